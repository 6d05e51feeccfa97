"""Sweep backends for sentinel tests, loaded by import string like real ones.

``ScaledBackend`` reproduces the step times of ``tests.factories.cost_rows`` times a factor, on a
virtual clock (nothing is executed), so a test chooses whether the live host agrees with the signed
table. ``FailingBackend`` raises ``MeasurementError`` when a cell is prepared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dspark_calibrate.calibrate.measurement.backends import BackendBase
from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.calibrate.measurement.timing import Step, Timer
from dspark_calibrate.errors import MeasurementError


def table_time_ms(cell: CellSpec) -> float:
    """The step time ``cost_rows`` stores for a cell."""
    g, v, k = cell.graph_batch_size, cell.verifier_budget, cell.k
    tokens = g * (k + 1) if v == 0 else v
    return 5.0 + 0.01 * tokens + 0.001 * g


class _FixedStep:
    def __init__(self, ms: float) -> None:
        self.ms = ms
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


class _VirtualTimer:
    """Each sample is the step's modelled time; warm-up and timing only count calls."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def warm(self, step: Step, replays: int) -> None:
        for _ in range(replays):
            step()

    def measure(
        self, step: Step, *, replays: int, samples: int, on_sample: Callable[[int], None] | None = None
    ) -> list[float]:
        assert isinstance(step, _FixedStep)
        out = []
        for i in range(samples):
            for _ in range(replays):
                step()
            self.t += step.ms * replays / 1e3
            out.append(step.ms)
            if on_sample is not None:
                on_sample(i)
        return out


class ScaledBackend(BackendBase):
    """Step times of the factory cost table multiplied by ``scale``."""

    name = "scaled-fake"
    synthetic = False

    def __init__(self, scale: float = 1.0, synthetic: bool = False) -> None:
        self.scale = scale
        self.synthetic = synthetic
        self.prepared: list[tuple[int, int]] = []
        self.closed = False

    def prepare(self, cell: CellSpec) -> Step:
        self.prepared.append((cell.graph_batch_size, cell.verifier_budget))
        return _FixedStep(table_time_ms(cell) * self.scale)

    def timer(self) -> Timer:
        return _VirtualTimer()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "scale": self.scale}

    def close(self) -> None:
        self.closed = True


class FailingBackend(BackendBase):
    """A backend whose device went away."""

    name = "failing-fake"
    synthetic = False

    def prepare(self, cell: CellSpec) -> Step:
        raise MeasurementError(f"cell {cell}: CUDA graph capture failed (device lost)")
