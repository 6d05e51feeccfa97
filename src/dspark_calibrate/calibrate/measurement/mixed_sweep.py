"""The mixed sweep: measure mixed prefill+decode cells through the decode sweep's harness.

Every group (one mixed step) contributes its native arm and its compact cells; the harness runs
them in the same interleaved, randomized, re-captured rounds as decode cells, pairs each cell
with its group's native arm, stops on the paired saving's precision, journals every visit and
resumes (DESIGN §7, §10). Across ranks each rank runs its own rank's share of the step and a
sample is the slowest rank's time; in one process for a deployment of several ranks, the process
runs rank 0's share (TensorRT-LLM prices mixed cells by a rank-0 forward proxy).

After measuring, the backend's output check (where it has one) runs every cell against its
native arm once: the greedy tokens of the rows both verify must agree. Outputs: the unsigned
``mixed-sweep`` summary and ``mixed-sweep-samples`` raw samples (both written atomically), with
``native_lower_ms``/``candidate_upper_ms`` left to ``build`` (they follow from the native arm's
interval and the paired saving's, ``deployment.mixed.paired_bounds``).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pyarrow as pa

from dspark_calibrate import __version__
from dspark_calibrate.artifacts import (
    PRICING_SEMANTICS,
    Fingerprint,
    MixedGeometry,
    MixedRoute,
    Provenance,
    write_unsigned_artifact,
)
from dspark_calibrate.calibrate.measurement.backends import Backend, load_backend
from dspark_calibrate.calibrate.measurement.backends.import_samples import (
    group_rounds,
    parse_mixed_profiler_jsonl,
)
from dspark_calibrate.calibrate.measurement.distributed import Communicator, from_environment
from dspark_calibrate.calibrate.measurement.mixed import (
    MIXED_NATIVE,
    Cell,
    MixedCellSpec,
    MixedPlan,
    MixedShape,
    OutputCheck,
    plan_from_geometries,
)
from dspark_calibrate.calibrate.measurement.stats import Thresholds
from dspark_calibrate.calibrate.measurement.sweep import (
    SweepConfig,
    SweepEvent,
    SweepOutput,
    SweepResult,
    build_fingerprint,
    default_journal_path,
    deployment_base,
    deployment_ranks,
    result_from_rounds,
    run_record,
    run_sweep,
    samples_path,
)
from dspark_calibrate.calibrate.measurement.telemetry import Telemetry
from dspark_calibrate.calibrate.measurement.timing import Step, Timer
from dspark_calibrate.errors import ConfigError, MeasurementError
from dspark_calibrate.schemas import arrow_schema

__all__ = [
    "PRICING_SEMANTICS",
    "MixedBackend",
    "MixedSweepOutput",
    "MixedSweepRequest",
    "OutputCheck",
    "execute_mixed",
    "import_mixed",
    "mixed_summary_table",
]


@runtime_checkable
class MixedBackend(Protocol):
    """What a backend adds to measure mixed cells (on top of :class:`Backend`)."""

    def prepare_mixed(self, shape: MixedShape) -> Step:
        """Build (capture) one rank's mixed step; called before its first visit of every epoch."""
        ...


class _MixedAdapter:
    """The harness's view of a mixed backend: cells in, the rank's shape to the backend."""

    def __init__(self, backend: Backend, plan: MixedPlan, rank: int) -> None:
        if not isinstance(backend, MixedBackend):
            raise ConfigError(
                f"backend {backend.name!r} cannot build mixed steps (it has no prepare_mixed); use synthetic, "
                "reference, module with --backend-opt mixed_factory=pkg.mod:fn, or import-samples"
            )
        self.inner = backend
        self.plan = plan
        self.rank = rank
        self.name = backend.name
        self.synthetic = backend.synthetic
        self.recapture = bool(getattr(backend, "recapture", True))

    def begin(self, round_index: int) -> None:
        begin = getattr(self.inner, "begin", None)
        if callable(begin):
            begin(round_index)

    def shape(self, cell: MixedCellSpec) -> MixedShape:
        return self.plan.group(cell.group).shape(cell.capacity, self.rank, self.plan.route)

    def prepare(self, cell: MixedCellSpec) -> Step:
        assert isinstance(self.inner, MixedBackend)
        return self.inner.prepare_mixed(self.shape(cell))

    def release(self, cell: MixedCellSpec) -> None:
        release = getattr(self.inner, "release_mixed", None)
        if callable(release):
            release(self.shape(cell))

    def check(self, cell: MixedCellSpec) -> OutputCheck:
        check = getattr(self.inner, "check_mixed", None)
        if not callable(check):
            return OutputCheck(0, 0, "the backend has no output check")
        result = check(self.shape(cell.native), self.shape(cell))
        if not isinstance(result, OutputCheck):
            raise MeasurementError(
                f"{self.name}.check_mixed returned {type(result).__name__}, not an OutputCheck"
            )
        return result

    def timer(self) -> Timer:
        return self.inner.timer()

    def telemetry(self) -> Telemetry:
        return self.inner.telemetry()

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()

    def fingerprint_fields(self) -> dict[str, Any]:
        return self.inner.fingerprint_fields()

    def close(self) -> None:
        self.inner.close()


