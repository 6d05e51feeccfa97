"""The sweep harness: measure T(G, V) for every cell, to a stated precision, resumably, across ranks.

:func:`run_sweep` drives one backend through interleaved, randomized rounds (DESIGN §7): every
round visits each open cell once in a seeded random order; a visit re-warms the cell (its first
visit also prepares it and runs the full warm-up), takes a few samples, reads telemetry after each
and appends the visit to the journal (fsynced). After each round the injected stopping rule decides
per cell (:mod:`~dspark_calibrate.calibrate.measurement.stats`). Everything that takes time (timer, backend,
telemetry, communicator) is injected, so the loop runs on CPU with a virtual clock.

:func:`write_sweep` turns a :class:`SweepResult` into the two unsigned artifacts: the per-cell
summary (kind ``sweep``) and the raw samples (kind ``sweep-samples``, ``<stem>.samples.parquet``),
both written atomically; the summary's provenance records the samples file's logical hash.
:func:`sweep` does both for the CLI. Signing is ``build``'s job; this module never imports
``cryptography``.
"""

from __future__ import annotations

import bisect
import math
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dspark_calibrate import __version__
from dspark_calibrate.artifacts import (
    Fingerprint,
    ModelError,
    Provenance,
    canonical_json,
    logical_sha256,
    sha256_hex,
    write_unsigned_artifact,
)
from dspark_calibrate.calibrate.measurement import resources
from dspark_calibrate.calibrate.measurement.backends import Backend, load_backend
from dspark_calibrate.calibrate.measurement.backends.import_samples import group_rounds, read_profiler_jsonl
from dspark_calibrate.calibrate.measurement.carryover import (
    Carryover,
    VisitRecord,
    estimate_carryover,
    next_rewarm,
)
from dspark_calibrate.calibrate.measurement.controls import (
    ControlBias,
    control_biases,
    relative_to_native,
    widen_saving,
)
from dspark_calibrate.calibrate.measurement.distributed import (
    VISIT_FIELDS,
    Communicator,
    SingleProcess,
    from_environment,
)
from dspark_calibrate.calibrate.measurement.dwell import (
    Dwell,
    check_dwell,
    dwell_at,
    dwell_from_json,
    dwell_to_json,
    stay_for_dwell,
)
from dspark_calibrate.calibrate.measurement.journal import Journal, read_journal
from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec, plan_cells
from dspark_calibrate.calibrate.measurement.mixed import Cell, MixedCellSpec
from dspark_calibrate.calibrate.measurement.order import (
    ServingOrder,
    g_blocks,
    interleaved_steps,
    visit_order,
)
from dspark_calibrate.calibrate.measurement.protocol import (
    MIX_STAYS,
    MixTerm,
    ProtocolTerm,
    SplitSample,
    mix_arm,
    mix_term,
    protocol_term,
    saving_at_native_clock,
    widen_for_clock,
    widen_for_mix,
    widen_for_order,
    widen_for_protocol,
    widen_for_settling,
    within_visit_drift,
)
from dspark_calibrate.calibrate.measurement.stats import (
    NO_BETWEEN_RUN,
    BetweenRun,
    CellProgress,
    CellSamples,
    CellSummary,
    Decision,
    FixedProtocolRule,
    PrecisionRule,
    Status,
    StoppingRule,
    StopReason,
    Thresholds,
    common_round_effects,
    estimate_between_run,
    group_paired,
    summarize,
)
from dspark_calibrate.calibrate.measurement.sweep_plot import plot_sweep
from dspark_calibrate.calibrate.measurement.telemetry import SW_POWER_CAP, Telemetry, drop_mask, reason_names
from dspark_calibrate.calibrate.measurement.timing import SequenceTimer, SplitTimer, Step, Timer
from dspark_calibrate.errors import ConfigError, MeasurementError, ProbeError
from dspark_calibrate.runtime_plugin.live import CPU_DEVICE, SYNTHETIC_DEVICE, collect_live

__all__ = [
    "IMPORT_BACKEND",
    "POWER_CAPPED_SETTLE_S",
    "PROTOCOLS",
    "CellResult",
    "SweepConfig",
    "SweepEvent",
    "SweepOutput",
    "SweepRequest",
    "SweepResult",
    "build_fingerprint",
    "check_reference_resources",
    "check_resolve",
    "default_journal_path",
    "deployment_base",
    "deployment_ranks",
    "execute",
    "result_from_imported",
    "result_from_rounds",
    "resummarize",
    "round_order",
    "run_record",
    "run_sweep",
    "samples_path",
    "sweep",
    "write_sweep",
]

