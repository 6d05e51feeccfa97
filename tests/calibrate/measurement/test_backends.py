"""Backends: registry, synthetic model, module factories, reference on CPU, import-samples, trtllm parsing."""

from __future__ import annotations

import importlib.metadata
import json
import math
from pathlib import Path

import numpy as np
import pytest

from dspark_calibrate.artifacts import read_artifact
from dspark_calibrate.calibrate.measurement.backends import Backend, load_backend, resolve_factory
from dspark_calibrate.calibrate.measurement.backends.import_samples import group_rounds, parse_profiler_jsonl
from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticBackend, SyntheticModel
from dspark_calibrate.calibrate.measurement.backends.trtllm import (
    cell_for_rows,
    parse_iteration_stats,
    steady_decode_steps,
)
from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec, plan_cells
from dspark_calibrate.calibrate.measurement.stats import Thresholds
from dspark_calibrate.calibrate.measurement.sweep import SweepRequest, execute, run_sweep, samples_path
from dspark_calibrate.errors import ConfigError, MeasurementError
from tests.calibrate.conftest import make_config

FIXTURES = Path(__file__).parent.parent / "fixtures"
FACTORY = "tests.calibrate.fixtures.step_factory"


# -- registry -----------------------------------------------------------------------------------
def test_registry_by_name_import_string_and_entry_point() -> None:
    assert isinstance(load_backend("synthetic"), Backend)
    by_string = load_backend(
        "dspark_calibrate.calibrate.measurement.backends.synthetic:SyntheticBackend", {"seed": 3}
    )
    assert by_string.describe()["seed"] == 3
    names = {ep.name for ep in importlib.metadata.entry_points(group="dspark_calibrate.backends")}
    if "synthetic" not in names:
        pytest.skip("package not installed with its entry points")
    ep = next(
        ep
        for ep in importlib.metadata.entry_points(group="dspark_calibrate.backends")
        if ep.name == "synthetic"
    )
    assert ep.load() is SyntheticBackend


