"""CPU coverage of the mixed prefill+decode proof (``benchmarks/e2e/mixed.py``, ``mixed_serving.py``).

- chunked prefill in mixed steps: mixed steps really hold context chunks and generation rows,
  about half of the steps are mixed, and the greedy outputs equal the decode-only engine's;
- a mixed step's greedy tokens do not depend on the capacity it runs in (the sweep's output check);
- the mixed arm runs a mixed cell only where the table has the step's exact geometry, a step
  without a cell runs native, and its outputs equal static K's token for token;
- ``mixed.py --tiny``: the whole proof in one process, three arms, the result file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from benchmarks.e2e import mixed, mixed_serving, pipeline, serving
from benchmarks.e2e.mixed_serving import MixedArm, MixedRun, MixedTraffic

from dspark_calibrate.artifacts import (
    MIXED_EXECUTION_MODE,
    ContextChunk,
    GenerationRequest,
    MixedGeometry,
    MixedLive,
    MixedRoute,
    MixedStep,
    RankStep,
    step_candidates,
)
from dspark_calibrate.calibrate.measurement.mixed import MixedShape
from dspark_calibrate.runtime_plugin.mixed import MixedCell, MixedCostTable
from dspark_calibrate.runtime_plugin.planner import Calibration
from tests.e2e.test_e2e_cpu import CHUNK, LADDER, MAX_NEW, K, Pair, pair
from tests.mixed_bundles import LATER, TP1_BUCKETS, MixedBundle

pytestmark = pytest.mark.slow
__all__ = ["pair"]  # the trained tiny pair, a module fixture shared with test_e2e_cpu

SIZE = 8  # context tokens per chunk: the 16-token prompts take two chunk steps
TRAFFIC = MixedTraffic(SIZE, 2, 6, tuple(range(4, 65, 4)))
ROUTE = MixedRoute(K, 1, TRAFFIC.buckets, mixed.EXECUTION_MODE, 1)


def _engine(p: Pair) -> serving.Engine:
    cfg = serving.EngineConfig(k=K, ladder=LADDER, max_len=64, gemm_chunk=CHUNK, use_graphs=False)
    engine = serving.Engine(p.target, p.drafter, cfg, torch.device("cpu"))
    mixed_serving.enlarge_caches(engine, TRAFFIC.max_decoding + TRAFFIC.prefill_slots)
    engine.prepare_cells([(g, 0) for g in LADDER])
    return engine


def _arrivals(p: Pair) -> np.ndarray:
    return mixed_serving.burst_arrivals(p.prompts.shape[0], 2, 4)


def _static(name: str = "static") -> MixedArm:
    return MixedArm(name, serving.StaticPolicy(LADDER, K))


def test_mixed_steps_hold_chunks_and_generation_rows_and_keep_greedy_output(pair: Pair) -> None:
    engine = _engine(pair)
    got = mixed_serving.serve_mixed(
        engine, pair.prompts, _arrivals(pair), traffic=TRAFFIC, max_new=MAX_NEW, arm=_static(), record=True
    )
    chunk_steps = {c.step for c in got.chunks}
    gen_steps = {r.step for r in got.records}
    mixed_steps = chunk_steps & gen_steps
    assert len(mixed_steps) == got.mixed_steps > 0
    assert all(r.mixed == (r.step in chunk_steps) for r in got.records)
    # Every prompt ran in chunks at positions 0 and 8, each in a step of its own.
    by_request: dict[int, list[int]] = {}
    for c in got.chunks:
        by_request.setdefault(c.request, []).append(c.position)
    assert all(sorted(v) == [0, SIZE] for v in by_request.values()) and len(by_request) == len(pair.prompts)
    assert 0.3 <= got.mixed_share <= 0.7, got.mixed_share
    assert got.tokens == pair.prompts.shape[0] * (MAX_NEW - 1)
    # Chunked prefill inside mixed steps gives the tokens of the decode-only engine (whole-prompt prefill).
    decode_only = serving.serve(
        _engine(pair), pair.prompts, concurrency=6, max_new=MAX_NEW, policy=serving.StaticPolicy(LADDER, K)
    )
    np.testing.assert_array_equal(got.outputs, decode_only.outputs)


def test_mixed_step_tokens_do_not_depend_on_the_capacity(pair: Pair) -> None:
    engine = _engine(pair)
    mixed_serving.register_mixed_engine(engine, TRAFFIC)
    gens = tuple(GenerationRequest(h) for h in (20, 23, 30, 17))
    context = (ContextChunk(SIZE, SIZE),)
    native = MixedShape(K, 40, context, gens, (6, 6, 6, 6))
    for rows in ((2, 3, 4, 5), (6, 2, 2, 2), (1, 1, 1, 1)):
        compact = MixedShape(K, 8 + sum(rows), context, gens, rows)
        checked, mismatches = mixed_serving.mixed_check(native, compact)
        assert checked == sum(rows) and mismatches == 0, rows
    step = mixed_serving.mixed_factory(native)
    step()  # the sweep's step runs (and is the same forward)


def _recorded_steps(got: mixed_serving.MixedRun) -> dict[int, MixedStep]:
    """Every mixed step of a recorded run, as the toolkit describes it."""
    chunks: dict[int, list[ContextChunk]] = {}
    for c in got.chunks:
        chunks.setdefault(c.step, []).append(ContextChunk(c.size, c.position))
    gens: dict[int, list[GenerationRequest]] = {}
    for r in got.records:
        if r.mixed:
            gens.setdefault(r.step, []).append(GenerationRequest(r.history))
    return {s: MixedStep((RankStep(tuple(chunks[s]), tuple(g)),)) for s, g in gens.items()}


def _candidates(step: MixedStep) -> set[MixedGeometry]:
    if any(c.position == 0 for c in step.ranks[0].context):
        return set()  # first chunks stay native
    return set(step_candidates(step.features(K), K, ROUTE.body_buckets)[1])


def test_mixed_arm_uses_cells_only_where_admitted_and_keeps_greedy_output(pair: Pair) -> None:
    engine = _engine(pair)
    arrivals = _arrivals(pair)
    recorded = mixed_serving.serve_mixed(
        engine, pair.prompts, arrivals, traffic=TRAFFIC, max_new=MAX_NEW, arm=_static(), record=True
    )
    per_step = {s: _candidates(step) for s, step in _recorded_steps(recorded).items()}
    # Hold out one compactable step whose geometries no other step shares; admit the others'.
    held = next(
        s for s, c in per_step.items() if c and all(not (c & o) for t, o in per_step.items() if t != s)
    )
    admitted = set().union(*(c for s, c in per_step.items() if s != held))
    table = MixedCostTable(ROUTE, tuple(MixedCell(g, 10.0, 1.0) for g in sorted(admitted)))
    arm = MixedArm(
        "mixed", serving.StaticPolicy(LADDER, K), table=table, calibration=Calibration.sts([1.0] * K)
    )
    got = mixed_serving.serve_mixed(
        engine, pair.prompts, arrivals, traffic=TRAFFIC, max_new=MAX_NEW, arm=arm, record=True
    )
    np.testing.assert_array_equal(got.outputs, recorded.outputs)
    assert got.mixed_cells and set(got.mixed_cells) <= {g.sha256() for g in admitted}
    assert got.reasons["compact"] == sum(got.mixed_cells.values()) > 0
    steps = _recorded_steps(got)
    uncovered = 0
    for step, kind, _, capacity, native, reason in got.step_log:
        if kind != "mixed":
            continue
        covered = bool(_candidates(steps[step]) & admitted)
        if reason == "compact":
            assert covered and capacity < native
        else:
            assert capacity == native, (reason, capacity, native)
        if not covered and _candidates(steps[step]):
            uncovered += 1
            assert reason == "no_cell"
    assert uncovered > 0, "every compactable step found a cell: the no-cell path was not exercised"
    assert got.reasons["compact"] <= got.covered_steps < got.mixed_steps
    # Without evidence every mixed step runs native.
    plain = mixed_serving.serve_mixed(
        engine, pair.prompts, arrivals, traffic=TRAFFIC, max_new=MAX_NEW, arm=_static("plain")
    )
    assert all(c == n for _, kind, _, c, n, _ in plain.step_log if kind == "mixed")
    assert set(plain.reasons) == {"native"} and plain.covered_steps == 0


def test_tiny_mixed_proof_end_to_end(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    try:
        assert mixed.main(["--tiny", "--out", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)  # run.torch_device set it for the CPU run; later tests need it off
    result = json.loads((tmp_path / "e2e_mixed.json").read_text())
    assert result["status"] == "done", result.get("error")
    assert result["identical_outputs"] is True
    for key in ("machine", "command", "commit", "gpu", "settings", "training", "verdict", "predictions"):
        assert key in result, key
    assert set(result["arms"]) == {"static", "decode_only", "decode_mixed"}
    for name, arm in result["arms"].items():
        assert len(arm["pair_gains"]) >= 3, name
        assert 0.3 <= arm["mixed_share"] <= 0.7, (name, arm["mixed_share"])
        for key in ("realised_gain", "realised_ci", "predicted_gain", "predicted_ci", "decode_cells"):
            assert key in arm, (name, key)
        if name != "static":
            assert set(arm["parts"]) == {"decode", "mixed"}, name
            assert 0 < arm["parts"]["decode"]["time_share"] < 1
    assert "mixed_aware" in result["predictions"]["decode_only"]
    for stage in (
        "train", "engine", "sweep", "traces", "workload", "fit", "overhead", "build_decode_only", "mixed_sweep",
        "build_decode_mixed", "export", "admit", "experiment",
    ):  # fmt: skip
        assert stage in result["stages"], stage
    # The workload build read is the recorded one, with its mixed companion table, every step's
    # wall time and the requests waiting for a slot (none waits long here: arrivals set the pace).
    from dspark_calibrate.calibrate.deployment.regime import infer_regime
    from dspark_calibrate.calibrate.deployment.workload import read_workload

    workload = result["stages"]["workload"]
    assert workload["mixed_steps"] > 0 and (tmp_path / "toolkit" / "workload.mixed.parquet").exists()
    values = read_workload(tmp_path / "toolkit" / "workload.parquet").step_values()
    assert values.has_times and values.has_waiting
    assert infer_regime(values.waiting).regime.value == "arrival-bound"
    assert result["stages"]["mixed_sweep"]["cells"] > 0
    # Both builds were handed the host planner's bracket runs in this loop, one mean per run.
    overhead = result["stages"]["overhead"]
    assert overhead["planner"] == "host" and len(overhead["per_step_ms"]) == 2 and overhead["cycles"] > 0
    for name in ("build_decode_only", "build_decode_mixed"):
        outcome = result["stages"][name]["outcome"]
        assert outcome["planner"] == "host" and outcome["overhead"]["per_step_ms"] == overhead["per_step_ms"]


def _built(bundle: MixedBundle) -> dict[str, Any]:
    """The build outcome the experiment records for a built bundle."""
    full = bundle.result.to_dict()
    return {
        "status": "built",
        "bundle": str(bundle.bundle),
        "summary": full["summary"],
        "mixed": full["mixed"],
    }


def test_admitted_mixed_bundle_drives_the_arms_and_predictions(
    mixed_tp1: MixedBundle, tmp_path: Path
) -> None:
    """The experiment's admission, arms, predictions and mixed export over a real one-GPU bundle
    with mixed evidence (built from synthetic sweeps, so synthetic evidence is allowed here)."""
    outcome = _built(mixed_tp1)
    full = mixed_tp1.result.to_dict()
    fingerprint = mixed_tp1.files.fingerprint
    ladder = tuple(fingerprint.rank_local_graph_batch_sizes or ())
    k = int(fingerprint.max_draft_len or 0)
    live = MixedLive(TP1_BUCKETS, MIXED_EXECUTION_MODE)
    kw: dict[str, Any] = {"now": LATER, "allow_synthetic": True}
    decision, record = mixed.admit_bundle(
        outcome, mixed_tp1.root_file, fingerprint, tmp_path / "s1.json", live, **kw
    )
    assert decision.active and record["mixed"]["active"], record
    arm = mixed.arm_of("decode_mixed", decision, ladder, k, use_mixed=True)
    assert arm.table is decision.mixed.table and arm.calibration is not None and not arm.plan_on_mixed
    plain = mixed.arm_of("decode_only", decision, ladder, k, use_mixed=False)
    assert plain.table is None and plain.plan_on_mixed
    summary, mixed_summary = full["summary"], full["mixed"]["summary"]
    got = mixed.prediction_of(outcome, decision, part="mixed")
    assert got["predicted_gain"] == mixed_summary["predicted_gain"]
    assert got["predicted_ci"] == [
        mixed_summary["predicted_gain_ci_low"],
        mixed_summary["predicted_gain_ci_high"],
    ]
    assert (
        mixed.prediction_of(outcome, decision, part="decode")["predicted_gain"] == summary["predicted_gain"]
    )
    # Mixed evidence bound to other buckets: decode stays admitted, mixed steps stay native and the
    # arm's prediction is the decode policy's.
    other = MixedLive((16, 32), MIXED_EXECUTION_MODE)
    d2, r2 = mixed.admit_bundle(outcome, mixed_tp1.root_file, fingerprint, tmp_path / "s2.json", other, **kw)
    assert d2.active and not r2["mixed"]["active"]
    assert mixed.arm_of("decode_mixed", d2, ladder, k, use_mixed=True).table is None
    assert mixed.prediction_of(outcome, d2, part="mixed")["predicted_gain"] == summary["predicted_gain"]
    # Nothing built: static K, predicted exactly 0.
    none, r3 = mixed.admit_bundle(
        {"status": "refused", "reason": "r"}, mixed_tp1.root_file, fingerprint, tmp_path / "s3.json", live
    )
    assert none is None and r3["reason_code"] == "NO_BUNDLE"
    assert isinstance(mixed.arm_of("x", none, ladder, k, use_mixed=True).decode, serving.StaticPolicy)
    assert mixed.prediction_of({"status": "refused"}, None, part="mixed")["predicted_gain"] == 0.0
    # One GPU is not TensorRT-LLM's mixed route: the mixed export is refused, with the reason.
    exported = mixed.export_mixed(
        mixed_tp1.bundle, tmp_path / "out", mixed_tp1.root_file, fingerprint, live, **kw
    )
    assert exported["status"] == "refused", exported
    assert "world size" in exported["reason"] or "K=" in exported["reason"], exported["reason"]


def test_ungated_arms_serve_the_bundles_cells_without_the_gain_test(
    mixed_tp1: MixedBundle, tmp_path: Path
) -> None:
    """``--ungated`` and the prediction matrix: the dynamic arm runs what the bundle deploys (its
    verified cells, drain guard, calibration and mixed table) whatever the economics decide."""
    from dspark_calibrate.calibrate.deployment.build import build_bundle, load_build_inputs
    from dspark_calibrate.runtime_plugin.engine import DynamicVerifier
    from tests.calibrate.build_factories import build_options

    outcome = _built(mixed_tp1)
    fp, root = mixed_tp1.files.fingerprint, mixed_tp1.root_file
    ladder, k = tuple(fp.rank_local_graph_batch_sizes or ()), int(fp.max_draft_len or 0)
    live = MixedLive(TP1_BUCKETS, MIXED_EXECUTION_MODE)
    kw: dict[str, Any] = {"now": LATER, "allow_synthetic": True}
    decision, _ = mixed.admit_bundle(outcome, root, fp, tmp_path / "s1.json", live, **kw)
    assert decision.active and decision.mixed.active
    # Where admission admits, the ungated arm is exactly the admitted selector and mixed table.
    arm = mixed.ungated_arm("x", outcome, root, fp, live, ladder, k, **kw)
    assert isinstance(arm.decode, pipeline.PlannerPolicy)
    assert arm.decode.planner.cost_table == DynamicVerifier.from_decision(decision).cost_table
    assert arm.table == decision.mixed.table and not arm.plan_on_mixed
    plain = mixed.ungated_arm("x", outcome, root, fp, None, ladder, k, **kw)
    assert plain.table is None and plain.plan_on_mixed
    # The prediction judged is the one of what the arm runs: with the mixed table, the mixed summary.
    summary, mixed_summary = outcome["summary"], outcome["mixed"]["summary"]
    got = mixed.prediction_of(outcome, None, part="mixed", served=arm)
    assert got["predicted_gain"] == mixed_summary["predicted_gain"]
    got = mixed.prediction_of(outcome, None, part="mixed", served=plain)
    assert got["predicted_gain"] == summary["predicted_gain"]
    # Economics that refuse (an overhead far above what the cells save): admission keeps static K,
    # the ungated verifier still serves the bundle's compact cells behind its drain guard.
    files = mixed_tp1.files
    refused = tmp_path / "refused"
    built = build_bundle(
        load_build_inputs([files.sweep], files.calibration, files.workload),
        refused,
        signers=list(mixed_tp1.signers),
        trust_root=mixed_tp1.root,
        options=build_options(allow_synthetic=True, overhead_ms=50.0),
    )
    assert not built.summary["admitted"]
    d2, r2 = mixed.admit_bundle(
        {"status": "built", "bundle": str(refused)}, root, fp, tmp_path / "s2.json", live, **kw
    )
    assert d2 is not None and not d2.active, r2
    verifier = pipeline.ungated_verifier(refused, root, fp, **kw)
    table = verifier.cost_table
    assert table.drain_guard is not None and any(table.compact_budgets(g) for g in table.graph_batch_sizes)
    # Gated, the deployment is static K (predicted 0); ungated, the build's own prediction is judged.
    refused_outcome = {"status": "built", "bundle": str(refused), "summary": dict(built.summary)}
    assert mixed.prediction_of(refused_outcome, d2, part="decode")["predicted_gain"] == 0.0
    served = mixed.ungated_arm("x", refused_outcome, root, fp, None, ladder, k, **kw)
    got = mixed.prediction_of(refused_outcome, d2, part="decode", served=served)
    assert got["predicted_gain"] == built.summary["predicted_gain"]
    # A bundle that does not verify is not served.
    broken = tmp_path / "broken"
    shutil.copytree(refused, broken)
    member = broken / "cost-table.parquet"
    data = bytearray(member.read_bytes())
    data[len(data) // 2] ^= 0xFF
    member.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match="does not verify"):
        pipeline.ungated_verifier(broken, root, fp, **kw)
    static = mixed.ungated_arm("x", {"status": "refused"}, root, fp, live, ladder, k, **kw)
    assert isinstance(static.decode, serving.StaticPolicy)


def test_the_overhead_bracket_takes_turns_on_decode_and_mixed_steps(pair: Pair, tmp_path: Path) -> None:
    """The forced host planner and static K alternate step by step in the mixed loop (the planner
    also on mixed steps, its plan dropped); outputs stay static K's and every run gives paired
    cycles. The recorded workload carries each step's wall time and queue depth."""
    from tests.e2e.test_e2e_cpu import _sloped_table

    args = mixed.build_parser().parse_args(["--tiny"])
    s = dataclasses.replace(mixed.make_settings(args), traffic=TRAFFIC, max_new=MAX_NEW)
    x = mixed.Experiment(s, _engine(pair), pair.prompts, _arrivals(pair))
    recorded = x.serve(_static(), record=True)
    x.reference = recorded.outputs.copy()
    forced = pipeline.PlannerPolicy(pipeline._Direct(*_sloped_table()), name="forced-host", force_native=True)
    runs = [mixed.overhead_run(x, serving.StaticPolicy(LADDER, K), forced, i) for i in range(2)]
    assert not x.mismatches
    assert [r["order"] for r in runs] == [["static", "forced-host"], ["forced-host", "static"]]
    assert all(
        r["forced-host"]["cycles"] > 0 and math.isfinite(r["forced-host"]["mean_diff_ms"]) for r in runs
    )
    workload = mixed.write_mixed_workload(recorded, tmp_path / "w.parquet", None, source="test")
    values = workload.step_values()
    assert values.has_times and values.has_waiting
    by_step = {e[0]: (e[2], q) for e, q in zip(recorded.step_log, recorded.waiting, strict=True)}
    np.testing.assert_allclose(values.step_time_ms, [by_step[int(i)][0] for i in values.step])
    np.testing.assert_array_equal(values.waiting, [by_step[int(i)][1] for i in values.step])


