"""The control cell as a bias check, and clock and power relative to the native cell."""

from __future__ import annotations

import math

import pytest

from dspark_calibrate.calibrate.measurement.controls import (
    ControlBias,
    control_biases,
    relative_to_native,
    widen_saving,
)
from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.calibrate.measurement.stats import CellSummary

K = 3


def _summary(cell: CellSpec, saving: float, low: float, high: float, paired: int = 8) -> CellSummary:
    return CellSummary(
        cell, 10.0, 9.9, 10.1, 9.8, 10.2, 0.1, 16, 8, "x",
        saving=saving, saving_ci_low=low, saving_ci_high=high, paired_rounds=paired,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("case", "bias", "excludes", "widening"),
    [
        ("zero_inside", ControlBias(8, 0.001, -0.004, 0.006), False, 0.0),
        ("biased_high", ControlBias(128, 0.0095, 0.0015, 0.0175), True, -math.log1p(-0.0175)),
        ("biased_low", ControlBias(8, -0.01, -0.02, -0.001), True, math.log1p(0.02)),
        ("touching_zero", ControlBias(8, 0.005, 0.0, 0.01), False, 0.0),
    ],
)
def test_a_control_is_biased_when_its_interval_excludes_zero(
    case: str, bias: ControlBias, excludes: bool, widening: float
) -> None:
    assert bias.excludes_zero is excludes
    assert bias.widening == pytest.approx(widening)


def test_widening_keeps_the_point_and_covers_the_old_interval_by_the_bias() -> None:
    cell = CellSpec(128, 384, K)
    s = _summary(cell, 0.10, 0.095, 0.105)
    bias = ControlBias(128, 0.0095, 0.0015, 0.0175)
    w = widen_saving(s, bias)
    assert w.saving == s.saving and "control_widened" in w.warnings
    assert w.saving_ci_low < s.saving_ci_low - 0.015 and w.saving_ci_high > s.saving_ci_high + 0.015
    # Widened on the log-ratio scale: the bounds move by exactly the control's widening there.
    assert math.log1p(-w.saving_ci_low) - math.log1p(-s.saving_ci_low) == pytest.approx(bias.widening)
    assert math.log1p(-s.saving_ci_high) - math.log1p(-w.saving_ci_high) == pytest.approx(bias.widening)
    assert w.saving_ci_high < 1.0
    assert widen_saving(s, ControlBias(128, 0.001, -0.004, 0.006)) is s


def test_control_biases_come_from_paired_control_cells_only() -> None:
    summaries = {
        CellSpec(8, 0, K): _summary(CellSpec(8, 0, K), 0.0, 0.0, 0.0),
        CellSpec(8, 32, K): _summary(CellSpec(8, 32, K), 0.002, -0.003, 0.007),
        CellSpec(8, 20, K): _summary(CellSpec(8, 20, K), 0.1, 0.09, 0.11),
        CellSpec(16, 64, K): _summary(CellSpec(16, 64, K), 0.02, 0.0, 0.04, paired=0),  # unpaired
        CellSpec(32, 128, K): None,  # not measured
    }
    assert control_biases(summaries) == {8: ControlBias(8, 0.002, -0.003, 0.007)}


def test_relative_to_native() -> None:
    values = {
        CellSpec(8, 0, K): 1750.0,
        CellSpec(8, 20, K): 1785.0,
        CellSpec(8, 24, K): None,
        CellSpec(16, 40, K): 1800.0,  # its native cell has no reading
        CellSpec(16, 0, K): None,
    }
    rel = relative_to_native(values)
    assert rel[CellSpec(8, 0, K)] == 1.0
    assert rel[CellSpec(8, 20, K)] == pytest.approx(1.02)
    assert rel[CellSpec(8, 24, K)] is None and rel[CellSpec(16, 40, K)] is None
