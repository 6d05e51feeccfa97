"""The admission summary and the receipt rule: frozen, self-validating models. Pure: no I/O.

TensorRT-LLM admits a receipt (decode ``admission_receipt.json`` and mixed
``mixed_admission.json`` alike) only when the policy chose a compact cell at least once and the
net value, ``gross lower bound − policy_steps · overhead upper bound − safety margin``, is
positive (DESIGN §6). :class:`ReceiptEconomics` is that rule's one home: ``build``'s replay, the
admission hook, the release report and both exporters ask it, so no two of them can disagree.

:class:`AdmissionSummary` is the ``admission`` artifact's signed summary as the runtime reads it
(the keys it requires; goodputs and per-bucket detail are for reports). It checks that the signed
``admitted`` flag is the rule recomputed. Reading the summary, not deciding on it, is this
module's job: the gain test lives in ``runtime_plugin.economics``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from dspark_calibrate.artifacts._models import ModelError, is_sha256_hex
from dspark_calibrate.schemas import ADMISSION_SUMMARY_KEYS

__all__ = ["ADMISSION_SUMMARY_FIELDS", "RECEIPT_ECONOMICS_FIELDS", "AdmissionSummary", "ReceiptEconomics"]

#: The keys of the admission artifact's signed summary (``schemas.ADMISSION_SUMMARY_KEYS``) that
#: the runtime reads and therefore requires; the goodputs and per-bucket detail are for reports.
ADMISSION_SUMMARY_FIELDS: tuple[str, ...] = tuple(
    k
    for k in ADMISSION_SUMMARY_KEYS
    if k
    not in ("static_goodput_tok_per_ms", "dynamic_goodput_tok_per_ms", "workload_approximate", "per_bucket")
)

#: The counts and amounts the receipt rule reads, in the order the receipts list them.
RECEIPT_ECONOMICS_FIELDS: tuple[str, ...] = (
    "policy_steps",
    "compact_choices",
    "gross_compact_value_ms_lower_bound",
    "fixed_confidence_path_overhead_ms_upper_bound",
    "safety_margin_ms",
)


def _is_count(value: object, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= minimum


def _is_amount(value: object) -> bool:
    return (
        not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value) and value >= 0
    )


@dataclass(frozen=True, slots=True)
class ReceiptEconomics:
    """The receipt's counts and amounts, and TensorRT-LLM's ``admitted`` rule over them.

    Attributes:
        policy_steps: steps the policy decided (native ones included); every one pays the
            confidence path's overhead.
        compact_choices: steps on which it chose a compact cell.
        gross_compact_value_ms_lower_bound: what the compact choices save, ms summed over the
            workload (a lower bound).
        fixed_confidence_path_overhead_ms_upper_bound: the per-step overhead, ms (an upper bound).
        safety_margin_ms: what the net value must clear on top, ms.

    Raises:
        ModelError: a count is not an integer in range (``0 <= compact_choices <= policy_steps``,
            ``policy_steps >= 1``) or an amount is not a finite number >= 0.
    """

    policy_steps: int
    compact_choices: int
    gross_compact_value_ms_lower_bound: float
    fixed_confidence_path_overhead_ms_upper_bound: float
    safety_margin_ms: float

    def __post_init__(self) -> None:
        if not _is_count(self.policy_steps, 1):
            raise ModelError(f"policy_steps must be an integer >= 1, got {self.policy_steps!r}")
        if not _is_count(self.compact_choices, 0) or self.compact_choices > self.policy_steps:
            raise ModelError(
                f"compact_choices must be an integer in [0, policy_steps={self.policy_steps}], "
                f"got {self.compact_choices!r}"
            )
        for name in RECEIPT_ECONOMICS_FIELDS[2:]:
            value = getattr(self, name)
            if not _is_amount(value):
                raise ModelError(f"{name} must be a finite number >= 0, got {value!r}")

    @property
    def net_value_ms(self) -> float:
        """gross lower bound − policy_steps · overhead upper bound − safety margin (DESIGN §6)."""
        return (
            self.gross_compact_value_ms_lower_bound
            - self.policy_steps * self.fixed_confidence_path_overhead_ms_upper_bound
            - self.safety_margin_ms
        )

    @property
    def admitted(self) -> bool:
        """The receipt rule: a compact choice was made and the net value is positive."""
        return self.compact_choices > 0 and self.net_value_ms > 0

    @classmethod
    def of(cls, holder: object) -> ReceiptEconomics:
        """The five fields read off an object that carries them as attributes (a summary model)."""
        return cls(*(getattr(holder, k) for k in RECEIPT_ECONOMICS_FIELDS))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReceiptEconomics:
        """Read the five fields (extra keys are ignored, never used).

        Raises:
            ModelError: a field is missing or holds an impossible value.
        """
        missing = [k for k in RECEIPT_ECONOMICS_FIELDS if k not in data]
        if missing:
            raise ModelError(f"the receipt economics lack {missing}")
        return cls(*(data[k] for k in RECEIPT_ECONOMICS_FIELDS))

    def to_dict(self) -> dict[str, Any]:
        """The five fields as the receipts carry them (counts as ints, amounts as floats)."""
        return {
            "policy_steps": int(self.policy_steps),
            "compact_choices": int(self.compact_choices),
            "gross_compact_value_ms_lower_bound": float(self.gross_compact_value_ms_lower_bound),
            "fixed_confidence_path_overhead_ms_upper_bound": float(
                self.fixed_confidence_path_overhead_ms_upper_bound
            ),
            "safety_margin_ms": float(self.safety_margin_ms),
        }


def _number(summary: Mapping[str, Any], name: str, *, minimum: float | None = None) -> float:
    value = summary[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ModelError(f"summary.{name} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ModelError(f"summary.{name} must be >= {minimum}, got {value!r}")
    return float(value)


def _label(summary: Mapping[str, Any], name: str) -> str | None:
    """An optional short label (absent in bundles built before it existed)."""
    value = summary.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 64 or not value.isprintable():
        raise ModelError(f"summary.{name} must be a short printable string, got {str(value)[:40]!r}")
    return value


def _receipt_of(summary: Mapping[str, Any]) -> ReceiptEconomics:
    """The five receipt fields of a summary; the amounts go through :func:`_number` first so that
    a bad one is named ``summary.<field>`` and ints are held as floats."""
    try:
        return ReceiptEconomics(
            policy_steps=summary["policy_steps"],
            compact_choices=summary["compact_choices"],
            gross_compact_value_ms_lower_bound=_number(summary, "gross_compact_value_ms_lower_bound"),
            fixed_confidence_path_overhead_ms_upper_bound=_number(
                summary, "fixed_confidence_path_overhead_ms_upper_bound"
            ),
            safety_margin_ms=_number(summary, "safety_margin_ms"),
        )
    except ModelError as exc:
        raise ModelError(f"summary.{exc}") from exc


@dataclass(frozen=True, slots=True)
class AdmissionSummary:
    """The admission artifact's signed workload economics (DESIGN §6 receipt fields).

    Gains are relative (0.05 = 5 % more goodput than static K); amounts are ms summed over the
    replayed workload. Built by :meth:`from_summary`, which refuses a summary whose ``admitted``
    flag is not the receipt rule recomputed.
    """

    predicted_gain: float
    predicted_gain_ci_low: float
    predicted_gain_ci_high: float
    compact_step_share: float
    policy_steps: int
    compact_choices: int
    gross_compact_value_ms_lower_bound: float
    fixed_confidence_path_overhead_ms_upper_bound: float
    safety_margin_ms: float
    net_value_ms: float
    admitted: bool
    minimum_predicted_gain: float
    drain_guard: Mapping[str, Any] | None
    workload_identity_sha256: str
    selector_replay_sha256: str
    objective: str | None = None
    regime: str | None = None

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> AdmissionSummary:
        """Read and validate the signed summary (extra keys are ignored, never used).

        Raises:
            ModelError: a key is missing or holds an impossible value; the message names it.
        """
        missing = [k for k in ADMISSION_SUMMARY_FIELDS if k not in summary]
        if missing:
            raise ModelError(f"summary lacks {missing}; rebuild the bundle with `dspark-calibrate build`")
        receipt = _receipt_of(summary)
        admitted = summary["admitted"]
        if not isinstance(admitted, bool):
            raise ModelError(f"summary.admitted must be a boolean, got {admitted!r}")
        guard = summary["drain_guard"]
        if guard is not None and not isinstance(guard, Mapping):
            raise ModelError(f"summary.drain_guard must be an object or null, got {type(guard).__name__}")
        for name in ("workload_identity_sha256", "selector_replay_sha256"):
            if not is_sha256_hex(summary[name]):
                raise ModelError(f"summary.{name} must be 64 lowercase hex characters, got {summary[name]!r}")
        share = _number(summary, "compact_step_share", minimum=0.0)
        if share > 1:
            raise ModelError(f"summary.compact_step_share must be in [0, 1], got {share!r}")
        econ = cls(
            predicted_gain=_number(summary, "predicted_gain"),
            predicted_gain_ci_low=_number(summary, "predicted_gain_ci_low"),
            predicted_gain_ci_high=_number(summary, "predicted_gain_ci_high"),
            compact_step_share=share,
            policy_steps=receipt.policy_steps,
            compact_choices=receipt.compact_choices,
            gross_compact_value_ms_lower_bound=receipt.gross_compact_value_ms_lower_bound,
            fixed_confidence_path_overhead_ms_upper_bound=receipt.fixed_confidence_path_overhead_ms_upper_bound,
            safety_margin_ms=receipt.safety_margin_ms,
            net_value_ms=_number(summary, "net_value_ms"),
            admitted=admitted,
            minimum_predicted_gain=_number(summary, "minimum_predicted_gain", minimum=0.0),
            drain_guard=None if guard is None else MappingProxyType(dict(guard)),
            workload_identity_sha256=summary["workload_identity_sha256"],
            selector_replay_sha256=summary["selector_replay_sha256"],
            objective=_label(summary, "objective"),
            regime=_label(summary, "regime"),
        )
        if not econ.predicted_gain_ci_low <= econ.predicted_gain_ci_high:
            raise ModelError(
                f"summary.predicted_gain_ci_low {econ.predicted_gain_ci_low} exceeds "
                f"ci_high {econ.predicted_gain_ci_high}"
            )
        if econ.admitted != econ.receipt_rule():
            raise ModelError(
                f"summary.admitted is {econ.admitted} but the receipt rule (compact_choices > 0 and gross − "
                f"policy_steps·overhead − margin > 0) gives {econ.receipt_rule()}"
            )
        return econ

    @property
    def receipt(self) -> ReceiptEconomics:
        """The five fields the receipt rule reads."""
        return ReceiptEconomics.of(self)

    def recomputed_net_ms(self) -> float:
        """gross lower bound − policy_steps · overhead upper bound − safety margin (DESIGN §6)."""
        return self.receipt.net_value_ms

    def receipt_rule(self) -> bool:
        """TensorRT-LLM's ``admitted`` rule, recomputed from the amounts."""
        return self.receipt.admitted

    def to_summary(self) -> dict[str, Any]:
        """The summary keys this model holds, in the signed form (``from_summary`` reads it back)."""
        return {
            "predicted_gain": self.predicted_gain,
            "predicted_gain_ci_low": self.predicted_gain_ci_low,
            "predicted_gain_ci_high": self.predicted_gain_ci_high,
            "compact_step_share": self.compact_step_share,
            **self.receipt.to_dict(),
            "net_value_ms": self.net_value_ms,
            "admitted": self.admitted,
            "minimum_predicted_gain": self.minimum_predicted_gain,
            "drain_guard": None if self.drain_guard is None else dict(self.drain_guard),
            "workload_identity_sha256": self.workload_identity_sha256,
            "selector_replay_sha256": self.selector_replay_sha256,
            "objective": self.objective,
            "regime": self.regime,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready display form (what the admission hook reports)."""
        return {
            "predicted_gain": self.predicted_gain,
            "predicted_gain_ci": [self.predicted_gain_ci_low, self.predicted_gain_ci_high],
            "compact_step_share": self.compact_step_share,
            "policy_steps": self.policy_steps,
            "compact_choices": self.compact_choices,
            "net_value_ms": self.net_value_ms,
            "admitted": self.admitted,
            "objective": self.objective,
            "regime": self.regime,
        }
