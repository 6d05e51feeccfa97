"""An interleaved sequence timed step by step agrees with each step timed alone (``--interleave``).

Two steps of different cost (matrix products of two sizes on a GPU, sleeps on the CPU) run in one random interleaving through
:meth:`~dspark_calibrate.calibrate.measurement.timing.SequenceTimer.measure_sequence`; each step's
median over the sequence must match its median timed on its own (:meth:`measure`, back-to-back
replays of one step), the telemetry callback must come in order and end on the last step, and the
sequence must run in the order asked (each step writes its index to a log tensor).

On a GPU the timer is :class:`CudaEventTimer` (an event between every two steps, chunks queued
ahead of the waits); on the CPU it is :class:`HostTimer`, so CI covers the same contract::

    PYTHONPATH=src python3 -m pytest tests/gpu/test_sequence_timer.py -q
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from dspark_calibrate.calibrate.measurement.order import interleaved_steps
from dspark_calibrate.calibrate.measurement.timing import CudaEventTimer, HostTimer, SequenceTimer

torch = pytest.importorskip("torch")

CUDA = torch.cuda.is_available()
#: How far a step's median in the sequence may be from its median alone: a GPU runs both the same
#: way; the CPU's steps sleep (a shared CPU moves computed steps by tens of percent).
REL = 0.1 if CUDA else 0.3


def _steps(log: list[int]) -> list[Callable[[], object]]:
    """Two steps, the second 4-8x the first: matrix products of two sizes on a GPU (about 0.2 and
    1.5 ms on an H200), sleeps of 1 and 4 ms on the CPU."""
    out = []
    for index, (n, sleep_s) in enumerate(((2048, 0.001), (4096, 0.004))):
        if CUDA:
            a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

            def work(a: object = a, b: object = b) -> object:
                c = a
                for _ in range(4):
                    c = torch.matmul(c, b) * 0.01  # type: ignore[operator]
                return c

        else:

            def work(sleep_s: float = sleep_s) -> object:
                time.sleep(sleep_s)
                return None

        def step(work: Callable[[], object] = work, index: int = index) -> object:
            log.append(index)
            return work()

        out.append(step)
    return out


def _timer() -> SequenceTimer:
    if CUDA:
        return CudaEventTimer(torch.cuda.Stream())
    return HostTimer()


def test_a_sequence_times_each_step_as_it_runs_alone() -> None:
    log: list[int] = []
    steps = _steps(log)
    timer = _timer()
    assert isinstance(timer, SequenceTimer)
    for step in steps:
        timer.warm(step, 10)
    alone = [float(np.median(timer.measure(step, replays=1, samples=60))) for step in steps]
    order = interleaved_steps([120, 120], np.random.default_rng(3))
    chunks: list[int] = []
    log.clear()
    ms = timer.measure_sequence(steps, order, chunk=8, on_chunk=chunks.append)
    assert log == order  # the steps ran in the order asked
    assert len(ms) == len(order) and all(m > 0 for m in ms)
    assert chunks == sorted(chunks) and chunks[-1] == len(order) - 1
    assert all(b - a <= 8 for a, b in zip([-1, *chunks], chunks, strict=False))
    for index, expected in enumerate(alone):
        mine = float(np.median([m for m, i in zip(ms, order, strict=True) if i == index]))
        assert mine == pytest.approx(expected, rel=REL), (index, mine, expected)
    # The larger step is the slower one in both.
    assert alone[1] > 2 * alone[0]


@pytest.mark.parametrize(("steps", "order", "chunk"), [(1, [1], 4), (2, [0, -1], 4), (2, [0, 1], 0)])
def test_a_sequence_refuses_what_it_cannot_run(steps: int, order: list[int], chunk: int) -> None:
    with pytest.raises(ValueError):
        _timer().measure_sequence([lambda: None] * steps, order, chunk=chunk)


def test_an_empty_sequence_times_nothing() -> None:
    calls: list[int] = []
    assert _timer().measure_sequence([lambda: None], [], chunk=4, on_chunk=calls.append) == []
