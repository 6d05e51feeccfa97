"""Mixed geometry: features from steps, the runtime's candidates, every invariant of the contract."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_calibrate.artifacts import (
    GEOMETRY_FEATURES,
    GEOMETRY_RULES,
    TRTLLM_BODY_BUCKETS,
    ContextChunk,
    GenerationRequest,
    MixedGeometry,
    MixedGeometryError,
    MixedIdentity,
    MixedRoute,
    MixedStep,
    RankFeatures,
    RankStep,
    candidate_rows,
    distinct,
    geometry_violations,
    require_geometry,
    step_candidates,
)
from dspark_calibrate.artifacts._mixed_geometry import native_rows, paid_bucket
from dspark_calibrate.errors import ConfigError
from tests.factories import make_fingerprint

K = 3
W = 8
BUCKETS = TRTLLM_BODY_BUCKETS


def _step() -> MixedStep:
    """Rank 0 prefills a 64-token chunk beside 10 generations; rank 1 decodes 8; six ranks idle."""
    r0 = RankStep((ContextChunk(64, 128),), tuple(GenerationRequest(100) for _ in range(10)))
    r1 = RankStep((), tuple(GenerationRequest(128) for _ in range(8)))
    return MixedStep((r0, r1, *([RankStep()] * 6)))


def _valid() -> MixedGeometry:
    paid, cells = step_candidates(_step().features(K), K, BUCKETS)
    assert paid == 128
    (cell,) = cells
    return cell


def test_features_of_a_step() -> None:
    f0, f1 = _step().features(K)[:2]
    assert f0.values() == (64, 4096, 8192, 0, 1000, 100, 0, 1, 10, 1, 10, 0)
    assert f1.values() == (0, 0, 0, 0, 1024, 128, 0, 0, 8, 0, 8, 0)
    # non-eligible and bootstrap generations keep their K+1 rows
    f = RankStep(
        (), (GenerationRequest(5, eligible=False), GenerationRequest(0, eligible=False, bootstrap=True))
    ).features(K)
    assert (f.fixed_generation_rows, f.bootstrap_generations, f.eligible_generations) == (8, 1, 0)


def test_the_runtime_candidate_of_the_step() -> None:
    cell = _valid()
    assert cell.capacity == 96
    assert cell.actual_rank_rows == (96, 32, 0, 0, 0, 0, 0, 0)
    assert cell.native_rank_rows == (104, 32, 0, 0, 0, 0, 0, 0)
    assert geometry_violations(cell, k=K, buckets=BUCKETS, world_size=W) == []


def test_upstream_fixture_is_unreachable() -> None:
    """TensorRT-LLM's own synthetic loader fixture: rank 1 has 8 eligible generations at capacity
    96, so the runtime builds 32 rows there, not 16 (TRTLLM_MIXED.md, derived rules)."""
    feats = ((64, 4096, 8192, 0, 0, 0, 0, 1, 0, 1, 0, 0), (0, 0, 0, 0, 1024, 128, 0, 0, 8, 0, 8, 0))
    geo = MixedGeometry(
        tuple(RankFeatures.from_values(f) for f in (*feats, *((0,) * 12,) * 6)),
        96,
        (64, 16, 0, 0, 0, 0, 0, 0),
        (64, 32, 0, 0, 0, 0, 0, 0),
    )
    found = geometry_violations(geo, k=K, buckets=BUCKETS, world_size=W)
    assert [(v.rule, v.rank) for v in found] == [("unreachable", 1)]
    assert "builds 32 rows" in found[0].message


def _with_rank(geo: MixedGeometry, rank: int, **changes: int) -> MixedGeometry:
    feats = list(geo.rank_features)
    feats[rank] = dataclasses.replace(feats[rank], **changes)
    return dataclasses.replace(geo, rank_features=tuple(feats))


def _rows(values: tuple[int, ...], rank: int, value: Any) -> tuple[Any, ...]:
    out = list(values)
    out[rank] = value
    return tuple(out)


def _native_grid() -> MixedGeometry:
    feats = RankStep((ContextChunk(500, 0),), tuple(GenerationRequest(10) for _ in range(4))).features(K)
    return MixedGeometry((feats,), 512, (512,), (516,))


def _not_offered() -> MixedGeometry:
    feats = RankStep((ContextChunk(80, 0),), tuple(GenerationRequest(10) for _ in range(10))).features(K)
    return MixedGeometry((feats,), 96, (92,), (120,))


def _native_at_128() -> MixedGeometry:
    g = _valid()
    return dataclasses.replace(g, capacity=128, actual_rank_rows=g.native_rank_rows)


# One row per way a geometry can be wrong: (id, the bad geometry, world size, costs, rule, rank).
CASES: list[tuple[str, Any, int | None, Any, str, int | None]] = [
    (
        "ranks",
        lambda g: dataclasses.replace(g, actual_rank_rows=g.actual_rank_rows[:7]),
        W,
        None,
        "ranks",
        None,
    ),
    ("world_size", lambda g: g, 4, None, "ranks", None),
    ("capacity", lambda g: dataclasses.replace(g, capacity=100), W, None, "capacity", None),
    ("bool_feature", lambda g: _with_rank(g, 0, context_position_product=True), W, None, "integers", 0),
    (
        "negative_rows",
        lambda g: dataclasses.replace(g, actual_rank_rows=_rows(g.actual_rank_rows, 3, -1)),
        W,
        None,
        "integers",
        3,
    ),
    ("wire_limit", lambda g: _with_rank(g, 2, generation_history_sum=2**63), W, None, "integers", 2),
    ("real_context", lambda g: _with_rank(g, 0, real_context_requests=2), W, None, "real_context", 0),
    ("eligible", lambda g: _with_rank(g, 1, eligible_generations=9), W, None, "eligible", 1),
    ("bootstrap", lambda g: _with_rank(g, 1, bootstrap_generations=1), W, None, "bootstrap", 1),
    ("history", lambda g: _with_rank(g, 1, generation_history_max=2000), W, None, "history", 1),
    ("fixed_rows", lambda g: _with_rank(g, 1, fixed_generation_rows=4), W, None, "fixed_rows", 1),
    (
        "native_rows",
        lambda g: dataclasses.replace(g, native_rank_rows=_rows(g.native_rank_rows, 1, 31)),
        W,
        None,
        "native_rows",
        1,
    ),
    (
        "reserved_rows",
        lambda g: dataclasses.replace(g, actual_rank_rows=_rows(g.actual_rank_rows, 0, 63)),
        W,
        None,
        "reserved_rows",
        0,
    ),
    (
        "capacity_rows",
        lambda g: dataclasses.replace(g, actual_rank_rows=_rows(g.actual_rank_rows, 1, 33)),
        W,
        None,
        "capacity_rows",
        1,
    ),
    ("all_decode", lambda g: _with_rank(g, 0, real_context_requests=0), W, None, "all_decode", None),
    ("not_compact", lambda g: _native_at_128(), W, None, "not_compact", None),
    ("native_grid", lambda g: _native_grid(), 1, None, "native_grid", None),
    (
        "unreachable_rows",
        lambda g: dataclasses.replace(g, actual_rank_rows=_rows(g.actual_rank_rows, 1, 16)),
        W,
        None,
        "unreachable",
        1,
    ),
    ("unreachable_capacity", lambda g: _not_offered(), 1, None, "unreachable", 0),
    ("dead", lambda g: g, W, (7.0, 6.95, 0.01), "dead", None),
]


@pytest.mark.parametrize(
    ("name", "mutate", "world", "costs", "rule", "rank"), CASES, ids=[c[0] for c in CASES]
)
def test_each_invariant(
    name: str, mutate: Any, world: int | None, costs: Any, rule: str, rank: int | None
) -> None:
    geo = mutate(_valid())
    found = geometry_violations(geo, k=K, buckets=BUCKETS, world_size=world, costs=costs)
    assert found, name
    assert (found[0].rule, found[0].rank) == (rule, rank), [v.describe() for v in found]
    with pytest.raises(MixedGeometryError, match=rf"mixed cell 7 .*breaks {rule}") as info:
        require_geometry(
            geo, where="mixed cell 7 (capacity 96)", k=K, buckets=BUCKETS, world_size=world, costs=costs
        )
    assert info.value.code == "MIXED_GEOMETRY_INVALID"
    if rank is not None:
        assert f"rank {rank} breaks {rule}" in str(info.value)


def test_every_rule_has_a_case() -> None:
    assert {c[4] for c in CASES} == set(GEOMETRY_RULES)


def test_a_live_cell_is_not_dead() -> None:
    assert geometry_violations(_valid(), k=K, buckets=BUCKETS, costs=(7.0, 6.9, 0.01)) == []


def test_rank_order_is_part_of_the_key() -> None:
    g = _valid()
    flipped = dataclasses.replace(
        g,
        rank_features=g.rank_features[::-1],
        actual_rank_rows=g.actual_rank_rows[::-1],
        native_rank_rows=g.native_rank_rows[::-1],
    )
    assert flipped != g and flipped.sha256() != g.sha256()
    with pytest.raises(ConfigError, match="share one geometry"):
        distinct([g, flipped, g])
    distinct([g, flipped])


def _consumer_json(geo: MixedGeometry) -> dict[str, Any]:
    return geo.to_dict()


BAD_JSON: list[tuple[str, Any, str]] = [
    ("extra_key", lambda d: {**d, "extra": 1}, "unknown fields"),
    ("missing_key", lambda d: {k: v for k, v in d.items() if k != "capacity"}, "missing fields"),
    ("float_capacity", lambda d: {**d, "capacity": 96.0}, "capacity must be an integer"),
    (
        "bool_rows",
        lambda d: {**d, "actual_rank_rows": [True, *d["actual_rank_rows"][1:]]},
        "actual_rank_rows",
    ),
    ("short_rows", lambda d: {**d, "native_rank_rows": d["native_rank_rows"][:3]}, "one entry per rank"),
    (
        "feature_missing",
        lambda d: {**d, "rank_features": [{"context_rows": 1}, *d["rank_features"][1:]]},
        "features must be exactly",
    ),
    (
        "feature_string",
        lambda d: {
            **d,
            "rank_features": [{**d["rank_features"][0], "context_rows": "64"}, *d["rank_features"][1:]],
        },
        "context_rows",
    ),
    ("not_object", lambda d: [d], "must be a JSON object"),
]


@pytest.mark.parametrize(("name", "mutate", "message"), BAD_JSON, ids=[c[0] for c in BAD_JSON])
def test_from_dict_is_strict(name: str, mutate: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        MixedGeometry.from_dict(mutate(_consumer_json(_valid())))


def test_json_and_flat_round_trip() -> None:
    g = _valid()
    assert MixedGeometry.from_dict(g.to_dict()) == g
    assert MixedGeometry.from_flat(g.flat_features(), g.capacity, g.actual_rank_rows, g.native_rank_rows) == g


def test_step_json_round_trip_and_errors() -> None:
    step = _step()
    assert MixedStep.from_dict(step.to_dict()) == step
    with pytest.raises(ConfigError, match=r"ranks\[0\]\.generations\[0\].*bootstrap"):
        MixedStep.from_dict(
            {"ranks": [{"generations": [{"history": 1, "eligible": True, "bootstrap": True}]}]}
        )
    with pytest.raises(ConfigError, match="unknown fields"):
        MixedStep.from_dict({"ranks": [{"context": [{"size": 4, "tokens": 1}]}]})


# --- properties -------------------------------------------------------------------------------

_chunk = st.builds(
    ContextChunk,
    size=st.integers(1, 200),
    position=st.integers(0, 4096),
    compressed=st.integers(0, 512),
    real=st.booleans(),
)
_gen = st.one_of(
    st.builds(GenerationRequest, history=st.integers(0, 4096), eligible=st.just(True)),
    st.builds(
        GenerationRequest, history=st.integers(0, 4096), eligible=st.just(False), bootstrap=st.booleans()
    ),
)
_rank = st.builds(
    RankStep,
    context=st.lists(_chunk, max_size=3).map(tuple),
    generations=st.lists(_gen, max_size=40).map(tuple),
)


@settings(max_examples=200, deadline=None)
@given(ranks=st.lists(_rank, min_size=1, max_size=8), k=st.integers(1, 4), floor=st.integers(1, 2))
def test_every_runtime_candidate_is_valid(ranks: list[RankStep], k: int, floor: int) -> None:
    step = MixedStep(tuple(ranks))
    feats = step.features(k)
    paid, cells = step_candidates(feats, k, BUCKETS, min_verify_len=min(floor, k))
    natives = tuple(native_rows(f, k) for f in feats)
    assert paid == paid_bucket(natives, BUCKETS)
    if not step.has_real_context():
        assert cells == ()
    for cell in cells:
        assert cell.capacity < (paid or 0)
        assert (
            geometry_violations(
                cell, k=k, buckets=BUCKETS, world_size=len(ranks), min_verify_len=min(floor, k)
            )
            == []
        )
        assert MixedGeometry.from_dict(cell.to_dict()) == cell
        for f, rows in zip(feats, cell.actual_rank_rows, strict=True):
            assert candidate_rows(f, cell.capacity, k, min_verify_len=min(floor, k)) == rows


@settings(max_examples=100, deadline=None)
@given(
    ranks=st.lists(_rank, min_size=1, max_size=4),
    rank=st.integers(0, 3),
    field=st.sampled_from(GEOMETRY_FEATURES),
    delta=st.integers(1, 5),
)
def test_changing_any_feature_changes_the_hash(
    ranks: list[RankStep], rank: int, field: str, delta: int
) -> None:
    feats = MixedStep(tuple(ranks)).features(K)
    geo = MixedGeometry(
        feats, 96, tuple(native_rows(f, K) for f in feats), tuple(native_rows(f, K) for f in feats)
    )
    r = rank % len(feats)
    changed = _with_rank(geo, r, **{field: getattr(feats[r], field) + delta})
    assert changed.sha256() != geo.sha256()
    assert changed.canonical() != geo.canonical()


# --- identity and route ------------------------------------------------------------------------


def test_identity_from_a_fingerprint() -> None:
    fp = make_fingerprint(
        max_draft_len=3, gpu_count=8, global_graph_batch_sizes=(64, 128, 256), model_config_sha256="ab" * 32
    )
    ident = MixedIdentity.derive(
        fp, selector_identity="cd" * 32, body_buckets=BUCKETS, execution_mode="BREAKABLE"
    )
    assert (ident.physical_k, ident.world_size, ident.body_buckets) == (3, 8, BUCKETS)
    assert MixedIdentity.from_dict(ident.to_dict()) == ident
    other = MixedIdentity.derive(
        fp.replace(runtime_snapshot="another"),
        selector_identity="cd" * 32,
        body_buckets=BUCKETS,
        execution_mode="BREAKABLE",
    )
    assert ident.diff(other) == ["runtime_snapshot_sha256"]
    with pytest.raises(ConfigError, match="model_config_sha256"):
        MixedIdentity.derive(
            fp.replace(model_config_sha256=None),
            selector_identity="cd" * 32,
            body_buckets=BUCKETS,
            execution_mode="BREAKABLE",
        )
    bad = {**ident.to_dict(), "physical_k": True}
    with pytest.raises(ConfigError, match="physical_k"):
        MixedIdentity.from_dict(bad)
    with pytest.raises(ConfigError, match="body_buckets must be a list"):
        MixedIdentity.from_dict({**ident.to_dict(), "body_buckets": 96})


def test_route_is_strict() -> None:
    route = MixedRoute(3, 8, BUCKETS)
    assert MixedRoute.from_dict(route.to_dict()) == route
    for bad in (
        {"body_buckets": [128, 96]},
        {"physical_k": 0},
        {"min_verify_len": 4},
        {"execution_mode": ""},
    ):
        with pytest.raises(ConfigError):
            MixedRoute.from_dict({**route.to_dict(), **bad})
