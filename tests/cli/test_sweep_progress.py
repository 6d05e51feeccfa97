"""The sweep's progress display tells only what it knows: no "None" total, no "≥ 0:00" time left,
no precision wider than the median, a count that agrees with the cells, a final line on a pipe,
and a live line that says how long it has waited during a stall. ``fit`` names its stages.

The live rendering is checked on a real (synthetic-backend) sweep drawn into a recording
terminal console: every frame the display would draw is captured after each event.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.cli._sweep_progress import (
    SweepProgress,
    finish_line,
    format_left,
    format_precision,
    format_seconds,
)

runner = CliRunner()


@pytest.mark.parametrize(
    ("eta", "shown"),
    [
        (None, "time left: estimating"),  # no visit of this process timed yet (a resumed sweep too)
        (0.0, ""),  # a lower bound under a second says nothing about the rounds still to come
        (0.4, ""),
        (math.inf, ""),
        (75.0, "at least 1:15 left"),
        (3725.0, "at least 1:02:05 left"),
    ],
)
def test_time_left_is_a_lower_bound_or_nothing(eta: float | None, shown: str) -> None:
    assert format_left(eta) == shown


@pytest.mark.parametrize(
    ("hw", "target", "shown"),
    [
        (None, 0.005, ""),
        (0.012, 0.005, "±1.20% (target ±0.50%)"),
        (0.012, None, "±1.20%"),
        (3.6735360182736027e17, 0.005, "±>100% (target ±0.50%)"),
        (math.nan, 0.005, "±>100% (target ±0.50%)"),
        (math.inf, None, "±>100%"),
    ],
)
def test_precision_is_never_an_absurd_number(hw: float | None, target: float | None, shown: str) -> None:
    assert format_precision(hw, target) == shown


def test_format_seconds() -> None:
    assert [format_seconds(s) for s in (0, 59.6, 61, 3600)] == ["0:00", "1:00", "1:01", "1:00:00"]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _terminal() -> Console:
    return Console(file=io.StringIO(), force_terminal=True, width=200, color_system=None)


def _frame(progress: SweepProgress) -> str:
    console = _terminal()
    console.print(progress.progress.get_renderable())
    text = console.file.getvalue()  # type: ignore[attr-defined]
    return str(text)


def test_live_frames_of_a_real_sweep_tell_the_truth(tmp_path: Path) -> None:
    from dspark_calibrate.calibrate.measurement.stats import Thresholds
    from dspark_calibrate.calibrate.measurement.sweep import SweepRequest, execute

    thresholds = Thresholds.quick()
    display = SweepProgress(quiet=False, precision_rel=thresholds.precision_rel, console=_terminal())
    assert display.live
    frames = [_frame(display)]
    kinds: list[str] = []

    def on_event(event: Any) -> None:
        display(event)
        kinds.append(event.kind)
        frames.append(_frame(display))

    request = SweepRequest(
        backend="synthetic", backend_options={}, k=5, ladder=(8, 16), out=tmp_path / "s.parquet",
        thresholds=thresholds, plot=False,
    )  # fmt: skip
    result, output = execute(request, on_event=on_event)
    assert output is not None and result.complete
    assert {"stage", "round", "visit", "cell_done", "end"} <= set(kinds)
    text = "\n".join(frames)
    assert "None" not in text and "≥ 0:00" not in text and "measuring the first round" not in text
    for shown in re.findall(r"±([0-9.]+)%", text):
        assert float(shown) <= 100.0, shown
    assert "summarising" in text  # the seconds after the last round are named too
    total = len(result.cells)
    counts = [int(m) for m in re.findall(rf"(\d+)/{total} cells done", text)]
    assert counts == sorted(counts) and counts[-1] == total  # never backwards, and ends complete
    # Within a round the visits move even while no cell has stopped yet.
    assert re.search(r"round 0: \d+/\d+ visits", text)
    assert finish_line(result, 1.0, display.visits).startswith(f"done: {total}/{total} cells stopped")


def test_a_stall_is_shown_while_it_lasts() -> None:
    from dspark_calibrate.calibrate.measurement.sweep import SweepEvent

    clock = _Clock()
    display = SweepProgress(quiet=False, clock=clock, console=_terminal())
    display(SweepEvent("round", 3, 10, 40, eta_s=30.0))
    clock.now += 2.0
    assert "since the last visit" not in _frame(display)
    clock.now += 10.0  # a re-capture, a slow cell: nothing reports for 12 s
    frame = _frame(display)
    assert "0:12 since the last visit" in frame and "at least 0:30 left" in frame
    display(SweepEvent("stage", 4, 40, 40, detail="summarising 40 cells"))
    clock.now += 30.0
    assert "since the last visit" not in _frame(display)  # not measuring: no stall to report


def test_nothing_before_the_first_event_but_the_stage() -> None:
    display = SweepProgress(quiet=False, console=_terminal())
    frame = _frame(display)
    assert "starting" in frame and "None" not in frame and "cells done" not in frame


@pytest.mark.slow
def test_a_piped_sweep_ends_with_a_final_line(tmp_path: Path) -> None:
    args = ["sweep", "--k", "5", "--ladder", "8", "--preset", "quick", "--out", str(tmp_path / "s.parquet"), "--no-plot"]
    r = runner.invoke(build_calibrate_app(), args)
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert any(line.startswith("sweep: round 0 (0/") for line in lines), lines
    assert "sweep: summarising" in " ".join(lines) and "sweep: writing" in " ".join(lines)
    last = lines[-1]
    m = re.match(r"sweep: done: (\d+)/(\d+) cells stopped \((.*)\) after (\d+) rounds, (\d+) visits in \d+:\d\d$", last)
    assert m is not None, last
    assert m.group(1) == m.group(2)


def test_fit_names_its_stages(tmp_path: Path) -> None:
    from dspark_calibrate.calibrate.confidence.synth_traces import SynthSpec, write_synth_traces

    traces = tmp_path / "t.parquet"
    write_synth_traces(traces, SynthSpec(rounds=3000, k=3, rounds_per_request=30))
    r = runner.invoke(
        build_calibrate_app(), ["fit", "--traces", str(traces), "--out", str(tmp_path / "fit"), "--no-plots"]
    )
    assert r.exit_code == 0, r.output
    stages = [line for line in r.stderr.splitlines() if line.startswith("fit: ")]
    assert stages[:3] == [
        "fit: reading traces",
        "fit: fitting 3,000 rounds and scoring the held-out requests",
        "fit: writing the calibration, its report",
    ], stages
