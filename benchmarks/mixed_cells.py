"""Why no mixed cell was deployable on the H200 mixed e2e run, and what would change that.

Reads a mixed e2e run's recorded toolkit files (the workload with its mixed companion, the mixed
sweep and its samples: ``benchmarks/results/raw/e2e_mixed_toolkit.tgz``) and its result file
(``benchmarks/results/e2e_mixed.json``: the calibration's temperatures, the deployed decode
cells' table times, the drain guard). It then runs the library's mixed deployment path on CPU
(``MixedGrid.from_rows``, ``deploy_mixed``, ``prepare_mixed`` under the decode policy's
``first_losses``) and breaks the measured cells down by why they were not deployed:

- under the bounds the run used (both arms' absolute interval ends) and under the paired bounds
  ``build`` uses now (``deployment.mixed.paired_bounds``);
- per reason: geometries, native time, paired saving and interval, rounds and samples, recorded
  steps per geometry, steps the decode policy diverged, and what the runtime's selector does
  on each cell's step at the table's medians (histories aside);
- the paired intervals' degrees of freedom and, with the product's own
  ``paired_saving_interval`` on rounds drawn at each cell's measured round-to-round spread, how
  many cells more rounds would make significant;
- every compact candidate of the workload's mixed steps (not only the measured ones), priced at
  the measured per-bucket times: which the selector would take, what they would save, and what
  ``plan_from_workload`` measures now; those cells replayed with the recorded histories, with
  only their own token losses shifting histories, and under the decode policy;
- what one row of a mixed step costs against what a verified draft token is worth there.

Run (under a minute on 2 cores)::

    python benchmarks/mixed_cells.py                       # unpacks the committed tgz itself
    python benchmarks/mixed_cells.py --toolkit DIR --result benchmarks/results/e2e_mixed.json

→ ``benchmarks/results/mixed_cells.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import tarfile
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_result

from dspark_calibrate.artifacts import MixedRoute, native_rows, read_artifact, step_candidates
from dspark_calibrate.calibrate.deployment.cells import CellGrid, CellTime
from dspark_calibrate.calibrate.deployment.mixed import (
    MixedArm,
    MixedCellTime,
    MixedEvidence,
    MixedGrid,
    prepare_mixed,
)
from dspark_calibrate.calibrate.deployment.mixed_build import MIXED_MINIMUM_GAIN, deploy_mixed
from dspark_calibrate.calibrate.deployment.replay import choose_steps, first_losses, prepare_evidence
from dspark_calibrate.calibrate.deployment.workload import Workload, read_workload
from dspark_calibrate.calibrate.measurement.mixed import MIXED_NATIVE, MixedCellSpec, plan_from_workload
from dspark_calibrate.calibrate.measurement.stats import TRIM, BetweenRun, CellSamples, paired_saving_interval
from dspark_calibrate.runtime_plugin.mixed import (
    MixedCell,
    MixedCostTable,
    choose_mixed,
    first_chunk,
    mixed_windows,
)
from dspark_calibrate.runtime_plugin.planner import Calibration, DrainGuard
from dspark_calibrate.schemas import MAX_MIXED_CELLS, conform_table

ROOT = Path(__file__).resolve().parent
TGZ = ROOT / "results" / "raw" / "e2e_mixed_toolkit.tgz"
RESULT = ROOT / "results" / "e2e_mixed.json"
#: Rounds per capture epoch in the run's mixed sweep (the harness's default re-capture period).
ROUNDS_PER_EPOCH = 3
#: Rounds the projection of (c) tries, and the simulated sweeps per cell and round count.
PROJECT_ROUNDS = (5, 6, 9, 12, 18)
DRAWS = 50


# ---------------------------------------------------------------------------------------------
# Inputs: the recorded run, its decode policy
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
    """One recorded mixed e2e run, loaded."""

    workload: Workload
    grid: MixedGrid
    rows: tuple[Mapping[str, Any], ...]
    samples: Any  # pandas.DataFrame of the mixed sweep samples
    between: BetweenRun
    calibration: Calibration
    diverged: dict[int, int]
    decode_compact_steps: int
    decode_steps: int
    static_seconds: float
    result: Mapping[str, Any]


def load(toolkit: Path, result_path: Path) -> Run:
    """The run's workload, mixed sweep (rows and samples), calibration and decode policy."""
    result = json.loads(result_path.read_text(encoding="utf-8"))
    workload = read_workload(toolkit / "workload.parquet")
    loaded = read_artifact(toolkit / "mixed-sweep.parquet")
    summary = loaded.metadata["summary"]
    route = MixedRoute.from_dict(summary["route"], where="mixed-sweep summary.route")
    rows = tuple(conform_table("mixed-sweep", loaded.table).to_pylist())
    grid = MixedGrid.from_rows(rows, route, summary["protocol_sha256"])
    between = BetweenRun(**loaded.provenance_untrusted().extra["between_run"])
    samples = read_artifact(toolkit / "mixed-sweep.samples.parquet").table.to_pandas()
    calibration = Calibration.sts(result["stages"]["fit"]["summary"]["sts_temperatures"])
    # The decode policy the build replayed: the deployed decode cells at their table medians and
    # the build's drain guard (first_losses: the request each decode compact step cut short).
    cells = []
    table = result["arms"]["decode_mixed"]["decode_cells"]["cells"]
    native = {int(k.split("/")[0]): v["table_ms"] for k, v in table.items() if k.endswith("/0")}
    for key, v in table.items():
        g, budget = (int(x) for x in key.split("/"))
        s = 1.0 - v["table_ms"] / native[g] if budget else 0.0
        cells.append(CellTime(g, budget, v["table_ms"], v["table_ms"], v["table_ms"], "", s, s, s, 2))
    replayed = result["stages"]["build_decode_mixed"]["outcome"]["replay"]
    dg = replayed["drain_guard"]
    guard = DrainGuard(
        dg["loss_multiplier"],
        dg["mean_output_tokens_per_request_iteration"],
        dg["minimum_group_value_ms"],
        dg["tail_graph_batch_size"],
    )
    evidence = prepare_evidence(
        workload,
        CellGrid(k=workload.k, cells=tuple(cells)),
        calibration,
        min_verify_len=route.min_verify_len,
        per_row=True,
    )
    column = choose_steps(
        evidence, minimum_predicted_gain=replayed["minimum_predicted_gain"], drain_guard=guard
    ).column
    return Run(
        workload=workload,
        grid=grid,
        rows=rows,
        samples=samples,
        between=between,
        calibration=calibration,
        diverged=first_losses(evidence, column),
        decode_compact_steps=int((column >= 0).sum()),
        decode_steps=int(evidence.steps),
        static_seconds=float(result["stages"]["workload"]["run"]["seconds"]),
        result=result,
    )


