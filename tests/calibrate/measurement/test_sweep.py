"""The sweep harness end to end on CPU: synthetic backend, fake clock, artifacts, CLI."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from dspark_calibrate.artifacts import logical_sha256, read_artifact
from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticBackend
from dspark_calibrate.calibrate.measurement.journal import read_journal
from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec, plan_cells
from dspark_calibrate.calibrate.measurement.stats import CellProgress, Decision, Status, Thresholds
from dspark_calibrate.calibrate.measurement.sweep import (
    SweepRequest,
    execute,
    round_order,
    run_sweep,
    samples_path,
)
from dspark_calibrate.calibrate.measurement.telemetry import TelemetrySample
from dspark_calibrate.cli import sweep as sweep_cli
from dspark_calibrate.errors import ConfigError, MeasurementError, ProbeError
from tests.calibrate.conftest import FakeClock, make_config

Factory = Callable[..., tuple]


class FakeTimer:
    """A timer on a fake clock: each step of cell (G, V) 'takes' G + V/10 ms, exactly."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.warmed = 0

    def now(self) -> float:
        return self.clock()

    def warm(self, step: object, replays: int) -> None:
        self.warmed += replays
        self.clock.advance(replays * 1e-3)

    def measure(
        self, step: object, *, replays: int, samples: int, on_sample: Callable[[int], None] | None = None
    ) -> list[float]:
        cell = step.cell  # type: ignore[attr-defined]  # the test backend's step carries its cell
        out = []
        for i in range(samples):
            ms = cell.graph_batch_size + cell.verifier_budget / 10
            self.clock.advance(ms * replays / 1000)
            out.append(ms)
            if on_sample:
                on_sample(i)
        return out


class _CellStep:
    def __init__(self, cell: CellSpec) -> None:
        self.cell = cell

    def __call__(self) -> None:
        return None


class CellBackend(SyntheticBackend):
    """The synthetic backend whose steps expose their cell (for :class:`FakeTimer`)."""

    def prepare(self, cell: CellSpec) -> _CellStep:  # type: ignore[override]
        return _CellStep(cell)


def test_quick_sweep_measures_every_cell_with_intervals(out_path: Path) -> None:
    request = SweepRequest(
        backend="synthetic", k=3, ladder=(2, 4), out=out_path, thresholds=Thresholds.quick(), seed=1
    )
    result, output = execute(request)
    assert output is not None and result.complete
    table = read_artifact(output.summary_path)
    assert table.kind == "sweep"
    # The synthetic backend offers the forced-K arm, so every G has it too.
    want = {c.key for c in plan_cells(k=3, ladder=(2, 4), include_forced_k=True)}
    got = set(
        zip(
            table.table.column("graph_batch_size").to_pylist(),
            table.table.column("verifier_budget").to_pylist(),
            strict=True,
        )
    )
    assert got == want
    df = table.table.to_pandas()
    assert (df.ci_low_ms <= df.step_time_ms).all() and (df.step_time_ms <= df.ci_high_ms).all()
    assert (
        df.tokens
        == [CellSpec(g, v, 3).tokens for g, v in zip(df.graph_batch_size, df.verifier_budget, strict=True)]
    ).all()
    prov = table.provenance_untrusted()
    assert prov.synthetic is True and prov.backend == "synthetic"
    samples = read_artifact(samples_path(out_path))
    assert samples.kind == "sweep-samples"
    assert prov.extra["samples_logical_sha256"] == logical_sha256(samples.table, "sweep-samples")
    assert prov.extra["samples_file"] == samples_path(out_path).name
    # each cell's source hash is the logical hash of its own sample rows
    sdf = samples.table
    row = df.iloc[0]
    mask = np.array(sdf.column("graph_batch_size").to_pylist()) == row.graph_batch_size
    mask &= np.array(sdf.column("verifier_budget").to_pylist()) == row.verifier_budget
    assert row.source_result_sha256 == logical_sha256(sdf.filter(mask), "sweep-samples")
    assert table.fingerprint_untrusted().max_draft_len == 3
    assert pq.read_table(out_path).num_rows == len(want)  # plain Parquet readers see the table


