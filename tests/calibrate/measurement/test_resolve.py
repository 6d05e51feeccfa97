"""``--resolve``: a G measures on (every cell timed, design 5) until its own cells resolve a paired
between-run shift of the asked size; refused where the design cannot act on it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticBackend
from dspark_calibrate.calibrate.measurement.journal import read_journal
from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec
from dspark_calibrate.calibrate.measurement.stats import (
    RESOLVE_TARGET_REL,
    CellSamples,
    Thresholds,
    estimate_between_run,
    group_paired,
)
from dspark_calibrate.calibrate.measurement.sweep import (
    SweepRequest,
    SweepResult,
    check_resolve,
    execute,
    resummarize,
    run_sweep,
)
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.errors import ConfigError
from tests.calibrate.conftest import make_config

#: Sample noise at which a G's cells reach a 1% precision before its epochs resolve 0.4% (G=4 on
#: seed 2 resolves about 0.54%, G=2 0.33%).
NOISY = {"per_tile_ms": 1.0, "tile": 4, "noise_rel": 0.005, "outlier_prob": 0.0}
DESIGN = Thresholds.quick(
    recapture_every=2, epochs_required=2, samples_per_visit=3, precision_rel=0.01, max_samples_per_cell=600
)


def _sweep(resolve: float | None, journal: Path | None = None) -> SweepResult:
    backend = SyntheticBackend(seed=2, **NOISY)
    config, _ = make_config(backend, thresholds=DESIGN, ladder=(2, 4), seed=2, interleave=True)
    return run_sweep(replace(config, resolve_rel=resolve), backend, journal_path=journal)


def _resolvable(result: SweepResult) -> dict[str, float]:
    return {g.native: g.resolvable for g in result.between.paired_groups if g.resolvable is not None}


def _native_samples(result: SweepResult, g: int) -> int:
    return next(c.samples_taken for c in result.cells if c.spec.key == (g, 0))


@pytest.mark.slow  # 2.5 s: two small sweeps and a summary again
def test_a_g_measures_on_until_its_own_cells_resolve_the_shift(tmp_path: Path) -> None:
    """Without ``--resolve`` G=4 stops on precision before its epochs resolve 0.4%; with it, G=4 is
    visited on (more samples, every cell of it alike) until it does, and G=2, which resolves it
    at its precision, is not held. The journal records the target, and summarises again alike."""
    plain = _sweep(None)
    assert _resolvable(plain)["G4/V0"] > RESOLVE_TARGET_REL  # the test can fail
    journal = tmp_path / "r.jsonl"
    held = _sweep(RESOLVE_TARGET_REL, journal)
    assert held.complete and len(_resolvable(held)) == 2
    assert all(r <= RESOLVE_TARGET_REL for r in _resolvable(held).values()), _resolvable(held)
    assert _native_samples(held, 4) > _native_samples(plain, 4)
    assert _native_samples(held, 2) < _native_samples(held, 4)
    assert len({c.samples_taken for c in held.cells if c.spec.key[0] == 4}) == 1
    assert all(c.decision.reason != "budget" for c in held.cells)
    assert read_journal(journal).header["config"]["resolve_rel"] == RESOLVE_TARGET_REL
    assert resummarize(journal, passes=False).cells == held.cells


def test_a_sweep_without_resolve_keeps_its_digest() -> None:
    config, _ = make_config(SyntheticBackend(seed=1), thresholds=DESIGN, interleave=True)
    assert "resolve_rel" not in config.to_dict()
    assert replace(config, resolve_rel=0.004).digest() != config.digest()


def test_a_groups_paired_sd_is_the_one_the_sweep_states() -> None:
    """:func:`group_paired` on one G's cells gives the group :func:`estimate_between_run` states for
    it over every G, with the epochs its own target needs."""
    rng = np.random.default_rng(5)
    cells = {}
    for g in (2, 4):
        for v in (0, g, 2 * g, 4 * g):
            spec = CellSpec(g, v, 3)
            shift = rng.normal(0.0, 0.004, 6)  # one per epoch
            rounds = np.repeat(np.arange(18), 3)
            epochs = rounds // 3
            ms = (
                (1.0 + g) * (1.0 - 0.01 * v / g) * np.exp(shift[epochs] + rng.normal(0.0, 0.003, rounds.size))
            )
            cells[spec] = CellSamples(
                spec, tuple(ms), tuple(int(r) for r in rounds), tuple(int(e) for e in epochs)
            )
    stated = {g.native: g for g in estimate_between_run(cells).paired_groups}
    for g in (2, 4):
        native = CellSpec(g, 0, 3)
        assert native.kind is CellKind.NATIVE
        assert group_paired(cells, native) == stated[native.label()]
        loose = group_paired(cells, native, target=0.05)
        assert loose is not None and loose.epochs_factor == 1
    alone = {c: s for c, s in cells.items() if c.key == (2, 0)}
    assert group_paired(alone, CellSpec(2, 0, 3)) is None  # no cell to pair with


@pytest.mark.parametrize(
    ("resolve", "interleave", "recapture", "says"),
    [
        (0.0, True, True, "not a relative shift"),
        (-0.004, True, True, "not a relative shift"),
        (0.06, True, True, "not a relative shift"),
        (float("nan"), True, True, "not a relative shift"),
        (float("inf"), True, True, "not a relative shift"),
        (0.004, False, True, "add --interleave"),
        (0.004, True, False, "--recapture-every"),
    ],
)
def test_a_resolve_the_design_cannot_act_on_is_refused(
    resolve: float, interleave: bool, recapture: bool, says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        check_resolve(resolve, interleave=interleave, recapture=recapture)
    check_resolve(None, interleave=interleave, recapture=recapture)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--resolve", "0.004"], "add --interleave"),
        (["--resolve", "0.004", "--interleave", "--recapture-every", "0"], "--recapture-every"),
        (["--resolve", "0.004", "--interleave", "--passes", "2"], "drop --resolve or --passes"),
        (["--resolve", "0.004", "--mixed"], "drop them with --mixed"),
        (["--resolve", "0.5", "--interleave"], "not a relative shift"),
    ],
)
def test_the_cli_refuses_a_resolve_before_anything_runs(tmp_path: Path, extra: list[str], says: str) -> None:
    out = tmp_path / "s.parquet"
    args = ["sweep", "--k", "3", "--ladder", "2,4", "--out", str(out), "--no-plot", *extra]
    res = CliRunner().invoke(build_calibrate_app(), args)
    assert res.exit_code != 0 and says in " ".join(res.output.split()), res.output
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"interleave": True, "pass_epoch": 0}, "drop --resolve or --passes"),
        ({"interleave": False}, "add --interleave"),
    ],
)
def test_a_request_to_resolve_is_refused_before_a_backend_loads(
    tmp_path: Path, fields: dict[str, object], says: str
) -> None:
    """A :class:`SweepRequest` (the API the CLI and the benchmarks call) is checked too."""
    request = SweepRequest(
        backend="synthetic", k=3, ladder=(2, 4), out=tmp_path / "s.parquet", resolve_rel=0.004, **fields
    )  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=says):
        execute(request)
    assert not list(tmp_path.iterdir())


def test_a_resolve_in_passes_is_refused() -> None:
    with pytest.raises(ConfigError, match="drop --resolve or --passes"):
        check_resolve(0.004, interleave=True, recapture=True, in_passes=True)
    check_resolve(None, interleave=True, recapture=True, in_passes=True)
