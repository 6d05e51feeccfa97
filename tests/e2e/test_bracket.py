"""The overhead bracket's statistics (``benchmarks/e2e/bracket.py``) on simulated runs with a known truth.

A simulated run is a step log as the serving loop writes it: arms cycling step by step in the
run's order, a step time that drifts, jumps with the batch (G) and is slower at some places of a
cycle, plus each arm's true overhead with a per-run random part. The interval's coverage of the
true mean overhead is measured, and the rotation of orders is shown to remove a place effect.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from benchmarks.e2e import bracket

ARMS = ["static", "forced-host", "forced-device"]
TRUE = {"forced-host": 0.27, "forced-device": 0.04}  # ms per step


def _simulated_log(
    rng: np.random.Generator, order: tuple[int, ...], *, steps: int = 300, place_effect: float = 0.0
) -> list[tuple[float, int, int, int]]:
    run_offset = {a: rng.normal(0.0, 0.01) for a in TRUE}  # per-run part of each overhead
    level, log = 8.0, []
    for i in range(steps):
        level += rng.normal(0.0, 0.01)  # drift (heat, clocks)
        g = 256 if i < 0.8 * steps else 128  # the tail of a run drains to a smaller G
        arm = order[i % len(order)]
        t = level * (1.0 if g == 256 else 0.6) + rng.normal(0.0, 0.05)
        if i % len(order) == 0:
            t += place_effect  # e.g. the first step of every cycle follows the slot refill
        if arm:
            t += TRUE[ARMS[arm]] + run_offset[ARMS[arm]]
        log.append((t, g, 0, arm))
    return log


def _bracket(rng: np.random.Generator, runs: int, place_effect: float = 0.0, rotate: bool = True) -> dict:
    ests = []
    for r in range(runs):
        order = bracket.cycle_order(r if rotate else 0, len(ARMS))
        ests.append(bracket.run_estimate(_simulated_log(rng, order, place_effect=place_effect), ARMS))
    return bracket.summarize(ests, ARMS)


@pytest.mark.slow
def test_interval_covers_the_true_overhead_at_its_level() -> None:
    rng = np.random.default_rng(7)
    trials, covered, means = 600, {a: 0 for a in TRUE}, {a: [] for a in TRUE}
    for _ in range(trials):
        summary = _bracket(rng, runs=6)
        for a, truth in TRUE.items():
            lo, hi = summary[a]["ci"]
            covered[a] += lo <= truth <= hi
            means[a].append(summary[a]["overhead_ms"])
    for a, truth in TRUE.items():
        assert 0.92 <= covered[a] / trials <= 0.98, (a, covered[a] / trials)
        assert abs(np.mean(means[a]) - truth) < 0.003, a


def test_rotating_the_order_removes_a_place_effect() -> None:
    rng = np.random.default_rng(11)
    fixed = [
        _bracket(rng, runs=6, place_effect=0.2, rotate=False)["forced-host"]["overhead_ms"] for _ in range(40)
    ]
    rotated = [
        _bracket(rng, runs=6, place_effect=0.2, rotate=True)["forced-host"]["overhead_ms"] for _ in range(40)
    ]
    assert abs(np.mean(fixed) - TRUE["forced-host"]) > 0.1  # static always first: it pays the effect
    assert abs(np.mean(rotated) - TRUE["forced-host"]) < 0.01


def test_cycles_mixing_graph_batch_sizes_or_compact_steps_are_not_paired() -> None:
    log = [(1.0, 8, 0, 0), (1.5, 8, 0, 1), (2.0, 16, 0, 0), (2.6, 8, 0, 1), (3.0, 8, 0, 0), (3.9, 8, 16, 1)]
    est = bracket.run_estimate(log, ["static", "arm"])
    assert est["arm"]["cycles"] == 1 and est["arm"]["mean_diff_ms"] == pytest.approx(0.5)
    empty = bracket.summarize([bracket.run_estimate([], ["static", "arm"])], ["static", "arm"])
    assert empty["arm"]["runs"] == 0 and math.isnan(empty["arm"]["overhead_ms"])


def test_overhead_evidence_hands_build_the_runs_and_says_how_they_were_measured() -> None:
    arm = _bracket(np.random.default_rng(1), runs=3)["forced-device"]
    text = bracket.overhead_source("forced-device", arm, "at concurrency 256")
    assert text.startswith("serving-loop release bracket at concurrency 256")
    assert "3 runs" in text and "Student-t" in text
    evidence = bracket.overhead_evidence("fused", "forced-device", arm, "at concurrency 256")
    assert evidence is not None and evidence.planner == "fused" and evidence.source == text
    assert evidence.per_step_ms == tuple(arm["per_run_ms"]) and len(evidence.per_step_ms) == 3
    # A run without a usable cycle is left out; below two runs there is no spread to hand over.
    one = {**arm, "per_run_ms": [0.04, math.nan]}
    assert bracket.overhead_evidence("fused", "forced-device", one, "at concurrency 8") is None


def test_level_report_compares_both_planners_on_the_same_static_runs() -> None:
    from benchmarks.e2e import analysis
    from benchmarks.e2e.serving import RunResult

    def run(policy: str, tokens: int, seconds: float) -> RunResult:
        r = RunResult(policy=policy, concurrency=8, outputs=np.zeros((1, 1), dtype=np.int64))
        r.decode_tokens, r.decode_seconds, r.steps = tokens, seconds, 10
        r.cells[(8, 0)] = 10
        return r

    pairs = [
        (run("static", 1000, 1.0 + 0.01 * i), run("dynamic-device-lagged", 1000, 0.95 + 0.01 * i))
        for i in range(4)
    ]
    host = [run("dynamic-host", 1000, 0.98 + 0.01 * i) for i in range(4)]
    predicted = {"predicted_gain": 0.04, "predicted_ci": (0.02, 0.06), "source": "test"}
    report = analysis.level_report(8, pairs, predicted, {(8, 0): 100.0}, host_runs=host)
    hp = report["host_planner"]
    assert hp["realised_gain"] == pytest.approx(
        np.mean([(1.0 + 0.01 * i) / (0.98 + 0.01 * i) - 1 for i in range(4)])
    )
    assert hp["device_over_host_goodput"] > 0 and hp["device_over_host_ci"][0] > 0
    assert "host_planner" not in analysis.level_report(8, pairs, predicted, {(8, 0): 100.0})