def _geometry_of(plan: MixedPlan, cell: MixedCellSpec) -> MixedGeometry:
    group = plan.group(cell.group)
    return group.native_geometry() if cell.capacity == MIXED_NATIVE else group.geometry(cell.capacity)


def mixed_summary_table(
    result: SweepResult, plan: MixedPlan, checks: Mapping[tuple[int, int], OutputCheck]
) -> pa.Table:
    """The ``mixed-sweep`` table: one row per measured arm (native arms have capacity 0)."""
    rows = []
    for c in result.cells:
        s = c.summary
        if s is None:
            continue
        assert isinstance(c.spec, MixedCellSpec)
        group = plan.group(c.spec.group)
        geo = _geometry_of(plan, c.spec)
        check = checks.get(c.spec.key, OutputCheck(0, 0))
        rows.append(
            {
                "mixed_group": c.spec.group,
                "group_sha256": group.sha256,
                "capacity": c.spec.capacity,
                "geometry_sha256": geo.sha256(),
                "rank_features": list(geo.flat_features()),
                "actual_rank_rows": list(geo.actual_rank_rows),
                "native_rank_rows": list(geo.native_rank_rows),
                "native_capacity": group.native_capacity,
                "workload_steps": group.workload_steps,
                "step_time_ms": s.median_ms,
                "ci_low_ms": s.ci_low_ms,
                "ci_high_ms": s.ci_high_ms,
                "p10_ms": s.p10_ms,
                "p90_ms": s.p90_ms,
                "iqr_ms": s.iqr_ms,
                "samples": s.samples,
                "rounds": s.rounds,
                "dropped_throttled": c.dropped_throttled,
                "warmup_steps": c.warmup_steps,
                "replays_per_sample": c.replays_per_sample,
                "stop_reason": c.decision.reason,
                "sm_clock_mhz_median": c.sm_clock_mhz_median,
                "temperature_c_max": c.temperature_c_max,
                "power_w_median": c.power_w_median,
                "source_result_sha256": c.source_result_sha256,
                "saving": s.saving,
                "saving_ci_low": s.saving_ci_low,
                "saving_ci_high": s.saving_ci_high,
                "paired_rounds": s.paired_rounds,
                "common_mode_rel": s.common_mode_rel,
                "level_rel": s.level_rel,
                "epochs": s.epochs,
                "power_capped": c.power_capped,
                "accuracy_rows": check.rows,
                "accuracy_mismatches": check.mismatches,
            }
        )
    return pa.Table.from_pylist(rows, schema=arrow_schema("mixed-sweep"))


@dataclass(frozen=True, slots=True)
class MixedSweepOutput:
    """What a mixed sweep wrote."""

    output: SweepOutput
    protocol_sha256: str
    checks: Mapping[tuple[int, int], OutputCheck] = field(default_factory=dict)


