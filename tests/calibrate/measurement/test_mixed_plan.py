"""What a mixed sweep measures from a recorded workload: the candidates that can pay, first.

``gain_bound`` is checked against hand-computed values; ``plan_from_steps`` must leave out the
candidates the runtime can never use (steps running a first context chunk) or that cannot gain
the consumer's 1% at the recorded acceptance, and rank the rest by what they can gain rather
than by the rows they cut (which puts the deepest, most token-losing cut first).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pytest

from dspark_calibrate.artifacts import (
    ContextChunk,
    GenerationRequest,
    MixedRoute,
    MixedStep,
    RankStep,
    step_candidates,
)
from dspark_calibrate.calibrate.deployment.workload import Workload, synthesize_mixed_workload
from dspark_calibrate.calibrate.measurement.mixed import (
    SKIP_CANNOT_PAY,
    SKIP_FIRST_CHUNK,
    gain_bound,
    plan_from_steps,
    plan_from_workload,
)
from dspark_calibrate.errors import ConfigError

K = 3


def _rank(ctx: int, eligible: int, fixed: int = 0, position: int = 64) -> RankStep:
    gens = tuple(GenerationRequest(500) for _ in range(eligible))
    gens += tuple(GenerationRequest(500, eligible=False, bootstrap=True) for _ in range(fixed))
    return RankStep((ContextChunk(ctx, position),), gens)


def _bound(step: MixedStep, accepted: Sequence[Sequence[int]], route: MixedRoute, capacity: int) -> float:
    paid, cells = step_candidates(step.features(K), K, route.body_buckets)
    assert paid is not None
    (geo,) = [c for c in cells if c.capacity == capacity]
    return gain_bound(step, [np.array(a) for a in accepted], geo, paid, K, route.min_verify_len)


# One rank: a 32-row chunk, 4 eligible generations and 1 bootstrap one (4 rows, never cut): native
# 52 rows, paid 64; at 48 the eligible keep anchor + floor (8 rows) and 4 extra rows.
ONE = MixedRoute(physical_k=K, world_size=1, body_buckets=(48, 64))
STEP = MixedStep((_rank(32, 4, fixed=1),))
BOUNDS: list[tuple[str, list[int], float]] = [
    # tokens at full width 11; kept: 2+2+1+2 at the floor and min(4 extra, 2+2 useful) = 11
    ("extra_rows_cover_every_accepted_token", [3, 3, 0, 1, 2], 11 / 11 * 64 / 48 - 1),
    # full 16; kept 8 + min(4, 8) = 12: a quarter of the tokens for a quarter of the capacity
    ("every_draft_accepted", [3, 3, 3, 3, 0], 12 / 16 * 64 / 48 - 1),
    ("nothing_accepted", [0, 0, 0, 0, 3], 64 / 48 - 1),
    # accepted counts above K are clipped; the bootstrap generation's count never matters
    ("counts_clipped_to_k", [9, 9, 9, 9, 9], 12 / 16 * 64 / 48 - 1),
]


@pytest.mark.parametrize(("name", "accepted", "want"), BOUNDS, ids=[b[0] for b in BOUNDS])
def test_gain_bound_by_hand(name: str, accepted: list[int], want: float) -> None:
    assert _bound(STEP, [accepted], ONE, 48) == pytest.approx(want, abs=1e-12)


def test_gain_bound_sums_tokens_over_ranks() -> None:
    route = MixedRoute(physical_k=K, world_size=2, body_buckets=(48, 64))
    step = MixedStep((_rank(32, 4, fixed=1), _rank(16, 2)))
    # rank 0 as "extra_rows_cover...": 11 of 11; rank 1 (reserve 16, 2 eligible, 48 rows at 48:
    # no cut) keeps its 1+3 and 1+0 tokens: 15 of 15 in all
    assert _bound(step, [[3, 3, 0, 1, 2], [3, 0]], route, 48) == pytest.approx(64 / 48 - 1)


def test_gain_bound_refuses_counts_that_do_not_match_the_generations() -> None:
    with pytest.raises(ConfigError, match="5 generations and 4 accepted counts"):
        _bound(STEP, [[3, 3, 0, 1]], ONE, 48)


# A 30-row chunk beside 10 eligible generations: native 70 rows, paid 80; candidates at 64 (cuts 6
# rows, 14 extra above the floor) and at 56 (cuts 14, 6 extra).
ROUTE = MixedRoute(physical_k=K, world_size=1, body_buckets=(56, 64, 80))
OPEN = MixedStep((_rank(30, 10),))
FIRST = MixedStep((_rank(30, 10, position=0),))  # a request's first chunk: the runtime keeps it native


def _capacities(plan: object) -> list[list[int]]:
    return [[c.capacity for c in g.cells] for g in plan.groups]  # type: ignore[attr-defined]


def test_a_candidate_that_cannot_gain_is_not_measured() -> None:
    """Every draft accepted: at 64 the step keeps 34 of 40 tokens for 80% of the capacity (+6%
    at most), at 56 26 of 40 for 70% (−7%): only 64 is measured."""
    assert _bound(OPEN, [[3] * 10], ROUTE, 64) == pytest.approx(34 / 40 * 80 / 64 - 1)
    assert _bound(OPEN, [[3] * 10], ROUTE, 56) < 0
    plan = plan_from_steps([OPEN] * 3, ROUTE, accepted=[[np.full(10, 3)]] * 3)
    assert _capacities(plan) == [[64]] and plan.skipped == {SKIP_CANNOT_PAY: 1}
    # Without the recorded acceptance, both are measured, the deeper cut first (more rows saved).
    blind = plan_from_steps([OPEN] * 3, ROUTE, max_cells=1)
    assert _capacities(blind) == [[56]] and blind.skipped == {}


def test_candidates_are_ranked_by_what_they_can_gain() -> None:
    """Two accepted drafts each: 64 can gain 25%, 56 24%; with room for one cell, 64 is measured
    (a ranking by rows cut would take 56)."""
    assert _bound(OPEN, [[2] * 10], ROUTE, 64) == pytest.approx(0.25)
    assert _bound(OPEN, [[2] * 10], ROUTE, 56) == pytest.approx(26 / 30 * 80 / 56 - 1)
    plan = plan_from_steps([OPEN], ROUTE, max_cells=1, accepted=[[np.full(10, 2)]])
    assert _capacities(plan) == [[64]]


def test_first_chunk_steps_get_their_native_arm_and_no_cell() -> None:
    steps = [FIRST] * 5 + [OPEN]
    accepted = [[np.full(10, 2)]] * 6
    plan = plan_from_steps(steps, ROUTE, accepted=accepted)
    by_steps = {g.workload_steps: [c.capacity for c in g.cells] for g in plan.groups}
    assert by_steps == {1: [56, 64], 5: []}  # the frequent first-chunk group is still priced
    assert plan.skipped == {SKIP_FIRST_CHUNK: 2}
    assert plan_from_steps(steps, ROUTE).skipped == {SKIP_FIRST_CHUNK: 2}


def test_accepted_counts_must_match_the_steps() -> None:
    with pytest.raises(ConfigError, match="2 mixed steps and 1 accepted"):
        plan_from_steps([OPEN, OPEN], ROUTE, accepted=[[np.full(10, 2)]])


def _accepting(wl: Workload, drafts: int) -> Workload:
    """The workload with every generation accepting ``drafts`` drafts under full verification."""
    t = wl.table
    i = t.schema.get_field_index("accepted")
    column = pa.array(np.full(t.num_rows, drafts), type=t.schema.field(i).type)
    return dataclasses.replace(wl, table=t.set_column(i, t.schema.field(i), column), _cache={})


def test_plan_from_workload_reads_each_generation_s_acceptance() -> None:
    """One rank, a 96-token chunk beside 20 eligible generations: native 176 rows, paid 192;
    candidates at 136 (floor only), 144 (8 extra rows) and 160 (24). With two accepted drafts
    each, 136 keeps 40 of 60 tokens for 71% of the capacity and cannot pay; 144 and 160 can."""
    wl = synthesize_mixed_workload(steps=300, ranks=1, levels=(20,), chunk_sizes=(96,), seed=3)
    route = MixedRoute(physical_k=3, world_size=1, body_buckets=(136, 144, 160, 192))
    blind = plan_from_steps(list(wl.mixed_steps()), route)
    assert {tuple(c) for c in _capacities(blind)} == {(136, 144, 160)}
    plan = plan_from_workload(_accepting(wl, 2), route)
    assert {tuple(c) for c in _capacities(plan)} == {(144, 160)}
    assert plan.skipped == {SKIP_CANNOT_PAY: len(plan.groups)}
    assert _capacities(plan_from_workload(_accepting(wl, 3), route)) == [[]] * len(plan.groups)


def test_plan_from_workload_splits_acceptance_by_rank() -> None:
    wl = synthesize_mixed_workload(steps=400, ranks=2, levels=(6, 10), seed=3)
    route = MixedRoute(physical_k=3, world_size=2, body_buckets=(96, 128, 192, 256))
    a = wl.arrays()
    accepted = [
        [a.accepted[m.start : m.stop][a.rank[m.start : m.stop] == r] for r in range(2)]
        for m in wl.mixed_step_rows()
    ]
    plan = plan_from_workload(wl, route)
    direct = plan_from_steps(list(wl.mixed_steps()), route, accepted=accepted)
    assert _capacities(plan) == _capacities(direct) and plan.skipped == direct.skipped
    assert [g.workload_steps for g in plan.groups] == [g.workload_steps for g in direct.groups]
