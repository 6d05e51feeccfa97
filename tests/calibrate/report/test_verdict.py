"""The report's first screen: one deploy verdict with its gates and blockers, in every form.

Also: near-identical "what to check" items fold into one line naming the cells, and a compact
cell is noisy only when its paired saving's interval is wide against the sweep's own precision
target (a real synthetic sweep, measured like the demo's, flags nothing; widening one cell's
saving interval flags exactly that cell).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dspark_calibrate.artifacts import Expectation, read_artifact
from dspark_calibrate.calibrate.report import (
    Severity,
    build_report,
    collect_evidence,
    render_html,
    render_markdown,
)
from dspark_calibrate.calibrate.report.model import DEFAULT_SWEEP_PRECISION_REL
from dspark_calibrate.calibrate.report.verdict import Check, group_checks, name_subjects
from dspark_calibrate.schemas import arrow_schema
from tests.calibrate.report.test_report import (
    LATER,
    Page,
    make_report_bundle,
    report_admission_summary,
    report_cost_summary,
)
from tests.factories import make_fingerprint, make_provenance
from tests.signing import make_root, make_signers

#: How many lines of text count as the first screen of a terminal or a Markdown viewer.
FIRST_SCREEN_LINES = 40


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    return make_signers(tmp_path_factory.mktemp("keys"), 1)


@pytest.fixture(scope="module")
def root_path(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Any, ...]) -> Path:
    path = tmp_path_factory.mktemp("root") / "root.json"
    path.write_bytes(make_root(keys).to_bytes())
    return path


def _many_candidates() -> dict[str, Any]:
    """Thirty undeployed G=16 cells that all save more than the best deployed G=16 cell."""
    summary = report_cost_summary()
    summary["candidates"] = [
        {
            "graph_batch_size": 16,
            "verifier_budget": v,
            "step_time_ms": 11.9,
            "ci_low_ms": 11.85,
            "ci_high_ms": 11.95,
        }
        for v in range(17, 47)
        if v not in (32,)
    ]
    return summary


@pytest.fixture(scope="module")
def blocked(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Any, ...], root_path: Path) -> Any:
    """A bundle whose signatures verify but which must not ship: synthetic, gain rejected, no guard."""
    b = make_report_bundle(
        tmp_path_factory.mktemp("blocked") / "b",
        keys,
        provenance=make_provenance(synthetic=True, backend="synthetic"),
        cost_summary=_many_candidates(),
        admission_summary=report_admission_summary(
            predicted_gain=0.004, predicted_gain_ci_low=-0.002, predicted_gain_ci_high=0.009, drain_guard=None
        ),
    )
    ev = collect_evidence([b], root_path, now=LATER, expected=Expectation(allow_synthetic=True))
    return build_report(ev, now=LATER)


BLOCKER_CODES = {"SYNTHETIC", "GAIN_REJECT", "NO_DRAIN_GUARD"}


def test_verdict_is_no_go_although_signatures_verify(blocked: Any) -> None:
    v = blocked.verdict
    assert blocked.verified and not v.deploy and v.status == "NO-GO"
    assert blocked.headline.startswith(
        "DO NOT DEPLOY — 3 blocker(s): SYNTHETIC (cost-table, calibration, admission)"
    )
    assert "Signatures verified" in blocked.headline
    gates = {g.section: g.status for g in v.gates}
    assert gates == {
        "verification": "pass",
        "identity": "fail",
        "cost-table": "pass",
        "calibration": "pass",
        "admission": "fail",
    }
    assert {b.family for b in v.blockers} == BLOCKER_CODES
    synthetic = next(b for b in v.blockers if b.family == "SYNTHETIC")
    assert synthetic.count == 3 and synthetic.subjects == ("cost-table", "calibration", "admission")


def _html_first_screen(html: str) -> str:
    body = html[html.index("<body>") :]
    return body[: body.index("<details")]


def test_html_first_screen_holds_the_verdict_and_every_blocker(blocked: Any) -> None:
    html = render_html(blocked, plots=False)
    screen = Page(_html_first_screen(html))
    assert screen.lines[0] == blocked.headline
    text = "\n".join(screen.lines)
    for b in blocked.verdict.blockers:
        assert b.message in text, b.message
    for code in (c.code for c in blocked.blockers):
        assert code in " ".join(str(a.get("data-codes", "")) for _, a in screen.elements), code
    # Every gate with its status, before any detail.
    statuses = [
        (a["data-gate"], a["data-status"]) for tag, a in screen.elements if tag == "tr" and "data-gate" in a
    ]
    assert statuses == [(g.section, g.status) for g in blocked.verdict.gates]
    # No section body, no cost-table number, no undeployed-cells table on the first screen.
    first = _html_first_screen(html)
    assert 'class="cells"' not in first and 'data-key="cost:' not in first and "candidate:" not in first


def test_html_sections_are_collapsed_and_candidates_summarised(blocked: Any) -> None:
    html = render_html(blocked, plots=False)
    opened = re.findall(r'<details class="section"( open)?>', html)
    assert len(opened) == 6  # verification, identity, cost table, calibration, admission, what to check
    assert opened.count(" open") == 1  # only "what to check"
    assert re.search(r'<details class="section" open>\s*<summary><h2>\d\. What to check', html)
    m = re.search(r'<details class="inner" id="candidates">\s*<summary[^>]*>([^<]*)</summary>', html)
    assert m is not None
    assert m.group(1) == (
        "Measured, not deployed: 29 measured cells were not deployed (G=16: 29); "
        "29 of them save more than the best deployed cell of their G"
    )


def test_what_to_check_folds_near_identical_items(blocked: Any) -> None:
    groups = blocked.check_groups
    faster = [g for g in groups if g.family == "UNDEPLOYED_FASTER"]
    assert len(faster) == 1 and faster[0].count == 29
    assert faster[0].message.startswith("29 × measured but not deployed")
    assert faster[0].message.endswith("— G=16: V=17–31, 33–46")
    assert len(groups) < len(blocked.checks)
    assert sum(g.count for g in groups) == len(blocked.checks)
    page = Page(render_html(blocked, plots=False))
    items = [a for tag, a in page.elements if tag == "li" and a.get("data-severity")]
    assert len(items) == len(groups)
    assert sorted(c for a in items for c in str(a["data-codes"]).split()) == sorted(
        c.code for c in blocked.checks
    )


def test_markdown_first_screen_holds_the_verdict_and_every_blocker(blocked: Any) -> None:
    md = render_markdown(blocked)
    screen = md.splitlines()[:FIRST_SCREEN_LINES]
    assert screen[0] == blocked.headline
    assert "## Verdict: do not deploy" in screen
    text = "\n".join(screen)
    for b in blocked.verdict.blockers:
        assert b.message.replace("|", "\\|") in text, b.message
    # The undeployed cells are one line in the cost section and a table in the appendix only.
    assert md.count("| 16 | 17 |") == 1 and md.index("## Appendix: measured, not deployed") > md.index(
        "## What to check"
    )


def test_json_carries_the_verdict(blocked: Any) -> None:
    doc = blocked.to_dict()
    assert doc["deploy"] is False and doc["verdict"]["status"] == "NO-GO"
    assert doc["verdict"]["headline"] == doc["headline"] == blocked.headline
    assert [b["family"] for b in doc["verdict"]["blockers"]] == [b.family for b in blocked.verdict.blockers]
    assert [g["status"] for g in doc["verdict"]["gates"]] == ["pass", "fail", "pass", "pass", "fail"]
    assert sum(g["count"] for g in doc["what_to_check"]) == len(doc["checks"])


def test_refused_input_is_no_go_first(tmp_path: Path, root_path: Path) -> None:
    report = build_report(collect_evidence([tmp_path / "absent"], root_path, now=LATER), now=LATER)
    assert report.headline.startswith("DO NOT DEPLOY — NOT VERIFIED: ")
    assert [g.status for g in report.verdict.gates] == ["fail"] + ["not checked"] * 4
    screen = Page(_html_first_screen(render_html(report)))
    assert screen.lines[0] == report.headline
    assert any(report.findings[0].code in line for line in screen.lines[1:])


@pytest.mark.parametrize(
    ("subjects", "named"),
    [
        (["G=8 V=9", "G=8 V=10", "G=8 V=11", "G=16 V=17", "G=8 V=14"], "G=8: V=9–11, 14; G=16: V=17"),
        (["j=1", "j=3"], "j=1, j=3"),
        (["cost-table", "admission"], "cost-table, admission"),
        (["G=8 V=9"], "G=8: V=9"),
    ],
)
def test_subjects_are_named_compactly(subjects: list[str], named: str) -> None:
    assert name_subjects(subjects) == named


def test_group_checks_keeps_singletons_and_subjectless_items() -> None:
    items = [
        Check(Severity.WARNING, "NOISY:G=8:V=9", "cost-table", "a", "G=8 V=9"),
        Check(Severity.WARNING, "FINGERPRINT_UNESTABLISHED", "identity", "b"),
        Check(Severity.WARNING, "SUMMARY_FIELD", "admission", "c"),
        Check(Severity.WARNING, "SUMMARY_FIELD", "admission", "d"),
        Check(Severity.WARNING, "NOISY:G=8:V=10", "cost-table", "e", "G=8 V=10"),
        Check(Severity.INFO, "NOISY:G=8:V=11", "cost-table", "f", "G=8 V=11"),
    ]
    groups = group_checks(items)
    assert [(g.family, g.count) for g in groups] == [
        ("NOISY", 2),
        ("FINGERPRINT_UNESTABLISHED", 1),
        ("SUMMARY_FIELD", 1),
        ("SUMMARY_FIELD", 1),
        ("NOISY", 1),
    ]
    assert groups[0].message.endswith("— G=8: V=9–10") and groups[2].message == "c"


# ---------------------------------------------------------------------------------------------
# Noisy cells: judged on the paired saving against the sweep's own precision target
# ---------------------------------------------------------------------------------------------

#: The demo's sweep: synthetic backend, its model options, K=3, precision 0.5 %, quick caps.
DEMO_K = 3
DEMO_LADDER = (8,)
DEMO_MODEL = {"tile": 8, "per_tile_ms": 0.4}
COST_COLUMNS = tuple(arrow_schema("cost-table").names)


@pytest.fixture(scope="module")
def demo_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A real synthetic sweep made the way ``make demo`` makes it; its rows and stopping rule."""
    from dspark_calibrate.calibrate.measurement.stats import Thresholds
    from dspark_calibrate.calibrate.measurement.sweep import SweepRequest, execute

    out = tmp_path_factory.mktemp("sweep") / "sweep.parquet"
    _, result = execute(
        SweepRequest(
            backend="synthetic",
            backend_options=DEMO_MODEL,
            world_size=8,
            k=DEMO_K,
            ladder=DEMO_LADDER,
            out=out,
            thresholds=Thresholds.quick(precision_rel=0.005),
            seed=0,
            fingerprint=_demo_fingerprint(),
            clock_policy="synthetic",
            plot=False,
        )
    )
    assert result is not None
    art = read_artifact(result.summary_path)
    rule = art.metadata["provenance"]["stopping_rule"]
    return art.table.to_pylist(), rule


