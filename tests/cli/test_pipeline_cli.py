"""The pipeline at the command line, as a user runs it: stage lines without a terminal, progress that
tells the truth, Ctrl-C and ``--resume``, per-key passphrases in ``trust rotate``, signer URIs,
``export trtllm --base-options`` and ``dspark-verify --key`` without a trust root.

Every command whose output on a pipe is the point runs as a real subprocess (stderr is then not a
terminal, as in CI or a log); the others run in process through CliRunner.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.cli.verify import verify_app

pytestmark = pytest.mark.slow

runner = CliRunner()
APP = build_calibrate_app()
REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SELECTOR = "0f6e7a0c3b1d2e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f"
LIVE = [
    "--live-topology",
    "TP1",
    "--live-source-head",
    "0123456789abcdef0123456789abcdef01234567",
    "--live-source-diff-sha256",
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
]


def calib(*args: Any, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(APP, [str(a) for a in args], env=env)


def verify(*args: Any) -> Any:
    return runner.invoke(verify_app, [str(a) for a in args])


def run(*args: Any, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    """A real subprocess of an installed entry point (``dspark-calibrate``, ``dspark-verify``)."""
    # The checkout's own sources first, whatever copy of the package the environment installed.
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO / "src"), str(REPO))), **(env or {})}
    full_env.pop("FORCE_COLOR", None)
    return subprocess.run(
        [str(BIN / str(args[0])), *[str(a) for a in args[1:]]],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok(result: Any) -> Any:
    code = getattr(result, "exit_code", getattr(result, "returncode", None))
    assert code == 0, (result.stdout, result.stderr)
    return result


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """keygen → trust init → sweep → traces → fit → workload → build, as the README's CPU trial."""
    d = tmp_path_factory.mktemp("pipeline")
    ok(calib("keygen", "--out", d / "keys"))
    ok(calib("trust", "init", "--key", d / "keys" / "signing-key.pem", "--out", d / "root.json"))
    ok(
        calib(
            "sweep", "--backend", "synthetic", "--preset", "quick", "--k", "5", "--ladder", "8,16,32", *LIVE,
            "--no-plot", "--out", d / "sweep.parquet",
        )
    )  # fmt: skip
    ok(calib("traces", "synth", "--rounds", "60000", "--out", d / "traces" / "traces.parquet"))
    ok(calib("fit", "--traces", d / "traces", "--out", d / "fit"))
    ok(calib("workload", "synth", "--k", "5", "--out", d / "workload.parquet"))
    build = run(
        "dspark-calibrate", "build", "--sweep", "sweep.parquet", "--calibration", "fit/calibration.parquet",
        "--workload", "workload.parquet", "--key", "keys/signing-key.pem", "--trust-root", "root.json",
        "--version", "1", "--out", "bundle", "--allow-synthetic", "--resamples", "300",
        cwd=d,
    )  # fmt: skip
    ok(build)
    return {"d": d, "build": build}


# ---------------------------------------------------------------------------------------------
# Stage lines and progress when stderr is not a terminal
# ---------------------------------------------------------------------------------------------


def test_build_prints_a_line_per_stage_without_a_terminal(pipeline: dict[str, Any]) -> None:
    lines = [line for line in pipeline["build"].stderr.splitlines() if line.startswith("build: ")]
    stages = [line.removeprefix("build: ").split(" (")[0] for line in lines]
    assert stages == ["reading inputs", "select", "replay", "sign", "publish"], pipeline["build"].stderr
    assert "\x1b[" not in pipeline["build"].stderr  # plain lines for a log, no terminal codes


_ROUND = re.compile(
    r"^sweep: round (\d+) \((\d+)/(\d+) cells done, (\d+) visits in ([\d.]+) s"
    r"(?:, (time left: estimating|at least (\d+):(\d\d) left))?\)$"
)
#: A sweep over steps that take real wall time (``tests/cli/sleepy_steps.py``): 5 cells of G=8.
SLEEPY = [
    "sweep", "--backend", "module", "--factory", "tests.cli.sleepy_steps:factory", "--preset", "quick",
    "--k", "3", "--ladder", "8", "--budgets", "8:16,24,28", "--max-samples", "16",
    "--live-gpu", "cpu", *LIVE, "--no-plot",
]  # fmt: skip


