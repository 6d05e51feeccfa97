"""Statistics of a sweep: per-cell summaries, honest confidence intervals, stopping decisions.

Pure functions of raw samples (STYLE rule 12): nothing here times, sleeps, reads a clock or touches
a GPU. The harness (``sweep.py``) feeds samples in and acts on the :class:`Decision` it gets back.

What the interval means
-----------------------
A sample is the mean of a few back-to-back graph replays. Samples taken back to back within one
visit to a cell are strongly correlated: they share the clock state, the heat, the cache and
allocator state left by the previous cell. A bootstrap over those samples describes the spread of
*that visit*, not what another sweep would measure; on an H200 such within-run intervals covered a
re-sweep's median on only a third of the cells.

A sweep therefore measures every cell in several *rounds*, each a fresh, re-warmed visit in a
randomized cell order, and :func:`median_interval` bootstraps hierarchically: it resamples rounds
with replacement and then samples within each chosen round, and takes the median of the pooled
resample. With few rounds the round-level bootstrap is too narrow, so each half-width is scaled by
``t(R−1)/z · sqrt(R/(R−1))`` (the small-sample Student correction). By default the interval is also
widened by √2 into a *reproduction interval*: a 95% range for the median that an independent
re-sweep under the same conditions would report, whose own error is as large as ours. That is the
quantity a cost table is checked against; the narrower interval for the condition median itself is
available with ``reproduction=False``.

Rounds inside one sweep cannot see what stays fixed for a whole sweep process (clock state at
start, graph capture, memory placement, the machine itself). On H200s (179 cells of a
DeepSeek-V3-shaped step) the relative difference between two sweeps' medians had a standard
deviation of 0.24% for two jobs on the same machine and 0.52–0.56% for jobs on two machine starts;
the round-level intervals explain only a small part of either. The reproduction interval therefore
adds a *between-run* term in quadrature, ``z · between_run_rel · median``
(``Thresholds.between_run_rel``, 0.52% by default: the cross-machine figure, since a cost table
serves every identical GPU of a fleet), so it covers a re-sweep's median, not only this sweep's. More samples cannot
shrink that term, so the adaptive stopping rule judges precision on the round-level part alone.

The median describes the step time of the exact captured (G, V) graph, replayed after a short
re-warm, interleaved with the other cells of the ladder, at the GPU's clock policy during the sweep,
with throttled samples dropped. It does not describe a cold first replay, a different cell order
in steady serving, or another clock policy.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np
from scipy.special import ndtri, stdtrit

from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.decision import Decision, Status
from dspark_calibrate.errors import ConfigError

__all__ = [
    "CellProgress",
    "CellSamples",
    "CellSummary",
    "Decision",
    "FixedProtocolRule",
    "Interval",
    "PrecisionRule",
    "Status",
    "StopReason",
    "StoppingRule",
    "Thresholds",
    "median_interval",
    "sample_interval",
    "summarize",
]


class StopReason(enum.StrEnum):
    """Why a cell stopped measuring; stored per cell in the ``stop_reason`` column."""

    PRECISION = "precision"  # the interval's relative half-width reached the target
    CELL_CAP_SAMPLES = "cell_cap_samples"  # per-cell sample cap reached first
    CELL_CAP_TIME = "cell_cap_time"  # per-cell time cap reached first
    BUDGET = "budget"  # the sweep's total budget ran out first
    FIXED_PROTOCOL = "fixed_protocol"  # the fixed 128 + 64 protocol completed
    IMPORTED = "imported"  # summarized from samples another tool measured


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Named measurement thresholds with units; recorded in every sweep's provenance.

    Attributes:
        precision_rel: target relative half-width of the interval (0.005 = 0.5%).
        confidence: interval confidence level.
        min_samples: kept samples a cell needs before it may stop on precision.
        min_rounds: rounds (independent re-warmed visits) a cell needs before it may stop.
        min_time_s: measured seconds a cell needs before it may stop on precision.
        max_samples_per_cell: per-cell sample cap.
        max_seconds_per_cell: per-cell time cap (seconds spent in its visits, warm-up included).
        budget_s: total sweep budget in seconds; cells still open when it runs out stop.
        warmup_steps: replays discarded on a cell's first visit (compilation, autotuning,
            allocator growth).
        rewarm_steps: replays discarded at the start of every later visit.
        replays_per_sample: back-to-back replays averaged into one sample.
        samples_per_visit: samples taken per visit.
        n_boot: bootstrap resamples per interval.
        reproduction: widen the interval by √2 to cover an independent re-sweep's median.
        between_run_rel: relative standard deviation of the sweep-to-sweep difference that rounds
            within one sweep cannot observe; added in quadrature to reproduction intervals
            (0.0052 measured across two H200 machine starts, see the module docstring; 0 turns
            it off).
        drop_throttled: drop samples taken while the GPU reported a throttle reason.
    """

    precision_rel: float = 0.005
    confidence: float = 0.95
    min_samples: int = 8
    min_rounds: int = 5
    min_time_s: float = 0.0
    max_samples_per_cell: int = 48
    max_seconds_per_cell: float = 60.0
    budget_s: float = 3600.0
    warmup_steps: int = 8
    rewarm_steps: int = 2
    replays_per_sample: int = 2
    samples_per_visit: int = 2
    n_boot: int = 1000
    reproduction: bool = True
    between_run_rel: float = 0.0052
    drop_throttled: bool = True

    def __post_init__(self) -> None:
        checks: list[tuple[str, bool, str]] = [
            ("precision_rel", 0.0 < self.precision_rel < 1.0, "in (0, 1)"),
            ("confidence", 0.5 <= self.confidence < 1.0, "in [0.5, 1)"),
            ("min_samples", self.min_samples >= 1, ">= 1"),
            ("min_rounds", self.min_rounds >= 1, ">= 1"),
            ("min_time_s", self.min_time_s >= 0.0, ">= 0"),
            ("max_samples_per_cell", self.max_samples_per_cell >= self.min_samples, ">= min_samples"),
            ("max_seconds_per_cell", self.max_seconds_per_cell > 0.0, "> 0"),
            ("budget_s", self.budget_s > 0.0, "> 0"),
            ("warmup_steps", self.warmup_steps >= 0, ">= 0"),
            ("rewarm_steps", self.rewarm_steps >= 0, ">= 0"),
            ("replays_per_sample", self.replays_per_sample >= 1, ">= 1"),
            ("samples_per_visit", self.samples_per_visit >= 1, ">= 1"),
            ("n_boot", self.n_boot >= 100, ">= 100"),
            ("between_run_rel", 0.0 <= self.between_run_rel < 0.5, "in [0, 0.5)"),
        ]
        for name, ok, want in checks:
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                ok = False
            if not ok:
                raise ConfigError(f"threshold {name}={value!r} must be {want}")

    @classmethod
    def adaptive(cls, **overrides: Any) -> Thresholds:
        """The default adaptive protocol (interleaved rounds, stop on precision)."""
        return cls(**overrides)

    @classmethod
    def fixed_protocol(cls, **overrides: Any) -> Thresholds:
        """The common fixed protocol: 128 warm-up steps, then 64 single-replay samples, one visit."""
        base: dict[str, Any] = {
            "warmup_steps": 128,
            "rewarm_steps": 0,
            "replays_per_sample": 1,
            "samples_per_visit": 64,
            "min_samples": 64,
            "min_rounds": 1,
            "max_samples_per_cell": 64,
            "reproduction": False,
            "between_run_rel": 0.0,
        }
        base.update(overrides)
        return cls(**base)

    @classmethod
    def quick(cls, **overrides: Any) -> Thresholds:
        """Loose thresholds for smoke tests and CPU backends (2% precision, small caps)."""
        base: dict[str, Any] = {
            "precision_rel": 0.02,
            "min_samples": 6,
            "min_rounds": 3,
            "max_samples_per_cell": 48,
            "max_seconds_per_cell": 10.0,
            "budget_s": 600.0,
            "warmup_steps": 2,
            "rewarm_steps": 1,
            "replays_per_sample": 2,
            "samples_per_visit": 2,
            "n_boot": 300,
        }
        base.update(overrides)
        return cls(**base)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every threshold."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Thresholds:
        """Build from a dict, refusing unknown names.

        Raises:
            ConfigError: an unknown name or an out-of-range value.
        """
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"unknown threshold(s) {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**dict(data))


