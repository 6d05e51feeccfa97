"""``benchmarks/independent_harness.py``: its comparison on known inputs, its serving-like sequence,
and the whole one-call job in its tiny CPU mode."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from benchmarks import independent_harness as ih

from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.calibrate.measurement.protocol import MixTerm

ROOT = Path(__file__).resolve().parents[2]


def _sweep_row(
    g: int, v: int, ms: float, saving: float, half: float, control: float | None
) -> dict[str, Any]:
    return {
        "graph_batch_size": g,
        "verifier_budget": v,
        "step_time_ms": ms,
        "ci_low_ms": ms * 0.99,
        "ci_high_ms": ms * 1.01,
        "saving": saving,
        "saving_ci_low": saving - half,
        "saving_ci_high": saving + half,
        "control_bias": control,
    }


def _case(offset: float, errors: dict[int, float]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Two G of native, one compact (saving 10%) and control; the harness sees every time
    ``offset`` slower, and the compact saving of G by ``errors[G]`` lower."""
    rows, cells = [], []
    for g, t0 in ((8, 2.0), (16, 3.0)):
        control = 0.001 if g == 8 else 0.006
        for v, kind, saving in ((0, "native", 0.0), (2 * g, "compact", 0.10), (6 * g, "control", control)):
            ms = t0 * (1 - saving)
            rows.append(_sweep_row(g, v, ms, saving, 0.0 if v == 0 else 0.004, control))
            seen = (
                saving
                - (errors.get(g, 0.0) if kind == "compact" else 0.0)
                - (control if kind == "control" else 0.0)
            )
            cells.append(
                {
                    "graph_batch_size": g,
                    "verifier_budget": v,
                    "kind": kind,
                    "median_ms": t0 * (1 - seen) * (1 + offset),
                    "saving": seen,
                }
            )
    return rows, {"gpu": "X", "cells": cells}


def test_the_comparison_on_known_differences() -> None:
    rows, harness = _case(0.02, {8: 0.001, 16: 0.012})
    between = {
        "paired_rel": 0.004,
        "paired_rel_upper": 0.006,
        "paired_resolved": True,
        "resolvable_shift_rel": 0.001,
    }
    r = ih.compare(rows, between, harness)
    assert r["cells"] == 6 and r["compact_cells"] == 2
    assert r["saving_ci_coverage"] == 0.5  # G=16's 1.2 pp difference lies outside ±0.4 pp
    assert r["saving_diff_median_pp"] == pytest.approx(0.65) and r["saving_diff_max_pp"] == pytest.approx(1.2)
    assert r["common_offset_rel"] == pytest.approx(0.02, abs=0.005)
    assert r["absolute_coverage"] < 0.5 <= r["absolute_coverage_after_common_offset"]
    assert r["control_bias_max_pp"] == pytest.approx(0.6) and r["paired_rel"] == 0.004
    assert r["meets"] == {
        "saving_ci_coverage": False,
        "saving_diff_median_pp": False,
        "saving_diff_max_pp": False,
        "absolute_coverage_after_common_offset": r["absolute_coverage_after_common_offset"] >= 0.9,
        "control_bias_max_pp": False,
    }
    good = ih.compare(*_good())
    assert all(good["meets"].values()), good["meets"]


def _good() -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    rows, harness = _case(0.01, {8: 0.001, 16: -0.002})
    for r in rows:
        if r["control_bias"] is not None:
            r["control_bias"] = 0.001
    for c in harness["cells"]:
        if c["kind"] == "control":
            c["saving"] = 0.001
    return rows, {"paired_rel": 0.002}, harness


