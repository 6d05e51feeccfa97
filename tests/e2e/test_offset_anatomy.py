"""``benchmarks/offset_anatomy.py``: a recorded sweep's saving differences to the harness, split by
the visit's mix, the G visited before and the half of the visit, on known samples."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from benchmarks import offset_anatomy as oa

#: G=64's native at 10 ms; its compact V128 saves 30% in a round that follows a lighter G and 32%
#: otherwise, except in its visit's second half, where it saves 1 pp more.
HARNESS = {
    "cells": [
        {"graph_batch_size": 64, "verifier_budget": 0, "kind": "native", "saving": 0.0},
        {"graph_batch_size": 64, "verifier_budget": 128, "kind": "compact", "saving": 0.31},
        {"graph_batch_size": 64, "verifier_budget": 384, "kind": "control", "saving": 0.0},
    ]
}


def _samples(rounds: int = 6, per_visit: int = 4) -> pd.DataFrame:
    rows: list[dict[str, Any]] = []
    for r in range(rounds):
        prev = 32 if r % 2 else 128  # odd rounds follow a lighter G
        cells = [0, 128, 384] if r < rounds - 2 else [0, 128]  # the control stops two rounds early
        for v in cells:
            for j in range(per_visit):
                late = j >= per_visit // 2
                saving = {0: 0.0, 384: 0.0, 128: (0.30 if prev < 64 else 0.32) + (0.01 if late else 0.0)}[v]
                rows.append(
                    {
                        "graph_batch_size": 64, "verifier_budget": v, "round": r, "epoch": 0,
                        "sample_index": r * per_visit + j, "step_time_ms": 10.0 * (1 - saving),
                        "kept": True, "sm_clock_mhz": 1800.0 + (30.0 if len(cells) == 2 else 0.0),
                        "prev_graph_batch_size": prev,
                    }
                )  # fmt: skip
    return pd.DataFrame(rows)


def _write(tmp_path: Path, frame: pd.DataFrame) -> Path:
    frame.to_parquet(tmp_path / "adaptive.samples.parquet")
    (tmp_path / "h.json").write_text(json.dumps(HARNESS))
    return tmp_path


def test_the_differences_split_as_the_samples_were_made(tmp_path: Path) -> None:
    """Medians of a visit's samples mix its two halves (two of four late), so a round's saving is
    the halves' midpoint; the splits recover each half and each previous G."""
    _write(tmp_path, _samples())
    out = tmp_path / "a.json"
    assert oa.main(["--sweep", str(tmp_path), "--harness", str(tmp_path / "h.json"), "--out", str(out)]) == 0
    g64 = json.loads(out.read_text())["per_g"]["64"]
    assert g64["mean_diff_pp"] == pytest.approx(0.5, abs=1e-6)  # (30.5 + 32.5) / 2 − 31
    prev = g64["by_previous"]
    assert prev["lighter"]["diff_pp"]["V128"] == pytest.approx(-0.5, abs=1e-6)
    assert prev["heavier"]["diff_pp"]["V128"] == pytest.approx(1.5, abs=1e-6)
    assert (prev["lighter"]["rounds"], prev["heavier"]["rounds"]) == (3, 3)
    half = g64["by_half"]
    assert half["late"]["diff_pp"]["V128"] - half["early"]["diff_pp"]["V128"] == pytest.approx(1.0, abs=1e-6)
    mix = g64["by_mix"]
    assert (mix["3 cells"]["rounds"], mix["2 cells"]["rounds"]) == (4, 2)
    assert mix["2 cells"]["sm_clock_mhz_median"] == 1830.0 and mix["3 cells"]["sm_clock_mhz_median"] == 1800.0


def test_a_diff_is_sweep_minus_harness() -> None:
    """A sweep that saves less than the harness has a negative difference."""
    frame = _samples()
    frame.loc[frame["verifier_budget"] == 128, "step_time_ms"] = 7.0  # saves 30%
    result = oa.anatomy(
        frame.assign(j=frame.groupby(["verifier_budget", "round"]).cumcount() + 1), {(64, 128): 0.31}
    )
    assert result["per_g"]["64"]["mean_diff_pp"] == pytest.approx(-1.0, abs=1e-6)


@pytest.mark.parametrize(
    ("harness", "match"),
    [
        ({"cells": []}, "no compact cell"),
        (
            {"cells": [{"graph_batch_size": 64, "verifier_budget": 0, "kind": "native", "saving": 0.0}]},
            "no compact",
        ),
    ],
    ids=["empty", "only-native"],
)
def test_a_harness_without_compact_cells_is_refused(harness: dict[str, Any], match: str) -> None:
    with pytest.raises(SystemExit, match=match):
        oa.harness_savings(harness)


def test_an_unreadable_harness_file_is_named(tmp_path: Path) -> None:
    _write(tmp_path, _samples())
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match=r"bad\.json: not a readable harness result"):
        oa.main(["--sweep", str(tmp_path), "--harness", str(bad)])
