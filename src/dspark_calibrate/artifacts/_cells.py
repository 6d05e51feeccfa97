"""The cost-table document: cell legality, one signed cell, the table of a deployment, its drain guard.

The one home of the cell rules (DESIGN §2, §6). :func:`cell_kind` is the only place the inequality
G ≤ V ≤ G·(K+1) and the two markers (:data:`NATIVE_BUDGET`, :data:`FORCED_K_BUDGET`) are
interpreted; :func:`is_deployable` adds the one rule of what a signed cost table may carry (V = G
is legal but can never carry a real row). The sweep's cell plan, ``build``'s cell grid, the content
rules of a verified table, the planners and the TensorRT-LLM exporter all ask these two functions.

:class:`CostCell` is one row of a ``cost-table`` (every column of the current schema, the older
schemas' missing columns as None); :class:`CostTable` is what the selector prices with and, when
built from cells, what ``build`` signs (:meth:`CostTable.to_arrow`) and what every reader of a
verified table gets back (:meth:`CostTable.from_arrow`). Both validate themselves on construction,
so no later stage re-checks the cells it is handed.

Pure: no file, clock or GPU access.

Example:
    >>> cell_kind(8, 0, 5), cell_kind(8, 8, 5), cell_kind(8, 48, 5), cell_kind(8, 7, 5)
    (<CellKind.NATIVE: 'native'>, <CellKind.COMPACT: 'compact'>, <CellKind.CONTROL: 'control'>, None)
    >>> is_deployable(8, 8, 5), is_deployable(8, 9, 5)
    (False, True)
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from dspark_calibrate.artifacts._models import field_names
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.schemas import (
    DRAIN_GUARD_SUMMARY_KEYS,
    MAX_COMPACT_CELLS_PER_G,
    MAX_COMPACT_CELLS_TOTAL,
    arrow_schema,
)

__all__ = [
    "DEFAULT_MINIMUM_PREDICTED_GAIN",
    "DRAIN_GUARD_FIELDS",
    "FORCED_K_BUDGET",
    "NATIVE_BUDGET",
    "CellKind",
    "CostCell",
    "CostTable",
    "DrainGuard",
    "cell_kind",
    "full_width",
    "is_deployable",
]

#: The verifier budget that names the native (static full-K) cell of a G (DESIGN §2).
NATIVE_BUDGET = 0
#: The verifier budget that names the forced-K arm of a G: "feature on, windows forced to K". It
#: verifies the full width like the native cell, with the engine's confidence path (snapshot,
#: selector, allocator, bookkeeping) run every step; it is measured, never deployed (DESIGN §9).
FORCED_K_BUDGET = -1
#: The consumer's typical minimum predicted gain of a compact cell over native (1%, DESIGN §6).
DEFAULT_MINIMUM_PREDICTED_GAIN = 0.01
#: The drain-guard fields the selector reads, in the consumer's spelling; the admission summary's
#: ``drain_guard`` object has exactly these keys (defined in ``schemas``).
DRAIN_GUARD_FIELDS: tuple[str, ...] = DRAIN_GUARD_SUMMARY_KEYS


class CellKind(enum.StrEnum):
    """What a legal cell is for (the values are stable: reports and logs print them)."""

    NATIVE = "native"  # V = 0: the static full-K step, fallback and comparator
    COMPACT = "compact"  # G ≤ V < G·(K+1): a dynamic-verification budget
    CONTROL = "control"  # V = G·(K+1): the compact path at full width, measured as a control
    FORCED_K = "forced_k"  # V = -1: confidence path on, every window forced to K (the overhead arm)


def full_width(graph_batch_size: int, k: int) -> int:
    """G·(K+1): the tokens a native step verifies (one anchor and K draft tokens per row)."""
    return graph_batch_size * (k + 1)


def cell_kind(graph_batch_size: int, verifier_budget: int, k: int) -> CellKind | None:
    """The kind of cell (G, V) for draft length K, or None when V is illegal for G.

    Legal: the two markers (0 native, −1 forced-K), and G ≤ V ≤ G·(K+1) (one anchor per row up to
    the full width); V = G·(K+1) is the full-width control, the rest compact (DESIGN §2).
    """
    g, v = graph_batch_size, verifier_budget
    if v == NATIVE_BUDGET:
        return CellKind.NATIVE
    if v == FORCED_K_BUDGET:
        return CellKind.FORCED_K
    if v == full_width(g, k):
        return CellKind.CONTROL
    if g <= v < full_width(g, k):
        return CellKind.COMPACT
    return None


def is_deployable(graph_batch_size: int, verifier_budget: int, k: int) -> bool:
    """True for the cells a signed cost table may carry: native cells and compact cells with V > G.

    V = G is legal but every row is then an anchor, so it can never carry a real row (DESIGN §6);
    the control and the forced-K arm are measured, never deployed.
    """
    kind = cell_kind(graph_batch_size, verifier_budget, k)
    return kind is CellKind.NATIVE or (kind is CellKind.COMPACT and verifier_budget > graph_batch_size)


def _exact_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    out = int(value)
    if out < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {out}")
    return out


def _finite(value: object, name: str, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating | np.integer):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out) or (out <= 0.0 if positive else out < 0.0):
        raise ConfigError(f"{name} must be finite and {'> 0' if positive else '>= 0'}, got {value!r}")
    return out


# ---------------------------------------------------------------------------------------------
# Drain guard
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DrainGuard:
    """Workload-matched inputs of the iteration drain guard (TensorRT-LLM ``iteration_drain_guard``).

    A compact cell must satisfy, strictly::

        T(G,0) - T(G,V) - loss_multiplier * max_rank((Y_native - Y_V) / n_real)
            * T(tail_G, 0) / mean_output_tokens_per_request_iteration  >  minimum_group_value_ms

    Attributes:
        loss_multiplier: scales the expected yield loss (> 0).
        mean_output_tokens_per_request_iteration: tokens a request emits per iteration (> 0).
        minimum_group_value_ms: the group value a compact choice must exceed (>= 0, ms).
        tail_graph_batch_size: the G whose native step prices a drain iteration.
    """

    loss_multiplier: float
    mean_output_tokens_per_request_iteration: float
    minimum_group_value_ms: float
    tail_graph_batch_size: int

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "loss_multiplier",
            _finite(self.loss_multiplier, "drain_guard.loss_multiplier", positive=True),
        )
        object.__setattr__(
            self,
            "mean_output_tokens_per_request_iteration",
            _finite(
                self.mean_output_tokens_per_request_iteration,
                "drain_guard.mean_output_tokens_per_request_iteration",
                positive=True,
            ),
        )
        object.__setattr__(
            self,
            "minimum_group_value_ms",
            _finite(self.minimum_group_value_ms, "drain_guard.minimum_group_value_ms", positive=False),
        )
        object.__setattr__(
            self,
            "tail_graph_batch_size",
            _exact_int(self.tail_graph_batch_size, "drain_guard.tail_graph_batch_size", 1),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the four fields, in the consumer's spelling)."""
        return {name: getattr(self, name) for name in DRAIN_GUARD_FIELDS}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DrainGuard:
        """Build from the four-field dict, refusing unknown or missing fields.

        Raises:
            ConfigError: a field is missing, unknown or out of range.
        """
        want = set(DRAIN_GUARD_FIELDS)
        if not isinstance(data, Mapping) or set(data) != want:
            have = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ConfigError(f"drain_guard must have exactly the fields {sorted(want)}, got {have}")
        return cls(**{k: data[k] for k in DRAIN_GUARD_FIELDS})


