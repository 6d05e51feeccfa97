"""``benchmarks/visit_noise.py``: a sweep's round noise split into what a visit's samples predict
and what they share, on known inputs and on a real synthetic sweep."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from benchmarks import visit_noise as vn
from typer.testing import CliRunner

from dspark_calibrate.cli import build_calibrate_app


def _write(tmp_path: Path, rows: list[dict[str, float]]) -> Path:
    frame = pd.DataFrame(rows)
    frame["kept"] = True
    frame.to_parquet(tmp_path / "adaptive.samples.parquet")
    return tmp_path


def _rows(
    visit_offsets: list[float], sample_offsets: list[float], epochs: list[int]
) -> list[dict[str, float]]:
    """G=8: a native cell at 10 ms and a control whose log-ratio in round r is
    ``visit_offsets[r] + sample_offsets[j]`` at its j-th sample; every round of design 0 (even)."""
    rows = []
    for k, (offset, epoch) in enumerate(zip(visit_offsets, epochs, strict=True)):
        r = 2 * k  # even rounds: the switching design
        for j, s in enumerate(sample_offsets):
            i = k * len(sample_offsets) + j
            base = {"graph_batch_size": 8, "round": r, "epoch": epoch, "sample_index": i}
            rows.append({**base, "verifier_budget": 0, "step_time_ms": 10.0})
            rows.append({**base, "verifier_budget": 48, "step_time_ms": 10.0 * math.exp(offset + s)})
    return rows


def test_the_split_on_known_inputs(tmp_path: Path) -> None:
    visits, samples = [0.01, -0.01, 0.02, -0.02], [0.003, -0.003]
    epochs = [0, 0, 1, 1]
    got = vn.noise(vn.load_samples(_write(tmp_path, _rows(visits, samples, epochs))))
    row = got["8"]["G8/V48"]["switching"]
    assert got["8"]["G8/V48"]["runs"] is None  # no odd round
    # Visit deviations from their epoch's mean: ±0.01 and ±0.02, over 4 − 2 degrees of freedom.
    assert row["visit_sd"] == pytest.approx(math.sqrt((2 * 0.01**2 + 2 * 0.02**2) / 2))
    # Within a visit the samples sit ±0.003 about its mean: 4 visits × 1 df; over √2 for a mean.
    assert row["expected_sd"] == pytest.approx(math.sqrt(8 * 0.003**2 / 4) / math.sqrt(2))
    assert row["excess_sd"] == pytest.approx(math.sqrt(row["visit_sd"] ** 2 - row["expected_sd"] ** 2))
    assert row["visits"] == 4 and row["samples_per_visit"] == 2


def test_noise_the_samples_explain_leaves_no_excess(tmp_path: Path) -> None:
    visits, samples = [0.0, 0.0, 0.0, 0.0], [0.01, -0.01]
    row = vn.noise(vn.load_samples(_write(tmp_path, _rows(visits, samples, [0, 0, 1, 1]))))["8"]["G8/V48"]
    assert row["switching"]["visit_sd"] == pytest.approx(0.0, abs=1e-12)
    assert row["switching"]["excess_sd"] == 0.0


@pytest.mark.parametrize(
    ("files", "match"),
    [({}, "no \\*.samples.parquet"), ({"x.samples.parquet": ["round"]}, "missing column")],
)
def test_what_it_cannot_read_is_refused(tmp_path: Path, files: dict[str, list[str]], match: str) -> None:
    for name, columns in files.items():
        pd.DataFrame({c: [1] for c in columns}).to_parquet(tmp_path / name)
    with pytest.raises(SystemExit, match=match):
        vn.load_samples(tmp_path)


@pytest.mark.slow  # 1 s: a sweep
def test_a_synthetic_interleaved_sweep_end_to_end(tmp_path: Path) -> None:
    args = ["sweep", "--k", "3", "--ladder", "2,4", "--out", str(tmp_path / "s.parquet"), "--preset", "quick"]
    args += [
        "--interleave",
        "--backend-opt",
        "power_capped=true",
        "--backend-opt",
        "wander_rel=0.01",
        "--no-plot",
    ]
    args += ["--recapture-every", "8", "--min-rounds", "8"]  # visits of both designs share an epoch
    res = CliRunner().invoke(build_calibrate_app(), args)
    assert res.exit_code == 0, res.output
    out = tmp_path / "noise.json"
    assert vn.main(["--sweep", str(tmp_path), "--out", str(out)]) == 0
    sweep = json.loads(out.read_text())["sweeps"][0]
    assert sweep["interleave_design"] == 5 and sweep["samples_per_visit"] >= 1
    rows = [r for cells in sweep["per_g"].values() for d in cells.values() for r in d.values() if r]
    assert set(sweep["per_g"]) == {"2", "4"} and rows
    assert all(np.isfinite([r["visit_sd"], r["expected_sd"], r["excess_sd"]]).all() for r in rows)
