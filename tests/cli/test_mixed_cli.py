"""The mixed evidence on the command line: build --mixed-sweep, export trtllm (with, without and
refused), dspark-verify offline and in its runtime form."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from dspark_calibrate.artifacts import TRTLLM_MIXED_FILES
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.cli.verify import verify_app
from tests.mixed_bundles import MixedBundle

runner = CliRunner()
SELECTOR = "5" * 64
BUCKETS = "96,128,192,256,384,512"


def _calib(*args: Any) -> Any:
    return runner.invoke(build_calibrate_app(), [str(a) for a in args])


def _verify(*args: Any) -> Any:
    return runner.invoke(verify_app, [str(a) for a in args])


def _fp(b: MixedBundle, tmp: Path) -> Path:
    path = tmp / "fp.json"
    path.write_text(json.dumps(b.files.fingerprint.to_dict()))
    return path


def test_build_with_a_mixed_sweep(mixed_tp1: MixedBundle, tmp_path: Path) -> None:
    f = mixed_tp1.files
    out = tmp_path / "b"
    args = ["build", "--sweep", f.sweep, "--calibration", f.calibration, "--workload", f.workload]
    args += ["--key", mixed_tp1.key_file, "--trust-root", mixed_tp1.root_file, "--out", out, "--version", "1"]
    args += ["--resamples", "100", "--no-plots", "--allow-synthetic", "--mixed-sweep", f.mixed_sweep]
    res = _calib(*args, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["valid"] is True and doc["mixed"]["valid"] is True
    assert doc["mixed"]["summary"]["mixed_part"]["share"] > 0.3
    assert (out / "mixed" / "mixed.dsse.json").is_file()
    human = _calib(*args[:-9], tmp_path / "b2", *args[-8:])
    assert human.exit_code == 0, human.output
    assert "mixed share of the workload" in human.stdout
    bad = _calib(*[tmp_path / "b3" if a == out else a for a in args[:-1]], tmp_path / "nope.parquet")
    assert bad.exit_code == 2 and "--mixed-sweep" in bad.stderr


def test_export_writes_the_mixed_files_or_leaves_them_out(mixed_dep8: MixedBundle, tmp_path: Path) -> None:
    args = ["export", "trtllm", mixed_dep8.bundle, "--trust-root", mixed_dep8.root_file]
    args += ["--selector-identity", SELECTOR, "--allow-synthetic", "--json"]
    res = _calib(*args, "--out", tmp_path / "t")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["mixed"] is True and set(TRTLLM_MIXED_FILES) <= set(doc["files"])
    spec = yaml.safe_load((tmp_path / "t" / "extra_llm_api_options.yaml").read_text())["speculative_config"]
    assert set(spec["confidence_mixed_evidence"]) == {
        "costs_path",
        "costs_sha256",
        "admission_path",
        "admission_sha256",
        "protocol_sha256",
        "live_fingerprint_path",
        "live_fingerprint_sha256",
    }
    decode_only = _calib(*args, "--out", tmp_path / "d", "--no-mixed")
    assert decode_only.exit_code == 0, decode_only.output
    assert not any((tmp_path / "d" / n).exists() for n in TRTLLM_MIXED_FILES)
    # synthetic mixed evidence is refused without --allow-synthetic, and nothing is written
    strict = [a for a in args if a != "--allow-synthetic"]
    refused = _calib(*strict, "--out", tmp_path / "s")
    assert refused.exit_code == 1 and not (tmp_path / "s").exists()


def test_export_refuses_mixed_evidence_off_the_consumers_route(
    mixed_tp1: MixedBundle, tmp_path: Path
) -> None:
    args = ["export", "trtllm", mixed_tp1.bundle, "--trust-root", mixed_tp1.root_file]
    args += ["--selector-identity", SELECTOR, "--allow-synthetic", "--out", tmp_path / "t", "--json"]
    res = _calib(*args)
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert "world size" in doc["message"] and "--no-mixed" in doc["message"]
    assert not (tmp_path / "t").exists()  # nothing partial
    ok = _calib(*args, "--no-mixed")
    assert ok.exit_code == 0, ok.output


def test_export_refuses_tampered_mixed_evidence(mixed_dep8: MixedBundle, tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    shutil.copytree(mixed_dep8.bundle, bundle)
    (bundle / "mixed" / "results" / "accuracy.json").write_bytes(b"{}")
    args = ["export", "trtllm", bundle, "--trust-root", mixed_dep8.root_file, "--selector-identity", SELECTOR]
    res = _calib(*args, "--allow-synthetic", "--out", tmp_path / "t", "--json")
    assert res.exit_code == 1
    assert json.loads(res.stdout)["error"].startswith("BUNDLE_MEMBER_MISMATCH")
    assert not (tmp_path / "t").exists()


def test_verify_reports_the_mixed_evidence_on_its_own(mixed_dep8: MixedBundle, tmp_path: Path) -> None:
    base = [mixed_dep8.bundle, "--trust-root", mixed_dep8.root_file, "--allow-synthetic"]
    res = _verify(*base, "--json")
    assert res.exit_code == 0, res.output
    reports = json.loads(res.stdout)["reports"]
    assert len(reports) == 2 and reports[1]["present"] is True and reports[1]["valid"] is True
    assert len(json.loads(_verify(*base, "--no-mixed", "--json").stdout)["reports"]) == 1
    fp = _fp(mixed_dep8, tmp_path)
    bound = _verify(
        *base,
        "--expect-fingerprint",
        fp,
        "--live-body-buckets",
        BUCKETS,
        "--live-execution-mode",
        "BREAKABLE",
    )
    assert bound.exit_code == 0, bound.output
    other = _verify(*base, "--expect-fingerprint", fp, "--live-body-buckets", "96,128", "--json")
    assert other.exit_code == 1
    doc = json.loads(other.stdout)
    assert doc["reports"][0]["valid"] is True  # the decode bundle still verifies
    assert doc["error"].startswith("FINGERPRINT_MISMATCH")
    malformed = _verify(*base, "--expect-fingerprint", fp, "--live-body-buckets", "a,b")
    assert malformed.exit_code == 2 and "--live-body-buckets" in malformed.stderr


def test_runtime_form_decides_mixed_apart_from_decode(mixed_dep8: MixedBundle, tmp_path: Path) -> None:
    fp = _fp(mixed_dep8, tmp_path)
    base = [mixed_dep8.bundle, "--trust-root", mixed_dep8.root_file, "--allow-synthetic"]
    base += ["--expect-fingerprint", fp, "--selector-identity", SELECTOR]
    out = tmp_path / "opts.yaml"
    res = _verify(
        *base,
        "--live-body-buckets",
        BUCKETS,
        "--live-execution-mode",
        "BREAKABLE",
        "--emit-trtllm-options",
        out,
        "--json",
    )
    assert res.exit_code == 0, res.output
    spec = yaml.safe_load(out.read_text())["speculative_config"]
    assert spec["enable_confidence_scheduling"] is True and "confidence_mixed_evidence" in spec
    # without the live body buckets the mixed evidence is not admitted; decode stands
    out2 = tmp_path / "opts2.yaml"
    res2 = _verify(*base, "--emit-trtllm-options", out2, "--json")
    assert res2.exit_code == 0, res2.output
    spec2 = yaml.safe_load(out2.read_text())["speculative_config"]
    assert spec2["enable_confidence_scheduling"] is True and "confidence_mixed_evidence" not in spec2
    assert "FINGERPRINT_MISSING:body_buckets" in res2.stdout
