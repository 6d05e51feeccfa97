"""The order a round visits its cells in: seeded random, or the order serving moves between G.

Pure: integers and a seed in, an order out. Which cell a visit follows decides the carry-over it
sees (:mod:`~.carryover`): under a power cap a light cell visited after a heavy one runs slower
for a while. A random order spreads that evenly over the cells of a G; the **serving order**
makes the visits follow one another the way a serving engine's steps do, so the table can be
measured in the serving mix (``dspark-calibrate sweep --order serving --workload W.parquet``).

Serving moves between graph batch sizes as its batch grows and shrinks, and stays at one G for
many steps, alternating that G's native and compact cells. :func:`serving_transitions` counts,
over a recorded workload's steps, how often a step at G is followed by one at G'
(:class:`ServingOrder`); :func:`visit_order` then visits one G's open cells together (in a seeded
random order within the G) and walks from G to G drawing each next G in proportion to those
counts. Which V a policy would choose within a G needs the very cost table the sweep measures, so
the order within a G stays random.

Within a G a serving engine alternates cells step by step (a policy picks V per step), so under a
power cap every cell runs at the clock of the G's mix. ``--interleave`` measures that way: a visit
takes one G's open cells together (:func:`g_blocks`) and runs them in one sequence that draws each
step's cell at random (:func:`interleaved_steps`), instead of one cell re-warmed alone; the timed
sequence is balanced (blocks that visit every cell once, run forward then backward), so a clock
wandering over the visit slows every cell alike.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dspark_calibrate.calibrate.measurement.mixed import Cell
from dspark_calibrate.errors import ConfigError

__all__ = [
    "ORDERS",
    "ServingOrder",
    "g_blocks",
    "interleaved_steps",
    "rows_per_step",
    "serving_transitions",
    "visit_order",
]

#: Visiting orders: ``random`` (a seeded permutation per round) or ``serving``.
ORDERS: tuple[str, ...] = ("random", "serving")
#: Weight of a G the workload never moves to, relative to one observed transition: keeps every G
#: reachable without letting unseen moves compete with seen ones.
_UNSEEN = 1e-3


@dataclass(frozen=True, slots=True)
class ServingOrder:
    """How often serving moves from one G to another between consecutive steps.

    Attributes:
        transitions: ``{G: {G': steps at G followed by a step at G'}}`` (self moves included).
        steps: the workload steps counted.
        source: what the counts came from (e.g. the workload's identity).
    """

    transitions: Mapping[int, Mapping[int, int]]
    steps: int
    source: str = ""

    def weight(self, g_from: int | None, g_to: int) -> float:
        """The weight of moving to ``g_to``: from ``g_from`` its transition count, else (first G of a
        round) how often serving runs at ``g_to``; unseen moves get a small weight."""
        if g_from is None:
            seen = sum(row.get(g_to, 0) for row in self.transitions.values())
        else:
            seen = self.transitions.get(g_from, {}).get(g_to, 0)
        return float(seen) + _UNSEEN

    def to_dict(self) -> dict[str, Any]:
        """JSON form (part of the sweep configuration, so it keys the journal)."""
        return {
            "mode": "serving",
            "transitions": {
                str(a): {str(b): n for b, n in sorted(row.items())}
                for a, row in sorted(self.transitions.items())
            },
            "steps": self.steps,
            "source": self.source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServingOrder:
        """Inverse of :meth:`to_dict`."""
        rows = {int(a): {int(b): int(n) for b, n in row.items()} for a, row in data["transitions"].items()}
        return cls(rows, int(data["steps"]), str(data.get("source", "")))


def rows_per_step(step: np.ndarray, rank: np.ndarray) -> list[int]:
    """Rows of each step on its fullest rank (rank-local rows, which pick the step's G), in step
    order, from a workload's per-row step and rank ids."""
    if step.size == 0:
        return []
    pairs, counts = np.unique(np.stack([step, rank]), axis=1, return_counts=True)
    _, first = np.unique(pairs[0], return_index=True)
    return [int(n) for n in np.maximum.reduceat(counts, first)]


def serving_transitions(
    rows_per_step: Sequence[int], ladder: Sequence[int], *, source: str = ""
) -> ServingOrder:
    """Count the G-to-G moves of consecutive steps with ``rows_per_step`` rows each (per rank).

    A step runs at the smallest G of ``ladder`` that holds its rows; a step with more rows than
    the largest G counts at the largest (it would be split, and the largest graph runs).

    Raises:
        ConfigError: fewer than two steps, or an empty ladder.
    """
    gs = sorted(ladder)
    if not gs:
        raise ConfigError("--order serving needs a graph ladder")
    if len(rows_per_step) < 2:
        raise ConfigError(
            f"--order serving needs a workload of at least two steps; this one has {len(rows_per_step)}"
        )
    index = np.searchsorted(np.asarray(gs), np.asarray(rows_per_step, dtype=np.int64), side="left")
    seq = [gs[min(int(i), len(gs) - 1)] for i in index]
    counts: dict[int, dict[int, int]] = {}
    for a, b in itertools.pairwise(seq):
        row = counts.setdefault(a, {})
        row[b] = row.get(b, 0) + 1
    return ServingOrder(counts, len(seq), source)


def visit_order(
    cells: Sequence[Cell], *, seed: int, round_index: int, order: ServingOrder | None = None
) -> list[Cell]:
    """The cells of one round in visiting order (pure, reproducible from the seed and the round).

    Without ``order``: a seeded random permutation. With it: one G's cells together, the G's in a
    walk drawn from the serving transitions (module docstring).
    """
    ordered = sorted(cells)
    rng = np.random.default_rng([seed, round_index])
    if order is None:
        return [ordered[i] for i in rng.permutation(len(ordered))]
    by_g: dict[int, list[Cell]] = {}
    for c in ordered:
        by_g.setdefault(c.key[0], []).append(c)
    left = sorted(by_g)
    out: list[Cell] = []
    current: int | None = None
    while left:
        weights = np.array([order.weight(current, g) for g in left])
        current = left.pop(int(rng.choice(len(left), p=weights / weights.sum())))
        group = by_g[current]
        out.extend(group[i] for i in rng.permutation(len(group)))
    return out


def g_blocks(order: Sequence[Cell]) -> list[list[Cell]]:
    """``order`` cut into one block per G, each G's block where its first cell was (so a serving
    order, which keeps a G's cells together, keeps its walk; a random order gives a random G order)."""
    blocks: dict[int, list[Cell]] = {}
    for c in order:
        blocks.setdefault(c.key[0], []).append(c)
    return list(blocks.values())


def interleaved_steps(
    counts: Sequence[int], rng: np.random.Generator, *, stay: float = 0.0, balanced: bool = False
) -> list[int]:
    """A sequence holding index ``i`` exactly ``counts[i]`` times: one G's cells alternating as a
    policy alternates them, every cell's steps spread over the whole sequence.

    ``stay`` = 0 draws every step's cell at random from the steps left (a uniformly random order);
    ``stay`` = p > 0 runs a cell for a run of steps, one more with probability p each time (mean
    ``1 / (1 − p)`` steps, cut at what the cell has left), then draws the next run's cell from the
    cells with steps left, in proportion to them.

    ``balanced`` spreads every cell's steps evenly instead, in two ways:

    - *blocks*: the sequence is a series of blocks, each visiting every cell with steps left once,
      in random order, for one step (``stay`` = 0) or one run (``stay`` > 0, drawn as above);
    - *a palindrome*: only the first half of each cell's steps is drawn that way; the sequence is
      that half, any odd steps left in random order, then the half again backwards. Every cell's
      steps then sit symmetrically about the middle, in time as well as in position whatever
      each cell's step time (a step ending t after the start has its mirror image starting t
      before the end), so a clock drifting linearly over the sequence slows every cell alike.

    Under a power cap the clock wanders within a visit (docs/sweep.md "Interleaved visits"): a
    random order leaves a cell's few steps bunched in some of its windows and not others, and its
    saving carries those windows' clock; spread evenly, every cell meets the visit's windows alike.

    Raises:
        ConfigError: a negative count, or ``stay`` outside [0, 1).
    """
    if any(n < 0 for n in counts):
        raise ConfigError(f"step counts must be >= 0, got {list(counts)}")
    if not 0.0 <= stay < 1.0:
        raise ConfigError(f"stay must be in [0, 1), got {stay!r}")
    if balanced:
        first = _in_blocks([n // 2 for n in counts], rng, stay)
        middle = [int(i) for i in rng.permutation([i for i, n in enumerate(counts) if n % 2])]
        return [*first, *middle, *first[::-1]]
    if stay == 0.0:
        steps = np.repeat(np.arange(len(counts)), np.asarray(counts, dtype=np.int64))
        return [int(i) for i in rng.permutation(steps)]
    left = np.asarray(counts, dtype=np.int64).copy()
    out: list[int] = []
    while left.sum() > 0:
        cell = int(rng.choice(len(left), p=left / left.sum()))
        run = min(int(rng.geometric(1.0 - stay)), int(left[cell]))
        out.extend([cell] * run)
        left[cell] -= run
    return out


def _in_blocks(counts: Sequence[int], rng: np.random.Generator, stay: float) -> list[int]:
    """Blocks that each visit every cell with steps left once, in random order, for one run
    (one step when ``stay`` = 0; see :func:`interleaved_steps`)."""
    left = np.asarray(counts, dtype=np.int64).copy()
    out: list[int] = []
    while left.sum() > 0:
        for cell in rng.permutation(np.flatnonzero(left)):
            run = 1 if stay == 0.0 else min(int(rng.geometric(1.0 - stay)), int(left[cell]))
            out.extend([int(cell)] * run)
            left[cell] -= run
    return out
