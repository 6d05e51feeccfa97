"""The report's first screen: the verdict, its blockers (the heading agrees with the list), and the
release facts a release engineer must not hunt for: expiry, the deployment fingerprint, the
signer, the admission receipt's sha256 that extra_llm_api_options.yaml pins, and the prediction's
objective and regime ("not stated" when the signed summary does not state them).

The last tests open the page in headless Chromium at 1280×800 and measure where each of those
lands: all of them must be inside the first screen.
"""

from __future__ import annotations

import hashlib
import html as html_lib
import json
import re
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dspark_calibrate.artifacts import Expectation
from dspark_calibrate.calibrate.report import build_report, collect_evidence, render_html, render_markdown
from dspark_calibrate.calibrate.report.facts import FACT_KEYS, NOT_STATED
from tests.calibrate.report.test_report import (
    LATER,
    _headless,
    _needs_browser,
    _png_pixels,
    make_report_bundle,
    report_admission_summary,
)
from tests.factories import NOW
from tests.signing import make_root, make_signers

ALLOW = Expectation(allow_synthetic=True)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    return make_signers(tmp_path_factory.mktemp("keys"), 1)


@pytest.fixture(scope="module")
def root_path(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Any, ...]) -> Path:
    path = tmp_path_factory.mktemp("root") / "root.json"
    path.write_bytes(make_root(keys).to_bytes())
    return path


def _facts(report: Any) -> dict[str, Any]:
    return {f.key: f for f in report.facts}


def test_facts_of_a_bundle_that_states_nothing_new(tmp_path: Path, keys: Any, root_path: Path) -> None:
    b = make_report_bundle(tmp_path / "b", keys, expires_at=NOW + timedelta(days=3))
    report = build_report(collect_evidence([b], root_path, now=LATER), now=LATER)
    facts = _facts(report)
    assert tuple(facts) == FACT_KEYS
    # Expiry: the earliest member, how long is left, and a warning inside the window.
    assert facts["expiry"].status == "warn" and "in 2 days 23 hours" in facts["expiry"].text
    # Deployment: the fields a reviewer checks, and the ones never established.
    deployment = facts["deployment"].text
    assert "topology" in deployment and "K=" in deployment and "not established:" in deployment
    # Signer: the whole keyid, its scheme and the trust root that trusts it.
    keyid = report.identity.members[0].signer_keyids[0]
    assert re.fullmatch("[0-9a-f]{64}", keyid)
    assert f"{keyid} (ed25519)" in facts["signer"].text and "trust root v1" in facts["signer"].text
    # No package given: the receipt's digest is not stated, and the page says how to state it.
    assert facts["receipt"].status == "missing" and facts["receipt"].text.startswith(NOT_STATED)
    assert "--trtllm" in facts["receipt"].text
    # Today's summaries state no objective or regime.
    assert facts["prediction"].status == "missing"
    assert facts["prediction"].text.count(NOT_STATED) == 4


def test_facts_state_the_objective_and_regime_when_signed(tmp_path: Path, keys: Any, root_path: Path) -> None:
    summary = report_admission_summary(
        objective="latency",
        regime="arrival-bound",
        regime_source="arrival times recorded in the workload",
        planner="host planner",
        mixed_share=0.25,
    )
    b = make_report_bundle(tmp_path / "b", keys, admission_summary=summary)
    report = build_report(collect_evidence([b], root_path, now=LATER), now=LATER)
    prediction = _facts(report)["prediction"]
    assert prediction.status == "ok" and prediction.value == "latency"
    assert prediction.text == (
        "objective latency; regime arrival-bound (arrival times recorded in the workload); "
        "planner overhead charged: host planner; share of mixed steps: 25.0%"
    )
    page = render_html(report, plots=False)
    assert 'data-fact="prediction" data-status="ok" data-value="latency"' in page
    assert "| prediction | objective latency;" in render_markdown(report)


def test_a_refused_input_states_no_facts(tmp_path: Path, keys: Any) -> None:
    b = make_report_bundle(tmp_path / "b", keys)
    other = tmp_path / "other-root.json"
    other.write_bytes(make_root(make_signers(tmp_path / "k2", 1)).to_bytes())
    report = build_report(collect_evidence([b], other, now=LATER), now=LATER)
    assert not report.verified and report.facts == ()
    assert 'id="facts"' not in render_html(report, plots=False)


# ---------------------------------------------------------------------------------------------
# The demo's own page: a synthetic bundle with its TensorRT-LLM package
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(demo_run: tuple[Path, dict[str, Any]]) -> Path:
    return demo_run[0]


