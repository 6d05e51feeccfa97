"""The release bracket's overhead arm: what the confidence path costs per step in the serving loop.

"Feature on, windows forced to K": the confidence path (logits snapshot, selector, allocator,
bookkeeping) runs every step exactly as in dynamic serving, but every step verifies the full
block, so it runs the same cells, emits the same tokens and takes the same number of steps as
static K. Its step time minus static K's is the overhead a dynamic step pays on top of its cell
(DESIGN §9), measured where it is paid.

**Design.** One serving run cycles its arms step by step (static K and each planner's forced-K
arm, in an order that changes from run to run), so the arms see the same batch states one step
apart. Steps ``i // m`` form cycle i; a cycle whose steps all ran the same G gives one paired
difference per planner arm, ``t_arm − t_static``. A run's estimate is the mean over its cycles;
successive runs rotate the order of the arms, forwards then backwards (each arm at every place
of a cycle equally often, :func:`cycle_order`), and the interval is a Student-t 95% interval over runs (the
run, not the step, is the unit: it carries the process and drift variation). ``build`` is handed
the runs themselves (:func:`overhead_evidence`), one mean per run, and draws the overhead from
them inside its joint replicates: the point and the spread, not a bound on top of a bound.

Pure statistics here (plus :func:`run_bracket`, which serves); the coverage of the interval is
tested on simulated runs with a known overhead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .analysis import t_interval
from .serving import CyclePolicy, Plan, Policy, RunResult, StepOutput

if TYPE_CHECKING:
    from dspark_calibrate.calibrate.deployment.uncertainty import OverheadEvidence

__all__ = [
    "STATIC_ARM",
    "ArmLog",
    "cycle_order",
    "overhead_evidence",
    "overhead_source",
    "run_bracket",
    "run_estimate",
    "summarize",
]

#: The arm every planner arm is paired with.
STATIC_ARM = "static"


def cycle_order(run_index: int, arms: int) -> tuple[int, ...]:
    """The order of the arms in every cycle of run ``run_index``.

    Runs go through the ``arms`` rotations of ``0..arms-1`` and then those of its reverse: over
    ``2 * arms`` runs every arm holds every place of a cycle twice, and follows each other arm as
    often as it precedes it (for three arms these are all six orders).
    """
    base = list(range(arms))
    r = run_index % (2 * arms)
    seq = base if r < arms else base[::-1]
    k = r % arms
    return tuple(seq[k:] + seq[:k])


def run_estimate(step_log: Sequence[tuple[float, int, int, int]], arms: Sequence[str]) -> dict[str, Any]:
    """One run's paired differences.

    Args:
        step_log: per decode step ``(ms, G, V, arm index)`` of a :class:`CyclePolicy` run whose
            arm 0 is static K.
        arms: the arms' names, static first.

    Returns:
        Per planner arm: ``mean_diff_ms`` (NaN without a usable cycle), ``cycles``; plus
        ``static_mean_ms`` over the cycles used.
    """
    m = len(arms)
    cycles: dict[int, dict[int, tuple[float, int, int]]] = {}
    for i, (ms, g, v, arm) in enumerate(step_log):
        cycles.setdefault(i // m, {})[arm] = (ms, g, v)  # the last cycle may be partial
    used = [
        c
        for c in cycles.values()
        if len(c) == m
        and len({(g, v) for _, g, v in c.values()}) == 1
        and all(v == 0 for _, _, v in c.values())
    ]
    out: dict[str, Any] = {
        "static_mean_ms": float(np.mean([c[0][0] for c in used])) if used else math.nan,
        "cycles_total": len(cycles),
    }
    for a in range(1, m):
        diffs = [c[a][0] - c[0][0] for c in used]
        out[arms[a]] = {
            "mean_diff_ms": float(np.mean(diffs)) if diffs else math.nan,
            "cycles": len(diffs),
            "se_ms": float(np.std(diffs, ddof=1) / math.sqrt(len(diffs))) if len(diffs) > 1 else math.nan,
            "mean_ms": float(np.mean([c[a][0] for c in used])) if used else math.nan,
        }
    return out


def summarize(
    runs: Sequence[dict[str, Any]], arms: Sequence[str], confidence: float = 0.95
) -> dict[str, Any]:
    """Per planner arm: the mean of the runs' estimates, its Student-t interval and upper bound.

    Returns:
        ``{arm: {overhead_ms, ci, upper_bound_ms, runs, cycles, per_run_ms, static_mean_ms}}``;
        runs without a usable cycle are left out (a NaN mean and interval when fewer than two).
    """
    out: dict[str, Any] = {}
    static = [r["static_mean_ms"] for r in runs if math.isfinite(r["static_mean_ms"])]
    for a in arms[1:]:
        per_run = [r[a]["mean_diff_ms"] for r in runs if math.isfinite(r[a]["mean_diff_ms"])]
        mean, lo, hi = t_interval(per_run, confidence)
        out[a] = {
            "overhead_ms": mean,
            "ci": [lo, hi],
            "upper_bound_ms": hi,
            "confidence": confidence,
            "runs": len(per_run),
            "cycles": int(sum(r[a]["cycles"] for r in runs)),
            "per_run_ms": per_run,
            "static_mean_ms": float(np.mean(static)) if static else math.nan,
            "relative_to_static_step": mean / float(np.mean(static))
            if static and math.isfinite(mean)
            else math.nan,
        }
    return out


def overhead_source(arm: str, summary: dict[str, Any], where: str) -> str:
    """The sentence that says how an arm's overhead was measured (for build's provenance);
    ``where`` names the load, e.g. ``at concurrency 256``."""
    lo, hi = summary["ci"]
    return (
        f"serving-loop release bracket {where}, arm {arm} (confidence path on, every "
        f"window forced to K) minus static K, step-interleaved in {summary['runs']} runs "
        f"({summary['cycles']} paired step cycles), one mean per run; mean {summary['overhead_ms']:.4f} ms, "
        f"{summary['confidence']:.0%} Student-t interval over runs {lo:.4f}..{hi:.4f} ms"
    )


def overhead_evidence(planner: str, arm: str, summary: dict[str, Any], where: str) -> OverheadEvidence | None:
    """The runs of one arm as build's overhead evidence for ``planner`` (None below two runs);
    ``where`` names the load it was measured under (:func:`overhead_source`)."""
    from dspark_calibrate.calibrate.deployment.uncertainty import OverheadEvidence

    runs = tuple(float(x) for x in summary.get("per_run_ms", ()) if math.isfinite(x))
    if len(runs) < 2:
        return None
    return OverheadEvidence(planner, runs, overhead_source(arm, summary, where))


class ArmLog:
    """A :class:`CyclePolicy` that also notes which arm planned each step, for serving loops whose
    own step log does not carry the arm (the mixed loop); ``arms[i]`` is the arm of the i-th
    planned step."""

    def __init__(self, cycle: CyclePolicy) -> None:
        self.cycle = cycle
        self.name = cycle.name
        self.arms: list[int] = []

    def plan(self, confidence: np.ndarray) -> Plan:
        """The cycle's plan for this step, its arm noted."""
        out = self.cycle.plan(confidence)
        self.arms.append(self.cycle.arm)
        return out

    def observe(self, out: StepOutput) -> None:
        """Hand the step's output to the arm that planned it."""
        self.cycle.observe(out)

    def finish(self) -> dict[str, Any]:
        """The arms' statistics (the cycle's)."""
        return self.cycle.finish()


def run_bracket(
    serve: Callable[[Policy, bool], RunResult],
    static: Policy,
    arms: Sequence[Policy],
    *,
    run_index: int,
    check: Callable[[RunResult], None] | None = None,
) -> dict[str, Any]:
    """Serve one bracket run (static plus the planner arms, cycling step by step) and estimate it.

    Args:
        serve: runs a policy over the level's prompts (``serve(policy, log_steps)``).
        static: the static-K arm.
        arms: the forced-K planner arms.
        run_index: picks the order of the arms in every cycle (:func:`cycle_order`).
        check: called with the run's result (e.g. the identity check of its outputs).

    Returns:
        :func:`run_estimate`'s dict plus the ``order`` and the planners' counters.
    """
    cycle = CyclePolicy([static, *arms], order=cycle_order(run_index, 1 + len(arms)), name="bracket")
    result = serve(cycle, True)
    if check is not None:
        check(result)
    names = [STATIC_ARM, *(a.name for a in arms)]
    est = run_estimate(result.step_log, names)
    est["order"] = [names[i] for i in cycle.order]
    est["planner_stats"] = result.planner_stats.get("arms", {})
    return est
