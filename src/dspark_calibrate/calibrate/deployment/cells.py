"""The measured cells ``build`` prices with: medians, intervals, paired savings, the forced-K arm.

:class:`CellTime` is one measured cell as a sweep summary or a cost table row states it (any
schema version: rows from before the paired design derive an unpaired saving from the two absolute
intervals). :class:`CellGrid` holds the cells of one deployment by G: the native cell, the
deployable compact candidates and, where measured, the forced-K arm. Pure; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scipy.special import ndtri

from dspark_calibrate.artifacts import (
    DEFAULT_MINIMUM_PREDICTED_GAIN,
    FORCED_K_BUDGET,
    NATIVE_BUDGET,
    CostTable,
    DrainGuard,
    is_deployable,
)
from dspark_calibrate.errors import ConfigError

__all__ = ["CHECK_COLUMNS", "CellGrid", "CellTime", "control_notes"]


@dataclass(frozen=True, slots=True, order=True)
class CellTime:
    """One measured cell: median whole-step time, its interval, and its paired saving.

    Attributes:
        graph_batch_size, verifier_budget: the cell (V = 0 native, V = −1 the forced-K arm).
        step_time_ms, ci_low_ms, ci_high_ms: the median and its reproduction interval (ms).
        source_result_sha256: the logical hash of the cell's raw samples.
        saving, saving_ci_low, saving_ci_high: ``1 − T(G,V)/T(G,0)`` and its 95% interval for a
            serving process (0 for native cells; negative for the forced-K arm: its overhead).
        paired_rounds: rounds the saving was paired on; 0 means unpaired (a table from before the
            paired design, priced the old way).
        common_mode_rel: relative SD of the level shift common to every cell between processes.
        level_rel: relative SD of this cell's own level shift beyond the common mode.
        control_bias, control_bias_ci_low, control_bias_ci_high: the saving of this G's control
            cell (the native step captured again; 0 is the truth) and its interval; None without a
            control (and in tables from before the sweep's bias checks).
        control_widened: the saving interval was widened because that control's interval excludes 0.
        paired_rel: the sweep's between-run SD of a paired log-ratio (REML estimate; None: not
            estimated); paired_rel_upper: the upper value the saving intervals carry.
        clock_rel, power_rel: the cell's median SM clock and power over its native cell's.
        carryover_rel: the shift of this cell's median by the carry-over of the visits before it.
    """

    graph_batch_size: int
    verifier_budget: int
    step_time_ms: float
    ci_low_ms: float
    ci_high_ms: float
    source_result_sha256: str = ""
    saving: float = 0.0
    saving_ci_low: float = 0.0
    saving_ci_high: float = 0.0
    paired_rounds: int = 0
    common_mode_rel: float = 0.0
    level_rel: float = 0.0
    control_bias: float | None = None
    control_bias_ci_low: float | None = None
    control_bias_ci_high: float | None = None
    control_widened: bool = False
    paired_rel: float | None = None
    paired_rel_upper: float | None = None
    clock_rel: float | None = None
    power_rel: float | None = None
    carryover_rel: float | None = None

    def __post_init__(self) -> None:
        t, lo, hi = self.step_time_ms, self.ci_low_ms, self.ci_high_ms
        where = f"cell (G={self.graph_batch_size}, V={self.verifier_budget})"
        if not all(math.isfinite(x) and x > 0 for x in (t, lo, hi)) or not lo <= t <= hi:
            raise ConfigError(f"{where}: need finite 0 < ci_low <= median <= ci_high, got {lo}, {t}, {hi}")
        s, slo, shi = self.saving, self.saving_ci_low, self.saving_ci_high
        if not all(math.isfinite(x) for x in (s, slo, shi)) or not slo <= s <= shi < 1.0:
            raise ConfigError(
                f"{where}: need finite saving_ci_low <= saving <= saving_ci_high < 1, got {slo}, {s}, {shi}; "
                "re-run the sweep"
            )
        if not all(math.isfinite(x) and x >= 0 for x in (self.common_mode_rel, self.level_rel)):
            raise ConfigError(f"{where}: common_mode_rel and level_rel must be finite and >= 0")
        bad = sorted(name for name in CHECK_COLUMNS[:-1] if not _finite_or_none(getattr(self, name)))
        bad += [n for n in ("paired_rel", "paired_rel_upper") if (getattr(self, n) or 0.0) < 0.0]
        if bad:
            raise ConfigError(f"{where}: {bad} must be finite (and the between-run SDs >= 0) where given")

    @property
    def paired(self) -> bool:
        """True when the saving's interval comes from a round-level pairing."""
        return self.paired_rounds >= 2


