"""GPU telemetry per sample through NVML (``pynvml`` from nvidia-ml-py), optional.

Reads the SM clock, temperature, power and throttle reasons of one device. When ``pynvml`` is not
installed or NVML cannot start (no driver, CPU host), :func:`open_telemetry` returns
:class:`NullTelemetry`, whose samples are all ``None`` and never throttled. A read that fails after
NVML started (a GPU that fell off the bus) raises :class:`~dspark_calibrate.errors.ProbeError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from dspark_calibrate.errors import ProbeError

__all__ = [
    "THROTTLE_DROP_MASK",
    "NullTelemetry",
    "NvmlTelemetry",
    "Telemetry",
    "TelemetrySample",
    "open_telemetry",
]

# NVML clocks-event (throttle) reason bits, from nvml.h (nvmlClocksEventReason*).
_SW_POWER_CAP = 0x4
_HW_SLOWDOWN = 0x8
_SW_THERMAL = 0x20
_HW_THERMAL = 0x40
_HW_POWER_BRAKE = 0x80
#: Reasons that make a sample unrepresentative: power capping, thermal and hardware slowdowns.
#: GPU idle (0x1), application clocks (0x2), sync boost (0x10) and display clock (0x100) are
#: informational and keep the sample.
THROTTLE_DROP_MASK = _SW_POWER_CAP | _HW_SLOWDOWN | _SW_THERMAL | _HW_THERMAL | _HW_POWER_BRAKE


@dataclass(frozen=True, slots=True)
class TelemetrySample:
    """One reading; ``None`` where the value is not available."""

    sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    throttle_reasons: int | None = None

    @property
    def throttled(self) -> bool:
        """True when a reason in :data:`THROTTLE_DROP_MASK` is set."""
        return bool(self.throttle_reasons is not None and self.throttle_reasons & THROTTLE_DROP_MASK)


class Telemetry(Protocol):
    """A per-sample telemetry source."""

    def read(self) -> TelemetrySample:
        """Read the device now."""
        ...

    def describe(self) -> str:
        """Where readings come from, e.g. ``nvml:0`` or ``none``."""
        ...


class NullTelemetry:
    """No telemetry: every reading is empty and unthrottled."""

    def read(self) -> TelemetrySample:
        """An empty reading."""
        return TelemetrySample()

    def describe(self) -> str:
        """``none``."""
        return "none"


class NvmlTelemetry:
    """NVML readings of one device.

    Args:
        pynvml: the imported ``pynvml`` module, already initialised.
        index: device index as NVML numbers them.
    """

    def __init__(self, pynvml: Any, index: int) -> None:
        self._nvml = pynvml
        self._index = index
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)

    def read(self) -> TelemetrySample:
        """Read clock, temperature, power and throttle reasons.

        Raises:
            ProbeError: NVML failed on a device that answered before.
        """
        n = self._nvml
        try:
            clock = n.nvmlDeviceGetClockInfo(self._handle, n.NVML_CLOCK_SM)
            temp = n.nvmlDeviceGetTemperature(self._handle, n.NVML_TEMPERATURE_GPU)
            power_mw = n.nvmlDeviceGetPowerUsage(self._handle)
            reasons_fn = (
                getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None)
                or n.nvmlDeviceGetCurrentClocksThrottleReasons
            )
            reasons = reasons_fn(self._handle)
        except n.NVMLError as exc:
            raise ProbeError(
                f"NVML read of GPU {self._index} failed mid-sweep: {exc}; is the GPU still present?"
            ) from exc
        return TelemetrySample(float(clock), float(temp), power_mw / 1000.0, int(reasons))

    def describe(self) -> str:
        """``nvml:<index>``."""
        return f"nvml:{self._index}"


def open_telemetry(index: int | None) -> Telemetry:
    """NVML telemetry for device ``index`` when available, else :class:`NullTelemetry`.

    Args:
        index: NVML device index; ``None`` asks for no telemetry.
    """
    if index is None:
        return NullTelemetry()
    try:
        import pynvml
    except ImportError:
        return NullTelemetry()
    try:
        pynvml.nvmlInit()
        return NvmlTelemetry(pynvml, index)
    except pynvml.NVMLError:
        return NullTelemetry()