def test_the_offset_compares_queued_steps_with_queued_steps() -> None:
    """A sweep whose samples pay half a 0.26 ms launch: its medians sit 0.13 ms above a harness of
    queued steps, in every cell. Against its queued medians the harness needs no offset, and the
    intervals that hold both protocols hold the harness's medians and savings."""
    rows, harness = _case(0.0, {})
    for r in rows:
        queued = r["step_time_ms"]
        r["pipelined_ms"], r["synchronous_ms"] = queued, queued + 0.26
        r["step_time_ms"] = queued + 0.13
        r["ci_low_ms"], r["ci_high_ms"] = queued * 0.995, (queued + 0.26) * 1.005
    plain = ih.compare([{k: v for k, v in r.items() if k != "pipelined_ms"} for r in rows], {}, harness)
    paired = ih.compare(rows, {}, harness)
    assert (
        paired["common_offset_against"] == "pipelined_ms" and plain["common_offset_against"] == "step_time_ms"
    )
    assert abs(paired["common_offset_rel"]) < 1e-9 < abs(plain["common_offset_rel"])
    assert paired["absolute_coverage_after_common_offset"] == 1.0 and paired["saving_ci_coverage"] == 1.0


def test_the_budget_and_sequence_can_be_shortened() -> None:
    mode = ih.with_budget(ih.FULL, 150.0, 300)
    cmd = ih.sweep_command(mode, Path("/x"))
    assert cmd[cmd.index("--adaptive-budget") + 1] == "150" and mode.steps_per_block == 300
    assert ih.with_budget(ih.FULL, None, None) == ih.FULL
    # A budget beyond the mode's raises the sweep's hard limit with it; a smaller one keeps it.
    assert mode.sweep_timeout_s == ih.FULL.sweep_timeout_s
    assert ih.with_budget(ih.FULL, 400.0, None).sweep_timeout_s == pytest.approx(1.25 * 400 + 60)
    for bad in ((0.0, None), (None, ih.FULL.discard)):
        with pytest.raises(SystemExit):
            ih.with_budget(ih.FULL, *bad)


def test_an_interleaved_sweep_can_be_asked_for() -> None:
    mode = ih.with_budget(ih.FULL, None, None, interleave=True)
    assert ih.sweep_command(mode, Path("/x"))[-1] == "--interleave"
    assert ih.with_budget(mode, None, None, interleave=True) == mode  # not added twice


def test_the_sweeps_passes_and_recapture_period_can_be_replaced() -> None:
    mode = ih.with_budget(
        ih.FULL, None, None, passes=1, recapture_every=2, samples_per_visit=6, max_samples=300, seed=5
    )
    cmd = ih.sweep_command(mode, Path("/x"))
    assert cmd[cmd.index("--seed") + 1] == "5" and cmd.count("--seed") == 1
    assert cmd[cmd.index("--passes") + 1] == "1" and cmd[cmd.index("--recapture-every") + 1] == "2"
    assert cmd[cmd.index("--samples-per-visit") + 1] == "6" and cmd.count("--samples-per-visit") == 1
    assert cmd[cmd.index("--max-samples") + 1] == "300" and cmd.count("--max-samples") == 1
    assert cmd.count("--passes") == 1 and cmd.count("--recapture-every") == 1
    for bad in ({"passes": 0}, {"recapture_every": -1}, {"samples_per_visit": 0}, {"max_samples": 0}):
        with pytest.raises(SystemExit):
            ih.with_budget(ih.FULL, None, None, **bad)


def test_an_unknown_process_state_is_refused() -> None:
    with pytest.raises(SystemExit, match="process-state"):
        ih.run_harness(ih.TINY, process_state="warm")


def test_two_harness_runs_state_how_far_they_are_apart() -> None:
    _, first = _case(0.0, {})
    _, second = _case(0.01, {8: 0.004, 16: -0.012})
    agreement = ih.harness_agreement(first, second)
    assert agreement["cells"] == 6
    assert agreement["saving_diff_pp"] == pytest.approx({"G8/V16": 0.4, "G16/V32": 1.2})
    assert (agreement["saving_diff_median_pp"], agreement["saving_diff_max_pp"]) == pytest.approx((0.8, 1.2))
    assert agreement["common_offset_rel"] == pytest.approx(math.log(1.01), abs=2e-3)
    assert ih.harness_agreement(first, first)["saving_diff_max_pp"] == 0.0