def test_fixed_shape_mixed_steps_equal_the_eager_forward(pair: Pair) -> None:
    from benchmarks.e2e.mixed_graphs import MixedSteps

    cfg = serving.EngineConfig(k=K, ladder=LADDER, max_len=64, gemm_chunk=CHUNK, use_graphs=False)
    engine = serving.Engine(pair.target, pair.drafter, cfg, torch.device("cpu"))
    mixed_serving.enlarge_caches(engine, TRAFFIC.max_decoding + TRAFFIC.prefill_slots + 1)
    steps = MixedSteps(engine, TRAFFIC)
    rng = np.random.default_rng(5)
    slots = engine.cache_k.shape[1]
    cases = [(4, 2, (True, False)), (6, 1, (True,)), (0, 2, (False, True)), (3, 0, ()), (1, 1, (False,))]
    for n, m, last in cases:
        windows = rng.integers(0, K + 1, size=n).astype(np.int64)
        lengths = np.zeros(slots, dtype=np.int64)
        lengths[:n] = rng.integers(10, 40, size=n)
        inputs = {
            "n": n,
            "windows": windows,
            "lengths": lengths,
            "anchors": rng.integers(32, 127, size=slots).astype(np.int64),
            "drafts": rng.integers(32, 127, size=(slots, K)).astype(np.int64),
            "chunk_slots": np.arange(TRAFFIC.max_decoding, TRAFFIC.max_decoding + m, dtype=np.int64),
            "chunk_pos": rng.choice([0, SIZE], size=m).astype(np.int64),
            "chunk_tokens": rng.integers(32, 127, size=(m, SIZE)).astype(np.int64),
            "last": np.array(last, dtype=bool),
            "keep_pred": True,
        }
        capacity = mixed_serving.paid_capacity(int(windows.sum()) + n + m * SIZE, TRAFFIC.buckets)
        want = mixed_serving.mixed_forward(engine, capacity=capacity, **inputs)
        got = steps.forward(capacity=capacity, **inputs)
        for a, b in (
            (want.gen.accepted, got.gen.accepted),
            (want.gen.bonus, got.gen.bonus),
            (want.first, got.first),
        ):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(want.pred, got.pred)
        np.testing.assert_array_equal(want.gen.drafts, got.gen.drafts)
        np.testing.assert_array_equal(want.first_drafts, got.first_drafts)
        np.testing.assert_allclose(want.gen.confidence, got.gen.confidence, atol=1e-5)
        np.testing.assert_allclose(want.first_confidence, got.first_confidence, atol=1e-5)
    with pytest.raises(ValueError, match="scratch slot"):
        MixedSteps(_engine(pair), TRAFFIC)
    with pytest.raises(KeyError, match="not a body bucket"):
        steps.forward(capacity=5, **inputs)


