"""The sweep backends as the runtime sentinel's backends (``runtime_plugin.sentinel``).

The admission sentinel re-measures a few cells of a verified cost table on the serving host. The
runtime plugin never imports the calibration stack, so the caller hands it a loader:
``SentinelPolicy(backend="trtllm", loader=load_sentinel_backend)``. The loader builds the named
sweep backend (:func:`~dspark_calibrate.calibrate.measurement.backends.load_backend`) and times
cells with that backend's own timer, exactly as a sweep would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dspark_calibrate.calibrate.measurement.backends import Backend, load_backend
from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.calibrate.measurement.timing import Timer
from dspark_calibrate.runtime_plugin.sentinel import SentinelBackend

__all__ = ["SweepSentinelBackend", "load_sentinel_backend"]


class SweepSentinelBackend:
    """A sweep backend seen through the sentinel's :class:`SentinelBackend` protocol."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend
        self._timer: Timer | None = None

    @property
    def synthetic(self) -> bool:
        """True when the wrapped backend models its times."""
        return bool(self._backend.synthetic)

    def measure(
        self,
        graph_batch_size: int,
        verifier_budget: int,
        max_draft_len: int,
        *,
        warmup: int,
        replays: int,
        samples: int,
    ) -> list[float]:
        """Prepare the cell, warm it up and time ``samples`` samples of ``replays`` steps (ms)."""
        if self._timer is None:
            self._timer = self._backend.timer()
        step = self._backend.prepare(CellSpec(graph_batch_size, verifier_budget, max_draft_len))
        if warmup:
            self._timer.warm(step, warmup)
        return list(self._timer.measure(step, replays=replays, samples=samples))

    def close(self) -> None:
        """Close the wrapped backend."""
        self._backend.close()


def load_sentinel_backend(spec: str, options: Mapping[str, Any]) -> SentinelBackend:
    """The sentinel loader for sweep backends: :func:`load_backend` wrapped for the sentinel.

    Raises:
        ConfigError: unknown backend, failed import or options the factory does not accept.
    """
    return SweepSentinelBackend(load_backend(spec, options))
