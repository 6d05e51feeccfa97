"""Statistics of a sweep: per-cell summaries, paired savings, honest intervals, stopping decisions.

Pure functions of raw samples (STYLE rule 12): nothing here times, sleeps, reads a clock or touches
a GPU. The harness (``sweep.py``) feeds samples in and acts on the :class:`Decision` it gets back.

The units of a sweep
--------------------
A sample is the mean of a few back-to-back graph replays. Samples taken back to back within one
visit share the clock state, the heat and the cache and allocator state left by the previous cell,
so they are not independent. A sweep therefore visits every cell in several *rounds* (fresh,
re-warmed visits in a randomized order) grouped into *capture epochs*: every
``Thresholds.recapture_every`` rounds each cell's graph is captured again and fully re-warmed.
Rounds are the unit of within-process noise; epochs are the unit of what a new process would see
(memory placement, graph capture, the clock state at start).

Three quantities, three intervals
---------------------------------
1. **The absolute median** T(G, V) of a cell (:func:`median_interval`). A hierarchical bootstrap
   resamples rounds within each epoch, then samples within each chosen round, and takes the pooled
   median; half-widths get the small-sample factor ``t(R−E)/z · sqrt(R/(R−E))``. The between-epoch
   variation is added in quadrature, split in two parts estimated from the whole sweep by
   :func:`estimate_between_run` (restricted maximum likelihood, :mod:`~.reml`): a *common mode*
   shared by every cell of an epoch (σ_F, few degrees of freedom, so it is scaled by
   ``t(E−1)/z``) and each cell's own epoch-to-epoch variation (σ_u, pooled over all cells, carried
   at the upper end of its profile interval). By default the result is a *reproduction interval*: widened by √2, it
   is a 95% range for the median that an independent sweep under the same conditions would
   report. Every bound is formed on the log scale, so no bound is ever negative.
2. **The paired saving** ``1 − T(G,V)/T(G,0)`` of a compact cell (:func:`paired_saving_interval`).
   Every round visits all open cells of a G, so the ratio of a compact cell to its native cell is
   paired by round: drift common to the round, the process and the machine cancels. The estimate
   is the trimmed mean per-round log-ratio over the rounds both cells were measured in, with a
   Student interval over those rounds (within epochs), widened by the between-epoch variation of
   the paired log-ratio (σ_d, pooled over cells, at the upper end of its profile interval: a design
   that cannot see σ_d does not state it as 0): for this process's own shift, for its average over
   E epochs, and for the serving process's shift. It is a 95% *prediction* interval for the
   saving a serving process sees.
3. **The level model** for ``build``'s joint resampling: ``common_mode_rel`` (the relative SD of
   the level shift common to every cell between this sweep and a serving process) and
   ``level_rel`` (one cell's own level SD beyond it).

Where a sweep has fewer than two epochs (re-capture off, imported samples) nothing between epochs
can be estimated; the interval then uses ``Thresholds.between_run_rel`` when given and otherwise the
documented fallback :data:`FALLBACK_BETWEEN_RUN_REL`, and says so (``no_between_run_estimate``).

What the median describes: the step time of the exact captured (G, V) graph, replayed after a
short re-warm, interleaved with the other cells of the ladder, at the GPU's clock and power state
during the sweep (power-capped samples are kept by default: a serving GPU runs at its cap), across
ranks the slowest rank. It does not describe a cold first replay or another clock policy.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import numpy as np
from scipy.special import ndtri, stdtrit

from dspark_calibrate.calibrate.measurement.ladder import CellKind
from dspark_calibrate.calibrate.measurement.mixed import Cell
from dspark_calibrate.calibrate.measurement.reml import design_effect, reml_component
from dspark_calibrate.calibrate.measurement.telemetry import DEFAULT_THROTTLE_POLICY, THROTTLE_POLICIES
from dspark_calibrate.decision import Decision, Status
from dspark_calibrate.errors import ConfigError, InvalidValueError

__all__ = [
    "FALLBACK_BETWEEN_RUN_REL",
    "FORCED_K_PRECISION_SHARE",
    "RESOLVE_TARGET_REL",
    "BetweenRun",
    "CellProgress",
    "CellSamples",
    "CellSummary",
    "Decision",
    "FixedProtocolRule",
    "GroupPaired",
    "Interval",
    "PrecisionRule",
    "SavingInterval",
    "Status",
    "StopReason",
    "StoppingRule",
    "Thresholds",
    "common_round_effects",
    "estimate_between_run",
    "group_paired",
    "median_interval",
    "paired_saving_interval",
    "round_level_half_width",
    "round_log_medians",
    "sample_interval",
    "summarize",
]

#: The forced-K arm stops at this share of the precision target: its excess over the native step
#: is charged on every policy step, native ones included, so its error weighs as much as the
#: whole gain (DESIGN §9), while a compact cell's error only touches the steps that choose it.
FORCED_K_PRECISION_SHARE = 0.25
#: Relative SD of the sweep-to-sweep difference of a cell's median used when a sweep cannot
#: estimate its own (fewer than two capture epochs): 0.52%, measured between two H200 machine
#: starts on a DeepSeek-V3-shaped 4-layer step (benchmarks/results/sweep_efficiency.json).
FALLBACK_BETWEEN_RUN_REL = 0.0052


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
        precision_rel: target relative half-width: of the absolute interval for native cells, of
            the paired saving (in units of the native step) for the other cells (0.005 = 0.5%).
        confidence: interval confidence level.
        min_samples: kept samples a cell needs before it may stop on precision.
        min_rounds: rounds (independent re-warmed visits) a cell needs before it may stop.
        min_time_s: measured seconds a cell needs before it may stop on precision.
        max_samples_per_cell: per-cell sample cap.
        max_seconds_per_cell: per-cell time cap (seconds spent in its visits, warm-up included).
        budget_s: total sweep budget in seconds; cells still open when it runs out stop.
        warmup_steps: replays discarded on a cell's first visit of every capture epoch
            (compilation, autotuning, allocator growth).
        rewarm_steps: replays discarded at the start of every other visit.
        replays_per_sample: back-to-back replays averaged into one sample.
        samples_per_visit: samples taken per visit.
        n_boot: bootstrap resamples per interval.
        reproduction: widen absolute intervals to cover an independent re-sweep's median.
        recapture_every: rounds per capture epoch; every that many rounds each cell's graph is
            captured again and fully re-warmed, so the sweep sees what a new process would see
            (0: never; the between-run variation is then not estimated).
        between_run_rel: relative SD of the sweep-to-sweep difference of a median, to use instead
            of the sweep's own estimate (None: estimate it from the capture epochs).
        throttle_policy: which throttled samples are kept (:data:`~.telemetry.THROTTLE_POLICIES`):
            ``serving`` keeps power-capped samples and drops thermal and hardware slowdowns.
        min_kept_share: after the first round, a sweep that kept less than this share of its
            samples stops at once and names the throttle reasons it saw.
        epochs_required: capture epochs (or passes: separate processes) a cell must span before
            it may stop on precision (with re-capture on; at least 2).
        carryover_limit_rel: how far the carry-over of the previous visit may move a saving (in
            units of the native step) before the re-warm grows (:mod:`~.carryover`).
        max_rewarm_steps: the longest re-warm the sweep may grow to (at or below
            ``rewarm_steps`` the re-warm never grows).
    """

    precision_rel: float = 0.005
    confidence: float = 0.95
    min_samples: int = 8
    min_rounds: int = 6
    min_time_s: float = 0.0
    max_samples_per_cell: int = 128
    max_seconds_per_cell: float = 60.0
    budget_s: float = 3600.0
    warmup_steps: int = 8
    rewarm_steps: int = 2
    replays_per_sample: int = 2
    samples_per_visit: int = 2
    n_boot: int = 1000
    reproduction: bool = True
    recapture_every: int = 3
    between_run_rel: float | None = None
    throttle_policy: str = DEFAULT_THROTTLE_POLICY
    min_kept_share: float = 0.5
    epochs_required: int = 2
    carryover_limit_rel: float = 0.002
    max_rewarm_steps: int = 64

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
            ("recapture_every", self.recapture_every >= 0, ">= 0 (0: never re-capture)"),
            (
                "between_run_rel",
                self.between_run_rel is None or 0.0 <= self.between_run_rel < 0.5,
                "None (estimate it) or in [0, 0.5)",
            ),
            (
                "throttle_policy",
                self.throttle_policy in THROTTLE_POLICIES,
                f"one of {list(THROTTLE_POLICIES)}",
            ),
            ("min_kept_share", 0.0 <= self.min_kept_share <= 1.0, "in [0, 1]"),
            ("epochs_required", self.epochs_required >= 2, ">= 2"),
            ("carryover_limit_rel", 0.0 < self.carryover_limit_rel < 0.1, "in (0, 0.1)"),
            ("max_rewarm_steps", self.max_rewarm_steps >= 0, ">= 0"),
        ]
        for name, ok, want in checks:
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                ok = False
            if not ok:
                raise ConfigError(f"threshold {name}={value!r} must be {want}")

    @property
    def min_epochs(self) -> int:
        """Capture epochs a cell must span before it may stop on precision (``epochs_required``
        with re-capture, else 1)."""
        return self.epochs_required if self.recapture_every > 0 else 1

    @classmethod
    def adaptive(cls, **overrides: Any) -> Thresholds:
        """The default adaptive protocol (interleaved rounds, capture epochs, stop on precision)."""
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
            "recapture_every": 0,
            "between_run_rel": 0.0,
            "max_rewarm_steps": 0,
        }
        base.update(overrides)
        return cls(**base)

    @classmethod
    def power_capped(cls, **overrides: Any) -> Thresholds:
        """The adaptive protocol as held out on an H200 at its power cap (``--preset power-capped``,
        with interleaved visits and ``sweep.POWER_CAPPED_SETTLE_S``; docs/sweep.md "What the
        intervals cover"):
        six samples per visit, a capture epoch every six rounds, 0.4% precision and a 320-sample
        cap, so that the cells run the rounds those epochs need before the cap stops them."""
        base: dict[str, Any] = {
            "precision_rel": 0.004,
            "samples_per_visit": 6,
            "recapture_every": 6,
            "max_samples_per_cell": 320,
        }
        base.update(overrides)
        return cls(**base)

    @classmethod
    def quick(cls, **overrides: Any) -> Thresholds:
        """Loose thresholds for smoke tests and CPU backends (2% precision, small caps)."""
        base: dict[str, Any] = {
            "precision_rel": 0.02,
            "min_samples": 6,
            "min_rounds": 4,
            "max_samples_per_cell": 48,
            "max_seconds_per_cell": 10.0,
            "budget_s": 600.0,
            "warmup_steps": 2,
            "rewarm_steps": 1,
            "replays_per_sample": 2,
            "samples_per_visit": 2,
            "n_boot": 300,
            "recapture_every": 2,
        }
        base.update(overrides)
        return cls(**base)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every threshold."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Thresholds:
        """Build from a dict, refusing unknown names.

        ``drop_throttled`` (before throttle policies) is read as ``strict`` (True) or
        ``keep-all`` (False).

        Raises:
            ConfigError: an unknown name or an out-of-range value.
        """
        values = dict(data)
        if "drop_throttled" in values and "throttle_policy" not in values:
            values["throttle_policy"] = "strict" if values.pop("drop_throttled") else "keep-all"
        unknown = sorted(set(values) - set(cls.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"unknown threshold(s) {unknown}; known: {sorted(cls.__dataclass_fields__)}")
        return cls(**values)


@dataclass(frozen=True, slots=True)
class CellSamples:
    """The kept raw samples of one cell, in the order they were taken.

    Attributes:
        spec: the cell.
        raw_ms: kept samples, each the mean of ``replays_per_sample`` replays (ms).
        round_ids: the round each sample was taken in (same length as ``raw_ms``).
        epoch_ids: the capture epoch of each sample (same length; all 0 when not given).
    """

    spec: Cell
    raw_ms: tuple[float, ...]
    round_ids: tuple[int, ...] = ()
    epoch_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.round_ids:
            object.__setattr__(self, "round_ids", (0,) * len(self.raw_ms))
        if not self.epoch_ids:
            object.__setattr__(self, "epoch_ids", (0,) * len(self.raw_ms))
        if not len(self.round_ids) == len(self.epoch_ids) == len(self.raw_ms):
            raise InvalidValueError(
                f"{self.spec.label()}: {len(self.raw_ms)} samples but {len(self.round_ids)} round ids "
                f"and {len(self.epoch_ids)} epoch ids"
            )

    @property
    def rounds(self) -> int:
        """Number of distinct rounds with at least one sample."""
        return len(set(self.round_ids))

    @property
    def epochs(self) -> int:
        """Number of distinct capture epochs with at least one sample."""
        return len(set(self.epoch_ids))

    def by_round(self) -> list[np.ndarray]:
        """Samples grouped by round, rounds in increasing order."""
        return list(self.round_groups().values())

    def round_groups(self) -> dict[int, np.ndarray]:
        """``{round: samples}``, rounds in increasing order."""
        values = np.asarray(self.raw_ms, dtype=np.float64)
        ids = np.asarray(self.round_ids)
        return {int(r): values[ids == r] for r in sorted(set(self.round_ids))}

    def round_epochs(self) -> dict[int, int]:
        """``{round: epoch}`` (a round belongs to exactly one epoch)."""
        return {int(r): int(e) for r, e in zip(self.round_ids, self.epoch_ids, strict=True)}

    def epoch_groups(self) -> dict[int, np.ndarray]:
        """``{epoch: samples}``, epochs in increasing order."""
        values = np.asarray(self.raw_ms, dtype=np.float64)
        ids = np.asarray(self.epoch_ids)
        return {int(e): values[ids == e] for e in sorted(set(self.epoch_ids))}


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
class SavingInterval:
    """The paired saving ``1 − T(cell)/T(native)`` of one cell, with its interval.

    Attributes:
        saving: from the two pooled medians.
        low, high: the interval's bounds (a prediction for a serving process by default).
        pairs: rounds in which both cells kept samples.
        precision_rel: the round-level (pairing) half-width on the log-ratio scale, the part more
            samples shrink; the stopping rule judges it.
        method: how the interval was formed.
    """

    saving: float
    low: float
    high: float
    pairs: int
    precision_rel: float
    method: str

    @property
    def half_width(self) -> float:
        """The larger half-width, in units of the native step time."""
        return max(self.saving - self.low, self.high - self.saving)


@dataclass(frozen=True, slots=True)
class GroupPaired:
    """σ_d of the cells paired with one native cell (one G of a decode sweep), by REML.

    A capture or a process moves the heavy steps of a power-capped GPU more than the light ones
    (on an H200, the control cell of G=256, the native graph captured again, moved by up to 1%
    between builds while G=8's moved by 0.05%), so one σ_d pooled over every G is mostly the light
    G's, and a heavy G's saving intervals would carry too little. Each G therefore gets its own
    estimate from its own cells' log-ratios.

    Attributes:
        native: the native cell's label (``G256/V0``).
        estimate: the REML estimate of the group's σ_d.
        low, upper: its profile-likelihood interval.
        df: between-epoch degrees of freedom behind it.
        series: the group's cells that contributed.
        resolvable: the smallest σ_d the group's own design resolves (None: none it could).
        epochs_factor: how many times its epochs the group's design needs to resolve
            :data:`RESOLVE_TARGET_REL` (1: it does; None: past :data:`~.reml.MAX_EPOCHS_FACTOR`), each epoch as its own
            (:func:`~.reml.reml_component`'s projection).
    """

    native: str
    estimate: float
    low: float
    upper: float
    df: int
    series: int
    resolvable: float | None = None
    epochs_factor: int | None = None


@dataclass(frozen=True, slots=True)
class BetweenRun:
    """Between-epoch variance components of one sweep, pooled over its cells (log scale).

    Each component is a restricted-maximum-likelihood estimate with a profile-likelihood interval
    (:mod:`~.reml`); the intervals a sweep states carry the *upper* value of the cell-level and
    paired components (:meth:`level_carried`, :meth:`paired_carried`), so a design that cannot see
    a component does not state it as 0. The common mode, estimated from E − 1 epoch contrasts only,
    keeps its point estimate scaled by Student's ``t(E−1)/z``.

    Attributes:
        epochs: capture epochs in the sweep in which at least two cells were measured.
        cells: cells that contributed (measured in at least two epochs).
        common_mode_rel: SD of the level shift shared by every cell between epochs (σ_F).
        common_mode_df: degrees of freedom behind it (epochs − 1).
        level_rel: SD of one cell's own level shift between epochs beyond the common mode (σ_u).
        paired_rel: SD of a cell's log-ratio to its native cell between epochs (σ_d): its REML
            estimate (0 only where the likelihood peaks at 0; ``paired_rel_low`` then says whether
            the design resolved it).
        paired_cells: cells that contributed to ``paired_rel``.
        level_df, paired_df: between-epoch degrees of freedom behind ``level_rel`` and ``paired_rel``.
        estimator: how the components were estimated (``reml``; ``none`` when nothing was).
        level_rel_upper, paired_rel_upper: the upper ends of their 95% profile-likelihood
            intervals, the values the intervals carry (None: carry the point, Student-scaled).
        paired_rel_low: the lower end of σ_d's interval (0: the design did not resolve σ_d).
        resolvable_shift_rel: the smallest σ_d the design resolves (:func:`~.reml.reml_component`).
        level_resolvable_rel: the same for σ_u.
        epochs_are_processes: the epochs were separate processes (passes), so the shift a process
            draws is among what the epochs showed; otherwise a process is assumed to draw one more
            shift of the epochs' size on top of them (:attr:`own_process_share`).
        paired_groups: σ_d per native cell (:class:`GroupPaired`); a cell's saving interval
            carries its group's upper value where that is the larger (:meth:`for_cell`).
    """

    epochs: int
    cells: int
    common_mode_rel: float
    common_mode_df: int
    level_rel: float
    paired_rel: float
    paired_cells: int
    level_df: int = 0
    paired_df: int = 0
    estimator: str = "reml"
    level_rel_upper: float | None = None
    paired_rel_low: float = 0.0
    paired_rel_upper: float | None = None
    resolvable_shift_rel: float | None = None
    level_resolvable_rel: float | None = None
    epochs_are_processes: bool = False
    paired_groups: tuple[GroupPaired, ...] = ()

    def for_cell(self, cell: Cell) -> BetweenRun:
        """The components as ``cell``'s saving interval carries them: σ_d of the cell's own group
        (:class:`GroupPaired`: its estimate, interval and degrees of freedom), its upper value
        never below the pooled one (a group measured in few epochs can be low by chance; one
        measured well above the pool is what its G does). Unchanged for a native cell, a cell
        whose group was not estimated, or a sweep without a pooled estimate."""
        if cell.kind is CellKind.NATIVE or self.paired_rel_upper is None:
            return self
        label = cell.native.label()
        group = next((g for g in self.paired_groups if g.native == label), None)
        if group is None:
            return self
        return replace(
            self,
            paired_rel=group.estimate,
            paired_rel_low=group.low,
            paired_rel_upper=max(group.upper, self.paired_rel_upper),
            paired_df=group.df,
            paired_cells=group.series,
        )

    @property
    def own_process_share(self) -> float:
        """How many epoch-sized shifts a process adds beyond its epochs: 0 when the epochs were
        processes, else 1 (a new process draws what a re-capture draws, once more)."""
        return 0.0 if self.epochs_are_processes else 1.0

    @property
    def estimated(self) -> bool:
        """True when the sweep had at least two epochs to estimate from."""
        return self.epochs >= 2 and self.cells >= 1

    @property
    def paired_resolved(self) -> bool:
        """True when σ_d = 0 lies outside its interval: a paired shift was measured, not bounded."""
        return self.paired_rel_low > 0.0

    def common_mode_scale(self, confidence: float) -> float:
        """``t(df)/z``: the common mode rests on few epochs, so its quantile is Student's."""
        return _student_scale(self.common_mode_df, confidence)

    def level_scale(self, confidence: float) -> float:
        """``t(df)/z`` for ``level_rel`` (an estimated variance, not a known one)."""
        return _student_scale(self.level_df, confidence)

    def paired_scale(self, confidence: float) -> float:
        """``t(df)/z`` for ``paired_rel``."""
        return _student_scale(self.paired_df, confidence)

    def level_carried(self, confidence: float) -> float:
        """σ_u as the intervals carry it: the upper end of its interval, else the scaled point."""
        if self.level_rel_upper is not None:
            return self.level_rel_upper
        return self.level_scale(confidence) * self.level_rel

    def paired_carried(self, confidence: float) -> float:
        """σ_d as the saving intervals carry it: the upper end of its interval, else the scaled point."""
        if self.paired_rel_upper is not None:
            return self.paired_rel_upper
        return self.paired_scale(confidence) * self.paired_rel

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (recorded in the sweep's provenance), with ``paired_resolved``."""
        return {**asdict(self), "paired_resolved": self.paired_resolved}


def _student_scale(df: int, confidence: float) -> float:
    if df < 1:
        return 1.0
    a = (1 - confidence) / 2
    return float(stdtrit(df, 1 - a)) / _z(confidence)


#: What a sweep without two epochs knows about the between-epoch variation: nothing.
NO_BETWEEN_RUN = BetweenRun(0, 0, 0.0, 0, 0.0, 0.0, 0, estimator="none")


@dataclass(frozen=True, slots=True)
class CellSummary:
    """Statistics of one cell's kept samples (computed lazily from raw samples).

    ``warnings`` are codes, returned as data: ``few_rounds``, ``single_round``, ``wide_iqr``,
    ``round_spread``, ``outliers``, ``no_between_run_estimate``, ``unpaired``.
    Native cells carry a saving of exactly 0 with a zero-width interval.
    """

    spec: Cell
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
    saving: float = 0.0
    saving_ci_low: float = 0.0
    saving_ci_high: float = 0.0
    paired_rounds: int = 0
    epochs: int = 1
    common_mode_rel: float = 0.0
    level_rel: float = 0.0

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
        ConfigError: empty, non-finite or non-positive values.
    """
    arr = np.asarray(values, dtype=np.float64)
    bad = _check_values(arr)
    if bad:
        raise InvalidValueError(bad)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
    meds = np.median(arr[idx], axis=1)
    a = (1 - confidence) / 2
    lo, hi = np.quantile(meds, [a, 1 - a])
    med = float(np.median(arr))
    return Interval(med, min(float(lo), med), max(float(hi), med), "sample_bootstrap")


class _RoundTable:
    """Rounds of one cell as a NaN-padded (R, width) table, with each round's epoch."""

    def __init__(self, groups: Sequence[np.ndarray], epochs: Sequence[int]) -> None:
        self.sizes = np.array([g.size for g in groups])
        self.width = int(self.sizes.max())
        self.table = np.full((len(groups), self.width), np.nan)
        for i, g in enumerate(groups):
            self.table[i, : g.size] = g
        self.epochs = np.asarray(epochs)
        self.equal = bool(np.all(self.sizes == self.width))

    @property
    def rounds(self) -> int:
        return int(self.sizes.shape[0])

    def medians(self, pick: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Pooled median of each resample: rounds ``pick`` (B, R), samples drawn within each."""
        n_boot, n_rounds = pick.shape
        picked_sizes = self.sizes[pick]
        within = np.floor(rng.random((n_boot, n_rounds, self.width)) * picked_sizes[..., None]).astype(
            np.int64
        )
        draws = self.table[pick[..., None], within]
        if self.equal:
            out: np.ndarray = np.median(draws.reshape(n_boot, -1), axis=1)
            return out
        mask = np.arange(self.width)[None, None, :] >= picked_sizes[..., None]
        draws[mask] = np.nan
        out = np.nanmedian(draws.reshape(n_boot, -1), axis=1)
        return out


def _stratified_pick(rng: np.random.Generator, epochs: np.ndarray, n_boot: int) -> np.ndarray:
    """(B, R) round indices resampled with replacement within each epoch."""
    cols = []
    for e in np.unique(epochs):
        members = np.flatnonzero(epochs == e)
        cols.append(members[rng.integers(0, members.size, size=(n_boot, members.size))])
    return np.concatenate(cols, axis=1)


def _small_sample_scale(rounds: int, epochs: int, confidence: float) -> float:
    """``t(df)/z · sqrt(R/df)`` with df = R − E: a stratified bootstrap over few rounds is narrow."""
    df = max(rounds - epochs, 1)
    a = (1 - confidence) / 2
    return float(stdtrit(df, 1 - a)) / _z(confidence) * math.sqrt(rounds / df)


def _epoch_variance(between: BetweenRun, cell_epochs: int, confidence: float) -> float:
    """Variance (log scale, in z units) of a cell's level beyond the round noise.

    A process carries its own level shift, of the size an epoch shows (the assumption the estimate
    rests on: a new process draws what a re-capture draws; none beyond them when the epochs were
    processes), plus this sweep's average over its E epochs: ``(1 + 1/E)·(σ_u² + (t·σ_F/z)²)``.
    """
    cm = between.common_mode_scale(confidence) * between.common_mode_rel
    level = between.level_carried(confidence)
    return (level**2 + cm**2) * (between.own_process_share + 1.0 / max(cell_epochs, 1))


def median_interval(
    rounds: Sequence[Sequence[float] | np.ndarray],
    *,
    epochs: Sequence[int] | None = None,
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    reproduction: bool = True,
    between: BetweenRun | None = None,
    between_run_rel: float | None = None,
) -> Interval:
    """Hierarchical bootstrap interval of the pooled median, with the between-epoch terms.

    Resamples rounds with replacement within each epoch, then samples within each chosen round,
    and takes each resample's pooled median; half-widths (log scale) are scaled by the
    small-sample factor. ``between`` adds the epoch-level variance of the sweep; with
    ``reproduction`` the half-widths are widened by √2 and ``between_run_rel`` (the SD of a
    sweep-to-sweep difference, when given) is added in quadrature. Bounds are ``m·exp(∓h)``.

    Args:
        rounds: samples per round; at least two non-empty rounds.
        epochs: the epoch of each round (default: one epoch).
        confidence: confidence level.
        n_boot: bootstrap resamples.
        seed: RNG seed (the same inputs and seed give the same interval).
        reproduction: cover an independent re-sweep's median rather than the condition median.
        between: the sweep's between-epoch components (None: none added).
        between_run_rel: with ``reproduction``, a sweep-to-sweep relative SD added in quadrature.

    Raises:
        InvalidValueError: fewer than two rounds, or unusable values.
    """
    keep = [i for i, r in enumerate(rounds) if len(r)]
    groups = [np.asarray(rounds[i], dtype=np.float64) for i in keep]
    if len(groups) < 2:
        raise InvalidValueError("a hierarchical interval needs at least two non-empty rounds")
    pooled = np.concatenate(groups)
    bad = _check_values(pooled)
    if bad:
        raise InvalidValueError(bad)
    round_epochs = [0] * len(groups) if epochs is None else [int(epochs[i]) for i in keep]
    table = _RoundTable(groups, round_epochs)
    rng = np.random.default_rng(seed)
    meds = table.medians(_stratified_pick(rng, table.epochs, n_boot), rng)
    a = (1 - confidence) / 2
    q_lo, q_hi = np.quantile(meds, [a, 1 - a])
    med = float(np.median(pooled))
    n_epochs = len(set(round_epochs))
    scale = _small_sample_scale(table.rounds, n_epochs, confidence)
    below = scale * max(math.log(med) - math.log(float(q_lo)), 0.0)
    above = scale * max(math.log(float(q_hi)) - math.log(med), 0.0)
    method = "hierarchical_bootstrap"
    z = _z(confidence)
    if between is not None and between.estimated:
        extra = z * math.sqrt(_epoch_variance(between, n_epochs, confidence))
        below, above = math.hypot(below, extra), math.hypot(above, extra)
        method += "+epochs"
    if reproduction:
        below, above = below * math.sqrt(2.0), above * math.sqrt(2.0)
        method += "+reproduction"
        if between_run_rel is not None and between_run_rel > 0.0:
            floor = z * between_run_rel
            below, above = math.hypot(below, floor), math.hypot(above, floor)
            method += "+between_run"
    return Interval(med, med * math.exp(-below), med * math.exp(above), method)


def paired_saving_interval(
    cell: CellSamples,
    native: CellSamples,
    *,
    confidence: float = 0.95,
    between: BetweenRun | None = None,
    prediction: bool = True,
) -> SavingInterval | None:
    """The saving ``1 − T(cell)/T(native)`` with an interval from the round-level pairing.

    Every round visits both cells, so the per-round log-ratio ``d_r = log m(cell, r) − log
    m(native, r)`` of the two round medians is free of whatever the round shared (drift, heat,
    the clock state). The estimate is the 20% trimmed mean of ``d_r`` over the rounds both kept
    samples in, its round-level half-width Yuen's (:func:`round_level_half_width`): robust to a
    round hit by an outlier sample. ``between`` adds the between-epoch variance of the
    paired log-ratio: this process's own shift and its E-epoch average, and with ``prediction``
    the serving process's shift too (DESIGN §7). A resampling of pooled medians would not cancel
    the round's drift as exactly, so none is used here.

    Returns:
        The interval, or None when fewer rounds pair than give one degree of freedom.

    Raises:
        InvalidValueError: unusable values.
    """
    for values in (cell.raw_ms, native.raw_ms):
        bad = _check_values(np.asarray(values, dtype=np.float64))
        if bad:
            raise InvalidValueError(f"{cell.spec.label()}: {bad}")
    loc = _trimmed_location(_paired_logs(cell, native), cell.round_epochs(), confidence)
    if loc is None:
        return None
    point, half, n_epochs = loc.point, loc.half, loc.epochs
    below = above = half
    method = "paired_rounds_trimmed"
    if between is not None and between.estimated and between.paired_cells:
        factor = between.own_process_share + 1.0 / max(n_epochs, 1) + (1.0 if prediction else 0.0)
        extra = _z(confidence) * between.paired_carried(confidence) * math.sqrt(factor)
        below, above = math.hypot(below, extra), math.hypot(above, extra)
        method += "+epochs" + ("+prediction" if prediction else "")
    # Saving = 1 − exp(log-ratio): a larger ratio is a smaller saving.
    return SavingInterval(
        saving=1.0 - math.exp(point),
        low=1.0 - math.exp(point + above),
        high=1.0 - math.exp(point - below),
        pairs=loc.rounds,
        precision_rel=half,
        method=method,
    )


def _group_medians(values: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group ids ascending, the median of each group), vectorised (no Python loop per group)."""
    order = np.lexsort((values, ids))
    v, g = values[order], ids[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    counts = np.diff(np.r_[starts, g.size])
    low = v[starts + (counts - 1) // 2]
    high = v[starts + counts // 2]
    return g[starts], (low + high) / 2.0


def _round_log_medians(samples: CellSamples) -> dict[int, float]:
    if not samples.raw_ms:
        return {}
    rounds, medians = _group_medians(
        np.asarray(samples.raw_ms, dtype=np.float64), np.asarray(samples.round_ids, dtype=np.int64)
    )
    return dict(zip(rounds.tolist(), np.log(medians).tolist(), strict=True))


def common_round_effects(logs: Mapping[Cell, Mapping[int, float]]) -> dict[int, float]:
    """The level every cell shared in each round: the median over the cells measured in the round
    of their round log-median less the cell's own mean (the epoch's common shift and the round's
    drift together). Pure; used by the between-run components and the carry-over estimate."""
    level = {c: float(np.mean(list(v.values()))) for c, v in logs.items() if v}
    by_round: dict[int, list[float]] = {}
    for c, values in logs.items():
        for r, v in values.items():
            by_round.setdefault(r, []).append(v - level[c])
    return {r: float(np.median(v)) for r, v in sorted(by_round.items())}


def round_log_medians(cells: Mapping[Cell, CellSamples]) -> dict[Cell, dict[int, float]]:
    """``{cell: {round: log of the round's median}}`` of every cell with samples."""
    return {c: _round_log_medians(s) for c, s in cells.items() if s.raw_ms}


#: Correlation of two cells' log-ratios to their shared native cell when every cell shifts alike
#: between epochs (Var(u_c − u_n) = 2σ², Cov(u_c − u_n, u_c' − u_n) = σ²).
PAIRED_CORRELATION = 0.5
#: The paired shift a sweep's design should resolve: one between processes of this size was
#: measured on an H200 at its power cap (docs/sweep.md); each G's group states how many times its
#: epochs it would need (:attr:`GroupPaired.epochs_factor`).
RESOLVE_TARGET_REL = 0.004


def _paired_groups(
    compared: Sequence[Cell],
    ratios: Sequence[tuple[dict[int, float], Mapping[int, int]]],
    confidence: float,
    target: float = RESOLVE_TARGET_REL,
) -> tuple[GroupPaired, ...]:
    """σ_d of each G alone from its cells' round log-ratios (``ratios``, one per cell of
    ``compared``), with the resolvable shift and the epochs it would need for ``target``; a G with
    no series that counts is left out."""
    groups = []
    for native in dict.fromkeys(c.native for c in compared):
        mine = [r for c, r in zip(compared, ratios, strict=True) if c.native == native]
        g = reml_component(
            mine,
            confidence=confidence,
            design=design_effect([len(mine)], PAIRED_CORRELATION),
            target=target,
        )
        if g.series:
            groups.append(
                GroupPaired(
                    native.label(),
                    g.estimate,
                    g.low,
                    g.high,
                    g.between_df,
                    g.series,
                    g.resolvable_or_none,
                    g.epochs_factor,
                )
            )
    return tuple(groups)


def _paired_ratios(
    logs: Mapping[Cell, dict[int, float]], epoch_of: Mapping[Cell, Mapping[int, int]], multi: Sequence[Cell]
) -> tuple[list[Cell], list[tuple[dict[int, float], Mapping[int, int]]]]:
    """The non-native cells of ``multi`` whose native has rounds, and each one's round log-ratios
    to its native cell with its rounds' epochs: the series σ_d is estimated from."""
    compared = [c for c in multi if c.kind is not CellKind.NATIVE and c.native in logs]
    ratios = [
        ({r: v - logs[c.native][r] for r, v in logs[c].items() if r in logs[c.native]}, epoch_of[c])
        for c in compared
    ]
    return compared, ratios


def group_paired(
    cells: Mapping[Cell, CellSamples],
    native: Cell,
    *,
    confidence: float = 0.95,
    target: float = RESOLVE_TARGET_REL,
) -> GroupPaired | None:
    """σ_d of ``native``'s G alone from ``cells`` (which may hold other G's cells too): the group
    :func:`estimate_between_run` states in ``paired_groups``, with its resolvable shift and the
    epochs it would need to resolve ``target``; None while no cell of the G spans two epochs
    beside its native. Pure."""
    mine = {c: s for c, s in cells.items() if c.native == native}
    logs = round_log_medians(mine)
    epoch_of = {c: mine[c].round_epochs() for c in logs}
    multi = [c for c in logs if len({epoch_of[c][r] for r in logs[c]}) >= 2]
    compared, ratios = _paired_ratios(logs, epoch_of, multi)
    groups = _paired_groups(compared, ratios, confidence, target) if compared else ()
    return groups[0] if groups else None


def estimate_between_run(
    cells: Mapping[Cell, CellSamples], *, confidence: float = 0.95, epochs_are_processes: bool = False
) -> BetweenRun:
    """Estimate the between-epoch variance components of a sweep from all its cells.

    Works on round log-medians, by restricted maximum likelihood (:func:`~.reml.reml_component`:
    per series a one-way random-effects model of rounds within epochs, the epoch SD pooled over the
    series, each series keeping its own round noise):

    - σ_F (common mode): one series, the level every cell shared in each round
      (:func:`common_round_effects`); its rounds' spread within an epoch is the drift they shared;
    - σ_u (cell level): per cell, its round log-medians less that shared level;
    - σ_d (paired): per non-native cell, its round log-ratio to the native cell of its G (the
      pairing cancels the shared level); pooled over every G, and per G (``paired_groups``).

    Each component comes with its profile-likelihood interval and the smallest shift the design
    resolves; the intervals carry the upper ends of σ_u and σ_d (:class:`BetweenRun`).
    ``epochs_are_processes``: the epochs were separate processes (see :class:`BetweenRun`). Pure.
    """
    logs = round_log_medians(cells)
    epoch_of = {c: cells[c].round_epochs() for c in logs}
    multi = [c for c in logs if len({epoch_of[c][r] for r in logs[c]}) >= 2]
    epochs = sorted({epoch_of[c][r] for c in multi for r in logs[c]})
    if len(epochs) < 2 or not multi:
        return NO_BETWEEN_RUN
    shared = common_round_effects({c: logs[c] for c in multi})
    round_epoch = {r: epoch_of[c][r] for c in multi for r in logs[c]}
    # The common mode is carried as its point estimate (module docstring), the level as its upper end.
    common = reml_component([(shared, round_epoch)], confidence=confidence, bounds=(False, False))
    level = reml_component(
        [({r: v - shared[r] for r, v in logs[c].items()}, epoch_of[c]) for c in multi],
        confidence=confidence,
        bounds=(False, True),
    )
    compared, ratios = _paired_ratios(logs, epoch_of, multi)
    # The cells of one G share their native cell's shift: if cells shift alike, their log-ratios
    # correlate at 1/2, and their pooled sum of squares carries fewer independent pieces.
    per_g = [sum(1 for c in compared if c.native == n) for n in {c.native for c in compared}]
    paired = reml_component(ratios, confidence=confidence, design=design_effect(per_g, PAIRED_CORRELATION))
    groups = _paired_groups(compared, ratios, confidence)
    return BetweenRun(
        epochs=len(epochs),
        cells=len(multi),
        common_mode_rel=common.estimate,
        common_mode_df=len(epochs) - 1,
        level_rel=level.estimate,
        paired_rel=paired.estimate,
        paired_cells=paired.series,
        level_df=level.between_df,
        paired_df=paired.between_df,
        estimator="reml",
        level_rel_upper=level.high if level.series else None,
        paired_rel_low=paired.low,
        paired_rel_upper=paired.high if paired.series else None,
        resolvable_shift_rel=paired.resolvable_or_none,
        level_resolvable_rel=level.resolvable_or_none,
        epochs_are_processes=epochs_are_processes,
        paired_groups=groups,
    )


def _bootstrap_seed(seed: int, spec: Cell, n: int) -> int:
    group, arm = spec.key
    state = np.random.SeedSequence([seed, group, arm + 1, n]).generate_state(1)
    return int(state[0])


def summarize(
    samples: CellSamples,
    *,
    reference: CellSamples | None = None,
    between: BetweenRun | None = None,
    confidence: float = 0.95,
    n_boot: int = 1000,
    seed: int = 0,
    reproduction: bool = True,
    between_run_rel: float | None = None,
) -> CellSummary:
    """Median, intervals, paired saving, p10/p90, IQR, level model and warnings of one cell.

    Two or more rounds use :func:`median_interval`; a single round falls back to
    :func:`sample_interval` and carries the ``single_round`` warning. A cell with a ``reference``
    (its native cell) also gets its paired saving (:func:`paired_saving_interval`); when fewer than
    two rounds pair, the saving's interval is formed from the two absolute intervals (the
    pre-pairing way) and the cell carries ``unpaired``. Without an estimable ``between``, the
    between-run term is ``between_run_rel`` or :data:`FALLBACK_BETWEEN_RUN_REL`
    (``no_between_run_estimate``). Bootstraps are seeded from ``seed`` and the cell, so the same
    samples always give the same summary.

    Raises:
        InvalidValueError: no samples, or non-finite or non-positive values.
    """
    values = np.asarray(samples.raw_ms, dtype=np.float64)
    bad = _check_values(values)
    if bad:
        raise InvalidValueError(f"{samples.spec.label()}: {bad}")
    boot_seed = _bootstrap_seed(seed, samples.spec, values.size)
    warnings: list[str] = []
    groups = samples.round_groups()
    estimated = between is not None and between.estimated
    fallback = between_run_rel
    if not estimated and fallback is None:
        fallback = FALLBACK_BETWEEN_RUN_REL
        if reproduction:
            warnings.append("no_between_run_estimate")
    resampling = _Resampling(confidence, n_boot, boot_seed, reproduction)
    interval, own = _cell_interval(
        samples,
        values,
        groups,
        resampling,
        between if estimated else None,
        between_run_rel if estimated else fallback,
        warnings,
    )
    med = interval.median
    p10, p90, iqr = _spread(values, med, warnings)
    common, level = _level_model(
        between if estimated else None, own, fallback, epochs=samples.epochs, confidence=confidence
    )
    saving = SavingInterval(0.0, 0.0, 0.0, samples.rounds, 0.0, "native")
    if reference is not None and samples.spec.kind is not CellKind.NATIVE:
        saving = _saving(
            samples, reference, interval, replace(resampling, seed=seed), between, between_run_rel, warnings
        )
    return CellSummary(
        spec=samples.spec,
        median_ms=med,
        ci_low_ms=interval.low,
        ci_high_ms=interval.high,
        p10_ms=p10,
        p90_ms=p90,
        iqr_ms=iqr,
        samples=int(values.size),
        rounds=len(groups),
        ci_method=interval.method,
        warnings=tuple(warnings),
        saving=saving.saving,
        saving_ci_low=saving.low,
        saving_ci_high=saving.high,
        paired_rounds=saving.pairs,
        epochs=samples.epochs,
        common_mode_rel=common,
        level_rel=level,
    )


def _spread(values: np.ndarray, median: float, warnings: list[str]) -> tuple[float, float, float]:
    """(p10, p90, IQR) of the samples; appends ``wide_iqr`` and ``outliers`` where they apply."""
    p10, p25, p75, p90 = np.quantile(values, [0.10, 0.25, 0.75, 0.90])
    if (p75 - p25) / median > 0.05:
        warnings.append("wide_iqr")
    if values.max() > 1.5 * median:
        warnings.append("outliers")
    return float(p10), float(p90), float(p75 - p25)


def _saving(
    samples: CellSamples,
    reference: CellSamples,
    interval: Interval,
    resampling: _Resampling,
    between: BetweenRun | None,
    between_run_rel: float | None,
    warnings: list[str],
) -> SavingInterval:
    """The compact cell's saving against its native ``reference``: paired when two or more rounds
    pair, else (``unpaired``, appended to ``warnings``) from the two absolute intervals (the
    reference summarized with ``resampling``, whose seed is the caller's, not the cell's)."""
    confidence = resampling.confidence
    estimated = between is not None and between.estimated
    paired = paired_saving_interval(
        samples, reference, confidence=confidence, between=between if estimated else None
    )
    if paired is not None:
        return paired
    warnings.append("unpaired")
    ref = summarize(
        reference,
        confidence=confidence,
        n_boot=resampling.n_boot,
        seed=resampling.seed,
        reproduction=resampling.reproduction,
        between=between,
        between_run_rel=between_run_rel,
    )
    return SavingInterval(
        1.0 - interval.median / ref.median_ms,
        1.0 - interval.high / ref.ci_low_ms,
        1.0 - interval.low / ref.ci_high_ms,
        0,
        math.inf,
        "unpaired_intervals",
    )


@dataclass(frozen=True, slots=True)
class _Resampling:
    """How a summary resamples: the interval's confidence, bootstrap draws and seed, and whether
    the interval is a reproduction interval (another process) or this condition's only."""

    confidence: float
    n_boot: int
    seed: int
    reproduction: bool


def _cell_interval(
    samples: CellSamples,
    values: np.ndarray,
    groups: Mapping[int, np.ndarray],
    resampling: _Resampling,
    between: BetweenRun | None,
    between_run_rel: float | None,
    warnings: list[str],
) -> tuple[Interval, float]:
    """The median's interval and the cell's own spread (log units): over rounds when there are
    two or more, else over the samples of the single round (``single_round``)."""
    confidence = resampling.confidence
    if len(groups) >= 2:
        return _round_interval(samples, groups, resampling, between, between_run_rel, warnings)
    interval = sample_interval(values, confidence=confidence, n_boot=resampling.n_boot, seed=resampling.seed)
    own = (
        math.log(interval.high / interval.median) / _z(confidence) if interval.high > interval.median else 0.0
    )
    warnings.append("single_round")
    return interval, own


def _round_interval(
    samples: CellSamples,
    groups: Mapping[int, np.ndarray],
    resampling: _Resampling,
    between: BetweenRun | None,
    between_run_rel: float | None,
    warnings: list[str],
) -> tuple[Interval, float]:
    """The median's interval over two or more rounds, and the cell's own (condition) spread in
    log units; appends ``few_rounds`` and ``round_spread`` to ``warnings`` where they apply."""
    confidence, n_boot, seed = resampling.confidence, resampling.n_boot, resampling.seed
    epochs_of = samples.round_epochs()
    interval = median_interval(
        list(groups.values()),
        epochs=[epochs_of[r] for r in groups],
        confidence=confidence,
        n_boot=n_boot,
        seed=seed,
        reproduction=resampling.reproduction,
        between=between,
        between_run_rel=between_run_rel,
    )
    condition = median_interval(
        list(groups.values()),
        epochs=[epochs_of[r] for r in groups],
        confidence=confidence,
        n_boot=n_boot,
        seed=seed,
        reproduction=False,
    )
    own = math.log(condition.high / condition.median) / _z(confidence)
    if len(groups) < 3:
        warnings.append("few_rounds")
    round_meds = np.array([np.median(g) for g in groups.values()])
    if (round_meds.max() - round_meds.min()) / interval.median > 0.05:
        warnings.append("round_spread")
    return interval, own


def _level_model(
    between: BetweenRun | None, own: float, fallback: float | None, *, epochs: int, confidence: float
) -> tuple[float, float]:
    """(common-mode, level) relative terms of the cell's time in a serving process.

    ``between``: the sweep's estimated between-run model, or None when nothing between epochs is
    known (the fallback's process share is then taken as common mode).
    """
    if between is not None:
        # A serving process differs from this sweep by its own shift and by this sweep's.
        serve = math.sqrt(1.0 + between.own_process_share + 1.0 / epochs)
        common = between.common_mode_scale(confidence) * between.common_mode_rel * serve
        level = math.sqrt(own**2 + (between.level_carried(confidence) * serve) ** 2)
        return common, level
    return float(fallback or 0.0) / math.sqrt(2.0), own


#: Share trimmed from each end of the per-round values (Yuen's 20% trimmed mean): a round hit by
#: an outlier sample (a stray interrupt, a clock dip) moves the mean of a few rounds far, the
#: trimmed mean hardly at all, at an efficiency loss of a few percent on clean data.
TRIM = 0.2


@dataclass(frozen=True, slots=True)
class _Location:
    """A robust location of per-round values with its round-level half-width."""

    point: float
    half: float
    rounds: int
    epochs: int


def _trimmed_location(
    values: Mapping[int, float], epoch_of: Mapping[int, int], confidence: float
) -> _Location | None:
    """Yuen's trimmed mean of per-round values, with a Student half-width from the Winsorized
    variance of the values' deviations from their own epoch's median (epoch shifts are left to the
    between-epoch terms); None without a degree of freedom."""
    if not values:
        return None
    rounds = np.array(list(values))
    v = np.array([values[r] for r in rounds])
    epochs = np.array([epoch_of[int(r)] for r in rounds])
    n, n_epochs = v.size, int(np.unique(epochs).size)
    g = math.floor(TRIM * n)
    df = n - 2 * g - 1 - (n_epochs - 1)
    if df < 1:
        return None
    ordered = np.sort(v)
    point = float(ordered[g : n - g].mean())
    centred = v.copy()
    for e in np.unique(epochs):
        members = epochs == e
        centred[members] -= np.median(v[members])
    c = np.sort(centred)
    wins = np.clip(centred, c[g], c[n - g - 1])
    se = float(np.std(wins, ddof=1)) / ((1.0 - 2.0 * g / n) * math.sqrt(n))
    a = (1 - confidence) / 2
    return _Location(point, float(stdtrit(df, 1 - a)) * se, n, n_epochs)


def _paired_logs(samples: CellSamples, reference: CellSamples | None) -> dict[int, float]:
    logs = _round_log_medians(samples)
    if reference is None:
        return logs
    ref = _round_log_medians(reference)
    return {r: v - ref[r] for r, v in logs.items() if r in ref}


def round_level_half_width(
    samples: CellSamples, reference: CellSamples | None = None, *, confidence: float = 0.95
) -> float | None:
    """The round-level half-width (log scale) of a cell's level, or of its log-ratio to
    ``reference`` over the rounds both were measured in (Yuen's trimmed mean of the per-round
    values; see :data:`TRIM`).

    For the paired case this is the interval :func:`paired_saving_interval` states before its
    between-epoch terms; for a cell alone it is the closed form of what :func:`median_interval`'s
    bootstrap estimates. The stopping rule uses it after every round: it costs microseconds.

    Returns:
        The half-width, or None without a degree of freedom.
    """
    loc = _trimmed_location(_paired_logs(samples, reference), samples.round_epochs(), confidence)
    return None if loc is None else loc.half


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
        reference: the kept samples of the native cell of the same G, for every other cell: its
            precision is then judged on the paired saving.
    """

    samples: CellSamples
    cell_seconds: float
    sweep_seconds: float
    taken: int
    visits: int
    seed: int = 0
    reference: CellSamples | None = None


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
    """Adaptive stopping: stop when the round-level half-width ≤ ``precision_rel``.

    A native cell is judged on its absolute interval; every other cell, given its native cell as
    ``reference``, on its paired saving (in units of the native step), which the pairing makes far
    tighter than either absolute interval. The between-epoch terms are not judged: more samples
    cannot shrink them. The minimums (samples, rounds, epochs, time) must be met first; the caps and
    the total budget stop a cell that has not reached precision (REJECT with the cap as reason).
    """

    thresholds: Thresholds

    def _half_width(self, progress: CellProgress) -> float | None:
        th = self.thresholds
        if progress.reference is not None and progress.samples.spec.kind is not CellKind.NATIVE:
            half = round_level_half_width(progress.samples, progress.reference, confidence=th.confidence)
        else:
            half = round_level_half_width(progress.samples, None, confidence=th.confidence)
        if half is None:
            return None
        # Judged as what an independent re-sweep would agree to, like the stored interval.
        return half * (math.sqrt(2.0) if th.reproduction else 1.0)

    def __call__(self, progress: CellProgress) -> Decision:
        """Decide about one cell; see :class:`StoppingRule`."""
        th = self.thresholds
        values = np.asarray(progress.samples.raw_ms, dtype=np.float64)
        if values.size and _check_values(values):
            return Decision(Status.UNKNOWN, "non_finite", "non-finite or non-positive samples")
        enough = (
            values.size >= th.min_samples
            and progress.samples.rounds >= max(th.min_rounds, 2)
            and progress.samples.epochs >= th.min_epochs
            and progress.cell_seconds >= th.min_time_s
        )
        if enough:
            half = self._half_width(progress)
            target = th.precision_rel
            if progress.samples.spec.kind is CellKind.FORCED_K:
                target *= FORCED_K_PRECISION_SHARE
            if half is not None and half <= target:
                what = "paired saving" if progress.reference is not None else "interval"
                return Decision(
                    Status.ACCEPT,
                    StopReason.PRECISION.value,
                    f"{what} half-width {half:.3%} <= {target:.3%}",
                )
        capped = _caps(progress, th)
        if capped is not None:
            return capped
        if not enough:
            return Decision(
                Status.UNKNOWN,
                "too_few_samples",
                f"{values.size} samples in {progress.samples.rounds} rounds and "
                f"{progress.samples.epochs} epoch(s); need {th.min_samples} in {th.min_rounds} rounds "
                f"and {th.min_epochs} epoch(s)",
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