# ---------------------------------------------------------------------------------------------
# One signed cell
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CostCell:
    """One measured cell as a ``cost-table`` row states it; :attr:`key` (G, V) is the row order.

    Only G, V and the median are needed to price a step; the rest is what ``build`` signs (the
    interval, the paired saving and the sweep's bias checks, ``schemas`` ``cost-table``). A field
    the table's schema version lacks is None. Whether V is legal needs K, so :class:`CostTable`
    checks it (:func:`cell_kind`); a cell alone checks types, finiteness and order.

    Attributes:
        graph_batch_size: G (>= 1).
        verifier_budget: V; :data:`NATIVE_BUDGET` names the native cell.
        step_time_ms: the median whole-step time (finite, > 0).
        ci_low_ms, ci_high_ms, p10_ms, p90_ms, samples, stop_reason, source_result_sha256: the
            measurement (schema 1).
        saving, saving_ci_low, saving_ci_high, paired_rounds, common_mode_rel, level_rel: the
            paired saving (schema 2).
        control_bias ... carryover_rel: the sweep's bias checks (schema 3, each nullable).
    """

    graph_batch_size: int
    verifier_budget: int
    step_time_ms: float
    ci_low_ms: float | None = field(default=None)
    ci_high_ms: float | None = field(default=None)
    p10_ms: float | None = field(default=None)
    p90_ms: float | None = field(default=None)
    samples: int | None = field(default=None)
    stop_reason: str | None = field(default=None)
    source_result_sha256: str | None = field(default=None)
    saving: float | None = field(default=None)
    saving_ci_low: float | None = field(default=None)
    saving_ci_high: float | None = field(default=None)
    paired_rounds: int | None = field(default=None)
    common_mode_rel: float | None = field(default=None)
    level_rel: float | None = field(default=None)
    control_bias: float | None = field(default=None)
    control_bias_ci_low: float | None = field(default=None)
    control_bias_ci_high: float | None = field(default=None)
    control_widened: bool | None = field(default=None)
    paired_rel: float | None = field(default=None)
    paired_rel_upper: float | None = field(default=None)
    clock_rel: float | None = field(default=None)
    power_rel: float | None = field(default=None)
    carryover_rel: float | None = field(default=None)

    def __post_init__(self) -> None:
        g = _exact_int(self.graph_batch_size, "graph batch size", 1)
        v = _exact_int(self.verifier_budget, f"verifier budget of G={g}", FORCED_K_BUDGET)
        where = f"(G={g}, V={v})"
        object.__setattr__(self, "graph_batch_size", g)
        object.__setattr__(self, "verifier_budget", v)
        object.__setattr__(
            self, "step_time_ms", _finite(self.step_time_ms, f"step time of {where}", positive=True)
        )
        lo, hi = self.ci_low_ms, self.ci_high_ms
        if lo is not None and hi is not None and not lo <= self.step_time_ms <= hi:
            raise ConfigError(f"cell {where}: need ci_low_ms <= step_time_ms <= ci_high_ms, got {lo}, {hi}")

    @property
    def key(self) -> tuple[int, int]:
        """(G, V), the cell's identity within one table."""
        return (self.graph_batch_size, self.verifier_budget)

    def to_dict(self) -> dict[str, Any]:
        """Every column as a JSON-ready dict (None where the cell does not state it)."""
        return {name: getattr(self, name) for name in field_names(type(self))}

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> CostCell:
        """One row of a ``cost-table`` of any schema version (absent columns become None).

        Raises:
            ConfigError: an unknown column, or a value :class:`CostCell` refuses.
        """
        names = field_names(cls)
        unknown = sorted(set(row).difference(names))
        if unknown:
            raise ConfigError(f"cost-table row has unknown columns {unknown}")
        return cls(**{n: row[n] for n in names if n in row})