def test_serving_with_fixed_shape_mixed_steps_keeps_greedy_output(pair: Pair) -> None:
    from benchmarks.e2e.mixed_graphs import MixedSteps

    cfg = serving.EngineConfig(k=K, ladder=LADDER, max_len=64, gemm_chunk=CHUNK, use_graphs=False)
    engine = serving.Engine(pair.target, pair.drafter, cfg, torch.device("cpu"))
    mixed_serving.enlarge_caches(engine, TRAFFIC.max_decoding + TRAFFIC.prefill_slots + 1)
    engine.prepare_cells([(g, 0) for g in LADDER])
    eager = mixed_serving.serve_mixed(
        engine, pair.prompts, _arrivals(pair), traffic=TRAFFIC, max_new=MAX_NEW, arm=_static()
    )
    fixed = mixed_serving.serve_mixed(
        engine,
        pair.prompts,
        _arrivals(pair),
        traffic=TRAFFIC,
        max_new=MAX_NEW,
        arm=_static(),
        steps=MixedSteps(engine, TRAFFIC),
    )
    np.testing.assert_array_equal(eager.outputs, fixed.outputs)
    assert fixed.mixed_steps == eager.mixed_steps > 0 and fixed.steps == eager.steps


def test_fixed_shape_mixed_step_bodies_never_read_the_device_on_the_host(pair: Pair) -> None:
    from benchmarks.e2e.mixed_graphs import MixedSteps
    from torch.profiler import ProfilerActivity, profile

    cfg = serving.EngineConfig(k=K, ladder=LADDER, max_len=64, gemm_chunk=CHUNK, use_graphs=False)
    engine = serving.Engine(pair.target, pair.drafter, cfg, torch.device("cpu"))
    mixed_serving.enlarge_caches(engine, TRAFFIC.max_decoding + TRAFFIC.prefill_slots + 1)
    steps = MixedSteps(engine, TRAFFIC)
    steps.prepare([TRAFFIC.buckets[0], TRAFFIC.buckets[-1]])
    syncing = {"aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select"}
    for bucket, step in steps._steps.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            step["run"]()
        assert not {e.name for e in prof.events()} & syncing, bucket


