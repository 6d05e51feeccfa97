"""Mixed prefill+decode geometry: the exact key TensorRT-LLM prices a mixed step by (DESIGN §10).

A *mixed step* puts context chunks and generation requests into one forward. The consumer keys
its measured cost by a *geometry*: per rank, in rank order, twelve integer features of the
rank's share of the step, the body capacity bucket the step runs in, and each rank's actual and
native row counts (``TRTLLM_MIXED.md``). This module computes that geometry from a step
description, builds the candidate geometries the runtime would look up for a step, and checks
every invariant of the contract, including the two the consumer leaves implicit:

- **unreachable**: a geometry whose actual rows are not the ones the runtime builds at its
  capacity (``reserve + min(C − reserve, (K+1)·eligible)``, offered only when
  ``C − reserve ≥ (1 + min_verify_len)·eligible``) can never match a lookup;
- **dead**: a cell whose ``candidate_upper_ms · (1 + gain)`` exceeds ``native_lower_ms`` can
  never be chosen (the candidate yield never exceeds the native yield).

The consumer runs K = 3 and eight ranks; everything here takes K and the number of ranks as
given (``(K+1)`` rows per full-width generation), so one-GPU test beds use the same code. The
route restriction belongs to the TensorRT-LLM export.

Pure: no I/O. Violations are data (:class:`GeometryViolation`, a stable ``rule`` id per
invariant); :func:`require_geometry` raises :class:`MixedGeometryError` naming the cell, the
rank and the rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dspark_calibrate.artifacts._canonical import canonical_json, sha256_hex
from dspark_calibrate.artifacts._models import Fingerprint, is_sha256_hex
from dspark_calibrate.errors import ConfigError

__all__ = [
    "GEOMETRY_FEATURES",
    "GEOMETRY_RULES",
    "IDENTITY_HASHES",
    "MIXED_EXECUTION_MODE",
    "TRTLLM_BODY_BUCKETS",
    "TRTLLM_MIXED_K",
    "TRTLLM_MIXED_WORLD_SIZE",
    "ContextChunk",
    "GenerationRequest",
    "GeometryViolation",
    "MixedGeometry",
    "MixedGeometryError",
    "MixedIdentity",
    "MixedLive",
    "MixedRoute",
    "MixedStep",
    "RankFeatures",
    "RankStep",
    "candidate_rows",
    "dead_cell",
    "distinct",
    "geometry_violations",
    "native_rows",
    "paid_bucket",
    "require_geometry",
    "step_candidates",
]

#: The twelve per-rank features, in the consumer's order.
GEOMETRY_FEATURES: tuple[str, ...] = (
    "context_rows",
    "context_chunk_squared",
    "context_position_product",
    "context_compressed_product",
    "generation_history_sum",
    "generation_history_max",
    "bootstrap_generations",
    "real_context_requests",
    "eligible_generations",
    "context_requests",
    "generation_requests",
    "fixed_generation_rows",
)
#: TensorRT-LLM's captured BREAKABLE prefill body buckets (rows), all six required on its route.
TRTLLM_BODY_BUCKETS: tuple[int, ...] = (96, 128, 192, 256, 384, 512)
#: The only physical draft length and world size the consumer's mixed route supports today.
TRTLLM_MIXED_K = 3
TRTLLM_MIXED_WORLD_SIZE = 8
#: The consumer's prefill CUDA-graph execution mode for mixed steps.
MIXED_EXECUTION_MODE = "BREAKABLE"
#: Every geometry value is a JSON integer in [0, 2^63) (the consumer's wire bound).
_WIRE_LIMIT = 1 << 63

#: Stable rule ids of the invariants, in the order they are checked (``GeometryViolation.rule``).
GEOMETRY_RULES: tuple[str, ...] = (
    "ranks",
    "capacity",
    "integers",
    "real_context",
    "eligible",
    "bootstrap",
    "history",
    "fixed_rows",
    "native_rows",
    "reserved_rows",
    "capacity_rows",
    "all_decode",
    "not_compact",
    "native_grid",
    "unreachable",
    "dead",
)


class MixedGeometryError(ConfigError):
    """A mixed geometry breaks an invariant; the message names the cell, the rank and the rule.

    Attributes:
        violations: every violation found, in rule order.
    """

    default_code = "MIXED_GEOMETRY_INVALID"

    def __init__(self, violations: Sequence[GeometryViolation], where: str) -> None:
        self.violations = tuple(violations)
        lines = "; ".join(v.describe() for v in self.violations[:4])
        more = f" (+{len(self.violations) - 4} more)" if len(self.violations) > 4 else ""
        super().__init__(f"{where}: {lines}{more}")


@dataclass(frozen=True, slots=True)
class GeometryViolation:
    """One broken invariant.

    Attributes:
        rule: the stable rule id (one of :data:`GEOMETRY_RULES`).
        rank: the rank concerned, or None for a whole-geometry rule.
        message: what is wrong, with the numbers, and what holds instead.
    """

    rule: str
    rank: int | None
    message: str

    def describe(self) -> str:
        """``rank 1 breaks fixed_rows: ...`` or ``breaks all_decode: ...``."""
        where = f"rank {self.rank} " if self.rank is not None else ""
        return f"{where}breaks {self.rule}: {self.message}"


def _nonneg_int(name: str, value: object) -> int:
    if type(value) is not int or not 0 <= value < _WIRE_LIMIT:
        raise ConfigError(f"{name} must be an integer in [0, 2^63), got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------
# Step descriptions
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContextChunk:
    """One context (prefill) chunk of a request in this step.

    Attributes:
        size: tokens of the chunk (rows it takes in the body), >= 1.
        position: tokens of the prompt already in the KV cache before this chunk.
        compressed: compressed KV tokens the chunk attends to (0 when the model has none).
        real: a request's chunk (False: a dummy request the engine adds, e.g. to an idle rank).
    """

    size: int
    position: int = 0
    compressed: int = 0
    real: bool = True

    def __post_init__(self) -> None:
        _nonneg_int("context chunk size", self.size)
        if self.size < 1:
            raise ConfigError(f"context chunk size must be >= 1, got {self.size}")
        _nonneg_int("context chunk position", self.position)
        _nonneg_int("context chunk compressed tokens", self.compressed)
        if not isinstance(self.real, bool):
            raise ConfigError(f"context chunk real must be a boolean, got {self.real!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "size": self.size,
            "position": self.position,
            "compressed": self.compressed,
            "real": self.real,
        }


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One generation (decode) request in this step.

    Attributes:
        history: tokens in the request's KV cache before this step (prompt plus output).
        eligible: the confidence path may shorten its verification (False: it keeps K+1 rows).
        bootstrap: the request's first generation step (never eligible; it keeps K+1 rows).
    """

    history: int
    eligible: bool = True
    bootstrap: bool = False

    def __post_init__(self) -> None:
        _nonneg_int("generation history", self.history)
        if not isinstance(self.eligible, bool) or not isinstance(self.bootstrap, bool):
            raise ConfigError("generation eligible and bootstrap must be booleans")
        if self.bootstrap and self.eligible:
            raise ConfigError("a bootstrap generation is never eligible (it keeps its K+1 rows)")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"history": self.history, "eligible": self.eligible, "bootstrap": self.bootstrap}


