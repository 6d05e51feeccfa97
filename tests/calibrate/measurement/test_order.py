"""Visiting orders: the seeded random order, and the serving order drawn from a workload's moves."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_calibrate.calibrate.measurement.ladder import CellSpec, plan_cells
from dspark_calibrate.calibrate.measurement.order import (
    ServingOrder,
    g_blocks,
    interleaved_steps,
    rows_per_step,
    serving_transitions,
    visit_order,
)
from dspark_calibrate.errors import ConfigError

CELLS = plan_cells(k=3, ladder=(2, 4, 8, 16), max_per_g=3)


def test_the_random_order_is_the_seeded_permutation() -> None:
    ordered = sorted(CELLS)
    for r in range(5):
        perm = np.random.default_rng([7, r]).permutation(len(ordered))
        assert visit_order(CELLS, seed=7, round_index=r) == [ordered[i] for i in perm]


def test_serving_transitions_count_moves_between_g() -> None:
    rows = [1, 2, 2, 3, 7, 9, 40, 16]  # G: 2 2 2 4 8 16 16(overflow) 16
    order = serving_transitions(rows, (2, 4, 8, 16), source="w")
    assert order.steps == 8
    assert order.transitions == {2: {2: 2, 4: 1}, 4: {8: 1}, 8: {16: 1}, 16: {16: 2}}
    assert ServingOrder.from_dict(order.to_dict()) == order


@pytest.mark.parametrize(
    ("rows", "ladder", "match"),
    [([3], (2, 4), "two steps"), ([], (2, 4), "two steps"), ([1, 2], (), "ladder")],
)
def test_serving_transitions_refuse(rows: list[int], ladder: tuple[int, ...], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        serving_transitions(rows, ladder)


def test_the_serving_order_visits_a_g_together_and_walks_the_workloads_moves() -> None:
    # Serving only ever moves up the ladder one G at a time (8 -> 16 -> ...), and stays at 2 most.
    order = ServingOrder({2: {2: 50, 4: 10}, 4: {8: 10}, 8: {16: 10}, 16: {2: 10}}, 100)
    moves: Counter[tuple[int, int]] = Counter()
    starts: Counter[int] = Counter()
    for r in range(300):
        seq = visit_order(CELLS, seed=3, round_index=r, order=order)
        assert sorted(seq) == sorted(CELLS)
        gs = [c.graph_batch_size for c in seq]
        blocks = [g for i, g in enumerate(gs) if i == 0 or gs[i - 1] != g]
        assert len(blocks) == len(set(blocks)) == 4  # each G's cells together
        starts[blocks[0]] += 1
        moves.update(itertools.pairwise(blocks))
    assert starts[2] > starts[4] + starts[8]  # serving runs at G=2 most
    seen = {m for m, n in moves.items() if n > 10}
    assert {(2, 4), (4, 8), (8, 16)} <= seen
    # From G=8 serving only ever moves to 16: other moves from 8 happen only once 16 is visited.
    assert moves[(8, 16)] > moves[(8, 2)] + moves[(8, 4)]


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    round_index=st.integers(0, 10_000),
    keep=st.sets(st.integers(0, len(CELLS) - 1), min_size=1),
)
def test_every_order_is_a_permutation_of_the_open_cells(seed: int, round_index: int, keep: set[int]) -> None:
    cells = [CELLS[i] for i in sorted(keep)]
    order = ServingOrder({2: {4: 1}, 16: {16: 3}}, 5)
    for o in (None, order):
        got = visit_order(cells, seed=seed, round_index=round_index, order=o)
        assert sorted(got) == sorted(cells)
        assert got == visit_order(cells, seed=seed, round_index=round_index, order=o)  # reproducible


def test_a_g_the_workload_never_reaches_is_still_visited() -> None:
    order = ServingOrder({2: {2: 5}}, 6)
    seq = visit_order([CellSpec(2, 0, 3), CellSpec(16, 0, 3)], seed=0, round_index=0, order=order)
    assert {c.graph_batch_size for c in seq} == {2, 16}


def test_rows_per_step_counts_the_fullest_rank() -> None:
    step = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    rank = np.array([0, 0, 1, 0, 1, 0, 1, 1, 1])
    assert rows_per_step(step, rank) == [2, 1, 3]
    assert rows_per_step(np.array([], dtype=np.int64), np.array([], dtype=np.int64)) == []


# --- interleaved visits -----------------------------------------------------------------------------


def test_g_blocks_keep_a_gs_cells_together_where_the_g_first_came() -> None:
    cells = visit_order(CELLS, seed=3, round_index=1)
    blocks = g_blocks(cells)
    assert [c for b in blocks for c in b] != []  # every cell is in one block
    assert sorted(c for b in blocks for c in b) == sorted(cells)
    for b in blocks:
        assert len({c.graph_batch_size for c in b}) == 1
    first_seen = list(dict.fromkeys(c.graph_batch_size for c in cells))
    assert [b[0].graph_batch_size for b in blocks] == first_seen


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 30), min_size=1, max_size=6),
    stay=st.sampled_from([0.0, 0.5, 0.75, 0.95]),
    balanced=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_an_interleaving_holds_each_cell_exactly_its_steps(
    counts: list[int], stay: float, balanced: bool, seed: int
) -> None:
    got = interleaved_steps(counts, np.random.default_rng(seed), stay=stay, balanced=balanced)
    assert Counter(got) == Counter({i: n for i, n in enumerate(counts) if n})
    again = interleaved_steps(counts, np.random.default_rng(seed), stay=stay, balanced=balanced)
    assert got == again  # reproducible


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(0, 20), min_size=1, max_size=5),
    durations=st.lists(st.floats(0.1, 50.0), min_size=5, max_size=5),
    stay=st.sampled_from([0.0, 0.75]),
    seed=st.integers(0, 2**31),
)
def test_a_balanced_interleaving_centres_every_cell_in_time(
    counts: list[int], durations: list[float], stay: float, seed: int
) -> None:
    """Whatever each cell's step time, every cell's steps are centred on the sequence's middle in
    time, so a clock drifting linearly over the sequence slows every cell alike."""
    order = interleaved_steps(counts, np.random.default_rng(seed), stay=stay, balanced=True)
    assert order == order[::-1] or any(n % 2 for n in counts)  # a palindrome, odd steps aside
    ends = np.cumsum([durations[i] for i in order])
    middles = ends - np.array([durations[i] for i in order]) / 2.0
    odd = {i for i, n in enumerate(counts) if n % 2}
    for cell in {i for i, n in enumerate(counts) if n} - odd:
        centre = float(np.mean(middles[np.array(order) == cell]))
        assert centre == pytest.approx(ends[-1] / 2.0, rel=1e-9, abs=1e-9)


def test_balanced_blocks_visit_every_cell_once_before_any_again() -> None:
    order = interleaved_steps([8, 8, 8, 8], np.random.default_rng(3), balanced=True)
    half = order[:16]
    for block in range(4):
        assert sorted(half[4 * block : 4 * block + 4]) == [0, 1, 2, 3]
    assert order[16:] == half[::-1]


@pytest.mark.parametrize(
    ("stay", "balanced", "low", "high"),
    [
        (0.0, False, 0.2, 0.3),  # 1/4 at random
        (0.75, False, 0.75, 0.87),  # 0.75 + 0.25/4 in runs
        (0.0, True, 0.03, 0.1),  # 1/16: only where a block ends on the cell the next begins with
        (0.75, True, 0.70, 0.82),  # runs as drawn, a few merged across blocks
    ],
)
def test_stay_sets_how_often_a_step_repeats_the_cell_before_it(
    stay: float, balanced: bool, low: float, high: float
) -> None:
    got = interleaved_steps([500] * 4, np.random.default_rng(0), stay=stay, balanced=balanced)
    repeats = float(np.mean([a == b for a, b in itertools.pairwise(got)]))
    assert low <= repeats <= high


@pytest.mark.parametrize("balanced", [False, True])
@pytest.mark.parametrize(("counts", "stay"), [([3, -1], 0.0), ([3, 3], 1.0), ([3], -0.1), ([1], float("nan"))])
def test_an_interleaving_refuses_what_it_cannot_draw(counts: list[int], stay: float, balanced: bool) -> None:
    with pytest.raises(ConfigError):
        interleaved_steps(counts, np.random.default_rng(0), stay=stay, balanced=balanced)
