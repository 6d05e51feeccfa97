"""The reference selector and allocator as fixed-shape torch ops, for the serving device (DESIGN §6).

:class:`DevicePlanner` decides what :func:`planner.plan` decides, from the same inputs (the exact
cost table, the calibration, one step's rows per rank), without leaving the device:

1. survivals ``S_j = prod_{i<=j} p_i`` from the calibration map of every position (STS, Platt,
   beta, isotonic, identity: every map the reference supports);
2. per rank, the native yield ``n + sum S`` and, for every measured compact V of the step's G, the
   compact yield ``n + floor survivals + the top-extra remaining survivals`` (one stable sort of
   the candidates, one prefix sum), the worst per-request yield loss and the cell's feasibility
   (a geometry table per G, built once on the host);
3. the margin test against native and the iteration drain guard, the winner by (group value,
   score, V), native on ties;
4. the allocation of a cell: the candidates ranked by survival with the value-independent
   tie-break (position, then request, i.e. the index order of the position-major layout), each
   request granted a prefix, every rank's tokens exactly V. The rank of a candidate is counted
   (larger candidates, and equal ones of a lower index, before it), so the allocation needs no
   sort; the stable sort, which keeps that same order, serves the selection's prefix sums.

**Fixed addresses, no host synchronisation.** A :class:`DeviceStep` holds one graph batch size's
input and output buffers; :meth:`DeviceStep.run` reads and writes only those buffers, with static
shapes and no ``.item()``, boolean indexing or other data-dependent shape, so on CUDA it is
captured in CUDA graphs per G (the whole step; the part a lagged serving step needs before the
engine's step, survivals and allocation; the selection) and replayed every step, or captured into
an engine's own cell graphs (:mod:`~dspark_calibrate.runtime_plugin.fused_planner`). The rows in use
are a device input (``counts``), so one set of graphs serves every occupancy of its G.

**The graph key.** The engine must know the cell (G, V) on the host before it replays that
cell's graph. :class:`ServingPlanner` takes it from the newest device decision, the one made
beside the last step that had a graph (a step without rows or above the ladder runs no graph and
makes no decision, so the one before stays in force): that decision comes back through a double-buffered pinned host snapshot (non-blocking copies on a side
stream and an event that is queried, never waited on), is re-validated on the host for this
step's G and rows (:func:`lagged_cell`), and the device allocates the committed cell over this
step's survivals before the engine's step and selects for the next step beside it, on the side
stream. ``mode="sync"`` instead waits for this step's own decision (exact, one host
synchronisation per step). The lag's cost is counted live (``lag_disagreements``: steps whose
committed cell differs from the same-step decision, and the relative score the lag gave up).

**Bad input.** A NaN or infinite confidence logit in a real row makes the step's decision native
(reason ``non_finite``), counted, never raised. Under the lag the step that verifies such rows has
already committed its cell: the allocation then ranks the bad candidates (the bad logit's position
and every later one of its row, under every calibration map) last, in (position, request) order
(its windows still fill V exactly), and the next step runs native; ``mode="sync"`` runs that very
step native.

**Agreement with the reference.** In float64 every sum is the reference's sequential sum in the
same order (``cumsum`` in position-major order, ranks in order) and every comparison the same
IEEE operation, so given the same survivals every decision, yield and score is bit-identical
(tested). The calibration maps use the device's own ``sigmoid``/``log`` (within an ulp or two of
numpy's); on the CPU, rows with equal logits up to a position share one survival there (the first
such row's), so torch's CPU kernels, which round a vector's tail an ulp differently, cannot break a
tie between identical requests against the (position, request) order (a CUDA elementwise kernel
computes every element alike, and the comparison would cost the critical path 20 us at G=256);
in float32 survivals carry about 1e-7 relative error and sums of hundreds of them about 1e-5. A
decision can then differ only where the reference itself was within that distance of a threshold
or a tie: a score against native or the margin, a group value against its minimum or another
cell's, or two candidate survivals at an allocation's cut (tested by classifying every
disagreement).

Imports torch; ``runtime_plugin`` loads this module only on request
(:func:`dspark_calibrate.runtime_plugin.engine.choose_planner`). Performs no file or network I/O.

Example:
    >>> import numpy as np
    >>> from dspark_calibrate.runtime_plugin.planner import Calibration, CostTable, DrainGuard, StepRows
    >>> table = CostTable.from_cells(
    ...     2, {(2, 0): 10.0, (2, 4): 6.0}, drain_guard=DrainGuard(1.0, 2.0, 0.0, 2))
    >>> p = DevicePlanner(table, Calibration.identity(2)).plan(
    ...     StepRows.single_rank(np.array([[4.0, -4.0], [4.0, -4.0]])))
    >>> (p.graph_batch_size, p.verifier_budget, p.windows.tolist())
    (2, 4, [1, 1])
"""

from __future__ import annotations

import math
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.planner import (
    DEFAULT_MIN_VERIFY_LEN,
    NATIVE_BUDGET,
    REASON_CODES,
    Calibration,
    CellEvaluation,
    CostTable,
    Plan,
    PositionMap,
    Selection,
    SelectReason,
    StepRows,
    _layouts,
    cell_geometry,
)

__all__ = [
    "DECISION_FIELDS",
    "PER_CELL_FIELDS",
    "SERVING_MODES",
    "DeviceDecision",
    "DevicePlanner",
    "DeviceStep",
    "ServingPlanner",
    "compiled_parts",
    "lag_score_loss",
    "lagged_cell",
    "run_counters",
    "zero_counters",
]

#: Leading entries of a step's decision vector (then ``PER_CELL_FIELDS`` per compact cell).
DECISION_FIELDS: tuple[str, ...] = ("column", "reason", "non_finite", "native_yield", "native_score")
#: Per compact cell of the step's G, in V order.
PER_CELL_FIELDS: tuple[str, ...] = (
    "feasible",
    "expected_yield",
    "score",
    "max_yield_loss_per_request",
    "passes_margin",
    "group_value_ms",
    "passes_drain_guard",
)
#: Where a NaN survival ranks in an allocation: below every real survival (>= 0), above the
#: padding of absent rows (-1), so the windows still fill the cell exactly.
_NAN_RANK = -0.5
_PAD = -1.0
_REASON = {r: float(i) for i, r in enumerate(REASON_CODES)}
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _dtype(value: str | torch.dtype) -> torch.dtype:
    if isinstance(value, torch.dtype):
        if value not in _DTYPES.values():
            raise ConfigError(f"device planner dtype must be float32 or float64, got {value}")
        return value
    if value not in _DTYPES:
        raise ConfigError(f"device planner dtype must be float32 or float64, got {value!r}")
    return _DTYPES[value]


