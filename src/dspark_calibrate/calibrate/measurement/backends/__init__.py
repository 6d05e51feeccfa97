"""Sweep backends: what turns a cell (G, V) into a step callable, and how backends are found.

A backend is small (:class:`Backend`): ``prepare(cell)`` returns a
:class:`~dspark_calibrate.calibrate.measurement.timing.Step`;
it also names the timer and telemetry that fit it, describes itself as JSON (that description
enters the sweep's configuration digest and provenance) and may contribute fingerprint fields it
can establish (GPU name, model config digest). :class:`BackendBase` supplies the defaults.

Two optional capabilities (attributes with defaults in :class:`BackendBase`):
``supports_forced_k`` — the backend can build the forced-K arm (V = −1: the engine's confidence
path on, every window forced to K), so the sweep measures the per-step overhead; ``recapture`` —
``prepare`` may be called again for a cell at the start of each capture epoch (``release(cell)``
is called first so the old graph can be freed).

Backends are found by :func:`load_backend` from a built-in name (``synthetic``, ``reference``,
``module``, ``trtllm``), an entry point in the group ``dspark_calibrate.backends``, or an import
string ``pkg.mod:Factory``; the factory is called with the backend options as keyword arguments.
Built-in backends import lazily, so the synthetic backend never imports torch.

Example:
    >>> from dspark_calibrate.calibrate.measurement.backends import load_backend
    >>> from dspark_calibrate.calibrate.measurement.ladder import CellSpec
    >>> backend = load_backend("synthetic", {"seed": 1})
    >>> step = backend.prepare(CellSpec(8, 0, 5))
    >>> backend.synthetic
    True
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.calibrate.measurement.telemetry import NullTelemetry, Telemetry
from dspark_calibrate.calibrate.measurement.timing import HostTimer, Step, Timer
from dspark_calibrate.errors import ConfigError

__all__ = [
    "BUILTIN_BACKENDS",
    "ENTRY_POINT_GROUP",
    "Backend",
    "BackendBase",
    "load_backend",
    "resolve_factory",
]

#: Entry-point group plugins register their backend factories under.
ENTRY_POINT_GROUP = "dspark_calibrate.backends"
#: Built-in backends by name → import string (imported only when asked for).
BUILTIN_BACKENDS: Mapping[str, str] = {
    "synthetic": "dspark_calibrate.calibrate.measurement.backends.synthetic:SyntheticBackend",
    "reference": "dspark_calibrate.calibrate.measurement.backends.reference:ReferenceBackend",
    "module": "dspark_calibrate.calibrate.measurement.backends.module:ModuleBackend",
    "trtllm": "dspark_calibrate.calibrate.measurement.backends.trtllm:TrtllmBackend",
}


@runtime_checkable
class Backend(Protocol):
    """What the sweep harness needs from a backend.

    Attributes:
        name: short name recorded in provenance.
        synthetic: True when the times are not measured on a real deployment.
    """

    name: str
    synthetic: bool

    def prepare(self, cell: CellSpec) -> Step:
        """Build (capture) the step of one cell; called before its first visit of every epoch."""
        ...

    def timer(self) -> Timer:
        """The timer that fits this backend's steps."""
        ...

    def telemetry(self) -> Telemetry:
        """Per-sample telemetry of the device this backend runs on."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON description; part of the sweep configuration digest."""
        ...

    def fingerprint_fields(self) -> dict[str, Any]:
        """Fingerprint fields this backend can establish (e.g. ``gpu``, ``model_config_sha256``)."""
        ...

    def close(self) -> None:
        """Release devices and graphs."""
        ...


class BackendBase:
    """Defaults for :class:`Backend`: host timer, no telemetry, empty description, no-op close.

    Subclasses set ``name`` and implement :meth:`prepare`.
    """

    name: str = "base"
    synthetic: bool = False
    #: The backend can build the forced-K arm (``CellKind.FORCED_K``) of every G.
    supports_forced_k: bool = False
    #: ``prepare`` may build a cell's step again (capture epochs).
    recapture: bool = True

    def release(self, cell: CellSpec) -> None:
        """Forget the step built for ``cell`` before it is prepared again (default: nothing)."""
        return None

    def begin(self, round_index: int) -> None:
        """Called once per process before it measures, with the round it starts at (0, or where
        a resumed journal or a later pass continues); default: nothing."""
        return None

    def prepare(self, cell: CellSpec) -> Step:
        """Build the step of one cell.

        Raises:
            NotImplementedError: always; subclasses implement it.
        """
        raise NotImplementedError(f"{type(self).__name__}.prepare")

    def timer(self) -> Timer:
        """A host-clock timer."""
        return HostTimer()

    def telemetry(self) -> Telemetry:
        """No telemetry."""
        return NullTelemetry()

    def describe(self) -> dict[str, Any]:
        """``{"name": ...}``."""
        return {"name": self.name}

    def fingerprint_fields(self) -> dict[str, Any]:
        """Nothing established."""
        return {}

    def close(self) -> None:
        """Nothing to release."""
        return None


def resolve_factory(spec: str) -> Any:
    """Resolve a backend name, entry point or ``pkg.mod:attr`` import string to its factory.

    Raises:
        ConfigError: unknown name, or the import failed (the message says which module).
    """
    target = BUILTIN_BACKENDS.get(spec)
    if target is None and ":" not in spec:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name == spec:
                try:
                    return ep.load()
                except (ImportError, AttributeError) as exc:
                    raise ConfigError(
                        f"backend entry point {spec!r} ({ep.value}) failed to load: {exc}"
                    ) from exc
        known = sorted(
            set(BUILTIN_BACKENDS)
            | {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
        )
        raise ConfigError(f"unknown backend {spec!r}; use one of {known} or an import string pkg.mod:Factory")
    target = target or spec
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"backend import string {spec!r} must look like pkg.mod:Factory")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"backend {spec!r}: cannot import {module_name!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"backend {spec!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


def load_backend(spec: str, options: Mapping[str, Any] | None = None) -> Backend:
    """Instantiate a backend from its name or import string with keyword options.

    Raises:
        ConfigError: unknown backend, failed import, options the factory does not accept, or a
            factory result that is not a :class:`Backend`.
    """
    factory = resolve_factory(spec)
    try:
        backend = factory(**dict(options or {}))
    except TypeError as exc:
        raise ConfigError(f"backend {spec!r} does not accept options {sorted(options or {})}: {exc}") from exc
    if not isinstance(backend, Backend):
        raise ConfigError(
            f"backend {spec!r} returned {type(backend).__name__}, which lacks the Backend methods"
        )
    return backend
