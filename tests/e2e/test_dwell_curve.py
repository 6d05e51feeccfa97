"""``benchmarks/dwell_curve.py``: a compact saving per stay, with the dwell its sequences had, on a
harness record whose step times are known."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from benchmarks import dwell_curve as dc
from benchmarks import independent_harness as ih

from dspark_calibrate.calibrate.measurement.ladder import CellSpec

ROOT = Path(__file__).resolve().parents[2]
CELLS = [CellSpec(8, 0, 5), CellSpec(8, 16, 5)]


def _record(tmp_path: Path) -> Path:
    """Two stays of one G: the compact step costs 8 ms (10 ms native) once it follows two compact
    steps, 9 ms while a native step is one of the two before it: the more a sequence switches, the
    less it saves."""
    blocks = []
    rng = np.random.default_rng(0)
    for stay in (0.0, 0.9):
        seq = ih.alternating_sequence(rng, CELLS, 400, stay)
        ms = [10.0 if c == 0 else (9.0 if i < 2 or 0 in seq[i - 2 : i] else 8.0) for i, c in enumerate(seq)]
        blocks.append(ih._Block(8, seq, stay, ms))
    each = {
        stay: ih.summarize_harness(
            {8: CELLS}, [b for b in blocks if b.stay == stay], discard=5, gpu="x", seconds=1
        )
        for stay in (0.0, 0.9)
    }
    record = {
        **each[0.0],
        "stays": [0.0, 0.9],
        "by_stay": {
            f"{s:g}": {"cells": r["cells"], "switch_share": r["switch_share"]} for s, r in each.items()
        },
        "steps": [{"g": b.g, "stay": b.stay, "cells": b.cells, "ms": b.ms} for b in blocks],
    }
    path = tmp_path / "independent.json"
    path.write_text(json.dumps(record))
    return path


def test_the_curve_on_known_step_times(tmp_path: Path) -> None:
    curve = dc.dwell_curve(json.loads(_record(tmp_path).read_text()))
    (cell,) = curve["cells"]
    assert cell["cell"] == "G8/V16"
    assert curve["dwell_by_stay"]["0.9"] > 5 * curve["dwell_by_stay"]["0"] > 5
    short, long = cell["by_stay"]["0"]["saving"], cell["by_stay"]["0.9"]["saving"]
    assert long == pytest.approx(0.2) and short == pytest.approx(0.1)  # most steps near a native one
    assert cell["saving_after_switch"] == pytest.approx(0.1) and cell["saving_after_stay"] == pytest.approx(
        0.2
    )
    assert cell["span_pp"] == pytest.approx(100 * (long - short)) and curve["span_pp_per_g"] == {
        "8": cell["span_pp"]
    }


def test_the_script_writes_its_file(tmp_path: Path) -> None:
    out = tmp_path / "curve.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "dwell_curve.py"),
            "--harness",
            str(_record(tmp_path)),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert "G8/V16" in done.stdout and json.loads(out.read_text())["cells"][0]["cell"] == "G8/V16"


def test_a_record_without_steps_is_refused(tmp_path: Path) -> None:
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"cells": [], "discard": 40}))
    with pytest.raises(SystemExit, match="no recorded steps"):
        dc.main(["--harness", str(old)])
