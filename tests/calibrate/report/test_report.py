"""The release report: structure, numbers against the artifacts, refusal of bad input, a real browser.

Bundles are built with the artifacts API (``sign_table`` then ``write_bundle``) from factories whose
numbers are chosen to trip each flag once: G=8 saves < 2 %, G=16 has a non-monotone and a noisy
cell, G=32 has a cell that stopped on the budget, one deployed cell is never chosen in replay.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dspark_calibrate.artifacts import (
    Expectation,
    Fingerprint,
    Provenance,
    Reason,
)
from dspark_calibrate.calibrate.report import (
    REPORT_SECTIONS,
    Evidence,
    ReportThresholds,
    Severity,
    build_report,
    collect_evidence,
    render_html,
    render_markdown,
    write_report,
)
from dspark_calibrate.errors import ConfigError
from tests.factories import NOW, K, calibration_rows, make_fingerprint, make_provenance, make_table
from tests.signing import MEMBER_FILES, make_root, make_signers, sign_bundle

LATER = NOW + timedelta(hours=1)

# ---------------------------------------------------------------------------------------------
# Factories
# ---------------------------------------------------------------------------------------------


def _cell(
    g: int, v: int, t: float, lo: float, hi: float, *, samples: int = 40, stop: str = "precision"
) -> dict[str, Any]:
    return {
        "graph_batch_size": g,
        "verifier_budget": v,
        "step_time_ms": t,
        "ci_low_ms": lo,
        "ci_high_ms": hi,
        "p10_ms": lo * 0.99,
        "p90_ms": hi * 1.01,
        "samples": samples,
        "stop_reason": stop,
        "source_result_sha256": f"{g:032x}{v:032x}",
    }


def with_paired_savings(rows: list[dict[str, Any]], half: float = 0.002) -> list[dict[str, Any]]:
    """Give every row its schema-2 paired saving (±``half``) against the native cell of its G."""
    native = {r["graph_batch_size"]: r["step_time_ms"] for r in rows if r["verifier_budget"] == 0}
    for r in rows:
        s = 1 - r["step_time_ms"] / native[r["graph_batch_size"]]
        w = 0.0 if r["verifier_budget"] == 0 else half
        r.update(
            saving=s,
            saving_ci_low=s - w,
            saving_ci_high=s + w,
            paired_rounds=8,
            common_mode_rel=0.003,
            level_rel=0.0015,
        )
    return rows


def report_costs() -> list[dict[str, Any]]:
    """Cells with one of each problem the cost-table section flags."""
    rows = with_paired_savings(
        [
            # G=8: the best compact cell saves 1 %: cannot pay.
            _cell(8, 0, 10.0, 9.97, 10.03),
            _cell(8, 16, 9.9, 9.87, 9.93),
            _cell(8, 32, 9.95, 9.92, 9.98),
            # G=16: V=32 is slower than V=64 (non-monotone); V=64's paired saving is ± 2.5 % (noisy).
            _cell(16, 0, 14.0, 13.96, 14.04),
            _cell(16, 32, 12.5, 12.46, 12.54),
            _cell(16, 64, 12.2, 11.8, 12.6),
            # G=32: good savings; V=128 stopped on the sweep budget.
            _cell(32, 0, 20.0, 19.95, 20.05),
            _cell(32, 64, 15.0, 14.97, 15.03),
            _cell(32, 128, 17.0, 16.96, 17.04, stop="budget"),
        ]
    )
    wide = next(r for r in rows if (r["graph_batch_size"], r["verifier_budget"]) == (16, 64))
    wide.update(saving_ci_low=wide["saving"] - 0.025, saving_ci_high=wide["saving"] + 0.025)
    return rows


def report_cost_summary() -> dict[str, Any]:
    """The cost table's summary: G=16 V=48 was measured, saves more than any deployed G=16 cell, left out."""
    return {
        "cells": 9,
        "k": K,
        "candidates": [
            {
                "graph_batch_size": 16,
                "verifier_budget": 48,
                "step_time_ms": 12.0,
                "ci_low_ms": 11.95,
                "ci_high_ms": 12.05,
            },
            {
                "graph_batch_size": 32,
                "verifier_budget": 96,
                "step_time_ms": 16.1,
                "ci_low_ms": 16.0,
                "ci_high_ms": 16.2,
            },
        ],
    }


def report_admission_rows() -> list[dict[str, Any]]:
    """Replay statistics: G=8 V=32 was never chosen."""
    chosen = {(8, 16): 50, (8, 32): 0, (16, 32): 120, (16, 64): 300, (32, 64): 400, (32, 128): 30}
    return [
        {
            "graph_batch_size": g,
            "verifier_budget": v,
            "chosen_steps": n,
            "value_ms": 0.01 * n,
            "value_ms_lower_bound": 0.008 * n,
        }
        for (g, v), n in sorted(chosen.items())
    ]


def report_admission_summary(**overrides: Any) -> dict[str, Any]:
    """Economics that pass the runtime's gain test; G=32 never appears in the workload."""
    base: dict[str, Any] = {
        "predicted_gain": 0.123,
        "predicted_gain_ci_low": 0.081,
        "predicted_gain_ci_high": 0.164,
        "static_goodput_tok_per_ms": 1.25,
        "dynamic_goodput_tok_per_ms": 1.40375,
        "compact_step_share": 0.6,
        "policy_steps": 1000,
        "compact_choices": 600,
        "gross_compact_value_ms_lower_bound": 900.0,
        "fixed_confidence_path_overhead_ms_upper_bound": 0.05,
        "safety_margin_ms": 100.0,
        "net_value_ms": 750.0,
        "admitted": True,
        "minimum_predicted_gain": 0.01,
        "drain_guard": {
            "loss_multiplier": 1.5,
            "mean_output_tokens_per_request_iteration": 2.3,
            "minimum_group_value_ms": 0.1,
            "tail_graph_batch_size": 8,
            "source_result_sha256": "d" * 64,
        },
        "workload_identity_sha256": "e" * 64,
        "selector_replay_sha256": "f" * 64,
        "workload_approximate": False,
        "per_bucket": [
            {
                "graph_batch_size": 8,
                "steps": 400,
                "predicted_gain": 0.004,
                "ci_low": -0.01,
                "ci_high": 0.02,
                "compact_share": 0.125,
            },
            {
                "graph_batch_size": 16,
                "steps": 600,
                "predicted_gain": 0.19,
                "ci_low": 0.15,
                "ci_high": 0.23,
                "compact_share": 0.7,
            },
        ],
    }
    base.update(overrides)
    return base