@dataclass(frozen=True, slots=True)
class CellSamples:
    """The kept raw samples of one cell, in the order they were taken.

    Attributes:
        spec: the cell.
        raw_ms: kept samples, each the mean of ``replays_per_sample`` replays (ms).
        round_ids: the round each sample was taken in (same length as ``raw_ms``).
    """

    spec: CellSpec
    raw_ms: tuple[float, ...]
    round_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.round_ids:
            object.__setattr__(self, "round_ids", (0,) * len(self.raw_ms))
        if len(self.round_ids) != len(self.raw_ms):
            raise ValueError(f"{len(self.raw_ms)} samples but {len(self.round_ids)} round ids")

    @property
    def rounds(self) -> int:
        """Number of distinct rounds with at least one sample."""
        return len(set(self.round_ids))

    def by_round(self) -> list[np.ndarray]:
        """Samples grouped by round, rounds in increasing order."""
        values = np.asarray(self.raw_ms, dtype=np.float64)
        ids = np.asarray(self.round_ids)
        return [values[ids == r] for r in sorted(set(self.round_ids))]


@dataclass(frozen=True, slots=True)
class Interval:
    """A confidence interval around a median (ms)."""

    median: float
    low: float
    high: float
    method: str

    @property
    def half_width_rel(self) -> float:
        """The larger half-width relative to the median."""
        return max(self.median - self.low, self.high - self.median) / self.median


