"""Runtime plugin: the live fingerprint, the admission hook, the reference selector, engine adapters.

Light by design: importing this package pulls in neither torch nor ``dspark_calibrate.calibrate``
(a serving process must not pay for what it does not use); ``choose_planner`` loads the device
planners (``runtime_plugin.device_planner`` and ``fused_planner``, torch) only when asked for
one, and so does reading ``DevicePlanner``, ``ServingPlanner`` or ``FusedServingPlanner`` from
this package (``from dspark_calibrate.runtime_plugin import *`` therefore imports torch). ``admit`` never
raises: on any doubt it returns an inactive decision with a reason code and the static-K engine configuration.

May import: ``artifacts``, ``schemas``, ``decision`` and ``errors``; never ``calibrate``. What it
needs from above at run time is handed to it: a sentinel's backend comes from
``SentinelPolicy.loader`` (``calibrate.measurement.load_sentinel_backend`` for the sweep backends).
``calibrate`` in turn replays this package's pure planner and economics, so build and serving
cannot disagree. Modules: ``admission`` (the hook), ``admission_decision`` (its record),
``economics`` (the signed summary and the gain test), ``planner`` (selector and allocator),
``engine`` and ``trtllm`` (adapters), ``device_planner`` (the selector and allocator on the
device: torch, loaded on request), ``fused_planner`` (the device planner inside the engine's cell
graphs: the one ``choose_planner`` returns on CUDA), ``live``, ``sentinel``, ``ranks``.

Example:
    >>> from dspark_calibrate.runtime_plugin import admit, collect_live
    >>> decision = admit("bundle/", "trust-root.json", live={"max_draft_len": 5})  # doctest: +SKIP
    >>> decision.active, decision.reason_code  # doctest: +SKIP
    (False, 'FINGERPRINT_MISSING:gpu')
"""

import importlib
from typing import TYPE_CHECKING, Any

from dspark_calibrate.runtime_plugin.admission import AdmissionPolicy, admit
from dspark_calibrate.runtime_plugin.admission_decision import STATIC_ENGINE_CONFIG, AdmissionDecision
from dspark_calibrate.runtime_plugin.economics import AdmissionEconomics, GainStatus, GainVerdict
from dspark_calibrate.runtime_plugin.engine import (
    PLANNER_MODES,
    DynamicVerifier,
    PlannerChoice,
    choose_planner,
)
from dspark_calibrate.runtime_plugin.live import (
    GpuInfo,
    LiveContext,
    LiveEnvironment,
    SystemEnvironment,
    collect_live,
)
from dspark_calibrate.runtime_plugin.planner import (
    Calibration,
    CostTable,
    DrainGuard,
    Plan,
    StepRows,
    allocate,
    plan,
    select,
)
from dspark_calibrate.runtime_plugin.ranks import agree
from dspark_calibrate.runtime_plugin.sentinel import (
    SentinelBackend,
    SentinelLoader,
    SentinelPolicy,
    SentinelReport,
)
from dspark_calibrate.runtime_plugin.trtllm import (
    TrtllmOptions,
    decoding_fields,
    llm_api_options,
    static_decoding_fields,
)

if TYPE_CHECKING:
    from dspark_calibrate.runtime_plugin.device_planner import DevicePlanner, ServingPlanner
    from dspark_calibrate.runtime_plugin.fused_planner import FusedServingPlanner

#: The serving planners on the device, public here but loaded (with torch) on first access.
_ON_REQUEST = {
    "DevicePlanner": "dspark_calibrate.runtime_plugin.device_planner",
    "ServingPlanner": "dspark_calibrate.runtime_plugin.device_planner",
    "FusedServingPlanner": "dspark_calibrate.runtime_plugin.fused_planner",
}

__all__ = [
    "PLANNER_MODES",
    "STATIC_ENGINE_CONFIG",
    "AdmissionDecision",
    "AdmissionEconomics",
    "AdmissionPolicy",
    "Calibration",
    "CostTable",
    "DevicePlanner",
    "DrainGuard",
    "DynamicVerifier",
    "FusedServingPlanner",
    "GainStatus",
    "GainVerdict",
    "GpuInfo",
    "LiveContext",
    "LiveEnvironment",
    "Plan",
    "PlannerChoice",
    "SentinelBackend",
    "SentinelLoader",
    "SentinelPolicy",
    "SentinelReport",
    "ServingPlanner",
    "StepRows",
    "SystemEnvironment",
    "TrtllmOptions",
    "admit",
    "agree",
    "allocate",
    "choose_planner",
    "collect_live",
    "decoding_fields",
    "llm_api_options",
    "plan",
    "select",
    "static_decoding_fields",
]


def __getattr__(name: str) -> Any:
    """The device planners, imported (with torch) when first read."""
    module = _ON_REQUEST.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ON_REQUEST))