@dataclass(frozen=True, slots=True, order=True)
class RankFeatures:
    """The twelve integer features of one rank's share of a mixed step (consumer order)."""

    context_rows: int = 0
    context_chunk_squared: int = 0
    context_position_product: int = 0
    context_compressed_product: int = 0
    generation_history_sum: int = 0
    generation_history_max: int = 0
    bootstrap_generations: int = 0
    real_context_requests: int = 0
    eligible_generations: int = 0
    context_requests: int = 0
    generation_requests: int = 0
    fixed_generation_rows: int = 0

    def values(self) -> tuple[int, ...]:
        """The features as a tuple, in :data:`GEOMETRY_FEATURES` order."""
        return tuple(getattr(self, name) for name in GEOMETRY_FEATURES)

    @property
    def reserve(self) -> int:
        """Rows never discounted: context rows plus the full-width rows of non-eligible generations."""
        return self.context_rows + self.fixed_generation_rows

    def to_dict(self) -> dict[str, int]:
        """The consumer's JSON object of the rank."""
        return {name: getattr(self, name) for name in GEOMETRY_FEATURES}

    @classmethod
    def from_values(cls, values: Sequence[int]) -> RankFeatures:
        """From twelve integers in :data:`GEOMETRY_FEATURES` order (types are not checked here)."""
        if len(values) != len(GEOMETRY_FEATURES):
            raise ConfigError(f"a rank has {len(GEOMETRY_FEATURES)} features, got {len(values)}")
        return cls(*(int(v) for v in values))

    @classmethod
    def from_dict(cls, data: object, *, where: str = "rank") -> RankFeatures:
        """From the consumer's JSON object: exactly the twelve keys, each a JSON integer in [0, 2^63).

        Raises:
            ConfigError: missing, extra or non-integer features.
        """
        if not isinstance(data, Mapping) or set(data) != set(GEOMETRY_FEATURES):
            have = sorted(data) if isinstance(data, Mapping) else type(data).__name__
            raise ConfigError(f"{where}: features must be exactly {list(GEOMETRY_FEATURES)}, got {have}")
        return cls(*(_nonneg_int(f"{where}.{name}", data[name]) for name in GEOMETRY_FEATURES))


