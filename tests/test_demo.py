"""The demo runs every stage and its output verifies; any edited copy is rejected."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dspark_calibrate.artifacts import detached_envelope_path
from dspark_calibrate.calibrate.demo import DEMO_MARKER, run_demo
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.cli.verify import verify_app
from dspark_calibrate.errors import ConfigError

runner = CliRunner()


@pytest.fixture(scope="module")
def demo_dir(demo_run: tuple[Path, dict[str, Any]]) -> Path:
    out, result = demo_run
    assert result["admission"]["active"] is True
    lo, hi = result["predicted_gain_ci"]
    assert lo <= result["predicted_gain"] <= hi
    return out


def test_outputs_present(demo_dir: Path) -> None:
    for rel in (
        "trust-root.json",
        "cost-table.parquet",
        "bundle/bundle.dsse.json",
        "trtllm/sps_table.json",
        "trtllm/sts.json",
        "trtllm/admission_receipt.json",
        "trtllm/extra_llm_api_options.yaml",
        "report.html",
        "fit/calibration.parquet",
    ):
        assert (demo_dir / rel).is_file(), rel
    assert (demo_dir / "report.html").read_text().lstrip().lower().startswith("<!doctype html>")


def test_demo_output_verifies(demo_dir: Path) -> None:
    root = str(demo_dir / "trust-root.json")
    r = runner.invoke(
        verify_app,
        [
            str(demo_dir / "cost-table.parquet"),
            str(demo_dir / "bundle"),
            "--trust-root",
            root,
            "--allow-synthetic",
        ],
    )
    assert r.exit_code == 0, r.output
    r = runner.invoke(verify_app, [str(demo_dir / "cost-table.parquet"), "--trust-root", root])
    assert r.exit_code == 1 and "SYNTHETIC_REFUSED" in r.stderr


@pytest.mark.parametrize("offset", [-300, -2000, 200, 5000])
def test_edited_copy_is_rejected(demo_dir: Path, tmp_path: Path, offset: int) -> None:
    copy = tmp_path / "cost-table.parquet"
    data = bytearray((demo_dir / "cost-table.parquet").read_bytes())
    data[offset] ^= 0x01
    copy.write_bytes(bytes(data))
    shutil.copyfile(detached_envelope_path(demo_dir / "cost-table.parquet"), detached_envelope_path(copy))
    r = runner.invoke(
        verify_app,
        [str(copy), "--trust-root", str(demo_dir / "trust-root.json"), "--allow-synthetic", "--json"],
    )
    assert r.exit_code == 1, r.output
    assert json.loads(r.stdout)["reports"][0]["code"] != "OK"


def test_refuses_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("not demo output")
    with pytest.raises(ConfigError, match="not empty"):
        run_demo(tmp_path)
    assert (tmp_path / "precious.txt").exists()
    assert not (tmp_path / DEMO_MARKER).exists()


def test_demo_package_carries_mixed_evidence(demo_dir: Path) -> None:
    """The demo deployment is TensorRT-LLM's mixed route, so its package has the three mixed files;
    they are synthetic, accepted only with allow_synthetic (the engine never serves them)."""
    from dspark_calibrate.artifacts import TRTLLM_MIXED_FILES, validate_trtllm

    files = {p.name: p.read_bytes() for p in (demo_dir / "trtllm").iterdir()}
    assert set(TRTLLM_MIXED_FILES) <= set(files)
    assert validate_trtllm(files, allow_synthetic=True) == []
    assert [f.field for f in validate_trtllm(files)] == ["mixed_costs.json:synthetic"]
    admission = json.loads((demo_dir / "admission.json").read_text())
    assert admission["active"] is True and admission["mixed"]["active"] is True
    r = runner.invoke(
        verify_app, [str(demo_dir / "bundle"), "--trust-root", str(demo_dir / "trust-root.json"), "--json"]
    )
    assert r.exit_code == 1 and "SYNTHETIC_REFUSED" in r.stdout


def test_every_json_file_the_demo_writes_validates(demo_dir: Path) -> None:
    """Each JSON file of the demo (DSSE envelopes with their payloads, the trust root, the state,
    fit-report.json, build.json, the TensorRT-LLM package, the mixed evidence) is recognised and
    valid against the shipped schemas."""
    files = sorted(demo_dir.rglob("*.json"))
    assert len(files) >= 25
    r = runner.invoke(build_calibrate_app(), ["schema", "validate", *map(str, files), "--json"])
    doc = json.loads(r.stdout)
    bad = [(e["path"], e["status"], e["problems"][:2]) for e in doc["files"] if e["status"] != "valid"]
    assert r.exit_code == 0 and not bad, bad
    schemas = {e["schema"] for e in doc["files"]}
    for name in (
        "dsse-envelope", "trust-root", "rollback-state", "fit-report", "build", "admission-receipt", "sts",
        "trtllm-sps-table", "trtllm-live-fingerprint", "trtllm-mixed-costs", "trtllm-mixed-admission",
        "trtllm-mixed-live-fingerprint", "mixed-result-accuracy", "mixed-result-measurement-results",
    ):  # fmt: skip
        assert name in schemas, name
    # The mixed manifest and the mixed members' payloads are checked too (kinds mixed-*).
    mixed = [e for e in doc["files"] if "/mixed/" in e["path"] and e["schema"] == "dsse-envelope"]
    assert len(mixed) == 4 and all(e["payload"] == "statement" for e in mixed)