def write_mixed_sweep(
    result: SweepResult,
    plan: MixedPlan,
    out: Path,
    *,
    fingerprint: Fingerprint,
    provenance: Provenance,
    checks: Mapping[tuple[int, int], OutputCheck],
) -> SweepOutput:
    """Write the mixed samples, then the mixed summary that names them (both atomic).

    Raises:
        MeasurementError: no arm kept a sample.
    """
    table = mixed_summary_table(result, plan, checks)
    if table.num_rows == 0:
        raise MeasurementError(
            "no mixed cell kept any sample; nothing to write (the journal keeps what was taken)"
        )
    spath = samples_path(out)
    samples_sha = write_unsigned_artifact(
        spath, result.samples, kind="mixed-sweep-samples", fingerprint=fingerprint, provenance=provenance
    )
    extra = {
        **provenance.extra,
        **run_record(result, spath, samples_sha),
        "output_checks": {f"{g}/{c}": v.detail for (g, c), v in sorted(checks.items())},
        "plan_source": plan.source,
        "plan_skipped": dict(plan.skipped),
        "workload_mixed_steps": plan.workload_mixed_steps,
    }
    summary = {
        "cells": sum(1 for r in table.column("capacity").to_pylist() if r != MIXED_NATIVE),
        "groups": len(plan.groups),
        "route": plan.route.to_dict(),
        "k": plan.route.physical_k,
        "protocol_sha256": result.config.digest(),
        "pricing_semantics": PRICING_SEMANTICS,
    }
    summary_sha = write_unsigned_artifact(
        out,
        table,
        kind="mixed-sweep",
        fingerprint=fingerprint,
        provenance=replace(provenance, extra=extra),
        summary=summary,
    )
    return SweepOutput(out, spath, summary_sha, samples_sha)


@dataclass(frozen=True, slots=True)
class MixedSweepRequest:
    """Everything ``dspark-calibrate sweep --mixed`` was asked to do.

    Attributes:
        backend: backend name or import string.
        plan: the groups and cells to measure (from a workload or a grid).
        ladder: the deployment's graph ladder (recorded in the fingerprint; not measured here).
        out: summary Parquet path.
        backend_options, protocol, thresholds, seed, fingerprint, live, clock_policy, journal,
            resume, command: as for a decode sweep.
    """

    backend: str
    plan: MixedPlan
    ladder: tuple[int, ...]
    out: Path
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    protocol: str = "adaptive"
    thresholds: Thresholds = field(default_factory=Thresholds)
    seed: int = 0
    fingerprint: Fingerprint | None = None
    live: Mapping[str, Any] = field(default_factory=dict)
    clock_policy: str | None = None
    journal: Path | None = None
    resume: bool = False
    command: tuple[str, ...] | None = None


def _rank_of(comm: Communicator, plan: MixedPlan) -> int:
    """The rank whose share this process runs: its own, or rank 0's in a single process."""
    deployment_ranks(plan.route.world_size, comm.world_size)
    return comm.rank if comm.world_size > 1 else 0


def execute_mixed(
    request: MixedSweepRequest,
    *,
    comm: Communicator | None = None,
    on_event: Callable[[SweepEvent], None] | None = None,
) -> tuple[SweepResult, MixedSweepOutput | None]:
    """Measure a mixed plan and write its artifacts on rank 0.

    Raises:
        ConfigError: a bad request (backend without mixed steps, a journal of another
            configuration, processes that do not match the world size).
        MeasurementError: the measurement or an output check failed.
    """
    plan = request.plan
    if comm is None:
        comm = from_environment()
    rank = _rank_of(comm, plan)
    backend = load_backend(request.backend, dict(request.backend_options))
    try:
        adapter = _MixedAdapter(backend, plan, rank)
        fields = adapter.fingerprint_fields()
        context_len = fields.pop("context_len", None)
        fingerprint = build_fingerprint(
            k=plan.route.physical_k,
            ladder=request.ladder,
            world_size=plan.route.world_size,
            backend_fields=fields,
            base=deployment_base(
                given=request.fingerprint, live_arguments=request.live, backend_fields=fields
            ),
            clock_policy=request.clock_policy,
            context_len=context_len,
        )
        config = SweepConfig(
            k=plan.route.physical_k,
            ladder=tuple(g.index for g in plan.groups),
            cells=plan.cells(),
            protocol=request.protocol,
            thresholds=request.thresholds,
            seed=request.seed,
            backend=adapter.describe(),
            world_size=comm.world_size,
            fingerprint=fingerprint.to_dict(),
            mixed=plan.to_dict(),
        )
        out = request.out
        result = run_sweep(
            config,
            adapter,  # type: ignore[arg-type]  # the adapter builds MixedCellSpec cells
            journal_path=request.journal or default_journal_path(out),
            resume=request.resume,
            comm=comm,
            on_event=on_event,
        )
        checks = _output_checks(adapter, config)
        if comm.rank != 0:
            return result, None
        provenance = _mixed_provenance(request, backend, adapter, config, comm.world_size)
        output = write_mixed_sweep(
            result, plan, out, fingerprint=fingerprint, provenance=provenance, checks=checks
        )
        return result, MixedSweepOutput(output, config.digest(), checks)
    finally:
        backend.close()


