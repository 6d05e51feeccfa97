"""Carry-over between visits: the fixed-effects estimate on visits with a known slowdown, the shift
it puts on medians and savings, and when the re-warm grows."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_calibrate.calibrate.measurement.carryover import (
    SIGNIFICANCE_Z,
    Carryover,
    CarryoverEffect,
    VisitRecord,
    estimate_carryover,
    next_rewarm,
)
from dspark_calibrate.calibrate.measurement.ladder import CellSpec

K = 3
LADDER = (2, 4, 8)


def _cells() -> list[CellSpec]:
    return [CellSpec(g, v, K) for g in LADDER for v in (0, g + 1, g * (K + 1))]


def _visits(
    rng: np.random.Generator, effect: float, rounds: int = 40, noise: float = 0.003
) -> list[VisitRecord]:
    """Random visiting orders; a visit after a larger G is slower by ``effect`` (log scale)."""
    cells = _cells()
    out = []
    for r in range(rounds):
        drift = rng.normal(0, 0.01)
        previous = None
        for i in rng.permutation(len(cells)):
            cell = cells[i]
            after = previous is not None and previous.graph_batch_size > cell.graph_batch_size
            level = np.log(cell.graph_batch_size) + drift + rng.normal(0, noise) + (effect if after else 0.0)
            out.append(VisitRecord(cell, r, r // 10, float(level), previous, 2))
            previous = cell
    return [v for v in out if v.previous is not None]


def _shared(visits: list[VisitRecord]) -> dict[int, float]:
    from dspark_calibrate.calibrate.measurement.stats import common_round_effects

    logs: dict[CellSpec, dict[int, float]] = {}
    for v in visits:
        logs.setdefault(v.cell, {})[v.round] = v.log_median
    return common_round_effects(logs)


@pytest.mark.parametrize("effect", [0.0, 0.01, 0.03])
def test_the_effect_of_each_g_is_recovered(effect: float) -> None:
    rng = np.random.default_rng(int(effect * 1000))
    visits = _visits(rng, effect)
    carry = estimate_carryover(visits, _shared(visits))
    largest = carry.per_g[8]
    assert largest.effect is None and largest.after == 0  # nothing is larger than the largest G
    for g in (2, 4):
        e = carry.per_g[g]
        assert e.effect is not None and e.se is not None
        assert abs(e.effect - effect) < 4 * e.se + 0.001, (g, e)
    for cell, shift in carry.cell_shift.items():
        if cell.graph_batch_size == 8:
            assert shift == 0.0
        else:
            assert shift is not None


def test_the_shift_of_a_saving_is_the_difference_of_the_shares() -> None:
    native, compact = CellSpec(4, 0, K), CellSpec(4, 5, K)
    big = CellSpec(8, 0, K)
    small = CellSpec(2, 0, K)
    visits = []
    # The compact cell follows the larger G in 3 of 4 rounds, the native cell in 1 of 4.
    for r in range(40):
        for cell, after in ((native, r % 4 == 0), (compact, r % 4 != 0)):
            prev = big if after else small
            visits.append(VisitRecord(cell, r, 0, 0.02 * after + 1e-4 * (r % 3), prev, 2))
    carry = estimate_carryover(visits, {})
    assert carry.per_g[4].effect == pytest.approx(0.02, abs=1e-3)
    assert carry.cell_shift[compact] == pytest.approx(0.015, abs=1e-3)
    assert carry.cell_shift[native] == pytest.approx(0.005, abs=1e-3)
    # The compact cell looks slower than it is relative to native: its saving looks smaller.
    assert carry.saving_shift[compact] == pytest.approx(-0.01, abs=1e-3)
    assert carry.largest_saving_shift() == pytest.approx(0.01, abs=1e-3)


def _carry(effect: float | None, se: float | None, shift: float | None) -> Carryover:
    cell = CellSpec(4, 5, K)
    return Carryover({4: CarryoverEffect(4, effect, se, 10, 10)}, {cell: shift}, {cell: shift})


@pytest.mark.parametrize(
    ("case", "carry", "current", "maximum", "expected"),
    [
        ("significant_and_large", _carry(0.02, 0.002, 0.005), 2, 64, 4),
        ("grows_from_zero", _carry(0.02, 0.002, 0.005), 0, 64, 2),
        ("capped", _carry(0.02, 0.002, 0.005), 48, 64, 64),
        ("at_the_cap", _carry(0.02, 0.002, 0.005), 64, 64, None),
        ("small_shift", _carry(0.02, 0.002, 0.001), 2, 64, None),
        ("not_significant", _carry(0.02, 0.02 / (SIGNIFICANCE_Z - 0.5), 0.005), 2, 64, None),
        ("a_speed_up_is_not_carry_over", _carry(-0.02, 0.002, -0.005), 2, 64, None),
        ("unknown_shift", _carry(0.02, 0.002, None), 2, 64, None),
        ("no_estimate", _carry(None, None, 0.005), 2, 64, None),
    ],
)
def test_next_rewarm(case: str, carry: Carryover, current: int, maximum: int, expected: int | None) -> None:
    assert next_rewarm(carry, current=current, limit=0.002, maximum=maximum) == expected


def test_to_dict_is_json_ready() -> None:
    import json

    rng = np.random.default_rng(1)
    visits = _visits(rng, 0.01, rounds=10)
    data = estimate_carryover(visits, _shared(visits)).to_dict()
    assert set(data) == {"per_g", "largest_saving_shift"} and json.dumps(data)


def test_each_rewarm_level_gets_its_own_effect() -> None:
    """A longer re-warm cuts the slowdown: the G states the effect at its last level, and a cell's
    shift weighs each visit with its own level's effect."""
    native, compact, big, small = CellSpec(4, 0, K), CellSpec(4, 5, K), CellSpec(8, 0, K), CellSpec(2, 0, K)
    visits = []
    for r in range(80):
        rewarm, slow = (2, 0.02) if r < 40 else (8, 0.002)
        for cell in (native, compact):
            after = (r + (cell is compact)) % 2 == 0
            visits.append(
                VisitRecord(cell, r, r // 20, slow * after + 1e-4 * (r % 3), big if after else small, rewarm)
            )
    carry = estimate_carryover(visits, {})
    assert carry.per_g[4].effect == pytest.approx(0.002, abs=5e-4)
    assert carry.cell_shift[native] == pytest.approx(0.5 * (0.02 + 0.002) / 2, abs=1e-3)
