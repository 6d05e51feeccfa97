"""The report's check items from the sweep's bias checks in a cost table."""

from __future__ import annotations

from typing import Any

from dspark_calibrate.calibrate.report.sweep_checks import sweep_bias_checks
from dspark_calibrate.calibrate.report.verdict import Severity
from tests.factories import cost_rows, make_table


def _rows(**per_g: tuple[float, float, float]) -> list[dict[str, Any]]:
    rows = cost_rows()
    for r in rows:
        bias = per_g.get(f"g{r['graph_batch_size']}")
        if bias is not None:
            r.update(control_bias=bias[0], control_bias_ci_low=bias[1], control_bias_ci_high=bias[2])
        r.update(clock_rel=1.0 if r["verifier_budget"] == 0 else 1.011 + 0.001 * r["verifier_budget"])
    return rows


def test_a_biased_control_is_a_warning_and_every_g_is_listed() -> None:
    checks = sweep_bias_checks(
        make_table("cost-table", _rows(g8=(0.001, -0.003, 0.005), g16=(0.0095, 0.0015, 0.0175)))
    )
    warnings = [c for c in checks if c.severity is Severity.WARNING]
    assert [c.code for c in warnings] == ["CONTROL_BIAS:G=16"] and "+0.95%" in warnings[0].message
    (info,) = [c for c in checks if c.code == "SWEEP_CHECKS"]
    assert info.severity is Severity.INFO
    assert "G=8: control +0.10% [-0.30%, +0.50%], SM clock" in info.message
    assert "G=32: control not measured, SM clock" in info.message


def test_a_large_clock_term_is_stated_with_its_cell() -> None:
    rows = _rows()
    for r in rows:
        if r["verifier_budget"] > 0:
            r.update(saving=0.30, saving_ci_low=0.20, saving_ci_high=0.32, clock_rel=1.0)
    hot = next(r for r in rows if r["verifier_budget"] > 0)
    hot.update(clock_rel=1.12)
    (term,) = [c for c in sweep_bias_checks(make_table("cost-table", rows)) if c.code == "CLOCK_TERM"]
    # 1 - 0.70 * 1.12 = 0.216: 8.40 points below 0.30.
    assert "8.40 points lower" in term.message and f"V={hot['verifier_budget']}" in term.message
    for r in rows:
        if r["verifier_budget"] > 0:
            r.update(clock_rel=1.01)  # 0.70 points: below the note's threshold
    assert "CLOCK_TERM" not in {c.code for c in sweep_bias_checks(make_table("cost-table", rows))}


def test_tables_without_checks_give_nothing() -> None:
    assert sweep_bias_checks(make_table("cost-table", cost_rows())) == []
    legacy = make_table("cost-table", cost_rows()).drop_columns(["control_bias", "clock_rel"])
    assert sweep_bias_checks(legacy) == []


def test_the_report_lists_them(tmp_path: Any) -> None:
    from dspark_calibrate.calibrate.report import build_report, collect_evidence
    from tests.calibrate.report.test_report import LATER, make_report_bundle, report_costs
    from tests.signing import make_root, make_signers

    signers = make_signers(tmp_path / "keys", 1)
    root = tmp_path / "root.json"
    root.write_bytes(make_root(signers).to_bytes())
    costs = report_costs()
    for r in costs:
        biased = r["graph_batch_size"] == 16
        r.update(control_bias=0.01 if biased else 0.0, control_bias_ci_low=0.004 if biased else -0.003)
        r.update(control_bias_ci_high=0.016 if biased else 0.003, clock_rel=1.0)
    bundle = make_report_bundle(tmp_path / "b", signers, costs=costs)
    report = build_report(collect_evidence([bundle], root, now=LATER), now=LATER)
    assert {"CONTROL_BIAS:G=16", "SWEEP_CHECKS"} <= {c.code for c in report.checks}
