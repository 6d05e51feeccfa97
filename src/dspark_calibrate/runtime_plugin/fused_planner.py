"""The device planner inside the engine's own cell graphs: no launch, no copy, no wait of its own.

:class:`~dspark_calibrate.runtime_plugin.device_planner.ServingPlanner` launches the planner's
graphs next to the engine's: per step it stages the logits, copies them in, replays a graph on the
engine's stream and another on a side stream, records events and copies the decision back. Each
of those is a host call of a few microseconds, and on the critical path of a step the host is all
there is between two steps. :class:`FusedServingPlanner` moves all of it into the engine:

- **Inputs in place.** Each G's :class:`~.device_planner.DeviceStep` reads the rows' logits and its
  ints (rows, committed column, ``use_selected``) from views of the engine's own input buffer
  (:meth:`DevicePlanner.bound_step`), which the engine copies to the device once per step anyway.
- **Captured with the step.** The engine captures, per cell (G, V), one CUDA graph of: the
  planner's survivals and allocation of the committed column (writing the windows the packing
  reads), then the engine's step, with the ranking and selection for the next step on a forked
  stream beside it, joined before the graph ends (:meth:`hooks`).
- **Decision out with the step's output.** The selection writes its decision vector into a region
  of the engine's output buffer, which the engine's one output copy brings back; the host hands
  those values to :meth:`observe` after the step.

The host's part per step is :meth:`commit` (the one-step lag rule of :func:`~.device_planner.lagged_cell`
over the newest observed decision, the ints written into the engine's pinned input buffer) and
:meth:`observe` (counters). The lag is the same as ``ServingPlanner``'s lagged mode: a step
commits the decision made beside the last step that had a graph, re-validated for this step's G
and rows. A step without rows or above the ladder has no graph: :meth:`commit` returns (0, 0)
(the engine's static fallback), no decision is made, and the newest one stays in force.

Contract with the engine: :meth:`commit` is called before the step's input copy, :meth:`observe`
after its output copy completed, steps in order, one at a time (the testbed's engine synchronises
at the end of every step). A snapshot that is not observed (the engine skipped the copy) leaves
the next step native, counted as ``snapshot_late``.

Imports torch (through ``device_planner``); loaded only on request, like ``device_planner``.
Performs no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.device_planner import (
    DECISION_FIELDS,
    PER_CELL_FIELDS,
    DevicePlanner,
    DeviceStep,
    lag_score_loss,
    lagged_cell,
    run_counters,
    zero_counters,
)
from dspark_calibrate.runtime_plugin.planner import NATIVE_BUDGET, cell_geometry

__all__ = ["FusedServingPlanner", "decision_size"]


def decision_size(compact_cells: int) -> int:
    """Elements of a step's decision vector with ``compact_cells`` compact cells of its G."""
    return len(DECISION_FIELDS) + len(PER_CELL_FIELDS) * int(compact_cells)