def _reliability_doc(j: int, shift: float) -> dict[str, Any]:
    edges = [i / 15 for i in range(16)]
    counts = [0 if i in (0, 14) else (j * 7 + i * 13) % 50 + 1 for i in range(15)]
    conf = [None if c == 0 else (edges[i] + edges[i + 1]) / 2 for i, c in enumerate(counts)]
    label = [None if c is None else min(1.0, max(0.0, c + shift)) for c in conf]
    return {
        "binning": "equal_width",
        "edges": edges,
        "counts": counts,
        "mean_confidence": conf,
        "mean_label": label,
        "ece": abs(shift),
        "empty_bins": counts.count(0),
    }


def report_calibration_summary(k: int = K, *, with_diagrams: bool = True) -> dict[str, Any]:
    """A calibration summary in ``fit``'s format plus the reliability bins and survival per position."""

    def est(value: float, half: float) -> dict[str, float]:
        return {"value": value, "low": value - half, "high": value + half}

    per_position = []
    for j in range(1, k + 1):
        entry: dict[str, Any] = {
            "position": j,
            "equal_width": {"before": est(0.05, 0.01), "after": est(0.01, 0.004)},
            "equal_mass": {"before": est(0.051, 0.01), "after": est(0.011, 0.004)},
            "empty_bins": {"equal_width": 2, "equal_mass": 0},
        }
        if with_diagrams:
            entry["reliability"] = {"before": _reliability_doc(j, -0.05), "after": _reliability_doc(j, 0.01)}
            predicted = round(0.9**j, 6)
            # Position K is over-confident by 0.03 (beyond the 0.02 tolerance).
            entry["mean_survival"] = {"before": predicted + 0.05, "after": predicted}
            entry["observed_survival"] = predicted - (0.03 if j == k else 0.005)
            entry["labelled"] = 20_000 - 1000 * j
        per_position.append(entry)
    return {
        "method": "sts",
        "k": k,
        "holdout_rounds": 20_000,
        "holdout_requests": 400,
        "nll_accepted_length": {"before": est(1.31, 0.02), "after": est(1.27, 0.02)},
        "brier_survival": {"before": est(0.61, 0.01), "after": est(0.58, 0.01)},
        "ea_error": {"before": est(0.21, 0.03), "after": est(-0.004, 0.02)},
        "ece": {
            "binning": {
                "bins": 15,
                "primary": "equal_width",
                "norm": "L1",
                "weights": "rounds per bin",
                "target": "S_j vs 1[A>=j] on held-out rounds with verified>=j",
                "interval": "95% percentile bootstrap over requests, 200 replicates",
            },
            "per_position": per_position,
        },
        "bootstrap": {"replicates": 200, "unit": "request", "confidence": 0.95},
        "fallbacks": [],
        "warnings": [],
    }


def make_report_bundle(
    directory: Path,
    signers: Sequence[Any],
    *,
    fingerprint: Fingerprint | None = None,
    provenance: Provenance | None = None,
    costs: Sequence[Mapping[str, Any]] | None = None,
    cost_summary: Mapping[str, Any] | None = None,
    calibration: Sequence[Mapping[str, Any]] | None = None,
    calibration_summary: Mapping[str, Any] | None = None,
    admission: Sequence[Mapping[str, Any]] | None = None,
    admission_summary: Mapping[str, Any] | None = None,
    members: Sequence[str] = ("cost-table", "calibration", "admission"),
    issued_at: datetime = NOW,
    expires_at: datetime | None = None,
    version: int = 1,
    manifest: bool = True,
) -> Path:
    """Sign the members (and, with ``manifest``, the bundle manifest) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    fp = fingerprint or make_fingerprint()
    prov = provenance or make_provenance()
    expires = expires_at or issued_at + timedelta(days=30)
    tables: dict[str, tuple[pa.Table, dict[str, Any] | None]] = {
        "cost-table": (
            make_table("cost-table", costs if costs is not None else report_costs()),
            dict(cost_summary if cost_summary is not None else report_cost_summary()),
        ),
        "calibration": (
            make_table("calibration", calibration if calibration is not None else calibration_rows()),
            dict(calibration_summary if calibration_summary is not None else report_calibration_summary()),
        ),
        "admission": (
            make_table("admission", admission if admission is not None else report_admission_rows()),
            dict(admission_summary if admission_summary is not None else report_admission_summary()),
        ),
    }
    return sign_bundle(
        directory,
        {kind: tables[kind] for kind in members},
        signers,
        version=version,
        fingerprint=fp,
        provenance=prov,
        issued_at=issued_at,
        expires_at=expires,
        manifest=manifest,
    )


class Page(HTMLParser):
    """What a reader and a test see of a rendered page."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: Counter[str] = Counter()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.ids: list[str] = []
        self.values: dict[str, str | None] = {}
        self.headings: list[str] = []
        self._hidden = 0
        self._heading: list[str] | None = None
        self._text: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags[tag] += 1
        self.elements.append((tag, a))
        if tag in ("head", "style", "script", "title"):
            self._hidden += 1
        if tag in ("h2", "h3"):
            self._heading = []
        if a.get("id"):
            self.ids.append(str(a["id"]))
        if "data-key" in a:
            self.values[str(a["data-key"])] = a.get("data-value")
        if tag in ("p", "div", "tr", "li", "h1", "h2", "h3", "br", "table", "section"):
            self._text.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("head", "style", "script", "title"):
            self._hidden -= 1
        if tag in ("h2", "h3") and self._heading is not None:
            self.headings.append(" ".join("".join(self._heading).split()))
            self._heading = None
        if tag in ("p", "div", "tr", "li", "td", "th"):
            self._text.append("\n" if tag not in ("td", "th") else " ")

    def handle_data(self, data: str) -> None:
        if self._heading is not None:
            self._heading.append(data)
        if not self._hidden:
            self._text.append(data)

    @property
    def lines(self) -> list[str]:
        """Visible text, one entry per non-empty line."""
        return [" ".join(line.split()) for line in "".join(self._text).splitlines() if line.strip()]

    def number(self, key: str) -> float:
        value = self.values[key]
        assert value is not None, key
        return float(value)

    def pair(self, key: str) -> tuple[float, float]:
        value = self.values[key]
        assert value is not None, key
        a, b = value.split(",")
        return float(a), float(b)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    return make_signers(tmp_path_factory.mktemp("keys"), 1)


