"""`sweep` at the command line on the reference backend: the estimate comes first, and no interval
bound is ever negative, even on a noisy CPU with few rounds (the regression of a negative
``ci_low_ms`` a short reference sweep once wrote)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dspark_calibrate.cli import build_calibrate_app

pytestmark = pytest.mark.slow


def test_reference_sweep_bounds_are_positive(tmp_path: Path) -> None:
    out = tmp_path / "sweep.parquet"
    r = CliRunner().invoke(
        build_calibrate_app(),
        [
            "sweep", "--backend", "reference", "--config", "tiny", "--device", "cpu", "--k", "3",
            "--ladder", "1,2", "--preset", "quick", "--budget", "6", "--min-rounds", "2",
            "--no-plot", "--live-topology", "TP1", "--out", str(out),
        ],
    )  # fmt: skip
    assert r.exit_code in (0, 1), r.output
    assert "sweep: needs weights" in r.stderr and "available" in r.stderr
    table = pq.read_table(out).to_pydict()
    for low, med, high in zip(table["ci_low_ms"], table["step_time_ms"], table["ci_high_ms"], strict=True):
        assert 0 < low <= med <= high