class FusedServingPlanner:
    """The device planner as part of the engine's cell graphs (module docstring).

    Args:
        planner: the device planner (its table, calibration, device, dtype; ``compile`` fuses the
            ranking and allocation kernels).
        force_native: commit native every step while the whole confidence path still runs (the
            release bracket's "feature on, windows forced to K" arm).

    Raises:
        ConfigError: a multi-rank planner (the fused path serves one rank per engine).
    """

    def __init__(self, planner: DevicePlanner, *, force_native: bool = False) -> None:
        if planner.num_ranks != 1:
            raise ConfigError(
                f"the fused planner serves one rank per engine, the planner has {planner.num_ranks}"
            )
        self.planner = planner
        self.force_native = bool(force_native)
        self.mode = "fused"
        self._steps: dict[int, DeviceStep] = {}
        self._ints: dict[int, np.ndarray] = {}
        self._budgets = {g: planner.table.compact_budgets(g) for g in planner.table.graph_batch_sizes}
        self._latest: tuple[int, int, int] | None = None  # (step index, G, V) of the newest decision
        self._pending: tuple[int, int, tuple[int, int], tuple[int, int], int] | None = None
        self._t = 0
        self.reset_stats()

    # -- set-up ------------------------------------------------------------------------------------
    def bind(
        self,
        graph_batch_size: int,
        *,
        logits: torch.Tensor,
        ints: torch.Tensor,
        ints_host: np.ndarray,
        windows: torch.Tensor,
        decision: torch.Tensor,
    ) -> None:
        """Bind G's step to the engine's buffers.

        Args:
            graph_batch_size: the G.
            logits: ``(1, G, K)`` floating device view the engine fills with the rows' logits.
            ints: ``(3,)`` int64 device view (rows, column, use_selected) the engine copies in.
            ints_host: the host (pinned) array behind ``ints``, which :meth:`commit` writes.
            windows: the engine's ``[G]`` int64 window buffer the packing reads.
            decision: a floating device view of :func:`decision_size` elements the engine's
                output copy brings back.

        Raises:
            ConfigError: a buffer of the wrong shape, dtype or device, or G off the ladder.
        """
        g = int(graph_batch_size)
        if ints_host.shape != (3,) or ints_host.dtype != np.int64:
            raise ConfigError(
                f"ints_host must be an int64 array of shape (3,), got {ints_host.shape} {ints_host.dtype}"
            )
        step = self.planner.bound_step(g, logits, ints)
        step.add_target(windows)
        step.add_decision_target(decision)
        self._steps[g] = step
        self._ints[g] = ints_host

    def hooks(self, graph_batch_size: int) -> tuple[Callable[[], None], Callable[[], None]]:
        """``(critical, beside)`` for the engine's capture of a cell of G: ``critical`` before the
        step (survivals, the allocation of the committed column), ``beside`` on a forked stream
        next to it (ranking, selection and the decision target).

        Raises:
            KeyError: G was not bound.
        """
        step = self._steps[int(graph_batch_size)]
        return step.enqueue_critical, step.enqueue_select

    def decision_size(self, graph_batch_size: int) -> int:
        """Elements of G's decision vector."""
        return decision_size(len(self._budgets[int(graph_batch_size)]))

    # -- the serving path ------------------------------------------------------------------------
    def commit(self, counts: Sequence[int]) -> tuple[int, int]:
        """This step's cell from the newest observed decision; writes G's ints for the step.

        Returns:
            The committed (G, V); (0, 0) without rows or above the ladder (the engine's static
            fallback; nothing is written).
        """
        n = int(counts[0]) if len(counts) == 1 else -1
        if n < 0:
            raise ConfigError(f"counts must have one entry (one rank), got {list(counts)}")
        table = self.planner.table
        g = table.graph_batch_size_for(n) if n > 0 else None
        if g is None or g not in self._steps:
            self.stats["no_graph_steps"] += 1
            return 0, NATIVE_BUDGET
        latest = None
        if self._latest is not None and self._latest[0] == self._t - 1:
            latest = self._latest[1:]
        elif self._t > 0:  # the previous step's decision was never observed
            self.stats["snapshot_late"] += 1
        self._pending = None
        rule = lagged_cell(table, latest, (n,), min_verify_len=self.planner.min_verify_len)
        committed = (g, NATIVE_BUDGET) if self.force_native else rule
        column = self._budgets[g].index(rule[1]) if rule[1] != NATIVE_BUDGET else -1
        ints = self._ints[g]
        ints[0] = n
        ints[1] = column
        ints[2] = 0
        self._pending = (self._t, g, committed, rule, n)
        self._t += 1
        return committed

    def observe(self, decision: np.ndarray) -> None:
        """The decision vector of the step just run (host values of its decision target)."""
        if self._pending is None:
            return
        index, g, committed, rule, n = self._pending
        self._pending = None
        budgets = self._budgets[g]
        d = decision
        st = self.stats
        if (
            d.shape[0] < self.decision_size(g)
            or not math.isfinite(float(d[0]))
            or not -1 <= d[0] < len(budgets)
        ):
            # Not a decision this planner wrote (a short or damaged region): the next step runs
            # native, counted; serving goes on.
            st["bad_decisions"] += 1
            return
        column = int(d[0])
        selected = NATIVE_BUDGET if column < 0 else budgets[column]
        st["steps"] += 1
        st["selected_compact_steps"] += selected != NATIVE_BUDGET
        st["committed_compact_steps"] += committed[1] != NATIVE_BUDGET
        non_finite = bool(d[2])
        st["non_finite_steps"] += non_finite
        if rule[1] != selected:
            st["lag_disagreements"] += 1
            if not non_finite:
                st["lag_score_loss"] += lag_score_loss(d, budgets, selected, rule[1])
        st["verified_tokens"] += self._verified(g, committed[1], n)
        self._latest = (index, g, selected)

    def _verified(self, g: int, v: int, n: int) -> int:
        """Tokens the real rows verified: every window fills its cell exactly (DeviceStep)."""
        pl = self.planner
        if v == NATIVE_BUDGET:
            return n * (pl.max_draft_len + 1)
        geo = cell_geometry(n, g, v, min_verify_len=pl.min_verify_len, max_draft_len=pl.max_draft_len)
        return 0 if geo is None else geo.real_tokens

    def finish(self) -> dict[str, Any]:
        """The run's counters (same keys as ``ServingPlanner.finish``); resets them and the lag."""
        out = run_counters(self.stats, mode=self.mode, force_native=self.force_native)
        out["graphs"] = self.planner.device.type == "cuda"
        out["graph_error"] = None
        out["compiled"] = self.planner.compile and self.planner.device.type == "cuda"
        out["compile_errors"] = sorted({s.compile_error for s in self._steps.values() if s.compile_error})
        self.reset_stats()
        self._latest = None
        self._pending = None
        self._t = 0
        return out

    def reset_stats(self) -> None:
        """Zero the counters (also done by :meth:`finish`)."""
        self.stats: dict[str, Any] = zero_counters()
