"""``sweep --interleave --dwell L``: every visit laid out in runs of the policy's mean length (one
for every G or one per G), instead of the two mix designs by round."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticBackend
from dspark_calibrate.calibrate.measurement.dwell import (
    MAX_DWELL,
    Dwell,
    describe_dwell,
    dwell_from_json,
    dwell_option,
    dwell_to_json,
    parse_dwell,
    stay_for_dwell,
)
from dspark_calibrate.calibrate.measurement.journal import read_journal
from dspark_calibrate.calibrate.measurement.ladder import CellKind
from dspark_calibrate.calibrate.measurement.order import interleaved_steps
from dspark_calibrate.calibrate.measurement.protocol import MIX_STAYS
from dspark_calibrate.calibrate.measurement.stats import Thresholds
from dspark_calibrate.calibrate.measurement.sweep import SweepConfig, SweepResult, resummarize, run_sweep
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.errors import ConfigError
from tests.calibrate.conftest import make_config

DESIGN = {"recapture_every": 4, "epochs_required": 4, "samples_per_visit": 6}
#: A power-capped synthetic GPU whose clock follows the running cell over about three steps: a
#: light cell run for a while reaches a clock 6%·(1 − its share of the full width) above the
#: native cell's, one switched every step the mix's.
QUICK_CLOCK: dict[str, Any] = {
    "per_tile_ms": 1.0,
    "tile": 4,
    "noise_rel": 0.002,
    "outlier_prob": 0.0,
    "power_capped": True,
    "power_cap_clock_rel": 0.06,
    "clock_tau_steps": 3.0,
}


def _config(seed: int = 0, dwell: Dwell | None = None, interleave: bool = True) -> SweepConfig:
    backend = SyntheticBackend(seed=seed, **QUICK_CLOCK)
    config, _ = make_config(
        backend, thresholds=Thresholds.quick(**DESIGN), ladder=(4, 8), seed=seed, interleave=interleave
    )
    return replace(config, dwell=dwell)


def test_the_dwell_is_in_the_digest_and_every_round_runs_it() -> None:
    both = _config()
    assert "dwell" not in both.to_dict()
    assert [both.visit_stay(r, 4) for r in range(4)] == [MIX_STAYS[r % 2] for r in range(4)]
    runs = replace(both, dwell=4.0)
    assert runs.to_dict()["dwell"] == 4.0 and runs.digest() != both.digest()
    assert {runs.visit_stay(r, g) for r in range(4) for g in (4, 8)} == {0.75}
    assert replace(both, dwell=1.0).visit_stay(3, 8) == 0.0  # switches every step


def test_a_dwell_per_g_is_in_the_digest_and_each_g_runs_its_own() -> None:
    per_g = _config(dwell={4: 1.0, 8: 4.0})
    assert per_g.to_dict()["dwell"] == {"4": 1.0, "8": 4.0}
    assert per_g.digest() not in {_config(dwell=4.0).digest(), _config(dwell=1.0).digest()}
    assert [per_g.visit_stay(r, 4) for r in range(3)] == [0.0] * 3
    assert [per_g.visit_stay(r, 8) for r in range(3)] == [0.75] * 3


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("2.7", 2.7),
        ("1", 1.0),
        ("4=1.4,8=3.1", {4: 1.4, 8: 3.1}),
        (" 8 = 3.1 , 4=1.4 ", {4: 1.4, 8: 3.1}),
        ("2.7,8=3.1", {4: 2.7, 8: 3.1}),
        ("8=3.1,2.7", {4: 2.7, 8: 3.1}),
        ("4=2.5,8=2.5", 2.5),  # every G the same: the one-value design and its digest
        ("2.5,8=2.5", 2.5),
    ],
    ids=["one", "switching", "per-g", "spaces-any-order", "default-first", "default-last", "equal", "equal-default"],
)
def test_the_dwell_forms_parse(text: str, want: Dwell) -> None:
    assert parse_dwell(text, (4, 8)) == want


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "empty item"),
        ("2.7,", "empty item"),
        ("x", "not a number of steps"),
        ("0.5", "1..64"),
        ("nan", "1..64"),
        ("65", "1..64"),
        ("4=0.9,8=2", "G=4.*1..64"),
        ("16=2,2.7", "G=16 is not in the ladder"),
        ("a=2,2.7", "'a' is not a G"),
        ("4=2,4=3,8=2", "names G=4 twice"),
        ("2,3", "two bare values"),
        ("8=3", r"no dwell for G=\[4\]"),
    ],
    ids=[
        "empty", "trailing-comma", "not-a-number", "below-one", "nan", "above-the-cap",
        "per-g-below-one", "g-outside-the-ladder", "g-not-a-number", "g-twice", "two-bare", "g-missing",
    ],
)  # fmt: skip
def test_a_bad_dwell_text_is_refused(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_dwell(text, (4, 8))


def test_the_dwell_forms_round_trip_and_read() -> None:
    for dwell in (2.7, {4: 1.4, 8: 3.1}):
        assert dwell_from_json(json.loads(json.dumps(dwell_to_json(dwell)))) == dwell
    assert dwell_from_json(None) is None
    assert describe_dwell(2.7) == "2.7 steps"
    assert describe_dwell({"8": 3.1, "4": 1.4}) == "G4 1.4, G8 3.1 steps"
    assert dwell_option(2.74) == "2.7"
    assert dwell_option(2.74, {256: 3.12, 8: 1.9}) == "2.7,8=1.9,256=3.1"
    assert parse_dwell(dwell_option(2.7, {8: 3.1}), (4, 8)) == {4: 2.7, 8: 3.1}


@pytest.mark.parametrize(
    ("dwell", "interleave", "match"),
    [
        (2.0, False, "add --interleave"),
        (0.5, True, "1..64"),
        (0.0, True, "1..64"),
        (math.nan, True, "1..64"),
        (math.inf, True, "1..64"),
        (MAX_DWELL + 1.0, True, "1..64"),
        ({4: 2.0, 8: 0.5}, True, "at G=8 is not a mean run of 1..64"),
        ({4: 2.0}, True, "the ladder has"),
        ({4: 2.0, 8: 2.0, 16: 2.0}, True, "the ladder has"),
        ({4: 2.0, 8: 3.0}, False, "add --interleave"),
    ],
    ids=[
        "without-interleave", "below-one", "zero", "nan", "inf", "above-the-cap",
        "per-g-below-one", "per-g-missing-a-g", "per-g-extra-g", "per-g-without-interleave",
    ],
)  # fmt: skip
def test_a_bad_dwell_is_refused(dwell: Dwell, interleave: bool, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        _config(dwell=dwell, interleave=interleave)


@pytest.mark.parametrize(("dwell", "per_cell"), [(1.0, 12), (1.5, 12), (2.6, 12), (2.6, 24), (4.0, 24)])
def test_a_visit_runs_about_the_dwell_asked(dwell: float, per_cell: int) -> None:
    """The balanced layout at ``stay_for_dwell``: runs as long as asked where a visit's first half
    holds twice the dwell per cell, a little shorter (cut at the steps a cell has left) where it
    holds less; never longer."""
    rng = np.random.default_rng(1)
    steps = runs = 0
    for _ in range(300):
        order = interleaved_steps([per_cell] * 4, rng, stay=stay_for_dwell(dwell), balanced=True)
        steps += len(order)
        runs += 1 + sum(a != b for a, b in itertools.pairwise(order))
    realised = steps / runs
    floor = 0.95 if per_cell // 2 >= 4 * dwell else 0.85
    assert floor * dwell <= realised <= 1.1 * dwell, realised


def _mean_compact_saving(result: SweepResult) -> float:
    return float(
        np.mean([c.summary.saving for c in result.cells if c.spec.kind is CellKind.COMPACT and c.summary])
    )


@pytest.mark.slow  # 2 s: six small sweeps
def test_longer_runs_let_light_cells_reach_their_own_clock() -> None:
    """On a GPU whose clock follows the running cell, compact savings measured in runs of six steps
    exceed those of a policy switching every step, on each of two seeds, and the two-design sweep
    holds a saving between them; no mix term is stated for one design."""
    for seed in (3, 4):
        measured = {}
        for dwell in (1.0, 6.0, None):
            backend = SyntheticBackend(seed=seed, **QUICK_CLOCK)
            measured[dwell] = run_sweep(_config(seed, dwell=dwell), backend, journal_path=None)
        saving = {d: _mean_compact_saving(r) for d, r in measured.items()}
        assert saving[6.0] > saving[1.0] + 0.003, saving  # 0.5-0.9 pp apart on these seeds
        assert saving[1.0] < saving[None] < saving[6.0], saving
        assert all(c.mix is None for c in measured[6.0].cells)
        assert measured[6.0].mix_summary() == {
            "measured": False,
            "dwell": 6.0,
            "stays": [stay_for_dwell(6.0)],
        }


def _compact_saving_at(result: SweepResult, g: int) -> float:
    return float(
        np.mean(
            [
                c.summary.saving
                for c in result.cells
                if c.spec.kind is CellKind.COMPACT and c.summary and c.spec.key[0] == g
            ]
        )
    )


@pytest.mark.slow  # 3 s: six small sweeps
def test_each_g_is_timed_at_its_own_dwell(tmp_path: Path) -> None:
    """A sweep at one dwell per G times each G's cells as a sweep at that G's dwell does: its G=4
    savings sit nearer those of a sweep switching every step, its G=8 savings nearer those of one in
    runs of six, on each of two seeds; its journal gives the per-G dwell back."""
    for seed in (3, 4):
        measured = {}
        for name, dwell in (("one", 1.0), ("six", 6.0), ("per_g", {4: 1.0, 8: 6.0})):
            backend = SyntheticBackend(seed=seed, **QUICK_CLOCK)
            journal = tmp_path / f"{seed}-{name}.jsonl"
            measured[name] = run_sweep(_config(seed, dwell=dwell), backend, journal_path=journal)
        at = {(n, g): _compact_saving_at(r, g) for n, r in measured.items() for g in (4, 8)}
        for g, near, far in ((4, "one", "six"), (8, "six", "one")):
            assert abs(at["per_g", g] - at[near, g]) < abs(at["per_g", g] - at[far, g]), (g, at)
        assert measured["per_g"].mix_summary()["dwell"] == {"4": 1.0, "8": 6.0}
        again = resummarize(tmp_path / f"{seed}-per_g.jsonl", passes=False)
        assert again.config.dwell == {4: 1.0, 8: 6.0}


@pytest.mark.slow  # 1 s: one small sweep
def test_the_cli_measures_at_the_dwell_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "d.parquet"
    args = ["sweep", "--k", "3", "--ladder", "2,4", "--interleave", "--dwell", "2.5", "--no-plot"]
    args += ["--backend-opt", "power_capped=true", "--max-samples", "24", "--precision", "0.05"]
    res = CliRunner().invoke(build_calibrate_app(), [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "in runs of 2.5 steps on average (--dwell)" in " ".join(res.output.split())
    head = read_journal(out.with_name(out.stem + ".journal.jsonl")).header
    assert head["config"]["dwell"] == 2.5
    res = CliRunner().invoke(build_calibrate_app(), [*args, "--json", "--out", str(tmp_path / "e.parquet")])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report.get("checks", report)["mix_term"]["dwell"] == 2.5


@pytest.mark.slow  # 1 s: one small sweep
def test_the_cli_measures_at_a_dwell_per_g_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "d.parquet"
    args = ["sweep", "--k", "3", "--ladder", "2,4", "--interleave", "--dwell", "1.5,4=3", "--no-plot"]
    args += ["--backend-opt", "power_capped=true", "--max-samples", "24", "--precision", "0.05", "--json"]
    res = CliRunner().invoke(build_calibrate_app(), [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    head = read_journal(out.with_name(out.stem + ".journal.jsonl")).header
    assert head["config"]["dwell"] == {"2": 1.5, "4": 3.0}
    report = json.loads(res.stdout)
    assert report.get("checks", report)["mix_term"]["dwell"] == {"2": 1.5, "4": 3.0}
    res = CliRunner().invoke(build_calibrate_app(), [*args[:-1], "--out", str(tmp_path / "e.parquet")])
    assert "in runs of G2 1.5, G4 3 steps on average (--dwell)" in " ".join(res.output.split())


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--dwell", "2"], "add --interleave"),
        (["--interleave", "--dwell", "0.5"], "1..64 steps"),
        (["--mixed", "--dwell", "2"], "--dwell and --resolve order decode cells"),
        (["--interleave", "--dwell", "2=3"], "no dwell for G=[4]"),
        (["--interleave", "--dwell", "2,8=3"], "G=8 is not in the ladder"),
        (["--dwell", "2,4=3"], "add --interleave"),
    ],
    ids=["without-interleave", "below-one", "mixed", "per-g-missing", "per-g-outside", "per-g-without-interleave"],
)
def test_the_cli_refuses_a_bad_dwell_before_measuring(tmp_path: Path, extra: list[str], match: str) -> None:
    out = tmp_path / "r.parquet"
    res = CliRunner().invoke(
        build_calibrate_app(),
        ["sweep", "--k", "3", "--ladder", "2,4", "--out", str(out), "--no-plot", *extra],
    )
    assert res.exit_code == 2, res.output
    assert match in " ".join(res.output.split()) and not out.exists()