#: Measurement protocols: ``adaptive`` (rounds + precision stopping), ``fixed`` (128 + 64, one visit).
PROTOCOLS: tuple[str, ...] = ("adaptive", "fixed")
#: Errors a backend may raise from ``prepare`` or a step that mean the measurement failed (a CUDA
#: error is a ``RuntimeError``); they become :class:`MeasurementError` naming the cell.
_BACKEND_ERRORS = (RuntimeError, OSError, ValueError, ArithmeticError, ProbeError)


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """Everything that decides what a sweep measures and how; its digest keys the journal.

    Attributes:
        k: physical draft length K.
        ladder: rank-local graph batch sizes, increasing.
        cells: the cells to measure, sorted.
        protocol: ``adaptive`` or ``fixed``.
        thresholds: measurement thresholds.
        seed: seeds the round order and the bootstrap.
        backend: the backend's JSON description.
        world_size: number of ranks.
        fingerprint: the deployment fingerprint as a dict.
        mixed: for a mixed sweep, the plan's JSON form (``MixedPlan.to_dict``); its cells are then
            :class:`~dspark_calibrate.calibrate.measurement.mixed.MixedCellSpec` and ``ladder``
            holds the group indices (each group pairs its cells like a G does).
        order: the serving order's JSON form (:meth:`~.order.ServingOrder.to_dict`), or None for a
            seeded random order in every round.
        interleave: visit one G's open cells together, in one sequence that alternates them step
            by step (:func:`~.order.interleaved_steps`), instead of one cell per visit: every cell
            is then timed at the clock its G's mix runs at (decode sweeps only).
        settle_s: with ``interleave``, seconds each visit runs its G's mix untimed before timing
            it (None: :data:`SETTLE_S`); a power-capped GPU's operating point follows the mix with
            a delay of seconds (docs/sweep.md "Interleaved visits").
        dwell: with ``interleave``, the mean run (steps) a policy stays on one cell, one for
            every G or one per G (:mod:`~.dwell`): every visit lays its cells out in runs of its
            G's mean length (:func:`~.dwell.stay_for_dwell`).
            None: half the rounds switch every step and half run cells in runs
            (:data:`~.protocol.MIX_STAYS`), and the intervals hold both. At a power cap a saving
            moves with the dwell (docs/sweep.md "The policy's dwell").
        resolve_rel: with ``interleave`` and re-capture, the paired shift each G's own cells must
            resolve before its native cell may stop (:func:`~.stats.group_paired`): the G is
            visited on, every cell timed (design 5), until its epochs resolve it, the budget ends
            the sweep, or no number of epochs up to :data:`~.reml.MAX_EPOCHS_FACTOR` times its
            own would. None: a G stops when its cells reach their precision.
    """

    k: int
    ladder: tuple[int, ...]
    cells: tuple[Cell, ...]
    protocol: str
    thresholds: Thresholds
    seed: int
    backend: Mapping[str, Any]
    world_size: int = 1
    fingerprint: Mapping[str, Any] = field(default_factory=dict)
    mixed: Mapping[str, Any] | None = None
    order: Mapping[str, Any] | None = None
    interleave: bool = False
    settle_s: float | None = None
    dwell: Dwell | None = None
    resolve_rel: float | None = None

    def __post_init__(self) -> None:
        check_settle(self.settle_s, interleave=self.interleave)
        check_resolve(self.resolve_rel, interleave=self.interleave, recapture=self.thresholds.recapture_every > 0)
        check_dwell(self.dwell, interleave=self.interleave, ladder=self.ladder)
        if self.interleave and self.mixed is not None:
            raise ConfigError("--interleave alternates decode cells; a mixed sweep visits one step at a time")
        if self.order is not None and self.mixed is not None:
            raise ConfigError(
                "--order serving orders decode cells; a mixed sweep visits its steps in random order"
            )
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"--protocol {self.protocol!r} is unknown; use one of {list(PROTOCOLS)}")
        if not self.cells:
            raise ConfigError("the sweep has no cells; check --ladder and --budgets")
        if len(set(self.cells)) != len(self.cells):
            raise ConfigError("the sweep lists a cell twice")
        want = MixedCellSpec if self.mixed is not None else CellSpec
        if not all(isinstance(c, want) for c in self.cells):
            raise ConfigError(
                f"a {'mixed' if self.mixed is not None else 'decode'} sweep measures only {want.__name__}s"
            )
        bad = sorted(c.label() for c in self.cells if c.k != self.k or c.key[0] not in self.ladder)
        if bad:
            raise ConfigError(f"cells {bad} do not belong to K={self.k} and ladder {list(self.ladder)}")
        natives = {c.key[0] for c in self.cells if c.kind is CellKind.NATIVE}
        missing = sorted(set(self.ladder) - natives)
        if missing and self.mixed is not None:
            raise ConfigError(f"every mixed step needs its native arm; missing for steps {missing}")
        if missing:
            raise ConfigError(f"every G needs its native cell (V=0); missing for G={missing}")

    @property
    def samples_kind(self) -> str:
        """The kind of the raw-samples table: ``sweep-samples`` or ``mixed-sweep-samples``."""
        return "sweep-samples" if self.mixed is None else "mixed-sweep-samples"

    @property
    def key_columns(self) -> tuple[str, str]:
        """The samples table's names of a cell's key."""
        return ("graph_batch_size", "verifier_budget") if self.mixed is None else ("mixed_group", "capacity")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the journal header stores it)."""
        out = {
            "k": self.k,
            "ladder": list(self.ladder),
            "cells": [list(c.key) for c in self.cells],
            "protocol": self.protocol,
            "thresholds": self.thresholds.to_dict(),
            "seed": self.seed,
            "backend": dict(self.backend),
            "world_size": self.world_size,
            "fingerprint": dict(self.fingerprint),
        }
        if self.mixed is not None:  # decode sweeps keep their digest
            out["mixed"] = dict(self.mixed)
        if self.order is not None:  # so does a random order
            out["order"] = dict(self.order)
        if self.interleave:  # and a sweep of one cell per visit
            out["interleave"] = INTERLEAVE_DESIGN
        if self.settle_s is not None:  # and an interleaved sweep at the default settle
            out["settle_s"] = self.settle_s
        if self.dwell is not None:  # a sweep of both mix designs keeps its digest
            out["dwell"] = dwell_to_json(self.dwell)
        if self.resolve_rel is not None:  # and a sweep that stops each G on its precision
            out["resolve_rel"] = self.resolve_rel
        return out

    def visit_stay(self, round_index: int, g: int) -> float:
        """The stay probability of an interleaved visit to ``g`` in round ``round_index``: its
        dwell's, or the round's mix design's (:attr:`dwell`)."""
        if self.dwell is not None:
            return stay_for_dwell(dwell_at(self.dwell, g))
        return MIX_STAYS[mix_arm(round_index)]

    @property
    def settle_seconds(self) -> float:
        """Seconds an interleaved visit runs its mix untimed first (:attr:`settle_s`)."""
        return SETTLE_S if self.settle_s is None else self.settle_s

    @property
    def serving_order(self) -> ServingOrder | None:
        """The serving order the rounds follow, or None (random)."""
        return None if self.order is None else ServingOrder.from_dict(self.order)

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of :meth:`to_dict`."""
        return sha256_hex(canonical_json(self.to_dict()))

    def stopping_rule(self) -> StoppingRule:
        """The rule the protocol implies."""
        if self.protocol == "fixed":
            return FixedProtocolRule(self.thresholds)
        return PrecisionRule(self.thresholds)


@dataclass(frozen=True, slots=True)
class SampleRow:
    """One raw sample as stored (journal and ``sweep-samples`` table)."""

    round: int
    rank: int
    sample_index: int
    ms: float
    replays: int
    sm_clock_mhz: float | None
    temperature_c: float | None
    power_w: float | None
    throttle_reasons: int | None
    kept: bool
    epoch: int = 0
    previous: tuple[int, int] | None = None
    warmup: int = 0
    first_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Compact JSON form for the journal (``first`` only where the first replay was timed)."""
        out = self._json()
        if self.first_ms is not None:
            out["first"] = self.first_ms
        return out

    def split(self) -> SplitSample | None:
        """The sample with its first replay, or None where that was not timed."""
        if self.first_ms is None:
            return None
        return SplitSample(self.ms, self.first_ms, self.replays, self.round, self.epoch)

    def _json(self) -> dict[str, Any]:
        return {
            "round": self.round,
            "rank": self.rank,
            "i": self.sample_index,
            "ms": self.ms,
            "replays": self.replays,
            "sm": self.sm_clock_mhz,
            "temp": self.temperature_c,
            "power": self.power_w,
            "thr": self.throttle_reasons,
            "kept": self.kept,
            "epoch": self.epoch,
            "prev": None if self.previous is None else list(self.previous),
            "warm": self.warmup,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SampleRow:
        """Inverse of :meth:`to_json`."""
        return cls(
            int(d["round"]),
            int(d["rank"]),
            int(d["i"]),
            float(d["ms"]),
            int(d["replays"]),
            d["sm"],
            d["temp"],
            d["power"],
            d["thr"],
            bool(d["kept"]),
            int(d.get("epoch", 0)),
            None if d.get("prev") is None else (int(d["prev"][0]), int(d["prev"][1])),
            int(d.get("warm", 0)),
            None if d.get("first") is None else float(d["first"]),
        )


@dataclass
class _CellState:
    spec: Cell
    rows: list[SampleRow] = field(default_factory=list)
    visits: int = 0
    seconds: float = 0.0
    warmup_steps: int = 0
    visited_rounds: set[int] = field(default_factory=set)
    decision: Decision | None = None

    def kept(self) -> CellSamples:
        rows = [r for r in self.rows if r.kept]
        return CellSamples(
            self.spec, tuple(r.ms for r in rows), tuple(r.round for r in rows), tuple(r.epoch for r in rows)
        )


@dataclass(frozen=True, slots=True)
class CellResult:
    """One measured cell: summary statistics, stop decision, telemetry and the samples' hash.

    ``summary`` is ``None`` when no sample was kept (budget ran out before the cell's first visit,
    or every sample was throttled).
    """

    spec: Cell
    summary: CellSummary | None
    decision: Decision
    samples_taken: int
    dropped_throttled: int
    warmup_steps: int
    replays_per_sample: int
    sm_clock_mhz_median: float | None
    temperature_c_max: float | None
    power_w_median: float | None
    source_result_sha256: str
    power_capped: int = 0
    control_bias: ControlBias | None = None
    control_widened: bool = False
    clock_rel: float | None = None
    power_rel: float | None = None
    carryover_rel: float | None = None
    protocol: ProtocolTerm | None = None
    mix: MixTerm | None = None

    def at_native_clock(self) -> float | None:
        """A compact cell's saving at its native cell's SM clock (:func:`~.protocol.saving_at_native_clock`);
        None for other cells (they run the native width) or without telemetry."""
        if self.summary is None or self.clock_rel is None or self.spec.kind is not CellKind.COMPACT:
            return None
        return saving_at_native_clock(self.summary.saving, self.clock_rel)


@dataclass(frozen=True, slots=True)
class SweepEvent:
    """Progress report for a UI: kind is ``estimate`` (before measuring; ``detail`` says what the
    sweep needs), ``stage`` (work outside the rounds: loading the backend, probing the deployment,
    summarising, writing, plotting; ``detail`` names it), ``round``, ``visit``, ``cell_done``,
    ``rewarm`` (``detail`` says why the re-warm grew) or ``end``. ``eta_s`` comes from the measured
    time per visit."""

    kind: str
    round: int
    cells_done: int
    cells_total: int
    cell: Cell | None = None
    half_width_rel: float | None = None
    eta_s: float | None = None
    decision: Decision | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class SweepResult:
    """Everything a sweep measured, with per-cell results (sorted by (G, V)).

    ``carryover`` is the carry-over estimate over every visit (None for a mixed or imported sweep)
    and ``rewarm_steps`` the re-warm the sweep ended with (it grows while carry-over moves a saving
    by more than ``Thresholds.carryover_limit_rel``).
    """

    config: SweepConfig
    cells: tuple[CellResult, ...]
    samples: pa.Table
    rounds: int
    seconds: float
    resumed: bool
    between: BetweenRun = NO_BETWEEN_RUN
    paused: bool = False
    carryover: Carryover | None = None
    rewarm_steps: int | None = None

    @property
    def complete(self) -> bool:
        """True when every cell has a summary."""
        return all(c.summary is not None for c in self.cells)

    @property
    def all_precise(self) -> bool:
        """True when every cell stopped on precision (or completed the fixed protocol)."""
        return all(c.decision.status is Status.ACCEPT for c in self.cells)

    def summary_table(self) -> pa.Table:
        """The ``sweep`` table: one row per measured cell (cells without samples are left out).

        Decode sweeps only; a mixed sweep's table is ``mixed_sweep.mixed_summary_table``.
        """
        rows = [c for c in self.cells if c.summary is not None]
        cols: dict[str, list[Any]] = {name: [] for name in _SUMMARY_COLUMNS}
        for c in rows:
            s = c.summary
            assert s is not None
            assert isinstance(c.spec, CellSpec)
            values = (
                c.spec.graph_batch_size,
                c.spec.verifier_budget,
                c.spec.tokens,
                s.median_ms,
                s.ci_low_ms,
                s.ci_high_ms,
                s.p10_ms,
                s.p90_ms,
                s.iqr_ms,
                s.samples,
                s.rounds,
                c.dropped_throttled,
                c.warmup_steps,
                c.replays_per_sample,
                c.decision.reason,
                c.sm_clock_mhz_median,
                c.temperature_c_max,
                c.power_w_median,
                c.source_result_sha256,
                s.saving,
                s.saving_ci_low,
                s.saving_ci_high,
                s.paired_rounds,
                s.common_mode_rel,
                s.level_rel,
                s.epochs,
                c.power_capped,
                *self._checks(c),
            )
            for name, value in zip(_SUMMARY_COLUMNS, values, strict=True):
                cols[name].append(value)
        return pa.table(cols)

    def _checks(self, c: CellResult) -> tuple[Any, ...]:
        """The bias-check columns of one cell (schema 3)."""
        bias = c.control_bias
        # Null where nothing was estimated: fewer than two epochs, or no cell paired in two.
        estimated = self.between.estimated and self.between.paired_cells > 0
        mine = self.between.for_cell(c.spec)  # σ_d of the cell's G, as its saving interval carries it
        return (
            None if bias is None else bias.bias,
            None if bias is None else bias.low,
            None if bias is None else bias.high,
            c.control_widened,
            mine.paired_rel if estimated else None,
            mine.paired_carried(self.config.thresholds.confidence) if estimated else None,
            c.clock_rel,
            c.power_rel,
            c.carryover_rel,
            *self._protocol_columns(c),
        )

    @staticmethod
    def _protocol_columns(c: CellResult) -> tuple[float | None, ...]:
        """The step protocol's and the clock's columns of one cell (schema 4; null where not
        measured)."""
        term, at_clock = c.protocol, c.at_native_clock()
        if term is None:
            return (None, None, None, None, at_clock)
        return (
            term.pipelined_ms,
            term.synchronous_ms,
            term.saving_pipelined,
            term.saving_synchronous,
            at_clock,
        )

    def settling_summary(self) -> dict[str, Any]:
        """An interleaved sweep's settling check: the settle each visit ran first (``settle_s``),
        per G how far the native cell's step time moves from a visit's first sample to its last
        (:func:`~.protocol.within_visit_drift`) and the G that moves most, and per G the largest
        move of a compact cell's saving over a visit, ``(1 − s)·(1 − exp(d_cell − d_native))``
        for drifts ``d`` and saving ``s`` (``saving_move_per_g``, with its cell in
        ``saving_move_cell``): visits whose savings still move are shorter than the mix needs to
        settle. ``measured`` is False for a sweep of one cell per visit."""
        if not self.config.interleave or self.config.mixed is not None:
            return {"measured": False}
        names = ["graph_batch_size", "verifier_budget", "round", "sample_index", "step_time_ms", "kept"]
        cols = self.samples.select(names)
        rows: dict[tuple[int, int], list[tuple[int, int, float]]] = {}
        for g, v, rnd, i, ms, kept in zip(*(c.to_pylist() for c in cols.columns), strict=True):
            if kept:
                rows.setdefault((int(g), int(v)), []).append((int(rnd), int(i), float(ms)))
        drift = {key: within_visit_drift(r) for key, r in rows.items()}
        per_g = {str(g): d for (g, v), d in sorted(drift.items()) if v == 0}
        moved = [(abs(d), g) for g, d in per_g.items() if d is not None]
        moves: dict[str, tuple[float, str]] = {}
        for c in self.cells:
            spec = c.spec
            if not isinstance(spec, CellSpec) or spec.kind is not CellKind.COMPACT or c.summary is None:
                continue
            mine, native = drift.get(spec.key), drift.get((spec.key[0], 0))
            if mine is None or native is None:
                continue
            move = (1.0 - c.summary.saving) * -math.expm1(mine - native)
            g = str(spec.key[0])
            if g not in moves or abs(move) > abs(moves[g][0]):
                moves[g] = (move, spec.label())
        return {
            "measured": True,
            "settle_s": self.config.settle_seconds,
            "per_g": per_g,
            "largest_g": max(moved)[1] if moved else None,
            "saving_move_per_g": {g: m for g, (m, _) in sorted(moves.items(), key=lambda x: int(x[0]))},
            "saving_move_cell": {g: cell for g, (_, cell) in sorted(moves.items(), key=lambda x: int(x[0]))},
        }

    def control_summary(self) -> dict[str, Any]:
        """Per G, the control cell's saving (0 is the truth), its interval and whether the G's
        compact savings were widened for it."""
        seen = {
            c.control_bias.graph_batch_size: c.control_bias for c in self.cells if c.control_bias is not None
        }
        return {str(g): b.to_dict() for g, b in sorted(seen.items())}

    def protocol_summary(self) -> dict[str, Any]:
        """The step protocol's term (:mod:`.protocol`): per G the median launch a waiting step pays
        beyond a queued one (its native cell's), and the largest move of a compact saving between
        the sweep's protocol and either serving protocol, with its cell. ``measured`` is False where
        no cell has it (single-replay samples, a timer that cannot split a sample)."""
        terms = [(c, c.protocol) for c in self.cells if c.protocol is not None]
        if not terms:
            return {"measured": False}
        launch = {
            str(c.spec.key[0]): t.launch_ms
            for c, t in terms
            if isinstance(c.spec, CellSpec) and c.spec.kind is CellKind.NATIVE
        }
        largest, where = 0.0, None
        for c, t in terms:
            if c.summary is None:
                continue
            for saving in (t.saving_pipelined, t.saving_synchronous):
                if saving is not None and abs(saving - c.summary.saving) > largest:
                    largest, where = abs(saving - c.summary.saving), c.spec.label()
        return {"measured": True, "launch_ms_per_g": launch, "largest_saving_shift": largest, "cell": where}

    def mix_summary(self) -> dict[str, Any]:
        """An interleaved sweep's mix term (:func:`~.protocol.mix_term`): the largest move of a
        compact saving between the design that switches cells every step and that of runs, with its
        cell. ``measured`` is False for a sweep of one cell per visit."""
        if not self.config.interleave:
            return {"measured": False}
        dwell = self.config.dwell
        if dwell is not None:
            stays = {str(g): self.config.visit_stay(0, g) for g in self.config.ladder}
            return {
                "measured": False,
                "dwell": dwell_to_json(dwell),
                "stays": sorted(set(stays.values())) if not isinstance(dwell, Mapping) else stays,
            }
        largest, where = 0.0, None
        for c in self.cells:
            t = c.mix
            if t is None or t.saving_switching is None or t.saving_runs is None:
                continue
            if abs(t.saving_runs - t.saving_switching) > abs(largest):
                largest, where = t.saving_runs - t.saving_switching, c.spec.label()
        return {"measured": True, "stays": list(MIX_STAYS), "runs_minus_switching": largest, "cell": where}

    def clock_summary(self) -> dict[str, Any]:
        """The clock's term (:func:`~.protocol.widen_for_clock`): the largest amount a compact
        saving would lose at its native cell's SM clock, with its cell (0 and None without telemetry
        or where every cell ran at its native's clock)."""
        largest, where = 0.0, None
        for c in self.cells:
            at_clock = c.at_native_clock()
            if c.summary is None or at_clock is None:
                continue
            moved = c.summary.saving - at_clock
            if abs(moved) > abs(largest):
                largest, where = moved, c.spec.label()
        return {"largest_saving_shift": largest, "cell": where}

    def unmeasured(self) -> tuple[Cell, ...]:
        """Cells without any kept sample."""
        return tuple(c.spec for c in self.cells if c.summary is None)

    def throttle_summary(self) -> dict[str, Any]:
        """What the throttle policy kept: counts, the power-capped share, the reasons seen."""
        kept = self.samples.column("kept").to_numpy(zero_copy_only=False).astype(bool)
        reasons = self.samples.column("throttle_reasons").to_numpy(zero_copy_only=False)
        bits = np.nan_to_num(reasons.astype(np.float64), nan=0.0).astype(np.int64)
        seen = int(np.bitwise_or.reduce(bits)) if bits.size else 0
        capped = int(np.count_nonzero(kept & (bits & SW_POWER_CAP > 0)))
        return {
            "policy": self.config.thresholds.throttle_policy,
            "samples_taken": int(kept.size),
            "samples_kept": int(kept.sum()),
            "power_capped_share": capped / int(kept.sum()) if kept.any() else 0.0,
            "reasons_seen": reason_names(seen),
        }


_SUMMARY_COLUMNS = (
    "graph_batch_size",
    "verifier_budget",
    "tokens",
    "step_time_ms",
    "ci_low_ms",
    "ci_high_ms",
    "p10_ms",
    "p90_ms",
    "iqr_ms",
    "samples",
    "rounds",
    "dropped_throttled",
    "warmup_steps",
    "replays_per_sample",
    "stop_reason",
    "sm_clock_mhz_median",
    "temperature_c_max",
    "power_w_median",
    "source_result_sha256",
    "saving",
    "saving_ci_low",
    "saving_ci_high",
    "paired_rounds",
    "common_mode_rel",
    "level_rel",
    "epochs",
    "power_capped",
    "control_bias",
    "control_bias_ci_low",
    "control_bias_ci_high",
    "control_widened",
    "paired_rel",
    "paired_rel_upper",
    "clock_rel",
    "power_rel",
    "carryover_rel",
    "pipelined_ms",
    "synchronous_ms",
    "saving_pipelined",
    "saving_synchronous",
    "saving_at_native_clock",
)


def round_order(
    seed: int, round_index: int, cells: Iterable[Cell], order: ServingOrder | None = None
) -> list[Cell]:
    """The visiting order of ``cells`` in one round: seeded random, or the serving order (pure,
    reproducible; see :func:`~.order.visit_order`)."""
    return visit_order(list(cells), seed=seed, round_index=round_index, order=order)


def samples_path(out: Path) -> Path:
    """``<stem>.samples.parquet`` beside the summary file."""
    return out.with_name(out.stem + ".samples.parquet")


def default_journal_path(out: Path) -> Path:
    """``<stem>.journal.jsonl`` beside the summary file."""
    return out.with_name(out.stem + ".journal.jsonl")


#: A decode sweep's cell key in its samples table (a mixed sweep names its own).
_DECODE_KEYS = ("graph_batch_size", "verifier_budget")


def _samples_table(states: Iterable[_CellState], keys: tuple[str, str] = _DECODE_KEYS) -> pa.Table:
    """The raw samples of ``states`` (a decode sweep's columns, with the carry-over columns; a mixed
    sweep names its key ``keys`` and has no carry-over columns)."""
    cols: dict[str, list[Any]] = {name: [] for name in _SAMPLE_COLUMNS}
    carry: dict[str, list[Any]] = {
        "prev_graph_batch_size": [],
        "prev_verifier_budget": [],
        "warmup": [],
        "first_replay_ms": [],
    }
    for st in states:
        for r in st.rows:
            values = (
                *st.spec.key,
                r.round,
                r.rank,
                r.sample_index,
                r.ms,
                r.replays,
                r.sm_clock_mhz,
                r.temperature_c,
                r.power_w,
                r.throttle_reasons,
                r.kept,
                r.epoch,
            )
            for name, value in zip(_SAMPLE_COLUMNS, values, strict=True):
                cols[name].append(value)
            carry["prev_graph_batch_size"].append(None if r.previous is None else r.previous[0])
            carry["prev_verifier_budget"].append(None if r.previous is None else r.previous[1])
            carry["warmup"].append(r.warmup)
            carry["first_replay_ms"].append(r.first_ms)
    names = dict(zip(_DECODE_KEYS, keys, strict=True))
    table = pa.table(
        {
            **{
                names.get(n, n): pa.array(cols[n], pa.int64())
                for n in ("graph_batch_size", "verifier_budget", "round", "rank")
            },
            "sample_index": pa.array(cols["sample_index"], pa.int64()),
            "step_time_ms": pa.array(cols["step_time_ms"], pa.float64()),
            "replays": pa.array(cols["replays"], pa.int64()),
            "sm_clock_mhz": pa.array(cols["sm_clock_mhz"], pa.float64()),
            "temperature_c": pa.array(cols["temperature_c"], pa.float64()),
            "power_w": pa.array(cols["power_w"], pa.float64()),
            "throttle_reasons": pa.array(cols["throttle_reasons"], pa.int64()),
            "kept": pa.array(cols["kept"], pa.bool_()),
            "epoch": pa.array(cols["epoch"], pa.int64()),
        }
    )
    if keys != _DECODE_KEYS:
        return table
    for name, column in carry.items():
        kind = pa.float64() if name == "first_replay_ms" else pa.int64()
        table = table.append_column(name, pa.array(column, kind))
    return table


_SAMPLE_COLUMNS = (
    "graph_batch_size",
    "verifier_budget",
    "round",
    "rank",
    "sample_index",
    "step_time_ms",
    "replays",
    "sm_clock_mhz",
    "temperature_c",
    "power_w",
    "throttle_reasons",
    "kept",
    "epoch",
)


def _finite_or_none(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _median_or_none(values: Sequence[float | None], how: Callable[[np.ndarray], float]) -> float | None:
    clean = np.array([v for v in values if v is not None], dtype=np.float64)
    return float(how(clean)) if clean.size else None


def _finish_cell(
    st: _CellState,
    config: SweepConfig,
    between: BetweenRun,
    reference: CellSamples | None,
    native: _CellState | None = None,
) -> CellResult:
    th = config.thresholds
    kept = st.kept()
    summary = None
    if kept.raw_ms:
        summary = summarize(
            kept,
            reference=reference if reference is not None and reference.raw_ms else None,
            between=between,
            confidence=th.confidence,
            n_boot=th.n_boot,
            seed=config.seed,
            reproduction=th.reproduction,
            between_run_rel=th.between_run_rel,
        )
    decision = st.decision or Decision(
        Status.UNKNOWN, "not_measured", "the sweep ended before this cell stopped"
    )
    # A mixed cell's measurement is the pair: its native arm's samples and its own.
    sources = [native, st] if config.mixed is not None and native is not None else [st]
    cell_table = _samples_table(sources, config.key_columns)
    rows_kept = [r for r in st.rows if r.kept]
    return CellResult(
        spec=st.spec,
        summary=summary,
        decision=decision,
        samples_taken=len(st.rows),
        dropped_throttled=sum(1 for r in st.rows if not r.kept),
        warmup_steps=st.warmup_steps,
        replays_per_sample=th.replays_per_sample,
        sm_clock_mhz_median=_median_or_none([r.sm_clock_mhz for r in rows_kept], np.median),
        temperature_c_max=_median_or_none([r.temperature_c for r in rows_kept], np.max),
        power_w_median=_median_or_none([r.power_w for r in rows_kept], np.median),
        source_result_sha256=logical_sha256(cell_table, config.samples_kind),
        power_capped=sum(1 for r in rows_kept if (r.throttle_reasons or 0) & SW_POWER_CAP),
    )


def finish_cells(
    config: SweepConfig, states: Mapping[Cell, _CellState], *, passes: bool = False
) -> tuple[tuple[CellResult, ...], BetweenRun, Carryover | None]:
    """Summarize every cell: the sweep's between-epoch components first (``passes``: its epochs
    were separate processes), then each cell paired with the native cell of its G (of its step, in
    a mixed sweep); a decode sweep's cells then get their bias checks (control bias, clock and
    power scaling, carry-over)."""
    kept = {c: st.kept() for c, st in states.items()}
    between = estimate_between_run(
        {c: s for c, s in kept.items() if s.raw_ms},
        confidence=config.thresholds.confidence,
        epochs_are_processes=passes,
    )
    results = tuple(
        _finish_cell(
            states[c],
            config,
            between.for_cell(c),
            None if c.kind is CellKind.NATIVE else kept.get(c.native),
            None if c.kind is CellKind.NATIVE else states.get(c.native),
        )
        for c in config.cells
    )
    if config.mixed is not None:
        return results, between, None
    carry = _carryover(states)
    if not config.interleave:
        return _with_checks(results, carry, _protocol_terms(states)), between, carry
    # One design at the policy's dwell has no second design to hold.
    mix = {
        c: t
        for c in config.cells
        if config.dwell is None
        and (t := mix_term(kept[c], None if c.kind is CellKind.NATIVE else kept.get(c.native))) is not None
    }
    settle = {c: _visit_drift(st) for c, st in states.items()}
    checked = _with_checks(results, carry, _protocol_terms(states), _clock_in_visits(states), mix, settle)
    return checked, between, carry


def _visit_drift(st: _CellState) -> float | None:
    """The cell's within-visit drift over its kept samples (:func:`~.protocol.within_visit_drift`)."""
    return within_visit_drift([(r.round, r.sample_index, r.ms) for r in st.rows if r.kept])


def _clock_in_visits(states: Mapping[Cell, _CellState]) -> dict[Cell, float | None]:
    """Each cell's SM clock relative to its native cell's in the same visits (an interleaved
    sweep): the median over rounds of the ratio of their round medians. Cells of one G visited
    together share the mix's clock, but the mix changes as cells stop, so a cell measured only in
    early rounds would otherwise be compared with the native cell's clock over every round."""
    def by_round(st: _CellState) -> dict[int, float]:
        clocks: dict[int, list[float]] = {}
        for r in st.rows:
            if r.kept and r.sm_clock_mhz is not None and r.sm_clock_mhz > 0:
                clocks.setdefault(r.round, []).append(r.sm_clock_mhz)
        return {k: float(np.median(v)) for k, v in clocks.items()}

    out: dict[Cell, float | None] = {}
    for cell, st in states.items():
        mine, native = by_round(st), by_round(states[cell.native]) if cell.native in states else {}
        ratios = [mine[k] / native[k] for k in mine.keys() & native.keys()]
        out[cell] = float(np.median(ratios)) if ratios else None
    return out


def _visits(states: Mapping[Cell, _CellState], rewarm: int | None = None) -> list[VisitRecord]:
    """One record per visit with kept samples that followed another visit in its process (only
    visits re-warmed with ``rewarm`` replays when given)."""
    out = []
    for cell, st in states.items():
        if not isinstance(cell, CellSpec):
            continue
        by_round: dict[int, list[SampleRow]] = {}
        for r in st.rows:
            if r.kept and r.previous is not None and (rewarm is None or r.warmup == rewarm):
                by_round.setdefault(r.round, []).append(r)
        for rnd, rows in by_round.items():
            before = rows[0].previous
            assert before is not None  # filtered above
            median = float(np.median([r.ms for r in rows]))
            previous = CellSpec(before[0], before[1], cell.k)
            out.append(VisitRecord(cell, rnd, rows[0].epoch, math.log(median), previous, rows[0].warmup))
    return out


def _carryover(states: Mapping[Cell, _CellState], rewarm: int | None = None) -> Carryover | None:
    """The carry-over estimate over the visits (:func:`_visits`), or None without any."""
    visits = _visits(states, rewarm)
    if not visits:
        return None
    logs: dict[Cell, dict[int, float]] = {}
    for v in visits:
        logs.setdefault(v.cell, {})[v.round] = v.log_median
    return estimate_carryover(visits, common_round_effects(logs))


def _protocol_terms(states: Mapping[Cell, _CellState]) -> dict[Cell, ProtocolTerm]:
    """Every decode cell's step protocol's term (:mod:`.protocol`), paired with its native cell."""
    split: dict[Cell, list[SplitSample]] = {}
    for cell, st in states.items():
        kept = [r.split() for r in st.rows if r.kept]
        rows = [r for r in kept if r is not None]
        if isinstance(cell, CellSpec) and rows and len(rows) == len(kept):
            split[cell] = rows
    out = {}
    for cell, rows in split.items():
        native = None if cell.kind is CellKind.NATIVE else cell.native
        term = protocol_term(cell, rows, native, split.get(native, ()) if native is not None else ())
        if term is not None:
            out[cell] = term
    return out


def _with_checks(
    results: Sequence[CellResult],
    carry: Carryover | None,
    protocol: Mapping[Cell, ProtocolTerm] | None = None,
    clock: Mapping[Cell, float | None] | None = None,
    mix: Mapping[Cell, MixTerm] | None = None,
    settle: Mapping[Cell, float | None] | None = None,
) -> tuple[CellResult, ...]:
    """The cells with their control bias (and widened savings where it is not 0), their clock and
    power relative to the native cell (``clock``: given, else the ratio of their medians), the
    carry-over's shift of their median, their step protocol's term (intervals stretched to hold
    both protocols), an interleaved sweep's mix term (to hold both designs) and its settling term
    (``settle``: each cell's within-visit drift; intervals stretched to hold where visits end)."""
    summaries = {c.spec: c.summary for c in results}
    biases = control_biases(summaries)
    if clock is None:
        clock = relative_to_native({c.spec: c.sm_clock_mhz_median for c in results})
    power = relative_to_native({c.spec: c.power_w_median for c in results})
    out = []
    for c in results:
        bias = biases.get(c.spec.key[0])
        summary = c.summary
        widened = False
        if (
            bias is not None
            and summary is not None
            and c.spec.kind is CellKind.COMPACT
            and bias.excludes_zero
        ):
            summary, widened = widen_saving(summary, bias), True
        shift = carry.cell_shift.get(c.spec) if carry is not None and isinstance(c.spec, CellSpec) else None
        term = (protocol or {}).get(c.spec)
        if term is not None and summary is not None:
            summary = widen_for_protocol(summary, term)
        mixed = (mix or {}).get(c.spec)
        if mixed is not None and summary is not None:
            summary = widen_for_mix(summary, mixed)
        if settle is not None and summary is not None:
            native = None if c.spec.kind is CellKind.NATIVE else settle.get(c.spec.native)
            summary = widen_for_settling(summary, settle.get(c.spec), native)
        if summary is not None and c.spec.kind is CellKind.COMPACT:
            # Only a lighter cell gains clock under a cap; the control and forced-K arm run the
            # native width, and widening them would only add telemetry noise to the overhead price.
            summary = widen_for_clock(summary, clock.get(c.spec))
        if summary is not None:
            summary = widen_for_order(summary, shift)
        out.append(
            replace(
                c,
                summary=summary,
                control_bias=bias,
                control_widened=widened,
                clock_rel=clock.get(c.spec),
                power_rel=power.get(c.spec),
                carryover_rel=shift,
                protocol=term,
                mix=mixed,
            )
        )
    return tuple(out)


#: The version of the interleaved visit's design, in the configuration (so in its digest): 2 queues
#: the settle and the timed steps as one sequence (no idle gap between them); 3 times a balanced
#: sequence (:func:`~.order.interleaved_steps` with ``balanced``: blocks, run forward then
#: backward); 4 keeps a G's whole mix in every visit (a cell that has stopped still runs, its times
#: dropped, :meth:`_Harness._mix_fill`); 5 keeps those times as the stopped cell's samples (its steps
#: run in the mix all the same, so they cost nothing); a journal of an earlier design is not resumed
#: under this one.
INTERLEAVE_DESIGN = 5
#: Seconds an interleaved visit runs its G's mix untimed before it times it by default (at least
#: the sweep's re-warm). On an H200 at its power cap a heavy G entered after a lighter one ran 3%
#: fast for 0.2 s and 0.3-0.6% for the next 0.8 s (benchmarks/settling_curve.py): such GPUs want
#: :data:`POWER_CAPPED_SETTLE_S`; the default keeps sweeps of lighter, uncapped steps short.
SETTLE_S = 0.2
#: The settle of a GPU at its power cap (``--preset power-capped``, or ``--settle-s`` by hand).
POWER_CAPPED_SETTLE_S = 0.75
#: The longest settle ``--settle-s`` accepts, in seconds (a visit per G per round pays it).
MAX_SETTLE_S = 60.0


def check_settle(settle_s: float | None, *, interleave: bool) -> None:
    """Refuse a settle that is not a finite number of seconds in ``0..MAX_SETTLE_S``, or one
    given without ``--interleave`` (the only visits that settle).

    Raises:
        ConfigError: naming ``--settle-s`` and the fix.
    """
    if settle_s is None:
        return
    if not interleave:
        raise ConfigError("--settle-s sets an interleaved visit's untimed mix; add --interleave")
    if not (math.isfinite(settle_s) and 0.0 <= settle_s <= MAX_SETTLE_S):
        raise ConfigError(f"--settle-s {settle_s!r} is not a number of seconds in 0..{MAX_SETTLE_S:g}")


#: The largest paired shift ``--resolve`` accepts (5%: a step's epochs move by far less).
MAX_RESOLVE_REL = 0.05


def check_resolve(
    resolve_rel: float | None, *, interleave: bool, recapture: bool, in_passes: bool = False
) -> None:
    """Refuse a ``--resolve`` outside ``(0, MAX_RESOLVE_REL]``, or one the design cannot act on:
    without ``--interleave`` a G's stopped cells are not timed while its native measures on,
    without re-capture there are no epochs to resolve a shift between, and in a sweep of several
    processes (``in_passes``) a pass's epochs are other processes'.

    Raises:
        ConfigError: naming ``--resolve`` and the fix.
    """
    if resolve_rel is None:
        return
    if not (math.isfinite(resolve_rel) and 0.0 < resolve_rel <= MAX_RESOLVE_REL):
        raise ConfigError(f"--resolve {resolve_rel!r} is not a relative shift in (0, {MAX_RESOLVE_REL:g}]; e.g. 0.004")
    if not interleave:
        raise ConfigError(
            "--resolve keeps a G measuring until its own cells resolve the shift, which only an "
            "interleaved visit times them for once they stopped; add --interleave"
        )
    if not recapture:
        raise ConfigError("--resolve needs capture epochs to resolve a shift between; set --recapture-every >= 1")
    if in_passes:
        raise ConfigError(
            "--resolve measures a G on inside one process; a sweep in passes gets its epochs from its "
            "processes: drop --resolve or --passes"
        )


#: Steps of an interleaved sequence between two telemetry readings (and between two waits of the
#: host for the device: the next chunk is queued before the one before it is waited for).
_CHUNK_STEPS = 8


@dataclass(frozen=True, slots=True)
class _Measured:
    """One cell's samples from one visit on this rank: times (ms), first replays (ms, NaN where
    not timed apart) and telemetry readings (SM clock, temperature, power, throttle reasons)."""

    n: int
    times: Sequence[float]
    firsts: Sequence[float]
    readings: Sequence[tuple[float, float, float, float]]


def _reading(telemetry: Telemetry) -> tuple[float, float, float, float]:
    """One telemetry reading as floats (NaN for a field the source cannot read)."""
    r = telemetry.read()
    values = (r.sm_clock_mhz, r.temperature_c, r.power_w, r.throttle_reasons)
    return tuple(math.nan if x is None else float(x) for x in values)  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class _Replayed:
    """What journal records set beyond the cells' samples (None: no record set it)."""

    seconds: float
    round: int | None
    rewarm: int | None
    finished: bool


def _replay_records(states: Mapping[Cell, _CellState], records: Sequence[Mapping[str, Any]]) -> _Replayed:
    """Add journal records' samples, visits and stop decisions to ``states``; return the rest.

    Raises:
        ConfigError: a record names a cell ``states`` does not hold.
    """
    by_key = {c.key: c for c in states}

    def state(rec: Mapping[str, Any]) -> _CellState:
        spec = by_key.get((int(rec["g"]), int(rec["v"])))
        if spec is None:
            raise ConfigError(f"journal names cell ({rec['g']}, {rec['v']}), which this sweep does not measure")
        return states[spec]

    seconds, rnd, rewarm, finished = 0.0, None, None, False
    for rec in records:
        kind = rec.get("type")
        if kind == "visit":
            st = state(rec)
            st.rows.extend(SampleRow.from_json(s) for s in rec["samples"])
            st.visits += 1
            st.seconds += float(rec["seconds"])
            seconds += float(rec["seconds"])
            st.warmup_steps += int(rec["warmup"])
            st.visited_rounds.add(int(rec["round"]))
        elif kind == "stop":
            state(rec).decision = Decision(Status(rec["status"]), str(rec["reason"]), str(rec.get("detail", "")))
        elif kind == "round":
            rnd = int(rec["round"]) + 1
        elif kind == "rewarm":
            rewarm = int(rec["steps"])
        elif kind == "done":
            finished = True
    return _Replayed(seconds, rnd, rewarm, finished)


def resummarize(journal_path: Path, *, passes: bool) -> SweepResult:
    """A recorded decode sweep summarised again from its journal, with this version's statistics
    and without its backend: what a change to the intervals does to a sweep already measured
    (its digest-keyed configuration and every kept and dropped sample are in the journal).
    ``passes``: its epochs were separate processes (the journal does not say; the summary's
    ``between_run.epochs_are_processes`` does).

    Raises:
        ConfigError: an unreadable journal, or a mixed sweep's (its cells are geometries).
    """
    contents = read_journal(journal_path)
    head = contents.header.get("config")
    if not isinstance(head, Mapping):
        raise ConfigError(f"{journal_path}: the journal's header holds no sweep configuration")
    if head.get("mixed") is not None:
        raise ConfigError(f"{journal_path}: a mixed sweep's journal cannot be summarised again here")
    try:
        k = int(head["k"])
        config = SweepConfig(
            k=k,
            ladder=tuple(int(g) for g in head["ladder"]),
            cells=tuple(CellSpec(int(g), int(v), k) for g, v in head["cells"]),
            protocol=str(head["protocol"]),
            thresholds=Thresholds.from_dict(head["thresholds"]),
            seed=int(head["seed"]),
            backend=dict(head["backend"]),
            world_size=int(head["world_size"]),
            fingerprint=dict(head["fingerprint"]),
            order=head.get("order"),
            interleave=bool(head.get("interleave")),
            settle_s=head.get("settle_s"),
            dwell=dwell_from_json(head.get("dwell")),
            resolve_rel=head.get("resolve_rel"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{journal_path}: the journal's configuration is incomplete ({exc!r})") from exc
    states = {c: _CellState(c) for c in config.cells}
    done = _replay_records(states, contents.records)
    results, between, carry = finish_cells(config, states, passes=passes)
    table = _samples_table((states[c] for c in config.cells), config.key_columns)
    return SweepResult(
        config,
        results,
        table,
        done.round or 0,
        done.seconds,
        True,
        between=between,
        paused=not done.finished,
        carryover=carry,
        rewarm_steps=config.thresholds.rewarm_steps if done.rewarm is None else done.rewarm,
    )


class _Harness:
    """The mutable state of one running sweep; :func:`run_sweep` is its only user."""

    def __init__(
        self,
        config: SweepConfig,
        backend: Backend,
        timer: Timer,
        telemetry: Telemetry,
        comm: Communicator,
        rule: StoppingRule,
        on_event: Callable[[SweepEvent], None] | None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.timer = timer
        self.telemetry = telemetry
        self.comm = comm
        self.rule = rule
        self.on_event = on_event
        self.states = {c: _CellState(c) for c in config.cells}
        self.by_key = {c.key: c for c in config.cells}
        self.steps: dict[Cell, Step] = {}
        self.step_epoch: dict[Cell, int] = {}
        # Re-capture needs a backend that can build a cell's step again (default: yes).
        self.recapture = config.thresholds.recapture_every > 0 and bool(getattr(backend, "recapture", True))
        self.mask = drop_mask(config.thresholds.throttle_policy)
        self.seconds_total = 0.0  # kept equal to the sum of every cell's seconds
        self.pass_epoch: int | None = None  # set when this process is one pass of several
        self.eta: float | None = None  # estimated once per round
        # Wall time of this process's visits and the sweep seconds they added: the ETA is wall time
        # (a synthetic backend's sweep seconds are simulated; a GPU's exclude host work).
        self.wall_visits = 0
        self.wall_s = 0.0
        self.wall_sweep_s = 0.0
        self.round = 0
        self.journal: Journal | None = None
        self.finished = False
        self.half_width: dict[Cell, float] = {}
        # Re-warm replays of a later visit: grows while carry-over moves a saving too far (the
        # journal's ``rewarm`` records restore it on resume).
        self.rewarm = config.thresholds.rewarm_steps
        # The cell visited last in this process: what the next visit's carry-over comes from. A
        # new process (a pass, a resume) starts without one.
        self.last_cell: Cell | None = None
        self.order = config.serving_order
        # The mean step (ms) of each G's cells, for an interleaved visit's re-warm (:meth:`_settle_steps`).
        self.settle_ms: dict[int, float] = {}
        if config.interleave and not isinstance(timer, SequenceTimer):
            raise ConfigError(
                f"--interleave times a G's cells in one sequence, which {type(timer).__name__} (the "
                f"{getattr(backend, 'name', 'backend')!r} backend's timer) cannot do; drop --interleave"
            )

    # -- journal replay ---------------------------------------------------------------------------
    def replay(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Rebuild the state from journal records (identical on every rank)."""
        done = _replay_records(self.states, records)
        self.seconds_total += done.seconds
        self.round = done.round if done.round is not None else self.round
        self.rewarm = done.rewarm if done.rewarm is not None else self.rewarm
        self.finished = self.finished or done.finished

    # -- measuring --------------------------------------------------------------------------------
    def open_cells(self) -> list[Cell]:
        return [c for c, st in self.states.items() if st.decision is None]

    def epoch(self, round_index: int) -> int:
        """The capture epoch a round belongs to (0 without re-capture; this process's pass when the
        sweep runs in passes)."""
        if self.pass_epoch is not None:
            return self.pass_epoch
        return round_index // self.config.thresholds.recapture_every if self.recapture else 0

    def _siblings_open(self, native: Cell) -> bool:
        """Whether another cell of the native cell's G still measures (the native stays to pair)."""
        return any(
            c.native == native and c != native and st.decision is None for c, st in self.states.items()
        )

    def _g_resolves(self, native: Cell) -> bool:
        """Whether the native cell's G may stop as far as ``--resolve`` goes: no target; its own
        cells resolve it (:func:`~.stats.group_paired`); or no projected number of epochs would
        (more rounds cannot help). A G whose cells do not yet span two epochs measures on."""
        target = self.config.resolve_rel
        if target is None:
            return True
        kept = {c: st.kept() for c, st in self.states.items() if c.native == native and st.rows}
        group = group_paired(kept, native, confidence=self.config.thresholds.confidence, target=target)
        if group is None or group.resolvable is None:
            return False
        return group.resolvable <= target or group.epochs_factor is None

    def sweep_seconds(self) -> float:
        return self.seconds_total

    def _write(self, records: Sequence[Mapping[str, Any]], *, sync: bool = True) -> None:
        if self.journal is not None:
            self.journal.append_many(records, sync=sync)

    def _emit(self, event: SweepEvent) -> None:
        if self.on_event is not None and self.comm.rank == 0:
            self.on_event(event)

    def _samples_wanted(self, cell: Cell) -> int:
        """Samples this visit takes of ``cell``: the per-visit count, never past the per-cell cap,
        except that a native cell measures on past its cap while cells of its G still pair with it."""
        th = self.config.thresholds
        taken = len(self.states[cell].rows)
        if cell.kind is CellKind.NATIVE and taken >= th.max_samples_per_cell:
            return th.samples_per_visit
        return max(1, min(th.samples_per_visit, th.max_samples_per_cell - taken))

    def _needs_capture(self, cell: Cell, epoch: int) -> bool:
        """A new capture epoch builds the cell's step again and warms it up fully: what a new
        process would see (graph capture, memory placement) becomes visible to the statistics."""
        return cell not in self.steps or self.step_epoch.get(cell) != epoch

    def _capture(self, cell: Cell, epoch: int) -> None:
        """(Re)build the cell's step for ``epoch``, releasing the previous capture."""
        if cell in self.steps:
            del self.steps[cell]
            release = getattr(self.backend, "release", None)
            if callable(release):
                release(cell)
        # A mixed sweep's backend is an adapter that builds MixedCellSpec cells.
        self.steps[cell] = self.backend.prepare(cell)  # type: ignore[arg-type]
        self.step_epoch[cell] = epoch

    def _visit(self, cell: Cell) -> None:
        th = self.config.thresholds
        epoch = self.epoch(self.round)
        first = self._needs_capture(cell, epoch)
        warm = th.warmup_steps if first else self.rewarm
        n_samples = self._samples_wanted(cell)
        self.comm.barrier()
        t0 = self.timer.now()
        times, firsts, readings, failure = self._measure(
            cell, epoch, first=first, warm=warm, n_samples=n_samples
        )
        seconds = self.timer.now() - t0
        record = self._record(
            cell, _Measured(n_samples, times, firsts, readings), failure, seconds=seconds, warm=warm,
            epoch=epoch, previous=self.last_cell,
        )  # fmt: skip
        self.last_cell = cell
        self._write([record], sync=False)

    def _visit_group(self, cells: Sequence[Cell]) -> None:
        """One visit to several cells of one G, alternated step by step (``--interleave``).

        Cells captured anew in this epoch get their full warm-up alone first; then the settle runs
        every cell ``rewarm`` times in one interleaving and the timed sequence each cell
        ``samples × replays`` times in another (:func:`~.order.interleaved_steps`, balanced: blocks
        run forward then backward, so a clock wandering over the visit slows every cell alike),
        both of the round's design (:func:`~.protocol.mix_arm`: switching every step, or runs),
        queued as one sequence so the device never idles between them (the settle's times are
        dropped).
        A cell's sample is the mean of its next ``replays`` steps of the sequence, its telemetry
        the first reading taken after the last of them; every sample's previous cell is the one
        visited before the group (the carry-over the group as a whole inherits).
        The G's cells that have stopped run in the sequence as well, as many steps as a cell that
        measures (:meth:`_mix_fill`; the records name them, ``fill``): every visit keeps the G's
        whole mix, so the cells still measuring are timed at the clock of the design's mix, not of a
        lighter or heavier one left by the cells that stopped (on an H200 at its cap, G=64's cells
        ran at 1860-1875 MHz with two of its four cells left against 1815 with all four, and a
        compact saving 0.3-0.4 pp lower). The visit's time is charged to the cells that measure.
        A stopped cell's steps are timed like the others' and kept as its samples (its own record,
        ``stopped``, charged no seconds): its decision only said it needs no more, and steps it runs
        anyway pair with its native in the same rounds. A control cell reaches its precision in a
        few rounds while its G measures on for its compact cells (on an H200, G=128's control
        stopped after 7 of its native's 76 rounds), and its saving is the bias check of those
        rounds: kept, its point rests on every round its G ran (design 5).
        """
        th = self.config.thresholds
        epoch = self.epoch(self.round)
        fill = self._mix_fill(cells)
        group = [*cells, *fill]
        firsts = [self._needs_capture(c, epoch) for c in group]
        rewarm = self._settle_steps(group)
        warms = [th.warmup_steps + rewarm if f else rewarm for f in firsts]
        counts = [self._samples_wanted(c) for c in cells]
        counts += [max(counts)] * (len(group) - len(cells))
        # Every rank draws the same sequences: steps with collectives must match across ranks.
        rng = np.random.default_rng([self.config.seed, self.round, int(cells[0].key[0]), 0x1E])
        stay = self.config.visit_stay(self.round, int(cells[0].key[0]))
        warm_order = interleaved_steps([rewarm] * len(group), rng, stay=stay)
        order = interleaved_steps([n * th.replays_per_sample for n in counts], rng, stay=stay, balanced=True)
        self.comm.barrier()
        t0 = self.timer.now()
        measured, failure = self._measure_group(group, epoch, firsts, counts, warm_order, order)
        seconds = self.timer.now() - t0
        timed = [sum(m.times) * th.replays_per_sample for m in measured[: len(cells)]]
        share = [t / sum(timed) if sum(timed) > 0 else 1.0 / len(cells) for t in timed]
        previous = self.last_cell
        records = [
            self._record(c, m, failure, seconds=seconds * w, warm=warm, epoch=epoch, previous=previous)
            for c, m, w, warm in zip(cells, measured[: len(cells)], share, warms[: len(cells)], strict=True)
        ]
        for record in records if fill else ():
            record["fill"] = [list(c.key) for c in fill]  # the journal says which cells kept the mix
        for c, m, warm in zip(fill, measured[len(cells) :], warms[len(cells) :], strict=True):
            record = self._record(c, m, failure, seconds=0.0, warm=warm, epoch=epoch, previous=previous)
            records.append({**record, "stopped": True})
        self.last_cell = group[order[-1]] if order else group[-1]
        self._write(records, sync=False)

    def _mix_fill(self, cells: Sequence[Cell]) -> list[Cell]:
        """The cells of ``cells``' G that no longer measure (decided), which an interleaved visit
        runs beside them so that the G's mix stays the design's, its times kept as samples
        (:meth:`_visit_group`)."""
        g = int(cells[0].key[0])
        return [
            c
            for c in self.config.cells
            if int(c.key[0]) == g and c not in cells and self.states[c].decision is not None
        ]

    def _settle_steps(self, cells: Sequence[Cell]) -> int:
        """Re-warm replays of each cell before an interleaved visit's timed sequence: the sweep's
        re-warm, or more, so that the untimed mix runs at least the settle (``--settle-s``,
        :data:`SETTLE_S` by default; estimated from
        the medians of the cells' samples so far; the sweep's re-warm alone before any). A visit
        inherits the clock state the previous G left, and a power-capped GPU's clock takes a
        fraction of a second to settle to the new mix; a serving engine stays at one G for many
        steps, so what it sees is the settled clock. A G's mean step is kept once its cells have
        samples, so its visits share few re-warm levels (what the carry-over estimate groups by)."""
        g = int(cells[0].key[0])
        if g not in self.settle_ms:
            medians = [float(np.median([r.ms for r in self.states[c].rows])) for c in cells if self.states[c].rows]
            if len(medians) < len(cells):
                return self.rewarm
            self.settle_ms[g] = max(float(np.mean(medians)), 1e-9)
        settle_s = self.config.settle_seconds
        return max(math.ceil(1000.0 * settle_s / (self.settle_ms[g] * len(cells))), self.rewarm)

    def _measure_group(
        self,
        cells: Sequence[Cell],
        epoch: int,
        firsts: Sequence[bool],
        counts: Sequence[int],
        warm_order: Sequence[int],
        order: Sequence[int],
    ) -> tuple[list[_Measured], BaseException | None]:
        """Run one group's interleaved sequence on this rank and cut it into each cell's samples
        (:meth:`_visit_group`); a failure is returned, not raised (see :meth:`_measure`)."""
        th = self.config.thresholds
        replays = th.replays_per_sample
        marks: list[tuple[int, tuple[float, float, float, float]]] = []

        def on_chunk(last: int) -> None:
            marks.append((last, _reading(self.telemetry)))

        empty = [_Measured(n, [], [], []) for n in counts]
        try:
            for cell, first in zip(cells, firsts, strict=True):
                if first:
                    self._capture(cell, epoch)
                    if th.warmup_steps:
                        self.timer.warm(self.steps[cell], th.warmup_steps)
            steps = [self.steps[c] for c in cells]
            assert isinstance(self.timer, SequenceTimer)  # checked when the sweep starts
            # The settle is queued in the same sequence as the timed steps, its times dropped:
            # waiting for it to finish would leave the device idle before the first timed step,
            # and a power-capped GPU's clock rises in that gap, so the first timed steps (the
            # heavy native ones most) would run fast.
            lead = len(warm_order)
            full = [*warm_order, *order]
            ms = self.timer.measure_sequence(steps, full, chunk=_CHUNK_STEPS, on_chunk=on_chunk)[lead:]
            if len(ms) != len(order) or not marks or marks[-1][0] != len(full) - 1:
                raise MeasurementError(
                    f"timer returned {len(ms)} step times for {len(order)} timed steps, telemetry last "
                    f"read after step {marks[-1][0] - lead if marks else None}"
                )
        except (*_BACKEND_ERRORS, MeasurementError) as exc:
            return empty, exc
        at = [m - lead for m, _ in marks]
        out = []
        for index, n in enumerate(counts):
            mine = [i for i, c in enumerate(order) if c == index]
            times, readings = [], []
            for j in range(n):
                part = mine[j * replays : (j + 1) * replays]
                times.append(float(np.mean([ms[i] for i in part])))
                readings.append(marks[bisect.bisect_left(at, part[-1])][1])
            out.append(_Measured(n, times, [math.nan] * n, readings))
        return out, None

    def _record(
        self,
        cell: Cell,
        measured: _Measured,
        failure: BaseException | None,
        *,
        seconds: float,
        warm: int,
        epoch: int,
        previous: Cell | None,
    ) -> dict[str, Any]:
        """Gather one cell's samples of a visit from every rank, refuse a failed or unusable
        one, add its rows to the cell and return its journal record."""
        st = self.states[cell]
        n_samples = measured.n
        local = np.full((n_samples, len(VISIT_FIELDS)), np.nan)
        if failure is None:
            local[:, 0] = measured.times
            local[:, 1:5] = np.array(measured.readings, dtype=np.float64).reshape(n_samples, 4)
            local[:, 6] = measured.firsts
        local[:, 5] = seconds
        gathered = self.comm.gather_visit(local)  # (world, samples, fields)
        self._refuse_bad_ranks(cell, gathered[:, :, 0], failure)
        rows = self._sample_rows(
            gathered, n_samples, first_index=len(st.rows), epoch=epoch, warmup=warm, previous=previous
        )
        visit_seconds = float(np.max(gathered[:, 0, 5]))
        st.rows.extend(rows)
        st.visits += 1
        st.seconds += visit_seconds
        self.seconds_total += visit_seconds
        st.warmup_steps += warm
        st.visited_rounds.add(self.round)
        return {
            "type": "visit",
            "g": cell.key[0],
            "v": cell.key[1],
            "round": self.round,
            "warmup": warm,
            "seconds": visit_seconds,
            "samples": [r.to_json() for r in rows],
        }

    def _measure(
        self, cell: Cell, epoch: int, *, first: bool, warm: int, n_samples: int
    ) -> tuple[list[float], list[float], list[tuple[float, float, float, float]], BaseException | None]:
        """Time ``n_samples`` samples of the cell on this rank, with a telemetry reading per sample
        and each sample's first replay (NaN where the timer cannot split a sample, or it is one
        replay).

        A backend or timer failure is returned, not raised: the other ranks wait in the gather
        that follows, and a failed rank contributes NaN so that every rank raises together.
        """
        th = self.config.thresholds
        readings: list[tuple[float, float, float, float]] = []

        def on_sample(_: int) -> None:
            readings.append(_reading(self.telemetry))

        times: list[float] = []
        firsts: list[float] = []
        try:
            if first:
                self._capture(cell, epoch)
            step = self.steps[cell]
            if warm:
                self.timer.warm(step, warm)
            if isinstance(self.timer, SplitTimer) and th.replays_per_sample >= 2:
                split = self.timer.measure_split(
                    step, replays=th.replays_per_sample, samples=n_samples, on_sample=on_sample
                )
                times, firsts = [m for m, _ in split], [f for _, f in split]
            else:
                times = self.timer.measure(
                    step, replays=th.replays_per_sample, samples=n_samples, on_sample=on_sample
                )
                firsts = [math.nan] * len(times)
            if len(times) != n_samples or len(readings) != len(times):
                raise MeasurementError(
                    f"timer returned {len(times)} samples and {len(readings)} telemetry readings for "
                    f"{n_samples} requested"
                )
        except (*_BACKEND_ERRORS, MeasurementError) as exc:
            return times, firsts, readings, exc
        return times, firsts, readings, None

    def _refuse_bad_ranks(self, cell: Cell, ms_all: np.ndarray, failure: BaseException | None) -> None:
        """Raise on every rank when any rank failed or timed a non-finite or non-positive sample.

        Raises:
            MeasurementError: naming the ranks, the cell and the round (the journal keeps the
                samples measured before).
        """
        bad_ranks = sorted({int(r) for r in np.nonzero(~np.isfinite(ms_all) | (ms_all <= 0))[0]})
        if not bad_ranks:
            return
        taken = sum(len(s.rows) for s in self.states.values())
        where = (
            f"rank(s) {bad_ranks} of {self.comm.world_size}" if self.comm.world_size > 1 else "the backend"
        )
        if failure is not None:
            what = f"failed here ({failure!r})"
        elif self.comm.rank in bad_ranks:
            what = f"returned non-finite or non-positive times {ms_all[self.comm.rank].tolist()!r}"
        else:
            what = "failed or returned unusable times (that rank reports why)"
        raise MeasurementError(
            f"{where} on backend {self.backend.name!r}, cell {cell.label()}, round {self.round}: {what}; "
            f"the journal keeps the {taken} samples measured before"
        ) from failure

    def _sample_rows(
        self,
        gathered: np.ndarray,
        n: int,
        *,
        first_index: int,
        epoch: int,
        warmup: int,
        previous: Cell | None,
    ) -> list[SampleRow]:
        """One row per sample: the slowest rank's time and telemetry; throttle reasons OR-ed over
        ranks, and the sample dropped when any rank reported a reason the throttle policy drops;
        with the cell visited before it in this process and the replays discarded before it."""
        th = self.config.thresholds
        ms_all = gathered[:, :, 0]
        slowest = np.argmax(ms_all, axis=0)
        thr_all = np.nan_to_num(gathered[:, :, 4], nan=0.0).astype(np.int64)
        throttled = np.any(thr_all & self.mask, axis=0)
        rows = []
        for i in range(n):
            rk = int(slowest[i])
            tel = gathered[rk, i, 1:5]
            rows.append(
                SampleRow(
                    round=self.round,
                    rank=rk,
                    sample_index=first_index + i,
                    ms=float(ms_all[rk, i]),
                    replays=th.replays_per_sample,
                    sm_clock_mhz=None if math.isnan(tel[0]) else float(tel[0]),
                    temperature_c=None if math.isnan(tel[1]) else float(tel[1]),
                    power_w=None if math.isnan(tel[2]) else float(tel[2]),
                    throttle_reasons=None if math.isnan(tel[3]) else int(np.bitwise_or.reduce(thr_all[:, i])),
                    kept=not bool(throttled[i]),
                    epoch=epoch,
                    previous=None if previous is None else previous.key,
                    warmup=warmup,
                    first_ms=_finite_or_none(gathered[rk, i, 6]),
                )
            )
        return rows

    def _check_kept_share(self) -> None:
        """Stop at once when the throttle policy drops most samples: the budget would buy nothing.

        Raises:
            MeasurementError: the kept share is below ``min_kept_share``; names the reasons seen.
        """
        th = self.config.thresholds
        rows = [r for st in self.states.values() for r in st.rows]
        if not rows or not self.mask:
            return
        kept = sum(1 for r in rows if r.kept)
        if kept / len(rows) >= th.min_kept_share:
            return
        bits = 0
        for r in rows:
            if not r.kept and r.throttle_reasons is not None:
                bits |= r.throttle_reasons
        names = ", ".join(reason_names(bits & self.mask)) or "none reported"
        if th.throttle_policy == "strict" and bits & SW_POWER_CAP:
            fix = (
                "a GPU serving at high concurrency runs at its power cap, so measure that condition: "
                "use --throttle-policy serving (the default)"
            )
        else:
            fix = (
                "cool the GPU or find what slows it (nvidia-smi -q -d PERFORMANCE), or keep these samples "
                "with --throttle-policy keep-all if serving runs under the same slowdown"
            )
        raise MeasurementError(
            f"throttle policy {th.throttle_policy!r} dropped {len(rows) - kept} of {len(rows)} samples "
            f"after round {self.round} (kept {kept / len(rows):.0%} < {th.min_kept_share:.0%}); "
            f"reasons seen: {names} (NVML clocks-event bits {hex(bits)}); {fix}. Nothing was written; "
            "the journal keeps the samples"
        )

    def _progress(self, cell: Cell, total: float) -> CellProgress:
        st = self.states[cell]
        reference = None if cell.kind is CellKind.NATIVE else self.states[cell.native].kept()
        return CellProgress(
            samples=st.kept(),
            cell_seconds=st.seconds,
            sweep_seconds=total,
            taken=len(st.rows),
            visits=st.visits,
            seed=self.config.seed,
            reference=reference,
        )

    def _decide(self) -> None:
        records = []
        total = self.sweep_seconds()
        # Non-native cells first: a native cell stops only once no cell of its G is left to pair
        # with it (the saving of a compact cell is measured against native samples of the same
        # rounds), unless the sweep's budget ends everything.
        order = sorted(self.open_cells(), key=lambda c: (c.kind is CellKind.NATIVE, c))
        for cell in order:
            st = self.states[cell]
            progress = self._progress(cell, total)
            decision = self.rule(progress)
            if self.on_event is not None and progress.samples.rounds >= 2 and decision.reason != "non_finite":
                th = self.config.thresholds
                quick = summarize(
                    progress.samples,
                    confidence=th.confidence,
                    n_boot=200,
                    seed=self.config.seed,
                    reproduction=th.reproduction,
                    between_run_rel=0.0,
                )
                self.half_width[cell] = quick.half_width_rel
            if decision.status is Status.UNKNOWN and decision.reason == "non_finite":
                raise MeasurementError(f"cell {cell.label()}: {decision.detail}")
            if (
                decision.stops
                and cell.kind is CellKind.NATIVE
                and decision.reason != StopReason.BUDGET.value
                and (self._siblings_open(cell) or not self._g_resolves(cell))
            ):
                continue
            if decision.stops:
                st.decision = decision
                records.append(
                    {
                        "type": "stop",
                        "g": cell.key[0],
                        "v": cell.key[1],
                        "round": self.round,
                        "status": decision.status.value,
                        "reason": decision.reason,
                        "detail": decision.detail,
                    }
                )
                self._emit(
                    SweepEvent(
                        "cell_done", self.round, self._done(), len(self.states), cell, None, None, decision
                    )
                )
        records.append({"type": "round", "round": self.round})
        self._write(records)
        self._check_kept_share()

    def _adapt_rewarm(self) -> None:
        """Re-warm longer from the next round on while the carry-over measured at the current
        re-warm moves a saving by more than ``carryover_limit_rel`` (:func:`~.carryover.next_rewarm`);
        journalled, so a resumed sweep continues with it. Decode sweeps only."""
        th = self.config.thresholds
        if self.config.mixed is not None or self.rewarm >= th.max_rewarm_steps:
            return
        carry = _carryover(self.states, self.rewarm)
        steps = (
            None
            if carry is None
            else next_rewarm(
                carry, current=self.rewarm, limit=th.carryover_limit_rel, maximum=th.max_rewarm_steps
            )
        )
        if carry is None or steps is None:
            return
        detail = (
            f"carry-over after a larger G moves a saving by up to {100 * carry.largest_saving_shift():.2f} pp at "
            f"{self.rewarm} re-warm replays (limit {100 * th.carryover_limit_rel:.2f} pp); re-warming {steps} from "
            f"round {self.round + 1}"
        )
        self._write([{"type": "rewarm", "round": self.round, "steps": steps, "detail": detail}])
        self.rewarm = steps
        self._emit(SweepEvent("rewarm", self.round, self._done(), len(self.states), detail=detail))

    def _done(self) -> int:
        return sum(1 for st in self.states.values() if st.decision is not None)

    def _eta(self) -> float | None:
        """A lower bound on the wall seconds left, from this process's measured visits."""
        if not self.wall_visits:
            return None
        th = self.config.thresholds
        need = sum(max(th.min_rounds - self.states[c].visits, 1) for c in self.open_cells())
        by_visits = self.wall_s / self.wall_visits * need
        if self.wall_sweep_s <= 0.0:
            return by_visits
        budget_left = max(th.budget_s - self.sweep_seconds(), 0.0) * (self.wall_s / self.wall_sweep_s)
        return min(by_visits, budget_left)

    def run(self, until_round: int | None = None) -> None:
        th = self.config.thresholds
        while not self.finished and self.open_cells():
            if until_round is not None and self.round >= until_round:
                return  # a pass ends here; the next process resumes the journal
            self.eta = self._eta()
            self._emit(SweepEvent("round", self.round, self._done(), len(self.states), eta_s=self.eta))
            order = round_order(self.config.seed, self.round, self.open_cells(), self.order)
            for block in g_blocks(order) if self.config.interleave else [[c] for c in order]:
                # Cells visited before a crash in this round are not visited again.
                block = [c for c in block if self.round not in self.states[c].visited_rounds]
                if not block:
                    continue
                if self.sweep_seconds() >= th.budget_s:
                    break
                started, before = time.perf_counter(), self.sweep_seconds()
                if self.config.interleave:
                    self._visit_group(block)
                else:
                    self._visit(block[0])
                self.wall_s += time.perf_counter() - started
                self.wall_sweep_s += self.sweep_seconds() - before
                self.wall_visits += len(block)
                for cell in block:
                    hw = self.half_width.get(cell)
                    self._emit(
                        SweepEvent("visit", self.round, self._done(), len(self.states), cell, hw, self.eta)
                    )
            self._decide()
            self._adapt_rewarm()
            self.round += 1
        if not self.finished:
            self._write([{"type": "done"}])
            self.finished = True


def _open_journal(
    config: SweepConfig, journal_path: Path | None, *, resume: bool
) -> tuple[Journal | None, list[Mapping[str, Any]], str | None]:
    """Rank 0's journal (None: none kept), the records it already holds, and the error that stops
    every rank (returned, not raised, so that rank 0 can broadcast it)."""
    if journal_path is None:
        return None, [], None
    try:
        if resume:
            journal, contents = Journal.resume(journal_path, config.digest(), config.to_dict())
            return journal, list(contents.records), None
        journal = Journal.create(
            journal_path,
            {
                "config_digest": config.digest(),
                "config": config.to_dict(),
                "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            },
        )
    except ConfigError as exc:
        return None, [], str(exc)
    return journal, [], None


def run_sweep(
    config: SweepConfig,
    backend: Backend,
    *,
    journal_path: Path | None,
    resume: bool = False,
    timer: Timer | None = None,
    telemetry: Telemetry | None = None,
    comm: Communicator | None = None,
    stopping_rule: StoppingRule | None = None,
    on_event: Callable[[SweepEvent], None] | None = None,
    until_round: int | None = None,
    pass_epoch: int | None = None,
) -> SweepResult:
    """Measure every cell of ``config`` with ``backend``; see the module docstring.

    Args:
        config: what to measure.
        backend: prepares the steps.
        journal_path: where rank 0 journals the sweep; ``None`` keeps no journal (tests).
        resume: continue the journal at ``journal_path`` instead of creating it.
        timer: times samples; default ``backend.timer()``.
        telemetry: per-sample readings; default ``backend.telemetry()``.
        comm: collectives across ranks; default one rank.
        stopping_rule: decides per cell after each round; default from ``config.protocol``.
        on_event: progress callback (rank 0 only).
        until_round: stop before this round while cells are still open (one pass of a sweep run
            in several processes; the result is ``paused`` and the journal continues it).
        pass_epoch: every round this process measures belongs to this epoch (its pass), with no
            re-capture inside it (see :mod:`~.passes`).

    Returns:
        The result, identical on every rank.

    Raises:
        ConfigError: ranks disagree, a journal exists without ``resume``, or the journal belongs
            to another configuration.
        MeasurementError: the backend failed or produced non-finite times (the journal keeps
            everything measured before).
    """
    comm = comm or SingleProcess()
    if comm.world_size != config.world_size:
        raise ConfigError(f"config is for {config.world_size} rank(s) but {comm.world_size} are running")
    comm.agree("sweep configuration", config.to_dict())
    harness = _Harness(
        config,
        backend,
        timer or backend.timer(),
        telemetry or backend.telemetry(),
        comm,
        stopping_rule or config.stopping_rule(),
        on_event,
    )
    journal, records, error = (
        _open_journal(config, journal_path, resume=resume) if comm.rank == 0 else (None, [], None)
    )
    # Every rank learns rank 0's journal error or records, so no rank measures alone.
    shared = comm.broadcast({"error": error, "records": records})
    if shared["error"] is not None:
        raise ConfigError(shared["error"] if comm.rank == 0 else f"rank 0: {shared['error']}")
    harness.journal = journal
    try:
        harness.replay(shared["records"])
        resumed = bool(shared["records"])
        begin = getattr(backend, "begin", None)
        if callable(begin):
            begin(harness.round)
        harness.pass_epoch = pass_epoch
        harness.run(until_round)
    finally:
        if journal is not None:
            journal.close()
    return _finish_sweep(config, harness, resumed=resumed)


def _finish_sweep(config: SweepConfig, harness: _Harness, *, resumed: bool) -> SweepResult:
    """Summarize every cell, tell the progress display the sweep ended, and state the result."""
    # Summarising (bootstrap intervals, between-run variation) takes seconds on a large sweep.
    harness._emit(
        SweepEvent(
            "stage",
            harness.round,
            harness._done(),
            len(harness.states),
            detail=f"summarising {len(config.cells)} cells",
        )
    )
    results, between, carry = finish_cells(config, harness.states, passes=harness.pass_epoch is not None)
    table = _samples_table((harness.states[c] for c in config.cells), config.key_columns)
    harness._emit(SweepEvent("end", harness.round, harness._done(), len(harness.states)))
    return SweepResult(
        config,
        results,
        table,
        harness.round,
        harness.sweep_seconds(),
        resumed,
        between=between,
        paused=not harness.finished,
        carryover=carry,
        rewarm_steps=harness.rewarm,
    )


def build_fingerprint(
    *,
    k: int,
    ladder: Sequence[int],
    world_size: int,
    backend_fields: Mapping[str, Any],
    base: Fingerprint | None = None,
    clock_policy: str | None = None,
    context_len: int | None = None,
) -> Fingerprint:
    """The sweep's fingerprint: K, ladders and GPU count derived here, the rest from ``base``.

    Fields the backend establishes (``gpu``, ``model_config_sha256``, …) and the derived ones must
    agree with ``base`` where ``base`` sets them.

    Raises:
        ConfigError: a conflict between ``base`` and what this sweep establishes, or an invalid field.
    """
    base = base or Fingerprint()
    # An explicit GPU count describes the deployment when the sweep measures one rank's share of
    # it (a DEP8 rank on one GPU with ``ep=8``); otherwise the ranks running are the deployment.
    gpus = base.gpu_count if base.gpu_count is not None else world_size
    derived: dict[str, Any] = {
        "max_draft_len": k,
        "rank_local_graph_batch_sizes": tuple(ladder),
        "gpu_count": gpus,
        "global_graph_batch_sizes": tuple(g * gpus for g in ladder),
        **{k2: v for k2, v in backend_fields.items() if v is not None},
    }
    if clock_policy is not None:
        derived["clock_policy"] = clock_policy
    if context_len is not None:
        derived["context_len"] = context_len
    conflicts = []
    for name, value in sorted(derived.items()):
        have = getattr(base, name)
        if have is not None and have != value:
            conflicts.append(f"{name} is {have!r} as given but this sweep has {value!r}")
    if conflicts:
        raise ConfigError(
            "fingerprint conflicts: " + "; ".join(conflicts) + "; fix --fingerprint or the --live-* option "
            "(docs/fingerprint.md)"
        )
    try:
        return base.replace(**derived)
    except (ModelError, TypeError) as exc:
        raise ConfigError(f"fingerprint: {exc}") from exc


#: Fields the sweep itself establishes (from --k, --ladder and the ranks), never from probes.
_DERIVED_FIELDS = frozenset(
    {"max_draft_len", "rank_local_graph_batch_sizes", "global_graph_batch_sizes", "gpu_count"}
)


def deployment_base(
    *,
    given: Fingerprint | None,
    live_arguments: Mapping[str, Any],
    backend_fields: Mapping[str, Any],
    probe: Callable[..., Any] | None = None,
) -> Fingerprint:
    """The fingerprint fields of the deployment this sweep measures, before K and the ladder.

    Precedence, highest first: the ``--live-*`` options, the ``--fingerprint`` file, then the host
    probes that ``dspark-verify --live`` runs on serving nodes (runtime snapshot, GPU snapshot,
    source tree), so the two sides establish each field the same way (docs/fingerprint.md). What
    the backend measured (GPU name, model config, kernels) is checked against the given values
    by :func:`build_fingerprint`; probed values the backend contradicts are dropped (the
    synthetic backend on a GPU host).

    Args:
        given: the ``--fingerprint`` file's fields.
        live_arguments: ``collect_live`` keyword arguments from the ``--live-*`` options.
        backend_fields: what the backend establishes.
        probe: the collector (default :func:`~dspark_calibrate.runtime_plugin.live.collect_live`).

    Raises:
        ConfigError: a ``--live-*`` option conflicts with the file, or a value is malformed.
    """
    args = dict(live_arguments)
    explicit = {
        name: value
        for name, value in (
            *((n, args.get(n)) for n in ("gpu", "gpu_count", "topology", "source_head", "runtime_snapshot")),
            ("source_diff_sha256", args.get("source_diff_sha256")),
            *dict(args.get("overrides") or {}).items(),
        )
        if value is not None
    }
    base = given or Fingerprint()
    clash = [
        f"{n} is {getattr(base, n)!r} in --fingerprint but {v!r} on the command line"
        for n, v in sorted(explicit.items())
        if getattr(base, n, None) is not None and getattr(base, n) != (tuple(v) if isinstance(v, list) else v)
    ]
    if clash:
        raise ConfigError("; ".join(clash) + "; give each field once (docs/fingerprint.md)")
    if "gpu" not in explicit:
        for device in (CPU_DEVICE, SYNTHETIC_DEVICE):
            if device in (base.gpu, backend_fields.get("gpu")):
                args["gpu"] = device  # a pseudo-device: the collector derives its snapshot
    try:
        ctx = (probe or collect_live)(**args)
    except ProbeError as exc:
        raise ConfigError(f"deployment fingerprint: {exc}; fix the --live-* option") from exc
    probed = {
        n: v
        for n, v in ctx.fingerprint.to_dict().items()
        if v is not None and n not in _DERIVED_FIELDS and getattr(base, n) is None
    }
    if "gpu_count" in explicit and base.gpu_count is None:
        probed["gpu_count"] = explicit["gpu_count"]
    backend_gpu = backend_fields.get("gpu")
    if backend_gpu is not None and probed.get("gpu", backend_gpu) != backend_gpu and "gpu" not in explicit:
        probed.pop("gpu", None)
        probed.pop("gpu_snapshot_sha256", None)
    try:
        return base.replace(**probed)
    except (ModelError, TypeError) as exc:
        raise ConfigError(f"deployment fingerprint: {exc}; fix the --live-* option") from exc


@dataclass(frozen=True, slots=True)
class SweepOutput:
    """What :func:`write_sweep` wrote."""

    summary_path: Path
    samples_path: Path
    summary_sha256: str
    samples_sha256: str
    plot_path: Path | None = None


def run_record(result: SweepResult, samples: Path, samples_sha: str) -> dict[str, Any]:
    """The provenance fields every sweep summary (decode or mixed) records about its run."""
    return {
        "samples_file": samples.name,
        "samples_logical_sha256": samples_sha,
        "config_digest": result.config.digest(),
        "seed": result.config.seed,
        "protocol": result.config.protocol,
        "rounds": result.rounds,
        "sweep_seconds": result.seconds,
        "unmeasured_cells": [list(c.key) for c in result.unmeasured()],
        "between_run": result.between.to_dict(),
        "throttle": result.throttle_summary(),
        **({} if result.config.mixed is not None else decode_checks(result)),
    }


def decode_checks(result: SweepResult) -> dict[str, Any]:
    """A decode sweep's bias checks for its provenance and ``--json`` report: the control bias per
    G, the carry-over per G with the re-warm the sweep ended with, and the visiting order."""
    th = result.config.thresholds
    order = result.config.serving_order
    return {
        "control_bias": result.control_summary(),
        "carryover": {
            **(result.carryover.to_dict() if result.carryover is not None else {"per_g": {}}),
            "rewarm_steps": result.rewarm_steps,
            "limit_rel": th.carryover_limit_rel,
        },
        "order": "random"
        if order is None
        else {"mode": "serving", "steps": order.steps, "source": order.source},
        "visits": "interleaved" if result.config.interleave else "one cell",
        "mix_term": result.mix_summary(),
        "settling": result.settling_summary(),
        "step_protocol": result.protocol_summary(),
        "clock_term": result.clock_summary(),
    }


def write_sweep(
    result: SweepResult,
    out: Path,
    *,
    fingerprint: Fingerprint,
    provenance: Provenance,
) -> SweepOutput:
    """Write the samples artifact, then the summary artifact that names it (both atomic).

    Raises:
        MeasurementError: no cell has a kept sample.
        ConfigError: the tables do not fit their schemas or the files cannot be written.
    """
    table = result.summary_table()
    if table.num_rows == 0:
        raise MeasurementError(
            "no cell kept any sample; nothing to write (see the journal for what was taken)"
        )
    spath = samples_path(out)
    samples_sha = write_unsigned_artifact(
        spath, result.samples, kind="sweep-samples", fingerprint=fingerprint, provenance=provenance
    )
    extra = {
        **provenance.extra,
        **run_record(result, spath, samples_sha),
        "ci_method": sorted({c.summary.ci_method for c in result.cells if c.summary is not None}),
        "warnings": {
            c.spec.label(): list(c.summary.warnings) for c in result.cells if c.summary and c.summary.warnings
        },
    }
    summary_prov = replace(provenance, extra=extra)
    summary_sha = write_unsigned_artifact(
        out,
        table,
        kind="sweep",
        fingerprint=fingerprint,
        provenance=summary_prov,
        summary={"cells": table.num_rows, "k": result.config.k, "ladder": list(result.config.ladder)},
    )
    return SweepOutput(out, spath, summary_sha, samples_sha)


def sweep(
    *,
    config: SweepConfig,
    backend: Backend,
    out: Path,
    fingerprint: Fingerprint,
    journal_path: Path | None = None,
    resume: bool = False,
    comm: Communicator | None = None,
    clock_policy: str | None = None,
    command: Sequence[str] | None = None,
    on_event: Callable[[SweepEvent], None] | None = None,
    plot: bool = False,
    until_round: int | None = None,
    pass_epoch: int | None = None,
) -> tuple[SweepResult, SweepOutput | None]:
    """Run a sweep and write its artifacts (rank 0); the one call behind ``dspark-calibrate sweep``.

    Args:
        config: what to measure (its fingerprint must equal ``fingerprint.to_dict()``).
        backend: the backend.
        out: summary Parquet path; samples go to :func:`samples_path`, the journal by default to
            :func:`default_journal_path`.
        fingerprint: the deployment fingerprint for the footer.
        journal_path: journal location override.
        resume: continue an interrupted sweep.
        comm: collectives across ranks.
        clock_policy: recorded in provenance.
        command: the command line recorded in provenance (default ``sys.argv``).
        on_event: progress callback.
        plot: also write ``<stem>.png`` (needs matplotlib).
        until_round: end this process's pass before that round (see :func:`run_sweep`); a paused
            result writes nothing.
        pass_epoch: this process's pass (see :func:`run_sweep`).

    Returns:
        The result, and the outputs on rank 0 (``None`` on other ranks and for a paused pass).

    Raises:
        ConfigError: see :func:`run_sweep`, and unwritable outputs.
        MeasurementError: see :func:`run_sweep`.
    """
    if dict(config.fingerprint) != fingerprint.to_dict():
        raise RuntimeError("config.fingerprint must be fingerprint.to_dict()")
    comm = comm or SingleProcess()
    result = run_sweep(
        config,
        backend,
        journal_path=journal_path or default_journal_path(out),
        resume=resume,
        comm=comm,
        on_event=on_event,
        until_round=until_round,
        pass_epoch=pass_epoch,
    )
    if comm.rank != 0 or result.paused:
        return result, None
    provenance = Provenance(
        tool_version=__version__,
        command=tuple(command if command is not None else [shlex.quote(a) for a in sys.argv]),
        backend=backend.name,
        synthetic=bool(backend.synthetic),
        clock_policy=clock_policy,
        stopping_rule={"protocol": config.protocol, **config.thresholds.to_dict()},
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        extra={
            "backend": dict(config.backend),
            "telemetry": backend.telemetry().describe(),
            "world_size": config.world_size,
        },
    )
    _stage(on_event, result, f"writing {out}")
    output = write_sweep(result, out, fingerprint=fingerprint, provenance=provenance)
    if plot:
        _stage(on_event, result, "plotting")
    return result, _maybe_plot(result, output, plot)


def _stage(on_event: Callable[[SweepEvent], None] | None, result: SweepResult | None, detail: str) -> None:
    """Tell the progress display what the sweep does outside its rounds."""
    if on_event is None:
        return
    done = sum(1 for c in result.cells if c.decision.stops) if result is not None else 0
    total = len(result.cells) if result is not None else 0
    on_event(SweepEvent("stage", result.rounds if result is not None else 0, done, total, detail=detail))


def result_from_imported(config: SweepConfig, imported: Any) -> SweepResult:
    """Summarize samples another tool measured (``import-samples``) like a sweep's own.

    Args:
        config: the sweep configuration (its cells are the cells found in the import).
        imported: an :class:`~dspark_calibrate.calibrate.measurement.backends.import_samples.ImportedSamples`.

    Raises:
        ConfigError: the import holds a cell the configuration does not list.
    """
    return result_from_rounds(config, group_rounds(imported.samples), f"imported from {imported.source}")


def result_from_rounds(
    config: SweepConfig, rounds: Mapping[Cell, Sequence[tuple[int, float]]], source: str
) -> SweepResult:
    """Summarize per-cell ``(round, ms)`` samples measured elsewhere, like a sweep's own.

    Raises:
        ConfigError: a cell the configuration does not list.
    """
    states = {c: _CellState(c) for c in config.cells}
    for cell, pairs in rounds.items():
        if cell not in states:
            raise ConfigError(f"imported cell {cell.label()} is not in this sweep's cells")
        st = states[cell]
        for i, (rnd, ms) in enumerate(pairs):
            st.rows.append(SampleRow(rnd, 0, i, ms, 1, None, None, None, None, True))
        st.visits = len({r for r, _ in pairs})
        st.decision = Decision(Status.ACCEPT, StopReason.IMPORTED.value, source)
    results, between, _ = finish_cells(config, states)
    samples = _samples_table((states[c] for c in config.cells), config.key_columns)
    return SweepResult(config, results, samples, 0, 0.0, False, between=between)


@dataclass(frozen=True, slots=True)
class SweepRequest:
    """Everything ``dspark-calibrate sweep`` was asked to do, as plain data.

    Attributes:
        backend: backend name, entry point or import string, or ``import-samples``.
        backend_options: keyword options for the backend factory.
        k: physical draft length.
        ladder: rank-local graph ladder.
        budgets: explicit compact budgets per G.
        max_candidates: default candidates per G before thinning.
        include_control: also measure V = G·(K+1).
        forced_k: also measure the forced-K arm of every G when the backend offers it.
        out: summary Parquet path.
        journal: journal path (default beside ``out``).
        resume: continue an interrupted sweep.
        protocol: ``adaptive`` or ``fixed``.
        thresholds: measurement thresholds.
        seed: round-order and bootstrap seed.
        fingerprint: base fingerprint (from ``--fingerprint``), or ``None``.
        clock_policy: GPU clock policy recorded in the fingerprint and provenance.
        input: profiler JSONL for ``import-samples``.
        plot: also write a PNG.
        command: command line for provenance.
        until_round: end this process's pass before that round (a sweep in several processes).
        pass_epoch: this process's pass index, its epoch (a sweep in several processes).
        world_size: the deployment's ranks (its ``gpu_count``) when they differ from the processes
            measuring: one process measures one rank's share (e.g. the reference backend's ``ep``).
        order: the serving order the rounds follow (None: a seeded random order).
        interleave: visit a G's open cells in one step-by-step alternating sequence
            (:attr:`SweepConfig.interleave`).
        settle_s: an interleaved visit's untimed mix, seconds (:attr:`SweepConfig.settle_s`).
        dwell: the policy's mean run on one cell, steps, for every G or per G (:attr:`SweepConfig.dwell`).
        resolve_rel: the paired shift each G must resolve before it stops (:attr:`SweepConfig.resolve_rel`);
            one process only (a pass's epochs are other processes').
    """

    backend: str
    k: int
    ladder: tuple[int, ...]
    out: Path
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    budgets: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    max_candidates: int = 48
    include_control: bool = True
    forced_k: bool = True
    journal: Path | None = None
    resume: bool = False
    protocol: str = "adaptive"
    thresholds: Thresholds = field(default_factory=Thresholds)
    seed: int = 0
    fingerprint: Fingerprint | None = None
    clock_policy: str | None = None
    input: Path | None = None
    plot: bool = False
    command: tuple[str, ...] | None = None
    until_round: int | None = None
    pass_epoch: int | None = None
    live: Mapping[str, Any] = field(default_factory=dict)
    check_memory: bool = True
    world_size: int | None = None
    order: ServingOrder | None = None
    interleave: bool = False
    settle_s: float | None = None
    dwell: Dwell | None = None
    resolve_rel: float | None = None


IMPORT_BACKEND = "import-samples"


def check_reference_resources(
    request: SweepRequest,
    cells: Sequence[CellSpec],
    on_event: Callable[[SweepEvent], None] | None,
) -> None:
    """Estimate the reference backend's memory and time; refuse what the machine cannot hold.

    Raises:
        ConfigError: the estimate exceeds :data:`~.resources.HEADROOM` of the available memory;
            the message gives the estimate and the options that shrink it.
    """
    try:
        import torch
    except ImportError as exc:
        raise ConfigError("the reference backend needs torch; install the 'torch' extra") from exc
    options = dict(request.backend_options)
    device = str(options.get("device") or ("cuda" if torch.cuda.is_available() else "cpu")).split(":")[0]
    est = resources.estimate_reference(options, cells, request.thresholds, device=device)
    have = resources.available_bytes(device, torch)
    dtype = str(options.get("dtype") or ("bfloat16" if device == "cuda" else "float32"))
    rate = resources.matmul_flops_per_second(torch, device, dtype)
    step_s = est.step_flops / rate
    floor_s = est.replays * step_s
    budget = request.thresholds.budget_s
    detail = (
        f"needs {est.describe()}"
        + (f" of {resources.format_bytes(have)} available" if have is not None else "")
        + f"; largest step ~{1000 * step_s:.3g} ms, at least ~{floor_s:.0f} s of measuring "
        f"({est.replays} replays; --budget {budget:g} s caps it)"
    )
    if on_event is not None:
        on_event(SweepEvent("estimate", 0, 0, len(cells), eta_s=min(floor_s, budget), detail=detail))
    if request.check_memory and have is not None and est.total > resources.HEADROOM * have:
        raise ConfigError(
            f"this sweep {detail}, more than this machine can hold "
            f"({resources.HEADROOM:.0%} of {resources.format_bytes(have)}); lower --layers, "
            "--context-len or the largest G of --ladder, split the experts with --backend-opt ep=8 "
            "(one DEP8 rank), drop the LM head with --backend-opt lm_head=false, run on a GPU, or pass "
            "--no-memory-check to try anyway"
        )


def deployment_ranks(requested: int | None, processes: int) -> int:
    """The deployment's ranks: ``requested`` (one process measuring one rank's share) or the processes.

    Raises:
        ConfigError: a requested size below 1, or several processes that are not the deployment's ranks.
    """
    if requested is None:
        return processes
    if requested < 1:
        raise ConfigError(f"the deployment's gpu_count (--live-gpu-count) must be >= 1, got {requested}")
    if processes not in (1, requested):
        raise ConfigError(
            f"{processes} processes cannot measure a deployment of {requested} ranks; run one process (one rank's "
            f"share) or {requested}"
        )
    return requested


def _check_request_resolve(request: SweepRequest) -> None:
    """:func:`check_resolve` on a request: a pass of a sweep in several processes is one."""
    check_resolve(
        request.resolve_rel,
        interleave=request.interleave,
        recapture=request.thresholds.recapture_every > 0,
        in_passes=request.pass_epoch is not None,
    )


def execute(
    request: SweepRequest,
    *,
    comm: Communicator | None = None,
    on_event: Callable[[SweepEvent], None] | None = None,
) -> tuple[SweepResult, SweepOutput | None]:
    """Run (or import) a sweep as requested and write its artifacts on rank 0.

    Under ``torchrun`` (``WORLD_SIZE`` > 1) and without ``comm``, initialises torch.distributed.

    Raises:
        ConfigError: bad request (ladder, budgets, backend, fingerprint, journal).
        MeasurementError: the measurement failed.
    """
    cells = _plan(request, forced_k=False)  # validates the ladder and budgets before any backend is loaded
    thresholds = request.thresholds
    if request.backend == IMPORT_BACKEND:
        return _execute_import(request)

    _check_request_resolve(request)  # before a backend loads (which can take minutes)
    if request.backend == "reference":
        check_reference_resources(request, cells, on_event)
    if comm is None:
        comm = from_environment()
    options = dict(request.backend_options)
    if request.backend == "trtllm":
        options.setdefault("ladder", list(request.ladder))
    _stage(on_event, None, f"loading the {request.backend} backend")
    backend = load_backend(request.backend, options)
    try:
        if request.forced_k and getattr(backend, "supports_forced_k", False):
            cells = _plan(request, forced_k=True)
        fields = backend.fingerprint_fields()
        context_len = fields.pop("context_len", None)
        _stage(on_event, None, "probing the deployment fingerprint")
        fingerprint = build_fingerprint(
            k=request.k,
            ladder=request.ladder,
            world_size=deployment_ranks(request.world_size, comm.world_size),
            backend_fields=fields,
            base=deployment_base(
                given=request.fingerprint, live_arguments=request.live, backend_fields=fields
            ),
            clock_policy=request.clock_policy,
            context_len=context_len,
        )
        config = SweepConfig(
            k=request.k,
            ladder=request.ladder,
            cells=cells,
            protocol=request.protocol,
            thresholds=thresholds,
            seed=request.seed,
            backend=backend.describe(),
            world_size=comm.world_size,
            fingerprint=fingerprint.to_dict(),
            order=None if request.order is None else request.order.to_dict(),
            interleave=request.interleave,
            settle_s=request.settle_s,
            dwell=request.dwell,
            resolve_rel=request.resolve_rel,
        )
        return sweep(
            config=config,
            backend=backend,
            out=request.out,
            fingerprint=fingerprint,
            journal_path=request.journal,
            resume=request.resume,
            comm=comm,
            clock_policy=request.clock_policy,
            command=request.command,
            on_event=on_event,
            plot=request.plot,
            until_round=request.until_round,
            pass_epoch=request.pass_epoch,
        )
    finally:
        backend.close()


def _plan(request: SweepRequest, *, forced_k: bool) -> tuple[CellSpec, ...]:
    """The cells the request measures (with the forced-K arms when the backend supports them)."""
    return plan_cells(
        k=request.k,
        ladder=request.ladder,
        budgets=request.budgets,
        max_per_g=request.max_candidates,
        include_control=request.include_control,
        include_forced_k=forced_k,
    )


def _execute_import(request: SweepRequest) -> tuple[SweepResult, SweepOutput | None]:
    """``--backend import-samples``: a sweep result from a profiler's JSONL, written like a measured one.

    Raises:
        ConfigError: no ``--input``, or the profile is unusable.
    """
    if request.input is None:
        raise ConfigError("--backend import-samples needs --input PROFILE.jsonl")
    imported = read_profiler_jsonl(request.input, k=request.k, ladder=request.ladder)
    found = tuple(sorted({s.cell for s in imported.samples}))
    fingerprint = build_fingerprint(
        k=request.k,
        ladder=request.ladder,
        world_size=deployment_ranks(request.world_size, 1),
        backend_fields={},
        base=deployment_base(given=request.fingerprint, live_arguments=request.live, backend_fields={}),
        clock_policy=request.clock_policy,
    )
    config = SweepConfig(
        k=request.k,
        ladder=request.ladder,
        cells=found,
        protocol="fixed",
        thresholds=request.thresholds,
        seed=request.seed,
        backend={"name": IMPORT_BACKEND, "input": str(request.input)},
        fingerprint=fingerprint.to_dict(),
    )
    result = result_from_imported(config, imported)
    provenance = Provenance(
        tool_version=__version__,
        command=request.command or tuple(sys.argv),
        backend=IMPORT_BACKEND,
        clock_policy=request.clock_policy,
        stopping_rule={"protocol": "imported"},
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        extra={"input": str(request.input), "misaligned_skipped": imported.misaligned},
    )
    output = write_sweep(result, request.out, fingerprint=fingerprint, provenance=provenance)
    return result, _maybe_plot(result, output, request.plot)


def _maybe_plot(result: SweepResult, output: SweepOutput, plot: bool) -> SweepOutput:
    if not plot:
        return output
    png = output.summary_path.with_suffix(".png")
    cells = [(c.spec, c.summary) for c in result.cells if isinstance(c.spec, CellSpec)]
    plot_sweep(result.config.k, result.config.ladder, cells, png)
    return replace(output, plot_path=png)
