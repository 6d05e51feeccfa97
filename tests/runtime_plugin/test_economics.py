"""The one gain classifier: every outcome and its reason code, in the documented order."""

from __future__ import annotations

import math

import pytest

from dspark_calibrate.calibrate.deployment.replay import gain_decision
from dspark_calibrate.decision import Decision, Status
from dspark_calibrate.runtime_plugin import GainStatus, GainVerdict
from dspark_calibrate.runtime_plugin.economics import classify_gain


@pytest.mark.parametrize(
    ("args", "kwargs", "status", "reason"),
    [
        pytest.param((math.nan, 0.0, 0.1), {"admitted": True}, Status.UNKNOWN, "non_finite", id="nan-gain"),
        pytest.param(
            (0.05, 0.01, 0.1),
            {"admitted": True, "minimum": math.inf},
            Status.UNKNOWN,
            "non_finite",
            id="inf-minimum",
        ),
        pytest.param((-0.02, -0.05, 0.0), {"admitted": True}, Status.REJECT, "no_gain", id="ci-at-zero"),
        pytest.param(
            (0.05, 0.03, 0.08),
            {"admitted": True, "minimum": 0.08},
            Status.REJECT,
            "no_gain",
            id="ci-below-minimum",
        ),
        # two defects: the interval is reported first
        pytest.param(
            (-0.02, -0.05, -0.01),
            {"admitted": False},
            Status.REJECT,
            "no_gain",
            id="no-gain-and-not-admitted",
        ),
        pytest.param(
            (0.05, 0.02, 0.08), {"admitted": False}, Status.REJECT, "not_admitted", id="not-admitted"
        ),
        pytest.param(
            (0.05, 0.02, 0.08),
            {"admitted": True, "drain_guard": False},
            Status.REJECT,
            "no_drain_guard",
            id="no-drain-guard",
        ),
        pytest.param((0.05, 0.02, 0.08), {"admitted": True}, Status.ACCEPT, "gain_proven", id="proven"),
        pytest.param(
            (0.05, 0.02, 0.08),
            {"admitted": True, "minimum": 0.03},
            Status.UNDECIDED,
            "ci_straddles_minimum",
            id="straddles-minimum",
        ),
        pytest.param(
            (0.01, -0.01, 0.03),
            {"admitted": True},
            Status.UNDECIDED,
            "ci_straddles_zero",
            id="straddles-zero",
        ),
    ],
)
def test_classify_gain(
    args: tuple[float, float, float], kwargs: dict[str, object], status: Status, reason: str
) -> None:
    decision = classify_gain(*args, **kwargs)  # type: ignore[arg-type]
    assert (decision.status, decision.reason) == (status, reason)
    assert decision.detail


def test_replay_and_admission_share_the_classifier_and_the_type() -> None:
    assert GainStatus is Status and GainVerdict is Decision
    for args in [(0.05, 0.02, 0.08), (0.01, -0.01, 0.03), (-0.02, -0.05, 0.0)]:
        for admitted in (True, False):
            assert gain_decision(*args, admitted=admitted) == classify_gain(*args, admitted=admitted)
