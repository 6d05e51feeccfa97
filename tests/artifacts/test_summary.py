"""The receipt rule's one home (``ReceiptEconomics``) and the admission summary model.

One table of rule rows; every place that used to write the rule itself (build's replay, the
admission hook's two economics, the release report, both exporters and their validators) is
asked about every row and must give the model's answer.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest

from dspark_calibrate.artifacts import AdmissionSummary, ModelError, ReceiptEconomics
from dspark_calibrate.artifacts._export_trtllm import RECEIPT_FILE, _check_receipt_economics
from dspark_calibrate.artifacts._trtllm_mixed import _RECEIPT_KEYS, ADMISSION_FILE, _receipt, _Rules
from dspark_calibrate.calibrate.deployment.replay import admission_rule
from dspark_calibrate.calibrate.report.model import _admission_section
from dspark_calibrate.runtime_plugin import AdmissionEconomics
from dspark_calibrate.runtime_plugin.mixed import MixedEconomics
from dspark_calibrate.schemas import MIXED_GATES, MIXED_RESULT_FILES
from tests.runtime_plugin.bundles import admission_summary

# (id, (policy_steps, compact_choices, gross, overhead, margin), (admitted, net))
RULE_CASES = [
    ("aggregate accounting admits", (100, 50, 156.0, 1.0, 0.0), (True, 56.0)),
    ("overhead is paid on every policy step", (100, 10, 80.0, 1.0, 0.0), (False, -20.0)),
    ("a compact choice is needed", (100, 0, 200.0, 1.0, 10.0), (False, 90.0)),
    ("zero net is not admitted", (100, 50, 110.0, 1.0, 10.0), (False, 0.0)),
    ("positive net is admitted", (100, 50, 160.0, 1.0, 10.0), (True, 50.0)),
    ("the margin alone can refuse", (10, 10, 5.0, 0.0, 5.0), (False, 0.0)),
    ("a single compact step", (1, 1, 0.5, 0.0, 0.0), (True, 0.5)),
    ("integer amounts", (4, 2, 9, 1, 1), (True, 4.0)),
]
RULE_IDS = [c[0] for c in RULE_CASES]
RULE_ROWS = [c[1:] for c in RULE_CASES]

Row = tuple[int, int, float, float, float]


@pytest.mark.parametrize(("row", "expected"), RULE_ROWS, ids=RULE_IDS)
def test_receipt_rule(row: Row, expected: tuple[bool, float]) -> None:
    econ = ReceiptEconomics(*row)
    assert econ.admitted is expected[0]
    assert econ.net_value_ms == pytest.approx(expected[1])


BAD_ECONOMICS = [
    ("no policy step", {"policy_steps": 0}),
    ("a bool is not a count", {"policy_steps": True}),
    ("a float is not a count", {"compact_choices": 1.0}),
    ("more choices than steps", {"compact_choices": 101}),
    ("negative choices", {"compact_choices": -1}),
    ("NaN gross", {"gross_compact_value_ms_lower_bound": math.nan}),
    ("infinite overhead", {"fixed_confidence_path_overhead_ms_upper_bound": math.inf}),
    ("negative margin", {"safety_margin_ms": -1.0}),
    ("a string amount", {"safety_margin_ms": "1"}),
    ("a bool amount", {"gross_compact_value_ms_lower_bound": True}),
]


@pytest.mark.parametrize("change", [c[1] for c in BAD_ECONOMICS], ids=[c[0] for c in BAD_ECONOMICS])
def test_impossible_economics_are_refused(change: dict[str, Any]) -> None:
    good = ReceiptEconomics(100, 50, 160.0, 1.0, 10.0).to_dict()
    with pytest.raises(ModelError, match=next(iter(change))):
        ReceiptEconomics.from_dict(good | change)


def test_receipt_economics_round_trip() -> None:
    econ = ReceiptEconomics(100, 50, 160.0, 1.0, 10.0)
    assert ReceiptEconomics.from_dict(econ.to_dict()) == econ
    with pytest.raises(ModelError, match="safety_margin_ms"):
        ReceiptEconomics.from_dict({k: v for k, v in econ.to_dict().items() if k != "safety_margin_ms"})


def test_admission_summary_round_trip_and_is_the_runtime_model() -> None:
    summary = AdmissionSummary.from_summary(admission_summary())
    assert AdmissionSummary.from_summary(summary.to_summary()) == summary
    assert AdmissionEconomics is AdmissionSummary
    with pytest.raises(AttributeError):
        summary.admitted = False  # type: ignore[misc]  # frozen: the assignment must fail


def _decode_summary(row: Row, admitted: bool) -> dict[str, Any]:
    steps, choices, gross, overhead, margin = row
    return admission_summary(
        policy_steps=steps,
        compact_choices=choices,
        compact_step_share=choices / steps,
        gross_compact_value_ms_lower_bound=gross,
        fixed_confidence_path_overhead_ms_upper_bound=overhead,
        safety_margin_ms=margin,
        net_value_ms=gross - steps * overhead - margin,
        admitted=admitted,
    )


def _mixed_summary(row: Row, admitted: bool) -> dict[str, Any]:
    return {
        **ReceiptEconomics(*row).to_dict(),
        "admitted": admitted,
        "gates": {g: True for g in MIXED_GATES},
        "results": {name: "a" * 64 for name in MIXED_RESULT_FILES},
        "predicted_gain": 0.05,
        "predicted_gain_ci_low": 0.01,
        "predicted_gain_ci_high": 0.09,
    }


def _export_says(row: Row, admitted: bool) -> bool:
    """Whether the decode receipt validator accepts ``admitted`` for these economics."""
    rules = _Rules()
    body = {**ReceiptEconomics(*row).to_dict(), "admitted": admitted}
    _check_receipt_economics(rules, body, {}, True, None)
    return f"{RECEIPT_FILE}:admitted" not in {f.field for f in rules.findings}


def _mixed_validator_admits(row: Row) -> bool:
    rules = _Rules()
    receipt = {key: None for key in _RECEIPT_KEYS} | {"economics": ReceiptEconomics(*row).to_dict()}
    _receipt(rules, receipt, None, {}, None, None)
    return f"{ADMISSION_FILE}:economics_admitted" not in {f.field for f in rules.findings}


@pytest.mark.parametrize(("row", "expected"), RULE_ROWS, ids=RULE_IDS)
def test_every_former_site_agrees_with_the_rule(row: Row, expected: tuple[bool, float]) -> None:
    admitted, net = expected
    # build's replay
    assert admission_rule(
        policy_steps=row[0],
        compact_choices=row[1],
        gross_compact_value_ms_lower_bound=row[2],
        fixed_confidence_path_overhead_ms_upper_bound=row[3],
        safety_margin_ms=row[4],
    ) == (admitted, pytest.approx(net))
    # the admission hook: decode and mixed summaries, the right flag read, the wrong one refused
    assert AdmissionEconomics.from_summary(_decode_summary(row, admitted)).receipt_rule() is admitted
    assert MixedEconomics.from_summary(_mixed_summary(row, admitted)).receipt_rule() is admitted
    for wrong in (_decode_summary(row, not admitted), _mixed_summary(row, not admitted)):
        with pytest.raises(ModelError, match="receipt rule"):
            (AdmissionEconomics if "gates" not in wrong else MixedEconomics).from_summary(wrong)
    # the release report
    section = _admission_section(SimpleNamespace(summary=_decode_summary(row, admitted)))  # type: ignore[arg-type]  # reads .summary only
    assert section.receipt_rule is admitted and section.recomputed_net_value_ms == pytest.approx(net)
    # the decode exporter's validator; the mixed one admits exactly when the rule does
    assert _export_says(row, admitted) and not _export_says(row, not admitted)
    assert _mixed_validator_admits(row) is admitted