@dataclass(frozen=True, slots=True)
class RankStep:
    """One rank's share of a mixed step: its context chunks and its generation requests."""

    context: tuple[ContextChunk, ...] = ()
    generations: tuple[GenerationRequest, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "context", tuple(self.context))
        object.__setattr__(self, "generations", tuple(self.generations))

    def features(self, k: int) -> RankFeatures:
        """The rank's twelve features for physical draft length ``k``."""
        gens = self.generations
        eligible = sum(1 for g in gens if g.eligible)
        return RankFeatures(
            context_rows=sum(c.size for c in self.context),
            context_chunk_squared=sum(c.size * c.size for c in self.context),
            context_position_product=sum(c.size * c.position for c in self.context),
            context_compressed_product=sum(c.size * c.compressed for c in self.context),
            generation_history_sum=sum(g.history for g in gens),
            generation_history_max=max((g.history for g in gens), default=0),
            bootstrap_generations=sum(1 for g in gens if g.bootstrap),
            real_context_requests=sum(1 for c in self.context if c.real),
            eligible_generations=eligible,
            context_requests=len(self.context),
            generation_requests=len(gens),
            fixed_generation_rows=(k + 1) * (len(gens) - eligible),
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ``--mixed-grid`` file's rank object)."""
        return {
            "context": [c.to_dict() for c in self.context],
            "generations": [g.to_dict() for g in self.generations],
        }


def _fields(data: object, allowed: set[str], required: set[str], where: str) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where} must be a JSON object, got {type(data).__name__}")
    extra, missing = sorted(set(data) - allowed), sorted(required - set(data))
    if extra or missing:
        raise ConfigError(f"{where}: unknown fields {extra}, missing fields {missing}")
    return data


@dataclass(frozen=True, slots=True)
class MixedStep:
    """A mixed step across ranks, in rank order (rank 0 first)."""

    ranks: tuple[RankStep, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(self.ranks))
        if not self.ranks:
            raise ConfigError("a mixed step needs at least one rank")

    @property
    def world_size(self) -> int:
        """Ranks of the step."""
        return len(self.ranks)

    def features(self, k: int) -> tuple[RankFeatures, ...]:
        """Every rank's features, in rank order."""
        return tuple(r.features(k) for r in self.ranks)

    def has_real_context(self) -> bool:
        """True when some rank holds a real context chunk (a step the mixed path prices)."""
        return any(c.real for r in self.ranks for c in r.context)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"ranks": [r.to_dict() for r in self.ranks]}

    @classmethod
    def from_dict(cls, data: object, *, where: str = "step") -> MixedStep:
        """From ``{"ranks": [{"context": [...], "generations": [...]}, ...]}`` (unknown fields refused).

        Raises:
            ConfigError: a malformed step, naming the rank and the field.
        """
        top = _fields(data, {"ranks"}, {"ranks"}, where)
        ranks_in = top["ranks"]
        if not isinstance(ranks_in, list) or not ranks_in:
            raise ConfigError(f"{where}.ranks must be a non-empty list")
        ranks = []
        for r, rank in enumerate(ranks_in):
            rw = f"{where}.ranks[{r}]"
            body = _fields(rank, {"context", "generations"}, set(), rw)
            chunks = []
            for i, c in enumerate(body.get("context", [])):
                cf = _fields(c, {"size", "position", "compressed", "real"}, {"size"}, f"{rw}.context[{i}]")
                try:
                    chunks.append(ContextChunk(**dict(cf)))
                except ConfigError as exc:
                    raise ConfigError(f"{rw}.context[{i}]: {exc}") from None
            gens = []
            for i, g in enumerate(body.get("generations", [])):
                gf = _fields(g, {"history", "eligible", "bootstrap"}, {"history"}, f"{rw}.generations[{i}]")
                try:
                    gens.append(GenerationRequest(**dict(gf)))
                except ConfigError as exc:
                    raise ConfigError(f"{rw}.generations[{i}]: {exc}") from None
            ranks.append(RankStep(tuple(chunks), tuple(gens)))
        return cls(tuple(ranks))