def as_recorded(grid: MixedGrid) -> MixedGrid:
    """The grid with the bounds the run used: the native arm's and the cell's own interval ends."""
    high = {c.sha256: c.time.ci_high_ms for c in grid.cells}
    cells = tuple(dataclasses.replace(c, candidate_upper_ms=high[c.sha256]) for c in grid.cells)
    return MixedGrid(grid.route, grid.protocol_sha256, grid.groups, cells, grid.dropped)


def breakdown(run: Run, grid: MixedGrid) -> tuple[dict[str, str], MixedEvidence]:
    """deploy_mixed under the decode policy: each measured cell's reason (``deployed`` if kept)."""
    deployed, left, evidence = deploy_mixed(
        run.workload, grid, run.calibration, minimum_predicted_gain=MIXED_MINIMUM_GAIN, diverged=run.diverged
    )
    reason = {sha: why.split(":", 1)[0] for sha, why in left}
    reason.update({c.sha256: "deployed" for c in deployed})
    return reason, evidence


# ---------------------------------------------------------------------------------------------
# Per cell: what was measured and what the selector does on its steps
# ---------------------------------------------------------------------------------------------


def _survivals(run: Run, index: int) -> list[np.ndarray]:
    a = run.workload.arrays()
    s = run.workload.mixed_step_rows()[index]
    rows = np.arange(s.start, s.stop)
    surv = run.calibration.survival(a.logits[rows])
    return [surv[a.rank[rows] == r] for r in range(s.description.world_size)]


