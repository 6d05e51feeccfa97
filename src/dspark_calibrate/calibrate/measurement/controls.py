"""Bias checks a sweep gets for free: the control cell of each G, and each cell's clock and power
relative to its native cell.

Pure: summaries and telemetry medians in, plain values out.

The control cell (V = G·(K+1)) runs the native step's full width again, through its own capture:
whatever separates it from the native cell is not a saving but a bias of the measurement (a
capture's memory placement, the clock state the two cells meet, the order they are visited in).
Its saving must therefore be 0 within its interval. Where it is not, the compact cells of that G,
captured the same way, may carry the same bias; their saving intervals are widened on both sides
by the largest saving the control's interval allows (:func:`widen_saving`), and the sweep says so
per cell (``control_widened``) and per G (``control_bias``).

Under a power cap a lighter cell runs at a higher SM clock than its native cell (on an H200,
+1.1..+4.0% for compact cells); :func:`relative_to_native` states that scaling per cell, for the
clock and the power draw alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec
from dspark_calibrate.calibrate.measurement.mixed import Cell
from dspark_calibrate.calibrate.measurement.stats import CellSummary

__all__ = ["ControlBias", "control_biases", "relative_to_native", "widen_saving"]


@dataclass(frozen=True, slots=True)
class ControlBias:
    """The saving of one G's control cell against its native cell, with its 95% interval.

    Attributes:
        graph_batch_size: G.
        bias, low, high: the control's saving and interval (0 is the truth).
    """

    graph_batch_size: int
    bias: float
    low: float
    high: float

    @property
    def excludes_zero(self) -> bool:
        """True when 0 lies outside the interval: the measurement of this G is biased."""
        return self.low > 0.0 or self.high < 0.0

    @property
    def widening(self) -> float:
        """How far (log-ratio units) the G's compact saving intervals are widened on each side: the
        largest |log-ratio| the control's interval allows when it excludes 0, else 0."""
        if not self.excludes_zero:
            return 0.0
        return max(abs(math.log1p(-self.low)), abs(math.log1p(-self.high)))

    def to_dict(self) -> dict[str, float | bool]:
        """JSON-ready form."""
        return {
            "control_bias": self.bias,
            "ci_low": self.low,
            "ci_high": self.high,
            "widened": self.excludes_zero,
        }


def control_biases(summaries: Mapping[Cell, CellSummary | None]) -> dict[int, ControlBias]:
    """The control bias of every G whose control cell has a paired saving."""
    out: dict[int, ControlBias] = {}
    for cell, s in summaries.items():
        if isinstance(cell, CellSpec) and cell.kind is CellKind.CONTROL and s is not None and s.paired_rounds:
            out[cell.graph_batch_size] = ControlBias(
                cell.graph_batch_size, s.saving, s.saving_ci_low, s.saving_ci_high
            )
    return out


def widen_saving(summary: CellSummary, bias: ControlBias) -> CellSummary:
    """``summary`` with its saving interval widened by the control's bias (log-ratio scale, both
    sides) and the ``control_widened`` warning; unchanged when the control is unbiased."""
    w = bias.widening
    if w == 0.0:
        return summary
    # Saving = 1 − exp(log-ratio): the interval's low end is the log-ratio's high end.
    low = 1.0 - math.exp(math.log1p(-summary.saving_ci_low) + w)
    high = 1.0 - math.exp(math.log1p(-summary.saving_ci_high) - w)
    return replace(
        summary, saving_ci_low=low, saving_ci_high=high, warnings=(*summary.warnings, "control_widened")
    )


def relative_to_native(values: Mapping[Cell, float | None]) -> dict[Cell, float | None]:
    """Each cell's value over its native cell's (1.0 for a native cell; None where either is missing)."""
    out: dict[Cell, float | None] = {}
    for cell, value in values.items():
        native = values.get(cell.native)
        out[cell] = None if value is None or not native else value / native
    return out