@pytest.fixture(scope="module")
def root_path(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Any, ...]) -> Path:
    path = tmp_path_factory.mktemp("root") / "root.json"
    path.write_bytes(make_root(keys).to_bytes())
    return path


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Any, ...]) -> Path:
    return make_report_bundle(tmp_path_factory.mktemp("bundle") / "b", keys)


@pytest.fixture(scope="module")
def evidence(bundle: Path, root_path: Path) -> Evidence:
    return collect_evidence([bundle], root_path, now=LATER)


@pytest.fixture(scope="module")
def html(evidence: Evidence) -> str:
    """The full page, plots included (rendered once for the module)."""
    return render_html(build_report(evidence, now=LATER))


@pytest.fixture(scope="module")
def page(html: str) -> Page:
    return Page(html)


def codes(report: Any) -> set[str]:
    return {c.code for c in report.checks}


# ---------------------------------------------------------------------------------------------
# Structure (golden)
# ---------------------------------------------------------------------------------------------

#: The section and sub-section headings of a complete report, in page order.
GOLDEN_HEADINGS: tuple[str, ...] = (
    "1. Verification",
    "2. Identity",
    "Members",
    "Deployment fingerprint",
    "3. Cost table T(G, V)",
    "Saving versus the native cell",
    "Stop reasons",
    "4. Calibration",
    "Metrics before and after calibration (95% CIs, bootstrap over requests)",
    "Reliability diagrams per position",
    "Survival: predicted versus observed",
    "5. Admission",
    "Gain per concurrency bucket",
    "Receipt economics",
    "Drain guard",
    "6. What to check",
)


def test_first_line_is_the_verdict(page: Page, html: str) -> None:
    assert page.lines[0].startswith("DEPLOY — no blockers: signatures verified (bundle v1, trust root v1)")
    assert "gain test ACCEPT +12.3% (95% CI +8.1% .. +16.4%)" in page.lines[0]
    assert "<title>DEPLOY" in html


def test_sections_and_headings_golden(page: Page) -> None:
    sections = [i for i in page.ids if i in REPORT_SECTIONS]
    assert sections == [s for s in REPORT_SECTIONS if s != "mixed"]  # a decode-only bundle
    assert tuple(page.headings) == GOLDEN_HEADINGS


def test_every_plot_is_embedded(page: Page) -> None:
    alts = [a.get("alt") or "" for tag, a in page.elements if tag == "img"]
    assert len(alts) == 6  # cost curves, heat map, metrics, reliability, survival, bucket gain
    for tag, a in page.elements:
        if tag == "img":
            assert str(a["src"]).startswith("data:image/png;base64,")


def test_page_is_self_contained(page: Page, html: str) -> None:
    assert page.tags["script"] == 0 and page.tags["link"] == 0 and page.tags["iframe"] == 0
    assert page.tags["object"] == 0 and page.tags["embed"] == 0
    lowered = html.lower()
    assert (
        "http:" not in lowered
        and "https:" not in lowered
        and "//" not in re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", html)
    )
    assert "url(" not in lowered and "@import" not in lowered and "javascript:" not in lowered
    assert not re.search(r"\son[a-z]+\s*=", lowered), "no event-handler attributes"
    for tag, a in page.elements:
        if "href" in a:
            assert str(a["href"]).startswith("#"), a
            assert str(a["href"])[1:] in page.ids, f"dangling anchor {a['href']}"
        if "src" in a:
            assert str(a["src"]).startswith("data:image/png;base64,"), tag
    assert "@media print" in html and "@page" in html


def _png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, pos = [], 8
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 4], "big")
        out.append((data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]))
        pos += 12 + n
    return out


def test_embedded_pngs_carry_no_url_or_software_tag(page: Page) -> None:
    for tag, a in page.elements:
        if tag != "img":
            continue
        data = base64.b64decode(str(a["src"]).split(",", 1)[1])
        chunks = _png_chunks(data)
        text = b"".join(body for kind, body in chunks if kind in (b"tEXt", b"iTXt", b"zTXt"))
        assert b"http" not in text.lower() and b"Software" not in text
        assert len(data) > 5_000  # a real plot, not an empty canvas


# ---------------------------------------------------------------------------------------------
# Numbers match the artifacts
# ---------------------------------------------------------------------------------------------


def test_cost_table_numbers(page: Page, evidence: Evidence) -> None:
    table = evidence.artifacts["cost-table"].table.to_pylist()
    native = {r["graph_batch_size"]: r["step_time_ms"] for r in table if r["verifier_budget"] == 0}
    for r in table:
        key = f"cost:{r['graph_batch_size']}:{r['verifier_budget']}"
        assert page.number(f"{key}:step_time_ms") == r["step_time_ms"]
        assert page.pair(f"{key}:ci") == (r["ci_low_ms"], r["ci_high_ms"])
        assert page.number(f"{key}:samples") == r["samples"]
        tokens = r["graph_batch_size"] * (K + 1) if r["verifier_budget"] == 0 else r["verifier_budget"]
        assert page.number(f"{key}:tokens") == tokens
        if r["verifier_budget"]:
            saving = 1 - r["step_time_ms"] / native[r["graph_batch_size"]]
            assert page.number(f"{key}:saving") == pytest.approx(saving, rel=1e-12)
            assert page.number(f"heat:{r['graph_batch_size']}:{r['verifier_budget']}") == pytest.approx(
                saving, rel=1e-12
            )
    assert page.number("stop:precision") == 8 and page.number("stop:budget") == 1
    for cand in evidence.artifacts["cost-table"].summary["candidates"]:
        key = f"candidate:{cand['graph_batch_size']}:{cand['verifier_budget']}"
        assert page.number(f"{key}:step_time_ms") == cand["step_time_ms"]
        assert page.pair(f"{key}:ci") == (cand["ci_low_ms"], cand["ci_high_ms"])
        native = next(
            r["step_time_ms"]
            for r in table
            if r["verifier_budget"] == 0 and r["graph_batch_size"] == cand["graph_batch_size"]
        )
        assert page.number(f"{key}:saving") == pytest.approx(1 - cand["step_time_ms"] / native, rel=1e-12)


def test_cost_table_replay_columns(page: Page, evidence: Evidence) -> None:
    for r in evidence.artifacts["admission"].table.to_pylist():
        key = f"cost:{r['graph_batch_size']}:{r['verifier_budget']}"
        assert page.number(f"{key}:chosen_steps") == r["chosen_steps"]
        assert page.number(f"{key}:value_ms") == r["value_ms"]


