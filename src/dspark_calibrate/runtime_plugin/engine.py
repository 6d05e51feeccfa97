"""Generic engine adapter: the reference selector and allocator, bound to an admitted deployment.

For engines without an in-tree DSpark planner. A :class:`DynamicVerifier` can only be built from
an *active* admission decision, so every selection it makes rests on verified, bound evidence:
the signed cost table (exact cells, no interpolation), the signed calibration and the admission
artifact's drain guard and gain threshold. The selection rule itself is ``planner``'s (DESIGN §6).

:func:`choose_planner` returns the serving planner recommended for the device it gets: on CUDA the
fused, compiled device planner (:class:`~dspark_calibrate.runtime_plugin.fused_planner.FusedServingPlanner`,
imported only then), which runs inside the engine's own cell graphs; without torch or CUDA the
host planner, with a logged reason code.

Performs no I/O; numpy only (torch only inside :func:`choose_planner`).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from dspark_calibrate.artifacts import DRAIN_GUARD_FIELDS, Finding, Reason
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.admission_decision import AdmissionDecision
from dspark_calibrate.runtime_plugin.economics import AdmissionEconomics
from dspark_calibrate.runtime_plugin.planner import (
    DEFAULT_MIN_VERIFY_LEN,
    DEFAULT_MINIMUM_PREDICTED_GAIN,
    Calibration,
    CostTable,
    DrainGuard,
    Plan,
    Selection,
    StepRows,
    allocate,
    plan,
    select,
)

if TYPE_CHECKING:
    import pyarrow as pa

    from dspark_calibrate.runtime_plugin.device_planner import ServingPlanner
    from dspark_calibrate.runtime_plugin.fused_planner import FusedServingPlanner

__all__ = [
    "DRAIN_GUARD_FIELDS",
    "PLANNER_FALLBACK_FIELDS",
    "PLANNER_MODES",
    "DynamicVerifier",
    "PlannerChoice",
    "choose_planner",
    "planner_inputs",
]

logger = logging.getLogger(__name__)


def planner_inputs(
    cost_table: pa.Table,
    calibration: pa.Table,
    max_draft_len: int,
    economics: AdmissionEconomics | None,
    *,
    calibration_use: str = "sts",
) -> tuple[CostTable, Calibration]:
    """The selector's cost table and calibration from verified member tables. Pure.

    Args:
        cost_table: the verified ``cost-table`` rows.
        calibration: the verified ``calibration`` rows.
        max_draft_len: K.
        economics: the admission economics (gain threshold and drain guard); without them the
            selector never picks a compact cell.
        calibration_use: ``sts`` applies the per-position temperatures (what TensorRT-LLM
            applies); ``native`` each position's fitted map.

    Raises:
        ConfigError: the members do not form a valid selector input (e.g. a drain guard whose
            tail G has no measured native cell).
    """
    guard: DrainGuard | None = None
    gain = DEFAULT_MINIMUM_PREDICTED_GAIN
    if economics is not None:
        gain = economics.minimum_predicted_gain
        if economics.drain_guard is not None:
            raw: Mapping[str, Any] = economics.drain_guard
            missing = [f for f in DRAIN_GUARD_FIELDS if f not in raw]
            if missing:
                raise ConfigError(f"admission summary.drain_guard lacks {missing}")
            guard = DrainGuard.from_dict({f: raw[f] for f in DRAIN_GUARD_FIELDS})
    table = CostTable.from_arrow(cost_table, max_draft_len, minimum_predicted_gain=gain, drain_guard=guard)
    calib = Calibration.from_rows(calibration.to_pylist(), use=calibration_use)
    if calib.k != max_draft_len:
        raise ConfigError(f"calibration covers K={calib.k} positions, the cost table K={max_draft_len}")
    return table, calib


class DynamicVerifier:
    """The reference selector and allocator for one admitted deployment.

    Build with :meth:`from_decision`. Thread-safe: it holds only immutable inputs.
    """

    __slots__ = ("_calibration", "_digest", "_min_verify_len", "_table")

    def __init__(
        self, table: CostTable, calibration: Calibration, *, digest: str, min_verify_len: int
    ) -> None:
        self._table = table
        self._calibration = calibration
        self._digest = digest
        self._min_verify_len = min_verify_len

    @classmethod
    def from_decision(
        cls,
        decision: AdmissionDecision,
        *,
        min_verify_len: int = DEFAULT_MIN_VERIFY_LEN,
        calibration_use: str = "sts",
    ) -> DynamicVerifier:
        """Bind the selector to an active decision's verified members.

        Raises:
            RuntimeError: the decision is inactive (run static K instead) or lacks its members.
            ConfigError: the members do not form a valid selector input.
        """
        if not decision.active:
            raise RuntimeError(
                f"admission is inactive ({decision.reason_code}); run static K, a DynamicVerifier needs an "
                "active decision"
            )
        cost, calib = decision.cost_table, decision.calibration
        if cost is None or calib is None or cost.fingerprint.max_draft_len is None:
            raise RuntimeError("an active decision must carry its verified cost table and calibration")
        k = cost.fingerprint.max_draft_len
        if not 1 <= min_verify_len <= k:
            raise ConfigError(f"min_verify_len must be in [1, K={k}], got {min_verify_len}")
        table, calibration = planner_inputs(
            cost.table, calib.table, k, decision.economics, calibration_use=calibration_use
        )
        return cls(table, calibration, digest=decision.agreement_digest(), min_verify_len=min_verify_len)

    @property
    def cost_table(self) -> CostTable:
        """The selector's cost table (verified cells, gain threshold, drain guard)."""
        return self._table

    @property
    def calibration(self) -> Calibration:
        """The confidence calibration applied to the logits."""
        return self._calibration

    @property
    def max_draft_len(self) -> int:
        """K."""
        return self._table.max_draft_len

    @property
    def min_verify_len(self) -> int:
        """The verify floor every request keeps."""
        return self._min_verify_len

    @property
    def decision_digest(self) -> str:
        """The admission decision's agreement digest this verifier was built from."""
        return self._digest

    def select(self, rows: StepRows) -> Selection:
        """Choose one step's cell (``planner.select``)."""
        return select(self._table, self._calibration, rows, min_verify_len=self._min_verify_len)

    def allocate(self, rows: StepRows, graph_batch_size: int, verifier_budget: int) -> Plan:
        """Spread a given cell's budget over the rows (``planner.allocate``)."""
        return allocate(
            self._table,
            self._calibration,
            rows,
            graph_batch_size=graph_batch_size,
            verifier_budget=verifier_budget,
            min_verify_len=self._min_verify_len,
        )

    def plan(self, rows: StepRows) -> Plan:
        """Select and allocate one step (``planner.plan``)."""
        return plan(self._table, self._calibration, rows, min_verify_len=self._min_verify_len)