def selector_at(
    run: Run, index: int, geometry: Any, native_ms: float, candidate_ms: float
) -> tuple[str, float, int]:
    """The runtime's choice on recorded mixed step ``index`` with one cell at these times, its
    yield over the native's (at a cell that always passes) and the tokens the cell loses."""
    step = run.workload.mixed_step_rows()[index]
    surv = _survivals(run, index)
    route = run.grid.route
    choice = choose_mixed(
        step.description, surv, MixedCostTable(route, (MixedCell(geometry, native_ms, candidate_ms),))
    )
    best = choose_mixed(step.description, surv, MixedCostTable(route, (MixedCell(geometry, 1e6, 1e-6),)))
    if best.cell is None:  # a first chunk: the step stays native whatever the times
        return choice.reason, float("nan"), 0
    acc = run.workload.arrays().accepted[step.start : step.stop]
    w = np.concatenate(mixed_windows(step.description, surv, best, route.physical_k, route.min_verify_len))
    lost = int((acc + 1).sum() - (np.minimum(acc, w) + 1).sum())
    return choice.reason, best.yield_ / best.native_yield, lost


def _steps_of(run: Run) -> dict[Any, list[int]]:
    out: dict[Any, list[int]] = {}
    k = run.workload.k
    for i, s in enumerate(run.workload.mixed_step_rows()):
        out.setdefault(s.description.features(k), []).append(i)
    return out


def _round_log_ratios(samples: Any, group: int, capacity: int) -> dict[int, float]:
    """Per round both arms kept samples in: log(median cell / median native)."""
    s = samples[(samples.mixed_group == group) & samples.kept]
    med = s.groupby(["capacity", "round"]).step_time_ms.median()
    cell, native = med.get(capacity), med.get(MIXED_NATIVE)
    if cell is None or native is None:
        return {}
    both = sorted(set(cell.index) & set(native.index))
    return {int(r): float(np.log(cell[r] / native[r])) for r in both}