def test_cost_flags(evidence: Evidence) -> None:
    report = build_report(evidence, now=LATER)
    assert report.cost is not None
    cells = {(c.graph_batch_size, c.verifier_budget): c for c in report.cost.cells}
    assert {k for k, c in cells.items() if c.non_monotone} == {(16, 32)}
    assert {k for k, c in cells.items() if c.noisy} == {(16, 64), (32, 128)}
    assert cells[(32, 64)].saving == pytest.approx(0.25)
    assert cells[(8, 32)].chosen_steps == 0
    group8 = report.cost.groups[0]
    assert group8.best is not None and group8.best.verifier_budget == 16


def test_calibration_numbers(page: Page, evidence: Evidence) -> None:
    art = evidence.artifacts["calibration"]
    for r in art.table.to_pylist():
        j = r["position"]
        assert page.number(f"cal:{j}:temperature") == r["temperature"]
        assert page.number(f"cal:{j}:risk_set_size") == r["risk_set_size"]
        assert page.pair(f"cal:{j}:ece") == (r["ece_before"], r["ece_after"])
        assert page.pair(f"cal:{j}:nll") == (r["nll_before"], r["nll_after"])
    for entry in art.summary["ece"]["per_position"]:
        j = entry["position"]
        counts = entry["reliability"]["after"]["counts"]
        assert [page.number(f"bins:{j}:{i}") for i in range(15)] == counts
        assert page.number(f"bins:{j}:total") == sum(counts)
        assert page.number(f"bins:{j}:empty") == counts.count(0)
        assert page.number(f"surv:{j}:predicted") == entry["mean_survival"]["after"]
        assert page.number(f"surv:{j}:observed") == entry["observed_survival"]
        assert (
            page.number(f"metric:ECE position {j} (equal width):after")
            == entry["equal_width"]["after"]["value"]
        )
    nll = art.summary["nll_accepted_length"]
    assert page.number("metric:NLL of accepted length (nats/round):before") == nll["before"]["value"]
    assert page.number("metric:NLL of accepted length (nats/round):after") == nll["after"]["value"]


def test_metric_cis_shown(evidence: Evidence) -> None:
    report = build_report(evidence, now=LATER)
    assert report.calibration is not None
    by_name = {m.name: m for m in report.calibration.metrics}
    brier = by_name["survival Brier (per round)"]
    assert brier.before_ci == pytest.approx((0.60, 0.62)) and brier.after_ci == pytest.approx((0.57, 0.59))
    assert report.calibration.holdout_rounds == 20_000 and report.calibration.binning is not None
    assert "15 equal_width bins" in report.calibration.binning and "L1" in report.calibration.binning


def test_admission_numbers(page: Page, evidence: Evidence) -> None:
    s = evidence.artifacts["admission"].summary
    assert page.number("admission:predicted_gain") == s["predicted_gain"]
    assert page.pair("admission:predicted_gain_ci") == (
        s["predicted_gain_ci_low"],
        s["predicted_gain_ci_high"],
    )
    assert page.number("admission:compact_step_share") == s["compact_step_share"]
    for name in (
        "policy_steps",
        "compact_choices",
        "gross_compact_value_ms_lower_bound",
        "fixed_confidence_path_overhead_ms_upper_bound",
        "safety_margin_ms",
        "net_value_ms",
    ):
        assert page.number(f"econ:{name}") == s[name], name
    assert page.number("econ:recomputed_net_value_ms") == pytest.approx(900.0 - 1000 * 0.05 - 100.0)
    assert page.values["econ:admitted"] == "true" and page.values["econ:receipt_rule"] == "true"
    for b in s["per_bucket"]:
        key = f"bucket:{b['graph_batch_size']}"
        assert page.number(f"{key}:predicted_gain") == b["predicted_gain"]
        assert page.pair(f"{key}:ci") == (b["ci_low"], b["ci_high"])
        assert page.number(f"{key}:compact_share") == b["compact_share"]
        assert page.number(f"{key}:steps") == b["steps"]
    assert (
        "ACCEPT"
        in page.lines[page.lines.index(next(x for x in page.lines if x.startswith("Runtime gain test")))]
    )


def test_identity_numbers(page: Page, evidence: Evidence, html: str) -> None:
    for kind, art in evidence.artifacts.items():
        assert page.number(f"identity:{kind}:version") == art.version
        assert page.number(f"identity:{kind}:rows") == art.table.num_rows
        assert art.logical_sha256 in html
        for kid in art.signer_keyids:
            assert kid in html
    assert "23b73d8" in html  # fingerprint.source_head


def test_what_to_check_is_data_driven(evidence: Evidence, page: Page) -> None:
    report = build_report(evidence, now=LATER)
    found = codes(report)
    expected = {
        "LOW_SAVING:G=8",
        "NON_MONOTONE:G=16:V=32",
        "NOISY:G=16:V=64",
        "STOP_REASON:G=32:V=128",
        "NEVER_CHOSEN:G=8:V=32",
        "SURVIVAL_GAP:j=5",
        "BUCKET_UNDECIDED:G=8",
        "BUCKETS_ABSENT",
        "UNDEPLOYED_FASTER:G=16:V=48",
    }
    assert expected <= found, expected - found
    assert not report.blockers, [c.message for c in report.blockers]
    low = next(c for c in report.checks if c.code == "LOW_SAVING:G=8")
    assert low.message.startswith("G=8 saves < 2.0%") and "cannot pay at this concurrency" in low.message
    rendered = {
        code
        for tag, a in page.elements
        if tag == "li" and a.get("data-codes") and a.get("data-severity")
        for code in str(a["data-codes"]).split()
    }
    assert rendered == found
    severities = [c.severity for c in report.checks]
    assert severities == sorted(severities, key=[Severity.BLOCKER, Severity.WARNING, Severity.INFO].index)


@pytest.mark.slow
def test_rendering_is_deterministic(evidence: Evidence, html: str) -> None:
    assert render_html(build_report(evidence, now=LATER)) == html


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------