#: Fields of ``PLANNER_FALLBACK`` findings: what the device planner lacked.
PLANNER_FALLBACK_FIELDS: tuple[str, ...] = ("torch", "cuda", "device_init")

#: Serving modes of the device planner :func:`choose_planner` builds: ``fused`` (inside the
#: engine's cell graphs, the recommended one), ``lagged`` and ``sync`` (``ServingPlanner``, its own
#: graphs beside the engine's).
PLANNER_MODES: tuple[str, ...] = ("fused", "lagged", "sync")


@dataclass(frozen=True, slots=True)
class PlannerChoice:
    """The planner an engine runs and, for the host planner, why.

    Narrow ``planner`` with ``isinstance(choice.planner, DynamicVerifier)`` first: that test
    loads nothing, while the device planners' classes import torch.

    Attributes:
        kind: ``device`` or ``host``.
        planner: the host planner (:class:`DynamicVerifier`, kind ``host``) or a device serving
            planner (kind ``device``): a ``fused_planner.FusedServingPlanner`` (mode ``fused``)
            or a ``device_planner.ServingPlanner`` (modes ``lagged`` and ``sync``).
        fallback: why the host planner runs although the device one was asked for
            (``PLANNER_FALLBACK:torch``, ``:cuda`` or ``:device_init``), else None.
        message: one human line.
        mode: the device planner's serving mode (:data:`PLANNER_MODES`); None for the host planner.
    """

    kind: Literal["device", "host"]
    planner: DynamicVerifier | FusedServingPlanner | ServingPlanner
    fallback: Finding | None
    message: str
    mode: str | None = None

    @property
    def reason_code(self) -> str | None:
        """The fallback's reason code (``PLANNER_FALLBACK:<field>``), or None."""
        return None if self.fallback is None else self.fallback.code


