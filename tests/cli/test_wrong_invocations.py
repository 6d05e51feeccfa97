"""Wrong invocations, one row each: every one ends with one line on stderr that names the fix, no
traceback, the documented exit code, and with --json the one error shape {ok, error, message, fix}.

Also: every ``--flag`` any message of the package names exists in the CLI.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.cli.verify import verify_app

runner = CliRunner()
APP = build_calibrate_app()
SRC = Path(__file__).resolve().parents[2] / "src" / "dspark_calibrate"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("wrong")
    keys = d / "keys"
    assert runner.invoke(APP, ["keygen", "--out", str(keys)]).exit_code == 0
    root = d / "root.json"
    r = runner.invoke(APP, ["trust", "init", "--key", str(keys / "signing-key.pem"), "--out", str(root)])
    assert r.exit_code == 0, r.output
    (d / "not-json.json").write_text("{nope")
    (d / "empty").mkdir()
    (d / "text.parquet").write_text("not parquet")
    (d / "traces.txt").write_text("x")
    return {"d": d, "key": keys / "signing-key.pem", "pub": keys / "signing-key.pub.pem", "root": root}


W = dict[str, Path]
# (id, app, argv builder, exit code)
CASES: list[tuple[str, str, Callable[[W], list[str]], int]] = [
    ("no such option", "calib", lambda w: ["sweep", "--bogus"], 2),
    ("missing --k", "calib", lambda w: ["sweep", "--ladder", "8", "--out", str(w["d"] / "s.parquet")], 2),
    ("bad integer", "calib", lambda w: ["sweep", "--k", "five", "--ladder", "8", "--out", "s.parquet"], 2),
    ("bad ladder", "calib", lambda w: ["sweep", "--k", "5", "--ladder", "8,x", "--out", "s.parquet"], 2),
    ("duplicate ladder", "calib", lambda w: ["sweep", "--k", "5", "--ladder", "8,8", "--out", "s.parquet"], 2),
    ("unknown backend", "calib", lambda w: ["sweep", "--k", "5", "--ladder", "8", "--backend", "nope", "--out", "s.parquet"], 2),
    ("bad preset", "calib", lambda w: ["sweep", "--k", "5", "--ladder", "8", "--preset", "fast", "--out", "s.parquet"], 2),
    ("bad backend opt", "calib", lambda w: ["sweep", "--k", "5", "--ladder", "8", "--backend-opt", "ep", "--out", "s.parquet"], 2),
    ("trtllm without model", "calib", lambda w: ["sweep", "--k", "5", "--ladder", "8", "--backend", "trtllm", "--out", "s.parquet"], 2),
    ("reference too big", "calib", lambda w: ["sweep", "--k", "5", "--ladder", "8", "--backend", "reference", "--config", "deepseek-v3", "--device", "cpu", "--out", str(w["d"] / "big.parquet")], 2),
    ("fingerprint not json", "calib", lambda w: ["sweep", "--k", "5", "--ladder", "8", "--fingerprint", str(w["d"] / "not-json.json"), "--out", "s.parquet"], 2),
    ("bad live digest", "calib", lambda w: ["sweep", "--k", "5", "--ladder", "8", "--live-source-diff-sha256", "xyz", "--out", str(w["d"] / "s2.parquet")], 2),
    ("keygen bad algorithm", "calib", lambda w: ["keygen", "--out", str(w["d"] / "k2"), "--algorithm", "rsa"], 2),
    ("keygen passphrase unset", "calib", lambda w: ["keygen", "--out", str(w["d"] / "k3"), "--passphrase-env", "UNSET_VAR_X"], 2),
    ("trust init public key", "calib", lambda w: ["trust", "init", "--key", str(w["pub"]), "--out", str(w["d"] / "r2.json")], 2),
    ("trust init no key", "calib", lambda w: ["trust", "init", "--out", str(w["d"] / "r3.json")], 2),
    ("trust init exists", "calib", lambda w: ["trust", "init", "--key", str(w["key"]), "--out", str(w["root"])], 2),
    ("trust show not json", "calib", lambda w: ["trust", "show", str(w["d"] / "not-json.json")], 1),
    ("trust show missing", "calib", lambda w: ["trust", "show", str(w["d"] / "missing.json")], 2),
    ("signer uri unpaired", "calib", lambda w: ["trust", "init", "--signer-uri", "gcpkms:x", "--out", str(w["d"] / "r4.json")], 2),
    ("passphrase for no key", "calib", lambda w: ["trust", "init", "--key", str(w["key"]), "--passphrase-env", "other.pem=X", "--out", str(w["d"] / "r5.json")], 2),
    ("sign not parquet", "calib", lambda w: ["sign", str(w["d"] / "text.parquet"), "--key", str(w["key"]), "--version", "1"], 2),
    ("sign bad version", "calib", lambda w: ["sign", str(w["d"] / "text.parquet"), "--key", str(w["key"]), "--version", "x"], 2),
    ("fit no traces", "calib", lambda w: ["fit", "--out", str(w["d"] / "fit")], 2),
    ("fit empty dir", "calib", lambda w: ["fit", "--traces", str(w["d"] / "empty"), "--out", str(w["d"] / "fit")], 2),
    ("fit bad method", "calib", lambda w: ["fit", "--traces", str(w["d"] / "empty"), "--method", "magic", "--out", str(w["d"] / "fit")], 2),
    ("traces synth not parquet", "calib", lambda w: ["traces", "synth", "--out", str(w["d"] / "t.csv")], 2),
    ("traces synth wrong temperatures", "calib", lambda w: ["traces", "synth", "--k", "3", "--temperatures", "1,2", "--out", str(w["d"] / "t.parquet")], 2),
    ("workload wrong temperatures", "calib", lambda w: ["workload", "synth", "--k", "3", "--temperatures", "1,2", "--out", str(w["d"] / "w.parquet")], 2),
    ("workload bad temperatures", "calib", lambda w: ["workload", "synth", "--temperatures", "a,b", "--out", str(w["d"] / "w.parquet")], 2),
    ("build missing sweep file", "calib", lambda w: ["build", "--sweep", str(w["d"] / "no.parquet"), "--calibration", "c.parquet", "--workload", "w.parquet", "--key", str(w["key"]), "--trust-root", str(w["root"]), "--version", "1", "--out", str(w["d"] / "b")], 2),
    ("build bad expiry", "calib", lambda w: ["build", "--sweep", "s.parquet", "--calibration", "c.parquet", "--workload", "w.parquet", "--key", str(w["key"]), "--trust-root", str(w["root"]), "--version", "1", "--expires", "soon", "--out", str(w["d"] / "b")], 2),
    ("export no selector", "calib", lambda w: ["export", "trtllm", str(w["d"]), "--trust-root", str(w["root"]), "--out", str(w["d"] / "x")], 2),
    ("export nonexistent bundle", "calib", lambda w: ["export", "trtllm", "/nonexistent", "--trust-root", str(w["root"]), "--selector-identity", "a" * 64, "--out", str(w["d"] / "x")], 2),
    ("export a single artifact", "calib", lambda w: ["export", "trtllm", str(w["d"] / "text.parquet"), "--trust-root", str(w["root"]), "--selector-identity", "a" * 64, "--out", str(w["d"] / "x")], 2),
    ("report bad format", "calib", lambda w: ["report", str(w["d"]), "--trust-root", str(w["root"]), "--format", "pdf"], 2),
    ("report bad age", "calib", lambda w: ["report", str(w["d"]), "--trust-root", str(w["root"]), "--max-age-days", "0"], 2),
    ("verify no root or key", "verify", lambda w: [str(w["d"] / "text.parquet")], 2),
    ("verify root and key", "verify", lambda w: [str(w["d"] / "text.parquet"), "--trust-root", str(w["root"]), "--key", str(w["pub"])], 2),
    ("verify private key as --key", "verify", lambda w: [str(w["d"] / "text.parquet"), "--key", str(w["key"])], 2),
    ("verify bad unbind", "verify", lambda w: [str(w["d"] / "text.parquet"), "--trust-root", str(w["root"]), "--unbind", "colour"], 2),
    ("verify not parquet", "verify", lambda w: [str(w["d"] / "text.parquet"), "--trust-root", str(w["root"])], 1),
    ("verify missing file", "verify", lambda w: [str(w["d"] / "none.parquet"), "--trust-root", str(w["root"])], 2),
    ("verify bad live ladder", "verify", lambda w: [str(w["d"]), "--trust-root", str(w["root"]), "--live", "--live-ladder", "a,b"], 2),
    ("verify emit without selector", "verify", lambda w: [str(w["d"]), "--trust-root", str(w["root"]), "--emit-trtllm-options", str(w["d"] / "o.yaml")], 2),
    ("verify unknown bundled config", "verify", lambda w: [str(w["d"]), "--trust-root", str(w["root"]), "--live", "--live-model-config", "nope"], 2),
]


#: A progress line on a pipe: ``<command>: <stage>`` (see ``cli._common.stage_line``).
PROGRESS = re.compile(r"^(sweep|fit|build|report|export|workload|traces): ")


def _invoke(app: str, argv: list[str]) -> Any:
    target: typer.Typer = APP if app == "calib" else verify_app
    return runner.invoke(target, argv, env={"UNSET_VAR_X": ""})


@pytest.mark.parametrize(("name", "app", "argv", "code"), CASES, ids=[c[0] for c in CASES])
def test_wrong_invocation(world: W, name: str, app: str, argv: Callable[[W], list[str]], code: int) -> None:
    args = argv(world)
    r = _invoke(app, args)
    assert r.exit_code == code, (name, r.exit_code, r.stdout, r.stderr)
    assert ("Traceback" not in r.output and r.exception is None) or isinstance(r.exception, SystemExit), r.output
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines, f"{name}: nothing on stderr"
    # Progress lines (a stage, the sweep's estimate) may come first; the error is one line, the last.
    errors = [line for line in lines if not PROGRESS.match(line)]
    assert len(errors) == 1 and errors[0] == lines[-1], f"{name}: the error is not one last line: {lines}"
    last = lines[-1] if code == 2 else next(line for line in lines if ":" in line)
    assert ";" in last or " -h" in last, f"{name}: no fix in {last!r}"
    j = _invoke(app, [*args, "--json"])
    assert j.exit_code == code, (name, j.stdout, j.stderr)
    doc = json.loads(j.stdout)
    assert doc["ok"] is False and doc["error"] and doc["message"] and doc["fix"], doc


def test_at_least_thirty_rows() -> None:
    assert len(CASES) >= 30


def _flags_of(command: Any, out: set[str]) -> None:
    for param in getattr(command, "params", []):
        out.update(o for o in (*param.opts, *param.secondary_opts) if o.startswith("--"))
    for sub in getattr(command, "commands", {}).values():
        _flags_of(sub, out)


def test_every_flag_a_message_names_exists() -> None:
    import typer.main

    flags: set[str] = {"--help", "--install-completion", "--show-completion"}
    _flags_of(typer.main.get_command(APP), flags)
    _flags_of(typer.main.get_command(verify_app), flags)
    named: dict[str, set[str]] = {}
    pattern = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])")
    for path in SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for m in pattern.finditer(text):
            named.setdefault(m.group(1), set()).add(path.name)
    # Flags of other programs that messages quote on purpose.
    foreign = {"--binary", "--nproc_per_node", "--nnodes", "--update-goldens"}
    missing = {f: sorted(p) for f, p in named.items() if f not in flags and f not in foreign}
    assert not missing, f"messages name flags the CLI does not have: {missing}"