def test_markdown_report(evidence: Evidence) -> None:
    md = render_markdown(build_report(evidence, now=LATER))
    lines = md.splitlines()
    assert lines[0].startswith("DEPLOY — no blockers")
    for heading in (
        "## Verification",
        "## Identity",
        "## Cost table",
        "## Calibration",
        "## Admission",
        "## What to check",
    ):
        assert heading in lines, heading
    assert "| 16 | 64 | 64 | 12.200 | [11.800, 12.600] |" in md
    assert "noisy" in md and "non-monotone" in md and "never chosen" in md
    assert "| 8 | 400 | 0.4% | [-1.0%, 2.0%] | 12.5% |" in md
    assert "| 1 | sts | 1.1 |" in md  # position 1 temperature
    assert not re.search(r"<[A-Za-z/!]", md)  # plain Markdown, no HTML
    assert "http" not in md


# ---------------------------------------------------------------------------------------------
# Bad input: a report that says so on its first line and shows nothing as trusted
# ---------------------------------------------------------------------------------------------


def _tamper_table(bundle_dir: Path) -> None:
    import pyarrow.parquet as pq

    path = bundle_dir / "cost-table.parquet"
    pf = pq.ParquetFile(path)
    meta = pf.metadata.metadata
    table = pf.read()
    col = table.column("step_time_ms").to_pylist()
    col[0] = col[0] * 0.5
    table = table.set_column(
        table.schema.get_field_index("step_time_ms"), "step_time_ms", pa.array(col, pa.float64())
    )
    pq.write_table(table.replace_schema_metadata(meta), path)


def _garbage(bundle_dir: Path) -> None:
    (bundle_dir / "calibration.parquet").write_bytes(b"not a parquet file at all")


def _drop_manifest(bundle_dir: Path) -> None:
    (bundle_dir / "bundle.dsse.json").unlink()


def _drop_member(bundle_dir: Path) -> None:
    (bundle_dir / "admission.parquet").unlink()
    (bundle_dir / "admission.parquet.dsse.json").unlink()


BAD_BUNDLES = [
    pytest.param(_tamper_table, {}, Reason.LOGICAL_HASH_MISMATCH, id="table-altered-after-signing"),
    pytest.param(_garbage, {}, Reason.NOT_PARQUET, id="member-not-parquet"),
    pytest.param(_drop_manifest, {}, Reason.BUNDLE_MEMBER_MISSING, id="no-manifest"),
    pytest.param(_drop_member, {}, Reason.BUNDLE_MEMBER_MISSING, id="member-file-missing"),
    pytest.param(None, {"expires_at": NOW + timedelta(minutes=30)}, Reason.EXPIRED, id="expired"),
    pytest.param(
        None,
        {"provenance": make_provenance(synthetic=True, backend="synthetic")},
        Reason.SYNTHETIC_REFUSED,
        id="synthetic-refused",
    ),
]


@pytest.mark.parametrize(("spoil", "factory_args", "reason"), BAD_BUNDLES)
def test_bad_bundle_gets_an_untrusted_report(
    tmp_path: Path,
    keys: tuple[Any, ...],
    root_path: Path,
    spoil: Any,
    factory_args: dict[str, Any],
    reason: Reason,
) -> None:
    b = make_report_bundle(tmp_path / "b", keys, **factory_args)
    if spoil is not None:
        spoil(b)
    out = tmp_path / "report.html"
    report = write_report([b], root_path, out, now=LATER)
    assert not report.verified
    assert report.findings[0].reason is reason, report.findings[0].message
    _assert_untrusted_page(out.read_text(encoding="utf-8"), reason)
    md = tmp_path / "report.md"
    write_report([b], root_path, md, now=LATER, fmt="md")
    assert (
        md.read_text(encoding="utf-8")
        .splitlines()[0]
        .startswith(f"DO NOT DEPLOY — NOT VERIFIED: {reason.value}")
    )


def _assert_untrusted_page(html: str, reason: Reason) -> None:
    page = Page(html)
    assert page.lines[0].startswith(f"DO NOT DEPLOY — NOT VERIFIED: {reason.value}")
    assert "Nothing in this report is trusted" in page.lines[0]
    assert "<title>DO NOT DEPLOY — NOT VERIFIED" in html
    withheld = {"identity", "cost-table", "calibration", "admission"}
    assert not withheld & set(page.ids)
    assert not [
        k
        for k in page.values
        if k.split(":")[0]
        in ("cost", "cal", "bins", "surv", "econ", "bucket", "heat", "admission", "identity")
    ]
    assert page.tags["img"] == 0
    assert "12.200" not in html and "14.000" not in html  # no step time from the refused table
    assert "<script" not in html.lower() and "http" not in html.lower()


def test_wrong_trust_root(tmp_path: Path, bundle: Path) -> None:
    other = make_signers(tmp_path / "other", 1, prefix="x")
    root = tmp_path / "other-root.json"
    root.write_bytes(make_root(other).to_bytes())
    report = write_report([bundle], root, tmp_path / "r.html", now=LATER)
    assert report.findings[0].reason in (
        Reason.SIGNATURE_INVALID,
        Reason.SIGNATURE_THRESHOLD,
        Reason.SIGNATURE_MISSING,
    )
    _assert_untrusted_page((tmp_path / "r.html").read_text(encoding="utf-8"), report.findings[0].reason)


def test_untrusted_inputs_listed_as_claims(tmp_path: Path, keys: tuple[Any, ...], root_path: Path) -> None:
    b = make_report_bundle(tmp_path / "b", keys, fingerprint=make_fingerprint(gpu="H100"))
    _tamper_table(b)
    report = build_report(collect_evidence([b], root_path, now=LATER), now=LATER)
    rows = {Path(u.path).name: u for u in report.untrusted}
    assert set(rows) == {"admission.parquet", "calibration.parquet", "cost-table.parquet", "bundle.dsse.json"}
    assert rows["cost-table.parquet"].claimed_kind == "cost-table"
    assert ("gpu", "H100") in rows["cost-table.parquet"].claims
    assert rows["cost-table.parquet"].file_sha256 is not None
    html = render_html(report)
    assert "UNTRUSTED" in html and "H100" in html