def test_two_harness_runs_state_one_runs_level_sd() -> None:
    """Cells whose levels move by known amounts beyond a common offset: the per-run SD is the
    SD of those moves over √2 (two runs, each carrying its own)."""
    _, first = _case(0.0, {})
    moves = [0.01, -0.01, 0.0, 0.02, -0.02, 0.0]
    second = {
        **first,
        "cells": [
            {**c, "median_ms": c["median_ms"] * math.exp(m)}
            for c, m in zip(first["cells"], moves, strict=True)
        ],
    }
    agreement = ih.harness_agreement(first, second)
    assert agreement["level_sd_rel"] == pytest.approx(np.std(moves, ddof=1) / math.sqrt(2), rel=1e-9)
    assert ih.harness_agreement(first, first)["level_sd_rel"] == 0.0


@pytest.mark.parametrize(
    ("prior", "covered"),
    [(None, None), (0.0, 4 / 6), (0.006, 1.0)],
    ids=["no-prior", "zero-prior-is-the-plain-coverage", "prior-carries-the-moves"],
)
def test_a_level_prior_widens_the_absolute_coverage(prior: float | None, covered: float | None) -> None:
    """The sweep's absolute intervals are ±1%; the harness sees G=8 1.5% slower than the common
    offset: without a level prior those two cells fall out (4 of 6), with one run's level SD of
    0.6% (1.96·√2·0.6% = 1.66%, with the ±1% in quadrature 1.94%) all six are inside."""
    rows, harness = _case(0.01, {})
    harness = {
        **harness,
        "cells": [
            {
                **c,
                "median_ms": c["median_ms"]
                * (1.015 if c["graph_batch_size"] == 8 and c["kind"] != "control" else 1.0),
            }
            for c in harness["cells"]
        ],
    }
    result = ih.compare(rows, {}, harness, level_prior_rel=prior)
    assert result["level_prior_rel"] == prior
    assert result["absolute_coverage_with_level_prior"] == (
        None if covered is None else pytest.approx(covered)
    )


def test_two_harness_runs_pool_into_one_reference() -> None:
    _, first = _case(0.0, {})
    _, second = _case(0.02, {8: 0.004})
    pooled = ih.pooled_harness(first, second)
    assert pooled["pooled_runs"] == 2 and len(pooled["cells"]) == 6
    one = {(c["graph_batch_size"], c["verifier_budget"]): c for c in first["cells"]}
    two = {(c["graph_batch_size"], c["verifier_budget"]): c for c in second["cells"]}
    for c in pooled["cells"]:
        key = (c["graph_batch_size"], c["verifier_budget"])
        assert c["median_ms"] == pytest.approx((one[key]["median_ms"] + two[key]["median_ms"]) / 2)
        assert c["saving"] == pytest.approx((one[key]["saving"] + two[key]["saving"]) / 2)


def test_the_sequence_alternates_like_a_policy() -> None:
    cells = [CellSpec(8, 0, 5), CellSpec(8, 16, 5), CellSpec(8, 32, 5), CellSpec(8, 48, 5)]
    seq = ih.alternating_sequence(np.random.default_rng(1), cells, 4000)
    share = np.bincount(seq, minlength=4) / len(seq)
    assert share[0] == pytest.approx(0.4, abs=0.05) and all(
        s == pytest.approx(0.2, abs=0.05) for s in share[1:]
    )
    switches = np.mean([a != b for a, b in itertools.pairwise(seq)])
    assert 0.25 < switches < 0.45  # runs of one cell, broken as often as a policy switches


def test_the_merged_result_keeps_every_other_key(tmp_path: Path) -> None:
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"heavy_step": {"cells": 48}, "independent": {"old": True}}))
    out = ih.write_independent(
        {"gpu": "H200", "cells": 24}, tmp_path / "o" / "sweep_efficiency.json", base=base
    )
    record = json.loads(out.read_text())
    assert record["heavy_step"] == {"cells": 48} and record["independent"] == {"gpu": "H200", "cells": 24}


def test_the_full_mode_is_the_heavy_step_with_24_cells() -> None:
    cells = ih.FULL.cells()
    assert len(cells) == 24 and {c.kind.value for c in cells} == {"native", "compact", "control"}
    cmd = ih.sweep_command(ih.FULL, Path("/x"))
    for flag in ("--passes", "--samples-per-visit", "--budgets"):
        assert flag in cmd
    assert cmd[cmd.index("--config") + 1] == "llama-70b" and cmd[cmd.index("--layers") + 1] == "4"


