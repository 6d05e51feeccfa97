"""The mixed sweep: plans from grids and workloads, the harness's pairing, backends, import, resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dspark_calibrate.artifacts import (
    ContextChunk,
    GenerationRequest,
    MixedRoute,
    MixedStep,
    RankStep,
    read_artifact,
)
from dspark_calibrate.artifacts._content import content_findings
from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticModel
from dspark_calibrate.calibrate.measurement.journal import read_journal
from dspark_calibrate.calibrate.measurement.mixed import (
    GRID_FORMAT,
    MIXED_NATIVE,
    MixedCellSpec,
    generation_rows,
    plan_from_grid,
    plan_from_steps,
)
from dspark_calibrate.calibrate.measurement.mixed_sweep import MixedSweepRequest, execute_mixed, import_mixed
from dspark_calibrate.calibrate.measurement.stats import Thresholds
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.errors import ConfigError, MeasurementError
from tests.factories import make_fingerprint

BUCKETS = (96, 128, 192, 256, 384, 512)
ROUTE = MixedRoute(physical_k=3, world_size=2, body_buckets=BUCKETS)
FP = make_fingerprint(max_draft_len=3, gpu="synthetic", gpu_count=2, global_graph_batch_sizes=(16, 32, 64))
CPU_FP = make_fingerprint(
    max_draft_len=3, gpu="cpu", model_config_sha256=None, kv_dtype=None, context_len=None
)
LADDER = (8, 16, 32)
runner = CliRunner()


def _step(ctx: int = 64, gens: int = 10, other: int = 6, position: int = 128) -> MixedStep:
    return MixedStep(
        (
            RankStep((ContextChunk(ctx, position),), tuple(GenerationRequest(500) for _ in range(gens))),
            RankStep((), tuple(GenerationRequest(300) for _ in range(other))),
        )
    )


def _grid(*steps: MixedStep, capacities: list[int] | None = None) -> dict[str, Any]:
    entries = [{"step": s.to_dict(), **({"capacities": capacities} if capacities else {})} for s in steps]
    return {"format": GRID_FORMAT, "steps": entries}


def test_plan_from_grid_pairs_every_cell_with_its_native_arm() -> None:
    plan = plan_from_grid(_grid(_step(), _step(ctx=200, gens=25)), ROUTE)
    cells = plan.cells()
    assert all(MixedCellSpec(c.group, MIXED_NATIVE, 3) in cells for c in cells)
    g1 = plan.group(1)
    assert g1.native_capacity == 384 and [c.capacity for c in g1.cells] == [256]
    shape = g1.shape(256, 0, ROUTE)
    assert shape.rows == 256 and shape.capacity == 256
    assert sum(shape.generation_rows) == 56  # 256 - 200 context rows, over 25 eligible generations
    assert g1.shape(MIXED_NATIVE, 0, ROUTE).generation_rows == (4,) * 25


BAD_GRIDS: list[tuple[str, Any, str]] = [
    ("format", {"format": "x", "steps": []}, "a mixed grid is"),
    ("empty", {"format": GRID_FORMAT, "steps": []}, "non-empty"),
    ("all_decode", _grid(MixedStep((RankStep((), (GenerationRequest(1),)), RankStep()))), "all-decode"),
    ("world_size", _grid(MixedStep((RankStep((ContextChunk(8, 0),)),))), "world size 2"),
    ("not_offered", _grid(_step(), capacities=[192]), "not compact candidates"),
    ("duplicate", _grid(_step(), _step()), "same geometry"),
    (
        "too_big",
        _grid(MixedStep((RankStep((ContextChunk(600, 0),)), RankStep()))),
        "above the largest body bucket",
    ),
    (
        "bad_step",
        {"format": GRID_FORMAT, "steps": [{"step": {"ranks": [{"context": [{"size": 0}]}]}}]},
        "size must be >= 1",
    ),
]


@pytest.mark.parametrize(("name", "grid", "message"), BAD_GRIDS, ids=[c[0] for c in BAD_GRIDS])
def test_bad_grids_are_refused(name: str, grid: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_from_grid(grid, ROUTE)


def test_more_than_256_cells_are_refused() -> None:
    steps = [_step(position=i) for i in range(300)]
    with pytest.raises(ConfigError, match="at most 256"):
        plan_from_grid(_grid(*steps), ROUTE)


def test_plan_from_steps_takes_frequent_valuable_cells_first() -> None:
    rare_big = _step(ctx=200, gens=25)  # saves a whole bucket step (384 -> 256)
    often = _step()  # 128 -> 96
    never = MixedStep((RankStep((ContextChunk(32, 0),)), RankStep()))  # no compact candidate
    steps = [often] * 10 + [rare_big] + [never] * 5
    plan = plan_from_steps(steps, ROUTE, max_cells=1)
    assert [len(g.cells) for g in plan.groups] == [1, 0, 0]
    assert plan.groups[0].workload_steps == 10  # 10 x 8 rows saved beats 1 x 128
    assert plan.groups[1].workload_steps == 5  # then natives by frequency
    assert plan.workload_mixed_steps == 16
    plan2 = plan_from_steps(steps, ROUTE, max_cells=1, max_groups=1)
    assert len(plan2.groups) == 1
    with pytest.raises(ConfigError, match="no mixed step"):
        plan_from_steps([MixedStep((RankStep((), (GenerationRequest(1),)), RankStep()))], ROUTE)


def test_generation_rows_keep_floor_and_full_width() -> None:
    gens = (GenerationRequest(1), GenerationRequest(1, eligible=False), GenerationRequest(1))
    assert generation_rows(gens, 4 + 4 + 2 + 2 + 1, 4, 3, 1) == (3, 4, 2)
    with pytest.raises(ConfigError):
        generation_rows(gens, 4 + 4 + 3, 4, 3, 1)


def _run(tmp_path: Path, backend: str = "synthetic", options: dict[str, Any] | None = None, **kw: Any) -> Any:
    tmp_path.mkdir(parents=True, exist_ok=True)
    plan = kw.pop("plan", None) or plan_from_grid(_grid(_step(), _step(ctx=200, gens=25)), ROUTE)
    request = MixedSweepRequest(
        backend=backend,
        plan=plan,
        ladder=LADDER,
        out=tmp_path / "mixed.parquet",
        backend_options=options or {"seed": 3},
        thresholds=kw.pop("thresholds", Thresholds.quick()),
        fingerprint=kw.pop("fingerprint", FP),
        **kw,
    )
    return execute_mixed(request)


def test_synthetic_mixed_sweep_pairs_and_covers_the_true_saving(tmp_path: Path) -> None:
    result, output = _run(tmp_path)
    assert output is not None and result.complete
    loaded = read_artifact(output.output.summary_path)
    assert loaded.kind == "mixed-sweep"
    rows = loaded.table.to_pylist()
    model = SyntheticModel()
    plan = plan_from_grid(_grid(_step(), _step(ctx=200, gens=25)), ROUTE)
    for r in rows:
        if r["capacity"] == 0:
            assert r["saving"] == 0.0
            continue
        assert r["paired_rounds"] >= 2 and r["accuracy_rows"] > 0 and r["accuracy_mismatches"] == 0
        g = plan.group(r["mixed_group"])
        truth = 1 - model.mixed_expected_ms(g.shape(r["capacity"], 0, ROUTE)) / model.mixed_expected_ms(
            g.shape(0, 0, ROUTE)
        )
        assert r["saving_ci_low"] <= truth <= r["saving_ci_high"]
    assert loaded.metadata["summary"]["route"] == ROUTE.to_dict()
    assert loaded.metadata["summary"]["protocol_sha256"] == output.protocol_sha256
    samples = read_artifact(output.output.samples_path)
    assert samples.kind == "mixed-sweep-samples"
    fp = loaded.fingerprint_untrusted()
    assert fp.gpu_count == 2 and fp.max_draft_len == 3
    found = content_findings(
        "mixed-sweep",
        loaded.table,
        fp,
        {},
        allow_synthetic=True,
        where="m",
        summary=loaded.metadata["summary"],
    )
    assert found == []


def test_a_killed_mixed_sweep_resumes_without_remeasuring(tmp_path: Path) -> None:
    whole, _ = _run(tmp_path / "a")
    with pytest.raises(MeasurementError):
        _run(tmp_path / "b", options={"seed": 3, "fail_at": 40})
    journal = tmp_path / "b" / "mixed.journal.jsonl"
    before = [r for r in read_journal(journal).records if r["type"] == "visit"]
    result, output = _run(tmp_path / "b", resume=True)
    assert result.resumed and result.complete and output is not None
    after = [r for r in read_journal(journal).records if r["type"] == "visit"]
    assert after[: len(before)] == before
    assert {c.spec for c in result.cells} == {c.spec for c in whole.cells}


@pytest.mark.slow
def test_reference_backend_runs_and_checks_mixed_steps(tmp_path: Path) -> None:
    route = MixedRoute(physical_k=3, world_size=1, body_buckets=(16, 24, 32, 48))
    step = MixedStep(
        (RankStep((ContextChunk(8, 16), ContextChunk(4, 0)), tuple(GenerationRequest(40) for _ in range(4))),)
    )
    plan = plan_from_grid(_grid(step), route)
    assert [c.capacity for c in plan.group(0).cells] == [24]
    for config in ("tiny", "mla-tiny"):
        result, output = _run(
            tmp_path / config,
            backend="reference",
            options={"config": config, "mixed_max_span": 64},
            plan=plan,
            thresholds=Thresholds.quick(
                    budget_s=30.0, min_time_s=0.0, max_samples_per_cell=12, min_samples=4, min_rounds=2
                ),
            fingerprint=CPU_FP,
        )
        check = output.checks[(0, 24)]
        assert check.rows == 24 - 12 and check.mismatches == 0, check
        assert result.complete


def test_reference_backend_refuses_a_prefix_beyond_its_span(tmp_path: Path) -> None:
    route = MixedRoute(physical_k=3, world_size=1, body_buckets=(16, 24, 32, 48))
    step = MixedStep((RankStep((ContextChunk(8, 200),), tuple(GenerationRequest(40) for _ in range(4))),))
    with pytest.raises(ConfigError, match="mixed_max_span"):
        _run(
            tmp_path,
            backend="reference",
            options={"config": "tiny", "mixed_max_span": 64},
            plan=plan_from_grid(_grid(step), route),
            fingerprint=CPU_FP,
        )


def test_module_backend_mixed_factory_and_check(tmp_path: Path) -> None:
    factory = "tests.calibrate.fixtures.step_factory"
    result, output = _run(
        tmp_path,
        backend="module",
        options={
            "factory": f"{factory}:make_step",
            "mixed_factory": f"{factory}:make_mixed_step",
            "mixed_check": f"{factory}:check_mixed",
        },
        thresholds=Thresholds.quick(budget_s=2.0, min_time_s=0.0),
    )
    assert result.complete and all(c.rows > 0 and c.mismatches == 0 for c in output.checks.values())
    with pytest.raises(ConfigError, match="mixed_factory"):
        _run(tmp_path / "b", backend="module", options={"factory": f"{factory}:make_step"})
    with pytest.raises(ConfigError, match=r"\(rows, mismatches\)"):
        _run(
            tmp_path / "c",
            backend="module",
            options={
                "factory": f"{factory}:make_step",
                "mixed_factory": f"{factory}:make_mixed_step",
                "mixed_check": f"{factory}:bad_check",
            },
            thresholds=Thresholds.quick(budget_s=1.0, min_time_s=0.0),
        )


def test_import_samples_reads_mixed_profiler_records(tmp_path: Path) -> None:
    plan = plan_from_grid(_grid(_step()), ROUTE)
    group = plan.group(0)
    native, cell = group.native_geometry(), group.cells[0]
    lines = [json.dumps({"batch_size": 8, "verify_len": 0, "step_time_ms": 5.0, "iteration": 0})]
    it = 0
    for rnd in range(6):
        for geo, ms in ((native, 10.0), (cell, 9.0)):
            for _ in range(4):
                it += 1
                jitter = 1 + 0.001 * ((it * 7919) % 11 - 5) + 0.002 * rnd
                lines.append(
                    json.dumps(
                        {"mixed_geometry": geo.to_dict(), "step_time_ms": ms * jitter, "iteration": it}
                    )
                )
    path = tmp_path / "profile.jsonl"
    path.write_text("\n".join(lines) + "\n")
    _, output = import_mixed(path, route=ROUTE, ladder=LADDER, out=tmp_path / "m.parquet", fingerprint=FP)
    rows = read_artifact(output.output.summary_path).table.to_pylist()
    compact = [r for r in rows if r["capacity"]]
    assert len(compact) == 1 and compact[0]["paired_rounds"] == 6
    assert compact[0]["saving_ci_low"] < 0.1 < compact[0]["saving_ci_high"]
    assert compact[0]["accuracy_rows"] == 0  # nothing ran a forward to compare
    # a cell without its native record, or a broken geometry, is refused
    only_cell = [x for x in lines[1:] if json.loads(x)["mixed_geometry"]["capacity"] == 96]
    path.write_text("\n".join(only_cell))
    with pytest.raises(ConfigError, match="no native record"):
        import_mixed(path, route=ROUTE, ladder=LADDER, out=tmp_path / "m2.parquet", fingerprint=FP)
    bad = json.loads(only_cell[0])
    bad["mixed_geometry"]["actual_rank_rows"][1] = 5
    path.write_text(json.dumps(bad) + "\n" + lines[2])
    with pytest.raises(ConfigError, match="breaks"):
        import_mixed(path, route=ROUTE, ladder=LADDER, out=tmp_path / "m3.parquet", fingerprint=FP)


def test_cli_sweep_mixed(tmp_path: Path) -> None:
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps(_grid(_step())))
    fp = tmp_path / "fp.json"
    fp.write_text(json.dumps(FP.to_dict()))
    app = build_calibrate_app()
    common = [
        "sweep",
        "--mixed",
        "--k",
        "3",
        "--ladder",
        "8,16,32",
        "--fingerprint",
        str(fp),
        "--preset",
        "quick",
    ]
    r = runner.invoke(
        app, [*common, "--mixed-grid", str(grid), "--out", str(tmp_path / "m.parquet"), "--json"]
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["mixed"] and report["ok"] and len(report["cells"]) == 2
    r = runner.invoke(app, [*common, "--out", str(tmp_path / "n.parquet")])
    assert r.exit_code == 2 and "exactly one of" in r.stderr
    r = runner.invoke(
        app,
        [
            "sweep",
            "--k",
            "3",
            "--ladder",
            "8",
            "--mixed-grid",
            str(grid),
            "--out",
            str(tmp_path / "o.parquet"),
        ],
    )
    assert r.exit_code == 2 and "need --mixed" in r.stderr


@pytest.mark.slow
def test_paired_intervals_cover_the_true_saving_over_seeds(tmp_path: Path) -> None:
    """The claim behind a mixed cell's saving interval and its two runtime bounds, measured over
    independent sweeps (fresh noise, drift and process shifts each): the paired 95% interval
    covers the synthetic model's true saving, ``native_lower_ms`` lies below the true native time
    and ``candidate_upper_ms`` above the true candidate time, at about their nominal rates."""
    model = SyntheticModel()
    steps = (_step(), _step(ctx=200, gens=25), _step(ctx=48, gens=30, other=20, position=1024))
    plan = plan_from_grid(_grid(*steps), ROUTE)
    covered = lower_ok = upper_ok = cells = 0
    for seed in range(12):
        _, output = _run(tmp_path / str(seed), options={"seed": seed}, plan=plan, seed=seed)
        assert output is not None
        rows = read_artifact(output.output.summary_path).table.to_pylist()
        native = {r["mixed_group"]: r for r in rows if r["capacity"] == 0}
        for r in rows:
            if r["capacity"] == 0:
                continue
            g = plan.group(r["mixed_group"])
            t = max(model.mixed_expected_ms(g.shape(r["capacity"], k, ROUTE)) for k in range(2))
            t0 = max(model.mixed_expected_ms(g.shape(0, k, ROUTE)) for k in range(2))
            cells += 1
            covered += r["saving_ci_low"] <= 1 - t / t0 <= r["saving_ci_high"]
            lower_ok += native[r["mixed_group"]]["ci_low_ms"] <= t0
            upper_ok += r["ci_high_ms"] >= t
    assert cells >= 24
    assert covered / cells >= 0.85, (covered, cells)
    assert lower_ok / cells >= 0.85 and upper_ok / cells >= 0.85, (lower_ok, upper_ok, cells)