@pytest.mark.parametrize(
    ("case", "spec", "options", "match"),
    [
        ("unknown_name", "warp-drive", {}, "unknown backend"),
        ("missing_module", "no.such.module:Thing", {}, "cannot import"),
        ("missing_attr", f"{FACTORY}:nothing_here", {}, "no attribute"),
        ("empty_attr", f"{FACTORY}:", {}, "pkg.mod:Factory"),
        ("bad_options", "synthetic", {"warp": 9}, "unknown option"),
        ("not_a_backend", f"{FACTORY}:NotABackend", {}, "lacks the Backend methods"),
        (
            "module_not_callable",
            "module",
            {"factory": "tests.calibrate.fixtures.step_factory"},
            "pkg.mod:factory",
        ),
    ],
)
def test_registry_errors(case: str, spec: str, options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_backend(spec, options)


def test_resolve_factory_nested_attribute() -> None:
    assert resolve_factory(
        "dspark_calibrate.calibrate.measurement.backends.synthetic:SyntheticModel.expected_ms"
    )


# -- synthetic ----------------------------------------------------------------------------------
def test_synthetic_model_is_a_staircase() -> None:
    model = SyntheticModel()
    times = [model.expected_ms(CellSpec(8, v, 5)) for v in range(9, 48)]
    assert times == sorted(times)
    assert len(set(times)) < len(times) / 4  # flat treads between tile boundaries
    assert model.expected_ms(CellSpec(8, 0, 5)) < model.expected_ms(CellSpec(8, 47, 5))
    with pytest.raises(ConfigError):
        SyntheticModel(noise_rel=-1.0)


# -- module -------------------------------------------------------------------------------------
def test_module_backend_sweep(tmp_path: Path) -> None:
    request = SweepRequest(
        backend="module",
        backend_options={"factory": f"{FACTORY}:make_step", "options": {"width": 4}},
        k=2,
        ladder=(2,),
        out=tmp_path / "m.parquet",
        thresholds=Thresholds.quick(precision_rel=0.5),
        max_candidates=3,
    )
    result, output = execute(request)
    assert output is not None and result.complete
    art = read_artifact(output.summary_path)
    assert art.provenance_untrusted().synthetic is False and art.provenance_untrusted().backend == "module"


@pytest.mark.parametrize(
    ("factory", "error", "match"),
    [
        ("not_callable", ConfigError, "expected a callable"),
        ("exploding", MeasurementError, "device vanished"),
    ],
)
def test_module_backend_bad_factories(tmp_path: Path, factory: str, error: type, match: str) -> None:
    backend = load_backend("module", {"factory": f"{FACTORY}:{factory}"})
    config, _ = make_config(k=2, ladder=(2,), max_per_g=2)
    with pytest.raises(error, match=match):
        run_sweep(config, backend, journal_path=tmp_path / "j.jsonl")


# -- reference ----------------------------------------------------------------------------------
@pytest.mark.parametrize("config", ["tiny", "mla-tiny"])
def test_reference_backend_cpu_path(config: str) -> None:
    torch = pytest.importorskip("torch")
    backend = load_backend(
        "reference", {"config": config, "context_len": 16, "max_rows": 8, "max_row_len": 4}
    )
    timer = backend.timer()
    for cell in (CellSpec(4, 0, 3), CellSpec(4, 5, 3), CellSpec(4, 15, 3)):
        step = backend.prepare(cell)
        timer.warm(step, 1)
        times = timer.measure(step, replays=1, samples=2)
        assert len(times) == 2 and all(math.isfinite(t) and t > 0 for t in times)
    model = backend.model  # type: ignore[attr-defined]  # the reference backend exposes its model
    with torch.inference_mode():
        ids = model.forward(model.cell_buffers(CellSpec(4, 7, 3)))
    assert ids.shape == (7,) and ids.dtype == torch.long
    fields = backend.fingerprint_fields()
    assert (
        fields["gpu"] == "cpu"
        and len(fields["model_config_sha256"]) == 64
        and fields["kv_dtype"] == "float32"
    )
    assert backend.describe()["graphs"] is False


def test_reference_buffers_match_row_lengths() -> None:
    pytest.importorskip("torch")
    backend = load_backend("reference", {"config": "tiny", "context_len": 8, "max_rows": 8, "max_row_len": 6})
    cell = CellSpec(4, 10, 5)
    buf = backend.model.cell_buffers(cell)  # type: ignore[attr-defined]  # reference model internals
    lengths = cell.row_lengths()
    assert buf["qmax"] == max(lengths) and buf["total"] == 10
    pads = buf["pad_index"].tolist()
    assert sum(1 for p in pads if p < 10) == 10 and sorted(p for p in pads if p < 10) == list(range(10))
    assert buf["active"] == min(8, 10 * 2)


@pytest.mark.parametrize(
    ("case", "options", "match"),
    [
        ("missing_file", {"config": "/nonexistent/config.json"}, "cannot read"),
        ("zero_layers", {"config": "tiny", "layers": 0}, "--layers"),
        ("bad_dtype", {"config": "tiny", "dtype": "int8"}, "dtype"),
    ],
)
def test_reference_errors(case: str, options: dict, match: str) -> None:
    pytest.importorskip("torch")
    with pytest.raises(ConfigError, match=match):
        load_backend("reference", options)


def test_reference_cell_too_big_and_bad_config(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    backend = load_backend("reference", {"config": "tiny", "context_len": 4, "max_rows": 2, "max_row_len": 2})
    with pytest.raises(ConfigError, match="does not fit"):
        backend.prepare(CellSpec(4, 0, 3))
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        load_backend("reference", {"config": str(cfg)})


@pytest.mark.slow
def test_reference_sweep_writes_artifacts(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    request = SweepRequest(
        backend="reference",
        backend_options={"config": "tiny", "context_len": 16, "max_rows": 4, "max_row_len": 4},
        k=3,
        ladder=(2, 4),
        budgets={2: (3,), 4: (6,)},
        out=tmp_path / "r.parquet",
        thresholds=Thresholds.quick(precision_rel=0.5, min_rounds=2, min_samples=2, max_samples_per_cell=6),
        seed=1,
    )
    result, output = execute(request)
    assert output is not None and result.complete
    fp = read_artifact(output.summary_path).fingerprint_untrusted()
    assert fp.gpu == "cpu" and fp.context_len == 16 and fp.max_draft_len == 3


def test_deepseek_config_shapes() -> None:
    from dspark_calibrate.calibrate.measurement.backends.reference import ModelShape, load_model_config

    cfg, digest = load_model_config("deepseek-v3")
    shape = ModelShape.from_config(cfg, layers=3)
    assert (
        shape.mla
        and shape.experts == 256
        and shape.top_k == 8
        and shape.layers == 3
        and shape.dense_layers == 0
    )
    assert ModelShape.from_config(cfg).dense_layers == 3 and len(digest) == 64


# -- import-samples -----------------------------------------------------------------------------
def test_import_samples_round_trip(tmp_path: Path) -> None:
    config, backend = make_config(k=3, ladder=(2, 4), seed=3)
    measured = run_sweep(config, backend, journal_path=None)
    lines = []
    rows = [
        r for r in measured.samples.to_pylist() if r["verifier_budget"] != 4 * r["graph_batch_size"]
    ]  # no controls
    for i, row in enumerate(rows):
        g, v = row["graph_batch_size"], row["verifier_budget"]
        lines.append(
            json.dumps(
                {
                    "batch_size": g,
                    "verify_len": v if v else g * 4,
                    "step_time_ms": row["step_time_ms"],
                    "iteration": i,
                    "measured_tokens": v if v else g * 4,
                }
            )
        )
    lines.append(
        json.dumps(
            {"batch_size": 2, "verify_len": 3, "step_time_ms": 1.0, "iteration": 99, "measured_tokens": 5}
        )
    )
    src = tmp_path / "profile.jsonl"
    src.write_text("\n".join(lines) + "\n")
    request = SweepRequest(
        backend="import-samples", k=3, ladder=(2, 4), out=tmp_path / "i.parquet", input=src
    )
    result, output = execute(request)
    assert output is not None
    art = read_artifact(output.summary_path)
    assert art.provenance_untrusted().extra["misaligned_skipped"] == 1
    got = {(c.spec.key): c.summary.median_ms for c in result.cells if c.summary}
    want = {
        c.spec.key: float(
            np.median(
                [
                    r["step_time_ms"]
                    for r in rows
                    if (r["graph_batch_size"], r["verifier_budget"]) == c.spec.key
                ]
            )
        )
        for c in measured.cells
        if c.spec.kind is not CellKind.CONTROL
    }
    assert got == pytest.approx(want)
    assert {c.decision.reason for c in result.cells} == {"imported"}
    assert read_artifact(samples_path(output.summary_path)).table.num_rows == len(lines) - 1


def test_import_rounds_follow_runs() -> None:
    text = [
        json.dumps({"batch_size": 2, "verify_len": v, "step_time_ms": 1.0 + v, "iteration": i})
        for i, v in enumerate([3, 3, 4, 3, 4, 4])
    ]
    parsed = parse_profiler_jsonl(text, k=3, ladder=(2,))
    rounds = group_rounds(parsed.samples)
    assert [r for r, _ in rounds[CellSpec(2, 3, 3)]] == [0, 0, 1]
    assert [r for r, _ in rounds[CellSpec(2, 4, 3)]] == [0, 1, 1]


@pytest.mark.parametrize(
    ("case", "line", "match"),
    [
        ("not_json", "{oops", "not valid"),
        ("missing", '{"batch_size": 2, "verify_len": 3, "iteration": 0}', "missing fields"),
        (
            "extra",
            '{"batch_size": 2, "verify_len": 3, "step_time_ms": 1, "iteration": 0, "x": 1}',
            "unknown fields",
        ),
        (
            "g_not_in_ladder",
            '{"batch_size": 3, "verify_len": 3, "step_time_ms": 1, "iteration": 0}',
            "not in the ladder",
        ),
        ("illegal_v", '{"batch_size": 2, "verify_len": 1, "step_time_ms": 1, "iteration": 0}', "illegal"),
        (
            "negative_time",
            '{"batch_size": 2, "verify_len": 3, "step_time_ms": -1, "iteration": 0}',
            "finite positive",
        ),
        ("nan_literal", '{"batch_size": 2, "verify_len": 3, "step_time_ms": NaN, "iteration": 0}', "NaN"),
        ("string_g", '{"batch_size": "2", "verify_len": 3, "step_time_ms": 1, "iteration": 0}', "integer"),
        ("empty", "", "no usable samples"),
    ],
)
def test_import_bad_lines(case: str, line: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_profiler_jsonl([line], k=3, ladder=(2,))


# -- trtllm -------------------------------------------------------------------------------------
def test_trtllm_stats_alignment_on_recorded_fixture() -> None:
    stats = parse_iteration_stats((FIXTURES / "trtllm_iteration_stats.jsonl").read_text().splitlines())
    assert len(stats) == 45
    four = steady_decode_steps(stats, rows=4, k=3, skip=4, tail=2)
    assert [s.iteration for s in four] == [*range(5, 13), 20, 21]
    six = steady_decode_steps(stats, rows=6, k=3, skip=4, tail=2)
    assert [s.iteration for s in six] == list(range(32, 38))
    assert all(s.context_requests == 0 for s in four + six)
    assert cell_for_rows(6, ladder=(4, 8), k=3, verifier_budget=0) == CellSpec(8, 0, 3)
    assert cell_for_rows(4, ladder=(4, 8), k=3, verifier_budget=10) == CellSpec(4, 10, 3)


@pytest.mark.parametrize(
    ("case", "record", "match"),
    [
        ("no_batching_stats", {"iter": 1, "iterLatencyMS": 3.0}, "enable_iter_perf_stats"),
        (
            "nan_latency",
            {
                "iter": 1,
                "iterLatencyMS": float("nan"),
                "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 1},
            },
            "positive finite",
        ),
        ("not_json", "{", "not JSON"),
    ],
)
def test_trtllm_bad_stats(case: str, record: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_iteration_stats([record])  # type: ignore[list-item]  # the table mixes dicts and strings


def test_trtllm_rows_beyond_ladder() -> None:
    with pytest.raises(ConfigError, match="do not fit"):
        cell_for_rows(9, ladder=(4, 8), k=3, verifier_budget=0)


def test_trtllm_engine_path() -> None:
    pytest.importorskip("tensorrt_llm")
    with pytest.raises(ConfigError):
        load_backend("trtllm", {"model": "/nonexistent", "ladder": [1, 2]})


def test_plan_matches_candidates() -> None:
    assert plan_cells(k=1, ladder=(1,)) == (CellSpec(1, 0, 1), CellSpec(1, 2, 1))
