"""CPU coverage of the end-to-end experiment (``benchmarks/e2e``): the serving mechanics the GPU run
relies on, and the whole pipeline with ``--tiny``.

- KV-cache rewind: greedy decoding with drafts, rejections and rewinds equals a no-cache reference
  that recomputes the whole sequence for every token;
- packed ragged verification: one packed step over rows with different windows gives each row the
  logits and outcome it gets when verified alone;
- dynamic verification driven by the toolkit's reference planner produces exactly the static-K
  tokens while it really trims windows;
- ``run.py --tiny``: training, engine, sweep (module backend), traces, workloads, fit, keys, build,
  admit, the A/B experiment and the result file, in one process.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from benchmarks.e2e import bracket, data, model, pipeline, run, serving

from dspark_calibrate.runtime_plugin.planner import Calibration, CostTable, DrainGuard

pytestmark = pytest.mark.slow

K = 5
LADDER = (2, 4, 8)
PROMPT = 16
MAX_NEW = 20
#: Tokens per GEMM launch in these tests: small and not a divisor of most V, so padding is exercised.
CHUNK = 4


@dataclasses.dataclass
class Pair:
    target: model.TargetLM
    drafter: model.Drafter
    prompts: np.ndarray


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    """A briefly trained tiny target and drafter (structured enough for mixed acceptance)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    preset = dataclasses.replace(
        model.PRESETS["tiny"], target_steps=60, drafter_steps=60, rollout_prompts=32, rollout_new=24
    )
    corpus = data.load_corpus(preset.corpus_bytes)
    held = np.frombuffer(b"".join(corpus.heldout[:5]), dtype=np.uint8)
    cpu = torch.device("cpu")
    target = model.TargetLM(preset.model)
    model.train_target(target, corpus.train, held, preset, seed=0, device=cpu, log=lambda _: None)
    target.eval()
    drafter = model.Drafter(model.DrafterConfig(d_target=preset.model.d_model, d_draft=preset.d_draft, k=K))
    rollout = torch.from_numpy(data.sample_prompts(corpus.heldout, preset.rollout_prompts, PROMPT, seed=1))
    model.train_drafter(drafter, target, rollout, preset, seed=0, device=cpu, log=lambda _: None)
    drafter.eval()
    yield Pair(target, drafter, data.sample_prompts(corpus.heldout, 12, PROMPT, seed=2))
    torch.set_num_threads(threads)
    # Processor state, not torch state: left on, later tests in this worker (hypothesis floats
    # among them) would see subnormals flushed to zero. Off is the process default.
    torch.set_flush_denormal(False)


def _engine(p: Pair) -> serving.Engine:
    cfg = serving.EngineConfig(k=K, ladder=LADDER, max_len=64, gemm_chunk=CHUNK, use_graphs=False)
    engine = serving.Engine(p.target, p.drafter, cfg, torch.device("cpu"))
    cells = [(g, 0) for g in LADDER] + [(g, v) for g in LADDER for v in range(g + 1, g * (K + 1))]
    engine.prepare_cells(cells)
    return engine


@torch.no_grad()
def _no_cache_greedy(target: model.TargetLM, prompt: np.ndarray, n: int) -> np.ndarray:
    seq = torch.from_numpy(prompt).clone()
    out = []
    for _ in range(n):
        _, logits = target.forward_train(seq[None])
        tok = logits[0, -1].argmax()
        out.append(int(tok))
        seq = torch.cat([seq, tok[None]])
    return np.array(out)


def test_kv_rewind_matches_no_cache_reference(pair: Pair) -> None:
    engine = _engine(pair)
    result = serving.serve(
        engine,
        pair.prompts,
        concurrency=4,
        max_new=MAX_NEW,
        policy=serving.StaticPolicy(LADDER, K),
        record=True,
    )
    rejected = sum(r.accepted < r.verified for r in result.records)
    accepted = sum(r.accepted > 0 for r in result.records)
    assert rejected > 0, "no draft was rejected, so no rewind happened"
    assert accepted > 0, "no draft was accepted, so no multi-token step happened"
    for i, prompt in enumerate(pair.prompts):
        np.testing.assert_array_equal(result.outputs[i], _no_cache_greedy(pair.target, prompt, MAX_NEW))