def _rounds(stderr: str) -> list[tuple[int, int, int, int, float, float | None]]:
    out = []
    for line in stderr.splitlines():
        m = _ROUND.match(line)
        if m:
            # No time left shown: the lower bound is under a second; "estimating": no visit timed yet.
            eta = 0.0 if m.group(6) is None else None if m.group(7) is None else 60.0 * int(m.group(7)) + int(m.group(8))
            out.append(
                (int(m.group(1)), int(m.group(2)), int(m.group(3)), int(m.group(4)), float(m.group(5)), eta)
            )
    return out


def test_sweep_progress_tells_the_truth_without_a_terminal(tmp_path: Path) -> None:
    started = time.perf_counter()
    r = run(
        "dspark-calibrate", *SLEEPY, "--out", tmp_path / "s.parquet", cwd=REPO, env={"SLEEPY_BASE_S": "0.03"}
    )
    ok(r)
    rounds = _rounds(r.stderr)
    assert len(rounds) >= 4, r.stderr
    # One line per round, in order, each with the same total of cells.
    assert [n for n, *_ in rounds] == list(range(len(rounds)))
    assert {total for _, _, total, *_ in rounds} == {5}  # native, three compact cells, the full-width control
    # Cells done never goes back; the visits between two lines are exactly the cells still open.
    for (_, done0, total, visits0, _, _), (_, done1, _, visits1, _, _) in itertools.pairwise(rounds):
        assert done0 <= done1 <= total
        assert visits1 - visits0 == total - done0
    # The first round has no measured time yet, so no ETA; later rounds estimate from it.
    assert rounds[0][5] is None and all(eta is not None for *_, eta in rounds[1:])
    # The ETA is a lower bound from the measured time per visit: after round 0 the open cells need
    # at least 3 more rounds (--min-rounds 4), each taking about as long as round 0 did.
    round0 = rounds[1][4]
    eta1 = rounds[1][5]
    assert eta1 is not None
    assert 0.4 * 3 * round0 - 1 <= eta1 <= 2.5 * 3 * round0 + 1, (round0, eta1)
    # ...and never promises more than what was really left.
    last_elapsed = rounds[-1][4]
    for _, _, _, _, elapsed, eta in rounds[1:]:
        assert eta is not None and eta <= (last_elapsed - elapsed) + 2 * round0 + 1.0, (elapsed, eta)
    assert time.perf_counter() - started > last_elapsed


def test_synthetic_sweep_eta_is_wall_time(tmp_path: Path) -> None:
    r = run(
        "dspark-calibrate", "sweep", "--backend", "synthetic", "--preset", "quick", "--k", "3", "--ladder", "8,16",
        *LIVE, "--no-plot", "--out", tmp_path / "s.parquet",
        cwd=tmp_path,
    )  # fmt: skip
    ok(r)
    rounds = _rounds(r.stderr)
    last_elapsed = rounds[-1][4]
    for _, _, _, _, elapsed, eta in rounds[1:]:
        assert eta is not None and eta <= (last_elapsed - elapsed) + 1.0, (elapsed, eta, r.stderr)


def _visits(journal: Path) -> int:
    """Visits the sweep journal holds (one JSON record per line)."""
    lines = journal.read_text(encoding="utf-8").splitlines()
    return sum(1 for line in lines if line.strip() and json.loads(line).get("type") == "visit")