def test_each_mix_designs_savings_are_compared_with_the_harness() -> None:
    cells = [
        {"cell": "G8/V0", "kind": "native", "independent_saving": 0.0},
        {"cell": "G8/V16", "kind": "compact", "independent_saving": 0.100},
        {"cell": "G8/V24", "kind": "compact", "independent_saving": 0.200},
        {"cell": "G8/V32", "kind": "control", "independent_saving": 0.0},
    ]
    designs = {
        "G8/V0": MixTerm(10.0, 10.0),
        "G8/V16": MixTerm(9.0, 9.0, saving_switching=0.090, saving_runs=0.101),
        "G8/V24": MixTerm(8.0, 8.0, saving_switching=0.180, saving_runs=None),
        "G8/V32": MixTerm(10.0, 10.0, saving_switching=0.01, saving_runs=0.0),
    }
    got = ih.by_mix_design(cells, designs)
    assert got is not None
    assert got["switching"]["cells"] == 2 and got["runs"]["cells"] == 1
    assert got["switching"]["diff_median_pp"] == pytest.approx(1.5)  # 1.0 and 2.0 pp apart
    assert got["switching"]["diff_max_pp"] == pytest.approx(2.0)
    assert got["runs"]["diff_max_pp"] == pytest.approx(0.1)
    assert cells[1]["sweep_saving_runs"] == 0.101 and "sweep_saving_switching" not in cells[3]
    assert ih.by_mix_design(cells, {}) is None  # a sweep of one cell per visit


def _tiny_job(tmp_path: Path, *options: str) -> tuple[Path, Path]:
    """Run the one-call job in its tiny CPU mode as a lent machine would (a subprocess from the
    repository root) with ``options``; fail with its output unless it exits 0. Returns (out, work)."""
    out, work = tmp_path / "out", tmp_path / "work"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "independent_harness.py"), "job", "--tiny",
         "--out", str(out), "--work", str(work), *options],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    return out, work


@pytest.mark.slow
def test_the_tiny_job_runs_end_to_end(tmp_path: Path) -> None:
    """The one-call GPU job on the CPU: sweep (two passes), harness, comparison, and only the four
    files that come back from a lent machine under ``--out``."""
    out, work = _tiny_job(tmp_path)
    assert {p.name for p in out.iterdir()} == {
        "sweep_efficiency.json",
        "independent.json",
        "job_log.txt",
        "independent_work.tgz",
    }
    assert (work / "sweep" / "adaptive.parquet").exists()
    record = json.loads((out / "sweep_efficiency.json").read_text())
    assert "heavy_step" in record  # the repository's keys are kept
    result = record["independent"]
    for key in ("gpu", "cells", *ih.TARGETS, "paired_rel", "meets", "per_cell", "commit", "command"):
        assert key in result, key
    assert result["gpu"] == "cpu" and result["cells"] == 8 and result["compact_cells"] == 4
    assert all(math.isfinite(c["independent_ms"]) for c in result["per_cell"])
    assert result["between_run"]["estimator"] == "reml"
    # The harness's first build comes after a matmul, as the sweep's does.
    assert result["harness"]["process_state"] == "sweep"
    assert {g["native"] for g in result["between_run"]["paired_groups"]} <= {"G2/V0", "G4/V0"}
    # Summarised again from its journal with the same statistics, the sweep compares the same.
    again = ih.compare_files(work / "sweep", out / "independent.json", recompute=True)
    assert again["recomputed"] and not result["recomputed"]
    for key in (*ih.TARGETS, "per_cell"):
        assert again[key] == result[key], key