def choose_planner(
    verifier: DynamicVerifier,
    *,
    prefer: str = "device",
    device: str | None = None,
    mode: str = "fused",
    dtype: str = "float64",
    compile: bool | None = None,
    num_ranks: int = 1,
    force_native: bool = False,
) -> PlannerChoice:
    """The serving planner recommended for ``verifier``'s deployment on the device it gets.

    On CUDA that is the fused, compiled device planner (docs/runtime.md, "Which planner"): the
    engine binds its buffers and captures its hooks into each cell's graph. Without torch or
    CUDA it is the host planner, which is also the better one on a CPU (torch's ops cost more
    than numpy's there), with a ``PLANNER_FALLBACK`` finding.

    Args:
        verifier: the admitted deployment's reference planner.
        prefer: ``device`` or ``host``.
        device: the torch device; None picks the current CUDA device and falls back to the host
            planner without one. ``cpu`` runs the device code on the CPU (tests, tools).
        mode: the device planner's serving mode (:data:`PLANNER_MODES`).
        dtype: the device planner's float type (``float64`` or ``float32``).
        compile: fuse the device planner's ranking and allocation with ``torch.compile`` (CUDA
            only); None compiles the fused mode's.
        num_ranks: ranks per step (the fused mode serves one).
        force_native: commit native every step while the whole confidence path runs (the
            release bracket's overhead arm).

    Returns:
        The choice; a fallback is logged once (WARNING, logger
        ``dspark_calibrate.runtime_plugin.engine``) with its reason code.

    Raises:
        ConfigError: ``prefer`` or ``mode`` is unknown, or a device planner argument is invalid
            (the same inputs the host planner would refuse; several ranks in the fused mode).
    """
    if prefer not in ("device", "host"):
        raise ConfigError(f"prefer must be 'device' or 'host', got {prefer!r}")
    if mode not in PLANNER_MODES:
        raise ConfigError(f"mode must be one of {PLANNER_MODES}, got {mode!r}")
    if prefer == "host":
        return PlannerChoice("host", verifier, None, "host planner requested")
    try:
        torch = importlib.import_module("torch")
        devices = importlib.import_module("dspark_calibrate.runtime_plugin.device_planner")
        fused = importlib.import_module("dspark_calibrate.runtime_plugin.fused_planner")
    except ImportError as exc:
        return _fallback(verifier, "torch", f"torch is not importable ({exc})")
    target = device
    if target is None:
        if not torch.cuda.is_available():
            return _fallback(verifier, "cuda", "no CUDA device is available")
        target = f"cuda:{torch.cuda.current_device()}"
    compiled = mode == "fused" if compile is None else bool(compile)
    try:
        planner = devices.DevicePlanner(
            verifier.cost_table,
            verifier.calibration,
            min_verify_len=verifier.min_verify_len,
            device=target,
            dtype=dtype,
            num_ranks=num_ranks,
            compile=compiled,
        )
        serving: FusedServingPlanner | ServingPlanner = (
            fused.FusedServingPlanner(planner, force_native=force_native)
            if mode == "fused"
            else devices.ServingPlanner(planner, mode=mode, force_native=force_native)
        )
    except (RuntimeError, OSError) as exc:  # CUDA initialisation, out of memory, driver errors
        return _fallback(verifier, "device_init", f"device planner on {target}: {exc!r}")
    on = f"{target}, {dtype}{', compiled' if compiled and planner.device.type == 'cuda' else ''}"
    return PlannerChoice("device", serving, None, f"{mode} device planner on {on}", mode)


def _fallback(verifier: DynamicVerifier, field: str, message: str) -> PlannerChoice:
    finding = Finding(Reason.PLANNER_FALLBACK, f"{message}; the host planner runs", field=field)
    logger.warning(
        "dspark planner fallback %s: %s",
        finding.code,
        finding.message,
        extra={"dspark_planner": {"reason_code": finding.code, "message": finding.message}},
    )
    return PlannerChoice("host", verifier, finding, finding.message)