@dataclass(frozen=True, slots=True)
class DeviceDecision:
    """A step's decision as read back from a device decision vector (host values).

    Attributes:
        graph_batch_size: the step's G (0: no graph).
        column: index of the chosen compact cell of G, -1 for native.
        verifier_budget: the chosen V (0 = native).
        reason: why.
        non_finite: a real row had a NaN or infinite logit.
        native_yield: expected tokens of the native step.
        native_score: native yield / T(G, 0).
        cells: the evaluation of every compact cell of G, in V order.
    """

    graph_batch_size: int
    column: int
    verifier_budget: int
    reason: SelectReason
    non_finite: bool
    native_yield: float
    native_score: float
    cells: tuple[CellEvaluation, ...]

    def selection(self) -> Selection:
        """The reference's :class:`Selection` of this decision."""
        return Selection(
            self.graph_batch_size,
            self.verifier_budget,
            self.reason,
            self.native_yield,
            self.native_score,
            self.cells,
        )


def _indexed(device: torch.device) -> torch.device:
    """``device`` with its index: an unindexed CUDA device means the current one.

    Tensors always carry an index (``cuda:0``); a planner built for ``"cuda"`` compares its
    device with the engine's buffers, so it must name the same index.
    """
    if str(device) == "cuda":  # no index (torch types `index` as int, but it is None here)
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _checked_inputs(
    inputs: tuple[torch.Tensor, torch.Tensor], shape: tuple[int, int, int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """A caller's (logits, ints) device tensors for a step to read in place, checked."""
    logits, ints = inputs
    r_count = shape[0]
    if tuple(logits.shape) != shape or not logits.is_floating_point():
        raise ConfigError(
            f"step logits must be a floating tensor of shape {shape}, got {tuple(logits.shape)} {logits.dtype}"
        )
    if tuple(ints.shape) != (r_count + 2,) or ints.dtype != torch.int64:
        raise ConfigError(
            f"step ints must be int64 of shape ({r_count + 2},), got {tuple(ints.shape)} {ints.dtype}"
        )
    for name, t in (("logits", logits), ("ints", ints)):
        if t.device != device:
            raise ConfigError(f"step {name} are on {t.device}, the planner on {device}")
    return logits, ints


class DeviceStep:
    """One graph batch size's selector and allocator on fixed-address buffers.

    Inputs (write them, then :meth:`run`): ``logits`` (R, W, K) raw confidence logits, each rank's
    rows in canonical (tie-break) order in slots ``0..counts[r]-1`` (other slots are ignored);
    ``ints`` (R + 2,) int64: ``counts`` per rank, then the column to allocate when not using the
    device's own choice (-1 = native), then ``use_selected`` (non-zero: allocate the column this
    step selects). Outputs: ``decision`` (``DECISION_FIELDS`` then ``PER_CELL_FIELDS`` per cell)
    and ``windows`` (R, W) int64, plus every tensor registered with :meth:`add_target`.

    Built by :meth:`DevicePlanner.step`; not thread-safe (one step's buffers).
    """

    def __init__(
        self,
        planner: DevicePlanner,
        width: int,
        g_index: int | None,
        input_dtype: torch.dtype,
        inputs: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        self.planner = planner
        self.width = width
        self.g_index = g_index
        k, r_count, dev = planner.max_draft_len, planner.num_ranks, planner.device
        table = planner.table
        if g_index is None:
            self.graph_batch_size = 0
            self.budgets: tuple[int, ...] = ()
            self.times: tuple[float, ...] = ()
            self.native_ms = math.nan
        else:
            g = table.graph_batch_sizes[g_index]
            if width != g:
                raise ConfigError(f"a step of G={g} needs width {g}, got {width}")
            self.graph_batch_size = g
            self.budgets = table.compact_budgets(g)
            self.times = tuple(table.time(g, v) for v in self.budgets)
            self.native_ms = table.time(g, NATIVE_BUDGET)
        c = len(self.budgets)
        cdt = planner.dtype
        if inputs is None:
            self.logits = torch.zeros(r_count, width, k, dtype=input_dtype, device=dev)
            self.ints = torch.zeros(r_count + 2, dtype=torch.int64, device=dev)
            self.ints[r_count] = -1
        else:
            self.logits, self.ints = _checked_inputs(inputs, (r_count, width, k), dev)
        self.decision = torch.zeros(len(DECISION_FIELDS) + len(PER_CELL_FIELDS) * c, dtype=cdt, device=dev)
        self.windows = torch.zeros(r_count, width, dtype=torch.int64, device=dev)
        self._targets: list[torch.Tensor] = []
        self._decision_targets: list[torch.Tensor] = []
        # The compiled critical part and selection (DevicePlanner(compile=True)), else None.
        self._critical_fn: Any = None
        self._select_fn: Any = None
        #: Why a compiled part could not run (it then runs eagerly), else None.
        self.compile_error: str | None = None
        self._graph: dict[str, Any] | None = None
        # Constants of the step (device tensors built once: a captured graph reads them in place).
        floor = planner.min_verify_len
        cols = k - floor
        self._rows = torch.arange(width, device=dev)
        # Equal inputs share one survival on the CPU only (see ``_rank``): torch's CPU kernels round
        # a vector's tail differently; a CUDA elementwise kernel runs the same instructions on
        # every element, and the W x W comparison would cost the critical path 20 us at G=256.
        self._share_equal = dev.type == "cpu"
        # [., i, i', .]: row i' is row i (every row equals itself, a NaN row included)
        self._self = torch.eye(width, dtype=torch.bool, device=dev)[None, :, :, None]
        places = torch.arange(cols * width, device=dev)
        self._before = places[None, :] < places[:, None]  # [i, j]: candidate j comes before i on a tie
        # Outputs of the ranking and the selection, read by the later parts (fixed addresses).
        self._valid = torch.zeros(r_count, width, dtype=torch.bool, device=dev)
        self._surv = torch.zeros(r_count, width, k, dtype=cdt, device=dev)
        self._cand = torch.zeros(r_count, cols * width, dtype=cdt, device=dev)
        self._ranked = torch.zeros(r_count, cols * width, dtype=cdt, device=dev)
        self._order = torch.zeros(r_count, cols * width, dtype=torch.int64, device=dev)
        self._selected = torch.full((), -1, dtype=torch.int64, device=dev)
        self._times = torch.tensor(self.times, dtype=cdt, device=dev)
        self._budgets = torch.tensor(self.budgets, dtype=torch.int64, device=dev)
        # extra[c, n]: allocatable tokens above the floor with n real rows (n = 0: an idle rank,
        # 0 when it can carry V); -1 when the rank cannot carry the cell.
        extra = np.full((c, width + 1), -1, dtype=np.int64)
        for ci, v in enumerate(self.budgets):
            for n in range(width + 1):
                geo = cell_geometry(n, self.graph_batch_size, v, min_verify_len=floor, max_draft_len=k)
                if geo is not None:
                    extra[ci, n] = geo.extra
        self._extra = torch.from_numpy(extra).to(dev)

    # -- buffers ---------------------------------------------------------------------------------
    @property
    def columns(self) -> int:
        """Compact cells of this step's G."""
        return len(self.budgets)

    def add_target(self, tensor: torch.Tensor) -> None:
        """Also write the windows into ``tensor`` (R*W int64 elements, e.g. an engine's buffer).

        Register targets before :meth:`capture`; a captured graph writes the registered ones.
        """
        if tensor.numel() != self.windows.numel() or tensor.dtype != torch.int64:
            raise ConfigError(
                f"window target needs {self.windows.numel()} int64 elements, got {tensor.numel()} {tensor.dtype}"
            )
        if tensor.device != self.windows.device:
            raise ConfigError(f"window target is on {tensor.device}, the planner on {self.windows.device}")
        self._targets.append(tensor)

    def add_decision_target(self, tensor: torch.Tensor) -> None:
        """Also write the decision vector into ``tensor`` (as many floating elements, any float
        dtype, e.g. a region of an engine's output buffer that one copy brings to the host).

        Register targets before :meth:`capture` or before capturing the step into a caller's graph.
        """
        n = self.decision.numel()
        if tensor.numel() != n or not tensor.is_floating_point():
            raise ConfigError(
                f"decision target needs {n} floating elements, got {tensor.numel()} {tensor.dtype}"
            )
        if tensor.device != self.decision.device:
            raise ConfigError(f"decision target is on {tensor.device}, the planner on {self.decision.device}")
        self._decision_targets.append(tensor)

    def enqueue_critical(self) -> None:
        """Queue the survivals and the allocation of the column in ``ints`` on the current stream:
        the ops themselves, never a replay, so a caller can capture them into its own graph
        (before the engine's step that reads the windows)."""
        if self._critical_fn is not None and self._compiled("_critical_fn"):
            return
        self._survive()
        self._allocate(requested=True)

    def enqueue_select(self) -> None:
        """Queue the selection over the survivals :meth:`enqueue_critical` computed (the ranking,
        the decision vector and its targets) on the current stream; for a caller's graph, beside
        its step."""
        if self._select_fn is not None and self._compiled("_select_fn"):
            return
        self._sort()
        self._select()

    def _compiled(self, name: str) -> bool:
        """Run a compiled part; False (and eager from now on) when its compiler fails here."""
        # torch.compile's failures are RuntimeErrors; a missing Triton or C++ toolchain can surface
        # as an ImportError. Nothing broader: the one fail-closed boundary is admit() (STYLE 13).
        try:
            getattr(self, name)()
            return True
        except (RuntimeError, ImportError) as exc:
            setattr(self, name, None)
            self.compile_error = f"{type(exc).__name__}: {exc}"[:500]
            return False

    def capture(self) -> None:
        """Capture the step in CUDA graphs (CUDA only; a no-op elsewhere).

        Three graphs: the whole step (:meth:`run`), the part a lagged serving step needs before
        the engine's step (:meth:`run_critical`: rank, allocate) and the selection it runs beside
        the engine's step on a side stream (:meth:`run_select`).
        """
        if self.windows.device.type != "cuda" or self._graph is not None:
            return
        dev = self.windows.device
        stream = torch.cuda.Stream(dev)  # type: ignore[no-untyped-call]  # torch leaves it untyped
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: allocator growth, lazy kernel initialisation, compilation
                self.enqueue_critical()
                self.enqueue_select()
                self._allocate()
        torch.cuda.current_stream(dev).wait_stream(stream)
        graphs: dict[str, Any] = {}
        for name, parts in (
            ("critical", (self.enqueue_critical,)),
            ("select", (self.enqueue_select,)),
            ("full", (self._survive, self._sort, self._select, self._allocate)),
        ):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for part in parts:
                    part()
            graphs[name] = graph
        self._graph = graphs

    def run(self) -> None:
        """Rank, select and allocate (a graph replay when captured). No host synchronisation."""
        if self._graph is not None:
            self._graph["full"].replay()
        else:
            self._survive()
            self._sort()
            self._select()
            self._allocate()

    def run_critical(self) -> None:
        """Survivals and the allocation of the column in ``ints`` (``use_selected`` is not read)."""
        if self._graph is not None:
            self._graph["critical"].replay()
        else:
            self.enqueue_critical()

    def run_select(self) -> None:
        """The selection over the survivals :meth:`run_critical` computed (the decision vector)."""
        if self._graph is not None:
            self._graph["select"].replay()
        else:
            self.enqueue_select()

    # -- the computation -------------------------------------------------------------------------
    def _survive(self) -> None:
        # Every output goes to a buffer allocated once, so the three graphs (and eager runs) share
        # fixed addresses: the selection graph reads what the critical graph wrote.
        pl = self.planner
        r_count = pl.num_ranks
        floor = pl.min_verify_len
        counts = self.ints[:r_count]
        x = self.logits.to(pl.dtype)
        valid = torch.lt(self._rows[None, :], counts[:, None], out=self._valid)  # (R, W) rows in use
        surv = torch.cumprod(pl.probabilities(x), dim=2)  # left to right, the engine's order
        # A non-finite logit makes its position and every later one a bad candidate (NaN, ranked
        # last below), whatever the map makes of it: an isotonic map sends NaN to a knot, STS
        # sends +inf to 1, either of which would rank the bad row first.
        bad = torch.cumsum(torch.isfinite(x).logical_not().to(torch.int32), dim=2) > 0
        surv = torch.where(bad, math.nan, surv)
        if self._share_equal:
            # Equal inputs, equal survivals: every row takes the survivals of the first row whose
            # logits equal its own up to each position. torch's CPU kernels round the same input
            # an ulp differently in a vector's tail, and an ulp would break a tie between
            # identical requests against the documented (position, request) order. Comparing
            # inputs, not outputs, keeps it.
            same = self.logits[:, :, None, :] == self.logits[:, None, :, :]  # [r, i, i', j]
            prefix = (torch.cumsum(same.logical_not().to(torch.int32), dim=3) == 0) | self._self
            first = prefix.to(torch.uint8).argmax(dim=2)  # (R, W, K): the first such row (i at most)
            surv = torch.gather(surv, 1, first, out=self._surv)
        else:
            surv = self._surv.copy_(surv)
        # Candidates above the floor, position-major (index = position * W + row: among equal
        # survivals that order is the tie-break); absent rows rank last, NaN survivals just above.
        cand = torch.where(valid[:, None, :], surv[:, :, floor:].permute(0, 2, 1), _PAD)
        self._cand.copy_(torch.nan_to_num_(cand.reshape(r_count, -1), nan=_NAN_RANK))

    def _sort(self) -> None:
        # The candidates in the allocation's order (the stable sort keeps the index order among
        # equal survivals): what the selection's prefix sums run over.
        torch.sort(self._cand, dim=1, descending=True, stable=True, out=(self._ranked, self._order))

    def _select(self) -> None:
        pl = self.planner
        r_count, width, k = pl.num_ranks, self.width, pl.max_draft_len
        floor = pl.min_verify_len
        cols = k - floor
        cdt = pl.dtype
        counts = self.ints[:r_count]
        # A row in use whose logits are not all finite (checked here, beside the engine's step in
        # lagged serving: the allocation already ranks NaN survivals last).
        non_finite = torch.gt(self._valid, torch.isfinite(self.logits).all(dim=2)).any()
        # Base per rank: n + the sequential sum of the floor survivals in position-major order
        # (absent rows add exact zeros, which change no rounding).
        live = torch.where(self._valid[:, :, None], self._surv[:, :, :floor], 0.0)
        terms = live[:, :, 0] if floor == 1 else live.permute(0, 2, 1).reshape(r_count, floor * width)
        base = counts.to(cdt) + torch.cumsum(terms, dim=1)[:, -1]
        ranked = self._ranked
        prefix = torch.cat([ranked.new_zeros(r_count, 1), torch.cumsum(ranked, dim=1)], dim=1)
        full = base + prefix.gather(1, (counts * cols)[:, None])[:, 0]
        native_yield = torch.cumsum(full, dim=0)[-1]  # ranks in order
        no_graph = self.g_index is None
        native_score = native_yield.new_zeros(()) if no_graph else native_yield / self.native_ms
        c = self.columns
        if c == 0:
            column = torch.full((), -1, dtype=torch.int64, device=base.device)
            why = SelectReason.NO_GRAPH if no_graph else SelectReason.NO_COMPACT_CELLS
            reason = torch.where(non_finite, _REASON[SelectReason.NON_FINITE], _REASON[why])
            parts = [column.to(cdt), reason.to(cdt), non_finite.to(cdt), native_yield, native_score]
            torch.stack(parts, out=self.decision)
            self._selected.copy_(column)
            self._write_decision_targets()
            return
        extra = self._extra[:, counts]  # (C, R)
        feasible = (extra >= 0).all(dim=1)
        per_rank = base[:, None] + prefix.gather(1, extra.clamp(min=0).t())  # (R, C)
        expected = torch.where(feasible, torch.cumsum(per_rank, dim=0)[-1], 0.0)
        active = (counts > 0)[:, None]
        loss_r = torch.where(
            active, (full[:, None] - per_rank) / counts.clamp(min=1).to(cdt)[:, None], -math.inf
        )
        loss = torch.where(feasible, loss_r.max(dim=0).values, 0.0)
        column, reason, score, passes, gv, ok = self._choose(
            native_yield, native_score, expected, loss, feasible
        )
        reason = torch.where(non_finite, _REASON[SelectReason.NON_FINITE], reason)
        column = torch.where(non_finite, -1, column)
        cells = torch.stack([feasible.to(cdt), expected, score, loss, passes.to(cdt), gv, ok.to(cdt)], dim=1)
        head = torch.stack([column.to(cdt), reason, non_finite.to(cdt), native_yield, native_score])
        torch.cat([head, cells.reshape(-1)], out=self.decision)
        self._selected.copy_(column)
        self._write_decision_targets()

    def _write_decision_targets(self) -> None:
        for t in self._decision_targets:
            t.copy_(self.decision.view(t.shape))

    def _allocate(self, *, requested: bool = False) -> None:
        """The windows of the column in ``ints`` (``requested``), else of ``use_selected``'s choice."""
        pl = self.planner
        r_count, width, k = pl.num_ranks, self.width, pl.max_draft_len
        floor = pl.min_verify_len
        c = self.columns
        if c == 0:
            self.windows.fill_(k)
        else:
            counts = self.ints[:r_count]
            # The requested column, or this step's own choice (the selection ran first).
            alloc = self.ints[r_count]
            if not requested:
                alloc = torch.where(self.ints[r_count + 1] != 0, self._selected, alloc)
            native = alloc < 0
            # (R,) tokens above the floor; a 1-element index tensor, never a 0-d one (that would be
            # read on the host).
            per = self._extra[alloc.clamp(min=0, max=c - 1).reshape(1, 1), counts.reshape(1, -1)][0]
            per = torch.where(native, 0, per.clamp(min=0))
            # A candidate's place in the stable descending order is the number of candidates
            # before it: larger ones, and equal ones of a lower index. The `per` first of each rank
            # are granted; no sort on this path, one fused comparison and count.
            cand = self._cand
            ahead = (cand[:, None, :] > cand[:, :, None]) | (
                (cand[:, None, :] == cand[:, :, None]) & self._before
            )
            grant = ahead.sum(dim=2) < per[:, None]  # (R, L)
            granted = grant.view(r_count, k - floor, width).sum(dim=1)
            torch.add(granted, floor, out=self.windows)
            self.windows.masked_fill_(native, k)
        for t in self._targets:
            t.copy_(self.windows.view(t.shape))

    def _choose(
        self,
        native_yield: torch.Tensor,
        native_score: torch.Tensor,
        expected: torch.Tensor,
        loss: torch.Tensor,
        feasible: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """The exact-SPS rule (planner.choose_cells, same operations in the same order)."""
        table = self.planner.table
        required = native_score * (1.0 + float(table.minimum_predicted_gain))
        score = torch.where(feasible, expected / self._times, -math.inf)
        passes = feasible & (score > native_score) & (score >= required)
        margin_any = passes.any()
        below = torch.where(
            feasible.any(), _REASON[SelectReason.BELOW_MARGIN], _REASON[SelectReason.NO_FEASIBLE_CELL]
        )
        guard, tail = table.drain_guard, self.planner.tail_native_ms
        none = torch.full((), -1, dtype=torch.int64, device=expected.device)
        if guard is None or tail is None:
            reason = torch.where(margin_any, _REASON[SelectReason.NO_DRAIN_GUARD], below)
            nan = torch.full_like(score, math.nan)
            return none, reason, score, passes, nan, torch.zeros_like(passes)
        loss_ms = guard.loss_multiplier * loss * float(tail) / guard.mean_output_tokens_per_request_iteration
        gv = (self.native_ms - self._times) - loss_ms
        ok = passes & (gv > guard.minimum_group_value_ms)
        ok_any = ok.any()
        # Winner: the largest (group value, score, V) among the cells that pass both tests.
        key1 = torch.where(ok, gv, -math.inf)
        tie1 = ok & (key1 == key1.max())
        key2 = torch.where(tie1, score, -math.inf)
        tie2 = tie1 & (key2 == key2.max())
        pick = torch.where(tie2, self._budgets, -1).argmax()
        column = torch.where(ok_any, pick, none)
        reason = torch.where(
            ok_any,
            _REASON[SelectReason.COMPACT],
            torch.where(margin_any, _REASON[SelectReason.DRAIN_GUARD], below),
        )
        return column, reason, score, passes, torch.where(passes, gv, math.nan), ok

    def read(self, values: np.ndarray | None = None) -> DeviceDecision:
        """Parse a decision vector (this step's ``decision``, or host values copied from it)."""
        d = self.decision.double().cpu().numpy() if values is None else np.asarray(values, dtype=np.float64)
        column = int(d[0])
        cells = []
        n_head, n_cell = len(DECISION_FIELDS), len(PER_CELL_FIELDS)
        for i, (v, t) in enumerate(zip(self.budgets, self.times, strict=True)):
            f = d[n_head + n_cell * i : n_head + n_cell * (i + 1)]
            gv = float(f[5])
            cells.append(
                CellEvaluation(
                    v,
                    t,
                    bool(f[0]),
                    float(f[1]),
                    float(f[2]),
                    float(f[3]),
                    bool(f[4]),
                    None if math.isnan(gv) else gv,
                    bool(f[6]),
                )
            )
        return DeviceDecision(
            graph_batch_size=self.graph_batch_size,
            column=column,
            verifier_budget=NATIVE_BUDGET if column < 0 else self.budgets[column],
            reason=REASON_CODES[int(d[1])],
            non_finite=bool(d[2]),
            native_yield=float(d[3]),
            native_score=float(d[4]),
            cells=tuple(cells),
        )


class DevicePlanner:
    """:func:`planner.plan`'s selector and allocator on a torch device.

    Args:
        table: the exact cost table (verified cells, gain threshold, drain guard).
        calibration: the confidence calibration (any map the reference supports).
        min_verify_len: the verify floor (1..K).
        device: where to compute (``cuda`` in serving; ``cpu`` runs the same code, for tests).
        dtype: ``float64`` (bit-identical sums and scores, the default) or ``float32``.
        num_ranks: ranks per step (their rows are laid out as an (R, W, K) grid).
        compile: on CUDA, compile each step's critical part and selection with ``torch.compile``
            (:func:`compiled_parts`: fused kernels, a few launches instead of dozens). The same
            operations; the generated kernels may round a survival or a sum an ulp differently,
            so a decision can differ from the reference only where float rounding decides it (a
            threshold or a tie, as in float32). Ignored on the CPU.

    Raises:
        ConfigError: K differs between table and calibration, or an argument is out of range.
    """

    def __init__(
        self,
        table: CostTable,
        calibration: Calibration,
        *,
        min_verify_len: int = DEFAULT_MIN_VERIFY_LEN,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = "float64",
        num_ranks: int = 1,
        compile: bool = False,
    ) -> None:
        k = table.max_draft_len
        if calibration.k != k:
            raise ConfigError(f"K mismatch: cost table K={k}, calibration K={calibration.k}")
        if isinstance(min_verify_len, bool) or not 1 <= int(min_verify_len) <= k:
            raise ConfigError(f"min_verify_len must be in [1, K={k}], got {min_verify_len}")
        if isinstance(num_ranks, bool) or int(num_ranks) < 1:
            raise ConfigError(f"num_ranks must be >= 1, got {num_ranks}")
        self.table = table
        self.calibration = calibration
        self.max_draft_len = k
        self.min_verify_len = int(min_verify_len)
        self.num_ranks = int(num_ranks)
        self.device = _indexed(torch.device(device))
        self.dtype = _dtype(dtype)
        guard = table.drain_guard
        self.tail_native_ms: float | None = (
            None if guard is None else table.time(guard.tail_graph_batch_size, NATIVE_BUDGET)
        )
        temps = calibration.sts_temperatures()
        self._t = None if temps is None else torch.tensor(temps, dtype=self.dtype, device=self.device)
        self._maps = [self._map_constants(m) for m in calibration.maps]
        self._steps: dict[tuple[int, int | None, torch.dtype], DeviceStep] = {}
        self.compile = bool(compile)

    def _map_constants(self, m: PositionMap) -> tuple[str, tuple[float, ...], tuple[torch.Tensor, ...]]:
        if m.method != "isotonic":
            return m.method, m.params, ()
        half = len(m.params) // 2
        xs = np.asarray(m.params[:half], dtype=np.float64)
        ys = np.asarray(m.params[half:], dtype=np.float64)
        slopes = np.diff(ys) / np.diff(xs) if half > 1 else np.zeros(1)
        as_t = [torch.tensor(a, dtype=self.dtype, device=self.device) for a in (xs, ys, slopes)]
        return m.method, m.params, tuple(as_t)

    # -- calibration -------------------------------------------------------------------------------
    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        """Acceptance probabilities of raw logits ``(..., K)``: the reference's maps, with the
        device's own sigmoid/exp/log (within an ulp or two of numpy's)."""
        if self._t is not None:
            return torch.sigmoid(x / self._t)
        return torch.stack([self._apply(j, x[..., j]) for j in range(self.max_draft_len)], dim=-1)

    def _apply(self, j: int, x: torch.Tensor) -> torch.Tensor:
        method, p, consts = self._maps[j]
        if method == "sts":
            return torch.sigmoid(x / p[0])
        if method == "platt":
            return torch.sigmoid(p[0] * x + p[1])
        if method == "beta":
            zero = torch.zeros((), dtype=x.dtype, device=x.device)
            log_s = -torch.logaddexp(zero, -x)  # log sigmoid(x)
            log_1s = -torch.logaddexp(zero, x)  # log sigmoid(-x) = log(1 - sigmoid(x))
            return torch.sigmoid(p[0] * log_s - p[1] * log_1s + p[2])
        if method == "isotonic":
            xs, ys, slopes = consts
            m = xs.shape[0]
            flat = x.contiguous()
            at = torch.searchsorted(xs, flat, right=True) - 1  # xs[at] <= x < xs[at + 1]
            if m == 1:
                out = torch.zeros_like(flat) + ys[0]
            else:
                i = at.clamp(0, m - 2)
                inner = slopes[i] * (flat - xs[i]) + ys[i]
                out = torch.where(at < 0, ys[0], torch.where(at >= m - 1, ys[m - 1], inner))
            # searchsorted places NaN above every knot; numpy's interp (the reference) gives NaN.
            return torch.where(torch.isnan(flat), flat, out)
        return torch.sigmoid(x)

    # -- steps -------------------------------------------------------------------------------------
    def step(self, graph_batch_size: int, *, input_dtype: torch.dtype = torch.float32) -> DeviceStep:
        """The fixed-address step of one captured G (built once per input dtype, then shared).

        Raises:
            ConfigError: G is not on the table's ladder.
        """
        g = int(graph_batch_size)
        if g not in self.table.graph_batch_sizes:
            raise ConfigError(f"G={g} is not on the ladder {list(self.table.graph_batch_sizes)}")
        return self._step(g, self.table.graph_batch_sizes.index(g), input_dtype)

    def bound_step(self, graph_batch_size: int, logits: torch.Tensor, ints: torch.Tensor) -> DeviceStep:
        """A step of one G that reads a caller's device tensors in place (not shared).

        ``logits`` (R, G, K) floating and ``ints`` (R + 2,) int64 on the planner's device are the
        step's inputs (:class:`DeviceStep`): typically views of an engine's input buffer, which
        one host copy per step fills, so the planner adds no copy of its own.

        Raises:
            ConfigError: G is not on the ladder, or a tensor's shape, dtype or device is wrong.
        """
        g = int(graph_batch_size)
        if g not in self.table.graph_batch_sizes:
            raise ConfigError(f"G={g} is not on the ladder {list(self.table.graph_batch_sizes)}")
        step = DeviceStep(self, g, self.table.graph_batch_sizes.index(g), logits.dtype, inputs=(logits, ints))
        self._compile(step)
        return step

    def _step(self, width: int, g_index: int | None, input_dtype: torch.dtype) -> DeviceStep:
        key = (width, g_index, input_dtype)
        hit = self._steps.get(key)
        if hit is None:
            hit = self._steps[key] = DeviceStep(self, width, g_index, input_dtype)
            self._compile(hit)
        return hit

    def _compile(self, step: DeviceStep) -> None:
        if self.compile and self.device.type == "cuda":
            step._critical_fn, step._select_fn = compiled_parts(step)

    # -- host-side convenience (synchronising; tests, replay and tools, not the serving path) ---------
    def _run(
        self, rows: StepRows, column: int, use_selected: bool, g: int | None = None
    ) -> tuple[DeviceStep | None, list[int], np.ndarray]:
        """Load the rows into the step of G (default: the step's own G), run it, read the windows.

        Returns the step (None without rows), the rows per rank and the windows in input order.
        """
        k = self.max_draft_len
        if rows.k != k:
            raise ConfigError(f"K mismatch: cost table K={k}, logits K={rows.k}")
        if rows.num_ranks != self.num_ranks:
            raise ConfigError(f"the rows span {rows.num_ranks} ranks, the planner {self.num_ranks}")
        order = rows.order
        rank = rows.rank[order]
        counts = np.bincount(rank, minlength=self.num_ranks)
        if len(rows) == 0:
            return None, counts.tolist(), np.zeros(0, dtype=np.int64)
        busiest = int(counts.max())
        g = self.table.graph_batch_size_for(busiest) if g is None else g
        gs = self.table.graph_batch_sizes
        step = (
            self._step(busiest, None, torch.float64)
            if g is None
            else self._step(g, gs.index(g), torch.float64)
        )
        local = np.arange(len(rows)) - np.concatenate([[0], np.cumsum(counts)[:-1]])[rank]
        grid = np.zeros((self.num_ranks, step.width, k))
        grid[rank, local] = rows.logits[order]
        step.logits.copy_(torch.from_numpy(grid))
        step.ints.copy_(torch.tensor([*counts.tolist(), column, int(use_selected)]))
        step.run()
        windows = np.empty(len(rows), dtype=np.int64)
        windows[order] = step.windows.cpu().numpy()[rank, local]
        return step, counts.tolist(), windows

    def select(self, rows: StepRows) -> Selection:
        """Choose one step's cell (``planner.select``'s answer)."""
        return self.plan(rows).selection

    def plan(self, rows: StepRows) -> Plan:
        """Select and allocate one step (``planner.plan``'s answer; synchronises with the device)."""
        step, counts, windows = self._run(rows, -1, True)
        if step is None:
            return Plan(Selection(0, NATIVE_BUDGET, SelectReason.NO_ROWS, 0.0, 0.0, ()), _frozen(windows), ())
        return self._plan(step.read(), counts, windows)

    def allocate(self, rows: StepRows, graph_batch_size: int, verifier_budget: int) -> Plan:
        """Allocate a given cell over the rows (``planner.allocate``'s answer).

        Raises:
            ConfigError: the cell is not measured, G does not hold the rows, or a rank cannot carry V.
        """
        g, v = int(graph_batch_size), int(verifier_budget)
        self.table.time(g, v)
        counts = [int(c) for c in np.bincount(rows.rank, minlength=self.num_ranks)]
        if max(counts) > g:
            raise ConfigError(f"G={g} cannot hold {max(counts)} rows on one rank")
        column = -1
        if v != NATIVE_BUDGET:
            budgets = self.table.compact_budgets(g)
            if v not in budgets:
                raise ConfigError(f"(G={g}, V={v}) is not a compact cell of the table")
            column = budgets.index(v)
            if not _carries(self.table, g, v, counts, self.min_verify_len):
                raise ConfigError(
                    f"(G={g}, V={v}) cannot carry rows {[c for c in counts if c]} with floor {self.min_verify_len}"
                )
        _, _, windows = self._run(rows, column, False, g)
        sel = Selection(g, v, SelectReason.COMPACT if v else SelectReason.BELOW_MARGIN, 0.0, 0.0, ())
        return Plan(sel, _frozen(windows), self._layouts(g, v, counts))

    def _plan(self, decision: DeviceDecision, counts: list[int], windows: np.ndarray) -> Plan:
        sel = decision.selection()
        if sel.graph_batch_size == 0:
            return Plan(sel, _frozen(np.full(windows.shape[0], self.max_draft_len, dtype=np.int64)), ())
        return Plan(sel, _frozen(windows), self._layouts(sel.graph_batch_size, sel.verifier_budget, counts))

    def _layouts(self, g: int, v: int, counts: list[int]) -> tuple[Any, ...]:
        active = tuple(r for r, c in enumerate(counts) if c)
        per = tuple(counts[r] for r in active)
        floor, k = self.min_verify_len, self.max_draft_len
        if v == NATIVE_BUDGET:
            return _layouts(self.table, active, per, self.num_ranks, g, v, 0, (), None)
        geometry = tuple(cell_geometry(c, g, v, min_verify_len=floor, max_draft_len=k) for c in per)
        idle = cell_geometry(0, g, v, min_verify_len=floor, max_draft_len=k)
        return _layouts(self.table, active, per, self.num_ranks, g, v, floor, geometry, idle)  # type: ignore[arg-type]  # feasible: every entry is a Geometry


#: Decision modes of :class:`ServingPlanner`.
SERVING_MODES: tuple[str, ...] = ("lagged", "sync")


@dataclass
class _Slot:
    """One buffer of the double-buffered snapshot: staging inputs, the decision copy, its event."""

    decision: torch.Tensor  # host copy of a step's decision vector (pinned on CUDA)
    windows: dict[int, torch.Tensor]  # per G: host copy of the step's windows (R, G)
    logits: dict[int, torch.Tensor]  # per G: staged inputs (pinned on CUDA)
    ints: torch.Tensor
    event: Any = None  # torch.cuda.Event recorded after the copies (None on CPU: copies are done)
    meta: tuple[int, int, tuple[int, int], tuple[int, int], tuple[int, ...]] | None = None
    # (step index, G, committed (G, V), lag rule's (G, V), counts) of the step in flight


class ServingPlanner:
    """The device planner in a serving loop: one fixed-address step (a CUDA graph) per G.

    Each :meth:`launch` commits the step's cell on the host and queues the device work:

    - ``lagged`` (default): the cell is the newest device decision (made beside the last step
      that had a graph), re-validated for this step (:func:`lagged_cell`); the device ranks this step's survivals and allocates the cell
      (writing the windows into the bound engine buffer), then selects again for the next step
      on a side stream, beside the engine's step. No host synchronisation: the decision comes
      back through a double-buffered pinned snapshot on that stream whose event is queried (a
      snapshot not yet back means native, counted).
    - ``sync``: the device selects and allocates this step's own cell; the host waits for the
      decision (one synchronisation per step). Exact: no lag.

    ``force_native`` keeps every step native while the whole confidence path still runs (the
    release bracket's "feature on, windows forced to K" arm).

    Args:
        planner: the device planner (its device and dtype).
        mode: ``lagged`` or ``sync``.
        force_native: commit native every step (the decision is still computed and counted).
        graphs: capture one CUDA graph per G (default: on CUDA).
        input_dtype: dtype of the logits the engine hands over.

    Raises:
        ConfigError: an unknown mode.
    """

    def __init__(
        self,
        planner: DevicePlanner,
        *,
        mode: str = "lagged",
        force_native: bool = False,
        graphs: bool | None = None,
        input_dtype: torch.dtype = torch.float32,
    ) -> None:
        if mode not in SERVING_MODES:
            raise ConfigError(f"serving planner mode must be one of {SERVING_MODES}, got {mode!r}")
        self.planner = planner
        self.mode = mode
        self.force_native = bool(force_native)
        dev = planner.device
        self._cuda = dev.type == "cuda"
        self._graphs = self._cuda if graphs is None else bool(graphs) and self._cuda
        ladder = planner.table.graph_batch_sizes
        self._steps = {g: planner.step(g, input_dtype=input_dtype) for g in ladder}
        r, k = planner.num_ranks, planner.max_draft_len
        size = max(s.decision.numel() for s in self._steps.values())

        def host(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, pin_memory=self._cuda)

        self._slots = [
            _Slot(
                decision=host((size,), planner.dtype),
                windows={g: host((r, g), torch.int64) for g in ladder},
                logits={g: host((r, g, k), input_dtype) for g in ladder},
                ints=host((r + 2,), torch.int64),
                event=torch.cuda.Event() if self._cuda else None,  # type: ignore[no-untyped-call]  # untyped in torch
            )
            for _ in range(2)
        ]
        self._copy_stream = torch.cuda.Stream(dev) if self._cuda else None  # type: ignore[no-untyped-call]  # untyped in torch
        self._t = 0
        self._latest: tuple[int, int, int] | None = None  # (step index, G, V) of the newest decision read
        self._prepared = False
        #: Why the per-G graphs could not be captured (the steps then run eagerly), else None.
        self.graph_error: str | None = None
        self.reset_stats()

    # -- set-up --------------------------------------------------------------------------------------
    def bind(self, graph_batch_size: int, windows: torch.Tensor) -> None:
        """Write the windows of G's steps into ``windows`` too (an engine's device buffer)."""
        if self._prepared:
            raise RuntimeError("bind every window buffer before prepare()")
        self._steps[int(graph_batch_size)].add_target(windows)

    def prepare(self) -> None:
        """Capture the per-G graphs (on CUDA with graphs on); idempotent."""
        if self._prepared:
            return
        if self._graphs:
            try:
                for step in self._steps.values():
                    step.capture()
            except RuntimeError as exc:  # a capture the driver refuses: run the same ops eagerly
                for step in self._steps.values():
                    step._graph = None
                self._graphs = False
                self.graph_error = repr(exc)
        self._prepared = True

    # -- the serving path -------------------------------------------------------------------------
    def launch(self, logits: np.ndarray | torch.Tensor, counts: Sequence[int]) -> tuple[int, int]:
        """Commit this step's cell and queue its device work; returns the (G, V) to run.

        Args:
            logits: one rank: ``(n, K)`` raw confidence logits of the real rows in canonical order;
                several ranks: ``(R, W, K)`` with each rank's rows first. A host array is staged in
                pinned memory and copied without blocking; a device tensor is copied on the device.
            counts: real rows per rank.

        Returns:
            The committed (G, V); (0, 0) when no rank has a row or the rows exceed the ladder (the
            engine's static fallback; no device work is queued).
        """
        if not self._prepared:
            self.prepare()
        counts_t = tuple(int(c) for c in counts)
        if len(counts_t) != self.planner.num_ranks:
            raise ConfigError(
                f"counts must have one entry per rank ({self.planner.num_ranks}), got {len(counts_t)}"
            )
        self._absorb_ready()
        table = self.planner.table
        g = table.graph_batch_size_for(max(counts_t, default=0)) if max(counts_t, default=0) > 0 else None
        if g is None:
            self.stats["no_graph_steps"] += 1
            return 0, NATIVE_BUDGET
        latest = None if self._latest is None else self._latest[1:]
        if self._latest is not None and self._latest[0] != self._t - 1:
            self.stats["snapshot_late"] += 1  # the previous step's decision is not back yet
            latest = None
        rule = lagged_cell(table, latest, counts_t, min_verify_len=self.planner.min_verify_len)
        committed = (g, NATIVE_BUDGET) if self.force_native or self.mode == "sync" else rule
        step = self._steps[g]
        slot = self._slots[self._t % len(self._slots)]
        if slot.meta is not None:  # that buffer's previous step was never read: wait for it (backpressure)
            if slot.event is not None and not slot.event.query():
                self.stats["snapshot_waits"] += 1
                slot.event.synchronize()
            self._absorb(slot)
        column = step.budgets.index(rule[1]) if rule[1] != NATIVE_BUDGET else -1
        if self._copy_stream is not None:
            # This step overwrites the inputs and buffers an earlier selection reads and its
            # snapshot copies from: order it after them (long finished: they ran beside the
            # engine's previous step). A device-side dependency; the host does not wait.
            torch.cuda.current_stream(self.planner.device).wait_stream(self._copy_stream)
        self._stage(slot, step, g, logits, counts_t, column)
        if self.mode == "sync":
            step.run()  # rank, select, allocate this step's own choice
            self._snapshot(slot, step, g, select=False)
        else:
            step.run_critical()  # rank and allocate the committed cell: the engine's step may start
            self._snapshot(slot, step, g, select=True)  # this step's decision, beside the engine
        if self.mode == "sync":
            if slot.event is not None:
                slot.event.synchronize()  # the one host synchronisation of sync mode
            chosen = int(slot.decision[0].item())
            if not self.force_native and chosen >= 0:
                committed = (g, step.budgets[chosen])
            rule = (g, NATIVE_BUDGET if chosen < 0 else step.budgets[chosen])
        slot.meta = (self._t, g, committed, rule, counts_t)
        if self.mode == "sync":
            self._absorb(slot)
        self._t += 1
        return committed

    def _stage(
        self,
        slot: _Slot,
        step: DeviceStep,
        g: int,
        logits: np.ndarray | torch.Tensor,
        counts: tuple[int, ...],
        column: int,
    ) -> None:
        r = self.planner.num_ranks
        ints = slot.ints.numpy()
        ints[:r] = counts
        ints[r] = column
        ints[r + 1] = 1 if self.mode == "sync" else 0
        if isinstance(logits, torch.Tensor) and logits.device.type != "cpu":
            src = logits if r > 1 else logits.reshape(1, -1, logits.shape[-1])
            w = min(src.shape[1], g)
            step.logits[:, :w].copy_(src[:, :w], non_blocking=True)
        else:
            staged = slot.logits[g].numpy()
            src_np = logits.numpy() if isinstance(logits, torch.Tensor) else np.asarray(logits)
            if r == 1:
                staged[0, : src_np.shape[0]] = src_np
            else:
                w = min(src_np.shape[1], g)
                staged[:, :w] = src_np[:, :w]
            step.logits.copy_(slot.logits[g], non_blocking=self._cuda)
        step.ints.copy_(slot.ints, non_blocking=self._cuda)

    def _snapshot(self, slot: _Slot, step: DeviceStep, g: int, *, select: bool) -> None:
        """Copy the decision and windows to the slot (after the selection, when ``select``).

        On CUDA this runs on the side stream: the selection and the copies overlap the engine's
        step on the main stream, and the slot's event says when they are done.
        """
        n = step.decision.numel()
        if self._copy_stream is None:
            if select:
                step.run_select()
            slot.decision[:n].copy_(step.decision)
            slot.windows[g].copy_(step.windows)
            return
        main = torch.cuda.current_stream(self.planner.device)
        done = torch.cuda.Event()  # type: ignore[no-untyped-call]  # untyped in torch
        done.record(main)
        self._copy_stream.wait_event(done)
        with torch.cuda.stream(self._copy_stream):
            if select:
                step.run_select()
            slot.decision[:n].copy_(step.decision, non_blocking=True)
            slot.windows[g].copy_(step.windows, non_blocking=True)
            slot.event.record(self._copy_stream)

    def _absorb_ready(self) -> None:
        for slot in sorted(self._slots, key=lambda s: -1 if s.meta is None else s.meta[0]):
            if slot.meta is not None and (slot.event is None or slot.event.query()):
                self._absorb(slot)

    def _absorb(self, slot: _Slot) -> None:
        """Read a finished snapshot: update the statistics and the newest decision."""
        assert slot.meta is not None
        index, g, committed, rule, counts = slot.meta
        slot.meta = None
        step = self._steps[g]
        d = slot.decision.numpy()
        column = int(d[0])
        selected = NATIVE_BUDGET if column < 0 else step.budgets[column]
        st = self.stats
        st["steps"] += 1
        st["selected_compact_steps"] += int(selected != NATIVE_BUDGET)
        st["committed_compact_steps"] += int(committed[1] != NATIVE_BUDGET)
        non_finite = bool(d[2])
        st["non_finite_steps"] += int(non_finite)
        # The lag's cost: the lag rule's cell against this step's own decision, in the step's score.
        if rule[1] != selected:
            st["lag_disagreements"] += 1
            if not non_finite:
                st["lag_score_loss"] += lag_score_loss(d, step.budgets, selected, rule[1])
        if committed[1] == NATIVE_BUDGET:
            st["verified_tokens"] += sum(counts) * (self.planner.max_draft_len + 1)
        else:
            w = slot.windows[g].numpy()
            st["verified_tokens"] += int(sum(int(w[r, :c].sum()) + c for r, c in enumerate(counts)))
        if self._latest is None or index > self._latest[0]:
            self._latest = (index, g, selected)

    def finish(self) -> dict[str, Any]:
        """Wait for every snapshot still in flight (end of a run), return the statistics and reset."""
        for slot in sorted(self._slots, key=lambda s: -1 if s.meta is None else s.meta[0]):
            if slot.meta is not None:
                if slot.event is not None:
                    slot.event.synchronize()
                self._absorb(slot)
        out = run_counters(self.stats, mode=self.mode, force_native=self.force_native)
        out["graphs"] = self._graphs
        out["graph_error"] = self.graph_error
        self.reset_stats()
        self._latest = None
        return out

    def reset_stats(self) -> None:
        """Zero the counters (also done by :meth:`finish`)."""
        self.stats: dict[str, Any] = zero_counters()


def zero_counters() -> dict[str, Any]:
    """A serving planner's counters at the start of a run (this module's and the fused one's)."""
    return {
        "steps": 0,
        "selected_compact_steps": 0,
        "committed_compact_steps": 0,
        "non_finite_steps": 0,
        "lag_disagreements": 0,
        "lag_score_loss": 0.0,
        "snapshot_late": 0,
        "snapshot_waits": 0,
        "no_graph_steps": 0,
        "bad_decisions": 0,
        "verified_tokens": 0,
    }


def run_counters(stats: dict[str, Any], *, mode: str, force_native: bool) -> dict[str, Any]:
    """A run's counters as ``finish`` returns them: the rates per step, the mode."""
    out = dict(stats)
    steps = max(int(out["steps"]), 1)
    out["lag_disagreement_rate"] = out["lag_disagreements"] / steps
    out["mean_lag_score_loss"] = out["lag_score_loss"] / steps
    out["mode"] = mode
    out["force_native"] = force_native
    return out


def compiled_parts(step: DeviceStep, *, backend: str = "inductor") -> tuple[Any, Any]:
    """``torch.compile`` of the step's critical part (survivals, allocation) and of its selection
    (sort, decision): what ``DevicePlanner(compile=True)`` runs on CUDA, on the CPU only for
    tests (compiling there buys nothing; ``backend="aot_eager"`` traces the same graphs without a
    C++ compiler). Each is one graph without breaks that reads and writes the step's fixed
    buffers, so a replay of a graph captured around it does the same."""

    def critical() -> None:
        step._survive()
        step._allocate(requested=True)

    def select() -> None:
        step._sort()
        step._select()

    return (
        _compiled_own(critical, f"critical_g{step.width}_{id(step):x}", backend),
        _compiled_own(select, f"select_g{step.width}_{id(step):x}", backend),
    )


def _compiled_own(fn: Any, name: str, backend: str) -> Any:
    # One code object per step and part: the compiler keeps a bounded number of compiled
    # versions per code object, and every step (each G, each planner) needs its own.
    code = fn.__code__.replace(co_name=name)
    own = types.FunctionType(code, fn.__globals__, name, None, fn.__closure__)
    return torch.compile(own, dynamic=False, backend=backend)


def lag_score_loss(decision: np.ndarray, budgets: Sequence[int], selected: int, committed: int) -> float:
    """The relative score a lagged commit gave up: the committed V against the step's own choice,
    both priced in the step's decision vector (0 when the choice's score is not positive)."""
    n_head, n_cell = len(DECISION_FIELDS), len(PER_CELL_FIELDS)
    scores = {NATIVE_BUDGET: float(decision[4])}
    for i, v in enumerate(budgets):
        scores[v] = float(decision[n_head + n_cell * i + 2])
    best = scores[selected]
    if best > 0 and math.isfinite(best):
        return (best - scores.get(committed, -math.inf)) / best
    return 0.0


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def lagged_cell(
    table: CostTable,
    previous: tuple[int, int] | None,
    counts: Sequence[int],
    *,
    min_verify_len: int = DEFAULT_MIN_VERIFY_LEN,
) -> tuple[int, int]:
    """The cell a step commits to from an earlier decision (the one-step lag's host rule).

    The step's G is the smallest captured G holding its busiest rank; the earlier decision's V is
    kept only when it was made for that same G and every rank of this step can carry it (an idle
    rank included), else the step runs native. Pure; no device access.

    Args:
        table: the cost table.
        previous: the earlier decision's (G, V), None when there is none.
        counts: this step's real rows per rank.
        min_verify_len: the verify floor.

    Returns:
        (G, V); (0, 0) without rows or above the ladder.
    """
    busiest = max(counts, default=0)
    if busiest <= 0:
        return 0, NATIVE_BUDGET
    g = table.graph_batch_size_for(busiest)
    if g is None:
        return 0, NATIVE_BUDGET
    if previous is None or previous[0] != g or previous[1] == NATIVE_BUDGET:
        return g, NATIVE_BUDGET
    v = previous[1]
    return (g, v) if _carries(table, g, v, counts, min_verify_len) else (g, NATIVE_BUDGET)


def _carries(table: CostTable, g: int, v: int, counts: Sequence[int], min_verify_len: int) -> bool:
    """Every rank (an idle one included) can carry cell (G, V) with its rows."""
    k = table.max_draft_len
    return all(
        cell_geometry(c, g, v, min_verify_len=min_verify_len, max_draft_len=k) is not None
        for c in {int(c) for c in counts}
    )