def _demo_fingerprint() -> Any:
    return make_fingerprint(
        max_draft_len=DEMO_K,
        rank_local_graph_batch_sizes=DEMO_LADDER,
        global_graph_batch_sizes=tuple(8 * g for g in DEMO_LADDER),
        gpu_count=8,
        gpu="synthetic",
        clock_policy="synthetic",
    )


def _deployed(rows: list[dict[str, Any]], widen: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """The native cell and four compact cells per G, as a cost table carries them."""
    out = []
    for g in DEMO_LADDER:
        for v in (0, g + 4, 2 * g, 2 * g + 4, 3 * g):
            row = next(r for r in rows if (r["graph_batch_size"], r["verifier_budget"]) == (g, v))
            cell = {name: row[name] for name in COST_COLUMNS}
            if (g, v) == widen:
                cell["saving_ci_low"] = cell["saving"] - 0.012
                cell["saving_ci_high"] = cell["saving"] + 0.012
            out.append(cell)
    return out


def _cost_report(tmp: Path, keys: Any, root: Path, costs: list[dict[str, Any]], rule: dict[str, Any]) -> Any:
    d = make_report_bundle(
        tmp,
        keys,
        fingerprint=_demo_fingerprint(),
        provenance=make_provenance(synthetic=True, backend="synthetic", stopping_rule=rule),
        costs=costs,
        cost_summary={},
        members=("cost-table",),
        manifest=False,
    )
    ev = collect_evidence(
        [d / "cost-table.parquet"], root, now=LATER, expected=Expectation(allow_synthetic=True)
    )
    report = build_report(ev, now=LATER)
    assert report.verified, report.headline
    return report


def test_the_report_default_precision_is_the_sweeps() -> None:
    from dspark_calibrate.calibrate.measurement.stats import Thresholds

    assert Thresholds().precision_rel == DEFAULT_SWEEP_PRECISION_REL


def test_precise_demo_sweep_flags_no_cell_noisy(
    demo_sweep: Any, tmp_path: Path, keys: Any, root_path: Path
) -> None:
    rows, rule = demo_sweep
    report = _cost_report(tmp_path / "b", keys, root_path, _deployed(rows), rule)
    cost = report.cost
    assert cost.precision_recorded and cost.precision_rel == rule["precision_rel"] == 0.005
    assert cost.noisy_limit == pytest.approx(0.01)
    cells = cost.cells
    # The absolute intervals carry the between-run level term: the old rule (absolute half-width
    # over 1 % of the median) flags a cell here (seed 0), although every saving is precise.
    assert [c.label for c in cells if c.ci_half_width_rel > 0.01]
    assert all(c.stop_reason == "precision" for c in cells)
    assert [c.label for c in cells if c.noisy] == []
    assert not [c.code for c in report.checks if c.code.startswith("NOISY")]
    for c in cells:
        if not c.native:
            assert c.saving_half_width is not None and c.saving_half_width <= cost.noisy_limit


def test_a_wide_saving_interval_is_flagged(
    demo_sweep: Any, tmp_path: Path, keys: Any, root_path: Path
) -> None:
    rows, rule = demo_sweep
    report = _cost_report(tmp_path / "b", keys, root_path, _deployed(rows, widen=(8, 16)), rule)
    assert [c.label for c in report.cost.cells if c.noisy] == ["G=8 V=16"]
    noisy = [c for c in report.checks if c.code.startswith("NOISY")]
    assert [c.code for c in noisy] == ["NOISY:G=8:V=16"]
    assert "± 1.2% is wider than 1.0% (2 × the sweep's 0.5% precision target)" in noisy[0].message


def test_a_looser_sweep_allows_wider_savings(
    demo_sweep: Any, tmp_path: Path, keys: Any, root_path: Path
) -> None:
    """The limit follows the sweep's own target: the same interval is not noisy for a 2 % sweep."""
    rows, rule = demo_sweep
    loose = {**rule, "precision_rel": 0.02}
    report = _cost_report(tmp_path / "b", keys, root_path, _deployed(rows, widen=(8, 16)), loose)
    assert report.cost.noisy_limit == pytest.approx(0.04)
    assert not [c for c in report.cost.cells if c.noisy]