@dataclass(frozen=True, slots=True)
class CellSummary:
    """Statistics of one cell's kept samples (computed lazily from raw samples).

    ``warnings`` are codes, returned as data: ``few_rounds``, ``single_round``, ``wide_iqr``,
    ``round_spread``, ``outliers``.
    """

    spec: CellSpec
    median_ms: float
    ci_low_ms: float
    ci_high_ms: float
    p10_ms: float
    p90_ms: float
    iqr_ms: float
    samples: int
    rounds: int
    ci_method: str
    warnings: tuple[str, ...] = field(default=())

    @property
    def half_width_rel(self) -> float:
        """The larger relative half-width of the interval."""
        return max(self.median_ms - self.ci_low_ms, self.ci_high_ms - self.median_ms) / self.median_ms


def _check_values(values: np.ndarray) -> str | None:
    if values.size == 0:
        return "no samples"
    if not np.all(np.isfinite(values)):
        return "non-finite sample(s)"
    if np.any(values <= 0):
        return "non-positive sample(s)"
    return None


def _z(confidence: float) -> float:
    return float(ndtri(0.5 + confidence / 2))


def sample_interval(
    values: Sequence[float] | np.ndarray, *, confidence: float = 0.95, n_boot: int = 1000, seed: int = 0
) -> Interval:
    """Percentile bootstrap interval of the median over individual samples (within-run).

    This is the interval the common fixed protocol reports. It ignores correlation between samples
    of one run and does not cover a re-sweep (see the module docstring); it is kept for the fixed
    protocol and for comparison.

    Raises:
        ValueError: empty, non-finite or non-positive values.
    """
    arr = np.asarray(values, dtype=np.float64)
    bad = _check_values(arr)
    if bad:
        raise ValueError(bad)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
    meds = np.median(arr[idx], axis=1)
    a = (1 - confidence) / 2
    lo, hi = np.quantile(meds, [a, 1 - a])
    med = float(np.median(arr))
    return Interval(med, min(float(lo), med), max(float(hi), med), "sample_bootstrap")


