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

The optional ``mixed_factory`` (``pkg.mod:fn``, called as ``fn(shape, **options)`` with a
:class:`~dspark_calibrate.calibrate.measurement.mixed.MixedShape`: K, the body capacity, the
rank's context chunks and generation requests and the rows each generation verifies) builds one
rank's mixed prefill+decode step for ``sweep --mixed``. The optional ``mixed_check``
(``pkg.mod:fn``, called as ``fn(native_shape, candidate_shape, **options)``) returns
``(rows, mismatches)``: how many verified generation rows the two forwards compare and how many
of their greedy tokens disagree (the accuracy evidence of a mixed receipt).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dspark_calibrate.calibrate.measurement.backends import BackendBase, resolve_factory
from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec
from dspark_calibrate.calibrate.measurement.mixed import MixedShape, OutputCheck
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
        mixed_factory: optional ``pkg.mod:fn`` building a mixed step as ``fn(shape, **options)``.
        mixed_check: optional ``pkg.mod:fn`` comparing a cell's outputs with its native arm's.
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
        mixed_factory: str | None = None,
        mixed_check: str | None = None,
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
        self._mixed_spec, self._check_spec = mixed_factory, mixed_check
        self._mixed = self._callable(mixed_factory, "mixed_factory")
        self._check = self._callable(mixed_check, "mixed_check")

    @staticmethod
    def _callable(spec: str | None, what: str) -> Callable[..., Any] | None:
        if spec is None:
            return None
        fn = resolve_factory(spec) if ":" in spec else None
        if not callable(fn):
            raise ConfigError(f"{what} {spec!r} must name a callable as pkg.mod:fn")
        return fn  # type: ignore[no-any-return]  # checked callable above

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

    def prepare_mixed(self, shape: MixedShape) -> Step:
        """``mixed_factory(shape, **options)``, checked to be callable.

        Raises:
            ConfigError: no mixed factory, or it returned something that is not callable.
        """
        if self._mixed is None:
            raise ConfigError("mixed cells need --backend-opt mixed_factory=pkg.mod:fn")
        step = self._mixed(shape, **self._options)
        if not callable(step):
            raise ConfigError(
                f"mixed_factory {self._mixed_spec} returned {type(step).__name__}; expected a callable"
            )
        return step  # type: ignore[no-any-return]  # checked callable above

    def check_mixed(self, native: MixedShape, candidate: MixedShape) -> OutputCheck:
        """``mixed_check(native, candidate, **options)`` → (rows, mismatches); (0, 0) without one.

        Raises:
            ConfigError: the check returned something other than two non-negative integers.
        """
        if self._check is None:
            return OutputCheck(0, 0, "no mixed_check given: outputs not compared")
        result = self._check(native, candidate, **self._options)
        if (
            not isinstance(result, tuple)
            or len(result) != 2
            or not all(type(x) is int and x >= 0 for x in result)
            or result[1] > result[0]
        ):
            raise ConfigError(
                f"mixed_check {self._check_spec} must return (rows, mismatches), got {result!r}"
            )
        return OutputCheck(result[0], result[1], f"compared by {self._check_spec}")

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
            "mixed_factory": self._mixed_spec,
            "mixed_check": self._check_spec,
        }
