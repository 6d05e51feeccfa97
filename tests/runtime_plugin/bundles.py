"""Factories for runtime admission tests: complete signed bundles, and ways to spoil them.

Each bundle is built through the artifacts API (``sign_artifact`` via ``sign_table``, then
``write_bundle``), so admission sees exactly what ``build`` would produce.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from dspark_calibrate.artifacts import (
    Fingerprint,
    Provenance,
)
from tests.factories import LADDER, NOW, K, calibration_rows, cost_rows, make_fingerprint, make_table
from tests.signing import MEMBER_FILES, sign_bundle

__all__ = ["LATER", "MEMBER_FILES", "K", "admission_rows", "admission_summary", "make_bundle"]

#: The admission clock of these tests: an hour after the artifacts were issued.
LATER = NOW + timedelta(hours=1)


def admission_summary(**overrides: Any) -> dict[str, Any]:
    """A signed-summary body that passes the gain test (CI lower bound 8 %, net value 750 ms)."""
    base: dict[str, Any] = {
        "predicted_gain": 0.12,
        "predicted_gain_ci_low": 0.08,
        "predicted_gain_ci_high": 0.16,
        "compact_step_share": 0.6,
        "policy_steps": 1000,
        "compact_choices": 600,
        "gross_compact_value_ms_lower_bound": 900.0,
        "fixed_confidence_path_overhead_ms_upper_bound": 0.05,
        "safety_margin_ms": 100.0,
        "net_value_ms": 750.0,
        "admitted": True,
        "minimum_predicted_gain": 0.01,
        "drain_guard": {
            "loss_multiplier": 1.5,
            "mean_output_tokens_per_request_iteration": 2.3,
            "minimum_group_value_ms": 0.1,
            "tail_graph_batch_size": LADDER[0],
            "source_result_sha256": "d" * 64,
        },
        "workload_identity_sha256": "e" * 64,
        "selector_replay_sha256": "f" * 64,
    }
    base.update(overrides)
    return base


def admission_rows(ladder: Sequence[int] = LADDER) -> list[dict[str, Any]]:
    """Replay statistics for the compact cells of ``cost_rows``."""
    return [
        {
            "graph_batch_size": g,
            "verifier_budget": v,
            "chosen_steps": 100,
            "value_ms": 2.0,
            "value_ms_lower_bound": 1.5,
        }
        for g in ladder
        for v in (2 * g, 4 * g)
    ]


def make_bundle(
    directory: Path,
    signers: Sequence[Any],
    *,
    version: int = 1,
    fingerprint: Fingerprint | None = None,
    provenance: Provenance | None = None,
    costs: Sequence[Mapping[str, Any]] | None = None,
    calibration: Sequence[Mapping[str, Any]] | None = None,
    admission: Sequence[Mapping[str, Any]] | None = None,
    summary: Mapping[str, Any] | None = None,
    members: Sequence[str] = ("cost-table", "calibration", "admission"),
    issued_at: datetime = NOW,
    expires_at: datetime | None = None,
    scale: float = 1.0,
) -> Path:
    """Sign the members and the manifest of a valid bundle in ``directory``.

    ``scale`` multiplies every step time (a bundle of the same deployment with other measurements).
    """
    directory.mkdir(parents=True, exist_ok=True)
    fp = fingerprint or make_fingerprint()
    expires = expires_at or issued_at + timedelta(days=30)
    rows = [
        {**r, **{c: r[c] * scale for c in ("step_time_ms", "ci_low_ms", "ci_high_ms", "p10_ms", "p90_ms")}}
        for r in (costs if costs is not None else cost_rows())
    ]
    tables = {
        "cost-table": (make_table("cost-table", rows), None),
        "calibration": (
            make_table("calibration", calibration if calibration is not None else calibration_rows()),
            None,
        ),
        "admission": (
            make_table("admission", admission if admission is not None else admission_rows()),
            dict(summary if summary is not None else admission_summary()),
        ),
    }
    return sign_bundle(
        directory,
        {kind: tables[kind] for kind in members},
        signers,
        version=version,
        fingerprint=fp,
        provenance=provenance,
        issued_at=issued_at,
        expires_at=expires,
    )
