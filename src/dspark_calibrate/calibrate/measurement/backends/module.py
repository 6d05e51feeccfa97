"""The ``module`` backend: a user factory ``pkg.mod:factory`` builds the step of each cell.

The route for any engine: the factory is called as ``factory(G, V, K)`` (V = 0 for the native
cell) and returns a zero-argument callable that runs one whole decode step of that cell,
synchronously or on a device whose synchronisation the caller supplies with ``sync``. Options
given after the factory are passed to it as keyword arguments.

The optional ``forced_k_factory`` (``pkg.mod:fn``, called as ``fn(G, K, **options)``) builds the
forced-K arm of a G: one whole step with the engine's confidence path running (confidence
snapshot, selector, allocator, bookkeeping) but every window forced to K, so it verifies the full
block. The sweep measures it paired with the native cell; its excess is the per-step overhead that
``build`` charges (DESIGN §9).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dspark_calibrate.calibrate.measurement.backends import BackendBase, resolve_factory
from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec
from dspark_calibrate.calibrate.measurement.telemetry import Telemetry, open_telemetry
from dspark_calibrate.calibrate.measurement.timing import HostTimer, Step, Timer
from dspark_calibrate.errors import ConfigError

__all__ = ["ModuleBackend"]


class ModuleBackend(BackendBase):
    """Steps from a user factory.

    Args:
        factory: ``pkg.mod:callable`` import string.
        sync: optional ``pkg.mod:callable`` that waits for queued device work (e.g.
            ``torch.cuda:synchronize``); the host timer calls it around each sample.
        telemetry_device: NVML device index for telemetry, or ``None``.
        options: keyword arguments for the factory.
        forced_k_factory: optional ``pkg.mod:fn`` building the forced-K arm as ``fn(G, K, **options)``.
    """

    name = "module"
    synthetic = False

    def __init__(
        self,
        factory: str,
        sync: str | None = None,
        telemetry_device: int | None = None,
        options: Mapping[str, Any] | None = None,
        forced_k_factory: str | None = None,
    ) -> None:
        self._spec = factory
        fn = resolve_factory(factory) if ":" in factory else None
        if not callable(fn):
            raise ConfigError(f"--factory {factory!r} must name a callable as pkg.mod:factory")
        self._factory: Callable[..., Any] = fn
        self._sync_spec = sync
        self._sync: Callable[[], object] | None = resolve_factory(sync) if sync else None
        self._telemetry_device = telemetry_device
        self._options = dict(options or {})
        self._forced_spec = forced_k_factory
        self._forced: Callable[..., Any] | None = None
        if forced_k_factory is not None:
            fk = resolve_factory(forced_k_factory) if ":" in forced_k_factory else None
            if not callable(fk):
                raise ConfigError(f"forced_k_factory {forced_k_factory!r} must name a callable as pkg.mod:fn")
            self._forced = fk
        self.supports_forced_k = self._forced is not None

    def prepare(self, cell: CellSpec) -> Step:
        """``factory(G, V, K, **options)``, checked to be callable.

        Raises:
            ConfigError: the factory returned something that is not callable.
        """
        if cell.kind is CellKind.FORCED_K:
            if self._forced is None:
                raise ConfigError(
                    f"{cell.label()}: the forced-K arm needs --backend-opt forced_k_factory=pkg.mod:fn"
                )
            step = self._forced(cell.graph_batch_size, cell.k, **self._options)
        else:
            step = self._factory(cell.graph_batch_size, cell.verifier_budget, cell.k, **self._options)
        if not callable(step):
            raise ConfigError(
                f"factory {self._spec} returned {type(step).__name__} for {cell.label()}; expected a callable"
            )
        return step  # type: ignore[no-any-return]  # checked callable above

    def timer(self) -> Timer:
        """Host timer, synchronising with ``sync`` when given."""
        if self._sync is None:
            return HostTimer()
        return HostTimer(sync=self._sync)

    def telemetry(self) -> Telemetry:
        """NVML telemetry of ``telemetry_device`` when given and available."""
        return open_telemetry(self._telemetry_device)

    def describe(self) -> dict[str, Any]:
        """Factory, sync and options."""
        return {
            "name": self.name,
            "factory": self._spec,
            "sync": self._sync_spec,
            "options": self._options,
            "forced_k_factory": self._forced_spec,
        }
