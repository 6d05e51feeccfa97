"""Test factories: valid fingerprints, tables and signed artifacts, and helpers to mutate and re-sign.

Factories, not mocks (STYLE rule 19): each builds a real, valid object that a test then changes in
one way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from dspark_calibrate.artifacts import Fingerprint, Provenance
from dspark_calibrate.artifacts._parquet import encode_artifact, footer_metadata
from dspark_calibrate.schemas import arrow_schema

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
K = 5
LADDER = (8, 16, 32)


def make_fingerprint(**overrides: Any) -> Fingerprint:
    """A complete, valid H200 fingerprint (K=5, ladder 8/16/32, TP1)."""
    base: dict[str, Any] = {
        "gpu": "H200",
        "gpu_count": 1,
        "gpu_snapshot_sha256": "a" * 64,
        "topology": "TP1",
        "source_head": "23b73d8",
        "source_diff_sha256": "b" * 64,
        "runtime_snapshot": "tensorrt_llm=1.3.0;torch=2.11.0",
        "max_draft_len": K,
        "rank_local_graph_batch_sizes": LADDER,
        "global_graph_batch_sizes": LADDER,
        "model_config_sha256": "c" * 64,
        "kv_dtype": "bf16",
        "context_len": 2048,
        "clock_policy": "default",
    }
    base.update(overrides)
    return Fingerprint(**base)


def make_provenance(**overrides: Any) -> Provenance:
    """A provenance record of a real (non-synthetic) measurement."""
    base: dict[str, Any] = {
        "tool_version": "0.1.0",
        "command": ("dspark-calibrate", "sweep"),
        "backend": "reference",
        "synthetic": False,
        "clock_policy": "default",
    }
    base.update(overrides)
    return Provenance(**base)


def cost_rows(ladder: Sequence[int] = LADDER, k: int = K) -> list[dict[str, Any]]:
    """Rows of a valid cost table: native + two compact cells per G, a staircase in V."""
    rows = []
    for g in ladder:
        full = g * (k + 1)
        t0 = 5.0 + 0.01 * full + 0.001 * g
        for v in (0, 2 * g, 4 * g):
            tokens = full if v == 0 else v
            t = 5.0 + 0.01 * tokens + 0.001 * g
            rows.append(
                {
                    "graph_batch_size": g,
                    "verifier_budget": v,
                    "step_time_ms": t,
                    "ci_low_ms": t * 0.995,
                    "ci_high_ms": t * 1.005,
                    "p10_ms": t * 0.99,
                    "p90_ms": t * 1.01,
                    "samples": 40,
                    "stop_reason": "precision",
                    "source_result_sha256": f"{g:032x}{v:032x}",
                    "saving": 1 - t / t0,
                    "saving_ci_low": 0.0 if v == 0 else 1 - t / t0 - 0.002,
                    "saving_ci_high": 0.0 if v == 0 else 1 - t / t0 + 0.002,
                    "paired_rounds": 8,
                    "common_mode_rel": 0.003,
                    "level_rel": 0.0015,
                }
            )
    return rows


def make_table(kind: str, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """A table of ``kind`` from row dicts (columns in schema order)."""
    return pa.Table.from_pylist(list(rows), schema=arrow_schema(kind))


def make_cost_table(**overrides: Any) -> pa.Table:
    """A valid cost table; ``overrides`` are passed to ``cost_rows``."""
    return make_table("cost-table", cost_rows(**overrides))


def calibration_rows(k: int = K) -> list[dict[str, Any]]:
    """Rows of a valid STS calibration table."""
    return [
        {
            "position": j,
            "method": "sts",
            "temperature": 1.0 + 0.1 * j,
            "params": [1.0 + 0.1 * j],
            "risk_set_size": 10_000 // j,
            "holdout_risk_set_size": 2_000 // j,
            "nll_before": 0.6,
            "nll_after": 0.5,
            "brier_before": 0.2,
            "brier_after": 0.18,
            "ece_before": 0.05,
            "ece_after": 0.01,
        }
        for j in range(1, k + 1)
    ]


def write_unsigned(
    path: Path,
    kind: str,
    table: pa.Table,
    *,
    fingerprint: Fingerprint | None = None,
    provenance: Provenance | None = None,
    summary: Mapping[str, Any] | None = None,
) -> Path:
    """Write an unsigned artifact (no schema conformance: tests write deliberately bad tables too)."""
    meta = footer_metadata(
        kind=kind,
        table=table,
        fingerprint=fingerprint or make_fingerprint(),
        provenance=provenance or make_provenance(),
        summary=summary,
    )
    path.write_bytes(encode_artifact(table, meta))
    return path


def replace_fp(fp: Fingerprint, **changes: Any) -> Fingerprint:
    """A fingerprint with some fields changed, bypassing nothing (validated again)."""
    return dataclasses.replace(fp, **changes)


Mutator = Callable[[pa.Table], pa.Table]


def future(days: int = 30) -> datetime:
    """A time ``days`` after NOW."""
    return NOW + timedelta(days=days)


#: Levels a hostile document nests: past the 32-level limit reader and writer share.
DEEP = 40


def nested(depth: int = DEEP, leaf: Any = 1, container: str = "dict") -> Any:
    """``leaf`` inside ``depth`` levels of ``{"x": ...}`` (or ``[...]``)."""
    value = leaf
    for _ in range(depth):
        value = [value] if container == "list" else {"x": value}
    return value


def unchecked_digest(obj: Any) -> str:
    """SHA-256 of ``obj``'s canonical JSON, made without the document limits (so a test can give
    a state file a consistent digest over a document the package refuses)."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