def test_the_split_by_the_step_before_on_a_known_sequence() -> None:
    """Steps that follow another cell run 10% slower (native 10 ms, compact 8 ms): the split states
    each regime's saving exactly, the share of switched steps, and the overall saving between."""
    cells = [CellSpec(8, 0, 5), CellSpec(8, 16, 5)]
    seq = [0, 0, 1, 1, 1, 0, 1, 0, 0, 1, 1, 0]
    base = {0: 10.0, 1: 8.0}
    ms = [base[c] * (1.1 if i and c != seq[i - 1] else 1.0) for i, c in enumerate(seq)]
    block = ih._Block(8, seq, 0.5, ms)
    out = ih.summarize_harness({8: cells}, [block], discard=1, gpu="cpu", seconds=1.0)
    compact = out["cells"][1]
    assert compact["saving_after_switch"] == pytest.approx(0.2) and compact[
        "saving_after_stay"
    ] == pytest.approx(0.2)
    # compact steps after index 0: 1,1,1,1,1,1 at 2,3,4,6,9,10 -> switched at 2, 6, 9
    assert compact["switch_share"] == pytest.approx(3 / 6)
    assert out["switch_share"] == pytest.approx((3 / 5 + 3 / 6) / 2)  # native: switched at 5, 7, 11


@pytest.mark.parametrize("stays", [(), (0.5, 0.5), (1.0,), (-0.1,)])
def test_bad_stays_are_refused(stays: tuple[float, ...]) -> None:
    with pytest.raises(SystemExit):
        if len(stays) == 1:
            ih.alternating_sequence(
                np.random.default_rng(0), [CellSpec(8, 0, 5), CellSpec(8, 16, 5)], 10, stays[0]
            )
        else:
            ih.run_harness(ih.TINY, stays=stays)


def test_a_higher_stay_switches_less() -> None:
    cells = [CellSpec(8, 0, 5), CellSpec(8, 16, 5), CellSpec(8, 32, 5), CellSpec(8, 48, 5)]
    rates = []
    for stay in (0.0, 0.5, 0.85):
        seq = ih.alternating_sequence(np.random.default_rng(2), cells, 4000, stay)
        rates.append(np.mean([a != b for a, b in itertools.pairwise(seq)]))
    assert rates[0] > 0.6 > rates[1] > 0.25 > rates[2] > 0.05, rates


def test_the_sweep_can_be_asked_for_a_dwell() -> None:
    mode = ih.with_budget(ih.FULL, None, None, interleave=True, dwell=2.6)
    assert mode.sweep[mode.sweep.index("--dwell") + 1] == "2.6"
    with pytest.raises(SystemExit, match="--sweep-interleave"):
        ih.with_budget(ih.FULL, None, None, dwell=2.6)


def test_the_sweep_can_be_asked_to_resolve_each_g() -> None:
    mode = ih.with_budget(ih.FULL, None, None, interleave=True, resolve=0.004)
    assert mode.sweep[mode.sweep.index("--resolve") + 1] == "0.004"
    with pytest.raises(SystemExit, match="--sweep-interleave"):
        ih.with_budget(ih.FULL, None, None, resolve=0.004)


@pytest.mark.parametrize("precision", [0.0, -0.01, 1.0])
def test_a_sweep_precision_outside_the_unit_interval_is_refused(precision: float) -> None:
    with pytest.raises(SystemExit, match="--sweep-precision"):
        ih.with_budget(ih.FULL, None, None, precision=precision)


def test_every_sweep_option_the_job_passes_is_one_the_sweep_script_takes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job's sweep command parses in ``sweep_efficiency.py run`` with each option it sets
    (an option one script passes and the other lacks fails on the GPU, after the machine starts)."""
    from benchmarks import sweep_efficiency as se

    seen: dict[str, Any] = {}
    monkeypatch.setattr(se, "cmd_run", lambda args: seen.update(vars(args)) or 0)
    mode = ih.with_budget(
        ih.FULL, 240, None, interleave=True, settle_s=0.75, passes=1, recapture_every=6,
        samples_per_visit=6, max_samples=320, seed=18, dwell=2.7, precision=0.003, resolve=0.004,
    )  # fmt: skip
    assert se.main(ih.sweep_command(mode, Path("/x"))[2:]) == 0
    assert (seen["dwell"], seen["settle_s"], seen["interleave"]) == ("2.7", 0.75, True)
    assert seen["resolve"] == 0.004
    assert seen["precision"] == 0.003
    assert (seen["samples_per_visit"], seen["max_samples"], seen["seed"]) == (6, 320, 18)


@pytest.mark.parametrize("stays", ["1.0", "0.5,0.5", "-0.1", "x", "0.5,,0"])
def test_bad_harness_stays_are_refused_before_the_sweep(
    stays: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused while the arguments are parsed, so a job never runs its sweep first."""
    with pytest.raises(SystemExit) as exit_:
        ih.main(["job", "--tiny", "--out", "/nonexistent/never-written", "--harness-stays", stays])
    assert exit_.value.code == 2 and "--harness-stays" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("recapture", [False, True])