# ---------------------------------------------------------------------------------------------
# Geometry
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class MixedGeometry:
    """One exact cell key: per-rank features, capacity, actual and native rows (rank order).

    Construction checks shapes only; :func:`geometry_violations` checks the invariants (so that
    every violation of a bad geometry can be reported, not just the first).
    """

    rank_features: tuple[RankFeatures, ...]
    capacity: int
    actual_rank_rows: tuple[int, ...]
    native_rank_rows: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "rank_features", tuple(self.rank_features))
        object.__setattr__(self, "actual_rank_rows", tuple(self.actual_rank_rows))
        object.__setattr__(self, "native_rank_rows", tuple(self.native_rank_rows))

    @property
    def world_size(self) -> int:
        """Ranks of the geometry."""
        return len(self.rank_features)

    def to_dict(self) -> dict[str, Any]:
        """The consumer's JSON object of the geometry."""
        return {
            "rank_features": [f.to_dict() for f in self.rank_features],
            "capacity": self.capacity,
            "actual_rank_rows": list(self.actual_rank_rows),
            "native_rank_rows": list(self.native_rank_rows),
        }

    @classmethod
    def from_dict(cls, data: object, *, where: str = "geometry") -> MixedGeometry:
        """From the consumer's JSON object: exactly its four keys, JSON integers, equal-length arrays.

        Raises:
            ConfigError: a malformed geometry (the message names the field).
        """
        top = _fields(
            data,
            {"rank_features", "capacity", "actual_rank_rows", "native_rank_rows"},
            {"rank_features", "capacity", "actual_rank_rows", "native_rank_rows"},
            where,
        )
        feats, actual, native = top["rank_features"], top["actual_rank_rows"], top["native_rank_rows"]
        if not all(isinstance(x, list) for x in (feats, actual, native)):
            raise ConfigError(f"{where}: rank_features, actual_rank_rows and native_rank_rows must be lists")
        if not len(feats) == len(actual) == len(native) or not feats:
            raise ConfigError(
                f"{where}: rank_features, actual_rank_rows and native_rank_rows need one entry per rank "
                f"(got {len(feats)}, {len(actual)}, {len(native)})"
            )
        return cls(
            tuple(
                RankFeatures.from_dict(f, where=f"{where}.rank_features[{r}]") for r, f in enumerate(feats)
            ),
            _nonneg_int(f"{where}.capacity", top["capacity"]),
            tuple(_nonneg_int(f"{where}.actual_rank_rows[{r}]", x) for r, x in enumerate(actual)),
            tuple(_nonneg_int(f"{where}.native_rank_rows[{r}]", x) for r, x in enumerate(native)),
        )

    def canonical(self) -> bytes:
        """Canonical JSON of :meth:`to_dict` (rank order is part of the key)."""
        return canonical_json(self.to_dict())

    def sha256(self) -> str:
        """SHA-256 of :meth:`canonical`: the geometry's identity in our artifacts."""
        return sha256_hex(self.canonical())

    def flat_features(self) -> tuple[int, ...]:
        """Every rank's twelve features, rank by rank (the Parquet column form)."""
        return tuple(v for f in self.rank_features for v in f.values())

    @classmethod
    def from_flat(
        cls, flat: Sequence[int], capacity: int, actual: Sequence[int], native: Sequence[int]
    ) -> MixedGeometry:
        """Inverse of :meth:`flat_features` plus the other three parts.

        Raises:
            ConfigError: the flat features are not twelve per rank of ``actual``.
        """
        n = len(GEOMETRY_FEATURES)
        if len(flat) != n * len(actual) or len(actual) != len(native) or not actual:
            raise ConfigError(
                f"flat geometry needs {n} features per rank for {len(actual)} ranks, got {len(flat)}"
            )
        feats = tuple(RankFeatures.from_values(flat[i : i + n]) for i in range(0, len(flat), n))
        return cls(feats, int(capacity), tuple(int(x) for x in actual), tuple(int(x) for x in native))


def paid_bucket(native_rank_rows: Sequence[int], buckets: Sequence[int]) -> int | None:
    """The smallest body bucket holding every rank's native rows, or None when none does."""
    top = max(native_rank_rows, default=0)
    return next((b for b in sorted(buckets) if b >= top), None)


def candidate_rows(features: RankFeatures, capacity: int, k: int, *, min_verify_len: int = 1) -> int | None:
    """The actual rows the runtime builds for one rank at ``capacity``, or None when not offered.

    ``reserve + min(capacity − reserve, (K+1)·eligible)``, offered only when every eligible
    generation keeps its anchor and ``min_verify_len`` draft tokens:
    ``capacity − reserve ≥ (1 + min_verify_len)·eligible``.
    """
    reserve, eligible = features.reserve, features.eligible_generations
    room = capacity - reserve
    if room < (1 + min_verify_len) * eligible:
        return None
    return reserve + min(room, (k + 1) * eligible)