@pytest.mark.parametrize(
    ("make_root_file", "reason", "io_error"),
    [
        # Unreadable is the same TRUST_ROOT_INVALID the admission hook reports, and still an I/O
        # error for the exit code (a wrong path, not bad evidence).
        pytest.param(lambda p, keys: None, Reason.TRUST_ROOT_INVALID, True, id="missing"),
        pytest.param(lambda p, keys: p.mkdir(), Reason.TRUST_ROOT_INVALID, True, id="directory"),
        pytest.param(
            lambda p, keys: p.write_bytes(b"{not json"), Reason.TRUST_ROOT_INVALID, False, id="not-json"
        ),
        pytest.param(
            lambda p, keys: p.write_bytes(b" " * ((1 << 20) + 1)),
            Reason.TRUST_ROOT_INVALID,
            False,
            id="too-large",
        ),
        pytest.param(
            lambda p, keys: p.write_bytes(make_root(keys, expires=NOW + timedelta(minutes=10)).to_bytes()),
            Reason.TRUST_ROOT_EXPIRED,
            False,
            id="expired",
        ),
    ],
)
def test_bad_trust_root(
    tmp_path: Path, keys: tuple[Any, ...], bundle: Path, make_root_file: Any, reason: Reason, io_error: bool
) -> None:
    root = tmp_path / "root.json"
    make_root_file(root, keys)
    report = write_report([bundle], root, tmp_path / "r.html", now=LATER)
    assert report.findings[0].reason is reason
    assert report.findings[0].field == "trust_root"
    assert report.trust_root is None
    _assert_untrusted_page((tmp_path / "r.html").read_text(encoding="utf-8"), reason)
    assert report.io_error is io_error


def test_missing_input_is_an_io_error(tmp_path: Path, root_path: Path) -> None:
    report = write_report([tmp_path / "nope.parquet"], root_path, tmp_path / "r.html", now=LATER)
    assert report.io_error and not report.verified
    assert report.untrusted[0].read_error is not None


def test_argument_errors(tmp_path: Path, bundle: Path, root_path: Path) -> None:
    with pytest.raises(ConfigError):
        collect_evidence([], root_path, now=LATER)
    with pytest.raises(ConfigError):
        collect_evidence([bundle, bundle / "cost-table.parquet"], root_path, now=LATER)
    with pytest.raises(ConfigError):
        write_report([bundle], root_path, tmp_path / "r.txt", now=LATER, fmt="pdf")  # type: ignore[arg-type]  # an invalid format on purpose
    with pytest.raises(ConfigError):
        write_report([bundle], root_path, tmp_path / "missing-dir" / "r.html", now=LATER, plots=False)
    with pytest.raises(ConfigError):
        ReportThresholds(noisy_precision_multiple=float("nan"))
    with pytest.raises(ConfigError):
        ReportThresholds(noisy_precision_multiple=0.5)
    with pytest.raises(ConfigError):
        ReportThresholds(min_samples=-1)


# ---------------------------------------------------------------------------------------------
# Loose artifacts, partial bundles, flagged content
# ---------------------------------------------------------------------------------------------


def test_loose_artifacts(tmp_path: Path, keys: tuple[Any, ...], root_path: Path) -> None:
    d = make_report_bundle(tmp_path / "loose", keys, manifest=False)
    files = [d / MEMBER_FILES[k] for k in ("cost-table", "calibration")]
    report = build_report(collect_evidence(files, root_path, now=LATER), now=LATER)
    assert report.verified and report.headline.startswith(
        "DO NOT DEPLOY — 1 blocker(s): MEMBER_ABSENT:admission"
    )
    found = codes(report)
    assert {"NOT_A_BUNDLE", "MEMBER_ABSENT:admission"} <= found
    gates = {g.section: g.status for g in report.verdict.gates}
    assert gates == {
        "verification": "pass",
        "identity": "fail",
        "cost-table": "pass",
        "calibration": "pass",
        "admission": "not checked",
    }
    assert report.admission is None and report.cost is not None and not report.cost.has_replay
    page = Page(render_html(report, plots=False))
    assert "admission" not in page.ids and "cost-table" in page.ids


def test_loose_artifacts_from_two_deployments(tmp_path: Path, keys: tuple[Any, ...], root_path: Path) -> None:
    a = make_report_bundle(tmp_path / "a", keys, manifest=False, members=("cost-table",))
    b = make_report_bundle(
        tmp_path / "b",
        keys,
        manifest=False,
        members=("calibration",),
        fingerprint=make_fingerprint(gpu="H100"),
    )
    report = build_report(
        collect_evidence([a / "cost-table.parquet", b / "calibration.parquet"], root_path, now=LATER),
        now=LATER,
    )
    assert not report.verified
    assert report.findings[0].reason is Reason.CROSS_MEMBER_MISMATCH and report.findings[0].field == "gpu"


def test_two_artifacts_of_one_kind(tmp_path: Path, keys: tuple[Any, ...], root_path: Path) -> None:
    a = make_report_bundle(tmp_path / "a", keys, manifest=False, members=("cost-table",))
    b = make_report_bundle(tmp_path / "b", keys, manifest=False, members=("cost-table",))
    report = build_report(
        collect_evidence([a / "cost-table.parquet", b / "cost-table.parquet"], root_path, now=LATER),
        now=LATER,
    )
    assert not report.verified and report.findings[0].reason is Reason.BUNDLE_INVALID


def test_synthetic_allowed_is_a_blocker(tmp_path: Path, keys: tuple[Any, ...], root_path: Path) -> None:
    b = make_report_bundle(
        tmp_path / "b", keys, provenance=make_provenance(synthetic=True, backend="synthetic")
    )
    ev = collect_evidence([b], root_path, now=LATER, expected=Expectation(allow_synthetic=True))
    report = build_report(ev, now=LATER)
    assert report.verified
    assert {"SYNTHETIC:cost-table", "SYNTHETIC:calibration", "SYNTHETIC:admission"} <= {
        c.code for c in report.blockers
    }
    assert "SYNTHETIC" in render_markdown(report)


def test_gain_not_proven_and_economics_mismatch(
    tmp_path: Path, keys: tuple[Any, ...], root_path: Path
) -> None:
    summary = report_admission_summary(
        predicted_gain=0.004,
        predicted_gain_ci_low=-0.002,
        predicted_gain_ci_high=0.009,
        net_value_ms=751.0,
        drain_guard=None,
    )
    b = make_report_bundle(tmp_path / "b", keys, admission_summary=summary)
    report = build_report(collect_evidence([b], root_path, now=LATER), now=LATER)
    assert report.admission is not None and report.admission.gain_status == "REJECT"
    assert {"GAIN_REJECT", "NET_VALUE_MISMATCH", "NO_DRAIN_GUARD"} <= {c.code for c in report.blockers}
    assert report.headline.startswith("DO NOT DEPLOY — 3 blocker(s): GAIN_REJECT; NET_VALUE_MISMATCH")
    assert not report.verdict.deploy and "Signatures verified" in report.headline


