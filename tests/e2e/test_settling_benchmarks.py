"""``benchmarks/settling_curve.py``, ``benchmarks/mix_composition.py`` and
``benchmarks/layout_probe.py``: their pure parts on known inputs, and each whole benchmark in its
tiny CPU mode (the GPU runs' logic, without a GPU)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from benchmarks import layout_probe as lp
from benchmarks import mix_composition as mc
from benchmarks import settling_curve as sc

from dspark_calibrate.calibrate.measurement.ladder import CellSpec


def _cells() -> list[CellSpec]:
    return [CellSpec(8, 0, 5), CellSpec(8, 16, 5)]


def _dwell(native_ms: list[float], compact_ms: float) -> tuple[list[int], list[float]]:
    """Native and compact steps alternating; the native's times as given, the compact's fixed."""
    order, ms = [], []
    for n in native_ms:
        order += [0, 1]
        ms += [n, compact_ms]
    return order, ms


def test_the_curve_bins_steps_by_when_they_end() -> None:
    # Steps of 50 ms: the first window (0-0.1 s) holds the first native and compact step.
    order, ms = _dwell([50.0, 50.0, 50.0, 50.0], 25.0)
    rows = sc.curve(_cells(), order, ms, [], [0.0, 0.1, 0.4])
    assert [r["steps"] for r in rows] == [2, 6]  # steps end at 0.05, 0.075 | 0.125, ..., 0.3 s
    first = rows[0]["cells"]
    assert first["G8/V0"]["median_ms"] == 50.0 and first["G8/V16"]["saving"] == pytest.approx(0.5)


def test_a_dwell_that_starts_fast_settles_when_its_windows_stop_moving() -> None:
    """The native runs 3% fast for its first 0.5 s, then at its settled time: the settle is the
    first window start after which every window is within tolerance."""
    native = [9.7] * 50 + [10.0] * 400
    order, ms = _dwell(native, 7.0)
    edges = [0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0]
    rows = sc.curve(_cells(), order, ms, [], edges)
    out = sc.settle_time(rows, tolerance_pp=0.2, tolerance_rel=0.002)
    assert out["settled_native_ms"] == pytest.approx(10.0)
    assert out["first_window_native_rel"] == pytest.approx(0.03, abs=1e-9)
    assert 0.25 <= out["settle_s"] <= 1.0
    flat = sc.settle_time(
        sc.curve(_cells(), *_dwell([10.0] * 450, 7.0), [], edges), tolerance_pp=0.2, tolerance_rel=0.002
    )
    assert flat["settle_s"] == 0.0


def test_a_dwell_that_never_settles_says_so() -> None:
    native = [10.0 * (1.0 + 0.01 * math.sin(i / 7.0)) for i in range(450)]  # ±1%, to the end
    rows = sc.curve(_cells(), *_dwell(native, 7.0), [], [0.0, 0.5, 1.0, 2.0, 4.0, 6.0, 8.0])
    assert sc.settle_time(rows, tolerance_pp=0.05, tolerance_rel=0.0005)["settle_s"] is None


@pytest.mark.parametrize(("share", "stay"), [(None, 0.0), (0.5, 0.0), (0.4, 0.5), (0.5, 0.75)])
def test_the_weighted_sequence_holds_its_native_share(share: float | None, stay: float) -> None:
    order = mc.weighted_sequence(np.random.default_rng(1), 4, 20_000, share, stay)
    want = 0.25 if share is None else share
    assert np.mean(np.asarray(order) == 0) == pytest.approx(want, abs=0.03)
    repeats = np.mean(np.diff(order) == 0)
    # a step repeats its cell when it stays, or draws the same cell again
    assert repeats == pytest.approx(stay + (1 - stay) * (want**2 + 3 * ((1 - want) / 3) ** 2), abs=0.03)


def test_both_saving_estimators_agree_on_steady_steps() -> None:
    order = [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]
    ms = [10.0, 7.0, 8.0] * 4
    out = mc.savings(order, ms, 3)
    assert out["saving_median"] == pytest.approx([0.0, 0.3, 0.2])
    assert out["saving_pairs"] == pytest.approx([0.0, 0.3, 0.2])
    assert out["native_share"] == pytest.approx(1 / 3) and out["steps"] == [4, 4, 4]


@pytest.mark.slow
@pytest.mark.parametrize("module", [sc, mc], ids=["settling_curve", "mix_composition"])
def test_the_tiny_benchmark_runs_end_to_end(tmp_path: Path, module: object) -> None:
    assert module.main(["--tiny", "--out", str(tmp_path), "--repeats", "1"]) == 0  # type: ignore[attr-defined]
    (result,) = list(tmp_path.glob("*.json"))
    data = json.loads(result.read_text())
    assert data["gpu"] == "cpu" and data["benchmark"] in {"settling_curve", "mix_composition"}
    rows = data.get("transitions") or data.get("results")
    assert rows


def test_the_layout_probe_states_each_cells_median_and_saving() -> None:
    order = [0, 1, 2, 0, 1, 2, 0]
    ms = [10.0, 7.0, 10.2, 10.4, 7.2, 9.8, 10.0]
    med, saving = lp.cell_stats(order, ms, 3)
    assert med == [10.0, 7.1, 10.0] and saving == pytest.approx([0.0, 0.29, 0.0])


def test_the_layout_probe_sizes_its_sequences_by_time_except_on_the_cpu() -> None:
    assert lp.sequence_steps(2.5, 10.0, tiny=False) == 250
    assert lp.sequence_steps(2.5, 1000.0, tiny=False) == 16  # never fewer than 16 steps
    assert {lp.sequence_steps(2.5, ms, tiny=True) for ms in (1000.0, 0.1)} == {lp.TINY_STEPS}
    med, saving = lp.cell_stats([0, 1, 0], [10.0, 8.0, 10.0], 3)  # the third cell drew no step
    assert med[:2] == [10.0, 8.0] and math.isnan(med[2]) and math.isnan(saving[2])


def test_the_layout_probe_reads_no_temperature_without_nvml() -> None:
    class Off:
        handle = None

    assert lp.temperatures(Off()) == {"gpu_c": None, "memory_c": None}  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_tiny_layout_probe_builds_the_step_again(tmp_path: Path) -> None:
    assert lp.main(["--tiny", "--out", str(tmp_path), "--pads", "0,0"]) == 0
    data = json.loads((tmp_path / "layout_probe.json").read_text())
    assert data["gpu"] == "cpu" and [b["build"] for b in data["builds"]] == [0, 1]
    for build in data["builds"]:
        (entry,) = build["g"].values()
        assert entry["saving"][0] == 0.0 and all(math.isfinite(x) for x in entry["median_ms"])


def test_a_dwell_whose_last_windows_never_ran_the_native_cell_does_not_settle() -> None:
    """A dwell of a few slow steps (a busy CPU) can leave the native cell out of every window, or
    out of the last third: there is nothing to settle against, and no settle is claimed."""
    compact = {"G4/V8": {"median_ms": 0.75, "saving": None}}
    rows = [{"from_s": 0.0, "to_s": 0.0025, "steps": 2, "cells": compact}]
    assert sc.settle_time(rows, tolerance_pp=0.2, tolerance_rel=0.002) == {
        "settle_s": None,
        "no_native_window": True,
    }
    early = [
        {
            "from_s": 0.0,
            "to_s": 0.01,
            "steps": 2,
            "cells": {"G4/V0": {"median_ms": 1.0, "saving": 0.0}, **compact},
        },
        {"from_s": 0.01, "to_s": 0.03, "steps": 2, "cells": compact},
    ]
    assert sc.settle_time(early, tolerance_pp=0.2, tolerance_rel=0.002)["settle_s"] is None