def _key(cell: CostCell) -> tuple[int, int]:
    return cell.key


# ---------------------------------------------------------------------------------------------
# The cost table
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CostTable:
    """Exact measured whole-step times per (G, V); V = 0 is the native cell of each G.

    Mirrors TensorRT-LLM's exact SPS table: no interpolation on either axis, a native cell for
    every G, positive budgets within G <= V <= G*(K+1) (:func:`cell_kind`), at most 4 compact cells
    (V < G*(K+1)) per G and 32 in all. Build one with :meth:`from_cells` (times only, for the
    selector) or :meth:`from_cost_cells` / :meth:`from_arrow` (the signed rows, which
    :meth:`to_arrow` writes back).

    Attributes:
        max_draft_len: the physical draft length K.
        graph_batch_sizes: the rank-local graph ladder, increasing.
        budgets: per G, the measured V, increasing, first 0.
        step_time_ms: per G, the times matching ``budgets``.
        minimum_predicted_gain: a compact cell must beat native's score by this fraction.
        drain_guard: the iteration drain guard; without it no compact cell is ever chosen.
        rows: the signed cells behind the times, in (G, V) order (empty: times only).
    """

    max_draft_len: int
    graph_batch_sizes: tuple[int, ...]
    budgets: tuple[tuple[int, ...], ...]
    step_time_ms: tuple[tuple[float, ...], ...]
    minimum_predicted_gain: float = DEFAULT_MINIMUM_PREDICTED_GAIN
    drain_guard: DrainGuard | None = None
    rows: tuple[CostCell, ...] = field(default=(), repr=False, compare=False)
    _times: dict[tuple[int, int], float] = field(init=False, repr=False, compare=False, hash=False)
    _compact: dict[int, tuple[int, ...]] = field(init=False, repr=False, compare=False, hash=False)
    # Serving-path data that depends on the table alone, computed once here so that a step does
    # no per-call table work: per G, (compact budgets, their times, native time); the drain
    # tail's native time; and a bounded memo of per-step-shape derived data (see _step_cells).
    _per_g: dict[int, tuple[tuple[int, ...], tuple[float, ...], float]] = field(
        init=False, repr=False, compare=False, hash=False
    )
    _tail_ms: float | None = field(init=False, repr=False, compare=False, hash=False)
    _memo: dict[tuple[Any, ...], Any] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        k = _exact_int(self.max_draft_len, "max_draft_len", 1)
        if not self.graph_batch_sizes:
            raise ConfigError("cost table has no graph batch size")
        gs = tuple(_exact_int(g, "graph batch size", 1) for g in self.graph_batch_sizes)
        if list(gs) != sorted(set(gs)):
            raise ConfigError(f"graph batch sizes must be strictly increasing, got {list(gs)}")
        if len(self.budgets) != len(gs) or len(self.step_time_ms) != len(gs):
            raise ConfigError("cost table: budgets and step_time_ms need one entry per graph batch size")
        times: dict[tuple[int, int], float] = {}
        compact: dict[int, tuple[int, ...]] = {}
        total = 0
        for g, vs, ts in zip(gs, self.budgets, self.step_time_ms, strict=True):
            vs = tuple(_exact_int(v, f"verifier budget of G={g}", 0) for v in vs)
            if len(vs) != len(ts) or not vs:
                raise ConfigError(f"cost table G={g}: {len(vs)} budgets but {len(ts)} times")
            if vs[0] != NATIVE_BUDGET:
                raise ConfigError(
                    f"cost table G={g} has no native cell (V=0); every G needs its static fallback"
                )
            if any(b <= a for a, b in itertools.pairwise(vs)):
                raise ConfigError(f"cost table G={g}: budgets {list(vs)} must be strictly increasing")
            bad = [v for v in vs[1:] if cell_kind(g, v, k) is None]
            if bad:
                raise ConfigError(
                    f"cost table G={g}: budgets {bad} outside G <= V <= G*(K+1)={full_width(g, k)}"
                )
            production = tuple(v for v in vs[1:] if cell_kind(g, v, k) is CellKind.COMPACT)
            if len(production) > MAX_COMPACT_CELLS_PER_G:
                raise ConfigError(
                    f"cost table G={g} has {len(production)} compact cells; the engine limit is "
                    f"{MAX_COMPACT_CELLS_PER_G} per G"
                )
            total += len(production)
            compact[g] = production
            for v, t in zip(vs, ts, strict=True):
                times[(g, v)] = _finite(t, f"step time of (G={g}, V={v})", positive=True)
        if total > MAX_COMPACT_CELLS_TOTAL:
            raise ConfigError(
                f"cost table has {total} compact cells; the engine limit is {MAX_COMPACT_CELLS_TOTAL}"
            )
        gain = _finite(self.minimum_predicted_gain, "minimum_predicted_gain", positive=False)
        if self.drain_guard is not None and self.drain_guard.tail_graph_batch_size not in gs:
            raise ConfigError(
                f"drain guard tail_graph_batch_size {self.drain_guard.tail_graph_batch_size} has no measured "
                f"native cell; the ladder is {list(gs)}"
            )
        rows = tuple(sorted(self.rows, key=_key))
        if rows and {r.key: r.step_time_ms for r in rows} != times:
            raise ConfigError("cost table: its rows do not state exactly its cells and times")
        object.__setattr__(self, "max_draft_len", k)
        object.__setattr__(self, "graph_batch_sizes", gs)
        object.__setattr__(self, "budgets", tuple(tuple(int(v) for v in vs) for vs in self.budgets))
        object.__setattr__(
            self, "step_time_ms", tuple(tuple(float(t) for t in ts) for ts in self.step_time_ms)
        )
        object.__setattr__(self, "minimum_predicted_gain", gain)
        object.__setattr__(self, "rows", rows)
        object.__setattr__(self, "_times", times)
        object.__setattr__(self, "_compact", compact)
        object.__setattr__(
            self,
            "_per_g",
            {
                g: (compact[g], tuple(times[(g, v)] for v in compact[g]), times[(g, NATIVE_BUDGET)])
                for g in gs
            },
        )
        guard = self.drain_guard
        object.__setattr__(
            self, "_tail_ms", None if guard is None else times[(guard.tail_graph_batch_size, NATIVE_BUDGET)]
        )
        object.__setattr__(self, "_memo", {})

    @classmethod
    def from_cells(
        cls,
        max_draft_len: int,
        cells: Mapping[tuple[int, int], float],
        *,
        minimum_predicted_gain: float = DEFAULT_MINIMUM_PREDICTED_GAIN,
        drain_guard: DrainGuard | None = None,
    ) -> CostTable:
        """Build a table from ``{(G, V): step_time_ms}``.

        Raises:
            ConfigError: any rule of the class docstring is broken.
        """
        return cls._build(max_draft_len, cells, (), minimum_predicted_gain, drain_guard)

    @classmethod
    def from_cost_cells(
        cls,
        max_draft_len: int,
        cells: Iterable[CostCell],
        *,
        minimum_predicted_gain: float = DEFAULT_MINIMUM_PREDICTED_GAIN,
        drain_guard: DrainGuard | None = None,
    ) -> CostTable:
        """Build a table that keeps its signed rows (for :meth:`to_arrow` and the exporters).

        Raises:
            ConfigError: a cell is given twice, or any rule of the class docstring is broken.
        """
        rows = tuple(sorted(cells, key=_key))
        times = {r.key: r.step_time_ms for r in rows}
        if len(times) != len(rows):
            twice = sorted({r.key for r in rows if sum(s.key == r.key for s in rows) > 1})
            raise ConfigError(f"cost table lists cells {twice} more than once")
        return cls._build(max_draft_len, times, rows, minimum_predicted_gain, drain_guard)

    @classmethod
    def _build(
        cls,
        k: int,
        cells: Mapping[tuple[int, int], float],
        rows: tuple[CostCell, ...],
        gain: float,
        guard: DrainGuard | None,
    ) -> CostTable:
        per_g: dict[int, list[tuple[int, float]]] = {}
        for (g, v), t in cells.items():
            per_g.setdefault(int(g), []).append((int(v), float(t)))
        gs = tuple(sorted(per_g))
        by_g = [sorted(per_g[g]) for g in gs]
        return cls(
            max_draft_len=k,
            graph_batch_sizes=gs,
            budgets=tuple(tuple(v for v, _ in r) for r in by_g),
            step_time_ms=tuple(tuple(t for _, t in r) for r in by_g),
            minimum_predicted_gain=gain,
            drain_guard=guard,
            rows=rows,
        )

    @classmethod
    def from_arrow(
        cls,
        table: pa.Table,
        max_draft_len: int,
        *,
        minimum_predicted_gain: float = DEFAULT_MINIMUM_PREDICTED_GAIN,
        drain_guard: DrainGuard | None = None,
    ) -> CostTable:
        """The table of a verified ``cost-table`` artifact (any schema version), rows kept.

        Raises:
            ConfigError: the rows do not form a valid table.
        """
        return cls.from_cost_cells(
            max_draft_len,
            (CostCell.from_dict(r) for r in table.to_pylist()),
            minimum_predicted_gain=minimum_predicted_gain,
            drain_guard=drain_guard,
        )

    def to_arrow(self) -> pa.Table:
        """The signed ``cost-table`` (current schema) of the rows this table was built from.

        Raises:
            ConfigError: the table holds times only, a cell is not deployable, or a row lacks a
                column the current schema requires.
        """
        if not self.rows:
            raise ConfigError("cost table was built from times only; build it from CostCells to sign it")
        schema = arrow_schema("cost-table")
        k = self.max_draft_len
        for r in self.rows:
            if not is_deployable(r.graph_batch_size, r.verifier_budget, k):
                raise ConfigError(
                    f"cell (G={r.graph_batch_size}, V={r.verifier_budget}) is not deployable; need V=0 or "
                    f"G < V < G*(K+1)={full_width(r.graph_batch_size, k)}"
                )
            missing = sorted(f.name for f in schema if not f.nullable and getattr(r, f.name) is None)
            if missing:
                raise ConfigError(f"cell (G={r.graph_batch_size}, V={r.verifier_budget}) lacks {missing}")
        try:
            return pa.Table.from_pylist([r.to_dict() for r in self.rows], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise ConfigError(f"cost table rows do not fit the cost-table schema: {exc}") from exc

    @property
    def tail_native_ms(self) -> float | None:
        """The drain guard's tail G's native time (None without a guard)."""
        return self._tail_ms

    @property
    def serving_memo(self) -> dict[tuple[Any, ...], Any]:
        """The serving path's memo of per-step-shape derived data (the planner bounds and fills it)."""
        return self._memo

    def serving_cells(self, graph_batch_size: int) -> tuple[tuple[int, ...], tuple[float, ...], float]:
        """(compact budgets, their times, native time) of one G, precomputed for the serving path.

        Raises:
            KeyError: ``graph_batch_size`` is not on the ladder.
        """
        return self._per_g[graph_batch_size]

    def cells(self) -> dict[tuple[int, int], float]:
        """Every measured cell, native included, as ``{(G, V): ms}``."""
        return dict(self._times)

    def time(self, graph_batch_size: int, verifier_budget: int) -> float:
        """The measured T(G, V).

        Raises:
            ConfigError: the cell was not measured (no interpolation, ever).
        """
        try:
            return self._times[(int(graph_batch_size), int(verifier_budget))]
        except KeyError:
            raise ConfigError(
                f"no measurement for (G={graph_batch_size}, V={verifier_budget}); only exact cells are used"
            ) from None

    def compact_budgets(self, graph_batch_size: int) -> tuple[int, ...]:
        """The production compact V of G (native and full-width controls excluded)."""
        return self._compact.get(int(graph_batch_size), ())

    def graph_batch_size_for(self, rows: int) -> int | None:
        """The smallest captured G holding ``rows`` real rows (None when above the ladder)."""
        i = bisect.bisect_left(self.graph_batch_sizes, rows)
        return self.graph_batch_sizes[i] if i < len(self.graph_batch_sizes) else None

    def replace_policy(
        self, *, minimum_predicted_gain: float | None = None, drain_guard: DrainGuard | None = None
    ) -> CostTable:
        """The same cells under another gain threshold and/or drain guard."""
        return CostTable(
            max_draft_len=self.max_draft_len,
            graph_batch_sizes=self.graph_batch_sizes,
            budgets=self.budgets,
            step_time_ms=self.step_time_ms,
            minimum_predicted_gain=(
                self.minimum_predicted_gain if minimum_predicted_gain is None else minimum_predicted_gain
            ),
            drain_guard=self.drain_guard if drain_guard is None else drain_guard,
            rows=self.rows,
        )