def _prefilled(engine: serving.Engine, prompts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    first = engine.prefill(np.arange(prompts.shape[0]), prompts)
    slots = engine.cfg.slots
    lengths = np.full(slots, PROMPT, dtype=np.int64)
    anchors = np.zeros(slots, dtype=np.int64)
    drafts = np.zeros((slots, K), dtype=np.int64)
    anchors[: prompts.shape[0]] = first.bonus
    drafts[: prompts.shape[0]] = first.drafts
    return lengths, anchors, drafts


def test_packed_ragged_verification_equals_per_request(pair: Pair) -> None:
    prompts = pair.prompts[:6]
    windows = np.array([0, 1, 3, 5, 2, 4], dtype=np.int64)
    packed_engine = _engine(pair)
    lengths, anchors, drafts = _prefilled(packed_engine, prompts)
    g, pad_len = 8, 2
    v = int((windows + 1).sum()) + (g - len(windows)) * pad_len
    packed, logits = packed_engine.verify_logits(g, v, len(windows), windows, lengths, anchors, drafts)
    starts = np.concatenate([[0], np.cumsum(windows + 1)[:-1]])
    for i, w in enumerate(windows):
        alone = _engine(pair)
        l1, a1, d1 = _prefilled(alone, prompts[i : i + 1])
        np.testing.assert_array_equal(a1[:1], anchors[i : i + 1])
        single_v = int(w) + 1 + pad_len  # G=2: the request plus one pad row
        one, one_logits = alone.verify_logits(2, single_v, 1, windows[i : i + 1], l1, a1, d1)
        rows = logits[starts[i] : starts[i] + w + 1]
        torch.testing.assert_close(rows, one_logits[: w + 1], rtol=0.0, atol=1e-5)
        assert torch.equal(rows.argmax(-1), one_logits[: w + 1].argmax(-1))
        assert int(packed.accepted[i]) == int(one.accepted[0]) <= w
        assert int(packed.bonus[i]) == int(one.bonus[0])
        np.testing.assert_array_equal(packed.drafts[i], one.drafts[0])


def _sloped_planner() -> pipeline.PlannerPolicy:
    # Compact cells far cheaper than native and a lenient drain guard: the planner trims often.
    return pipeline.direct_policy(*_sloped_table())


def test_planner_driven_dynamic_verification_keeps_greedy_output(pair: Pair) -> None:
    engine = _engine(pair)
    static = serving.serve(
        engine, pair.prompts, concurrency=8, max_new=MAX_NEW, policy=serving.StaticPolicy(LADDER, K)
    )
    dynamic = serving.serve(engine, pair.prompts, concurrency=8, max_new=MAX_NEW, policy=_sloped_planner())
    compact = sum(c for (_, v), c in dynamic.cells.items() if v != 0)
    assert compact > 0, f"the planner never trimmed: {dict(dynamic.cells)}"
    assert dynamic.verified_tokens < static.verified_tokens
    np.testing.assert_array_equal(dynamic.outputs, static.outputs)
    assert dynamic.decode_tokens == static.decode_tokens == pair.prompts.shape[0] * (MAX_NEW - 1)


def _sloped_table() -> tuple[CostTable, Calibration]:
    cells: dict[tuple[int, int], float] = {}
    for g in LADDER:
        cells[(g, 0)] = 1.0 + 1.0 * g * (K + 1)
        for m in (2, 3, 4):
            cells[(g, m * g)] = 1.0 + 0.1 * g * m
    table = CostTable.from_cells(K, cells, drain_guard=DrainGuard(1.0, 100.0, 0.0, min(LADDER)))
    return table, Calibration.sts([1.0] * K)


@pytest.mark.parametrize("mode", ["lagged", "sync", "fused"])
def test_device_planner_drives_the_engine_and_keeps_greedy_output(pair: Pair, mode: str) -> None:
    from dspark_calibrate.runtime_plugin.device_planner import DevicePlanner, ServingPlanner
    from dspark_calibrate.runtime_plugin.fused_planner import FusedServingPlanner

    engine = _engine(pair)
    table, calibration = _sloped_table()
    static = serving.serve(
        engine, pair.prompts, concurrency=8, max_new=MAX_NEW, policy=serving.StaticPolicy(LADDER, K)
    )
    policy: serving.Policy
    if mode == "fused":
        policy = pipeline.FusedPlannerPolicy(FusedServingPlanner(DevicePlanner(table, calibration)), engine)
        lagged = pipeline.DevicePlannerPolicy(ServingPlanner(DevicePlanner(table, calibration)), engine)
        same = serving.serve(engine, pair.prompts, concurrency=8, max_new=MAX_NEW, policy=lagged)
    else:
        policy = pipeline.DevicePlannerPolicy(
            ServingPlanner(DevicePlanner(table, calibration), mode=mode), engine
        )
    dynamic = serving.serve(engine, pair.prompts, concurrency=8, max_new=MAX_NEW, policy=policy)
    host = serving.serve(engine, pair.prompts, concurrency=8, max_new=MAX_NEW, policy=_sloped_planner())
    compact = sum(c for (_, v), c in dynamic.cells.items() if v != 0)
    assert compact > 0, f"the device planner never trimmed: {dict(dynamic.cells)}"
    np.testing.assert_array_equal(dynamic.outputs, static.outputs)
    stats = dynamic.planner_stats
    assert stats["steps"] == dynamic.steps and stats["non_finite_steps"] == 0
    assert static.verified_tokens > dynamic.verified_tokens == stats["verified_tokens"]
    if mode == "sync":  # the same-step decision: exactly the host planner's cells and windows
        assert dynamic.cells == host.cells and dynamic.verified_tokens == host.verified_tokens
    else:
        assert stats["committed_compact_steps"] == compact
    if mode == "fused":  # in the engine's own cell steps: exactly the lagged planner's steps
        assert dynamic.cells == same.cells and dynamic.verified_tokens == same.verified_tokens
        assert stats["lag_disagreements"] == same.planner_stats["lag_disagreements"]


def test_cycle_policy_and_forced_arms_verify_every_draft(pair: Pair) -> None:
    from dspark_calibrate.runtime_plugin.device_planner import DevicePlanner, ServingPlanner
    from dspark_calibrate.runtime_plugin.fused_planner import FusedServingPlanner

    engine = _engine(pair)
    table, calibration = _sloped_table()
    static = serving.StaticPolicy(LADDER, K)
    host = pipeline.PlannerPolicy(pipeline._Direct(table, calibration), name="forced-host", force_native=True)
    device = pipeline.DevicePlannerPolicy(
        ServingPlanner(DevicePlanner(table, calibration), force_native=True), engine, name="forced-device"
    )
    fused = pipeline.FusedPlannerPolicy(
        FusedServingPlanner(DevicePlanner(table, calibration), force_native=True), engine, name="forced-fused"
    )
    ref = serving.serve(engine, pair.prompts, concurrency=8, max_new=MAX_NEW, policy=static)
    cycle = serving.CyclePolicy([static, host, device, fused], order=(2, 0, 3, 1))
    run_ = serving.serve(engine, pair.prompts, concurrency=8, max_new=MAX_NEW, policy=cycle, log_steps=True)
    np.testing.assert_array_equal(run_.outputs, ref.outputs)
    assert run_.steps == ref.steps and all(v == 0 for (_, v) in run_.cells)
    assert [arm for *_, arm in run_.step_log[:8]] == [2, 0, 3, 1, 2, 0, 3, 1]
    assert run_.verified_tokens == ref.verified_tokens
    arms = run_.planner_stats["arms"]
    assert arms["forced-device"]["selected_compact_steps"] > 0
    # Each fused arm sees its own step's decision, whichever arm ran between.
    assert arms["forced-fused"]["selected_compact_steps"] > 0 and arms["forced-fused"]["snapshot_late"] == 0
    est = bracket.run_estimate(run_.step_log, ["static", "forced-host", "forced-device", "forced-fused"])
    assert est["forced-host"]["cycles"] == est["forced-device"]["cycles"] == est["forced-fused"]["cycles"] > 0
    with pytest.raises(ValueError, match="permutation"):
        serving.CyclePolicy([static, host], order=(0, 0))


def test_cell_graph_bodies_never_read_the_device_on_the_host(pair: Pair) -> None:
    from torch.profiler import ProfilerActivity, profile

    engine = _engine(pair)
    syncing = {"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select"}
    for cell in ((8, 0), (8, 20), (4, 9)):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            engine._cells[cell]()
        assert not {e.name for e in prof.events()} & syncing, cell


def test_tiny_pipeline_end_to_end(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    try:
        assert run.main(["--tiny", "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)  # run.torch_device set it for the CPU run; later tests need it off
    result = json.loads((tmp_path / "e2e.json").read_text())
    assert result["status"] == "done"
    assert result["identical_outputs"] is True
    for key in ("training", "gpu", "command", "commit", "verdict", "settings"):
        assert key in result
    assert set(result["training"]) == {"target", "drafter"}
    assert len(result["levels"]) >= 3
    for level in result["levels"].values():
        for key in (
            "static_tok_s",
            "dynamic_tok_s",
            "realised_gain",
            "realised_ci",
            "predicted_gain",
            "predicted_ci",
        ):
            assert key in level, key
        assert level["pairs"] >= 3
        assert level["agreement"] in ("within_band", "miss", "undecided")
        assert level["identical_outputs"] is True
    for stage in (
        "train", "engine", "sweep", "traces", "workloads", "fit", "bracket", "build", "admit", "lag", "experiment",
    ):  # fmt: skip
        assert stage in result["stages"], stage
    # The overhead bracket ran both planners (the device one on the CPU here) before build, and
    # build was handed the dynamic arm's runs (one mean each) naming the planner it serves with.
    for c, lv in result["stages"]["bracket"]["levels"].items():
        assert set(lv["arms"]) == {"forced-host", "forced-device-fused+compile"}, c
        assert lv["dynamic_arm"] == "forced-device-fused+compile"
        arm = lv["arms"]["forced-device-fused+compile"]
        assert arm["runs"] >= 2 and arm["cycles"] > 0
        charged = result["stages"]["build"]["overhead"][c]
        assert charged["planner"] == "fused"
        assert charged["per_step_ms"] == pytest.approx(arm["per_run_ms"])
        assert charged["source"].startswith(f"serving-loop release bracket at concurrency {c}")
        built = result["stages"]["build"]["levels"][c]
        assert built["planner"] == "fused" and built["overhead"]["per_step_ms"] == charged["per_step_ms"]
    # Every recorded workload carries each step's wall time and queue depth (build's regime input).
    from dspark_calibrate.calibrate.deployment.workload import read_workload

    for c in result["levels"]:
        values = read_workload(tmp_path / "toolkit" / f"workload-c{c}.parquet").step_values()
        assert values.has_times and values.has_waiting, c
        assert values.waiting[0] > 0 and values.waiting[-1] == 0  # queued at the start, drained at the end
    for c, lag in result["stages"]["lag"]["levels"].items():
        assert 0.0 <= lag["disagreement_rate"] <= 1.0 and lag["steps"] > 0, c
    toolkit = tmp_path / "toolkit"
    for name in ("sweep.parquet", "traces.parquet", "root.json", "fit/calibration.parquet"):
        assert (toolkit / name).exists(), name
    assert (tmp_path / "e2e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_experiment_serves_the_host_planner_beside_a_fused_device_arm(pair: Pair, tmp_path: Path) -> None:
    from dspark_calibrate.runtime_plugin.device_planner import DevicePlanner
    from dspark_calibrate.runtime_plugin.fused_planner import FusedServingPlanner

    engine = _engine(pair)
    table, calibration = _sloped_table()
    s = dataclasses.replace(
        run.make_settings(run.build_parser("t").parse_args(["--tiny"])), max_new=MAX_NEW, pairs=3
    )
    fused = pipeline.FusedPlannerPolicy(FusedServingPlanner(DevicePlanner(table, calibration)), engine)
    ref = serving.serve(
        engine, pair.prompts, concurrency=8, max_new=MAX_NEW, policy=serving.StaticPolicy(LADDER, K)
    )
    lv = run.Level(
        8, pair.prompts, reference=ref.outputs, policy=fused, verifier=pipeline._Direct(table, calibration)
    )
    run.stage_experiment(s, engine, [lv], run.Recorder(tmp_path), deadline=float("inf"))
    assert len(lv.pairs) == len(lv.host_runs) == 3 and not lv.mismatches
    assert all(h.policy == "dynamic-host" for h in lv.host_runs)
    assert any(v for b in (p[1] for p in lv.pairs) for (_, v) in b.cells)  # the fused arm trimmed


def test_fused_policies_never_share_an_engine_token(pair: Pair) -> None:
    import gc

    from dspark_calibrate.runtime_plugin.device_planner import DevicePlanner
    from dspark_calibrate.runtime_plugin.fused_planner import FusedServingPlanner

    engine = _engine(pair)
    table, calibration = _sloped_table()
    seen = set()
    for _ in range(3):  # each planner gone before the next: an id() would come back, a token must not
        policy = pipeline.FusedPlannerPolicy(
            FusedServingPlanner(DevicePlanner(table, calibration), force_native=True), engine
        )
        assert policy.token not in seen
        seen.add(policy.token)
        del policy
        gc.collect()
