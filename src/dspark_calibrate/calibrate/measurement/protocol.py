"""The step protocol's term: what a saving becomes when serving launches steps ahead or waits.

Pure: sample values in, plain values out.

A sample is the mean of ``R`` replays started on an idle device. Its first replay also pays the
host's launch of the graph; the replays behind it were queued while the first ran and pay none.
Which of the two a serving engine sees is a property of the engine: a loop that reads every step's
result before it launches the next pays the launch on every step (*synchronous*); one that launches
ahead (an overlap scheduler) pays it on none (*pipelined*). The sample's mean is neither: it pays
1/R of it. On an H200 the launch of an 8-layer step cost about 0.26 ms, constant across cells, so a
saving measured with two replays a sample sat 0.1-0.7 pp below what a pipelined harness measured.

Every sample also records its first replay (:class:`~.timing.SplitTimer`), so each cell has two
more series on the same rounds: the first replays (synchronous) and the rest,
``(R·mean − first)/(R − 1)`` (pipelined). :func:`protocol_term` gives the paired saving and the
median of each; :func:`widen_for_protocol` stretches a cell's saving and absolute intervals so
they hold the sweep's interval moved to either protocol's estimate. The point estimates stay the
sample means: the intervals say what either kind of engine would see.

The clock is the other half of a protocol. A visit re-warms its cell and times it alone, so under
a power cap a compact cell runs at the SM clock its own lighter load allows (on an H200 at its cap,
+5..+14% over its native cell at G >= 32). A serving loop that switches between a G's cells every
few steps runs them at a clock the mix sets: a harness alternating native and compact steps saw
savings 0.5-2.9 pp below the sweep's at G >= 32. :func:`widen_for_clock` adds the saving the cell
would have at its native cell's clock, ``1 − (1 − s)·clock_rel``: its step time scaled by the
clock ratio, as if every kernel were clock-bound (memory-bound ones are not), so it is the far
end of what a native-heavy mix can take away.

The visiting order is the third part. A sweep visits the G of a round in random order, so a small
G often follows a heavy one and meets the clock state it left (the carry-over, :mod:`.carryover`,
which moves each cell's median by ``carryover_rel``); a serving GPU that stays at one G for a while
does not. :func:`widen_for_order` lets the absolute interval also hold the median without it: on
an H200 at its cap a harness that ran each G for 400 steps saw the G=8 and G=32 cells 1.5-2.4%
faster than the sweep, of which the carry-over accounts for 0.4-0.6%.

The mix is the last part, and the one an interleaved sweep (``--interleave``) measures instead of
bounding: it times a G's cells in one sequence, so they share the clock of their mix. But a
saving under a power cap still depends on how the mix is laid out in time: a compact step right
after a native one meets the clock the heavier step left, one inside a run of compact steps the
clock it lets the GPU reach (on an H200 at its cap, savings 0.5-1.4 pp lower at G >= 64 with
every step drawn at random than in a harness that stayed on a cell half the time). How long a
serving policy stays on a cell depends on its traffic, so an interleaved sweep alternates two
designs by round (:data:`MIX_STAYS`): cells switching every step (a policy that switches every
step) and runs of steps (one that stays a while), each laid out in balanced blocks
(:func:`~.order.interleaved_steps`). :func:`mix_term` gives each
design's median and paired saving, :func:`widen_for_mix` stretches the intervals to hold both;
the points are the paired estimates over all rounds, half of each design. ``--dwell`` instead
times every visit in runs of the policy's own mean length, one for every G or one per G
(:mod:`.dwell`; docs/sweep.md "The policy's dwell").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from dspark_calibrate.calibrate.measurement.mixed import Cell
from dspark_calibrate.calibrate.measurement.stats import CellSamples, CellSummary, paired_saving_interval

__all__ = [
    "MIX_STAYS",
    "MixTerm",
    "ProtocolTerm",
    "SplitSample",
    "mix_arm",
    "mix_term",
    "protocol_term",
    "saving_at_native_clock",
    "widen_for_clock",
    "widen_for_mix",
    "widen_for_order",
    "widen_for_protocol",
    "widen_for_settling",
    "within_visit_drift",
]


@dataclass(frozen=True, slots=True)
class SplitSample:
    """One kept sample with its first replay: the mean of ``replays`` replays (ms), the first
    replay alone (ms), and the round and epoch it was taken in."""

    ms: float
    first_ms: float
    replays: int
    round: int
    epoch: int

    @property
    def pipelined_ms(self) -> float:
        """The mean of the replays after the first (queued behind a running step)."""
        return (self.ms * self.replays - self.first_ms) / (self.replays - 1)


@dataclass(frozen=True, slots=True)
class ProtocolTerm:
    """One cell under the two step protocols (module docstring).

    Attributes:
        pipelined_ms, synchronous_ms: the median step time of the replays after the first and of
            the first replays.
        saving_pipelined, saving_synchronous: the paired saving against the native cell under each
            (None for a native cell, or where fewer than two rounds pair).
    """

    pipelined_ms: float
    synchronous_ms: float
    saving_pipelined: float | None = None
    saving_synchronous: float | None = None

    @property
    def launch_ms(self) -> float:
        """What a synchronous step pays beyond a pipelined one (the median first replay less the
        median later replay)."""
        return self.synchronous_ms - self.pipelined_ms


def _usable(rows: Sequence[SplitSample]) -> bool:
    return bool(rows) and all(
        r.replays >= 2 and math.isfinite(r.first_ms) and r.first_ms > 0.0 and r.pipelined_ms > 0.0
        for r in rows
    )


def _series(cell: Cell, rows: Sequence[SplitSample], values: Sequence[float]) -> CellSamples:
    return CellSamples(cell, tuple(values), tuple(r.round for r in rows), tuple(r.epoch for r in rows))


def protocol_term(
    cell: Cell,
    rows: Sequence[SplitSample],
    native: Cell | None = None,
    native_rows: Sequence[SplitSample] = (),
) -> ProtocolTerm | None:
    """The cell's medians under both protocols and, with its native cell's samples, its paired
    saving under each (the trimmed mean of the per-round log-ratios, as the sweep's own saving).

    Returns:
        None when a sample lacks its first replay, or was a single replay (nothing to split).
    """
    if not _usable(rows):
        return None
    pipe = [r.pipelined_ms for r in rows]
    sync = [r.first_ms for r in rows]
    term = ProtocolTerm(float(np.median(pipe)), float(np.median(sync)))
    if native is None or not _usable(native_rows):
        return term
    pairs = {}
    for name, mine, theirs in (
        ("pipelined", pipe, [r.pipelined_ms for r in native_rows]),
        ("synchronous", sync, [r.first_ms for r in native_rows]),
    ):
        s = paired_saving_interval(_series(cell, rows, mine), _series(native, native_rows, theirs))
        pairs[name] = None if s is None else s.saving
    return replace(term, saving_pipelined=pairs["pipelined"], saving_synchronous=pairs["synchronous"])


def widen_for_protocol(summary: CellSummary, term: ProtocolTerm) -> CellSummary:
    """``summary`` with intervals that also hold its interval moved to each protocol's estimate
    (:func:`widen_to_hold`). The point estimates are kept."""
    return widen_to_hold(
        summary, (term.pipelined_ms, term.synchronous_ms), (term.saving_pipelined, term.saving_synchronous)
    )


#: The stay probability of each design an interleaved sweep alternates, by round parity (module
#: docstring): 0 (the cell switches every step) and 0.75 (runs drawn four steps long on average).
MIX_STAYS: tuple[float, float] = (0.0, 0.75)


def mix_arm(round_index: int) -> int:
    """The design (index into :data:`MIX_STAYS`) an interleaved sweep's round uses."""
    return round_index % len(MIX_STAYS)


@dataclass(frozen=True, slots=True)
class MixTerm:
    """One cell under the two designs of an interleaved sweep (module docstring).

    Attributes:
        switching_ms, runs_ms: the median step time in the rounds of each design.
        saving_switching, saving_runs: the paired saving against the native cell in each design's
            rounds (None for a native cell, or where fewer than two rounds pair).
    """

    switching_ms: float
    runs_ms: float
    saving_switching: float | None = None
    saving_runs: float | None = None


def _arm(samples: CellSamples, arm: int) -> CellSamples:
    keep = [i for i, r in enumerate(samples.round_ids) if mix_arm(r) == arm]
    return CellSamples(
        samples.spec,
        tuple(samples.raw_ms[i] for i in keep),
        tuple(samples.round_ids[i] for i in keep),
        tuple(samples.epoch_ids[i] for i in keep),
    )


def mix_term(samples: CellSamples, native: CellSamples | None = None) -> MixTerm | None:
    """The cell's median and (with its native cell's samples) paired saving in each design's rounds.

    Returns:
        None when a design has no kept sample of the cell.
    """
    arms = [_arm(samples, a) for a in range(len(MIX_STAYS))]
    if not all(a.raw_ms for a in arms):
        return None
    medians = [float(np.median(a.raw_ms)) for a in arms]
    savings: list[float | None] = [None, None]
    if native is not None:
        for i, mine in enumerate(arms):
            s = paired_saving_interval(mine, _arm(native, i))
            savings[i] = None if s is None else s.saving
    return MixTerm(medians[0], medians[1], savings[0], savings[1])


def widen_for_mix(summary: CellSummary, term: MixTerm) -> CellSummary:
    """``summary`` with intervals that also hold its interval moved to each design's estimate
    (:func:`widen_to_hold`). The point estimates are kept."""
    return widen_to_hold(
        summary, (term.switching_ms, term.runs_ms), (term.saving_switching, term.saving_runs)
    )


def widen_to_hold(
    summary: CellSummary, medians: Sequence[float], savings: Sequence[float | None]
) -> CellSummary:
    """``summary`` with intervals that also hold its interval moved to other estimates of the same
    cell: the absolute interval scaled by each median's ratio to the summary's median, the saving
    interval shifted by each saving's difference from the summary's saving (None: skipped)."""
    lows, highs = [summary.ci_low_ms], [summary.ci_high_ms]
    for ms in medians:
        ratio = ms / summary.median_ms
        lows.append(summary.ci_low_ms * ratio)
        highs.append(summary.ci_high_ms * ratio)
    s_lows, s_highs = [summary.saving_ci_low], [summary.saving_ci_high]
    for saving in savings:
        if saving is not None:
            shift = saving - summary.saving
            s_lows.append(summary.saving_ci_low + shift)
            s_highs.append(summary.saving_ci_high + shift)
    return replace(
        summary,
        ci_low_ms=min(lows),
        ci_high_ms=max(highs),
        saving_ci_low=min(s_lows),
        saving_ci_high=max(s_highs),
    )


def saving_at_native_clock(saving: float, clock_rel: float) -> float:
    """The saving with the cell's step time scaled from its own SM clock to its native cell's
    (``clock_rel`` = the cell's median clock over the native's): ``1 − (1 − saving)·clock_rel``."""
    return 1.0 - (1.0 - saving) * clock_rel


def widen_for_clock(summary: CellSummary, clock_rel: float | None) -> CellSummary:
    """``summary`` (a compact cell's) with intervals that also hold its interval moved to its
    native cell's clock (:func:`saving_at_native_clock`; the absolute interval scaled by
    ``clock_rel``). Unchanged without a usable clock ratio. The point estimates are kept."""
    if clock_rel is None or not math.isfinite(clock_rel) or clock_rel <= 0.0 or clock_rel == 1.0:
        return summary
    shift = saving_at_native_clock(summary.saving, clock_rel) - summary.saving
    return replace(
        summary,
        ci_low_ms=min(summary.ci_low_ms, summary.ci_low_ms * clock_rel),
        ci_high_ms=max(summary.ci_high_ms, summary.ci_high_ms * clock_rel),
        saving_ci_low=min(summary.saving_ci_low, summary.saving_ci_low + shift),
        saving_ci_high=max(summary.saving_ci_high, summary.saving_ci_high + shift),
    )


def widen_for_order(summary: CellSummary, carryover_rel: float | None) -> CellSummary:
    """``summary`` with an absolute interval that also holds its interval without the carry-over's
    shift of the median (``carryover_rel``: the median's relative move by the visits before it).
    Unchanged without an estimate. Savings are left alone: the carry-over's move of a saving is the
    difference of two such shifts, which the sweep bounds with its re-warm."""
    if (
        carryover_rel is None
        or not math.isfinite(carryover_rel)
        or carryover_rel <= -1.0
        or carryover_rel == 0.0
    ):
        return summary
    scale = 1.0 / (1.0 + carryover_rel)
    return replace(
        summary,
        ci_low_ms=min(summary.ci_low_ms, summary.ci_low_ms * scale),
        ci_high_ms=max(summary.ci_high_ms, summary.ci_high_ms * scale),
    )


def widen_for_settling(summary: CellSummary, drift: float | None, native_drift: float | None) -> CellSummary:
    """``summary`` with intervals that also hold its interval moved to where a visit ends: the
    median scaled by ``exp(drift)`` (the cell's within-visit drift, :func:`within_visit_drift`)
    and, for a cell with a native cell's drift, the saving ``1 − (1 − s)·exp(drift −
    native_drift)`` (a visit whose savings still move at its end measures them before a process
    that stays at one G does). Unchanged without a drift; the point estimates are kept."""
    if drift is None or not math.isfinite(drift):
        return summary
    savings: list[float | None] = [None]
    if native_drift is not None and math.isfinite(native_drift):
        savings = [1.0 - (1.0 - summary.saving) * math.exp(drift - native_drift)]
    return widen_to_hold(summary, (summary.median_ms * math.exp(drift),), savings)


def within_visit_drift(samples: Sequence[tuple[int, int, float]]) -> float | None:
    """How far a cell's step time moves from the first to the last sample of a visit: the median
    over visits of ``log(last / first)`` (``samples``: ``(round, sample index, ms)`` of kept
    samples; a round is one visit). None without a visit of two samples.

    A visit that is still settling (a power-capped GPU's clock falling for seconds after a lighter
    G, or rising after a heavier one) shows it here; a process that stays at one G runs at the end
    of that drift, beyond the visit's median."""
    by_visit: dict[int, list[tuple[int, float]]] = {}
    for rnd, index, ms in samples:
        by_visit.setdefault(rnd, []).append((index, ms))
    moves = []
    for rows in by_visit.values():
        if len(rows) >= 2:
            rows.sort()
            moves.append(math.log(rows[-1][1] / rows[0][1]))
    return float(np.median(moves)) if moves else None
