"""Timers: how one sample of a step is timed. Injected into the harness (STYLE rule 12).

A timer owns the notion of time a sweep runs on: :meth:`Timer.now` feeds the per-cell caps and the
total budget, :meth:`Timer.measure` times samples. :class:`HostTimer` uses a host clock plus an
optional synchronisation callable (CPU backends, and tests with a fake clock); :class:`CudaEventTimer`
records CUDA events on the engine stream around back-to-back replays. This module imports torch only
inside :class:`CudaEventTimer`.

Both also time each sample's first replay on its own (:class:`SplitTimer`). A sample starts on an
idle device (the previous sample was waited for), so its first replay also pays what the host
needs to launch it, while the replays behind it are queued as the first runs. The first replay is
the step of a serving loop that waits for every step's result before launching the next; the rest
are the step of one that launches ahead (docs/sweep.md, "Step protocol").

Both also time an interleaved sequence of several steps one step at a time
(:class:`SequenceTimer`): the sweep's ``--interleave`` visits run a G's cells in one alternating
sequence, as a policy alternates them, so every cell is timed at the clock the mix runs at rather
than the clock it would settle to alone under a power cap.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from dspark_calibrate.errors import InvalidValueError

__all__ = ["CudaEventTimer", "HostTimer", "SequenceTimer", "SplitTimer", "Step", "Timer"]


class Step(Protocol):
    """One whole decode step of a prepared cell (a graph replay on GPU backends)."""

    def __call__(self) -> object:
        """Run (enqueue) one step."""
        ...


class Timer(Protocol):
    """Times samples of a step; see the module docstring."""

    def now(self) -> float:
        """Seconds on the timer's monotonic clock."""
        ...

    def warm(self, step: Step, replays: int) -> None:
        """Run ``replays`` untimed steps and wait for them to finish."""
        ...

    def measure(
        self, step: Step, *, replays: int, samples: int, on_sample: Callable[[int], None] | None = None
    ) -> list[float]:
        """Time ``samples`` samples, each the mean of ``replays`` back-to-back steps, in ms.

        ``on_sample(i)`` is called after sample ``i`` has completed (device synchronised), so
        telemetry read there belongs to that sample.
        """
        ...


@runtime_checkable
class SplitTimer(Timer, Protocol):
    """A timer that also times each sample's first replay on its own (module docstring)."""

    def measure_split(
        self, step: Step, *, replays: int, samples: int, on_sample: Callable[[int], None] | None = None
    ) -> list[tuple[float, float]]:
        """Per sample, ``(mean ms over its replays, ms of its first replay)``; otherwise as
        :meth:`Timer.measure`."""
        ...


@runtime_checkable
class SequenceTimer(Timer, Protocol):
    """A timer that times a sequence of steps of several cells, one step at a time."""

    def measure_sequence(
        self,
        steps: Sequence[Step],
        order: Sequence[int],
        *,
        chunk: int,
        on_chunk: Callable[[int], None] | None = None,
    ) -> list[float]:
        """Run ``steps[order[0]], steps[order[1]], ...`` back to back and return each one's ms.

        ``on_chunk(i)`` is called once steps ``0..i`` have completed, at least every ``chunk``
        steps and after the last one, so telemetry read there belongs to the steps just before.
        """
        ...


def _check_sequence(steps: Sequence[Step], order: Sequence[int], chunk: int) -> None:
    if chunk < 1:
        raise InvalidValueError(f"chunk must be >= 1, not {chunk}")
    bad = sorted({i for i in order if not 0 <= i < len(steps)})
    if bad:
        raise InvalidValueError(f"order names steps {bad} of {len(steps)}")


def _no_sync() -> None:
    return None