def median_interval(
    rounds: Sequence[Sequence[float] | np.ndarray],
    *,
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    reproduction: bool = True,
    between_run_rel: float = 0.0,
) -> Interval:
    """Hierarchical bootstrap interval of the pooled median over independent rounds.

    Resamples rounds with replacement, then samples with replacement within each chosen round, and
    takes each resample's pooled median. Half-widths are scaled by the small-sample factor
    ``t(R−1)/z · sqrt(R/(R−1))`` and, with ``reproduction``, by √2 (see the module docstring).

    Args:
        rounds: samples per round; at least two non-empty rounds.
        confidence: confidence level.
        n_boot: bootstrap resamples.
        seed: RNG seed (the same inputs and seed give the same interval).
        reproduction: cover an independent re-sweep's median rather than the condition median.
        between_run_rel: with ``reproduction``, the between-run relative SD added in quadrature.

    Raises:
        ValueError: fewer than two rounds, or unusable values.
    """
    groups = [np.asarray(r, dtype=np.float64) for r in rounds if len(r)]
    if len(groups) < 2:
        raise ValueError("a hierarchical interval needs at least two non-empty rounds")
    pooled = np.concatenate(groups)
    bad = _check_values(pooled)
    if bad:
        raise ValueError(bad)
    n_rounds = len(groups)
    sizes = np.array([g.size for g in groups])
    width = int(sizes.max())
    table = np.full((n_rounds, width), np.nan)
    for i, g in enumerate(groups):
        table[i, : g.size] = g
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, n_rounds, size=(n_boot, n_rounds))  # which rounds
    picked_sizes = sizes[pick]  # (B, R)
    within = np.floor(rng.random((n_boot, n_rounds, width)) * picked_sizes[..., None]).astype(np.int64)
    draws = table[pick[..., None], within]  # (B, R, width)
    if np.all(sizes == width):
        meds = np.median(draws.reshape(n_boot, -1), axis=1)
    else:  # unequal rounds (dropped samples): pad with NaN, then the NaN-aware median
        mask = np.arange(width)[None, None, :] >= picked_sizes[..., None]
        draws[mask] = np.nan
        meds = np.nanmedian(draws.reshape(n_boot, -1), axis=1)
    a = (1 - confidence) / 2
    q_lo, q_hi = np.quantile(meds, [a, 1 - a])
    med = float(np.median(pooled))
    scale = float(stdtrit(n_rounds - 1, 1 - a)) / _z(confidence) * math.sqrt(n_rounds / (n_rounds - 1))
    if reproduction:
        scale *= math.sqrt(2.0)
    below = scale * max(med - float(q_lo), 0.0)
    above = scale * max(float(q_hi) - med, 0.0)
    method = "hierarchical_bootstrap" + ("+reproduction" if reproduction else "")
    if reproduction and between_run_rel > 0.0:
        floor = _z(confidence) * between_run_rel * med
        below, above = math.hypot(below, floor), math.hypot(above, floor)
        method += "+between_run"
    return Interval(med, med - below, med + above, method)


def _bootstrap_seed(seed: int, spec: CellSpec, n: int) -> list[int]:
    return [seed, spec.graph_batch_size, spec.verifier_budget, n]


def summarize(
    samples: CellSamples,
    *,
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    reproduction: bool = True,
    between_run_rel: float = 0.0,
) -> CellSummary:
    """Median, interval, p10/p90, IQR and warnings of one cell's kept samples.

    Two or more rounds use :func:`median_interval`; a single round falls back to
    :func:`sample_interval` and carries the ``single_round`` warning. The bootstrap is seeded from
    ``seed`` and the cell, so the same samples always give the same summary.

    Raises:
        ValueError: no samples, or non-finite or non-positive values.
    """
    values = np.asarray(samples.raw_ms, dtype=np.float64)
    bad = _check_values(values)
    if bad:
        raise ValueError(f"{samples.spec.label()}: {bad}")
    boot_seed = np.random.SeedSequence(_bootstrap_seed(seed, samples.spec, values.size)).generate_state(1)[0]
    warnings: list[str] = []
    groups = samples.by_round()
    if len(groups) >= 2:
        interval = median_interval(
            groups,
            confidence=confidence,
            n_boot=n_boot,
            seed=int(boot_seed),
            reproduction=reproduction,
            between_run_rel=between_run_rel,
        )
        if len(groups) < 3:
            warnings.append("few_rounds")
        round_meds = np.array([np.median(g) for g in groups])
        if (round_meds.max() - round_meds.min()) / interval.median > 0.05:
            warnings.append("round_spread")
    else:
        interval = sample_interval(values, confidence=confidence, n_boot=n_boot, seed=int(boot_seed))
        warnings.append("single_round")
    p10, p25, p75, p90 = np.quantile(values, [0.10, 0.25, 0.75, 0.90])
    med = interval.median
    if (p75 - p25) / med > 0.05:
        warnings.append("wide_iqr")
    if values.max() > 1.5 * med:
        warnings.append("outliers")
    return CellSummary(
        spec=samples.spec,
        median_ms=med,
        ci_low_ms=interval.low,
        ci_high_ms=interval.high,
        p10_ms=float(p10),
        p90_ms=float(p90),
        iqr_ms=float(p75 - p25),
        samples=int(values.size),
        rounds=len(groups),
        ci_method=interval.method,
        warnings=tuple(warnings),
    )


