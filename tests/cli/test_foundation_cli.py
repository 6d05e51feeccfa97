"""CLI tests for keygen, trust, sign and dspark-verify: exit codes, key stderr lines, --json."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dspark_calibrate.artifacts import detached_envelope_path, write_unsigned_artifact
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.cli.verify import verify_app
from tests.factories import make_cost_table, make_fingerprint, make_provenance

runner = CliRunner()
APP = build_calibrate_app()


def calib(*args: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(APP, [str(a) for a in args], env=env)


def verify(*args: str) -> Any:
    return runner.invoke(verify_app, [str(a) for a in args])


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Path]:
    keys = tmp_path / "keys"
    assert calib("keygen", "--out", keys).exit_code == 0
    root = tmp_path / "root.json"
    r = calib("trust", "init", "--key", keys / "signing-key.pem", "--out", root, "--expires", "30d")
    assert r.exit_code == 0, r.output
    table = tmp_path / "cost-table.parquet"
    write_unsigned_artifact(
        table,
        make_cost_table(),
        kind="cost-table",
        fingerprint=make_fingerprint(),
        provenance=make_provenance(),
    )
    r = calib("sign", table, "--key", keys / "signing-key.pem", "--version", "1", "--expires", "7d")
    assert r.exit_code == 0, r.output
    return {"keys": keys, "root": root, "table": table, "tmp": tmp_path}


def test_keygen_permissions_and_no_overwrite(tmp_path: Path) -> None:
    r = calib("keygen", "--out", tmp_path, "--json")
    assert r.exit_code == 0
    info = json.loads(r.stdout)
    mode = stat.S_IMODE(os.stat(info["private_key"]).st_mode)
    assert mode == 0o600
    again = calib("keygen", "--out", tmp_path)
    assert again.exit_code == 2


def test_keygen_ecdsa_and_passphrase(tmp_path: Path) -> None:
    env = {"KEYPASS": "correct horse"}
    r = calib(
        "keygen", "--out", tmp_path, "--algorithm", "ecdsa-p256", "--passphrase-env", "KEYPASS", env=env
    )
    assert r.exit_code == 0, r.output
    assert b"ENCRYPTED" in (tmp_path / "signing-key.pem").read_bytes()
    r = calib(
        "trust",
        "init",
        "--key",
        tmp_path / "signing-key.pem",
        "--out",
        tmp_path / "root.json",
        "--passphrase-env",
        "KEYPASS",
        env=env,
    )
    assert r.exit_code == 0, r.output
    r = calib("trust", "init", "--key", tmp_path / "signing-key.pem", "--out", tmp_path / "r2.json")
    assert r.exit_code == 2  # encrypted key without its passphrase


def test_group_readable_key_refused(setup: dict[str, Path]) -> None:
    key = setup["keys"] / "signing-key.pem"
    key.chmod(0o640)
    r = calib("sign", setup["table"], "--key", key, "--version", "2")
    assert r.exit_code == 2
    assert "chmod" in r.output


def test_verify_valid_exit_0(setup: dict[str, Path]) -> None:
    r = verify(setup["table"], "--trust-root", setup["root"])
    assert r.exit_code == 0, r.output
    assert "VALID" in r.stdout


def test_verify_json(setup: dict[str, Path]) -> None:
    r = verify(setup["table"], "--trust-root", setup["root"], "--json")
    assert r.exit_code == 0
    report = json.loads(r.stdout)
    assert report["valid"] is True and report["reports"][0]["code"] == "OK"


def test_verify_edited_copy_exit_1(setup: dict[str, Path]) -> None:
    edited = setup["tmp"] / "edited.parquet"
    data = bytearray(setup["table"].read_bytes())
    data[-200] ^= 0xFF  # inside the footer
    edited.write_bytes(bytes(data))
    shutil.copy(detached_envelope_path(setup["table"]), detached_envelope_path(edited))
    r = verify(edited, "--trust-root", setup["root"], "--json")
    assert r.exit_code == 1
    code = json.loads(r.stdout)["reports"][0]["code"]
    assert code != "OK"
    assert "REJECTED" in r.stderr


def test_verify_fingerprint_diff_printed(setup: dict[str, Path]) -> None:
    fp = setup["tmp"] / "fp.json"
    fp.write_text(json.dumps(make_fingerprint(gpu="H100", topology="DEP8").to_dict()))
    r = verify(setup["table"], "--trust-root", setup["root"], "--expect-fingerprint", fp, "--json")
    assert r.exit_code == 1
    report = json.loads(r.stdout)["reports"][0]
    assert [f["code"] for f in report["findings"]] == [
        "FINGERPRINT_MISMATCH:gpu",
        "FINGERPRINT_MISMATCH:topology",
    ]
    assert "fingerprint differences" in r.stderr and "H100" in r.stderr


def test_verify_live_binding_on_cpu_reports_missing(setup: dict[str, Path]) -> None:
    r = verify(
        setup["table"],
        "--trust-root",
        setup["root"],
        "--live",
        "--live-k",
        "5",
        "--live-ladder",
        "8,16,32",
        "--live-topology",
        "TP1",
        "--json",
    )
    assert r.exit_code == 1
    report = json.loads(r.stdout)
    assert report["reports"][0]["reason"] in ("FINGERPRINT_MISSING", "FINGERPRINT_MISMATCH")
    assert "gpu" in report["live"]["missing"]


def test_verify_missing_file_exit_2(setup: dict[str, Path]) -> None:
    r = verify(setup["tmp"] / "nope.parquet", "--trust-root", setup["root"])
    assert r.exit_code == 2
    assert "IO_ERROR" in r.stderr


def test_verify_missing_root_exit_2(setup: dict[str, Path]) -> None:
    assert verify(setup["table"], "--trust-root", setup["tmp"] / "none.json").exit_code == 2


def test_verify_corrupt_root_exit_1(setup: dict[str, Path]) -> None:
    bad = setup["tmp"] / "bad-root.json"
    bad.write_text('{"signed": {}, "signatures": []}')
    r = verify(setup["table"], "--trust-root", bad)
    assert r.exit_code == 1
    assert "TRUST_ROOT" in r.stderr


def test_verify_state_rollback(setup: dict[str, Path]) -> None:
    state = setup["tmp"] / "state.json"
    v1 = setup["tmp"] / "v1.parquet"
    shutil.copy(setup["table"], v1)
    shutil.copy(detached_envelope_path(setup["table"]), detached_envelope_path(v1))
    assert (
        calib("sign", setup["table"], "--key", setup["keys"] / "signing-key.pem", "--version", "2").exit_code
        == 0
    )
    assert verify(setup["table"], "--trust-root", setup["root"], "--state", state).exit_code == 0
    r = verify(v1, "--trust-root", setup["root"], "--state", state, "--json")
    assert r.exit_code == 1
    assert json.loads(r.stdout)["reports"][0]["reason"] == "ROLLBACK"


def test_verify_synthetic_needs_flag(tmp_path: Path, setup: dict[str, Path]) -> None:
    table = tmp_path / "synthetic.parquet"
    write_unsigned_artifact(
        table,
        make_cost_table(),
        kind="cost-table",
        fingerprint=make_fingerprint(),
        provenance=make_provenance(synthetic=True, backend="synthetic"),
    )
    assert calib("sign", table, "--key", setup["keys"] / "signing-key.pem", "--version", "1").exit_code == 0
    r = verify(table, "--trust-root", setup["root"])
    assert r.exit_code == 1 and "SYNTHETIC_REFUSED" in r.stderr
    assert verify(table, "--trust-root", setup["root"], "--allow-synthetic").exit_code == 0


def test_failed_verification_never_exits_0(setup: dict[str, Path]) -> None:
    # One valid and one rejected input: the whole command is a rejection.
    bad = setup["tmp"] / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    r = verify(setup["table"], bad, "--trust-root", setup["root"])
    assert r.exit_code == 1


def test_sign_unknown_kind_and_bad_expiry(setup: dict[str, Path]) -> None:
    key = setup["keys"] / "signing-key.pem"
    assert calib("sign", setup["table"], "--key", key, "--version", "1", "--kind", "nonsense").exit_code == 2
    r = calib("sign", setup["table"], "--key", key, "--version", "1", "--expires", "yesterday")
    assert r.exit_code == 2 and "--expires" in r.output


def test_trust_show_and_rotate(setup: dict[str, Path], tmp_path: Path) -> None:
    r = calib("trust", "show", setup["root"], "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["version"] == 1
    assert calib("keygen", "--out", tmp_path / "new", "--name", "k2").exit_code == 0
    new_root = tmp_path / "root-v2.json"
    r = calib(
        "trust",
        "rotate",
        "--root",
        setup["root"],
        "--key",
        setup["keys"] / "signing-key.pem",
        "--add-root-key",
        tmp_path / "new" / "k2.pub.pem",
        "--out",
        new_root,
        "--json",
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["version"] == 2


def test_entry_point_help_runs() -> None:
    exe = Path(sys.executable).with_name("dspark-verify")
    proc = subprocess.run([str(exe), "--help"], capture_output=True, timeout=60)
    assert proc.returncode == 0
    assert b"--trust-root" in proc.stdout


# -------------------------------------------------------------------------------------------------
# hardening: no hang, no traceback, no root rollback, private key directories
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o022, 0o000], ids=["umask-022", "umask-000"])
def test_keygen_creates_a_missing_directory_0700(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        out = tmp_path / "new" / "keys"
        assert calib("keygen", "--out", out).exit_code == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert stat.S_IMODE(out.parent.stat().st_mode) == 0o700


def test_verify_state_fifo_exits_2_without_blocking(setup: dict[str, Path]) -> None:
    from tests.hangs import HANG_S, fifo_watchdog

    state = setup["tmp"] / "state.json"
    os.mkfifo(state)
    with fifo_watchdog(setup["tmp"]):
        started = time.monotonic()
        r = verify(setup["table"], "--trust-root", setup["root"], "--state", state, "--json")
        elapsed = time.monotonic() - started
    assert elapsed < HANG_S
    assert r.exit_code == 2, r.output
    assert json.loads(r.stdout)["reports"][0]["reason"] == "IO_ERROR"


@pytest.mark.parametrize(
    ("case", "edit"),
    [
        ("float", lambda raw: raw.replace(b'"consistent_snapshot":true', b'"consistent_snapshot":1.5')),
        ("integer-of-5000-digits", lambda raw: raw.replace(b'"version":1', b'"version":' + b"9" * 5000, 1)),
    ],
)
def test_verify_malformed_root_numbers_exit_1_without_traceback(
    setup: dict[str, Path], case: str, edit: Any
) -> None:
    bad = setup["tmp"] / "bad-root.json"
    raw = setup["root"].read_bytes()
    bad.write_bytes(edit(raw))
    assert bad.read_bytes() != raw
    r = verify(setup["table"], "--trust-root", bad)
    assert r.exit_code == 1, r.output
    assert "TRUST_ROOT_INVALID" in r.stderr
    # CliRunner exits 1 on an uncaught exception too: it must have been a clean exit
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception


def test_verify_refuses_an_older_trust_root(setup: dict[str, Path], tmp_path: Path) -> None:
    """After root v2 is seen with --state, putting v1 back is TRUST_ROOT_ROLLBACK (exit 1)."""
    state = setup["tmp"] / "state.json"
    v2 = tmp_path / "root-v2.json"
    key = setup["keys"] / "signing-key.pem"
    assert calib("trust", "rotate", "--root", setup["root"], "--key", key, "--out", v2).exit_code == 0
    v3 = tmp_path / "root-v3.json"
    assert calib("trust", "rotate", "--root", v2, "--key", key, "--out", v3).exit_code == 0
    assert verify(setup["table"], "--trust-root", v2, "--state", state).exit_code == 0
    r = verify(setup["table"], "--trust-root", setup["root"], "--state", state, "--json")
    assert r.exit_code == 1
    assert json.loads(r.stdout)["reports"][0]["code"] == "TRUST_ROOT_ROLLBACK:trust_root"
    assert "TRUST_ROOT_ROLLBACK" in r.stderr
    # a newer root is accepted through its rotation chain, and remembered
    assert verify(setup["table"], "--trust-root", v3, "--state", state).exit_code == 0
    assert verify(setup["table"], "--trust-root", v2, "--state", state).exit_code == 1
