"""``dspark-calibrate report``: exit codes, the written page, ``--json``, and the installed entry point."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dspark_calibrate.cli import build_calibrate_app
from tests.calibrate.report.test_report import Page, make_report_bundle
from tests.factories import make_provenance
from tests.signing import make_root, make_signers

runner = CliRunner()
#: Signing time of these bundles: the CLI verifies against the real clock.
ISSUED = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)


@pytest.fixture(scope="module")
def app() -> Any:
    return build_calibrate_app()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    return make_signers(tmp_path_factory.mktemp("keys"), 1)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Any, ...]) -> Path:
    path = tmp_path_factory.mktemp("root") / "root.json"
    path.write_bytes(make_root(keys, expires=ISSUED + timedelta(days=365)).to_bytes())
    return path


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Any, ...]) -> Path:
    return make_report_bundle(tmp_path_factory.mktemp("bundle") / "b", keys, issued_at=ISSUED)


def invoke(app: Any, *args: str | Path) -> Any:
    return runner.invoke(app, ["report", *[str(a) for a in args]])


def test_valid_bundle_html(app: Any, bundle: Path, root: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    result = invoke(app, bundle, "--trust-root", root, "--out", out, "--no-plots")
    assert result.exit_code == 0, result.output
    assert "DEPLOY — no blockers" in result.output and f"report written to {out}" in result.output
    page = Page(out.read_text(encoding="utf-8"))
    assert page.lines[0].startswith("DEPLOY — no blockers: signatures verified (bundle v1")
    assert {"verification", "identity", "cost-table", "calibration", "admission", "what-to-check"} <= set(
        page.ids
    )


def test_markdown_and_json(app: Any, bundle: Path, root: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    result = invoke(app, bundle, "--trust-root", root, "--out", out, "--format", "md", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["verified"] is True and doc["exit_code"] == 0 and doc["out"] == str(out)
    assert doc["admission"]["gain_status"] == "ACCEPT"
    assert "LOW_SAVING:G=8" in {c["code"] for c in doc["checks"]}
    assert out.read_text(encoding="utf-8").splitlines()[0].startswith("DEPLOY — no blockers")


def test_default_out_follows_format(
    app: Any, bundle: Path, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(app, bundle, "--trust-root", root, "--format", "md")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report.md").exists()


def test_tampered_bundle_exits_1_and_still_writes(app: Any, bundle: Path, root: Path, tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    (copy / "bundle.dsse.json").write_text("{}", encoding="utf-8")
    out = tmp_path / "report.html"
    result = invoke(app, copy, "--trust-root", root, "--out", out, "--json")
    assert result.exit_code == 1, result.output
    doc = json.loads(result.stdout)
    assert doc["verified"] is False and doc["findings"][0]["reason"].startswith("ENVELOPE_")
    assert "REJECTED" in result.stderr
    page = Page(out.read_text(encoding="utf-8"))
    assert page.lines[0].startswith("DO NOT DEPLOY — NOT VERIFIED")
    assert "cost-table" not in page.ids


def test_synthetic_needs_the_flag(app: Any, keys: tuple[Any, ...], root: Path, tmp_path: Path) -> None:
    b = make_report_bundle(
        tmp_path / "b",
        keys,
        issued_at=ISSUED,
        provenance=make_provenance(synthetic=True, backend="synthetic"),
    )
    out = tmp_path / "r.html"
    refused = invoke(app, b, "--trust-root", root, "--out", out, "--no-plots")
    assert refused.exit_code == 1 and "SYNTHETIC_REFUSED" in refused.stderr
    again = invoke(app, b, "--trust-root", root, "--out", out, "--no-plots", "--allow-synthetic")
    assert again.exit_code == 2 and "--force" in again.stderr  # the refused run's page stays
    allowed = invoke(app, b, "--trust-root", root, "--out", out, "--no-plots", "--allow-synthetic", "--force")
    assert allowed.exit_code == 0, allowed.output
    strict = invoke(
        app, b, "--trust-root", root, "--out", out, "--no-plots", "--allow-synthetic", "--strict", "--force"
    )
    assert strict.exit_code == 1  # synthetic evidence is a blocker
    assert (
        Page(out.read_text(encoding="utf-8")).lines[0].startswith("DO NOT DEPLOY — 1 blocker(s): SYNTHETIC")
    )


def test_expected_fingerprint_mismatch(app: Any, bundle: Path, root: Path, tmp_path: Path) -> None:
    from tests.factories import make_fingerprint

    fp = tmp_path / "fp.json"
    fp.write_text(json.dumps(make_fingerprint(gpu="B300").to_dict()), encoding="utf-8")
    out = tmp_path / "r.html"
    result = invoke(app, bundle, "--trust-root", root, "--out", out, "--expect-fingerprint", fp, "--no-plots")
    assert result.exit_code == 1
    assert "FINGERPRINT_MISMATCH:gpu" in result.stderr
    assert (
        Page(out.read_text(encoding="utf-8"))
        .lines[0]
        .startswith("DO NOT DEPLOY — NOT VERIFIED: FINGERPRINT_MISMATCH:gpu")
    )


@pytest.mark.parametrize(
    ("case", "code"),
    [
        pytest.param("missing-input", 2, id="missing-input"),
        pytest.param("missing-root", 2, id="missing-root"),
        pytest.param("bad-root", 1, id="bad-root"),
        pytest.param("bad-format", 2, id="bad-format"),
        pytest.param("unwritable-out", 2, id="unwritable-out"),
        pytest.param("bad-fingerprint-file", 2, id="bad-fingerprint-file"),
        pytest.param("bad-max-age", 2, id="bad-max-age"),
    ],
)
def test_usage_and_io_errors(
    app: Any, bundle: Path, root: Path, tmp_path: Path, case: str, code: int
) -> None:
    out = tmp_path / "r.html"
    args: list[str | Path] = [bundle, "--trust-root", root, "--out", out, "--no-plots"]
    if case == "missing-input":
        args[0] = tmp_path / "nope"
    elif case == "missing-root":
        args[2] = tmp_path / "no-root.json"
    elif case == "bad-root":
        bad = tmp_path / "bad-root.json"
        bad.write_text("{}", encoding="utf-8")
        args[2] = bad
    elif case == "bad-format":
        args += ["--format", "pdf"]
    elif case == "unwritable-out":
        (tmp_path / "a-file").write_text("x", encoding="utf-8")
        args[4] = tmp_path / "a-file" / "r.html"  # a missing directory is created; a file is not one
    elif case == "bad-fingerprint-file":
        args += ["--expect-fingerprint", tmp_path / "absent.json"]
    elif case == "bad-max-age":
        args += ["--max-age-days", "0"]
    result = invoke(app, *args)
    assert result.exit_code == code, result.output
    if case in ("missing-input", "missing-root", "bad-root"):
        # Unverifiable input still gets a page that says so first.
        assert Page(out.read_text(encoding="utf-8")).lines[0].startswith("DO NOT DEPLOY — NOT VERIFIED")


def test_installed_entry_point_help() -> None:
    exe = Path(sys.executable).parent / "dspark-calibrate"
    if not exe.exists():
        pytest.skip("dspark-calibrate is not installed beside this interpreter")
    proc = subprocess.run([exe, "report", "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "--trust-root" in proc.stdout and "--format" in proc.stdout


def test_terminal_first_screen_is_the_verdict_and_its_blockers(
    app: Any, keys: tuple[Any, ...], root: Path, tmp_path: Path
) -> None:
    """Without --json the command prints the verdict, its gates and every blocker before anything else."""
    from tests.calibrate.report.test_report import report_admission_summary

    b = make_report_bundle(
        tmp_path / "b",
        keys,
        issued_at=ISSUED,
        admission_summary=report_admission_summary(drain_guard=None, net_value_ms=1.0),
    )
    result = invoke(app, b, "--trust-root", root, "--out", tmp_path / "r.html", "--no-plots", "--strict")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith("DO NOT DEPLOY — 3 blocker(s): GAIN_REJECT; NET_VALUE_MISMATCH; NO_DRAIN_GUARD")
    screen = "\n".join(lines[:40])
    assert "fail  the runtime's gain test and the receipt economics" in screen
    assert "blocker 1 (admission) the runtime's gain test says REJECT" in screen
    assert "blocker 2 (admission) signed net value 1 ms differs" in screen
    assert "blocker 3 (admission) no drain guard" in screen
    assert lines[-1] == f"report written to {tmp_path / 'r.html'}"
    doc = json.loads(
        invoke(app, b, "--trust-root", root, "--out", tmp_path / "r2.html", "--no-plots", "--json").stdout
    )
    assert doc["ok"] is True and doc["deploy"] is False and doc["verdict"]["status"] == "NO-GO"
    strict = json.loads(
        invoke(
            app, b, "--trust-root", root, "--out", tmp_path / "r3.html", "--no-plots", "--json", "--strict"
        ).stdout
    )
    assert strict["ok"] is False and strict["error"] == "BLOCKERS" and strict["fix"]