def test_unreadable_admission_summary(tmp_path: Path, keys: tuple[Any, ...], root_path: Path) -> None:
    summary = report_admission_summary(admitted=False)  # contradicts the receipt rule
    del summary["per_bucket"]
    b = make_report_bundle(tmp_path / "b", keys, admission_summary=summary)
    report = build_report(collect_evidence([b], root_path, now=LATER), now=LATER)
    assert report.admission is not None and report.admission.gain_status == "UNKNOWN"
    assert {"GAIN_UNKNOWN", "ADMITTED_MISMATCH"} <= {c.code for c in report.blockers}
    assert "summary.per_bucket is missing" in report.admission.problems
    render_html(report, plots=False)


def test_runtime_cross_member_findings(tmp_path: Path, keys: tuple[Any, ...], root_path: Path) -> None:
    rows = calibration_rows()
    rows[2] = {**rows[2], "temperature": None, "method": "isotonic"}
    b = make_report_bundle(tmp_path / "b", keys, calibration=rows)
    report = build_report(collect_evidence([b], root_path, now=LATER), now=LATER)
    assert report.verified and report.runtime_findings
    assert {"CONTENT_INVALID:calibration.temperature", "NO_STS_TEMPERATURE:j=3"} <= {
        c.code for c in report.blockers
    }
    assert "The runtime admission hook would still refuse this evidence" in render_html(report, plots=False)


@pytest.mark.slow
def test_calibration_summary_without_diagrams(tmp_path: Path, keys: tuple[Any, ...], root_path: Path) -> None:
    b = make_report_bundle(
        tmp_path / "b", keys, calibration_summary=report_calibration_summary(with_diagrams=False)
    )
    report = build_report(collect_evidence([b], root_path, now=LATER), now=LATER)
    assert report.calibration is not None
    assert not report.calibration.reliability and not report.calibration.survival
    assert report.calibration.metrics  # the CIs are still there
    assert "CALIBRATION_SUMMARY_INCOMPLETE" in codes(report)
    page = Page(render_html(report))
    assert "Reliability diagrams per position" not in page.headings
    assert page.tags["img"] == 4


def test_malformed_candidates_are_reported(tmp_path: Path, keys: tuple[Any, ...], root_path: Path) -> None:
    summary = {
        "candidates": [
            {"graph_batch_size": 8, "verifier_budget": 24},
            "junk",
            report_cost_summary()["candidates"][0],
        ]
    }
    b = make_report_bundle(tmp_path / "b", keys, cost_summary=summary)
    report = build_report(collect_evidence([b], root_path, now=LATER), now=LATER)
    assert report.cost is not None and len(report.cost.problems) == 2
    assert [(c.graph_batch_size, c.verifier_budget) for c in report.cost.candidates] == [(16, 48)]
    assert "COST_SUMMARY_FIELD" in codes(report)


def test_expiry_warning_and_native_only_group(tmp_path: Path, keys: tuple[Any, ...], root_path: Path) -> None:
    costs = [r for r in report_costs() if not (r["graph_batch_size"] == 32 and r["verifier_budget"])]
    admission = [r for r in report_admission_rows() if r["graph_batch_size"] != 32]
    b = make_report_bundle(
        tmp_path / "b", keys, costs=costs, admission=admission, expires_at=NOW + timedelta(days=3)
    )
    report = build_report(collect_evidence([b], root_path, now=LATER), now=LATER)
    assert {"EXPIRES_SOON:cost-table", "NATIVE_ONLY:G=32"} <= codes(report)
    assert report.cost is not None and report.cost.groups[2].best is None


@pytest.mark.slow
def test_real_fit_summary_renders(tmp_path: Path, keys: tuple[Any, ...], root_path: Path) -> None:
    """The summary ``fit`` actually writes feeds the calibration section (metrics and their CIs)."""
    from dspark_calibrate.calibrate.confidence.fit import FitOptions, fit_traces
    from dspark_calibrate.calibrate.confidence.synth_traces import SynthSpec, synth_traces

    result = fit_traces(
        synth_traces(SynthSpec(rounds=4000, k=K, rounds_per_request=40)),
        FitOptions(method="sts", bootstrap=30),
    )
    b = make_report_bundle(
        tmp_path / "b", keys, calibration=result.table().to_pylist(), calibration_summary=result.summary()
    )
    report = build_report(collect_evidence([b], root_path, now=LATER), now=LATER)
    assert report.verified and report.calibration is not None
    by_name = {m.name: m for m in report.calibration.metrics}
    nll = result.summary()["nll_accepted_length"]["after"]
    assert by_name["NLL of accepted length (nats/round)"].after == nll["value"]
    assert by_name["NLL of accepted length (nats/round)"].after_ci == (nll["low"], nll["high"])
    assert len([m for m in report.calibration.metrics if m.name.startswith("ECE position")]) == K
    page = Page(render_html(report))
    assert page.number("metric:NLL of accepted length (nats/round):after") == nll["value"]


# ---------------------------------------------------------------------------------------------
# A real headless browser renders the page and fetches nothing
# ---------------------------------------------------------------------------------------------

CHROMIUM_NAMES = ("chromium", "chromium-browser")


