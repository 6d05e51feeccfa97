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
    "DEFAULT_THROTTLE_POLICY",
    "THROTTLE_DROP_MASK",
    "THROTTLE_POLICIES",
    "NullTelemetry",
    "NvmlTelemetry",
    "Telemetry",
    "TelemetrySample",
    "drop_mask",
    "open_telemetry",
    "reason_names",
]

# NVML clocks-event (throttle) reason bits, from nvml.h (nvmlClocksEventReason*).
_GPU_IDLE = 0x1
_APPLICATIONS_CLOCKS = 0x2
SW_POWER_CAP = 0x4
_HW_SLOWDOWN = 0x8
_SYNC_BOOST = 0x10
_SW_THERMAL = 0x20
_HW_THERMAL = 0x40
_HW_POWER_BRAKE = 0x80
_DISPLAY_CLOCK = 0x100
#: Readable names of the reason bits, for messages.
REASON_NAMES: dict[int, str] = {
    _GPU_IDLE: "gpu_idle",
    _APPLICATIONS_CLOCKS: "applications_clocks",
    SW_POWER_CAP: "sw_power_cap",
    _HW_SLOWDOWN: "hw_slowdown",
    _SYNC_BOOST: "sync_boost",
    _SW_THERMAL: "sw_thermal",
    _HW_THERMAL: "hw_thermal",
    _HW_POWER_BRAKE: "hw_power_brake",
    _DISPLAY_CLOCK: "display_clock",
}
#: Every reason that slows the clocks: power capping, thermal and hardware slowdowns. GPU idle,
#: application clocks, sync boost and display clock are informational and never drop a sample.
THROTTLE_DROP_MASK = SW_POWER_CAP | _HW_SLOWDOWN | _SW_THERMAL | _HW_THERMAL | _HW_POWER_BRAKE
#: Which throttled samples a sweep drops (DESIGN §7). A GPU serving at high concurrency runs at
#: its power cap, so ``serving`` (the default) keeps power-capped samples: that is the steady state
#: the cost table must describe. Thermal and hardware slowdowns are faults of the moment, not the
#: serving condition, and are dropped. ``strict`` drops every slowdown (an uncapped bench);
#: ``keep-all`` drops nothing (when the engine's own serving runs are not filtered either).
THROTTLE_POLICIES: dict[str, int] = {
    "serving": THROTTLE_DROP_MASK & ~SW_POWER_CAP,
    "strict": THROTTLE_DROP_MASK,
    "keep-all": 0,
}
DEFAULT_THROTTLE_POLICY = "serving"


def drop_mask(policy: str) -> int:
    """The reason bits whose samples ``policy`` drops.

    Raises:
        KeyError: unknown policy (callers validate names against :data:`THROTTLE_POLICIES`).
    """
    return THROTTLE_POLICIES[policy]


def reason_names(bits: int) -> list[str]:
    """Names of the set reason bits, e.g. ``["sw_power_cap"]`` (unknown bits as hex)."""
    names = [name for bit, name in sorted(REASON_NAMES.items()) if bits & bit]
    unknown = bits & ~sum(REASON_NAMES)
    if unknown:
        names.append(hex(unknown))
    return names


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

    @property
    def power_capped(self) -> bool:
        """True when the SW power cap is set (the steady state of a serving GPU)."""
        return bool(self.throttle_reasons is not None and self.throttle_reasons & SW_POWER_CAP)


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
