"""Factories for build/replay/export tests: sweep summaries, calibrations, workloads, keys.

Real, valid objects (STYLE rule 19) that a test then changes in one way. The sweep factory follows a
staircase cost model (whole-step time grows with ceil(tokens / tile)), so compact cells pay.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from dspark_calibrate.artifacts import Fingerprint, Provenance, sha256_hex, write_unsigned_artifact
from dspark_calibrate.calibrate.deployment.build import BuildOptions
from dspark_calibrate.calibrate.deployment.replay import BootstrapSettings
from dspark_calibrate.calibrate.deployment.workload import Workload, synthesize_workload, write_workload
from dspark_calibrate.schemas import arrow_schema
from tests.factories import LADDER, NOW, K, make_fingerprint, make_provenance

TEMPERATURES = (1.3, 1.4, 1.5, 1.6, 1.7)


def staircase_ms(
    g: int,
    tokens: int,
    *,
    base: float = 4.0,
    per_row: float = 0.02,
    per_tile: float = 0.25,
    tile: int = 16,
    compact_overhead: float = 0.05,
    native: bool = False,
) -> float:
    """The noise-free step time of the staircase model."""
    t = base + per_row * g + per_tile * math.ceil(tokens / tile)
    return t if native else t + compact_overhead


def sweep_rows(
    ladder: Sequence[int] = LADDER,
    k: int = K,
    *,
    budgets: Mapping[int, Sequence[int]] | None = None,
    flat: bool = False,
    rel_ci: float = 0.004,
    saving_ci: float = 0.002,
    paired: bool = True,
    forced_k_rel: float | None = None,
    cost: Mapping[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Rows of a ``sweep`` summary: native + compact candidates (incl. V=G and the control).

    ``cost`` overrides :func:`staircase_ms`'s parameters (``tile``, ``per_tile``, ...).

    Savings are paired (``saving_ci`` wide on either side) unless ``paired`` is False (then the
    rows carry the schema-1 columns' meaning: paired_rounds 0 and the unpaired derived interval).
    ``forced_k_rel`` adds the forced-K arm of every G at that relative overhead.
    """
    rows = []
    for g in ladder:
        vs = (
            budgets[g]
            if budgets is not None
            else sorted({g, *range(g + g // 2, g * (k + 1), max(1, g // 2)), g * (k + 1)})
        )
        model = dict(cost or {})
        t0 = staircase_ms(g, g * (k + 1), native=True, **model)
        arms = [-1] if forced_k_rel is not None else []
        for v in [*arms, 0, *vs]:
            tokens = g * (k + 1) if v <= 0 else v
            if v == -1:
                assert forced_k_rel is not None
                t = t0 * (1 + forced_k_rel)
            else:
                t = t0 if flat else staircase_ms(g, tokens, native=v == 0, **model)
            saving = 1 - t / t0
            if paired:
                low, high = (saving, saving) if v == 0 else (saving - saving_ci, saving + saving_ci)
            else:
                low, high = (
                    (0.0, 0.0)
                    if v == 0
                    else (
                        1 - t * (1 + rel_ci) / (t0 * (1 - rel_ci)),
                        1 - t * (1 - rel_ci) / (t0 * (1 + rel_ci)),
                    )
                )
            rows.append(
                {
                    "graph_batch_size": g,
                    "verifier_budget": v,
                    "tokens": tokens,
                    "step_time_ms": t,
                    "ci_low_ms": t * (1 - rel_ci),
                    "ci_high_ms": t * (1 + rel_ci),
                    "p10_ms": t * (1 - 2 * rel_ci),
                    "p90_ms": t * (1 + 2 * rel_ci),
                    "iqr_ms": t * rel_ci,
                    "samples": 64,
                    "rounds": 8,
                    "dropped_throttled": 0,
                    "warmup_steps": 20,
                    "replays_per_sample": 4,
                    "stop_reason": "precision",
                    "sm_clock_mhz_median": 1980.0,
                    "temperature_c_max": 61.0,
                    "power_w_median": 550.0,
                    "source_result_sha256": sha256_hex(f"{g}:{v}".encode()),
                    "saving": saving,
                    "saving_ci_low": low,
                    "saving_ci_high": high,
                    "paired_rounds": 8 if paired else 0,
                    "common_mode_rel": 0.003 if paired else 0.0,
                    "level_rel": 0.0015,
                    "epochs": 3,
                    "power_capped": 0,
                }
            )
    return rows


def write_sweep(
    path: Path,
    rows: Sequence[Mapping[str, Any]],
    *,
    fingerprint: Fingerprint | None = None,
    provenance: Provenance | None = None,
) -> Path:
    table = pa.Table.from_pylist(list(rows), schema=arrow_schema("sweep"))
    write_unsigned_artifact(
        path,
        table,
        kind="sweep",
        fingerprint=fingerprint or make_fingerprint(),
        provenance=provenance or make_provenance(),
        summary={"cells": table.num_rows},
    )
    return path


def calibration_table(temperatures: Sequence[float] = TEMPERATURES, *, method: str = "sts") -> pa.Table:
    rows = []
    for j, t in enumerate(temperatures, start=1):
        params = {"sts": [t], "platt": [1.0 / t, 0.0], "identity": []}[method]
        rows.append(
            {
                "position": j,
                "method": method,
                "temperature": t,
                "params": params,
                "risk_set_size": 20_000 // j,
                "holdout_risk_set_size": 5_000 // j,
                "nll_before": 0.6,
                "nll_after": 0.5,
                "brier_before": 0.2,
                "brier_after": 0.18,
                "ece_before": 0.05 + 0.01 * j,
                "ece_after": 0.01,
            }
        )
    return pa.Table.from_pylist(rows, schema=arrow_schema("calibration"))


def write_calibration(
    path: Path,
    *,
    temperatures: Sequence[float] = TEMPERATURES,
    method: str = "sts",
    fingerprint: Fingerprint | None = None,
    provenance: Provenance | None = None,
) -> Path:
    fp = fingerprint or Fingerprint(max_draft_len=len(temperatures), model_config_sha256="c" * 64)
    write_unsigned_artifact(
        path,
        calibration_table(temperatures, method=method),
        kind="calibration",
        fingerprint=fp,
        provenance=provenance or make_provenance(command=("dspark-calibrate", "fit")),
    )
    return path


def small_workload(
    *, steps: int = 1500, ranks: int = 1, max_rows: int = 32, seed: int = 3, k: int = K
) -> Workload:
    return synthesize_workload(
        k=k, steps=steps, ranks=ranks, max_rows=max_rows, seed=seed, temperatures=TEMPERATURES[:k]
    )


@dataclass(frozen=True)
class BuildFiles:
    sweep: Path
    calibration: Path
    workload: Path


def build_files(
    tmp: Path, *, steps: int = 1500, synthetic_workload: bool = False, **sweep_kw: Any
) -> BuildFiles:
    """Sweep, calibration and workload files of one (non-synthetic) deployment."""
    tmp.mkdir(parents=True, exist_ok=True)
    sweep = write_sweep(tmp / "sweep.parquet", sweep_rows(**sweep_kw))
    cal = write_calibration(tmp / "calibration.parquet")
    wl = small_workload(steps=steps)
    if not synthetic_workload:
        wl = Workload(
            table=wl.table, k=wl.k, num_ranks=wl.num_ranks, notes=("test workload",), source="tests"
        )
    write_workload(tmp / "workload.parquet", wl, fingerprint=make_fingerprint())
    return BuildFiles(sweep, cal, tmp / "workload.parquet")


def build_options(**overrides: Any) -> BuildOptions:
    base: dict[str, Any] = {
        "version": 1,
        "issued_at": NOW,
        "expires_at": NOW + timedelta(days=30),
        "bootstrap": BootstrapSettings(resamples=200, seed=1),
        "plots": False,
        "command": ("dspark-calibrate", "build"),
    }
    base.update(overrides)
    return BuildOptions(**base)


# --- mixed evidence (DESIGN §10) -----------------------------------------------------------------

#: The synthetic step model of the mixed factories: tiles of 8 tokens at 0.4 ms (a K=3 staircase).
MIXED_SWEEP_MODEL: dict[str, Any] = {"tile": 8, "per_tile_ms": 0.4}


@dataclass(frozen=True)
class MixedFiles:
    """A deployment's decode inputs plus a synthetic mixed sweep of its workload's mixed steps."""

    sweep: Path
    calibration: Path
    workload: Path
    mixed_sweep: Path
    fingerprint: Fingerprint
    route: Any
    model: Mapping[str, Any]


def mixed_fingerprint(*, ranks: int = 8, k: int = 3, ladder: Sequence[int] = (8, 16)) -> Fingerprint:
    """A complete fingerprint of an attention-DP deployment of ``ranks`` GPUs (the synthetic
    backend's GPU and clock policy, so its mixed sweep binds to it)."""
    return make_fingerprint(
        gpu="synthetic",
        clock_policy="synthetic",
        max_draft_len=k,
        gpu_count=ranks,
        topology=f"DEP{ranks}" if ranks > 1 else "TP1",
        rank_local_graph_batch_sizes=tuple(ladder),
        global_graph_batch_sizes=tuple(g * ranks for g in ladder),
    )


def mixed_files(
    tmp: Path,
    *,
    ranks: int = 8,
    k: int = 3,
    ladder: Sequence[int] = (8, 16),
    buckets: Sequence[int] | None = None,
    steps: int = 1200,
    seed: int = 0,
    model: Mapping[str, Any] | None = None,
    min_rounds: int = 6,
) -> MixedFiles:
    """Write the inputs of a build with mixed evidence: decode sweep rows of the staircase model,
    a calibration, a (non-synthetic) recorded-like workload with prefill traffic, and a synthetic
    mixed sweep of its mixed steps on ``buckets`` (default: TensorRT-LLM's six)."""
    import dataclasses

    from dspark_calibrate.artifacts import TRTLLM_BODY_BUCKETS, MixedRoute
    from dspark_calibrate.calibrate.deployment.workload import synthesize_mixed_workload
    from dspark_calibrate.calibrate.measurement.mixed import plan_from_workload
    from dspark_calibrate.calibrate.measurement.mixed_sweep import MixedSweepRequest, execute_mixed
    from dspark_calibrate.calibrate.measurement.stats import Thresholds

    tmp.mkdir(parents=True, exist_ok=True)
    fp = mixed_fingerprint(ranks=ranks, k=k, ladder=ladder)
    rows = sweep_rows(ladder, k, cost={"tile": 8, "per_tile": 0.4})
    sweep = write_sweep(tmp / "sweep.parquet", rows, fingerprint=fp)
    cal = write_calibration(
        tmp / "calibration.parquet",
        temperatures=TEMPERATURES[:k],
        fingerprint=Fingerprint(max_draft_len=k, model_config_sha256=fp.model_config_sha256),
    )
    wl = synthesize_mixed_workload(
        k=k, steps=steps, ranks=ranks, seed=seed, temperatures=TEMPERATURES[:k], levels=(6, 10, 14)
    )
    wl = dataclasses.replace(wl, synthetic=False, source="tests", notes=("test workload",))
    write_workload(tmp / "workload.parquet", wl, fingerprint=fp)
    route = MixedRoute(k, ranks, tuple(buckets or TRTLLM_BODY_BUCKETS))
    options = dict(model or MIXED_SWEEP_MODEL)
    _, out = execute_mixed(
        MixedSweepRequest(
            backend="synthetic",
            plan=plan_from_workload(wl, route),
            ladder=tuple(ladder),
            out=tmp / "mixed-sweep.parquet",
            backend_options=dict(options),
            thresholds=Thresholds.quick(precision_rel=0.005, min_rounds=min_rounds),
            seed=seed,
            fingerprint=fp,
            clock_policy="synthetic",
        )
    )
    assert out is not None
    return MixedFiles(sweep, cal, tmp / "workload.parquet", out.output.summary_path, fp, route, options)