def test_precision_reached_and_caps_respected(config_factory: Factory) -> None:
    th = Thresholds.quick(precision_rel=0.01, max_samples_per_cell=13, samples_per_visit=2)
    config, backend = config_factory(thresholds=th, seed=2)
    result = run_sweep(config, backend, journal_path=None)
    for c in result.cells:
        assert c.summary is not None
        if c.spec.kind is CellKind.NATIVE:
            # A native cell measures on while cells of its G still pair with it.
            same_g = [
                o.summary.rounds
                for o in result.cells
                if o.summary and o.spec.graph_batch_size == c.spec.graph_batch_size
            ]
            assert c.summary.rounds == max(same_g)
            continue
        assert c.samples_taken <= 13
        if c.decision.reason == "precision":
            # Judged on the paired saving's round-level part (the pairing removes common drift).
            assert "paired saving half-width" in c.decision.detail
            assert c.summary.rounds >= th.min_rounds and c.summary.epochs >= th.min_epochs
        else:
            assert c.decision.reason == "cell_cap_samples" and c.samples_taken == 13
    assert Counter(c.decision.reason for c in result.cells)["precision"] > 0


def test_budget_stops_open_cells(config_factory: Factory) -> None:
    th = Thresholds.quick(
        precision_rel=0.0001, budget_s=0.5, max_samples_per_cell=10_000, max_seconds_per_cell=100
    )
    config, backend = config_factory(thresholds=th)
    result = run_sweep(config, backend, journal_path=None)
    assert {c.decision.reason for c in result.cells} == {"budget"}
    one_visit = max(c.summary.median_ms for c in result.cells if c.summary) * 1e-3 * 20
    assert result.seconds <= th.budget_s + one_visit


def test_fake_clock_timer_and_injected_rule(config_factory: Factory) -> None:
    """STYLE rule 12: timer and stopping rule injected; exact values from a fake clock."""
    calls: list[int] = []

    def three_visits(progress: CellProgress) -> Decision:
        calls.append(progress.visits)
        if progress.visits >= 3:
            return Decision(Status.ACCEPT, "precision", "three visits")
        return Decision(Status.UNDECIDED, "precision_not_reached")

    config, _ = config_factory(thresholds=Thresholds.quick(warmup_steps=5, rewarm_steps=1, recapture_every=0))
    backend = CellBackend()
    timer = FakeTimer()
    result = run_sweep(config, backend, journal_path=None, timer=timer, stopping_rule=three_visits)
    assert result.rounds == 3
    for c in result.cells:
        assert c.summary is not None and c.summary.median_ms == pytest.approx(
            c.spec.graph_batch_size + c.spec.verifier_budget / 10
        )
        assert c.warmup_steps == 5 + 1 + 1 and c.summary.rounds == 3
    assert timer.warmed == len(config.cells) * 7
    assert result.seconds == pytest.approx(timer.clock())


def test_order_is_seeded_and_recorded(tmp_path: Path, config_factory: Factory) -> None:
    cells = plan_cells(k=3, ladder=(2, 4))
    assert round_order(5, 0, cells) == round_order(5, 0, reversed(cells))
    assert round_order(5, 0, cells) != round_order(6, 0, cells)
    assert round_order(5, 0, cells) != round_order(5, 1, cells)

    def visits(seed: int, name: str) -> list[tuple[int, int, int]]:
        config, backend = config_factory(seed=seed)
        run_sweep(config, backend, journal_path=tmp_path / name)
        recs = read_journal(tmp_path / name).records
        return [(r["round"], r["g"], r["v"]) for r in recs if r["type"] == "visit"]

    first = visits(3, "a.jsonl")
    assert first == visits(3, "b.jsonl")
    assert first != visits(4, "c.jsonl")
    # within each round the journal follows the seeded order
    r0 = [(g, v) for rnd, g, v in first if rnd == 0]
    config, _ = config_factory(seed=3)
    assert r0 == [c.key for c in round_order(3, 0, config.cells)]