#: The sweep's bias-check columns (sweep and cost-table schema 3), copied as the sweep states them.
CHECK_COLUMNS: tuple[str, ...] = (
    "control_bias",
    "control_bias_ci_low",
    "control_bias_ci_high",
    "paired_rel",
    "paired_rel_upper",
    "clock_rel",
    "power_rel",
    "carryover_rel",
    "control_widened",
)


def _finite_or_none(x: float | None) -> bool:
    return x is None or math.isfinite(x)


def _checks(r: Mapping[str, Any]) -> dict[str, Any]:
    """The bias-check fields of a row (absent in tables from before them: None, not widened)."""
    out: dict[str, Any] = {n: None if r.get(n) is None else float(r[n]) for n in CHECK_COLUMNS[:-1]}
    out["control_widened"] = bool(r.get("control_widened") or False)
    return out


def control_notes(grid: CellGrid) -> list[str]:
    """One line per G whose control cell's saving excludes 0: the G, the bias, and that its compact
    savings were widened for it (build's notes)."""
    out = []
    for g in grid.ladder:
        cells = [grid.native(g), *grid.compact(g)]
        c = next((c for c in cells if c.control_bias is not None), None)
        if c is None:
            continue
        bias, low, high = c.control_bias, c.control_bias_ci_low, c.control_bias_ci_high
        if bias is not None and low is not None and high is not None and (low > 0.0 or high < 0.0):
            out.append(
                f"control bias at G={g}: the native step captured again shows a saving of "
                f"{100 * bias:+.2f}% [{100 * low:+.2f}, {100 * high:+.2f}] (0 is the truth); the sweep "
                "widened this G's compact saving intervals by it"
            )
    return out


def _cell_from_row(r: Mapping[str, Any], native: Mapping[str, Any] | None) -> CellTime:
    """A cell from a sweep or cost-table row; rows without paired columns (schema 1) derive the
    saving from the two absolute intervals, the pre-pairing way, and are marked unpaired."""
    g, v = int(r["graph_batch_size"]), int(r["verifier_budget"])
    t, lo, hi = float(r["step_time_ms"]), float(r["ci_low_ms"]), float(r["ci_high_ms"])
    source = str(r.get("source_result_sha256") or "")
    if r.get("saving") is not None:
        return CellTime(
            g,
            v,
            t,
            lo,
            hi,
            source,
            float(r["saving"]),
            float(r["saving_ci_low"]),
            float(r["saving_ci_high"]),
            int(r["paired_rounds"]),
            float(r["common_mode_rel"]),
            float(r["level_rel"]),
            **_checks(r),
        )
    z = float(ndtri(0.975))
    if native is None or v == NATIVE_BUDGET:
        return CellTime(g, v, t, lo, hi, source, level_rel=math.log(hi / lo) / (2 * z))
    t0, lo0, hi0 = float(native["step_time_ms"]), float(native["ci_low_ms"]), float(native["ci_high_ms"])
    low, high = 1.0 - hi / lo0, 1.0 - lo / hi0
    point = min(max(1.0 - t / t0, low), high)
    return CellTime(g, v, t, lo, hi, source, point, low, high, 0, 0.0, math.log(hi / lo) / (2 * z))