def _now() -> datetime:
    return datetime.now(UTC)  # the demo signs with the real clock


def _receipt_sha(package: Path) -> str:
    return hashlib.sha256((package / "admission_receipt.json").read_bytes()).hexdigest()


def test_the_demo_page_states_the_receipt_its_options_pin(demo: Path) -> None:
    ev = collect_evidence([demo / "bundle"], demo / "trust-root.json", now=_now(), expected=ALLOW, trtllm=demo / "trtllm")
    report = build_report(ev, now=_now())
    receipt = _facts(report)["receipt"]
    sha = _receipt_sha(demo / "trtllm")
    assert receipt.status == "ok" and receipt.value == sha and sha in receipt.text
    options = (demo / "trtllm" / "extra_llm_api_options.yaml").read_text()
    assert re.search(rf'confidence_admission_receipt_sha256: "?{sha}"?\n', options)
    # The same digest from the selector identity alone, without the package.
    selector = json.loads((demo / "trtllm" / "admission_receipt.json").read_bytes())["admission"]["selector_identity_sha256"]
    alone = collect_evidence(
        [demo / "bundle"], demo / "trust-root.json", now=_now(), expected=ALLOW, selector_identity=selector
    )
    assert alone.receipt is not None and alone.receipt.sha256 == sha and alone.receipt.problem is None
    # One blocker line (synthetic, three members): the heading and the headline say one.
    assert len(report.verdict.blockers) == 1 and report.headline.startswith("DO NOT DEPLOY — 1 blocker(s): SYNTHETIC")
    page = render_html(report, plots=False)
    assert "Blockers (1):" in page and page.count("<li data-family=") == 1