def cell_table(
    run: Run, recorded: Mapping[str, str], paired: Mapping[str, str], evidence: MixedEvidence
) -> list[dict[str, Any]]:
    """One record per measured cell."""
    members = _steps_of(run)
    out = []
    for c in run.grid.cells:
        arm = run.grid.groups[c.group]
        steps = members.get(arm.features, [])
        at_median = [
            selector_at(run, i, c.geometry, arm.time.step_time_ms, c.time.step_time_ms) for i in steps
        ]
        logs = _round_log_ratios(run.samples, arm.mixed_group, c.geometry.capacity)
        f = c.geometry.rank_features[0]
        out.append(
            {
                "mixed_group": arm.mixed_group,
                "reason_recorded_bounds": recorded[c.sha256],
                "reason_paired_bounds": paired[c.sha256],
                "native_capacity": arm.native_capacity,
                "capacity": c.geometry.capacity,
                "native_rows": max(c.geometry.native_rank_rows),
                "actual_rows": max(c.geometry.actual_rank_rows),
                "context_rows": f.context_rows,
                "eligible_generations": f.eligible_generations,
                "native_ms": arm.time.step_time_ms,
                "candidate_ms": c.time.step_time_ms,
                "native_ci_ms": [arm.time.ci_low_ms, arm.time.ci_high_ms],
                "candidate_ci_ms": [c.time.ci_low_ms, c.time.ci_high_ms],
                "saving": c.time.saving,
                "saving_ci": [c.time.saving_ci_low, c.time.saving_ci_high],
                "paired_rounds": c.time.paired_rounds,
                "samples": c.samples,
                "round_log_ratio_sd": float(np.std(list(logs.values()), ddof=1)) if len(logs) > 1 else None,
                "recorded_steps": len(steps),
                "diverged_steps": int(sum(bool(evidence.diverged[i]) for i in steps)),
                "selector_at_medians": [r for r, _, _ in at_median],
                "yield_ratio": [y for _, y, _ in at_median],
                "tokens_lost": [n for _, _, n in at_median],
                "stop_reason": c.stop_reason,
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# Summaries per reason, and the answers to (a)-(d)
# ---------------------------------------------------------------------------------------------


def _span(values: Iterable[float]) -> dict[str, float] | None:
    v = [x for x in values if x is not None and np.isfinite(x)]
    if not v:
        return None
    return {"min": min(v), "median": statistics.median(v), "max": max(v), "n": len(v)}


def by_reason(cells: Sequence[Mapping[str, Any]], key: str) -> dict[str, Any]:
    """Per reason: how many cells, which geometries, times, savings, rounds, steps, selector."""
    out: dict[str, Any] = {}
    for reason in sorted({c[key] for c in cells}):
        group = [c for c in cells if c[key] == reason]
        out[reason] = {
            "cells": len(group),
            "buckets": dict(Counter(f"{c['native_capacity']}->{c['capacity']}" for c in group)),
            "native_rows": _span(c["native_rows"] for c in group),
            "rows_cut": _span(c["native_rows"] - c["actual_rows"] for c in group),
            "native_ms": _span(c["native_ms"] for c in group),
            "candidate_ms": _span(c["candidate_ms"] for c in group),
            "saving": _span(c["saving"] for c in group),
            "saving_ci_low": _span(c["saving_ci"][0] for c in group),
            "saving_ci_high": _span(c["saving_ci"][1] for c in group),
            "saving_ci_width": _span(c["saving_ci"][1] - c["saving_ci"][0] for c in group),
            "paired_rounds": dict(Counter(str(c["paired_rounds"]) for c in group)),
            "samples": dict(Counter(str(c["samples"]) for c in group)),
            "recorded_steps_per_geometry": dict(Counter(str(c["recorded_steps"]) for c in group)),
            "cells_whose_steps_all_diverged": sum(c["diverged_steps"] == c["recorded_steps"] for c in group),
            "selector_at_medians": dict(Counter(r for c in group for r in c["selector_at_medians"])),
            "yield_ratio": _span(y for c in group for y in c["yield_ratio"]),
            "round_log_ratio_sd": _span(c["round_log_ratio_sd"] for c in group),
        }
    return out


def _half(interval: Sequence[float], median: float) -> float:
    """An interval's half-width relative to its median."""
    return (interval[1] - interval[0]) / 2 / median


def dead_answer(run: Run, cells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """(a): what makes the recorded 'dead' cells dead, and how many the paired bounds keep dead."""
    dead = [c for c in cells if c["reason_recorded_bounds"] == "dead"]
    g = MIXED_MINIMUM_GAIN
    return {
        "rule": "candidate_upper_ms x (1 + gain) > native_lower_ms, gain 0.01: the consumer's acceptance test "
        "(Y_c / candidate_upper_ms >= (1 + gain) Y_n / native_lower_ms) at the best yield ratio, Y_c = Y_n",
        "recorded_bounds": "native_lower_ms = the native arm's reproduction-interval low end, candidate_upper_ms "
        "= the cell's own high end: each carries the level shift both arms share",
        "native_interval_half_width_rel": _span(_half(c["native_ci_ms"], c["native_ms"]) for c in dead),
        "candidate_interval_half_width_rel": _span(
            _half(c["candidate_ci_ms"], c["candidate_ms"]) for c in dead
        ),
        "recorded_bound_ratio": _span(c["candidate_ci_ms"][1] / c["native_ci_ms"][0] for c in dead),
        "paired_bound_ratio": _span(1 - c["saving_ci"][0] for c in dead),
        "dead_at_paired_bounds": sum(1 - c["saving_ci"][0] > 1 / (1 + g) for c in dead),
        "paired_margin": g / (1 + g),
        "between_run": dataclasses.asdict(run.between),
    }


def _simulated_low(mu: float, sd: float, rounds: int, between: BetweenRun, rng: np.random.Generator) -> float:
    """saving_ci_low of the product's paired interval over ``rounds`` rounds drawn N(mu, sd)."""
    spec = MixedCellSpec(0, 640, 5)
    ids = tuple(range(rounds))
    epochs = tuple(r // ROUNDS_PER_EPOCH for r in ids)
    cell = CellSamples(spec, tuple(np.exp(rng.normal(mu, sd, rounds))), ids, epochs)
    native = CellSamples(spec.native, (1.0,) * rounds, ids, epochs)
    got = paired_saving_interval(cell, native, between=between)
    return float("nan") if got is None else got.low


def _df(rounds: int, epochs: int) -> int:
    return rounds - 2 * int(np.floor(TRIM * rounds)) - 1 - (epochs - 1)


def significance_answer(
    run: Run, cells: Sequence[Mapping[str, Any]], seconds_per_visit: float
) -> dict[str, Any]:
    """(c): interval widths, rounds and degrees of freedom, and what more rounds would give."""
    from scipy.stats import t as student

    rng = np.random.default_rng(0)
    margin = MIXED_MINIMUM_GAIN / (1 + MIXED_MINIMUM_GAIN)
    projection: dict[str, Any] = {}
    for rounds in PROJECT_ROUNDS:
        per_reason: dict[str, dict[str, float]] = {}
        for reason in sorted({c["reason_recorded_bounds"] for c in cells}):
            lows = []
            for c in (x for x in cells if x["reason_recorded_bounds"] == reason):
                mu, sd = float(np.log(1 - c["saving"])), c["round_log_ratio_sd"] or 0.0
                lows += [_simulated_low(mu, sd, rounds, run.between, rng) for _ in range(DRAWS)]
            arr = np.array(lows)
            per_reason[reason] = {
                "significant_share": float(np.mean(arr > 0)),
                "above_margin_share": float(np.mean(arr > margin)),
                "median_saving_ci_low": float(np.nanmedian(arr)),
            }
        epochs = -(-rounds // ROUNDS_PER_EPOCH)
        projection[str(rounds)] = {
            "epochs": epochs,
            "df": _df(rounds, epochs),
            "t_975": float(student.ppf(0.975, _df(rounds, epochs))),
            "by_recorded_reason": per_reason,
        }
    measured = {}
    for n in sorted({c["paired_rounds"] for c in cells}):
        e = -(-n // ROUNDS_PER_EPOCH)
        measured[str(n)] = {"cells": sum(c["paired_rounds"] == n for c in cells), "df": _df(n, e)}
    return {
        "paired_rounds_as_measured": measured,
        "t_975_at_df": {str(d): float(student.ppf(0.975, d)) for d in (1, 2, 3, 4, 6)},
        "between_run_paired_rel": run.between.paired_rel,
        "projection": projection,
        "sweep_seconds_per_arm_visit": seconds_per_visit,
        "method": f"per cell, {DRAWS} sweeps of R rounds ({ROUNDS_PER_EPOCH} per epoch) whose per-round log "
        "ratios are drawn N(log(1 - saving), its measured round-to-round SD), summarized by the product's "
        "paired_saving_interval with the run's between-epoch model",
    }


def bucket_times(run: Run) -> tuple[dict[int, float], dict[int, list[float]]]:
    """Median measured step time per body bucket, over every arm that ran in it (native arms in
    their paid bucket, compact arms in theirs), and the times behind each median."""
    by_bucket: dict[int, list[float]] = {}
    for g in run.grid.groups:
        by_bucket.setdefault(g.native_capacity, []).append(g.time.step_time_ms)
    for c in run.grid.cells:
        by_bucket.setdefault(c.geometry.capacity, []).append(c.time.step_time_ms)
    return {b: statistics.median(v) for b, v in by_bucket.items()}, by_bucket


def candidates_answer(run: Run, evidence: MixedEvidence) -> dict[str, Any]:
    """(d): every compact candidate of the workload's mixed steps, at the measured per-bucket times."""
    route, k = run.grid.route, run.workload.k
    bucket_ms, by_bucket = bucket_times(run)
    records = []
    for i, s in enumerate(run.workload.mixed_step_rows()):
        paid, cands = step_candidates(
            s.description.features(k), k, route.body_buckets, min_verify_len=route.min_verify_len
        )
        for geo in cands:
            if paid not in bucket_ms or geo.capacity not in bucket_ms:
                continue
            reason, ratio, lost = selector_at(run, i, geo, bucket_ms[paid], bucket_ms[geo.capacity])
            records.append(
                {
                    "step": s.step,
                    "pair": f"{paid}->{geo.capacity}",
                    "rows_cut": max(geo.native_rank_rows) - max(geo.actual_rank_rows),
                    "first_chunk": first_chunk(s.description),
                    "diverged": bool(evidence.diverged[i]),
                    "reason": reason,
                    "yield_ratio": ratio,
                    "tokens_lost": lost,
                    "saved_ms": bucket_ms[paid] - bucket_ms[geo.capacity],
                }
            )
    return _candidates_summary(run, records, bucket_ms, by_bucket)


def histories_answer(run: Run) -> dict[str, Any]:
    """What the cells ``plan_from_workload`` picks would do if measured at the per-bucket medians:
    replayed with every recorded geometry recurring, with only the mixed cells' own token losses
    shifting later histories (a recording made under the deployed decode policy), and under the
    decode policy's losses (what serving from this recording does)."""
    bucket_ms, _ = bucket_times(run)
    plan = plan_from_workload(
        run.workload, run.grid.route, max_cells=MAX_MIXED_CELLS, max_groups=MAX_MIXED_CELLS
    )
    groups: list[MixedArm] = []
    cells: list[MixedCellTime] = []
    for g in (g for g in plan.groups if g.native_capacity in bucket_ms):
        t = bucket_ms[g.native_capacity]
        h = len(groups)
        groups.append(
            MixedArm(
                g.sha256, g.features, g.native_capacity, CellTime(h, 0, t, t, t), g.index, g.workload_steps
            )
        )
        for geo in g.cells:
            tc = bucket_ms[geo.capacity]
            saving = 1.0 - tc / t
            time = CellTime(h, geo.capacity, tc, tc, tc, "", saving, saving, saving, 2)
            cells.append(MixedCellTime(geo, h, time, t, tc, "0" * 64, 0, 0, 0, "median"))
    grid = MixedGrid(run.grid.route, run.grid.protocol_sha256, tuple(groups), tuple(cells))
    out: dict[str, Any] = {"cells": len(cells)}
    for name, diverged in (
        ("recorded_histories", None),
        ("own_losses_only", {}),
        ("decode_policy", run.diverged),
    ):
        ev = prepare_mixed(
            run.workload,
            grid,
            run.calibration,
            cells,
            minimum_predicted_gain=MIXED_MINIMUM_GAIN,
            diverged=diverged,
        )
        compact = ev.cell >= 0
        out[name] = {
            "compact_steps": int(compact.sum()),
            "tokens_lost": int((ev.static_tokens - ev.tokens)[compact].sum()),
            "reasons": dict(Counter(ev.reason)),
        }
    return out


def economics_answer(run: Run) -> dict[str, Any]:
    """Why a bucket drop rarely pays in these mixed steps: what one row costs against what the
    draft token it verifies is worth (static K's time per emitted token in mixed steps)."""
    bucket_ms, _ = bucket_times(run)
    ladder = sorted(bucket_ms)
    per_row = [(bucket_ms[b] - bucket_ms[a]) / (b - a) for a, b in itertools.pairwise(ladder)]
    a = run.workload.arrays()
    tokens = surv_rows = 0
    survivals = []
    for s in run.workload.mixed_step_rows():
        rows = np.arange(s.start, s.stop)
        tokens += int((a.accepted[rows] + 1).sum())
        survivals.append(run.calibration.survival(a.logits[rows]))
        surv_rows += rows.size
    mixed_s = float(run.result["stages"]["workload"]["run"]["mixed_seconds"])
    mixed_steps = int(run.result["stages"]["workload"]["run"]["mixed_steps"])
    per_token_ms = mixed_s * 1e3 / mixed_steps / (tokens / len(run.workload.mixed_step_rows()))
    row_ms = statistics.median(per_row)
    surv = np.concatenate(survivals) if survivals else np.zeros((0, run.workload.k))
    breakeven = row_ms / per_token_ms
    return {
        "row_cost_ms": row_ms,
        "row_cost_by_bucket_step": {
            f"{x}->{y}": v for x, y, v in zip(ladder, ladder[1:], per_row, strict=False)
        },
        "static_ms_per_token_in_mixed_steps": per_token_ms,
        "breakeven_survival": breakeven,
        "draft_rows_below_breakeven_share": float((surv < breakeven).mean()) if surv.size else None,
        "mean_survival_by_position": surv.mean(axis=0).tolist() if surv.size else [],
    }


def _candidates_summary(
    run: Run,
    records: list[dict[str, Any]],
    bucket_ms: Mapping[int, float],
    by_bucket: Mapping[int, list[float]],
) -> dict[str, Any]:
    per_pair: dict[str, Any] = {}
    for pair in sorted({r["pair"] for r in records}):
        rs = [r for r in records if r["pair"] == pair]
        per_pair[pair] = {
            "steps": len(rs),
            "first_chunk": sum(r["first_chunk"] for r in rs),
            "diverged": sum(r["diverged"] for r in rs),
            "rows_cut": _span(r["rows_cut"] for r in rs),
            "time_ratio": bucket_ms[int(pair.split("->")[1])] / bucket_ms[int(pair.split("->")[0])],
            "yield_ratio_open_steps": _span(r["yield_ratio"] for r in rs),
            "selector_at_medians": dict(Counter(r["reason"] for r in rs)),
            "compact_and_lossless": sum(r["reason"] == "compact" and r["tokens_lost"] == 0 for r in rs),
        }
    chosen = [r for r in records if r["reason"] == "compact"]
    # Static K's time per emitted token prices what a cell loses (as deploy_mixed values cells).
    per_token_ms = 1e3 * run.static_seconds / max(1, run.result["stages"]["workload"]["run"]["tokens"])
    ideal_ms = sum(r["saved_ms"] - r["tokens_lost"] * per_token_ms for r in chosen)
    plan = plan_from_workload(
        run.workload, run.grid.route, max_cells=MAX_MIXED_CELLS, max_groups=MAX_MIXED_CELLS
    )
    planned = Counter(f"{g.native_capacity}->{c.capacity}" for g in plan.groups for c in g.cells)
    return {
        "bucket_ms": {
            str(b): {"median": bucket_ms[b], "arms": len(by_bucket[b]), "iqr": _iqr(by_bucket[b])}
            for b in sorted(bucket_ms)
        },
        "by_pair": per_pair,
        "chosen_at_medians": len(chosen),
        "chosen_at_medians_not_diverged": sum(not r["diverged"] for r in chosen),
        "ideal_value_ms": ideal_ms,
        "ideal_value_share_of_static_run": ideal_ms / (1e3 * run.static_seconds),
        "plan_now": {"groups": len(plan.groups), "cells": dict(planned), "skipped": dict(plan.skipped)},
    }


def _iqr(values: Sequence[float]) -> list[float]:
    q = np.quantile(values, [0.25, 0.75])
    return [float(q[0]), float(q[1])]


def coverage_answer(run: Run, evidence: MixedEvidence) -> dict[str, Any]:
    """(b): which mixed steps the decode policy leaves recognisable, and what they offer."""
    k, route = run.workload.k, run.grid.route
    steps = run.workload.mixed_step_rows()
    open_steps = []
    for i in np.flatnonzero(~evidence.diverged):
        s = steps[int(i)]
        feats = s.description.features(k)
        paid, cands = step_candidates(feats, k, route.body_buckets, min_verify_len=route.min_verify_len)
        open_steps.append(
            {
                "step": s.step,
                "native_rows": max(native_rows(f, k) for f in feats),
                "paid_bucket": paid,
                "candidates": [c.capacity for c in cands],
                "first_chunk": first_chunk(s.description),
                "measured_native_arm": run.grid.group_of(feats) is not None,
            }
        )
    return {
        "mixed_steps": len(steps),
        "diverged_steps": int(evidence.diverged.sum()),
        "requests_cut_by_the_decode_policy": len(run.diverged),
        "first_decode_loss_step": min(run.diverged.values()) if run.diverged else None,
        "decode_compact_steps": run.decode_compact_steps,
        "decode_steps": run.decode_steps,
        "steps_not_diverged": open_steps,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the analysis and write ``results/mixed_cells.json``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--toolkit",
        type=Path,
        default=None,
        help="unpacked toolkit directory (default: unpack the committed tgz)",
    )
    ap.add_argument("--result", type=Path, default=RESULT, help="the run's e2e_mixed.json")
    ap.add_argument("--name", default="mixed_cells", help="result file name under benchmarks/results")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        toolkit = args.toolkit
        if toolkit is None:
            with tarfile.open(TGZ) as tar:
                tar.extractall(tmp, filter="data")
            toolkit = Path(tmp) / "toolkit"
        run = load(toolkit, args.result)
        data = analyse(run)
    data["inputs"] = {
        "toolkit": str(args.toolkit or TGZ.relative_to(ROOT.parent)),
        "result": str(args.result),
    }
    path = write_result(args.name, data)
    print(json.dumps(data["summary"], indent=2))
    print(f"wrote {path}")
    return 0


def analyse(run: Run) -> dict[str, Any]:
    """Every part of the breakdown, as one JSON-ready dict."""
    recorded, evidence = breakdown(run, as_recorded(run.grid))
    paired, _ = breakdown(run, run.grid)
    cells = cell_table(run, recorded, paired, evidence)
    stage = run.result["stages"]["mixed_sweep"]
    visits = sum(int(r["rounds"]) for r in run.rows)
    seconds_per_visit = float(stage["seconds"]) / max(1, visits)
    candidates = candidates_answer(run, evidence)
    coverage = coverage_answer(run, evidence)
    return {
        "run": {"commit": run.result.get("commit"), "command": run.result.get("command")},
        "summary": {
            "measured_cells": len(cells),
            "recorded_bounds": dict(Counter(c["reason_recorded_bounds"] for c in cells)),
            "paired_bounds": dict(Counter(c["reason_paired_bounds"] for c in cells)),
            "diverged_mixed_steps": coverage["diverged_steps"],
            "mixed_steps": coverage["mixed_steps"],
            "candidates_chosen_at_medians": candidates["chosen_at_medians"],
            "of_which_not_diverged": candidates["chosen_at_medians_not_diverged"],
            "ideal_value_share_of_static_run": candidates["ideal_value_share_of_static_run"],
            "plan_now": candidates["plan_now"],
        },
        "by_reason_recorded_bounds": by_reason(cells, "reason_recorded_bounds"),
        "by_reason_paired_bounds": by_reason(cells, "reason_paired_bounds"),
        "a_dead": dead_answer(run, cells),
        "b_coverage": coverage,
        "c_significance": significance_answer(run, cells, seconds_per_visit),
        "d_candidates": candidates,
        "d_histories": histories_answer(run),
        "economics": economics_answer(run),
        "cells": cells,
    }


if __name__ == "__main__":
    raise SystemExit(main())