def native_rows(features: RankFeatures, k: int) -> int:
    """A rank's native rows: context rows, fixed rows and K+1 rows per eligible generation."""
    return features.context_rows + features.fixed_generation_rows + (k + 1) * features.eligible_generations


def step_candidates(
    features: Sequence[RankFeatures], k: int, buckets: Sequence[int], *, min_verify_len: int = 1
) -> tuple[int | None, tuple[MixedGeometry, ...]]:
    """The native bucket of a step and every compact geometry the runtime would look up for it.

    A bucket is a candidate when it is below the native (paid) bucket and every rank can carry
    its reserve and the verify floor of its eligible generations there; such a geometry is compact
    by construction (the largest rank loses rows). Steps without a real context request have no
    candidates (the mixed path prices no all-decode step), nor do steps whose native rows exceed
    the largest bucket.

    Returns:
        (the paid bucket or None, the candidate geometries by increasing capacity).
    """
    native = tuple(native_rows(f, k) for f in features)
    paid = paid_bucket(native, buckets)
    if paid is None or not any(f.real_context_requests for f in features):
        return paid, ()
    out = []
    for capacity in sorted(buckets):
        if capacity >= paid:
            break
        rows = [candidate_rows(f, capacity, k, min_verify_len=min_verify_len) for f in features]
        if any(r is None for r in rows):
            continue
        actual = tuple(int(r) for r in rows if r is not None)
        if actual != native:
            out.append(MixedGeometry(tuple(features), capacity, actual, native))
    return paid, tuple(out)


def dead_cell(native_lower_ms: float, candidate_upper_ms: float, minimum_predicted_gain: float) -> bool:
    """True when the cell can never be chosen: ``candidate_upper · (1 + gain) > native_lower``.

    The candidate's yield never exceeds native's, so its score beats native's by the margin only
    when the time ratio does.
    """
    return candidate_upper_ms * (1.0 + minimum_predicted_gain) > native_lower_ms


def geometry_violations(
    geometry: MixedGeometry,
    *,
    k: int,
    buckets: Sequence[int],
    world_size: int | None = None,
    min_verify_len: int = 1,
    costs: tuple[float, float, float] | None = None,
) -> list[GeometryViolation]:
    """Every invariant the geometry breaks (empty: valid), in :data:`GEOMETRY_RULES` order.

    Args:
        geometry: the cell's key.
        k: physical draft length K (full-width generations take K+1 rows).
        buckets: the captured body buckets.
        world_size: the ranks the geometry must have (None: any, but at least one).
        min_verify_len: the runtime's verify floor (draft tokens an eligible generation keeps).
        costs: ``(native_lower_ms, candidate_upper_ms, minimum_predicted_gain)`` to check the dead-cell
            rule; None skips it.
    """
    out = _shape_violations(geometry, buckets, world_size)
    if any(v.rule in ("ranks", "integers") for v in out):
        return out  # nothing below can be read rank by rank
    feats, actual, native = geometry.rank_features, geometry.actual_rank_rows, geometry.native_rank_rows
    for r, f in enumerate(feats):
        out.extend(_rank_violations(r, f, actual[r], native[r], geometry.capacity, k))
    if not any(f.real_context_requests for f in feats):
        out.append(
            GeometryViolation(
                "all_decode",
                None,
                "no rank has a real context request; all-decode steps are priced by the decode table",
            )
        )
    if actual == native:
        out.append(
            GeometryViolation(
                "not_compact", None, "actual rows equal native rows on every rank; a cell must be compact"
            )
        )
    top = max(native)
    largest = max(buckets) if buckets else 0
    if top > largest:
        out.append(
            GeometryViolation(
                "native_grid",
                None,
                f"largest native row count {top} exceeds the largest body bucket {largest}",
            )
        )
    if not any(v.rule in ("fixed_rows", "native_rows") for v in out):
        out.extend(_reach_violations(geometry, k, min_verify_len))
    if costs is not None:
        native_lower, candidate_upper, gain = costs
        if dead_cell(native_lower, candidate_upper, gain):
            out.append(
                GeometryViolation(
                    "dead",
                    None,
                    f"candidate_upper_ms {candidate_upper:.6g} × (1 + gain {gain:g}) > native_lower_ms "
                    f"{native_lower:.6g}: the runtime can never choose this cell",
                )
            )
    return out


