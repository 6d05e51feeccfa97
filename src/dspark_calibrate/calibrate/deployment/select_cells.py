"""Choose which measured compact cells to deploy: at most 4 per G and a fixed total.

The runtime limits a deployment to 4 compact cells per G and 32 in all; the ``cost-table``
artifact counts native cells in its 32 rows, so at most ``32 - len(ladder)`` compact cells are
chosen. Selection maximises the replayed value of the workload (``replay``'s per-step value
``T(G,0) - T(G,V) - lost_tokens * static_ms_per_token``, with median times) under the runtime's own
choice rule, by greedy forward selection with re-evaluation:

1. Every candidate's per-step outcome is computed once: whether it passes the margin and the
   drain guard, and its (group value, score, V) key, which is how the runtime ranks cells.
2. Start from native only. In each round, for every remaining candidate, re-evaluate the workload
   with that cell added (a step moves to it when it passes and its key beats the step's current
   cell) and take the candidate that adds the most value. Stop when no candidate adds value or
   the limits are reached.
3. Drop chosen cells that the final set never selects.

Adding a cell can lower the value (the runtime ranks by group value, not by the replay's value),
which is why every round re-evaluates instead of ranking candidates once.

Only cells that save for sure are candidates: a compact cell whose paired saving interval reaches
0 or below is never deployed (``not_significant`` in the flatness rows), so no signed table claims a
saving its own evidence does not support.

Refusals (STYLE rule 11): a flat table (no compact median below native) is REJECT, drops that are
all within the measurement intervals (no saving interval above 0) are UNDECIDED, a table whose
cells never change a decision profitably on this workload is REJECT; :func:`require_cells` turns
anything but ACCEPT into a ``ConfigError`` that gives the numbers. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dspark_calibrate.calibrate.deployment.replay import CellGrid, StepEvidence, choose_steps
from dspark_calibrate.decision import Decision, Status
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.planner import (
    MAX_COMPACT_CELLS_PER_G,
    MAX_COMPACT_CELLS_TOTAL,
    CellChoice,
    DrainGuard,
)

__all__ = ["CellSelection", "SelectionRefused", "flatness", "require_cells", "select_cells"]

#: Value (ms over the workload) below which adding a cell is not worth a graph capture.
MIN_VALUE_GAIN_MS = 1e-6


class SelectionRefused(ConfigError):
    """The measurements or the workload do not support a deployment; ``decision`` says why."""

    def __init__(self, decision: Decision, message: str) -> None:
        self.decision = decision
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class CellSelection:
    """The outcome of :func:`select_cells`.

    Attributes:
        cells: the chosen compact (G, V), sorted.
        decision: ACCEPT / REJECT / UNDECIDED / UNKNOWN with a reason code and the numbers.
        value_ms: the replayed value of the chosen set (ms over the workload, median times).
        rounds: the greedy history, one entry per added cell.
        flatness: per G, the best compact saving against native.
        limits: the per-G and total limits applied.
    """

    cells: tuple[tuple[int, int], ...]
    decision: Decision
    value_ms: float
    rounds: tuple[Mapping[str, Any], ...]
    flatness: tuple[Mapping[str, Any], ...]
    limits: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "cells": [list(c) for c in self.cells],
            "decision": {
                "status": self.decision.status.value,
                "reason": self.decision.reason,
                "detail": self.decision.detail,
            },
            "value_ms": self.value_ms,
            "rounds": [dict(r) for r in self.rounds],
            "flatness": [dict(f) for f in self.flatness],
            "limits": dict(self.limits),
        }


def flatness(grid: CellGrid) -> tuple[Decision, tuple[Mapping[str, Any], ...]]:
    """Does T(G, V) drop below T(G, 0) anywhere, and beyond the measurement intervals?

    Returns:
        REJECT ``flat`` when no compact median is below its native median, UNDECIDED
        ``flat_within_noise`` when no cell's saving interval lies above 0 (paired, or for a
        schema-1 table derived from the two absolute intervals), ACCEPT ``staircase`` otherwise;
        and the per-G numbers.
    """
    rows: list[dict[str, Any]] = []
    for g in grid.ladder:
        nat = grid.native(g)
        comp = grid.compact(g)
        if not comp:
            rows.append({"graph_batch_size": g, "native_ms": nat.step_time_ms, "candidates": 0})
            continue
        best = min(comp, key=lambda c: c.step_time_ms)
        rows.append(
            {
                "graph_batch_size": g,
                "native_ms": nat.step_time_ms,
                "candidates": len(comp),
                "best_verifier_budget": best.verifier_budget,
                "best_ms": best.step_time_ms,
                "saving_ms": nat.step_time_ms - best.step_time_ms,
                "saving_fraction": (nat.step_time_ms - best.step_time_ms) / nat.step_time_ms,
                "significant": any(c.saving_ci_low > 0 for c in comp),
                "not_significant": sorted(c.verifier_budget for c in comp if c.saving_ci_low <= 0),
            }
        )
    text = "; ".join(
        f"G={r['graph_batch_size']}: best V={r['best_verifier_budget']} saves {r['saving_ms']:.4g} ms "
        f"({r['saving_fraction']:.2%}) of {r['native_ms']:.4g} ms"
        if r["candidates"]
        else f"G={r['graph_batch_size']}: no compact candidate"
        for r in rows
    )
    if not any(r["candidates"] for r in rows):
        return Decision(
            Status.REJECT, "no_candidates", "the sweep measured no deployable compact cell"
        ), tuple(rows)
    if not any(r.get("saving_ms", 0.0) > 0 for r in rows):
        return Decision(Status.REJECT, "flat", f"no compact cell is faster than native: {text}"), tuple(rows)
    if not any(r.get("significant") for r in rows):
        return (
            Decision(
                Status.UNDECIDED,
                "flat_within_noise",
                f"every compact saving lies within the measurement intervals: {text}",
            ),
            tuple(rows),
        )
    return Decision(Status.ACCEPT, "staircase", text), tuple(rows)


def _later(
    gv: np.ndarray, sc: np.ndarray, v: np.ndarray, cgv: np.ndarray, csc: np.ndarray, cv: np.ndarray
) -> np.ndarray:
    """Lexicographic (group value, score, V) comparison: True where the first key wins."""
    out: np.ndarray = (gv > cgv) | ((gv == cgv) & ((sc > csc) | ((sc == csc) & (v > cv))))
    return out


def select_cells(
    evidence: StepEvidence,
    *,
    minimum_predicted_gain: float,
    drain_guard: DrainGuard,
    max_per_g: int = MAX_COMPACT_CELLS_PER_G,
    max_total: int | None = None,
) -> CellSelection:
    """Greedy forward selection with re-evaluation (see the module docstring).

    Args:
        evidence: every policy step evaluated under every candidate (from ``prepare_evidence``).
        minimum_predicted_gain: the runtime margin.
        drain_guard: the runtime drain guard used for the choice.
        max_per_g: compact cells per G (engine limit 4).
        max_total: compact cells in all (default ``32 - len(ladder)`` so the cost table, native
            cells included, stays within 32 rows).
    """
    grid = evidence.grid
    ladder = grid.ladder
    total_cap = MAX_COMPACT_CELLS_TOTAL - len(ladder) if max_total is None else max_total
    limits = {"max_per_g": max_per_g, "max_total": total_cap}
    flat, flat_rows = flatness(grid)
    if flat.status is not Status.ACCEPT:
        return CellSelection((), flat, 0.0, (), flat_rows, limits)
    s_count = evidence.steps
    if s_count == 0:
        return CellSelection(
            (), Decision(Status.UNKNOWN, "no_steps", "no policy step to replay"), 0.0, (), flat_rows, limits
        )
    choice = choose_steps(evidence, minimum_predicted_gain=minimum_predicted_gain, drain_guard=drain_guard)
    value = _step_value(evidence)
    ok = choice.passes_guard
    race = _Race(
        ok,
        np.where(ok, choice.group_value_ms, -np.inf),
        choice.score,
        evidence.columns,
        value,
        {g: np.flatnonzero(evidence.graph_batch_size == g) for g in ladder},
    )
    cur = _Standing.native(s_count)
    # Only cells that save for sure: their saving interval lies above 0.
    candidates = [
        (g, j, c.verifier_budget)
        for g in ladder
        for j, c in enumerate(grid.compact(g))
        if c.saving_ci_low > 0
    ]
    chosen: list[int] = []
    per_g = dict.fromkeys(ladder, 0)
    rounds = []
    while len(chosen) < total_cap:
        open_ = [i for i, (g, _, _) in enumerate(candidates) if i not in chosen and per_g[g] < max_per_g]
        best, best_delta, best_wins = race.best(candidates, open_, cur)
        if best < 0 or best_wins is None:
            break
        g, j, v = candidates[best]
        cur.take(race, best_wins, j, best)
        chosen.append(best)
        per_g[g] += 1
        rounds.append(
            {
                "graph_batch_size": g,
                "verifier_budget": v,
                "added_value_ms": best_delta,
                "total_value_ms": float(cur.value.sum()),
            }
        )
    used = sorted({candidates[i][0::2] for i in set(cur.cell.tolist()) if i >= 0})
    cells = tuple((int(g), int(v)) for g, v in used)
    total = float(cur.value.sum())
    if not cells:
        refused = _never_changes(choice, ok, value, s_count, minimum_predicted_gain)
        return CellSelection((), refused, 0.0, tuple(rounds), flat_rows, limits)
    detail = f"{len(cells)} compact cell(s) chosen, replayed value {total:.4g} ms over {s_count} steps"
    return CellSelection(
        cells, Decision(Status.ACCEPT, "cells_selected", detail), total, tuple(rounds), flat_rows, limits
    )


def _step_value(evidence: StepEvidence) -> np.ndarray:
    """(S, J) value of each column on each step at the median times: the time it saves minus the
    time static K needs for the tokens it does not emit."""
    native_ms, compact_ms = evidence.times("median")
    ms_per_token = float(native_ms.sum()) / float(evidence.static_tokens.sum())
    value: np.ndarray = (native_ms[:, None] - compact_ms) - (
        evidence.static_tokens[:, None] - evidence.tokens
    ) * ms_per_token
    return value


@dataclass(frozen=True, eq=False)
class _Race:
    """What every candidate column offers every step: whether it passes the drain guard, its
    selector keys (group value, score, V) and its value; and the steps of each G."""

    ok: np.ndarray
    group_value: np.ndarray
    score: np.ndarray
    budget: np.ndarray
    value: np.ndarray
    steps_of_g: Mapping[int, np.ndarray]

    def best(
        self, candidates: Sequence[tuple[int, int, int]], open_: Sequence[int], cur: _Standing
    ) -> tuple[int, float, np.ndarray | None]:
        """The open candidate that adds the most value over the current table (by more than
        :data:`MIN_VALUE_GAIN_MS`), with its gain and the steps it wins; -1 when none does."""
        best, best_delta, best_wins = -1, MIN_VALUE_GAIN_MS, None
        for i in open_:
            g, j, _v = candidates[i]
            idx = self.steps_of_g[g]
            if idx.size == 0:
                continue
            wins = self.ok[idx, j] & _later(
                self.group_value[idx, j],
                self.score[idx, j],
                self.budget[idx, j],
                cur.group_value[idx],
                cur.score[idx],
                cur.budget[idx],
            )
            if not wins.any():
                continue
            delta = float((self.value[idx[wins], j] - cur.value[idx[wins]]).sum())
            if delta > best_delta:
                best, best_delta, best_wins = i, delta, idx[wins]
        return best, best_delta, best_wins


@dataclass(frozen=True, eq=False)
class _Standing:
    """Per step, what the table chosen so far makes the selector pick (updated in place)."""

    group_value: np.ndarray
    score: np.ndarray
    budget: np.ndarray
    value: np.ndarray
    cell: np.ndarray  # index into the candidates, -1 native

    @classmethod
    def native(cls, steps: int) -> _Standing:
        return cls(
            np.full(steps, -np.inf),
            np.full(steps, -np.inf),
            np.full(steps, -1, dtype=np.int64),
            np.zeros(steps),
            np.full(steps, -1, dtype=np.int64),
        )

    def take(self, race: _Race, wins: np.ndarray, j: int, candidate: int) -> None:
        """The steps in ``wins`` now pick column ``j`` (candidate ``candidate``)."""
        self.group_value[wins] = race.group_value[wins, j]
        self.score[wins] = race.score[wins, j]
        self.budget[wins] = race.budget[wins, j]
        self.value[wins] = race.value[wins, j]
        self.cell[wins] = candidate


def _never_changes(
    choice: CellChoice, ok: np.ndarray, value: np.ndarray, s_count: int, minimum_predicted_gain: float
) -> Decision:
    """The refusal when no cell changes a decision profitably, with the funnel that says why."""
    margin = int(choice.passes_margin.any(axis=1).sum())
    guard = int(ok.any(axis=1).sum())
    positive = int((ok & (value > 0)).any(axis=1).sum())
    detail = (
        f"over {s_count} policy steps, {margin} have a cell beating native by the "
        f"{minimum_predicted_gain:.2%} "
        f"margin, {guard} of those pass the drain guard, {positive} would gain value; no cell changes a "
        "decision profitably on this workload"
    )
    return Decision(Status.REJECT, "never_changes_decision", detail)


def require_cells(selection: CellSelection) -> tuple[tuple[int, int], ...]:
    """The chosen cells, or a ``ConfigError`` that explains the refusal with its numbers.

    Raises:
        SelectionRefused: the decision is not ACCEPT (a ``ConfigError``).
    """
    d = selection.decision
    if d.status is Status.ACCEPT:
        return selection.cells
    fixes = {
        "flat": "dynamic verification cannot pay on this deployment; deploy static K",
        "flat_within_noise": "measure longer (a tighter --precision) or more rounds before building",
        "no_candidates": "re-run the sweep with compact budgets",
        "never_changes_decision": "record a workload that matches serving, or measure more compact budgets",
        "no_steps": "record a workload on this deployment",
    }
    raise SelectionRefused(
        d,
        f"cell selection {d.status.value} ({d.reason}): {d.detail}; "
        f"{fixes.get(d.reason, 'see docs/build.md')}",
    )
