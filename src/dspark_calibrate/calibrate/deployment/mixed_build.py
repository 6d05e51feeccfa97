"""The mixed half of ``build``: which measured mixed cells to deploy, and the evidence behind them.

Given a mixed sweep of the same deployment (DESIGN §10):

1. :func:`load_mixed_inputs` reads the ``mixed-sweep`` summary and its samples and checks them
   (the deployment's fingerprint, a route whose K and world size are the fingerprint's, the
   samples the summary names, by logical hash);
2. :func:`deploy_mixed` starts from every cell that saves for sure, is not dead under its own
   bounds and whose outputs never disagreed with its native arm's, replays the workload's mixed
   steps through the runtime's selector, and drops cells no step chooses or whose replayed value
   is not positive, until nothing changes;
3. :func:`mixed_outputs` turns the final replay into the signed tables and the result files the
   mixed receipt's five gates rest on: a gate is true only when the evidence behind it exists
   and passed its check here (``docs/mixed.md`` lists each check).

Pure except :func:`load_mixed_inputs` (reads two files).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dspark_calibrate.artifacts import (
    GEOMETRY_RULES,
    ArtifactReadError,
    Fingerprint,
    MixedRoute,
    Provenance,
    canonical_json,
    geometry_violations,
    logical_sha256,
    read_artifact,
    sha256_hex,
)
from dspark_calibrate.calibrate.deployment.mixed import (
    MixedArm,
    MixedCellTime,
    MixedEvidence,
    MixedGrid,
    prepare_mixed,
)
from dspark_calibrate.calibrate.deployment.replay import MixedReplay, ReplayReport
from dspark_calibrate.calibrate.deployment.workload import Workload
from dspark_calibrate.calibrate.measurement.mixed import MIXED_MINIMUM_GAIN
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.planner import Calibration
from dspark_calibrate.schemas import (
    MAX_MIXED_CELLS,
    MIXED_ADMISSION_SUMMARY_KEYS,
    MIXED_COST_SUMMARY_KEYS,
    MIXED_GATES,
    MIXED_RESULT_FILES,
    SchemaMismatch,
    arrow_schema,
    conform_table,
)

__all__ = [
    "MIXED_MINIMUM_GAIN",
    "MixedInputs",
    "MixedOutputs",
    "deploy_mixed",
    "load_mixed_inputs",
    "mixed_outputs",
]

_PASSES = 5  # rounds of dropping unused or losing cells before the set is final


@dataclass(frozen=True, eq=False)
class MixedInputs:
    """A loaded, checked mixed sweep."""

    path: Path
    route: MixedRoute
    protocol_sha256: str
    rows: tuple[Mapping[str, Any], ...]
    samples: pa.Table
    samples_logical_sha256: str
    sweep_logical_sha256: str
    provenance: Provenance

    @property
    def synthetic(self) -> bool:
        """Measured by the synthetic backend."""
        return self.provenance.synthetic


def load_mixed_inputs(path: Path, fingerprint: Fingerprint) -> MixedInputs:
    """Read a ``mixed-sweep`` summary and the samples it names.

    Raises:
        ConfigError: unreadable, another kind, another deployment, or samples that are not the
            ones the summary names.
    """
    try:
        loaded = read_artifact(path)
    except ArtifactReadError as exc:
        raise ConfigError(f"--mixed-sweep {exc}") from exc
    if loaded.kind != "mixed-sweep":
        raise ConfigError(f"{path}: is a {loaded.kind!r} artifact, expected a mixed-sweep (sweep --mixed)")
    fp = loaded.fingerprint_untrusted()
    diff = fingerprint.diff(fp)
    if diff:
        names = ", ".join(f"{n}: {b!r} (deployment {a!r})" for n, a, b in diff)
        raise ConfigError(f"{path}: mixed sweep of another deployment than the decode sweeps ({names})")
    summary = loaded.metadata.get("summary") or {}
    try:
        route = MixedRoute.from_dict(summary.get("route"), where=f"{path}: summary.route")
    except ConfigError as exc:
        raise ConfigError(f"{exc}; re-run sweep --mixed with this version") from exc
    if route.physical_k != fingerprint.max_draft_len or route.world_size != fingerprint.gpu_count:
        raise ConfigError(
            f"{path}: mixed route K={route.physical_k}, world size {route.world_size}; the deployment has "
            f"K={fingerprint.max_draft_len}, gpu_count={fingerprint.gpu_count}"
        )
    try:
        rows = conform_table("mixed-sweep", loaded.table).to_pylist()
    except SchemaMismatch as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    prov = loaded.provenance_untrusted()
    name, want = prov.extra.get("samples_file"), prov.extra.get("samples_logical_sha256")
    if not isinstance(name, str):
        raise ConfigError(f"{path}: names no samples file; re-run sweep --mixed")
    spath = path.with_name(Path(name).name)
    try:
        samples = read_artifact(spath)
    except ArtifactReadError as exc:
        raise ConfigError(f"{path}: its samples {spath.name} cannot be read: {exc}") from exc
    table = conform_table("mixed-sweep-samples", samples.table)
    digest = logical_sha256(table, "mixed-sweep-samples")
    if samples.kind != "mixed-sweep-samples" or digest != want:
        raise ConfigError(
            f"{spath}: not the samples {path.name} was summarized from (logical sha256 {digest}, named "
            f"{want!s}); keep a sweep's files together"
        )
    protocol = summary.get("protocol_sha256")
    if not isinstance(protocol, str) or len(protocol) != 64:
        raise ConfigError(f"{path}: summary lacks protocol_sha256; re-run sweep --mixed")
    return MixedInputs(
        path=Path(path),
        route=route,
        protocol_sha256=protocol,
        rows=tuple(rows),
        samples=table,
        samples_logical_sha256=digest,
        sweep_logical_sha256=logical_sha256(loaded.table, "mixed-sweep"),
        provenance=prov,
    )


def _values(evidence: MixedEvidence, calibration_free_ms: np.ndarray) -> np.ndarray:
    """Point value (ms) of each deployed cell over the workload: time saved minus the time
    static K needs for the tokens it did not emit (the replay's definition, at point costs)."""
    grid = evidence.grid
    out = np.zeros(len(evidence.deployed))
    for i in np.flatnonzero(evidence.cell >= 0):
        c = evidence.deployed[evidence.cell[i]]
        native = grid.groups[c.group].time.step_time_ms
        saved = native * c.time.saving
        lost = evidence.static_tokens[i] - evidence.tokens[i]
        out[evidence.cell[i]] += saved - lost * calibration_free_ms[0]
    return out


def _step_reasons(evidence: MixedEvidence, cell: MixedCellTime) -> str:
    """What the runtime did on the recorded steps of ``cell``'s group, counted by reason (a step
    ``diverged`` holds a request the decode policy cut short, so its geometry does not recur)."""
    reasons: dict[str, int] = {}
    for i in np.flatnonzero(evidence.group == cell.group):
        reasons[evidence.reason[i]] = reasons.get(evidence.reason[i], 0) + 1
    if not reasons:
        return "the workload has no step of its group"
    return "its steps: " + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items()))