def _shape_violations(
    geometry: MixedGeometry, buckets: Sequence[int], world_size: int | None
) -> list[GeometryViolation]:
    """The rules read before any rank's rows: one entry per rank, a captured capacity, wire integers."""
    out: list[GeometryViolation] = []
    feats, actual, native = geometry.rank_features, geometry.actual_rank_rows, geometry.native_rank_rows
    ranks = len(feats)
    if (
        not ranks
        or len(actual) != ranks
        or len(native) != ranks
        or (world_size is not None and ranks != world_size)
    ):
        want = f"{world_size}" if world_size is not None else "one or more"
        out.append(
            GeometryViolation(
                "ranks",
                None,
                f"{ranks} rank feature objects, {len(actual)} actual and {len(native)} native row counts; "
                f"need {want} of each, in rank order",
            )
        )
        return out
    if geometry.capacity not in buckets:
        out.append(
            GeometryViolation(
                "capacity",
                None,
                f"capacity {geometry.capacity} is not a captured body bucket {list(buckets)}",
            )
        )
    for r in range(ranks):
        values = (*feats[r].values(), actual[r], native[r])
        if any(type(v) is not int or not 0 <= v < _WIRE_LIMIT for v in values):
            out.append(
                GeometryViolation(
                    "integers", r, "every feature and row count must be an integer in [0, 2^63)"
                )
            )
    return out


def _rank_violations(
    r: int, f: RankFeatures, actual: int, native: int, capacity: int, k: int
) -> list[GeometryViolation]:
    """One rank's counting rules: features consistent, fixed and native rows as the runtime
    builds them, actual rows between the reserved floor and min(native, capacity)."""
    out: list[GeometryViolation] = []

    def bad(rule: str, message: str) -> None:
        out.append(GeometryViolation(rule, r, message))

    full = k + 1
    gens, elig = f.generation_requests, f.eligible_generations
    if f.real_context_requests > f.context_requests:
        bad(
            "real_context",
            f"real_context_requests {f.real_context_requests} > context_requests {f.context_requests}",
        )
    if elig > gens:
        bad("eligible", f"eligible_generations {elig} > generation_requests {gens}")
    if f.bootstrap_generations > gens - elig:
        bad(
            "bootstrap",
            f"bootstrap_generations {f.bootstrap_generations} > generations {gens} − eligible {elig}; "
            "a bootstrap generation is never eligible",
        )
    if f.generation_history_max > f.generation_history_sum:
        bad(
            "history",
            f"generation_history_max {f.generation_history_max} > generation_history_sum "
            f"{f.generation_history_sum}",
        )
    if f.fixed_generation_rows != full * (gens - elig):
        bad(
            "fixed_rows",
            f"fixed_generation_rows is {f.fixed_generation_rows}, expected {full} × (generations {gens} − "
            f"eligible {elig}) = {full * (gens - elig)} (non-eligible generations keep K+1 rows)",
        )
    want_native = f.context_rows + f.fixed_generation_rows + full * elig
    if native != want_native:
        bad(
            "native_rows",
            f"native rows {native}, expected context {f.context_rows} + fixed {f.fixed_generation_rows} "
            f"+ {full} × eligible {elig} = {want_native}",
        )
    floor = f.context_rows + f.fixed_generation_rows + elig
    if actual < floor:
        bad(
            "reserved_rows",
            f"actual rows {actual} < context {f.context_rows} + fixed {f.fixed_generation_rows} + "
            f"eligible {elig} = {floor}; context and full-K rows are never discounted",
        )
    ceiling = min(native, capacity)
    if actual > ceiling:
        bad(
            "capacity_rows",
            f"actual rows {actual} > min(native rows {native}, capacity {capacity}) = {ceiling}",
        )
    return out


def _reach_violations(geometry: MixedGeometry, k: int, min_verify_len: int) -> list[GeometryViolation]:
    """Ranks whose actual rows the runtime never builds at the cell's capacity (no lookup matches)."""
    out: list[GeometryViolation] = []
    full = k + 1
    for r, f in enumerate(geometry.rank_features):
        built = candidate_rows(f, geometry.capacity, k, min_verify_len=min_verify_len)
        actual = geometry.actual_rank_rows[r]
        if built is None:
            out.append(
                GeometryViolation(
                    "unreachable",
                    r,
                    f"capacity {geometry.capacity} − reserve {f.reserve} < {1 + min_verify_len} × eligible "
                    f"{f.eligible_generations}: the runtime never offers this capacity, so no lookup can match",
                )
            )
        elif built != actual:
            out.append(
                GeometryViolation(
                    "unreachable",
                    r,
                    f"the runtime builds {built} rows at capacity {geometry.capacity} (reserve {f.reserve} + "
                    f"min({geometry.capacity - f.reserve}, {full} × eligible {f.eligible_generations})), not "
                    f"{actual}: no lookup can match this cell",
                )
            )
    return out