class HostTimer:
    """Host-clock timer: synchronise, read the clock, run the replays, synchronise, read again.

    Args:
        clock: seconds, monotonic (``time.perf_counter`` by default; a fake clock in tests).
        sync: waits for queued work (``torch.cuda.synchronize`` for a GPU timed from the host).
    """

    def __init__(
        self, clock: Callable[[], float] = time.perf_counter, sync: Callable[[], object] = _no_sync
    ) -> None:
        self._clock = clock
        self._sync = sync

    def now(self) -> float:
        """Seconds on the host (or fake) clock."""
        return self._clock()

    def warm(self, step: Step, replays: int) -> None:
        """Run untimed replays and synchronise."""
        for _ in range(replays):
            step()
        self._sync()

    def measure(
        self, step: Step, *, replays: int, samples: int, on_sample: Callable[[int], None] | None = None
    ) -> list[float]:
        """Time samples with the host clock; see :class:`Timer`."""
        return [m for m, _ in self.measure_split(step, replays=replays, samples=samples, on_sample=on_sample)]

    def measure_split(
        self, step: Step, *, replays: int, samples: int, on_sample: Callable[[int], None] | None = None
    ) -> list[tuple[float, float]]:
        """Time samples and each one's first replay with the host clock; see :class:`SplitTimer`.

        The clock is read once more, after the first replay is enqueued; on a device that runs
        asynchronously the host reading is only exact when ``sync`` waits after each replay, so
        GPU backends use :class:`CudaEventTimer`."""
        out: list[tuple[float, float]] = []
        for i in range(samples):
            self._sync()
            t0 = self._clock()
            step()
            t1 = self._clock()
            for _ in range(replays - 1):
                step()
            self._sync()
            t2 = self._clock()
            out.append(((t2 - t0) * 1000.0 / replays, (t1 - t0) * 1000.0))
            if on_sample is not None:
                on_sample(i)
        return out

    def measure_sequence(
        self,
        steps: Sequence[Step],
        order: Sequence[int],
        *,
        chunk: int,
        on_chunk: Callable[[int], None] | None = None,
    ) -> list[float]:
        """Time each step of the sequence with the host clock, synchronising around every step
        (exact on an asynchronous device, at the price of a wait per step); see
        :class:`SequenceTimer`."""
        _check_sequence(steps, order, chunk)
        out: list[float] = []
        self._sync()
        for i, index in enumerate(order):
            t0 = self._clock()
            steps[index]()
            self._sync()
            out.append((self._clock() - t0) * 1000.0)
            if on_chunk is not None and ((i + 1) % chunk == 0 or i == len(order) - 1):
                on_chunk(i)
        return out


class CudaEventTimer:
    """CUDA-event timer on one stream: events bracket the replays of each sample.

    Args:
        stream: the ``torch.cuda.Stream`` the graphs replay on (the engine stream).
        clock: host clock for budgets.
    """

    def __init__(self, stream: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        import torch

        self._torch = torch
        self._stream = stream
        self._clock = clock

    def now(self) -> float:
        """Seconds on the host clock."""
        return self._clock()

    def warm(self, step: Step, replays: int) -> None:
        """Run untimed replays on the stream and wait for them."""
        with self._torch.cuda.stream(self._stream):
            for _ in range(replays):
                step()
        self._stream.synchronize()

    def measure(
        self, step: Step, *, replays: int, samples: int, on_sample: Callable[[int], None] | None = None
    ) -> list[float]:
        """Time samples with CUDA events; see :class:`Timer`."""
        return [m for m, _ in self.measure_split(step, replays=replays, samples=samples, on_sample=on_sample)]

    def measure_split(
        self, step: Step, *, replays: int, samples: int, on_sample: Callable[[int], None] | None = None
    ) -> list[tuple[float, float]]:
        """Time samples with CUDA events, one more event after the first replay; see
        :class:`SplitTimer`. The extra event is recorded on the same stream between two replays:
        it adds no wait, and the sample's total is the same two events as without it."""
        torch = self._torch
        out: list[tuple[float, float]] = []
        with torch.cuda.stream(self._stream):
            for i in range(samples):
                start = torch.cuda.Event(enable_timing=True)
                first = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record(self._stream)
                step()
                first.record(self._stream)
                for _ in range(replays - 1):
                    step()
                end.record(self._stream)
                end.synchronize()
                out.append((float(start.elapsed_time(end)) / replays, float(start.elapsed_time(first))))
                if on_sample is not None:
                    on_sample(i)
        return out

    def measure_sequence(
        self,
        steps: Sequence[Step],
        order: Sequence[int],
        *,
        chunk: int,
        on_chunk: Callable[[int], None] | None = None,
    ) -> list[float]:
        """An event between every two consecutive steps on the stream; see :class:`SequenceTimer`.

        The host enqueues a chunk before it waits for the end of the chunk before it, so the
        device always has work queued and never idles for the host: each step's time is the
        device's time between its neighbours' events, as in a serving loop that launches ahead.
        """
        _check_sequence(steps, order, chunk)
        torch = self._torch
        if not order:
            return []
        events = [torch.cuda.Event(enable_timing=True) for _ in range(len(order) + 1)]
        with torch.cuda.stream(self._stream):
            for start in range(0, len(order), chunk):
                stop = min(start + chunk, len(order))
                for i in range(start, stop):
                    events[i].record(self._stream)
                    steps[order[i]]()
                if start:
                    events[start].synchronize()  # the chunk before this one has finished
                    if on_chunk is not None:
                        on_chunk(start - 1)
            events[-1].record(self._stream)
        events[-1].synchronize()
        if on_chunk is not None:
            on_chunk(len(order) - 1)
        return [float(events[i].elapsed_time(events[i + 1])) for i in range(len(order))]