def deploy_mixed(
    workload: Workload,
    grid: MixedGrid,
    calibration: Calibration,
    *,
    minimum_predicted_gain: float,
    diverged: Mapping[int, int] | None = None,
) -> tuple[tuple[MixedCellTime, ...], tuple[tuple[str, str], ...], MixedEvidence]:
    """Pick the deployed mixed cells (see the module docstring) and replay them; ``diverged`` is
    :func:`~.mixed.prepare_mixed`'s (the decode policy's first token loss per request).

    Returns:
        The deployed cells, the measured cells left out with why, and the final evidence.
    """
    cells, left = grid.deployable(minimum_predicted_gain)
    left = list(left) + list(grid.dropped)
    deployed = cells

    def evaluate(cells: Sequence[MixedCellTime]) -> MixedEvidence:
        return prepare_mixed(
            workload,
            grid,
            calibration,
            cells,
            minimum_predicted_gain=minimum_predicted_gain,
            diverged=diverged,
        )

    evidence = evaluate(deployed)
    priced = evidence.priced
    # Static time per emitted token over the priced mixed steps (prices the tokens a cell loses).
    native = np.array([grid.groups[h].time.step_time_ms for h in evidence.group[priced]])
    per_token = np.array([native.sum() / max(1, int(evidence.static_tokens[priced].sum()))])
    for _ in range(_PASSES):
        chosen = np.bincount(evidence.cell[evidence.cell >= 0], minlength=len(deployed))
        value = _values(evidence, per_token)
        keep = [c for j, c in enumerate(deployed) if chosen[j] > 0 and value[j] > 0]
        for j, c in enumerate(deployed):
            if chosen[j] == 0:
                left.append(
                    (c.sha256, f"never_chosen: no workload step chooses it ({_step_reasons(evidence, c)})")
                )
            elif value[j] <= 0:
                left.append((c.sha256, f"no_value: replayed value {value[j]:.4g} ms <= 0"))
        if len(keep) == len(deployed):
            break
        deployed = keep
        evidence = evaluate(deployed)
    if len(deployed) > MAX_MIXED_CELLS:
        value = _values(evidence, per_token)
        order = np.argsort(-value, kind="stable")[:MAX_MIXED_CELLS]
        left += [
            (deployed[j].sha256, "cell_limit: beyond the 256 most valuable")
            for j in sorted(set(range(len(deployed))) - set(order))
        ]
        deployed = [deployed[j] for j in sorted(order)]
        evidence = evaluate(deployed)
    return tuple(deployed), tuple(left), evidence