def _output_checks(adapter: _MixedAdapter, config: SweepConfig) -> dict[tuple[int, int], OutputCheck]:
    """Every measured mixed cell's output check against its native arm.

    Raises:
        MeasurementError: a check could not run.
    """
    checks: dict[tuple[int, int], OutputCheck] = {}
    for cell in config.cells:
        if isinstance(cell, MixedCellSpec) and cell.capacity != MIXED_NATIVE:
            try:
                checks[cell.key] = adapter.check(cell)
            except (RuntimeError, ValueError, ArithmeticError) as exc:
                raise MeasurementError(f"output check of {cell.label()} failed: {exc!r}") from exc
    return checks


def _mixed_provenance(
    request: MixedSweepRequest, backend: Backend, adapter: _MixedAdapter, config: SweepConfig, processes: int
) -> Provenance:
    """The mixed sweep's provenance (``processes``: the processes that measured it)."""
    return Provenance(
        tool_version=__version__,
        command=tuple(request.command if request.command is not None else [shlex.quote(a) for a in sys.argv]),
        backend=backend.name,
        synthetic=bool(backend.synthetic),
        clock_policy=request.clock_policy,
        stopping_rule={"protocol": config.protocol, **config.thresholds.to_dict()},
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        extra={
            "backend": dict(config.backend),
            "telemetry": adapter.telemetry().describe(),
            "world_size": request.plan.route.world_size,
            "processes": processes,
            "pricing": "slowest rank of each sample" if processes > 1 else "rank 0's share of the step",
        },
    )


def import_mixed(
    input_path: Path,
    *,
    route: MixedRoute,
    ladder: tuple[int, ...],
    out: Path,
    fingerprint: Fingerprint | None = None,
    live: Mapping[str, Any] | None = None,
    clock_policy: str | None = None,
    thresholds: Thresholds | None = None,
    seed: int = 0,
    command: tuple[str, ...] | None = None,
) -> tuple[SweepResult, MixedSweepOutput]:
    """Summarize mixed profiler records (``import-samples``) like a mixed sweep's own.

    Each run of consecutive records of one geometry is one round; natives (actual rows = native
    rows) pair their group's cells. No output check runs (nothing here can run a forward).

    Raises:
        ConfigError: unreadable or malformed records, an invalid geometry, a cell without native.
    """
    try:
        data = input_path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{input_path}: cannot read profiler samples: {exc}") from exc
    imported = parse_mixed_profiler_jsonl(data.splitlines(), source=str(input_path))
    plan = plan_from_geometries([s.geometry for s in imported.samples], route, source=str(input_path))
    k = plan.route.physical_k
    index = {g.features: g.index for g in plan.groups}
    rounds: dict[Cell, list[tuple[int, float]]] = {}
    for geo, pairs in group_rounds(imported.samples).items():
        capacity = MIXED_NATIVE if geo.actual_rank_rows == geo.native_rank_rows else geo.capacity
        rounds[MixedCellSpec(index[geo.rank_features], capacity, k)] = pairs
    fp = build_fingerprint(
        k=k,
        ladder=ladder,
        world_size=plan.route.world_size,
        backend_fields={},
        base=deployment_base(given=fingerprint, live_arguments=live or {}, backend_fields={}),
        clock_policy=clock_policy,
    )
    config = SweepConfig(
        k=k,
        ladder=tuple(g.index for g in plan.groups),
        cells=plan.cells(),
        protocol="fixed",
        thresholds=thresholds or Thresholds(),
        seed=seed,
        backend={"name": "import-samples", "input": str(input_path)},
        world_size=1,
        fingerprint=fp.to_dict(),
        mixed=plan.to_dict(),
    )
    result = result_from_rounds(config, rounds, f"imported from {imported.source}")
    provenance = Provenance(
        tool_version=__version__,
        command=command or tuple(sys.argv),
        backend="import-samples",
        clock_policy=clock_policy,
        stopping_rule={"protocol": "imported"},
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        extra={"input": str(input_path), "decode_records_skipped": imported.decode_skipped},
    )
    output = write_mixed_sweep(result, plan, out, fingerprint=fp, provenance=provenance, checks={})
    return result, MixedSweepOutput(output, config.digest(), {})