def require_geometry(
    geometry: MixedGeometry,
    *,
    where: str,
    k: int,
    buckets: Sequence[int],
    world_size: int | None = None,
    min_verify_len: int = 1,
    costs: tuple[float, float, float] | None = None,
) -> None:
    """Raise :class:`MixedGeometryError` when the geometry breaks an invariant.

    Args:
        where: names the cell in the message (e.g. ``mixed cell 3 (capacity 128)``).
        Other arguments: as :func:`geometry_violations`.
    """
    found = geometry_violations(
        geometry, k=k, buckets=buckets, world_size=world_size, min_verify_len=min_verify_len, costs=costs
    )
    if found:
        raise MixedGeometryError(found, where)


def distinct(geometries: Iterable[MixedGeometry], *, what: str = "mixed cells") -> None:
    """Refuse two cells with one geometry (rank order is part of the key).

    Raises:
        ConfigError: the first duplicate, naming both positions.
    """
    seen: dict[MixedGeometry, int] = {}
    for i, g in enumerate(geometries):
        if g in seen:
            raise ConfigError(
                f"{what} {seen[g]} and {i} share one geometry (capacity {g.capacity}); every cell needs its own "
                "geometry (the runtime looks cells up exactly)"
            )
        seen[g] = i


# ---------------------------------------------------------------------------------------------
# The consumer's live identity
# ---------------------------------------------------------------------------------------------

#: The six hash fields of the consumer's live identity, in the identity's order.
IDENTITY_HASHES: tuple[str, ...] = (
    "source_tree_sha256",
    "runtime_snapshot_sha256",
    "model_config_sha256",
    "gpu_class_sha256",
    "topology_sha256",
    "selector_identity_sha256",
)


