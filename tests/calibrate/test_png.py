"""The shared figure/PNG helper: deterministic bytes, no Software stamp, a clear error without matplotlib."""

from __future__ import annotations

import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dspark_calibrate.calibrate._png import new_figure, png_bytes
from dspark_calibrate.errors import ConfigError

pytest.importorskip("matplotlib")


def _draw() -> bytes:
    fig = new_figure(2.0, 1.5, dpi=50, what="a plot", skip_flag="--no-plot")
    fig.add_subplot().plot([0, 1, 2], [1, 0, 1])
    return png_bytes(fig)


def test_same_figure_same_bytes_and_no_software_chunk() -> None:
    png = _draw()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert png == _draw()
    assert b"Software" not in png and b"matplotlib.org" not in png


def test_size_follows_inches_times_dpi() -> None:
    png = _draw()
    width, height = struct.unpack(">II", png[16:24])  # IHDR
    assert (width, height) == (100, 75)


def test_without_matplotlib_the_error_says_how_to_install_or_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # makes the import fail
    with pytest.raises(
        ConfigError, match=r"the sweep plot: matplotlib is not installed.*'plots' extra.*--no-plot"
    ):
        new_figure(1.0, 1.0, what="the sweep plot", skip_flag="--no-plot")
    from dspark_calibrate.calibrate.deployment.build import _plots

    report = SimpleNamespace(per_cell=[{"graph_batch_size": 8, "verifier_budget": 16}])
    paths, notes = _plots(Path("/nonexistent"), report)  # type: ignore[arg-type]
    assert paths == [] and notes == [
        "plots skipped: build plots: matplotlib is not installed; install the 'plots' extra or pass --no-plots"
    ]
