"""The admission artifact's signed economics and the gain test. Pure: no I/O.

:class:`AdmissionEconomics` (``artifacts.AdmissionSummary``, which owns the receipt rule) reads
and validates the signed summary of an ``admission`` artifact (DESIGN §6 receipt fields);
:func:`gain_test` decides whether dynamic verification is proven to pay, through :func:`classify_gain`, the package's one gain classifier. The admission hook, the
release report and ``build``'s replay all use these, so what the page and the build say is what
the runtime decides.
"""

from __future__ import annotations

import math

from dspark_calibrate.artifacts import ADMISSION_SUMMARY_FIELDS, AdmissionSummary
from dspark_calibrate.decision import Decision, Status

__all__ = [
    "ADMISSION_SUMMARY_FIELDS",
    "AdmissionEconomics",
    "GainStatus",
    "GainVerdict",
    "classify_gain",
    "gain_test",
]

#: The runtime reads the admission artifact's summary through the artifacts model; the old name
#: stays for callers that imported it from here (the same class object).
AdmissionEconomics = AdmissionSummary


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