@dataclass(frozen=True, slots=True)
class MixedIdentity:
    """The ten-field identity the consumer binds mixed evidence to.

    The six hashes name the engine source tree, the runtime snapshot, the model config, the GPU
    class, the topology and the selector; the other four name the route the costs were measured
    on. :meth:`derive` computes the hashes from a deployment fingerprint (TensorRT-LLM's source
    does not say how it computes them: the derivation is documented in ``docs/mixed.md``); an
    identity observed on the deployment can be given instead and must then agree.
    """

    source_tree_sha256: str
    runtime_snapshot_sha256: str
    model_config_sha256: str
    gpu_class_sha256: str
    topology_sha256: str
    selector_identity_sha256: str
    physical_k: int
    world_size: int
    body_buckets: tuple[int, ...]
    execution_mode: str

    def __post_init__(self) -> None:
        for name in IDENTITY_HASHES:
            if not is_sha256_hex(getattr(self, name)):
                raise ConfigError(f"mixed identity {name} must be 64 lowercase hex characters")
        for name in ("physical_k", "world_size"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"mixed identity {name} must be an integer >= 1, got {value!r}")
        buckets = tuple(self.body_buckets)
        if (
            not buckets
            or any(type(b) is not int or b < 1 for b in buckets)
            or list(buckets) != sorted(set(buckets))
        ):
            raise ConfigError(
                f"mixed identity body_buckets must be strictly increasing integers, got {buckets!r}"
            )
        object.__setattr__(self, "body_buckets", buckets)
        if not isinstance(self.execution_mode, str) or not self.execution_mode:
            raise ConfigError("mixed identity execution_mode must be a non-empty string")

    def to_dict(self) -> dict[str, Any]:
        """The consumer's JSON object (body buckets as a list)."""
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["body_buckets"] = list(self.body_buckets)
        return out

    @classmethod
    def from_dict(cls, data: object, *, where: str = "identity") -> MixedIdentity:
        """Strict: exactly the ten fields, integers that are JSON integers, buckets a list.

        Raises:
            ConfigError: a malformed identity (the message names the field).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        top = _fields(data, names, names, where)
        if not isinstance(top["body_buckets"], list):
            raise ConfigError(f"{where}.body_buckets must be a list")
        return cls(**{**dict(top), "body_buckets": tuple(top["body_buckets"])})

    @classmethod
    def derive(
        cls,
        fingerprint: Fingerprint,
        *,
        selector_identity: str,
        body_buckets: Sequence[int],
        execution_mode: str,
        world_size: int | None = None,
    ) -> MixedIdentity:
        """The identity of a deployment from its fingerprint (see ``docs/mixed.md``).

        Each hash is the SHA-256 of the canonical JSON of the fingerprint fields it names:
        source tree = {source_head, source_diff_sha256}; runtime snapshot = {runtime_snapshot};
        model config = the fingerprint's ``model_config_sha256`` as is; GPU class =
        {gpu, gpu_snapshot_sha256}; topology = {topology, gpu_count}.

        Raises:
            ConfigError: the fingerprint lacks a field the identity needs.
        """
        need = (
            "source_head",
            "source_diff_sha256",
            "runtime_snapshot",
            "model_config_sha256",
            "gpu",
            "gpu_snapshot_sha256",
            "topology",
            "gpu_count",
            "max_draft_len",
        )
        missing = fingerprint.missing(need)
        if missing:
            raise ConfigError(
                f"the mixed identity needs fingerprint fields {list(missing)}; re-run the sweep with them "
                "(--fingerprint, or the backend's model config for model_config_sha256)"
            )
        fp = fingerprint.to_dict()

        def digest(*names: str) -> str:
            return sha256_hex(canonical_json({n: fp[n] for n in names}))

        assert fingerprint.max_draft_len is not None and fingerprint.gpu_count is not None
        return cls(
            source_tree_sha256=digest("source_head", "source_diff_sha256"),
            runtime_snapshot_sha256=digest("runtime_snapshot"),
            model_config_sha256=str(fp["model_config_sha256"]),
            gpu_class_sha256=digest("gpu", "gpu_snapshot_sha256"),
            topology_sha256=digest("topology", "gpu_count"),
            selector_identity_sha256=selector_identity,
            physical_k=fingerprint.max_draft_len,
            world_size=world_size if world_size is not None else fingerprint.gpu_count,
            body_buckets=tuple(int(b) for b in body_buckets),
            execution_mode=execution_mode,
        )

    def diff(self, other: MixedIdentity) -> list[str]:
        """Names of the fields (sorted) where the two identities differ."""
        a, b = self.to_dict(), other.to_dict()
        return sorted(n for n in a if a[n] != b[n])


# ---------------------------------------------------------------------------------------------
# The measured route, as the signed mixed artifacts state it
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MixedRoute:
    """What a mixed measurement is bound to beyond the deployment fingerprint.

    Attributes:
        physical_k: K (the fingerprint's ``max_draft_len``).
        world_size: ranks of every geometry (the fingerprint's ``gpu_count``).
        body_buckets: the captured body buckets, increasing.
        execution_mode: the prefill graph mode (``BREAKABLE`` on TensorRT-LLM's route).
        min_verify_len: draft tokens an eligible generation always keeps.
    """

    physical_k: int
    world_size: int
    body_buckets: tuple[int, ...]
    execution_mode: str = MIXED_EXECUTION_MODE
    min_verify_len: int = 1

    def __post_init__(self) -> None:
        for name in ("physical_k", "world_size", "min_verify_len"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ConfigError(f"mixed route {name} must be an integer >= 1, got {value!r}")
        if self.min_verify_len > self.physical_k:
            raise ConfigError(f"min_verify_len {self.min_verify_len} exceeds K={self.physical_k}")
        buckets = tuple(self.body_buckets)
        if (
            not buckets
            or any(type(b) is not int or b < 1 for b in buckets)
            or list(buckets) != sorted(set(buckets))
        ):
            raise ConfigError(
                f"mixed body buckets must be strictly increasing integers >= 1, got {list(buckets)}"
            )
        object.__setattr__(self, "body_buckets", buckets)
        if (
            not isinstance(self.execution_mode, str)
            or not self.execution_mode.isprintable()
            or not self.execution_mode
        ):
            raise ConfigError(f"mixed execution mode must be a printable string, got {self.execution_mode!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the signed summaries' ``route``)."""
        return {
            "physical_k": self.physical_k,
            "world_size": self.world_size,
            "body_buckets": list(self.body_buckets),
            "execution_mode": self.execution_mode,
            "min_verify_len": self.min_verify_len,
        }

    @classmethod
    def from_dict(cls, data: object, *, where: str = "route") -> MixedRoute:
        """Strict: exactly the five fields.

        Raises:
            ConfigError: a malformed route.
        """
        names = {"physical_k", "world_size", "body_buckets", "execution_mode", "min_verify_len"}
        top = _fields(data, names, names, where)
        if not isinstance(top["body_buckets"], list):
            raise ConfigError(f"{where}.body_buckets must be a list")
        return cls(**{**dict(top), "body_buckets": tuple(top["body_buckets"])})


@dataclass(frozen=True, slots=True)
class MixedLive:
    """The route facts the live deployment states (engine arguments); None: not established."""

    body_buckets: tuple[int, ...] | None = None
    execution_mode: str | None = None

    def __post_init__(self) -> None:
        if self.body_buckets is not None:
            object.__setattr__(self, "body_buckets", tuple(int(b) for b in self.body_buckets))