def test_ctrl_c_exits_130_and_resume_completes(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO / "src"), str(REPO))), "SLEEPY_BASE_S": "0.03"}
    proc = subprocess.Popen(
        [str(BIN / "dspark-calibrate"), *SLEEPY, "--out", str(out)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A runner started in the background inherits SIGINT ignored, and Python then keeps it
        # ignored: give the sweep the default disposition a terminal's Ctrl-C meets.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    seen: list[str] = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if line.startswith("sweep: round 2 "):
                proc.send_signal(signal.SIGINT)
                break
        _, rest_err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = "".join(seen) + rest_err
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    last = [line for line in stderr.splitlines() if line.strip()][-1]
    assert "interrupted" in last and "--resume" in last, last
    journal = out.with_name("s.journal.jsonl")
    assert journal.exists() and not out.exists()
    measured = _visits(journal)
    assert measured >= 10  # two rounds of five cells survived the interrupt
    r = run(
        "dspark-calibrate",
        *SLEEPY,
        "--out",
        out,
        "--resume",
        "--json",
        cwd=REPO,
        env={"SLEEPY_BASE_S": "0.03"},
    )
    ok(r)
    doc = json.loads(r.stdout)
    assert doc["resumed"] is True and out.exists()
    again = _visits(journal)
    assert again > measured


# ---------------------------------------------------------------------------------------------
# Keys: per-key passphrases, signer URIs, one public key without a trust root
# ---------------------------------------------------------------------------------------------


def test_trust_rotate_from_a_plain_key_to_a_passphrase_protected_one(tmp_path: Path) -> None:
    env = {"PASS_B": "correct horse battery", "PASS_C": "another passphrase"}
    ok(calib("keygen", "--out", tmp_path / "a", "--name", "a"))
    ok(calib("keygen", "--out", tmp_path / "b", "--name", "b", "--passphrase-env", "PASS_B", env=env))
    ok(calib("keygen", "--out", tmp_path / "c", "--name", "c", "--passphrase-env", "PASS_C", env=env))
    a, b, c = (tmp_path / n / f"{n}.pem" for n in "abc")
    assert b.read_text().startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    r1, r2, r3 = (tmp_path / f"root-v{i}.json" for i in (1, 2, 3))
    ok(calib("trust", "init", "--key", a, "--out", r1))
    a_id = json.loads(calib("trust", "show", r1, "--json").stdout)["root_keyids"][0]
    # v1 (plain a) -> v2 (encrypted b): a signs as the old root, b as the new; only b has a passphrase.
    rotate = [
        "trust", "rotate", "--root", r1, "--out", r2, "--key", a, "--key", b,
        "--passphrase-env", f"{b}=PASS_B", "--add-root-key", tmp_path / "b" / "b.pub.pem",
        "--remove-root-key", a_id, "--json",
    ]  # fmt: skip
    r = calib(*rotate, env=env)
    ok(r)
    assert json.loads(r.stdout)["version"] == 2
    # v2 -> v3 (encrypted b and c, each with its own passphrase).
    ok(
        calib(
            "trust", "rotate", "--root", r2, "--out", r3, "--key", b, "--key", c,
            "--passphrase-env", f"{b}=PASS_B", "--passphrase-env", f"{c}=PASS_C",
            "--add-root-key", tmp_path / "c" / "c.pub.pem", "--root-threshold", "2",
            env=env,
        )
    )  # fmt: skip
    shown = json.loads(calib("trust", "show", r3, "--json").stdout)
    assert shown["version"] == 3 and shown["root_threshold"] == 2
    # The wrong passphrase for one key names that key; a missing one names the per-key form.
    bad = calib(*rotate[:-1], "--out", tmp_path / "x.json", env={**env, "PASS_B": "wrong"})
    assert bad.exit_code == 2 and str(b) in bad.stderr and "Traceback" not in bad.output
    missing = calib("trust", "rotate", "--root", r1, "--out", tmp_path / "y.json", "--key", a, "--key", b)
    assert missing.exit_code == 2 and f"--passphrase-env {b}=VAR" in " ".join(missing.stderr.split())


def _artifact(tmp_path: Path) -> Path:
    from dspark_calibrate.artifacts import write_unsigned_artifact
    from tests.factories import make_cost_table, make_fingerprint, make_provenance

    table = tmp_path / "cost-table.parquet"
    write_unsigned_artifact(
        table,
        make_cost_table(),
        kind="cost-table",
        fingerprint=make_fingerprint(),
        provenance=make_provenance(),
    )
    return table


@pytest.mark.parametrize("scheme", ["file", "file2"])
def test_a_signer_uri_signs_on_the_cli(tmp_path: Path, scheme: str) -> None:
    env = {"PASS_K": "uri passphrase"}
    ok(calib("keygen", "--out", tmp_path / "k", "--passphrase-env", "PASS_K", env=env))
    key, pub = tmp_path / "k" / "signing-key.pem", tmp_path / "k" / "signing-key.pub.pem"
    uri = f"{scheme}:{key}"
    root = tmp_path / "root.json"
    signer = ["--signer-uri", uri, "--signer-public-key", pub, "--passphrase-env", "PASS_K"]
    ok(calib("trust", "init", *signer, "--out", root, env=env))
    table = _artifact(tmp_path)
    ok(calib("sign", table, *signer, "--version", "1", env=env))
    r = verify(table, "--trust-root", root, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["ok"] is True
    # A URI whose key is not the public key given is refused, naming both.
    ok(calib("keygen", "--out", tmp_path / "other"))
    wrong = calib("sign", table, "--signer-uri", uri, "--signer-public-key", tmp_path / "other" / "signing-key.pub.pem",
                  "--passphrase-env", "PASS_K", "--version", "2", env=env)  # fmt: skip
    assert wrong.exit_code == 2 and "does not match the given public key" in " ".join(wrong.stderr.split())


def test_verify_with_a_public_key_alone(pipeline: dict[str, Any], tmp_path: Path) -> None:
    d = pipeline["d"]
    pub = d / "keys" / "signing-key.pub.pem"
    r = run("dspark-verify", "bundle/cost-table.parquet", "--key", pub, "--allow-synthetic", "--json", cwd=d)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] is True
    r = run("dspark-verify", "bundle", "--key", pub, "--allow-synthetic", cwd=d)
    assert r.returncode == 0, r.stderr
    # Another key: rejected (exit 1), one line naming the reason.
    ok(calib("keygen", "--out", tmp_path / "other"))
    r = run("dspark-verify", "bundle/cost-table.parquet", "--key", tmp_path / "other" / "signing-key.pub.pem",
            "--allow-synthetic", cwd=d)  # fmt: skip
    assert r.returncode == 1 and "SIGNATURE" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------------------------
# export trtllm --base-options
# ---------------------------------------------------------------------------------------------


def test_export_merges_into_the_users_options_with_absolute_paths(
    pipeline: dict[str, Any], tmp_path: Path
) -> None:
    d = pipeline["d"]
    base = tmp_path / "extra_llm_api_options.yaml"
    base.write_text(
        yaml.safe_dump(
            {
                "max_batch_size": 64,
                "kv_cache_config": {"free_gpu_memory_fraction": 0.85},
                "speculative_config": {"decoding_type": "DSpark", "speculative_model_dir": "/models/drafter"},
            }
        ),
        encoding="utf-8",
    )
    # Relative --out from another directory: the merged YAML still names absolute files.
    r = run(
        "dspark-calibrate", "export", "trtllm", d / "bundle", "--trust-root", d / "root.json",
        "--selector-identity", SELECTOR, "--base-options", base, "--out", "pkg", "--allow-synthetic", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    merged = yaml.safe_load((tmp_path / "pkg" / "extra_llm_api_options.yaml").read_text(encoding="utf-8"))
    assert merged["max_batch_size"] == 64 and merged["kv_cache_config"] == {"free_gpu_memory_fraction": 0.85}
    spec = merged["speculative_config"]
    assert spec["speculative_model_dir"] == "/models/drafter"
    assert spec["enable_confidence_scheduling"] is True
    paths = {k: v for k, v in spec.items() if k.endswith("_path")}
    assert {
        "confidence_sts_path",
        "confidence_sps_table_path",
        "confidence_sps_live_fingerprint_path",
    } <= set(paths)
    for name, value in paths.items():
        assert Path(value).is_absolute() and Path(value).is_file(), (name, value)
        assert Path(value).parent == (tmp_path / "pkg").resolve()
    receipt = Path(spec["confidence_admission_receipt_path"])
    assert spec["confidence_admission_receipt_sha256"] == hashlib.sha256(receipt.read_bytes()).hexdigest()
    assert json.loads(r.stdout)["merged_base_options"]
    # A base file for another speculative decoding type is refused, naming the file.
    other = tmp_path / "eagle.yaml"
    other.write_text(yaml.safe_dump({"speculative_config": {"decoding_type": "Eagle"}}), encoding="utf-8")
    r = run(
        "dspark-calibrate", "export", "trtllm", d / "bundle", "--trust-root", d / "root.json",
        "--selector-identity", SELECTOR, "--base-options", other, "--out", "pkg2", "--allow-synthetic",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 2 and str(other) in " ".join(r.stderr.split()) and "Traceback" not in r.stderr