@dataclass(frozen=True, eq=False)
class MixedOutputs:
    """The mixed members' tables and summaries, and the result files, ready to sign."""

    cost_table: pa.Table
    cost_summary: Mapping[str, Any]
    samples: pa.Table
    samples_summary: Mapping[str, Any]
    admission_table: pa.Table
    admission_summary: Mapping[str, Any]
    results: Mapping[str, bytes]
    gates: Mapping[str, bool]
    notes: tuple[str, ...]


def _json(obj: Any) -> bytes:
    return canonical_json(obj)


def mixed_outputs(
    inputs: MixedInputs,
    grid: MixedGrid,
    evidence: MixedEvidence,
    report: ReplayReport,
    *,
    workload: Workload,
    fingerprint: Fingerprint,
    decode_members: Mapping[str, str],
    minimum_predicted_gain: float,
    allow_synthetic: bool,
) -> MixedOutputs:
    """The signed tables, summaries and result files of the deployed mixed cells.

    Raises:
        ConfigError: nothing is deployed (no mixed member can be written).
    """
    mixed = report.mixed
    deployed = evidence.deployed
    if mixed is None or not deployed:
        raise ConfigError("no mixed cell is deployed")
    route = grid.route
    order = sorted(range(len(deployed)), key=lambda j: deployed[j].sha256)  # the table's key order
    cells = [deployed[j] for j in order]
    cost_table = pa.Table.from_pylist(
        [_cost_row(c, grid.groups[c.group], inputs.rows) for c in cells],
        schema=arrow_schema("mixed-cost-table"),
    )
    cost_summary = {
        "cells": len(cells),
        "route": route.to_dict(),
        "minimum_predicted_gain": minimum_predicted_gain,
        "protocol_sha256": inputs.protocol_sha256,
    }
    assert tuple(cost_summary) == MIXED_COST_SUMMARY_KEYS
    # --- the evidence behind each gate -------------------------------------------------------
    hashes = [c.measurement_result_sha256 for c in cells]
    source = _source_gate(inputs, grid, cells, hashes, fingerprint)
    accuracy = _accuracy_gate(inputs, grid, cells)
    runtime = _runtime_gate(route, cells, fingerprint, minimum_predicted_gain)
    matched = _matched_gate(workload, route, mixed, cells)
    results = _result_files(accuracy, runtime, matched, source, mixed.replay_bytes, hashes)
    gates = _gates(
        accuracy,
        runtime,
        matched,
        source,
        admitted=mixed.economics.admitted,
        synthetic_ok=allow_synthetic or not inputs.synthetic,
    )
    summary = _mixed_admission_summary(
        mixed,
        inputs,
        route,
        gates=gates,
        results=results,
        minimum_predicted_gain=minimum_predicted_gain,
        decode_members=decode_members,
        workload=workload,
    )
    failed = [g for g, ok in gates.items() if not ok]
    notes = (
        [f"mixed receipt gates not passed: {failed}; export will not write a mixed receipt"] if failed else []
    )
    return MixedOutputs(
        cost_table=cost_table,
        cost_summary=cost_summary,
        samples=inputs.samples,
        samples_summary={"route": route.to_dict(), "source_logical_sha256": inputs.samples_logical_sha256},
        admission_table=_mixed_admission_table(mixed, cells),
        admission_summary=summary,
        results=results,
        gates=gates,
        notes=tuple(notes),
    )


