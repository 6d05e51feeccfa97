"""Crash safety: journal resume after failures, torn tails and SIGKILL at random points."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import dspark_calibrate
from dspark_calibrate.artifacts import read_artifact
from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticBackend
from dspark_calibrate.calibrate.measurement.journal import read_journal
from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.calibrate.measurement.stats import Thresholds
from dspark_calibrate.calibrate.measurement.sweep import round_order, run_sweep
from dspark_calibrate.errors import ConfigError, MeasurementError
from tests.calibrate.conftest import make_config


def _visits(journal: Path) -> list[tuple[int, int, int]]:
    return [(r["round"], r["g"], r["v"]) for r in read_journal(journal).records if r["type"] == "visit"]


def _check_journal_order(journal: Path, seed: int, cells: tuple[CellSpec, ...]) -> None:
    """Every round's visits follow the seeded order of the cells still open in that round."""
    records = read_journal(journal).records
    k = cells[0].k
    stopped: set[tuple[int, int]] = set()
    rounds = sorted({r["round"] for r in records if r["type"] == "visit"})
    for rnd in rounds:
        open_cells = [c for c in cells if c.key not in stopped]
        got = [(r["g"], r["v"]) for r in records if r["type"] == "visit" and r["round"] == rnd]
        assert got == [c.key for c in round_order(seed, rnd, open_cells)][: len(got)]
        stopped |= {(r["g"], r["v"]) for r in records if r["type"] == "stop" and r["round"] == rnd}
    assert all(CellSpec(g, v, k) in cells for g, v in stopped)


def test_resume_after_backend_failure_does_not_remeasure(tmp_path: Path) -> None:
    journal = tmp_path / "j.jsonl"
    # A precision target that cells reach in different rounds.
    th = Thresholds.quick(precision_rel=0.004)
    whole = SyntheticBackend(seed=0)
    run_sweep(make_config(whole, thresholds=th)[0], whole, journal_path=None)
    # Fail late enough that some cells finished, early enough that others had not.
    broken = SyntheticBackend(seed=0, fail_at=int(0.9 * whole._steps))
    config, _ = make_config(broken, thresholds=th)
    with pytest.raises(MeasurementError):
        run_sweep(config, broken, journal_path=journal)
    before = read_journal(journal).records
    stopped_before = {(r["g"], r["v"]) for r in before if r["type"] == "stop"}
    assert stopped_before, "some cells finished before the failure"
    result = run_sweep(config, SyntheticBackend(seed=0), journal_path=journal, resume=True)
    assert result.resumed and result.complete
    after = read_journal(journal).records[len(before) :]
    assert not {(r["g"], r["v"]) for r in after if r["type"] == "visit"} & stopped_before
    assert max(Counter(_visits(journal)).values()) == 1  # no (round, cell) visited twice
    _check_journal_order(journal, config.seed, config.cells)


@pytest.mark.parametrize(
    ("case", "change", "field"),
    [
        ("other_seed", {"seed": 9}, "seed"),
        ("other_k", {"k": 2}, "k"),
        ("other_ladder", {"ladder": (2, 8)}, "ladder"),
        ("other_thresholds", {"thresholds": Thresholds.quick(precision_rel=0.05)}, "thresholds"),
    ],
)
def test_resume_refuses_another_configuration(tmp_path: Path, case: str, change: dict, field: str) -> None:
    journal = tmp_path / "j.jsonl"
    config, backend = make_config()
    run_sweep(config, backend, journal_path=journal)
    other, other_backend = make_config(**change)
    with pytest.raises(ConfigError, match=rf"another configuration|written for configuration.*{field}"):
        run_sweep(other, other_backend, journal_path=journal, resume=True)


def test_journal_guards(tmp_path: Path) -> None:
    config, backend = make_config()
    journal = tmp_path / "j.jsonl"
    with pytest.raises(ConfigError, match="no sweep journal"):
        run_sweep(config, backend, journal_path=journal, resume=True)
    run_sweep(config, backend, journal_path=journal)
    with pytest.raises(ConfigError, match="--resume"):
        run_sweep(config, backend, journal_path=journal)
    (tmp_path / "bad.jsonl").write_text('{"type": "visit"}\n')
    with pytest.raises(ConfigError, match="header"):
        run_sweep(config, backend, journal_path=tmp_path / "bad.jsonl", resume=True)
    lines = journal.read_bytes().split(b"\n")
    lines[2] = b"{not json"
    (tmp_path / "corrupt.jsonl").write_bytes(b"\n".join(lines))
    with pytest.raises(ConfigError, match="corrupt"):
        run_sweep(config, backend, journal_path=tmp_path / "corrupt.jsonl", resume=True)


def test_torn_tail_is_cut_and_finished_journal_is_not_remeasured(tmp_path: Path) -> None:
    config, backend = make_config()
    journal = tmp_path / "j.jsonl"
    first = run_sweep(config, backend, journal_path=journal)
    size = journal.stat().st_size
    with journal.open("ab") as fh:
        fh.write(b'{"type":"visit","g":2,"v":0,"rou')  # a write the kill interrupted
    again = run_sweep(config, SyntheticBackend(seed=5, fail_at=1), journal_path=journal, resume=True)
    assert journal.stat().st_size == size  # torn bytes removed, nothing measured
    assert [c.summary for c in again.cells] == [c.summary for c in first.cells]


_WORKER = """
import sys
from pathlib import Path
from dspark_calibrate.calibrate.measurement.stats import Thresholds
from dspark_calibrate.calibrate.measurement.sweep import SweepRequest, execute
out, resume = Path(sys.argv[1]), sys.argv[2] == "1"
started = []
def on_event(event):
    # Started means the journal exists: the stages before the first round (loading the backend,
    # probing the deployment) come earlier.
    if not started and event.kind not in ("stage", "estimate"):
        started.append(1)
        print("started", flush=True)
req = SweepRequest(backend="synthetic", backend_options={"seed": 4, "real_delay_s": 0.0004},
                   k=3, ladder=(2, 4),
                   max_candidates=6, out=out, resume=resume, seed=11, thresholds=Thresholds.quick())
result, output = execute(req, on_event=on_event)
print("done", result.complete, flush=True)
"""


def _spawn(out: Path, resume: bool) -> subprocess.Popen[str]:
    env = dict(os.environ)
    src = str(Path(dspark_calibrate.__file__).resolve().parents[1])
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([src, root, env.get("PYTHONPATH", "")])
    return subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(out), "1" if resume else "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume(tmp_path: Path) -> None:
    out = tmp_path / "s.parquet"
    journal = tmp_path / "s.journal.jsonl"
    rng = random.Random(2024)
    kills = 0
    for attempt in range(3):
        proc = _spawn(out, resume=attempt > 0)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "started", proc.stderr.read() if proc.stderr else ""
        time.sleep(rng.uniform(0.05, 0.6))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait(timeout=30)
        # a killed sweep leaves no output file, or (if it got that far) a complete one
        if out.exists():
            assert read_artifact(out).kind == "sweep"
    assert kills >= 1
    final = _spawn(out, resume=True)
    stdout, stderr = final.communicate(timeout=60)
    assert final.returncode == 0, stderr
    assert "done True" in stdout
    loaded = read_artifact(out)
    config, _ = make_config(k=3, ladder=(2, 4), seed=11, forced_k=True)
    assert loaded.table.num_rows == len(config.cells)
    assert max(Counter(_visits(journal)).values()) == 1
    _check_journal_order(journal, 11, config.cells)