def _run(
    decode_s: float, mixed_s: float, log: Sequence[tuple[int, str, float, int, int, str]] = ()
) -> MixedRun:
    return MixedRun(
        "arm",
        np.zeros((1, 1), dtype=np.int64),
        seconds=decode_s + mixed_s,
        decode_seconds=decode_s,
        mixed_seconds=mixed_s,
        step_log=list(log),
    )


def test_part_gains_split_the_realised_gain_and_judge_each_part() -> None:
    """Known truth: the arm is 5% faster on decode steps and 3% slower on mixed ones, every round."""
    static = [_run(1.0 + 0.01 * i, 2.0 + 0.02 * i) for i in range(4)]
    arm = [_run(r.decode_seconds / 1.05, r.mixed_seconds / (1 - 0.03)) for r in static]
    prediction = {
        "predicted_gain": -0.02,
        "mixed_aware": {
            "decode_part": {"predicted_gain": 0.01, "ci_low": 0.0, "ci_high": 0.02},
            "mixed_part": {"predicted_gain": -0.033, "ci_low": -0.034, "ci_high": -0.032},
        },
    }
    parts = mixed.part_gains(static, arm, prediction)
    assert parts["decode"]["realised_gain"] == pytest.approx(0.05)
    assert parts["mixed"]["realised_gain"] == pytest.approx(-0.03)
    assert parts["decode"]["error_pp"] == pytest.approx(4.0)
    assert parts["mixed"]["predicted_ci"] == [-0.034, -0.032]
    share = arm[0].decode_seconds / arm[0].seconds
    assert parts["decode"]["time_share"] == pytest.approx(share, rel=0.01)
    # Without a split in the prediction, the realised parts are still reported.
    assert "predicted_gain" not in mixed.part_gains(static, arm, {"predicted_gain": 0.0})["decode"]


def test_decode_cells_compare_serving_with_the_table() -> None:
    log = [
        (0, "decode", 4.0, 64, 0, ""),
        (1, "mixed", 7.0, 768, 896, "native"),
        (2, "decode", 3.0, 64, 256, ""),
    ]
    runs = [
        _run(0.007, 0.007, log),
        _run(0.007, 0.007, [(0, "decode", 2.0, 64, 256, ""), (1, "decode", 5.0, 8, 0, "")]),
    ]
    got = mixed.decode_cells(runs, {(64, 0): 3.6, (64, 256): 2.4})
    assert got["cells"]["64/256"] == {"steps": 2, "realised_ms": 2.5, "table_ms": 2.4}
    assert got["cells"]["8/0"]["table_ms"] is None  # served, not measured: left out of the ratio
    assert got["realised_over_table_time"] == pytest.approx((4.0 + 5.0) / (3.6 + 4.8))
    assert mixed.decode_cells([], {})["realised_over_table_time"] is None