def test_the_terminal_first_screen_and_json_state_the_facts(demo: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dspark_calibrate.cli import build_calibrate_app

    args = ["report", str(demo / "bundle"), "--trust-root", str(demo / "trust-root.json"), "--allow-synthetic"]
    args += ["--trtllm", str(demo / "trtllm"), "--no-plots"]
    r = CliRunner().invoke(build_calibrate_app(), [*args, "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    screen = " ".join(r.stdout.split())
    sha = _receipt_sha(demo / "trtllm")
    for label in ("expires", "deployment", "signed by", "admission receipt", "prediction"):
        assert f" {label} " in screen, label
    assert f"admission receipt sha256 {sha}," in screen and "objective throughput; regime saturated" in screen
    j = CliRunner().invoke(build_calibrate_app(), [*args, "--out", str(tmp_path / "r2.html"), "--json"])
    facts = {f["key"]: f for f in json.loads(j.stdout)["facts"]}
    assert list(facts) == list(FACT_KEYS) and facts["receipt"]["value"] == sha


def _foreign_package(demo: Path, tmp: Path) -> Path:
    """The demo's package with another selector identity's receipt: not what this bundle exports."""
    package = tmp / "trtllm"
    shutil.copytree(demo / "trtllm", package)
    receipt = json.loads((package / "admission_receipt.json").read_bytes())
    receipt["admission"]["selector_identity_sha256"] = "0" * 64
    (package / "admission_receipt.json").write_text(json.dumps(receipt), encoding="utf-8")
    return package


def test_a_package_of_another_bundle_is_a_blocker(demo: Path, tmp_path: Path) -> None:
    package = _foreign_package(demo, tmp_path)
    ev = collect_evidence([demo / "bundle"], demo / "trust-root.json", now=_now(), expected=ALLOW, trtllm=package)
    report = build_report(ev, now=_now())
    assert "RECEIPT_MISMATCH" in {c.code for c in report.checks}
    receipt = _facts(report)["receipt"]
    assert receipt.status == "warn" and "not the one this bundle exports" in receipt.text
    assert len(report.verdict.blockers) == 2 and "Blockers (2):" in render_html(report, plots=False)


# ---------------------------------------------------------------------------------------------
# A real browser: the first screen at 1280×800
# ---------------------------------------------------------------------------------------------

#: Where each thing the first screen must show lives on the page.
FIRST_SCREEN = {
    "verdict": "#verdict",
    "blockers": "#blockers-heading",
    "blocker_list": "#blockers",
    "expiry": "[data-fact=expiry]",
    "deployment": "[data-fact=deployment]",
    "signer": "[data-fact=signer]",
    "receipt": "[data-fact=receipt]",
    "prediction": "[data-fact=prediction]",
}

#: Appended to a copy of the page: measures each element after layout and writes the numbers into
#: the DOM, which ``--dump-dom`` prints (the page itself carries no script).
_MEASURE = """<script>
const want = %s;
const out = {viewport: [innerWidth, innerHeight], blocker_items: document.querySelectorAll('#blockers li').length};
for (const [key, selector] of Object.entries(want)) {
  const e = document.querySelector(selector);
  if (!e) { out[key] = null; continue; }
  const r = e.getBoundingClientRect();
  out[key] = {top: r.top, bottom: r.bottom, width: r.width, height: r.height, text: e.innerText};
}
const pre = document.createElement('pre'); pre.id = 'first-screen'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def _first_screen(browser: str, page_html: str, tmp: Path) -> dict[str, Any]:
    measured = tmp / "measured.html"
    measured.write_text(page_html.replace("</body>", _MEASURE % json.dumps(FIRST_SCREEN) + "</body>"), encoding="utf-8")
    proc = _headless(
        browser, measured.as_uri(), tmp / "profile", tmp / "net.json", "--dump-dom", "--window-size=1280,800"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'<pre id="first-screen">(.*?)</pre>', proc.stdout, flags=re.S)
    assert found is not None, proc.stdout[-2000:]
    return dict(json.loads(html_lib.unescape(found.group(1))))


def _screenshot(browser: str, page: Path, tmp: Path) -> None:
    shot = tmp / "first-screen.png"
    proc = _headless(
        browser, page.as_uri(), tmp / "profile2", tmp / "net2.json", f"--screenshot={shot}", "--window-size=1280,800"
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    width, height, pixels = _png_pixels(shot)
    assert (width, height) == (1280, 800)
    dark = sum(1 for p in pixels if p < 128) / len(pixels)
    assert dark > 0.01, "the first screen is (nearly) blank"


#: The first screen's height in px: what the 1280×800 screenshot shows (the measuring run's own
#: viewport is shorter by the headless window's frame, and the layout does not depend on it).
SCREEN_HEIGHT = 800


def _assert_first_screen(box: dict[str, Any], keyid: str, receipt_sha: str, blockers: int) -> None:
    assert box["viewport"][0] == 1280
    height = SCREEN_HEIGHT
    for key in FIRST_SCREEN:
        found = box[key]
        assert found is not None, f"{key}: not on the page"
        assert found["width"] > 0 and found["height"] > 0, f"{key}: not visible"
        assert found["top"] >= 0 and found["bottom"] <= height, f"{key} lies outside the first screen: {found}"
    assert box["verdict"]["text"].startswith("DO NOT DEPLOY")
    assert box["blockers"]["text"].startswith(f"Blockers ({blockers}):") and box["blocker_items"] == blockers
    assert "UTC, in " in box["expiry"]["text"]
    assert "topology DEP8" in box["deployment"]["text"] and "not established:" in box["deployment"]["text"]
    assert keyid in box["signer"]["text"]
    assert receipt_sha in box["receipt"]["text"]
    assert "objective" in box["prediction"]["text"] and "regime" in box["prediction"]["text"]


@pytest.mark.slow
def test_first_screen_in_chromium_shows_verdict_blockers_and_release_facts(demo: Path, tmp_path: Path) -> None:
    browser = _needs_browser()
    page = demo / "report.html"  # written by the demo, with its package
    text = page.read_text(encoding="utf-8")
    keyid = json.loads((demo / "trust-root.json").read_bytes())["signatures"][0]["keyid"]
    box = _first_screen(browser, text, tmp_path)
    _assert_first_screen(box, keyid, _receipt_sha(demo / "trtllm"), blockers=1)
    _screenshot(browser, page, tmp_path)


@pytest.mark.slow
def test_first_screen_in_chromium_with_more_blockers(demo: Path, tmp_path: Path) -> None:
    """Two blockers (synthetic evidence, a package of another bundle) still leave every fact visible."""
    browser = _needs_browser()
    package = _foreign_package(demo, tmp_path)
    ev = collect_evidence([demo / "bundle"], demo / "trust-root.json", now=_now(), expected=ALLOW, trtllm=package)
    report = build_report(ev, now=_now())
    keyid = report.identity.members[0].signer_keyids[0]
    expected_sha = report.facts[FACT_KEYS.index("receipt")].value
    box = _first_screen(browser, render_html(report), tmp_path)
    _assert_first_screen(box, keyid, expected_sha, blockers=2)
