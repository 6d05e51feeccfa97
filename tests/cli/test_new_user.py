"""What a new user gets wrong, one row each: the command, the exit code, one line of the message
that points at the fix, no traceback, and with ``--json`` the one error shape
``{ok: false, error, message, fix}``.

Rows marked "before any work" also prove that nothing expensive ran first: no sweep journal is
created, no build stage starts.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

import dspark_calibrate
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.cli.verify import verify_app
from tests.runtime_plugin.bundles import make_bundle
from tests.signing import make_root, make_signers

runner = CliRunner()
APP = build_calibrate_app()
W = dict[str, Path]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> W:
    from dspark_calibrate.calibrate.confidence.synth_traces import SynthSpec, write_synth_traces

    d = tmp_path_factory.mktemp("newuser")
    keys = d / "keys"
    assert runner.invoke(APP, ["keygen", "--out", str(keys)]).exit_code == 0
    root = d / "root.json"
    assert runner.invoke(APP, ["trust", "init", "--key", str(keys / "signing-key.pem"), "--out", str(root)]).exit_code == 0
    other = d / "other"
    assert runner.invoke(APP, ["keygen", "--out", str(other)]).exit_code == 0
    other_root = d / "other-root.json"
    r = runner.invoke(APP, ["trust", "init", "--key", str(other / "signing-key.pem"), "--out", str(other_root)])
    assert r.exit_code == 0, r.output
    signers = make_signers(d / "bundle-keys", 1)
    issued = datetime.now(UTC) - timedelta(minutes=1)  # the CLI reads the real clock
    bundle = make_bundle(d / "bundle", signers, issued_at=issued)
    bundle_root = d / "bundle-root.json"
    bundle_root.write_bytes(make_root(signers, expires=issued + timedelta(days=365)).to_bytes())
    incomplete = d / "incomplete"
    shutil.copytree(bundle, incomplete)
    (incomplete / "calibration.parquet").unlink()
    (d / "adir").mkdir()
    (d / "a-file.parquet").write_bytes(b"PAR1")
    (d / "empty.pem").write_bytes(b"")
    (d / "empty.pem").chmod(0o600)
    traces = d / "traces.parquet"
    write_synth_traces(traces, SynthSpec(rounds=2000, k=5, rounds_per_request=20))
    (d / "report.html").write_text("<html></html>", encoding="utf-8")
    return {
        "d": d,
        "key": keys / "signing-key.pem",
        "pub": keys / "signing-key.pub.pem",
        "root": root,
        "other_root": other_root,
        "bundle": bundle,
        "bundle_root": bundle_root,
        "incomplete": incomplete,
        "traces": traces,
    }


def _build(w: W, *extra: str, root: str = "root", out: str = "b-new", version: str = "1") -> list[str]:
    d = w["d"]
    return [
        "build", "--sweep", str(d / "sweep.parquet"), "--calibration", str(d / "calibration.parquet"),
        "--workload", str(d / "workload.parquet"), "--key", str(w["key"]), "--trust-root", str(w[root]),
        "--version", version, "--out", str(d / out), *extra,
    ]  # fmt: skip


def _sweep(w: W, out: str, *extra: str) -> list[str]:
    return ["sweep", "--k", "5", "--ladder", "8", "--preset", "quick", "--out", str(w["d"] / out), *extra]


@dataclass(frozen=True)
class Case:
    """One wrong invocation and what it must produce."""

    id: str
    app: str  # "calib" or "verify"
    argv: Callable[[W], list[str]]
    code: int
    says: str  # a fragment of the one error line
    not_started: Callable[[W], bool] | None = None  # checked after the run: no work was done


def _no_journal(name: str) -> Callable[[W], bool]:
    return lambda w: not any(w["d"].glob(f"{name}*journal*")) and not (w["d"] / "adir.journal.jsonl").exists()


CASES: list[Case] = [
    # 1. sweep's --out an existing directory: refused before measuring, no journal left behind
    Case("sweep out is a directory", "calib", lambda w: _sweep(w, "adir"), 2, "--out", _no_journal("adir")),
    # 2. late checks
    Case("sweep out not parquet", "calib", lambda w: _sweep(w, "s.csv"), 2, "ending in .parquet", _no_journal("s")),
    Case("sweep journal is a directory", "calib", lambda w: _sweep(w, "s2.parquet", "--journal", str(w["d"] / "adir")), 2, "--journal", _no_journal("s2")),
    Case("build key not in the trust root", "calib", lambda w: _build(w, root="other_root"), 2, "its artifact signers are"),
    Case("build version 0", "calib", lambda w: _build(w, version="0"), 2, "versions start at 1"),
    Case("build out exists", "calib", lambda w: _build(w, out="adir"), 2, "pass --force"),
    Case("build out is a file", "calib", lambda w: _build(w, out="a-file.parquet"), 2, "is a file"),
    Case("build trust root is a public key", "calib", lambda w: [*_build(w)[:10], str(w["pub"]), *_build(w)[11:]], 2, "a PEM public key"),
    Case("export out is a file", "calib", lambda w: ["export", "trtllm", str(w["bundle"]), "--trust-root", str(w["bundle_root"]), "--selector-identity", "a" * 64, "--out", str(w["d"] / "a-file.parquet")], 2, "is a file"),
    # 5. messages that point the right way
    Case("verify trust root is a public key", "verify", lambda w: [str(w["bundle"]), "--trust-root", str(w["pub"])], 2, "dspark-verify --key"),
    Case("verify trust root is parquet", "verify", lambda w: [str(w["bundle"]), "--trust-root", str(w["d"] / "a-file.parquet")], 2, "a Parquet file, not a trust root"),
    Case("report trust root is a public key", "calib", lambda w: ["report", str(w["bundle"]), "--trust-root", str(w["pub"]), "--out", str(w["d"] / "r-pub.html")], 2, "a PEM public key"),
    Case("sign with an empty key", "calib", lambda w: ["sign", str(w["d"] / "a-file.parquet"), "--key", str(w["d"] / "empty.pem"), "--version", "1"], 2, "the file is empty"),
    Case("module backend without factory", "calib", lambda w: _sweep(w, "m.parquet", "--backend", "module"), 2, "--backend module needs a factory", _no_journal("m")),
    Case("fit out is a file", "calib", lambda w: ["fit", "--traces", str(w["traces"]), "--out", str(w["d"] / "a-file.parquet")], 2, "is a file"),
    Case("bundle member missing", "verify", lambda w: [str(w["incomplete"]), "--trust-root", str(w["bundle_root"])], 1, "BUNDLE_MEMBER_MISSING:calibration"),
    Case("throttle policy unknown", "calib", lambda w: _sweep(w, "t.parquet", "--throttle-policy", "bogus"), 2, "--throttle-policy 'bogus' is unknown", _no_journal("t")),
    Case("verify a trace file", "verify", lambda w: [str(w["traces"]), "--trust-root", str(w["root"])], 1, "fit --traces"),
    Case("sign a trace file", "calib", lambda w: ["sign", str(w["traces"]), "--key", str(w["key"]), "--version", "1"], 2, "fit --traces"),
    Case("root threshold above the keys", "calib", lambda w: ["trust", "rotate", "--root", str(w["root"]), "--key", str(w["key"]), "--root-threshold", "5", "--out", str(w["d"] / "r5.json")], 2, "threshold 5"),
    # 7. consistency
    Case("rotate over its own input", "calib", lambda w: ["trust", "rotate", "--root", str(w["root"]), "--key", str(w["key"]), "--out", str(w["root"])], 2, "is the current root"),
    Case("report over an existing page", "calib", lambda w: ["report", str(w["bundle"]), "--trust-root", str(w["bundle_root"]), "--out", str(w["d"] / "report.html")], 2, "pass --force"),
    Case("report to another format", "calib", lambda w: ["report", str(w["bundle"]), "--trust-root", str(w["bundle_root"]), "--out", str(w["d"] / "r.pdf")], 2, "ending in .html"),
    Case("report package that is no package", "calib", lambda w: ["report", str(w["bundle"]), "--trust-root", str(w["bundle_root"]), "--trtllm", str(w["d"] / "adir"), "--out", str(w["d"] / "r-pkg.html")], 2, "no admission_receipt.json"),
    Case("report selector identity malformed", "calib", lambda w: ["report", str(w["bundle"]), "--trust-root", str(w["bundle_root"]), "--selector-identity", "xyz", "--out", str(w["d"] / "r-sel.html")], 2, "64 lowercase hex"),
    Case("workload synth to csv", "calib", lambda w: ["workload", "synth", "--out", str(w["d"] / "w.csv")], 2, "ending in .parquet"),
    Case("traces synth to txt", "calib", lambda w: ["traces", "synth", "--out", str(w["d"] / "t.txt")], 2, "ending in .parquet"),
]  # fmt: skip


def _invoke(app: str, argv: list[str]) -> Any:
    target: typer.Typer = APP if app == "calib" else verify_app
    return runner.invoke(target, argv)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_new_user_mistake(world: W, case: Case) -> None:
    argv = case.argv(world)
    r = _invoke(case.app, argv)
    assert r.exit_code == case.code, (case.id, r.exit_code, r.stdout, r.stderr)
    assert "Traceback" not in r.output and (r.exception is None or isinstance(r.exception, SystemExit))
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    hits = [line for line in lines if case.says in line]
    assert len(hits) == 1, (case.id, lines)
    assert ".;" not in hits[0], hits[0]
    # Nothing of the expensive work began: no build stage, no sweep round.
    assert not any(line.startswith(("build: select", "sweep: round")) for line in lines), lines
    if case.not_started is not None:
        assert case.not_started(world), case.id
    j = _invoke(case.app, [*argv, "--json"])
    assert j.exit_code == case.code
    doc = json.loads(j.stdout)
    assert doc["ok"] is False and doc["error"] and doc["message"] and doc["fix"], doc
    assert case.says in doc["message"] or case.says in doc["fix"] or case.says in doc.get("error", ""), doc


def test_at_least_twenty_rows() -> None:
    assert len(CASES) >= 20


# ---------------------------------------------------------------------------------------------
# Usage errors and --version
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "--k", "five", "--ladder", "8", "--out", "s.parquet"],
        ["sweep", "--bogus"],
        ["build"],
        ["trust", "init"],
    ],
    ids=["bad integer", "unknown option", "missing options", "missing --out"],
)
def test_usage_errors_read_as_one_sentence(argv: list[str]) -> None:
    r = runner.invoke(APP, argv)
    assert r.exit_code == 2
    line = r.stderr.strip().splitlines()[-1]
    assert ".;" not in line and "; run `dspark-calibrate" in line, line


@pytest.mark.parametrize(("app", "name"), [("calib", "dspark-calibrate"), ("verify", "dspark-verify")])
def test_version_names_its_program(app: str, name: str) -> None:
    target: typer.Typer = APP if app == "calib" else verify_app
    r = runner.invoke(target, ["--version"], prog_name=name)
    assert r.exit_code == 0 and r.stdout.strip() == f"{name} {dspark_calibrate.__version__}"


def _leaf_commands(command: Any, path: tuple[str, ...]) -> list[tuple[str, Any]]:
    subs = getattr(command, "commands", None)
    if not subs:
        return [(" ".join(path), command)]
    return [leaf for name, sub in sorted(subs.items()) for leaf in _leaf_commands(sub, (*path, name))]


def test_every_command_has_json_help_and_an_example() -> None:
    """What README.md promises of every command: ``-h`` with an example, and ``--json``."""
    import typer.main

    leaves = _leaf_commands(typer.main.get_command(APP), ("dspark-calibrate",))
    leaves += _leaf_commands(typer.main.get_command(verify_app), ("dspark-verify",))
    assert len(leaves) >= 15
    for path, command in leaves:
        flags = {o for p in command.params for o in p.opts}
        assert "--json" in flags, path
        assert command.epilog and "Examples:" in command.epilog, path
        assert "-h" in command.context_settings.get("help_option_names", ["-h"]), path


@pytest.mark.slow
def test_sweep_creates_a_missing_output_directory(tmp_path: Path) -> None:
    out = tmp_path / "new" / "dir" / "s.parquet"
    r = runner.invoke(APP, ["sweep", "--k", "5", "--ladder", "8", "--preset", "quick", "--out", str(out), "--no-plot"])
    assert r.exit_code == 0, r.output
    assert out.is_file() and out.with_name("s.samples.parquet").is_file()


@pytest.mark.slow
def test_sweep_prints_one_row_per_g_unless_verbose(tmp_path: Path) -> None:
    args = ["sweep", "--k", "5", "--ladder", "8,16", "--preset", "quick", "--no-plot"]
    short = runner.invoke(APP, [*args, "--out", str(tmp_path / "a.parquet")])
    assert short.exit_code == 0, short.output
    first = [re.match(r"^│\s*(\d+)\s*│", line) for line in short.stdout.splitlines()]
    assert [m.group(1) for m in first if m] == ["8", "16"], short.stdout
    assert len(short.stdout.splitlines()) < 25 and "…" not in short.stdout
    assert "--verbose" in short.stdout
    full = runner.invoke(APP, [*args, "--out", str(tmp_path / "b.parquet"), "--verbose"])
    assert full.exit_code == 0, full.output
    cells = [line for line in full.stdout.splitlines() if re.match(r"^│\s*\d+\s*│", line)]
    assert len(cells) >= 40 and "…" not in full.stdout  # every cell, nothing cut


def test_digests_and_keyids_are_printed_whole(world: W) -> None:
    """At 80 columns: trust show, export and dspark-verify print every digest and keyid whole."""
    shown = runner.invoke(APP, ["trust", "show", str(world["root"])])
    assert shown.exit_code == 0
    info = json.loads(runner.invoke(APP, ["trust", "show", str(world["root"]), "--json"]).stdout)
    for value in (info["digest"], *info["root_keyids"], *info["artifact_keyids"]):
        assert value in shown.stdout
    out = world["d"] / "export-whole"
    exported = runner.invoke(
        APP,
        ["export", "trtllm", str(world["bundle"]), "--trust-root", str(world["bundle_root"]),
         "--selector-identity", "a" * 64, "--out", str(out)],
    )  # fmt: skip
    assert exported.exit_code == 0, exported.output
    import hashlib

    for name in ("sps_table.json", "admission_receipt.json", "extra_llm_api_options.yaml"):
        digest = hashlib.sha256((out / name).read_bytes()).hexdigest()
        assert f"{digest}  {out / name}" in exported.stdout  # sha256sum format
    valid = runner.invoke(verify_app, [str(world["bundle"] / "cost-table.parquet"), "--trust-root", str(world["bundle_root"])])
    assert valid.exit_code == 0 and "…" not in valid.output
    for output in (shown.stdout, exported.stdout, valid.stdout):
        assert "…" not in output
