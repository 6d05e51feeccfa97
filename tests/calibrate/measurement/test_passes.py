"""A sweep in several processes: the command lines of each pass, and a real three-process sweep."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_calibrate.artifacts import read_artifact
from dspark_calibrate.calibrate.measurement.journal import read_journal
from dspark_calibrate.calibrate.measurement.passes import pass_commands, run_passes
from dspark_calibrate.calibrate.measurement.sweep import samples_path
from dspark_calibrate.errors import ConfigError

ARGS = [
    "--backend",
    "synthetic",
    "--k",
    "3",
    "--ladder",
    "2,4",
    "--out",
    "s.parquet",
    "--json",
    "--passes",
    "3",
]


def test_each_pass_resumes_the_one_before_and_stops_at_its_rounds() -> None:
    cmds = pass_commands(ARGS, passes=3, rounds_per_pass=2, resume=False, as_json=True)
    assert len(cmds) == 3
    for i, cmd in enumerate(cmds):
        assert cmd[:8] == ARGS[:8]  # the user's own options, unchanged
        assert cmd.count("--passes") == 1 and cmd[cmd.index("--passes") + 1] == "1"
        assert (
            cmd[cmd.index("--recapture-every") + 1] == "2" and cmd[cmd.index("--epochs-required") + 1] == "3"
        )
        assert ("--resume" in cmd) == (i > 0)
        assert cmd[cmd.index("--pass-index") + 1] == str(i)
    assert cmds[0][cmds[0].index("--until-round") + 1] == "2"
    assert cmds[1][cmds[1].index("--until-round") + 1] == "4"
    assert "--until-round" not in cmds[2] and "--json" in cmds[2] and "--json" not in cmds[0]


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        (["--passes=4", "--resume", "--until-round", "9", "--k", "3"], ["--k", "3"]),
        (["--recapture-every=5", "--json", "--ladder", "2"], ["--ladder", "2"]),
    ],
)
def test_the_parent_replaces_the_options_it_owns(argv: list[str], kept: list[str]) -> None:
    cmd = pass_commands(argv, passes=2, rounds_per_pass=3, resume=True, as_json=False)[0]
    assert cmd[: len(kept)] == kept and "--resume" in cmd
    assert cmd.count("--recapture-every") == 1 and cmd[cmd.index("--recapture-every") + 1] == "3"


@pytest.mark.parametrize(("passes", "rounds"), [(1, 3), (3, 0)])
def test_bad_pass_settings_are_refused(passes: int, rounds: int) -> None:
    with pytest.raises(ConfigError, match=r"--passes|--recapture-every"):
        pass_commands(ARGS, passes=passes, rounds_per_pass=rounds, resume=False, as_json=False)


def test_a_failing_pass_stops_the_rest(tmp_path: Path) -> None:
    calls: list[list[str]] = []

    def fake(args: list[str]) -> int:
        calls.append(args)
        return 1 if len(calls) == 2 else 0

    cmds = pass_commands(ARGS, passes=3, rounds_per_pass=2, resume=False, as_json=False)
    assert run_passes(cmds, out=tmp_path / "s.parquet", run=fake) == 1
    assert len(calls) == 2


@pytest.mark.slow
def test_a_real_sweep_in_three_processes(tmp_path: Path) -> None:
    """Three child processes over one journal: every cell spans three passes (epochs), the
    journal holds each round once, and only the last pass writes the outputs."""
    out = tmp_path / "s.parquet"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dspark_calibrate.cli",
            "sweep",
            "--backend",
            "synthetic",
            "--backend-opt",
            "process_rel=0.01",
            "--k",
            "3",
            "--ladder",
            "2,4",
            "--max-candidates",
            "3",
            "--preset",
            "quick",
            "--passes",
            "3",
            "--recapture-every",
            "2",
            "--no-plot",
            "--json",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and report["between_run"]["epochs"] == 3
    assert proc.stderr.count("the next pass continues with --resume") == 2
    rows = read_artifact(out).table.to_pylist()
    assert rows and all(r["epochs"] == 3 for r in rows)
    samples = read_artifact(samples_path(out)).table.to_pydict()
    assert set(samples["epoch"]) == {0, 1, 2}
    visits = [
        (r["round"], r["g"], r["v"])
        for r in read_journal(tmp_path / "s.journal.jsonl").records
        if r["type"] == "visit"
    ]
    assert len(visits) == len(set(visits))  # no (round, cell) measured twice across processes