def test_a_recapturing_harness_captures_each_g_again_before_each_block(
    recapture: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the real reference backend (CPU): capturing once builds each of the 8 tiny cells once;
    re-capturing builds a G's cells again before each of its blocks (two per G), each after its
    release, and the result says which it did."""
    from dspark_calibrate.calibrate.measurement.backends.reference import ReferenceBackend

    built: list[CellSpec] = []
    released: list[CellSpec] = []
    prepare, release = ReferenceBackend.prepare, ReferenceBackend.release

    def counting_prepare(self: ReferenceBackend, cell: CellSpec) -> Any:
        built.append(cell)
        return prepare(self, cell)

    def counting_release(self: ReferenceBackend, cell: CellSpec) -> None:
        released.append(cell)
        release(self, cell)

    monkeypatch.setattr(ReferenceBackend, "prepare", counting_prepare)
    monkeypatch.setattr(ReferenceBackend, "release", counting_release)
    mode = ih.TINY
    result = ih.run_harness(mode, recapture=recapture)
    cells = mode.cells()
    per_cell = {c: built.count(c) for c in cells}
    assert per_cell == {c: 1 + (mode.blocks if recapture else 0) for c in cells}
    assert sorted(released) == (sorted(cells * mode.blocks) if recapture else [])
    assert result["recapture"] is recapture
    assert all(len(c["saving_per_block"]) == mode.blocks for c in result["cells"])


def test_an_unknown_recapture_is_refused_before_the_sweep(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="harness-recapture"):
        ih.run_job(ih.TINY, tmp_path, sys.stderr, tmp_path / "work", recapture="sometimes")
    assert not (tmp_path / "work").exists()


def test_recapture_both_is_a_job_option_only(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="needs the job"):
        ih.main(["harness", "--tiny", "--out", str(tmp_path), "--harness-recapture", "both"])


@pytest.mark.slow
def test_the_tiny_job_compares_with_both_harnesses(tmp_path: Path) -> None:
    """``--harness-recapture both``: the capture-once harness comes back beside the re-capturing one,
    the comparison is against the re-capturing one and also states the other's, and how far the
    two harnesses are apart."""
    out, work = _tiny_job(tmp_path, "--harness-recapture", "both", "--harness-blocks", "3")
    assert (out / "independent_capture_once.json").exists()
    once = json.loads((out / "independent_capture_once.json").read_text())
    block = json.loads((out / "independent.json").read_text())
    assert once["recapture"] is False and block["recapture"] is True
    assert all(len(c["saving_per_block"]) == 3 for c in block["cells"])
    result = json.loads((out / "sweep_efficiency.json").read_text())["independent"]
    assert result["harness_layouts"] == ih.harness_agreement(once, block)
    against = result["against_capture_once"]
    assert set(against["meets"]) == set(ih.TARGETS)
    assert against == {
        k: v
        for k, v in ih.compare_files(work / "sweep", out / "independent_capture_once.json").items()
        if k in against
    }


def test_the_first_capture_order_is_the_ladders_or_a_seeded_permutation() -> None:
    cells = ih.FULL.cells()
    assert ih.first_capture_order(cells, None) == cells
    one, again, other = (ih.first_capture_order(cells, s) for s in (1, 1, 2))
    assert sorted(one) == sorted(cells) and one == again
    assert one != cells and one != other


def test_several_harness_runs_pool_into_one_reference() -> None:
    """Three runs: each cell's median and saving are the runs' means, every run's saving and
    per-block savings are kept, and a cell one run lacks is left out."""
    runs = []
    for offset, error in ((0.0, 0.0), (0.01, 0.002), (0.02, 0.007)):
        _, harness = _case(offset, {8: error})
        for c in harness["cells"]:
            c["saving_per_block"] = [c["saving"], c["saving"]]
        runs.append(harness)
    runs[2]["cells"] = [c for c in runs[2]["cells"] if c["verifier_budget"] != 96]  # G16's control
    pooled = ih.pooled_harness(*runs)
    assert pooled["pooled_runs"] == 3 and len(pooled["cells"]) == 5
    compact = next(c for c in pooled["cells"] if (c["graph_batch_size"], c["verifier_budget"]) == (8, 16))
    assert compact["saving_per_run"] == pytest.approx([0.10, 0.098, 0.093])
    assert compact["saving"] == pytest.approx(np.mean([0.10, 0.098, 0.093]))
    medians = [next(c["median_ms"] for c in r["cells"] if c["verifier_budget"] == 16) for r in runs]
    assert compact["median_ms"] == pytest.approx(np.mean(medians))
    assert len(compact["saving_per_block"]) == 6


def test_the_process_spread_is_the_sd_of_each_compact_saving_over_processes() -> None:
    runs = [_case(0.0, {8: e, 16: 0.0})[1] for e in (0.0, 0.004, 0.008)]
    spread = ih.process_spread(runs)
    assert spread["processes"] == 3
    assert spread["saving_sd_pp"]["G8/V16"] == pytest.approx(0.4)
    assert spread["saving_sd_pp"]["G16/V32"] == pytest.approx(0.0)
    assert spread["saving_sd_max_pp"] == pytest.approx(0.4)
    assert spread["saving_sd_median_pp"] == pytest.approx(0.2)


@pytest.mark.parametrize(("processes", "recapture"), [(0, "never"), (-1, "never"), (2, "both")])
def test_bad_harness_processes_are_refused_before_the_sweep(
    tmp_path: Path, processes: int, recapture: str
) -> None:
    with pytest.raises(SystemExit, match="harness-processes"):
        ih.run_job(ih.TINY, tmp_path, sys.stderr, tmp_path / "work", recapture=recapture, processes=processes)
    assert not (tmp_path / "work").exists()


def test_a_repeat_beside_harness_processes_is_refused_before_the_sweep(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="harness-processes alone"):
        ih.run_job(ih.TINY, tmp_path, sys.stderr, tmp_path / "work", repeat=True, processes=2)
    assert not (tmp_path / "work").exists()


@pytest.mark.slow
def test_the_tiny_job_pools_harnesses_run_in_separate_processes(tmp_path: Path) -> None:
    """``--harness-processes 2``: two runs come back, each from its own process (another pid) with its
    own capture seed, ``independent.json`` is their pool and the comparison is against it."""
    out, work = _tiny_job(tmp_path, "--harness-processes", "2", "--harness-blocks", "2")
    assert {p.name for p in out.iterdir()} == {
        "sweep_efficiency.json", "independent.json", "independent_processes.json", "job_log.txt", "independent_work.tgz"
    }  # fmt: skip
    runs = json.loads((out / "independent_processes.json").read_text())["runs"]
    assert [r["capture_seed"] for r in runs] == [0, 1]
    assert len({r["pid"] for r in runs} | {os.getpid()}) == 3
    pooled = json.loads((out / "independent.json").read_text())
    assert pooled == json.loads(json.dumps(ih.pooled_harness(*runs)))
    result = json.loads((out / "sweep_efficiency.json").read_text())["independent"]
    assert result["harness_processes"] == json.loads(json.dumps(ih.process_spread(runs)))
    assert (
        result["saving_diff_max_pp"]
        == ih.compare_files(work / "sweep", out / "independent.json")["saving_diff_max_pp"]
    )


@pytest.mark.slow
def test_the_harness_alone_runs_in_this_process_in_the_ladders_order(tmp_path: Path) -> None:
    """``harness`` without ``--harness-processes`` times the step as it always did: here, capturing
    in the ladder's order."""
    assert ih.main(["harness", "--tiny", "--out", str(tmp_path), "--harness-blocks", "1"]) == 0
    result = json.loads((tmp_path / "independent.json").read_text())
    assert result["capture_seed"] is None and result["pid"] == os.getpid() and not result["recapture"]