def _mixed_admission_table(mixed: MixedReplay, cells: Sequence[MixedCellTime]) -> pa.Table:
    """Per deployed cell, the replay's chosen steps and value (in the cost table's key order)."""
    per_cell = {c["geometry_sha256"]: c for c in mixed.per_cell}
    return pa.Table.from_pylist(
        [
            {
                k: per_cell[c.sha256][k]
                for k in ("geometry_sha256", "chosen_steps", "value_ms", "value_ms_lower_bound")
            }
            for c in cells
        ],
        schema=arrow_schema("mixed-admission"),
    )


def _cost_row(c: MixedCellTime, arm: MixedArm, sweep_rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One row of the mixed cost table: the cell as measured, beside its native arm."""
    return {
        "geometry_sha256": c.sha256,
        "mixed_group": arm.mixed_group,
        "group_sha256": arm.group_sha256,
        "capacity": c.geometry.capacity,
        "rank_features": list(c.geometry.flat_features()),
        "actual_rank_rows": list(c.geometry.actual_rank_rows),
        "native_rank_rows": list(c.geometry.native_rank_rows),
        "native_capacity": arm.native_capacity,
        "native_lower_ms": c.native_lower_ms,
        "candidate_upper_ms": c.candidate_upper_ms,
        "measurement_result_sha256": c.measurement_result_sha256,
        "native_ms": arm.time.step_time_ms,
        "native_ci_low_ms": arm.time.ci_low_ms,
        "native_ci_high_ms": arm.time.ci_high_ms,
        "candidate_ms": c.time.step_time_ms,
        "candidate_ci_low_ms": c.time.ci_low_ms,
        "candidate_ci_high_ms": c.time.ci_high_ms,
        "saving": c.time.saving,
        "saving_ci_low": c.time.saving_ci_low,
        "saving_ci_high": c.time.saving_ci_high,
        "paired_rounds": c.time.paired_rounds,
        "common_mode_rel": max(c.time.common_mode_rel, arm.time.common_mode_rel),
        "native_level_rel": arm.time.level_rel,
        "samples": c.samples,
        "native_samples": _samples_of(sweep_rows, arm.mixed_group),
        "stop_reason": c.stop_reason,
        "accuracy_rows": c.accuracy_rows,
        "accuracy_mismatches": c.accuracy_mismatches,
    }


@dataclass(frozen=True, slots=True)
class _Gate:
    """A gate's result file (before serialisation) and whether its check passed."""

    record: dict[str, Any]
    ok: bool


def _source_gate(
    inputs: MixedInputs,
    grid: MixedGrid,
    cells: Sequence[MixedCellTime],
    hashes: Sequence[str],
    fingerprint: Fingerprint,
) -> _Gate:
    """Every cell's measurement-result hash, recomputed from the signed samples."""
    from dspark_calibrate.artifacts import measurement_result

    recomputed = [
        measurement_result(inputs.samples, grid.groups[c.group].mixed_group, c.geometry.capacity)
        for c in cells
    ]
    measured_ok = recomputed == list(hashes)
    record = {
        "format": "dspark-calibrate/mixed-source-and-measurements/v1",
        "mixed_sweep": str(inputs.path.name),
        "mixed_sweep_logical_sha256": inputs.sweep_logical_sha256,
        "samples_logical_sha256": inputs.samples_logical_sha256,
        "fingerprint_sha256": fingerprint.digest(),
        "source_head": fingerprint.source_head,
        "source_diff_sha256": fingerprint.source_diff_sha256,
        "runtime_snapshot": fingerprint.runtime_snapshot,
        "protocol_sha256": inputs.protocol_sha256,
        "cells": [
            {"geometry_sha256": c.sha256, "measurement_result_sha256": h, "recomputed": r, "match": h == r}
            for c, h, r in zip(cells, hashes, recomputed, strict=True)
        ],
        "pass": measured_ok,
    }
    return _Gate(record, measured_ok)


def _accuracy_gate(inputs: MixedInputs, grid: MixedGrid, cells: Sequence[MixedCellTime]) -> _Gate:
    """Every cell verified rows, and none of its greedy tokens differed from its native arm's."""
    accuracy_ok = all(c.accuracy_rows > 0 and c.accuracy_mismatches == 0 for c in cells)
    checks = inputs.provenance.extra.get("output_checks") or {}
    record = {
        "format": "dspark-calibrate/mixed-accuracy/v1",
        "method": "greedy tokens of every row a cell verifies, against its native arm's forward (sweep output check)",
        "backend": inputs.provenance.backend,
        "cells": [
            {
                "geometry_sha256": c.sha256,
                "rows": c.accuracy_rows,
                "mismatches": c.accuracy_mismatches,
                "detail": checks.get(f"{grid.groups[c.group].mixed_group}/{c.geometry.capacity}", ""),
            }
            for c in cells
        ],
        "pass": accuracy_ok,
    }
    return _Gate(record, accuracy_ok)


def _runtime_gate(
    route: MixedRoute, cells: Sequence[MixedCellTime], fingerprint: Fingerprint, minimum_predicted_gain: float
) -> _Gate:
    """The runtime's geometry rules hold for every cell, and the set fits the route and the deployment."""
    invariants = []
    for c in cells:
        found = geometry_violations(
            c.geometry,
            k=route.physical_k,
            buckets=route.body_buckets,
            world_size=route.world_size,
            min_verify_len=route.min_verify_len,
            costs=(c.native_lower_ms, c.candidate_upper_ms, minimum_predicted_gain),
        )
        invariants.append({"geometry_sha256": c.sha256, "violations": [v.describe() for v in found]})
    invariants_ok = (
        all(not x["violations"] for x in invariants)
        and 1 <= len(cells) <= MAX_MIXED_CELLS
        and len({c.geometry for c in cells}) == len(cells)
        and route.physical_k == fingerprint.max_draft_len
        and route.world_size == fingerprint.gpu_count
        and minimum_predicted_gain >= MIXED_MINIMUM_GAIN
    )
    record = {
        "format": "dspark-calibrate/mixed-runtime-invariants/v1",
        "rules": list(GEOMETRY_RULES),
        "route": route.to_dict(),
        "minimum_predicted_gain": minimum_predicted_gain,
        "cells": invariants,
        "pass": invariants_ok,
    }
    return _Gate(record, invariants_ok)


def _matched_gate(
    workload: Workload, route: MixedRoute, mixed: MixedReplay, cells: Sequence[MixedCellTime]
) -> _Gate:
    """The workload is exact, of this route, and every deployed cell wins some of its steps."""
    chosen = {c["geometry_sha256"]: c["chosen_steps"] for c in mixed.per_cell}
    matched_ok = (
        workload.k == route.physical_k
        and workload.num_ranks == route.world_size
        and not workload.approximate
        and mixed.economics.compact_choices > 0
        and all(chosen.get(c.sha256, 0) > 0 for c in cells)
    )
    record = {
        "format": "dspark-calibrate/mixed-matched-workload/v1",
        "workload_identity_sha256": workload.identity_sha256,
        "k": workload.k,
        "ranks": workload.num_ranks,
        "approximate": workload.approximate,
        "steps": mixed.workload_steps,
        "mixed_steps": mixed.mixed_steps,
        "priced_mixed_steps": mixed.mixed_part["priced_steps"],
        "covered_mixed_steps": mixed.mixed_part["covered_steps"],
        "compact_choices": mixed.economics.compact_choices,
        "chosen_steps": {c.sha256: chosen.get(c.sha256, 0) for c in cells},
        "reasons": dict(mixed.reasons),
        "pass": matched_ok,
    }
    return _Gate(record, matched_ok)


def _result_files(
    accuracy: _Gate, runtime: _Gate, matched: _Gate, source: _Gate, replay_bytes: bytes, hashes: Sequence[str]
) -> dict[str, bytes]:
    """The bytes of every file in :data:`MIXED_RESULT_FILES`, by name."""
    from dspark_calibrate.artifacts import measurement_results_bytes

    results = {
        "accuracy": _json(accuracy.record),
        "runtime_invariants": _json(runtime.record),
        "matched_workload": _json(matched.record),
        "selector_replay": replay_bytes,
        "measurement_results": measurement_results_bytes(list(hashes)),
        "source_and_measurements": _json(source.record),
    }
    assert set(results) == set(MIXED_RESULT_FILES)
    return results


def _gates(
    accuracy: _Gate, runtime: _Gate, matched: _Gate, source: _Gate, *, admitted: bool, synthetic_ok: bool
) -> dict[str, bool]:
    """The mixed receipt's gates, in :data:`MIXED_GATES` order: production admission needs every
    other gate, an admitted economics and (unless allowed) no synthetic measurement."""
    gates = {
        "accuracy_pass": accuracy.ok,
        "runtime_invariants_pass": runtime.ok,
        "matched_workload_pass": matched.ok,
        "source_and_measurements_verified": source.ok,
    }
    gates["production_admission"] = all(gates.values()) and admitted and synthetic_ok
    assert tuple(gates) == tuple(sorted(gates, key=MIXED_GATES.index))
    return gates


def _mixed_admission_summary(
    mixed: MixedReplay,
    inputs: MixedInputs,
    route: MixedRoute,
    *,
    gates: Mapping[str, bool],
    results: Mapping[str, bytes],
    minimum_predicted_gain: float,
    decode_members: Mapping[str, str],
    workload: Workload,
) -> dict[str, Any]:
    """The signed summary of the mixed admission artifact (exactly :data:`MIXED_ADMISSION_SUMMARY_KEYS`)."""
    e = mixed.economics
    summary = {
        "route": route.to_dict(),
        "protocol_sha256": inputs.protocol_sha256,
        "minimum_predicted_gain": minimum_predicted_gain,
        "policy_steps": e.policy_steps,
        "compact_choices": e.compact_choices,
        "gross_compact_value_ms_lower_bound": e.gross_compact_value_ms_lower_bound,
        "fixed_confidence_path_overhead_ms_upper_bound": e.fixed_confidence_path_overhead_ms_upper_bound,
        "safety_margin_ms": e.safety_margin_ms,
        "net_value_ms": e.net_value_ms,
        "admitted": e.admitted,
        "gates": dict(gates),
        "results": {name: sha256_hex(data) for name, data in results.items()},
        "predicted_gain": mixed.predicted_gain,
        "predicted_gain_ci_low": mixed.predicted_gain_ci_low,
        "predicted_gain_ci_high": mixed.predicted_gain_ci_high,
        "decode_part": dict(mixed.decode_part),
        "mixed_part": {
            **dict(mixed.mixed_part),
            "workload_steps": mixed.workload_steps,
            "unpriced_steps": mixed.unpriced_steps,
            "share": mixed.mixed_steps / mixed.workload_steps if mixed.workload_steps else 0.0,
        },
        "decode_members": dict(decode_members),
        "workload_identity_sha256": workload.identity_sha256,
    }
    assert tuple(summary) == MIXED_ADMISSION_SUMMARY_KEYS
    return summary


def _samples_of(rows: Sequence[Mapping[str, Any]], mixed_group: int) -> int:
    for r in rows:
        if r["mixed_group"] == mixed_group and r["capacity"] == 0:
            return int(r["samples"])
    return 0
