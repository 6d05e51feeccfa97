"""Hostile values on the command line and in the files the commands read, one row each: every row
ends with the documented exit code and one clean error (no traceback), and with ``--json`` the one
error shape.

- numeric options that Python accepts as floats or huge counts (``nan``, ``inf``, ``1e308``,
  ``999999999d``) are usage errors, refused while the command line is parsed (exit 2);
- a rollback state or a trust root nested deeper than the document limit is the file's own error
  (``STATE_CORRUPT``, ``TRUST_ROOT_INVALID``: exit 1), never a traceback;
- a garbage root stored in the state is reported as the state's defect, naming the state file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dspark_calibrate.artifacts import write_unsigned_artifact
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.cli.verify import verify_app
from tests.factories import make_cost_table, make_fingerprint, make_provenance, nested, unchecked_digest

runner = CliRunner()
APP = build_calibrate_app()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hostile")
    keys = d / "keys"
    assert runner.invoke(APP, ["keygen", "--out", str(keys)]).exit_code == 0
    key = keys / "signing-key.pem"
    root = d / "root.json"
    r = runner.invoke(APP, ["trust", "init", "--key", str(key), "--out", str(root)])
    assert r.exit_code == 0, r.output
    table = d / "cost-table.parquet"
    write_unsigned_artifact(
        table,
        make_cost_table(),
        kind="cost-table",
        fingerprint=make_fingerprint(),
        provenance=make_provenance(),
    )
    assert runner.invoke(APP, ["sign", str(table), "--key", str(key), "--version", "1"]).exit_code == 0
    states = d / "states"
    states.mkdir(mode=0o700)
    for name, trust_root, series in (
        ("root-40-deep", {"version": 1, "sha256": unchecked_digest(nested()), "root": nested()}, {}),
        (
            "binding-40-deep",
            None,
            {
                f"cost-table:{unchecked_digest({'gpu': nested()})}": {
                    "kind": "cost-table",
                    "binding": {"gpu": nested()},
                    "version": 1,
                }
            },
        ),
        (
            "garbage-root",
            {
                "version": 2,
                "sha256": unchecked_digest({"signed": {"_type": "root"}}),
                "root": {"signed": {"_type": "root"}},
            },
            {},
        ),
    ):
        doc = {"schema_version": 2, "series": series, "legacy_series": {}, "trust_root": trust_root}
        (states / f"{name}.json").write_text(json.dumps(doc))
    # A validly signed root whose key carries a 40-deep extra keyval entry.
    from tuf.api.metadata import Metadata

    from dspark_calibrate.artifacts import load_signer

    md = Metadata.from_bytes(root.read_bytes())
    for k in md.signed.keys.values():
        k.keyval["extra"] = nested()
    md.signatures.clear()
    md.sign(load_signer(key))
    (d / "deep-root.json").write_bytes(md.to_bytes())
    return {"d": d, "key": key, "root": root, "table": table, "states": states}


W = dict[str, Path]
VERIFY = "{table} --trust-root {root}"
SIGN = "sign {table} --key {key} --version 2 --expires"
BUILD = "build --sweep s.parquet --calibration c.parquet --workload w.parquet --version 1 --key {key}"

#: (id, app, command line (``{name}`` filled from the world; no path holds a space), exit code,
#: text the error names)
CASES: list[tuple[str, str, str, int, str]] = [
    # numeric options: refused while parsing (exit 2), whatever the command would do next
    *(
        (f"verify-max-age-days-{v}", "verify", f"{VERIFY} --max-age-days {v}", 2, "--max-age-days")
        for v in ("nan", "inf", "-inf", "1e308", "0", "-1")
    ),
    (
        "verify-runtime-max-age-days-nan",
        "verify",
        "{d} --trust-root {root} --max-age-days nan --emit-trtllm-options {d}/o.yaml --fail-open-to-static",
        2,
        "--max-age-days",
    ),
    (
        "report-max-age-days-inf",
        "calib",
        "report {d} --trust-root {root} --max-age-days inf",
        2,
        "--max-age-days",
    ),
    ("sign-expires-999999999d", "calib", f"{SIGN} 999999999d", 2, "--expires"),
    ("sign-expires-10000-years-of-weeks", "calib", f"{SIGN} 999999999999w", 2, "--expires"),
    ("sign-expires-end-of-calendar", "calib", f"{SIGN} 9999-12-31T23:59:59-12:00", 2, "--expires"),
    (
        "trust-init-expires-999999999d",
        "calib",
        "trust init --key {key} --out {d}/r2.json --expires 999999999d",
        2,
        "--expires",
    ),
    (
        "trust-rotate-expires-999999999d",
        "calib",
        "trust rotate --root {root} --key {key} --out {d}/r3.json --expires 999999999d",
        2,
        "--expires",
    ),
    (
        "build-expires-999999999d",
        "calib",
        f"{BUILD} --trust-root {{root}} --expires 999999999d --out {{d}}/b",
        2,
        "--expires",
    ),
    # files nested deeper than the reader accepts: the file's own reason, exit 1
    (
        "verify-state-root-40-deep",
        "verify",
        f"{VERIFY} --state {{states}}/root-40-deep.json",
        1,
        "STATE_CORRUPT",
    ),
    (
        "verify-state-binding-40-deep",
        "verify",
        f"{VERIFY} --state {{states}}/binding-40-deep.json",
        1,
        "STATE_CORRUPT",
    ),
    (
        "verify-state-garbage-root",
        "verify",
        f"{VERIFY} --state {{states}}/garbage-root.json",
        1,
        "garbage-root.json",
    ),
    (
        "verify-root-keyval-40-deep",
        "verify",
        "{table} --trust-root {d}/deep-root.json",
        1,
        "TRUST_ROOT_INVALID",
    ),
    ("trust-show-root-keyval-40-deep", "calib", "trust show {d}/deep-root.json", 1, "TRUST_ROOT_INVALID"),
]


def _invoke(app: str, argv: list[str]) -> Any:
    return runner.invoke(APP if app == "calib" else verify_app, argv)


@pytest.mark.parametrize(("name", "app", "argv", "code", "named"), CASES, ids=[c[0] for c in CASES])
def test_hostile_input(world: W, name: str, app: str, argv: str, code: int, named: str) -> None:
    args = argv.format(**world).split()
    r = _invoke(app, args)
    assert r.exit_code == code, (name, r.stdout, r.stderr)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "Traceback" not in r.output
    assert named in r.stderr, r.stderr
    j = _invoke(app, [*args, "--json"])
    assert j.exit_code == code, (name, j.stdout, j.stderr)
    doc = json.loads(j.stdout)
    assert doc["ok"] is False, doc


def test_garbage_state_root_is_the_state_defect(world: W) -> None:
    state = world["states"] / "garbage-root.json"
    r = _invoke(
        "verify", [str(world["table"]), "--trust-root", str(world["root"]), "--state", str(state), "--json"]
    )
    report = json.loads(r.stdout)["reports"][0]
    assert report["reason"] == "STATE_CORRUPT", report
    assert str(state) in report["message"] and str(world["root"]) not in report["message"]