@dataclass(frozen=True, slots=True)
class CellProgress:
    """What a stopping rule sees about one cell (plain data, no clock).

    Attributes:
        samples: the cell's kept samples so far.
        cell_seconds: seconds spent in the cell's visits (warm-up included).
        sweep_seconds: seconds spent by the whole sweep so far.
        taken: samples taken, throttled ones included (the cap counts these).
        visits: visits made to the cell.
        seed: the sweep seed (seeds the bootstrap).
    """

    samples: CellSamples
    cell_seconds: float
    sweep_seconds: float
    taken: int
    visits: int
    seed: int = 0


class StoppingRule(Protocol):
    """Decides after each round whether a cell is done. Pure: no clock, no I/O.

    ACCEPT and REJECT stop the cell, with the reason stored as its stop reason; UNDECIDED and
    UNKNOWN ask for another visit (the caller's choice, STYLE rule 11).
    """

    def __call__(self, progress: CellProgress) -> Decision:
        """Decide about one cell."""
        ...


def _caps(progress: CellProgress, th: Thresholds) -> Decision | None:
    if progress.sweep_seconds >= th.budget_s:
        return Decision(Status.REJECT, StopReason.BUDGET.value, f"sweep budget {th.budget_s:g} s spent")
    if progress.taken >= th.max_samples_per_cell:
        return Decision(
            Status.REJECT,
            StopReason.CELL_CAP_SAMPLES.value,
            f"{progress.taken} samples >= cap {th.max_samples_per_cell}",
        )
    if progress.cell_seconds >= th.max_seconds_per_cell:
        return Decision(
            Status.REJECT,
            StopReason.CELL_CAP_TIME.value,
            f"{progress.cell_seconds:.3g} s >= cap {th.max_seconds_per_cell:g} s",
        )
    return None


@dataclass(frozen=True, slots=True)
class PrecisionRule:
    """Adaptive stopping: stop when the interval's relative half-width ≤ ``precision_rel``.

    The minimums (samples, rounds, time) must be met first; the caps and the total budget stop a
    cell that has not reached precision (REJECT with the cap as reason).
    """

    thresholds: Thresholds

    def __call__(self, progress: CellProgress) -> Decision:
        """Decide about one cell; see :class:`StoppingRule`."""
        th = self.thresholds
        values = np.asarray(progress.samples.raw_ms, dtype=np.float64)
        if values.size and _check_values(values):
            return Decision(Status.UNKNOWN, "non_finite", "non-finite or non-positive samples")
        enough = (
            values.size >= th.min_samples
            and progress.samples.rounds >= max(th.min_rounds, 2)
            and progress.cell_seconds >= th.min_time_s
        )
        if enough:
            # Precision is judged on the round-level interval: the between-run term of the
            # reported interval cannot be reduced by measuring more, so it plays no part here.
            summary = summarize(
                progress.samples,
                confidence=th.confidence,
                n_boot=th.n_boot,
                seed=progress.seed,
                reproduction=th.reproduction,
            )
            if summary.half_width_rel <= th.precision_rel:
                return Decision(
                    Status.ACCEPT,
                    StopReason.PRECISION.value,
                    f"half-width {summary.half_width_rel:.3%} <= {th.precision_rel:.3%}",
                )
        capped = _caps(progress, th)
        if capped is not None:
            return capped
        if not enough:
            return Decision(
                Status.UNKNOWN,
                "too_few_samples",
                f"{values.size} samples in {progress.samples.rounds} rounds; "
                f"need {th.min_samples} in {th.min_rounds}",
            )
        return Decision(Status.UNDECIDED, "precision_not_reached")


@dataclass(frozen=True, slots=True)
class FixedProtocolRule:
    """The fixed protocol: stop once ``min_samples`` samples were kept (one visit normally)."""

    thresholds: Thresholds

    def __call__(self, progress: CellProgress) -> Decision:
        """Decide about one cell; see :class:`StoppingRule`."""
        th = self.thresholds
        values = np.asarray(progress.samples.raw_ms, dtype=np.float64)
        if values.size and _check_values(values):
            return Decision(Status.UNKNOWN, "non_finite", "non-finite or non-positive samples")
        if values.size >= th.min_samples:
            return Decision(Status.ACCEPT, StopReason.FIXED_PROTOCOL.value, f"{values.size} samples taken")
        capped = _caps(progress, th)
        if capped is not None:
            return capped
        return Decision(Status.UNKNOWN, "too_few_samples", f"{values.size} of {th.min_samples} samples")