def test_throttled_samples_are_dropped_and_counted(config_factory: Factory) -> None:
    backend = SyntheticBackend(seed=1, throttle_prob=0.3)
    config, _ = config_factory(backend)
    result = run_sweep(config, backend, journal_path=None)
    dropped = sum(c.dropped_throttled for c in result.cells)
    kept_col = result.samples.column("kept").to_pylist()
    assert dropped > 0 and kept_col.count(False) == dropped
    for c in result.cells:
        assert c.summary is not None and c.summary.samples == c.samples_taken - c.dropped_throttled


def test_fixed_protocol(config_factory: Factory) -> None:
    config, backend = config_factory(thresholds=Thresholds.fixed_protocol(), protocol="fixed")
    result = run_sweep(config, backend, journal_path=None)
    assert result.rounds == 1
    for c in result.cells:
        assert c.decision.reason == "fixed_protocol" and c.warmup_steps == 128
        assert c.summary is not None and c.summary.samples == 64 and "single_round" in c.summary.warnings


@pytest.mark.parametrize(
    ("case", "options", "match"),
    [
        ("backend_raises", {"fail_at": 40}, "device lost"),
        ("non_finite", {"nan_at": 40}, "non-finite"),
    ],
)
def test_backend_failures_keep_the_journal(tmp_path: Path, case: str, options: dict, match: str) -> None:
    backend = SyntheticBackend(seed=0, **options)
    config, _ = make_config(backend)
    journal = tmp_path / "j.jsonl"
    with pytest.raises(MeasurementError, match=match):
        run_sweep(config, backend, journal_path=journal)
    visits = [r for r in read_journal(journal).records if r["type"] == "visit"]
    assert visits, "samples measured before the failure stay in the journal"


def test_config_errors() -> None:
    config, _ = make_config()
    with pytest.raises(ConfigError, match="native"):
        type(config)(
            **{**{f: getattr(config, f) for f in config.__dataclass_fields__}, "cells": config.cells[1:]}
        )
    with pytest.raises(ConfigError, match="protocol"):
        make_config(protocol="lazy")


def _app() -> typer.Typer:
    app = typer.Typer()
    sweep_cli.register(app)

    @app.callback()
    def main() -> None:
        """Throwaway root so ``sweep`` stays a subcommand."""

    return app


