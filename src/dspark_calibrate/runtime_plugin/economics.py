"""The admission artifact's signed economics and the gain test. Pure: no I/O.

:class:`AdmissionEconomics` reads and validates the signed summary of an ``admission`` artifact
(DESIGN §6 receipt fields); :func:`gain_test` decides whether dynamic verification is proven to
pay, through :func:`classify_gain`, the package's one gain classifier. The admission hook, the
release report and ``build``'s replay all use these, so what the page and the build say is what
the runtime decides.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from dspark_calibrate.artifacts import ModelError, is_sha256_hex
from dspark_calibrate.decision import Decision, Status
from dspark_calibrate.schemas import ADMISSION_SUMMARY_KEYS

__all__ = [
    "ADMISSION_SUMMARY_FIELDS",
    "AdmissionEconomics",
    "GainStatus",
    "GainVerdict",
    "classify_gain",
    "gain_test",
]

#: The keys of the admission artifact's signed summary (``schemas.ADMISSION_SUMMARY_KEYS``) that
#: the hook reads and therefore requires; the goodputs and per-bucket detail are for reports.
ADMISSION_SUMMARY_FIELDS: tuple[str, ...] = tuple(
    k
    for k in ADMISSION_SUMMARY_KEYS
    if k
    not in ("static_goodput_tok_per_ms", "dynamic_goodput_tok_per_ms", "workload_approximate", "per_bucket")
)


def _number(summary: Mapping[str, Any], name: str, *, minimum: float | None = None) -> float:
    value = summary[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
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


def _integer(summary: Mapping[str, Any], name: str, *, minimum: int) -> int:
    value = summary[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ModelError(f"summary.{name} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class AdmissionEconomics:
    """The admission artifact's signed workload economics (DESIGN §6 receipt fields).

    Gains are relative (0.05 = 5 % more goodput than static K); amounts are ms summed over the
    replayed workload.
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
    def from_summary(cls, summary: Mapping[str, Any]) -> AdmissionEconomics:
        """Read and validate the signed summary (extra keys are ignored, never used).

        Raises:
            ModelError: a key is missing or holds an impossible value; the message names it.
        """
        missing = [k for k in ADMISSION_SUMMARY_FIELDS if k not in summary]
        if missing:
            raise ModelError(f"summary lacks {missing}; rebuild the bundle with `dspark-calibrate build`")
        steps = _integer(summary, "policy_steps", minimum=1)
        choices = _integer(summary, "compact_choices", minimum=0)
        if choices > steps:
            raise ModelError(f"summary.compact_choices {choices} exceeds policy_steps {steps}")
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
            policy_steps=steps,
            compact_choices=choices,
            gross_compact_value_ms_lower_bound=_number(
                summary, "gross_compact_value_ms_lower_bound", minimum=0.0
            ),
            fixed_confidence_path_overhead_ms_upper_bound=_number(
                summary, "fixed_confidence_path_overhead_ms_upper_bound", minimum=0.0
            ),
            safety_margin_ms=_number(summary, "safety_margin_ms", minimum=0.0),
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

    def recomputed_net_ms(self) -> float:
        """gross lower bound − policy_steps · overhead upper bound − safety margin (DESIGN §6)."""
        return (
            self.gross_compact_value_ms_lower_bound
            - self.policy_steps * self.fixed_confidence_path_overhead_ms_upper_bound
            - self.safety_margin_ms
        )

    def receipt_rule(self) -> bool:
        """TensorRT-LLM's ``admitted`` rule, recomputed from the amounts."""
        return self.compact_choices > 0 and self.recomputed_net_ms() > 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
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


#: The gain test's outcome is the package's one four-state decision (:mod:`dspark_calibrate.decision`);
#: these names stay for callers that imported them from the admission hook.
GainStatus = Status
GainVerdict = Decision


def classify_gain(
    gain: float,
    ci_low: float,
    ci_high: float,
    *,
    admitted: bool,
    minimum: float = 0.0,
    drain_guard: bool = True,
) -> Decision:
    """Classify a predicted goodput gain and its interval (STYLE rule 11). Pure.

    The one gain classifier: ``build``'s replay calls it with ``minimum`` 0, the admission hook
    (through :func:`gain_test`) with the signed ``minimum_predicted_gain``. Checks, in order:

    - UNKNOWN ``non_finite``: no finite estimate or interval;
    - REJECT ``no_gain``: the whole interval is at or below ``minimum``;
    - REJECT ``not_admitted``: the receipt rule does not admit (no compact step, or the net value
      after overhead and margin is not positive);
    - REJECT ``no_drain_guard``: the engine never picks a compact cell without one;
    - ACCEPT ``gain_proven``: the interval lies above ``minimum``;
    - UNDECIDED ``ci_straddles_zero`` / ``ci_straddles_minimum``: the interval straddles it (a
      longer workload would be needed). Only the caller decides what that means.

    Args:
        gain: the predicted relative gain (0.05 = 5 % more goodput than static K).
        ci_low, ci_high: its 95 % interval.
        admitted: the receipt rule's verdict.
        minimum: the bar the interval must clear.
        drain_guard: whether a drain guard accompanies the cells.
    """
    interval = f"gain {gain:+.2%}, 95% CI [{ci_low:+.2%}, {ci_high:+.2%}]"
    if not all(math.isfinite(x) for x in (gain, ci_low, ci_high, minimum)):
        return Decision(Status.UNKNOWN, "non_finite", "no finite gain estimate")
    if ci_high <= minimum:
        return Decision(Status.REJECT, "no_gain", f"{interval} at or below {minimum:+.2%}")
    if not admitted:
        return Decision(
            Status.REJECT,
            "not_admitted",
            f"gain {gain:+.2%} does not cover the overhead and margin (no compact step, or net value <= 0)",
        )
    if not drain_guard:
        return Decision(
            Status.REJECT,
            "no_drain_guard",
            "no drain guard accompanies the cells; the engine never picks a compact cell without one",
        )
    if ci_low > minimum:
        return Decision(Status.ACCEPT, "gain_proven", interval)
    return Decision(
        Status.UNDECIDED,
        "ci_straddles_zero" if minimum == 0 else "ci_straddles_minimum",
        f"{interval} straddles {minimum:+.2%}; replay a longer workload to narrow it",
    )


def gain_test(econ: AdmissionEconomics | None, minimum: float) -> Decision:
    """Is dynamic verification proven to pay on the recorded workload? Pure.

    :func:`classify_gain` over the signed economics: ACCEPT only when the receipt rule holds, a
    drain guard is present and the CI lower bound exceeds ``minimum``; UNKNOWN
    (``no_admission_artifact``) when there are no economics. Only ACCEPT activates.
    """
    if econ is None:
        return Decision(
            Status.UNKNOWN,
            "no_admission_artifact",
            "the bundle carries no admission artifact, so no gain is proven",
        )
    return classify_gain(
        econ.predicted_gain,
        econ.predicted_gain_ci_low,
        econ.predicted_gain_ci_high,
        admitted=econ.receipt_rule(),
        minimum=minimum,
        drain_guard=econ.drain_guard is not None,
    )
