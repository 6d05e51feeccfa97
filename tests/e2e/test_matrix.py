"""The prediction matrix (``benchmarks/e2e/matrix.py``): how runs are judged and summarised, and the
whole benchmark with ``--tiny``.

- the realised gain measures the objective the prediction states (throughput or latency);
- the confidence path's cost in the arms (native steps of the dynamic arm against static K's of the
  same shape) recovers a known per-step cost, and its interval over rounds covers it;
- each target of the summary is evaluated, one table row per way a matrix can miss it;
- seeded arrivals keep the traffic's shape and change with the seed;
- ``matrix.py --tiny``, part by part into one work directory: every run carries every field, and
  the second part merges into the first part's file.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from benchmarks.e2e import analysis, matrix
from benchmarks.e2e.mixed_serving import MixedRun
from benchmarks.e2e.serving import RunResult

#: The fields every run of the matrix records (issue 27).
REQUIRED = {
    "regime": str,
    "seed": int,
    "concurrency": int,
    "mixed_share": float,
    "objective": str,
    "predicted_gain": float,
    "predicted_ci": list,
    "realised_gain": float,
    "realised_ci": list,
    "gated_decision": str,
    "overhead_charged_ms": float,
    "overhead_realised_ms": float,
}


def _decode_run(
    tokens: int, seconds: float, cells: dict[tuple[int, int], tuple[int, float]] | None = None
) -> RunResult:
    r = RunResult(policy="p", concurrency=8, outputs=np.zeros((1, 1), dtype=np.int64))
    r.decode_tokens, r.decode_seconds = tokens, seconds
    for cell, (n, ms) in (cells or {}).items():
        r.cells[cell] += n
        r.cell_seconds[cell] += ms / 1000.0
        r.steps += n
    return r


def _mixed_run(
    tokens: int, seconds: float, log: list[tuple[int, str, float, int, int, str]] | None = None
) -> MixedRun:
    r = MixedRun(arm="a", outputs=np.zeros((1, 1), dtype=np.int64))
    r.tokens, r.seconds, r.step_log = tokens, seconds, log or []
    r.steps = len(r.step_log)
    return r


def test_realised_gain_measures_the_objective_the_prediction_states() -> None:
    # The dynamic arm emits 2% fewer tokens in 5% less time (a decode run's saturated view).
    static, dynamic = _decode_run(1000, 1.0), _decode_run(980, 0.95)
    assert matrix.realised_gain("throughput", static, dynamic) == pytest.approx((980 / 0.95) / 1000 - 1)
    assert matrix.realised_gain("latency", static, dynamic) == pytest.approx(1.0 / 0.95 - 1)
    # With prefill traffic, every step's time counts (mixed and prefill-only steps included).
    static_m, dynamic_m = _mixed_run(500, 2.0), _mixed_run(500, 1.9)
    assert matrix.realised_gain("latency", static_m, dynamic_m) == pytest.approx(2.0 / 1.9 - 1)
    assert matrix.realised_gain("throughput", static_m, dynamic_m) == pytest.approx(2.0 / 1.9 - 1)


def test_native_times_keep_the_native_shapes_only() -> None:
    decode = _decode_run(1, 1.0, {(8, 0): (10, 40.0), (8, 16): (5, 15.0), (64, 0): (2, 8.0)})
    assert matrix.native_times(decode) == {
        (8, 0): (10, pytest.approx(40.0)),
        (64, 0): (2, pytest.approx(8.0)),
    }
    log = [
        (0, "prefill", 5.0, 384, 384, "native"),  # plans nothing: not a confidence-path step
        (1, "mixed", 7.0, 512, 512, "native"),
        (2, "mixed", 6.0, 384, 512, "compact"),  # ran an admitted cell, not native
        (3, "decode", 3.0, 32, 0, ""),
        (4, "decode", 2.5, 32, 96, ""),
        (5, "mixed", 9.0, 512, 512, "native"),
    ]
    assert matrix.native_times(_mixed_run(1, 1.0, log)) == {
        ("mixed", 512): (2, 16.0),
        ("decode", 32): (1, 3.0),
    }
    assert matrix.compact_share([_mixed_run(1, 1.0, log)]) == pytest.approx(1 / 6)  # the compact decode step
    assert matrix.compact_share([decode]) == pytest.approx(5 / 17)


def _pair(
    rng: np.random.Generator, overhead: float
) -> tuple[dict[Any, tuple[int, float]], dict[Any, tuple[int, float]]]:
    """One round: each arm's own level (drift between runs), the dynamic arm's native steps a
    random subset of shapes, paying ``overhead`` ms on top of the same step."""
    base = {("decode", 64): 3.6, ("decode", 32): 2.9, ("mixed", 640): 7.2}
    static, dynamic = {}, {}
    for arm, extra in ((static, 0.0), (dynamic, overhead)):
        level = 1.0 + rng.normal(0.0, 0.01)
        for key, ms in base.items():
            n = int(rng.integers(20, 120))
            times = ms * level + extra + rng.normal(0.0, 0.15, size=n)
            arm[key] = (n, float(times.sum()))
    return static, dynamic


def test_the_confidence_path_cost_in_the_arms_recovers_a_known_truth() -> None:
    rng = np.random.default_rng(5)
    truth, trials, covered, means = 0.10, 400, 0, []
    for _ in range(trials):
        est = [analysis.native_overhead_ms(*_pair(rng, truth)) for _ in range(8)]
        mean, lo, hi = analysis.t_interval(est)
        covered += lo <= truth <= hi
        means.append(mean)
    assert 0.92 <= covered / trials <= 0.98, covered / trials
    assert abs(np.mean(means) - truth) < 0.003
    # Shapes only one arm ran are left out; nothing shared gives no estimate.
    assert analysis.native_overhead_ms(
        {(8, 0): (4, 10.0)}, {(8, 0): (2, 5.4), (16, 0): (3, 99.0)}
    ) == pytest.approx(0.2)
    assert math.isnan(analysis.native_overhead_ms({(8, 0): (4, 10.0)}, {(16, 0): (3, 9.0)}))


def _entry(rid: str, seed: int, **overrides: Any) -> dict[str, Any]:
    e: dict[str, Any] = {
        "id": f"{rid}-s{seed}",
        "seed": seed,
        "predicted_gain": 0.03,
        "predicted_ci": [0.01, 0.05],
        "realised_gain": 0.035,
        "realised_ci": [0.02, 0.05],
        "gated_decision": "admit",
        "dynamic_ran": True,
        "rounds": 5,
    }
    e.update(overrides)
    e["error_pp"] = 100.0 * (e["realised_gain"] - e["predicted_gain"])
    lo, hi = e["predicted_ci"]
    e["inside_predicted_ci"] = lo <= e["realised_gain"] <= hi
    return e


CONFIGS = ["decode-c256", "decode-c64", "mixed-50", "mixed-25"]


def _matrix(**changes: dict[str, Any]) -> list[dict[str, Any]]:
    """Eight good runs; ``changes`` maps a run id to what is different about it."""
    out = []
    for c in CONFIGS:
        for seed in (1, 2):
            rid = f"{c}-s{seed}"
            if changes.get(rid) != {"absent": True}:
                out.append(_entry(c, seed, **changes.get(rid, {})))
    return out


@pytest.mark.parametrize(
    ("runs", "failed"),
    [
        pytest.param(_matrix(), set(), id="all-good"),
        pytest.param(
            _matrix(**{"decode-c64-s1": {"realised_gain": 0.075, "realised_ci": [0.07, 0.08]}}),
            {"max_abs_error_pp"},
            id="one-run-4.5pp-off",
        ),
        pytest.param(
            _matrix(**{f"{c}-s1": {"realised_gain": 0.052, "realised_ci": [0.05, 0.055]} for c in CONFIGS}),
            {"inside_predicted_ci_share"},
            id="half-the-runs-outside-their-interval",
        ),
        pytest.param(
            _matrix(
                **{
                    rid: {"realised_gain": 0.049, "realised_ci": [0.045, 0.053]}
                    for rid in (
                        "decode-c256-s1",
                        "decode-c256-s2",
                        "decode-c64-s1",
                        "mixed-50-s1",
                        "mixed-25-s2",
                    )
                }
            ),
            {"median_abs_error_pp"},
            id="most-runs-2pp-off-inside-wide-intervals",
        ),
        pytest.param(
            _matrix(**{"mixed-25-s2": {"realised_gain": 0.01, "realised_ci": [-0.004, 0.024]}}),
            {"admitted_with_realised_low_below_0"},
            id="admitted-run-whose-realised-low-is-below-0",
        ),
        pytest.param(
            _matrix(**{"decode-c64-s1": {"gated_decision": "refuse", "realised_ci": [0.025, 0.045]}}),
            set(),
            id="one-refused-run-with-a-missed-gain-is-allowed",
        ),
        pytest.param(
            _matrix(
                **{
                    f"decode-c64-s{s}": {"gated_decision": "refuse", "realised_ci": [0.025, 0.045]}
                    for s in (1, 2)
                }
            ),
            {"refused_with_realised_low_above_2pct"},
            id="two-refused-runs-with-missed-gains",
        ),
        pytest.param(
            _matrix(**{"mixed-50-s2": {"absent": True}}),
            {"runs_cover_every_config_and_seed"},
            id="a-run-missing",
        ),
        pytest.param(
            _matrix(**{"mixed-50-s2": {"rounds": 2}}),
            {"runs_cover_every_config_and_seed"},
            id="a-run-with-two-rounds-is-not-judged",
        ),
        pytest.param(
            _matrix(
                **{
                    "decode-c64-s2": {
                        "dynamic_ran": False,
                        "predicted_gain": 0.0,
                        "predicted_ci": [0.0, 0.0],
                        "realised_gain": 0.004,
                        "realised_ci": [-0.01, 0.018],
                        "gated_decision": "refuse",
                    }
                }
            ),
            set(),
            id="static-in-both-arms-is-not-counted-in-the-interval-share",
        ),
    ],
)
def test_summary_evaluates_each_target(runs: list[dict[str, Any]], failed: set[str]) -> None:
    summary = matrix.summarize(runs, (1, 2), CONFIGS)
    got = {name for name, t in summary["targets"].items() if not t["met"]}
    assert got == failed
    assert summary["targets_met"] is (not failed)


def test_summary_lists_the_runs_behind_each_verdict() -> None:
    runs = _matrix(
        **{
            "mixed-25-s2": {"realised_gain": 0.008, "realised_ci": [-0.004, 0.02]},
            "decode-c64-s2": {
                "gated_decision": "refuse",
                "realised_ci": [0.025, 0.045],
                "dynamic_ran": False,
            },
        }
    )
    summary = matrix.summarize(runs, (1, 2), CONFIGS)
    assert summary["admitted_with_realised_low_below_0"] == ["mixed-25-s2"]
    assert summary["refused_with_realised_low_above_2pct"] == ["decode-c64-s2"]
    assert summary["same_policy_runs"] == ["decode-c64-s2"]
    assert summary["median_abs_error_pp"] == pytest.approx(0.5)
    assert summary["max_abs_error_pp"] == pytest.approx(2.2)
    assert summary["inside_predicted_ci_share"] == pytest.approx(6 / 7)


def test_seeded_arrivals_keep_the_shape_and_change_with_the_seed() -> None:
    for period in (5, 12):
        a = matrix.seeded_arrivals(400, 8, period, 3, seed=1)
        b = matrix.seeded_arrivals(400, 8, period, 3, seed=2)
        assert a.shape == (400,) and np.all(np.diff(a) >= 0)
        assert not np.array_equal(a, b)
        starts = np.unique(a)
        assert len(starts) == 50 and np.all(np.diff(starts) >= 3)  # a burst's prompts are through first
        assert Counter(a.tolist()).most_common(1)[0][1] == 8
        assert abs(np.diff(starts).mean() - period) < 0.5
    np.testing.assert_array_equal(
        matrix.seeded_arrivals(20, 8, 5, 3, seed=3), matrix.seeded_arrivals(20, 8, 5, 3, seed=3)
    )


def test_a_refused_build_is_judged_as_static_k_in_the_regime_build_would_infer() -> None:
    from dspark_calibrate.calibrate.deployment.workload import synthesize_workload, with_step_values

    workload = synthesize_workload(steps=40, max_rows=4, seed=1)
    steps = np.unique(workload.arrays().step)
    waiting = np.where(np.arange(steps.size) < 30, 5.0, 0.0)  # queued on 75% of the steps
    workload = with_step_values(workload, step=steps, waiting=waiting)
    outcome = {
        "status": "refused",
        "reason": "cell selection REJECT",
        "planner": "fused",
        "overhead": {"per_step_ms": [0.02, -0.01, 0.05]},
    }
    got = matrix.prediction_of(outcome, {"active": False}, workload)
    assert (got["regime"], got["objective"]) == ("saturated", "throughput")
    assert got["predicted_gain"] == 0.0 and got["predicted_ci"] == [0.0, 0.0] and not got["dynamic_ran"]
    assert got["gated_decision"] == "refuse" and got["overhead_charged_ms"] == pytest.approx(0.02)
    assert got["source"].startswith("build refused")


@pytest.mark.slow
def test_tiny_matrix_part_by_part(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    work = tmp_path / "work"
    try:
        assert (
            matrix.main(["--tiny", "--part", "decode", "--out", str(tmp_path / "one"), "--work", str(work)])
            == 0
        )
        first = json.loads((tmp_path / "one" / matrix.RESULT).read_text())
        assert first["status"] == "partial" and {e["part"] for e in first["runs"]} == {"decode"}
        assert (
            matrix.main(["--tiny", "--part", "mixed", "--out", str(tmp_path / "two"), "--work", str(work)])
            == 0
        )
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)  # run.torch_device set it for the CPU run; later tests need it off
    result = json.loads((tmp_path / "two" / matrix.RESULT).read_text())
    assert result == json.loads((work / matrix.RESULT).read_text())
    assert result["status"] == "done", {p: r.get("error") for p, r in result["parts"].items()}
    for key in ("gpu", "commit", "command", "runs", "summary", "targets_met"):
        assert key in result, key
    assert result["command"].count("--part") == 2 and set(result["parts"]) == {"decode", "mixed"}
    runs = result["runs"]
    assert len(runs) == 8 and len({e["id"] for e in runs}) == 8
    assert {(e["id"].rsplit("-s", 1)[0], e["seed"]) for e in runs} == {
        (c, s) for c in ("decode-c8", "decode-c4", "mixed-50", "mixed-25") for s in (1, 2)
    }
    for e in runs:
        for key, kind in REQUIRED.items():
            assert key in e, (e["id"], key)
            assert e[key] is None or isinstance(e[key], kind), (e["id"], key, e[key])
        assert len(e["predicted_ci"]) == len(e["realised_ci"]) == 2
        assert e["gated_decision"] in ("admit", "refuse") and e["objective"] in ("throughput", "latency")
        assert e["rounds"] >= 3 and e["identical_outputs"], e["id"]
        assert e["overhead_measured"]["handed_to_build"] and len(e["overhead_measured"]["per_step_ms"]) == 2
        if e["part"] == "decode":
            assert e["mixed_share"] == 0.0 and e["overhead_measured"]["planner"] == "fused"
        else:
            assert e["mixed_share"] > 0 and e["regime"] == "arrival-bound" and e["objective"] == "latency"
            assert e["overhead_measured"]["planner"] == "host"
    summary = result["summary"]
    assert summary["judged_runs"] == 8 and set(summary["targets"]) == {
        "median_abs_error_pp",
        "max_abs_error_pp",
        "inside_predicted_ci_share",
        "admitted_with_realised_low_below_0",
        "refused_with_realised_low_above_2pct",
        "runs_cover_every_config_and_seed",
    }
    assert summary["targets_met"] is result["targets_met"]
    # The second part trained nothing: it loaded the first part's weights; each deployment was
    # swept once and its sweep and fit are kept for a rerun.
    assert "loaded_from" in result["parts"]["mixed"]["stages"]["train"]["training"]
    for part in ("decode", "mixed"):
        assert (work / part / "toolkit" / "deployment.json").exists()
    assert (tmp_path / "two" / "prediction_matrix.png").exists()


def test_a_run_whose_set_up_fails_is_recorded_and_the_others_go_on(tmp_path: Path) -> None:
    from dspark_calibrate.calibrate.deployment.workload import synthesize_workload

    ms = matrix.make_matrix_settings(matrix.build_parser().parse_args(["--tiny"]))
    (tmp_path / "out").mkdir()
    (tmp_path / "work").mkdir()
    rec = matrix.MatrixRecorder(
        tmp_path / "out", tmp_path / "work", "decode", ms, {"commit": "c", "gpu": {"name": "CPU"}}
    )
    rec.result["command"] = "matrix.py --part decode"
    judged = matrix.prediction_of(
        {"status": "refused", "reason": "r"}, {"active": False}, synthesize_workload(steps=20)
    )

    keys = []

    def good(trust: Any) -> matrix.Run:
        assert trust.root_path.exists() and trust.private_key.exists()
        keys.append(trust.key_dir)
        return matrix.Run(
            "decode-c8-s1", "decode", 1, 8, lambda arm: None, None, None, np.zeros((1, 1)), judged, {}
        )

    def bad(trust: Any) -> matrix.Run:
        raise RuntimeError("the planner did not compile")

    runs = matrix.set_up([("decode-c4-s1", bad), ("decode-c8-s1", good)], tmp_path / "keys", rec)
    assert [r.id for r in runs] == ["decode-c8-s1"]
    (failed,) = rec.result["failed_runs"]
    assert (
        failed["id"] == "decode-c4-s1"
        and "did not compile" in failed["error"]
        and "Traceback" in failed["traceback"]
    )
    doc = json.loads((tmp_path / "work" / matrix.RESULT).read_text())
    assert "decode-c4-s1" in doc["summary"]["missing"] and [e["id"] for e in doc["runs"]] == ["decode-c8-s1"]
    assert keys and not keys[0].exists()  # the private key is gone once the runs are set up