def test_cli_json_and_resume(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "x.parquet"
    args = [
        "sweep",
        "--backend",
        "synthetic",
        "--k",
        "3",
        "--ladder",
        "2,4",
        "--out",
        str(out),
        "--preset",
        "quick",
        "--no-plot",
    ]
    res = runner.invoke(_app(), [*args, "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["ok"] and {c["kind"] for c in report["cells"]} == {k.value for k in CellKind}
    assert all(c["ci_low_ms"] <= c["step_time_ms"] <= c["ci_high_ms"] for c in report["cells"])
    # a second run without --resume refuses the existing journal; with --resume it only rewrites
    again = runner.invoke(_app(), args)
    assert again.exit_code == 2 and "--resume" in again.stderr
    resumed = runner.invoke(_app(), [*args, "--resume", "--json"])
    assert resumed.exit_code == 0 and json.loads(resumed.stdout)["resumed"]


@pytest.mark.parametrize(
    ("case", "extra", "code", "needle"),
    [
        ("bad_ladder", ["--ladder", "8,x"], 2, "integers"),
        ("duplicate_g", ["--ladder", "8,8"], 2, "more than once"),
        ("k_zero", ["--k", "0"], 2, "K must be"),
        ("illegal_budget", ["--budgets", "2:1"], 2, "legal compact budget"),
        ("unknown_backend", ["--backend", "nope"], 2, "unknown backend"),
        ("bad_import", ["--backend", "no_such_mod:Factory"], 2, "cannot import"),
        ("bad_option", ["--backend-opt", "flavour=1"], 2, "unknown option"),
        ("backend_fails", ["--backend-opt", "fail_at=30"], 1, "measurement failed"),
        ("bad_preset", ["--preset", "turbo"], 2, "preset"),
        ("bad_precision", ["--precision", "2"], 2, "precision_rel"),
    ],
)
def test_cli_errors(tmp_path: Path, case: str, extra: list[str], code: int, needle: str) -> None:
    base = {
        "--backend": "synthetic",
        "--k": "3",
        "--ladder": "2,4",
        "--out": str(tmp_path / "x.parquet"),
        "--preset": "quick",
    }
    args = ["sweep", "--no-plot"]
    overridden = {extra[i] for i in range(0, len(extra), 2)}
    for key, value in base.items():
        if key not in overridden:
            args += [key, value]
    res = CliRunner().invoke(_app(), [*args, *extra])
    assert res.exit_code == code, res.output
    assert needle in res.stderr
    assert not (tmp_path / "x.parquet").exists()


def test_cli_writes_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "p.parquet"
    res = CliRunner().invoke(
        _app(), ["sweep", "--k", "2", "--ladder", "2", "--out", str(out), "--preset", "quick"]
    )
    assert res.exit_code == 0, res.output
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class VanishingGpu:
    """Telemetry that answers a few times, then fails like a GPU that fell off the bus."""

    def __init__(self, answers: int) -> None:
        self.left = answers

    def read(self) -> TelemetrySample:
        self.left -= 1
        if self.left < 0:
            raise ProbeError("NVML read of GPU 0 failed mid-sweep: GPU is lost")
        return TelemetrySample(1980.0, 60.0, 500.0, 0)

    def describe(self) -> str:
        return "vanishing"


def test_gpu_vanishing_mid_sweep_keeps_the_journal(tmp_path: Path) -> None:
    config, backend = make_config()
    journal = tmp_path / "j.jsonl"
    with pytest.raises(MeasurementError, match="GPU is lost"):
        run_sweep(config, backend, journal_path=journal, telemetry=VanishingGpu(answers=25))
    visits = [r for r in read_journal(journal).records if r["type"] == "visit"]
    assert len(visits) == 12  # 25 readings = 12 complete two-sample visits; the 13th failed
    assert all(s["sm"] == 1980.0 for v in visits for s in v["samples"])


def test_cli_fingerprint_file(tmp_path: Path) -> None:
    fp = tmp_path / "fp.json"
    args = ["sweep", "--k", "3", "--ladder", "2", "--out", str(tmp_path / "f.parquet"), "--preset", "quick"]
    fp.write_text(json.dumps({"max_draft_len": 4}))
    res = CliRunner().invoke(_app(), [*args, "--no-plot", "--fingerprint", str(fp)])
    assert res.exit_code == 2 and "max_draft_len is 4" in res.stderr
    fp.write_text(json.dumps({"topology": "DEP8", "source_head": "abc123", "max_draft_len": 3}))
    res = CliRunner().invoke(
        _app(), [*args, "--no-plot", "--fingerprint", str(fp), "--clock-policy", "locked:1980"]
    )
    assert res.exit_code == 0, res.output
    got = read_artifact(tmp_path / "f.parquet").fingerprint_untrusted()
    assert (got.topology, got.source_head, got.clock_policy, got.gpu_count) == (
        "DEP8",
        "abc123",
        "locked:1980",
        1,
    )
    fp.write_text("{not json")
    res = CliRunner().invoke(_app(), [*args, "--no-plot", "--fingerprint", str(fp), "--resume"])
    assert res.exit_code == 2