@dataclass(frozen=True, eq=False)
class CellGrid:
    """Measured cells for draft length K: a native cell per G and candidate compact cells.

    Only deployable compact cells are kept (G < V < G*(K+1)): V = G cannot carry a real row and
    V = G*(K+1) is the full-width control. The forced-K arm of a G (V = −1), where measured, is
    kept apart (:meth:`forced_k`): it prices the confidence path's overhead and is never deployed.
    ``dropped`` lists what was left out.
    """

    k: int
    cells: tuple[CellTime, ...]
    dropped: tuple[tuple[int, int], ...] = ()
    forced: tuple[CellTime, ...] = ()
    _native: dict[int, CellTime] = field(init=False, repr=False)
    _compact: dict[int, tuple[CellTime, ...]] = field(init=False, repr=False)
    _forced: dict[int, CellTime] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        native: dict[int, CellTime] = {}
        compact: dict[int, list[CellTime]] = {}
        seen: set[tuple[int, int]] = set()
        for c in sorted(self.cells) + sorted(self.forced):
            key = (c.graph_batch_size, c.verifier_budget)
            if key in seen:
                raise ConfigError(
                    f"cell (G={key[0]}, V={key[1]}) is given twice; merge sweeps without overlap"
                )
            seen.add(key)
            if c.verifier_budget == NATIVE_BUDGET:
                native[c.graph_batch_size] = c
            elif c.verifier_budget != FORCED_K_BUDGET:
                compact.setdefault(c.graph_batch_size, []).append(c)
        missing = sorted(set(compact) - set(native))
        if missing or not native:
            raise ConfigError(
                f"graph batch sizes {missing or 'all'} have no native cell (V=0); re-run the sweep"
            )
        stray = sorted(c.graph_batch_size for c in self.forced if c.graph_batch_size not in native)
        if stray:
            raise ConfigError(f"forced-K arms for G={stray} have no native cell (V=0); re-run the sweep")
        object.__setattr__(self, "cells", tuple(sorted(self.cells)))
        object.__setattr__(self, "forced", tuple(sorted(self.forced)))
        object.__setattr__(self, "_native", native)
        object.__setattr__(self, "_compact", {g: tuple(v) for g, v in compact.items()})
        object.__setattr__(self, "_forced", {c.graph_batch_size: c for c in self.forced})

    @classmethod
    def from_rows(cls, k: int, rows: Iterable[Mapping[str, Any]]) -> CellGrid:
        """From ``sweep`` or ``cost-table`` rows of any schema version (undeployable budgets are
        dropped, not refused; forced-K rows go to :meth:`forced_k`)."""
        rows = list(rows)
        natives = {int(r["graph_batch_size"]): r for r in rows if int(r["verifier_budget"]) == NATIVE_BUDGET}
        kept, forced, dropped = [], [], []
        for r in rows:
            g, v = int(r["graph_batch_size"]), int(r["verifier_budget"])
            if v == FORCED_K_BUDGET:
                forced.append(_cell_from_row(r, natives.get(g)))
                continue
            if not is_deployable(g, v, k):
                dropped.append((g, v))
                continue
            kept.append(_cell_from_row(r, natives.get(g)))
        return cls(k=k, cells=tuple(kept), dropped=tuple(sorted(dropped)), forced=tuple(forced))

    @property
    def paired(self) -> bool:
        """True when every compact cell's saving is paired (the joint uncertainty model applies)."""
        return all(c.paired for g in self.ladder for c in self.compact(g))

    def forced_k(self, graph_batch_size: int) -> CellTime | None:
        """The forced-K arm of G, when the sweep measured it."""
        return self._forced.get(graph_batch_size)

    @property
    def ladder(self) -> tuple[int, ...]:
        """The graph batch sizes with a native cell."""
        return tuple(sorted(self._native))

    def native(self, graph_batch_size: int) -> CellTime:
        """The native cell of G."""
        return self._native[graph_batch_size]

    def compact(self, graph_batch_size: int) -> tuple[CellTime, ...]:
        """The compact cells of G, by V."""
        return self._compact.get(graph_batch_size, ())

    def compact_keys(self) -> tuple[tuple[int, int], ...]:
        """Every compact (G, V)."""
        return tuple((c.graph_batch_size, c.verifier_budget) for g in self.ladder for c in self.compact(g))

    def restrict(self, keep: Iterable[tuple[int, int]]) -> CellGrid:
        """Native cells plus the given compact cells (which must be in the grid)."""
        keep = set(keep)
        unknown = sorted(keep - set(self.compact_keys()))
        if unknown:
            raise ConfigError(
                f"cells {unknown} are not measured compact cells; no cell outside the sweep is used"
            )
        cells = [
            c
            for c in self.cells
            if c.verifier_budget == NATIVE_BUDGET or (c.graph_batch_size, c.verifier_budget) in keep
        ]
        return CellGrid(k=self.k, cells=tuple(cells), forced=self.forced)

    def cost_table(
        self,
        *,
        minimum_predicted_gain: float = DEFAULT_MINIMUM_PREDICTED_GAIN,
        drain_guard: DrainGuard | None = None,
    ) -> CostTable:
        """The runtime's view of these cells (medians).

        Raises:
            ConfigError: more compact cells than the engine accepts.
        """
        return CostTable.from_cells(
            self.k,
            {(c.graph_batch_size, c.verifier_budget): c.step_time_ms for c in self.cells},
            minimum_predicted_gain=minimum_predicted_gain,
            drain_guard=drain_guard,
        )