def _chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _headless(
    browser: str, url: str, profile: Path, netlog: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    args = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--log-net-log={netlog}",
        *extra,
        url,
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def _load_netlog(path: Path) -> dict[str, Any]:
    raw = path.read_text(encoding="utf-8").rstrip()
    try:
        return dict(json.loads(raw))
    except json.JSONDecodeError:
        # A net log cut short (browser killed) lacks its closing brackets.
        return dict(json.loads(raw.rstrip(",") + "]}"))


def page_requests(netlog: Path) -> list[str]:
    """Network URLs requested on behalf of a page loaded from a file: URL.

    Chromium keys every request a page makes by the page's top-frame site; for a file: page that is
    ``file://``. The browser's own background requests (update checks, time queries) are keyed
    otherwise, so they are not counted.
    """
    log = _load_netlog(netlog)
    out = []
    for event in log.get("events", []):
        params = event.get("params") or {}
        key = str(params.get("network_isolation_key", "")) + str(params.get("network_anonymization_key", ""))
        target = str(params.get("url") or params.get("host") or "")
        if "file://" in key and target and not target.startswith(("file:", "data:")):
            out.append(target)
    return sorted(set(out))


def _png_pixels(path: Path) -> tuple[int, int, list[int]]:
    """Width, height and grey levels of an 8-bit RGB(A) PNG (enough for screenshot checks)."""
    from PIL import Image

    with Image.open(path) as img:
        grey = img.convert("L")
        return grey.width, grey.height, list(grey.tobytes())


def _needs_browser() -> str:
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium is required in CI (apt-get install -y chromium)")
        pytest.skip("chromium is not installed (apt-get install -y chromium)")
    return browser


@pytest.mark.slow
def test_browser_renders_without_network(tmp_path: Path, html: str) -> None:
    browser = _needs_browser()
    page_file = tmp_path / "report.html"
    page_file.write_text(html, encoding="utf-8")
    shot = tmp_path / "shot.png"
    netlog = tmp_path / "net.json"
    proc = _headless(
        browser,
        page_file.as_uri(),
        tmp_path / "profile",
        netlog,
        f"--screenshot={shot}",
        "--window-size=1280,2400",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 20_000
    width, height, pixels = _png_pixels(shot)
    assert (width, height) == (1280, 2400)
    mean = sum(pixels) / len(pixels)
    variance = sum((p - mean) ** 2 for p in pixels) / len(pixels)
    assert variance > 200.0, "the screenshot is blank or nearly uniform"
    dark = sum(1 for p in pixels if p < 128) / len(pixels)
    assert dark > 0.005, "no text or plot was drawn"
    assert netlog.stat().st_size > 0
    assert page_requests(netlog) == []


@pytest.mark.slow
def test_browser_network_check_detects_external_requests(tmp_path: Path) -> None:
    """The control: the same check flags a page that does fetch (addresses that go nowhere)."""
    browser = _needs_browser()
    page_file = tmp_path / "leaky.html"
    page_file.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>t</title>'
        '<link rel="stylesheet" href="http://127.0.0.1:9/s.css"></head>'
        '<body><p>x</p><img src="https://report-test.invalid/x.png"></body></html>',
        encoding="utf-8",
    )
    netlog = tmp_path / "net.json"
    proc = _headless(
        browser,
        page_file.as_uri(),
        tmp_path / "profile",
        netlog,
        f"--screenshot={tmp_path / 's.png'}",
        "--window-size=400,300",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    requests = page_requests(netlog)
    assert any("127.0.0.1:9/s.css" in u for u in requests), requests
    assert any("report-test.invalid" in u for u in requests), requests


@pytest.mark.slow
def test_browser_prints_to_pdf(tmp_path: Path, html: str) -> None:
    browser = _needs_browser()
    page_file = tmp_path / "report.html"
    page_file.write_text(html, encoding="utf-8")
    pdf = tmp_path / "report.pdf"
    proc = _headless(
        browser,
        page_file.as_uri(),
        tmp_path / "profile",
        tmp_path / "net.json",
        f"--print-to-pdf={pdf}",
        "--no-pdf-header-footer",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = pdf.read_bytes()
    assert data.startswith(b"%PDF-") and len(data) > 50_000
    # Page objects, or the page tree's count when the writer packs objects into compressed streams.
    counts = [int(n) for n in re.findall(rb"/Count\s+(\d+)", data)]
    pages = max([len(re.findall(rb"/Type\s*/Page\b", data)), *counts])
    assert pages >= 5, pages  # the print stylesheet starts each section on a new page
    assert page_requests(tmp_path / "net.json") == []


def test_page_requests_parser_on_a_recorded_shape(tmp_path: Path) -> None:
    """The net-log reader, on the event shapes Chromium writes (no browser needed)."""
    log = {
        "constants": {},
        "events": [
            {"params": {"url": "https://update.example/x", "network_isolation_key": "null null"}},
            {
                "params": {
                    "url": "https://cdn.example/a.css",
                    "network_isolation_key": "file:// [internally: file://] file://",
                }
            },
            {"params": {"host": "https://cdn.example", "network_anonymization_key": "file:// same_site"}},
            {"params": {"url": "file:///tmp/report.html", "network_isolation_key": "file://"}},
        ],
    }
    path = tmp_path / "net.json"
    path.write_text(json.dumps(log)[:-2], encoding="utf-8")  # truncated, as after a kill
    assert page_requests(path) == ["https://cdn.example", "https://cdn.example/a.css"]


# ---------------------------------------------------------------------------------------------
# Mixed prefill+decode evidence
# ---------------------------------------------------------------------------------------------


def test_mixed_section_shows_the_cells_and_the_mixed_share(mixed_dep8: Any) -> None:
    from dspark_calibrate.artifacts import read_artifact

    allow = Expectation(allow_synthetic=True)
    ev = collect_evidence([mixed_dep8.bundle], mixed_dep8.root_file, now=LATER, expected=allow)
    report = build_report(ev, now=LATER)
    mx = report.mixed
    s = mixed_dep8.result.mixed_summary
    assert mx is not None and mx.valid
    assert mx.share == pytest.approx(s["mixed_part"]["share"])
    table = read_artifact(mixed_dep8.bundle / "mixed" / "mixed-cost-table.parquet").table
    assert len(mx.cells) == table.num_rows > 0
    page = Page(render_html(report))
    assert "mixed" in page.ids and "Deployed mixed cells" in page.headings
    assert page.number("mixed:predicted_gain") == pytest.approx(s["predicted_gain"], abs=5e-4)
    assert page.number("mixed:mixed_part") == pytest.approx(s["mixed_part"]["predicted_gain"], abs=5e-4)
    for c in mx.cells:
        key = f"mixedcell:{c.geometry_sha256}:native_lower_ms"
        assert page.number(key) == pytest.approx(c.native_lower_ms, rel=1e-3)
    md = render_markdown(report)
    assert "## Mixed prefill+decode evidence" in md
    assert f"({mx.mixed_steps} of {mx.workload_steps};" in md


def test_refused_mixed_evidence_is_shown_and_decode_stands(mixed_dep8: Any, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(mixed_dep8.bundle, bundle)
    (bundle / "mixed" / "results" / "runtime_invariants.json").write_bytes(b"{}")
    report = build_report(
        collect_evidence(
            [bundle], mixed_dep8.root_file, now=LATER, expected=Expectation(allow_synthetic=True)
        ),
        now=LATER,
    )
    assert report.verified and report.mixed is not None and not report.mixed.valid
    assert "BUNDLE_MEMBER_MISMATCH" in report.mixed.reason
    assert "MIXED_REFUSED" in codes(report)
