"""Mixed prefill+decode cells: what a mixed sweep measures and the shape each backend builds.

A mixed sweep measures *groups*: one mixed step (per rank: context chunks, generation requests)
whose native width — every generation at K+1 rows, in the smallest body bucket holding the
largest rank — is the comparator of the group's *cells*, the compact geometries the runtime
would look up for that step (one per smaller body bucket every rank can carry). A cell is
measured paired with its group's native arm in the same rounds, exactly as a decode cell (G, V)
is paired with (G, 0) (DESIGN §7, §10).

:class:`MixedCellSpec` is the harness's cell (group, capacity; capacity 0 is the native arm).
:class:`MixedShape` is what a backend builds for one rank: the body capacity, the rank's context
chunks and its generation requests with the rows each verifies. :func:`plan_from_workload` picks
the groups and cells from a recorded workload's mixed steps (the cells that can pay most often
first, at most :data:`~dspark_calibrate.schemas.MAX_MIXED_CELLS` cells; see
:func:`plan_from_steps`); :func:`plan_from_grid` reads a user's grid of steps. Pure: no I/O
beyond :func:`read_grid`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dspark_calibrate.artifacts import (
    ContextChunk,
    GenerationRequest,
    JsonError,
    MixedGeometry,
    MixedRoute,
    MixedStep,
    RankFeatures,
    canonical_json,
    loads_strict,
    native_rows,
    paid_bucket,
    require_geometry,
    sha256_hex,
    step_candidates,
)
from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.mixed import first_chunk
from dspark_calibrate.schemas import MAX_MIXED_CELLS

__all__ = [
    "GRID_FORMAT",
    "MIXED_MINIMUM_GAIN",
    "MIXED_NATIVE",
    "SKIP_CANNOT_PAY",
    "SKIP_FIRST_CHUNK",
    "Cell",
    "MixedCellSpec",
    "MixedGroup",
    "MixedPlan",
    "MixedShape",
    "OutputCheck",
    "gain_bound",
    "group_sha256",
    "plan_from_geometries",
    "plan_from_grid",
    "plan_from_steps",
    "plan_from_workload",
    "read_grid",
]

#: The capacity that names a group's native arm (full width in its paid bucket).
MIXED_NATIVE = 0
#: Format tag of a ``--mixed-grid`` file.
GRID_FORMAT = "dspark-calibrate/mixed-grid/v1"
#: A candidate left unmeasured because each of its recorded steps runs a request's first context
#: chunk: the runtime keeps such a step native whatever the table holds.
SKIP_FIRST_CHUNK = "first_chunk"
#: A candidate left unmeasured because none of its recorded steps could gain the consumer's
#: minimum even at the most favourable time (:func:`gain_bound`).
SKIP_CANNOT_PAY = "cannot_pay"
#: TensorRT-LLM's floor on the mixed cost file's ``minimum_predicted_gain``: the mixed path never
#: loosens its 1% immediate-goodput gate.
MIXED_MINIMUM_GAIN = 0.01


@dataclass(frozen=True, slots=True, order=True)
class MixedCellSpec:
    """One mixed cell of a sweep: a group (step) and a capacity (0: the group's native arm).

    Orders by (group, capacity), the canonical row order of a mixed sweep.
    """

    group: int
    capacity: int
    k: int

    def __post_init__(self) -> None:
        for name in ("group", "capacity", "k"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ConfigError(f"mixed cell {name} must be an integer >= 0, got {value!r}")
        if self.k < 1:
            raise ConfigError(f"K must be >= 1, got {self.k}")

    @property
    def kind(self) -> CellKind:
        """Native (capacity 0) or compact."""
        return CellKind.NATIVE if self.capacity == MIXED_NATIVE else CellKind.COMPACT

    @property
    def native(self) -> MixedCellSpec:
        """The group's native arm (the comparator this cell's saving is paired with)."""
        return MixedCellSpec(self.group, MIXED_NATIVE, self.k)

    @property
    def key(self) -> tuple[int, int]:
        """(group, capacity): the cell's identity within one sweep (journal and samples keys)."""
        return (self.group, self.capacity)

    def label(self) -> str:
        """Short human name, e.g. ``M3/native`` or ``M3/C128``."""
        arm = "native" if self.capacity == MIXED_NATIVE else f"C{self.capacity}"
        return f"M{self.group}/{arm}"


#: Any cell the sweep harness measures.
Cell = CellSpec | MixedCellSpec


@dataclass(frozen=True, slots=True)
class MixedShape:
    """What one rank runs in one mixed step (a backend's input).

    Attributes:
        k: physical draft length K.
        capacity: body rows the captured graph processes (pad rows included).
        context: the rank's context chunks.
        generations: the rank's generation requests.
        generation_rows: rows each generation verifies (anchor + draft tokens, 1..K+1).
    """

    k: int
    capacity: int
    context: tuple[ContextChunk, ...]
    generations: tuple[GenerationRequest, ...]
    generation_rows: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.generation_rows) != len(self.generations):
            raise ConfigError("a mixed shape needs one row count per generation")
        if any(not 1 <= r <= self.k + 1 for r in self.generation_rows):
            raise ConfigError(
                f"generation rows must lie in [1, K+1={self.k + 1}], got {list(self.generation_rows)}"
            )
        if self.rows > self.capacity:
            raise ConfigError(f"{self.rows} rows do not fit the body capacity {self.capacity}")

    @property
    def rows(self) -> int:
        """Real rows: context tokens plus generation rows."""
        return sum(c.size for c in self.context) + sum(self.generation_rows)

    def describe(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "k": self.k,
            "capacity": self.capacity,
            "context": [c.to_dict() for c in self.context],
            "generations": [g.to_dict() for g in self.generations],
            "generation_rows": list(self.generation_rows),
        }


@dataclass(frozen=True, slots=True)
class OutputCheck:
    """A backend's comparison of a cell's forward with its native arm's.

    Attributes:
        rows: rows whose greedy token both forwards produce (every verified generation row of the
            cell); 0 means the backend could not check.
        mismatches: how many of them disagree.
        detail: how the comparison was made (tolerances, what was skipped).
    """

    rows: int
    mismatches: int
    detail: str = ""


def _spread(total: int, caps: Sequence[int]) -> list[int]:
    """``total`` extra rows over slots with room ``caps``, as evenly as possible (first slots first)."""
    out = [0] * len(caps)
    left = total
    while left > 0:
        open_slots = [i for i, c in enumerate(caps) if out[i] < c]
        if not open_slots:
            raise ConfigError(f"{total} extra rows do not fit the eligible generations")
        for i in open_slots:
            if left == 0:
                break
            out[i] += 1
            left -= 1
    return out


def generation_rows(
    generations: Sequence[GenerationRequest], actual_rows: int, context_rows: int, k: int, min_verify_len: int
) -> tuple[int, ...]:
    """Rows per generation for a rank with ``actual_rows`` in all.

    Non-eligible generations keep K+1 rows; every eligible one keeps its anchor and the verify
    floor, and the rows left over are spread evenly over them (the measured shape: the runtime
    allocates them by confidence, which moves tokens between rows but not the rows' sum).

    Raises:
        ConfigError: the rows cannot carry the context, the fixed rows and the floor.
    """
    full = k + 1
    floor = 1 + min_verify_len
    fixed = [full for g in generations if not g.eligible]
    eligible = [g for g in generations if g.eligible]
    extra = actual_rows - context_rows - sum(fixed) - floor * len(eligible)
    if extra < 0:
        raise ConfigError(f"{actual_rows} rows cannot carry the context, fixed and verify-floor rows")
    grant = iter(_spread(extra, [full - floor] * len(eligible)))
    return tuple(full if not g.eligible else floor + next(grant) for g in generations)


def group_sha256(features: Sequence[RankFeatures]) -> str:
    """The identity of a group: SHA-256 of the canonical JSON of its rank features (rank order)."""
    return sha256_hex(canonical_json([f.to_dict() for f in features]))


@dataclass(frozen=True, slots=True)
class MixedGroup:
    """One measured step: its native arm and the compact cells measured against it.

    Attributes:
        index: the group's number in the sweep (the samples' ``mixed_group``).
        step: the step description the backends build (None for imported samples: no backend
            builds them).
        features: every rank's features.
        native_rows: every rank's native rows.
        native_capacity: the paid bucket of the native arm.
        cells: the compact geometries measured, by capacity.
        workload_steps: recorded steps with these features (0 for a user grid).
    """

    index: int
    step: MixedStep | None
    features: tuple[RankFeatures, ...]
    native_rows: tuple[int, ...]
    native_capacity: int
    cells: tuple[MixedGeometry, ...]
    workload_steps: int = 0

    @property
    def sha256(self) -> str:
        """:func:`group_sha256` of the features."""
        return group_sha256(self.features)

    def geometry(self, capacity: int) -> MixedGeometry:
        """The cell at ``capacity``.

        Raises:
            ConfigError: no cell of the group has that capacity.
        """
        for g in self.cells:
            if g.capacity == capacity:
                return g
        raise ConfigError(f"mixed step {self.index} has no cell at capacity {capacity}")

    def native_geometry(self) -> MixedGeometry:
        """The native arm as a geometry (capacity = paid bucket, actual rows = native rows)."""
        return MixedGeometry(self.features, self.native_capacity, self.native_rows, self.native_rows)

    def shape(self, capacity: int, rank: int, route: MixedRoute) -> MixedShape:
        """What ``rank`` runs for the cell at ``capacity`` (0: the native arm).

        Raises:
            ConfigError: the group has no step description (imported samples).
        """
        if self.step is None:
            raise ConfigError(f"mixed group {self.index} was imported; it has no step for a backend to build")
        part = self.step.ranks[rank]
        if capacity == MIXED_NATIVE:
            body, rows = self.native_capacity, self.native_rows[rank]
        else:
            body, rows = capacity, self.geometry(capacity).actual_rank_rows[rank]
        ctx_rows = sum(c.size for c in part.context)
        per_gen = generation_rows(part.generations, rows, ctx_rows, route.physical_k, route.min_verify_len)
        return MixedShape(route.physical_k, body, part.context, part.generations, per_gen)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (enters the sweep's configuration digest)."""
        return {
            "index": self.index,
            "step": self.step.to_dict() if self.step is not None else None,
            "features": [f.to_dict() for f in self.features],
            "native_capacity": self.native_capacity,
            "capacities": [g.capacity for g in self.cells],
            "workload_steps": self.workload_steps,
        }


@dataclass(frozen=True, slots=True)
class MixedPlan:
    """What a mixed sweep measures: the route and its groups.

    Attributes:
        route: K, world size, body buckets, execution mode, verify floor.
        groups: the groups, by index.
        source: where the steps came from (a workload's identity or a grid file).
        workload_mixed_steps: mixed steps of the source workload (0 for a grid).
        skipped: compact candidates of the source's steps left unmeasured, by why
            (:data:`SKIP_FIRST_CHUNK`, :data:`SKIP_CANNOT_PAY`); not part of the configuration.
    """

    route: MixedRoute
    groups: tuple[MixedGroup, ...]
    source: str = ""
    workload_mixed_steps: int = 0
    skipped: Mapping[str, int] = field(default_factory=dict)
    _by_key: dict[tuple[int, int], MixedGeometry] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ConfigError("the mixed sweep has no step to measure")
        cells = sum(len(g.cells) for g in self.groups)
        if cells > MAX_MIXED_CELLS:
            raise ConfigError(
                f"{cells} mixed cells to measure; TensorRT-LLM's mixed cost file holds at most {MAX_MIXED_CELLS} "
                "(drop steps from the grid, or lower --mixed-max-cells)"
            )
        seen: dict[MixedGeometry, str] = {}
        for grp in self.groups:
            for geo in grp.cells:
                where = f"mixed step {grp.index} at capacity {geo.capacity}"
                if geo in seen:
                    raise ConfigError(f"{where} has the same geometry as {seen[geo]}; list each step once")
                seen[geo] = where
        object.__setattr__(
            self, "_by_key", {(grp.index, geo.capacity): geo for grp in self.groups for geo in grp.cells}
        )

    def cells(self) -> tuple[MixedCellSpec, ...]:
        """Every cell to measure: each group's native arm and its compact cells, sorted."""
        k = self.route.physical_k
        out = [MixedCellSpec(g.index, MIXED_NATIVE, k) for g in self.groups]
        out += [MixedCellSpec(g.index, c.capacity, k) for g in self.groups for c in g.cells]
        return tuple(sorted(out))

    def group(self, index: int) -> MixedGroup:
        """The group with that index."""
        return self.groups[index]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (enters the sweep's configuration digest and the journal header)."""
        return {
            "route": self.route.to_dict(),
            "source": self.source,
            "groups": [g.to_dict() for g in self.groups],
        }


def _group(
    index: int,
    step: MixedStep,
    route: MixedRoute,
    *,
    workload_steps: int = 0,
    capacities: Iterable[int] | None = None,
) -> MixedGroup:
    k = route.physical_k
    if step.world_size != route.world_size:
        raise ConfigError(
            f"mixed step {index} has {step.world_size} ranks; the deployment has world size {route.world_size}"
        )
    feats = step.features(k)
    native = tuple(native_rows(f, k) for f in feats)
    paid = paid_bucket(native, route.body_buckets)
    if paid is None:
        raise ConfigError(
            f"mixed step {index}: its largest rank has {max(native)} native rows, above the largest body bucket "
            f"{max(route.body_buckets)}; the engine does not run such a step in a captured body"
        )
    _, cells = step_candidates(feats, k, route.body_buckets, min_verify_len=route.min_verify_len)
    if capacities is not None:
        wanted = set(capacities)
        offered = {c.capacity for c in cells}
        unknown = sorted(wanted - offered)
        if unknown:
            raise ConfigError(
                f"mixed step {index}: capacities {unknown} are not compact candidates of the step (offered: "
                f"{sorted(offered)}); the runtime would never look those geometries up"
            )
        cells = tuple(c for c in cells if c.capacity in wanted)
    for c in cells:
        require_geometry(
            c,
            where=f"mixed step {index} at capacity {c.capacity}",
            k=k,
            buckets=route.body_buckets,
            world_size=route.world_size,
            min_verify_len=route.min_verify_len,
        )
    return MixedGroup(index, step, feats, native, paid, cells, workload_steps)


def plan_from_geometries(geometries: Sequence[MixedGeometry], route: MixedRoute, *, source: str) -> MixedPlan:
    """A plan of measured geometries (``import-samples``): natives and cells, grouped by features.

    A geometry whose actual rows equal its native rows is a native arm; its capacity must be the
    paid bucket. Every cell must pass the invariants and have its group's native arm.

    Raises:
        ConfigError: an invalid cell, a native arm at another bucket, or a cell without native arm.
    """
    k = route.physical_k
    order: dict[tuple[RankFeatures, ...], list[MixedGeometry]] = {}
    natives: set[tuple[RankFeatures, ...]] = set()
    for g in geometries:
        feats = g.rank_features
        order.setdefault(feats, [])
        if g.actual_rank_rows == g.native_rank_rows:
            paid = paid_bucket(g.native_rank_rows, route.body_buckets)
            if g.capacity != paid:
                raise ConfigError(
                    f"{source}: a native record at capacity {g.capacity}; the native arm runs in the paid bucket {paid}"
                )
            natives.add(feats)
        elif g not in order[feats]:
            order[feats].append(g)
    groups = []
    for i, (feats, cells) in enumerate(order.items()):
        if feats not in natives:
            raise ConfigError(
                f"{source}: mixed group {i} has cells but no native record (actual rows = native rows)"
            )
        native = tuple(native_rows(f, k) for f in feats)
        for c in cells:
            require_geometry(
                c,
                where=f"{source}: mixed group {i} at capacity {c.capacity}",
                k=k,
                buckets=route.body_buckets,
                world_size=route.world_size,
                min_verify_len=route.min_verify_len,
            )
        paid = paid_bucket(native, route.body_buckets)
        assert paid is not None
        groups.append(
            MixedGroup(i, None, feats, native, paid, tuple(sorted(cells, key=lambda c: c.capacity)))
        )
    return MixedPlan(route, tuple(groups), source=source)


def plan_from_grid(grid: Mapping[str, Any], route: MixedRoute, *, source: str = "grid") -> MixedPlan:
    """A plan from a user grid ``{"format": GRID_FORMAT, "steps": [{"step": {...}, "capacities": [...]}]}``.

    Each entry's ``step`` is a :class:`~dspark_calibrate.artifacts.MixedStep`; ``capacities``
    (optional) picks some of the step's candidate buckets (default: all of them).

    Raises:
        ConfigError: a malformed grid, a step of another world size, a capacity the runtime never
            offers, a duplicate geometry, or more than 256 cells.
    """
    if not isinstance(grid, Mapping) or grid.get("format") != GRID_FORMAT or set(grid) != {"format", "steps"}:
        raise ConfigError(f'{source}: a mixed grid is {{"format": "{GRID_FORMAT}", "steps": [...]}}')
    entries = grid["steps"]
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{source}: steps must be a non-empty list")
    groups = []
    for i, entry in enumerate(entries):
        where = f"{source}: steps[{i}]"
        if not isinstance(entry, Mapping) or not {"step"} <= set(entry) <= {"step", "capacities"}:
            raise ConfigError(f'{where} must be {{"step": ..., "capacities": [...]}} (capacities optional)')
        step = MixedStep.from_dict(entry["step"], where=f"{where}.step")
        if not step.has_real_context():
            raise ConfigError(
                f"{where}: no rank has a real context chunk; all-decode steps belong to the decode sweep"
            )
        caps = entry.get("capacities")
        if caps is not None and (not isinstance(caps, list) or not all(type(c) is int for c in caps)):
            raise ConfigError(f"{where}.capacities must be a list of integers")
        groups.append(_group(i, step, route, capacities=caps))
    return MixedPlan(route, tuple(groups), source=source)


def read_grid(path: Path, route: MixedRoute) -> MixedPlan:
    """Read a ``--mixed-grid`` JSON file (see :func:`plan_from_grid`).

    Raises:
        ConfigError: unreadable or malformed.
    """
    try:
        data = loads_strict(path.read_bytes(), what=str(path))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the mixed grid ({exc.strerror or exc})") from exc
    except JsonError as exc:
        raise ConfigError(str(exc)) from exc
    return plan_from_grid(data, route, source=str(path))


def gain_bound(
    step: MixedStep,
    accepted: Sequence[np.ndarray],
    geometry: MixedGeometry,
    native_capacity: int,
    k: int,
    min_verify_len: int,
) -> float:
    """The most a recorded step's goodput can rise at ``geometry`` (a fraction; below 0: it falls).

    Tokens: at full width an eligible generation emits ``1 + a`` (``a`` its accepted drafts, as
    recorded); at the geometry's rows it keeps its anchor and floor and the rank's extra rows go
    where they are accepted, which no allocation beats: ``Σ (1 + min(a, floor)) + min(extra,
    Σ max(0, a − floor))``. Time: a body bucket's step costs at least in proportion to its
    capacity (a part of the step does not shrink with the rows), so ``T(C) / T(paid) ≥ C / paid``.
    The bound is then ``kept · paid / C − 1``, ``kept`` the candidate's share of the full width's
    tokens over the eligible generations (the ones the mixed path may shorten).

    Args:
        step: the recorded step.
        accepted: per rank, the accepted draft tokens of its generations, in the rank's order.
        geometry: a compact candidate of the step (:func:`~dspark_calibrate.artifacts.step_candidates`).
        native_capacity: the step's paid bucket.
        k: physical draft length K.
        min_verify_len: the runtime's verify floor.

    Raises:
        ConfigError: ``accepted`` does not hold one value per generation of each rank.
    """
    full = kept = 0
    for rank, (part, acc, rows) in enumerate(
        zip(step.ranks, accepted, geometry.actual_rank_rows, strict=True)
    ):
        if len(acc) != len(part.generations):
            raise ConfigError(
                f"rank {rank} of a mixed step has {len(part.generations)} generations and {len(acc)} accepted counts"
            )
        f = geometry.rank_features[rank]
        mask = np.array([g.eligible for g in part.generations], dtype=bool)
        a = np.clip(np.asarray(acc, dtype=np.int64)[mask], 0, k)
        extra = rows - f.reserve - (1 + min_verify_len) * f.eligible_generations
        full += int((1 + a).sum())
        kept += int((1 + np.minimum(a, min_verify_len)).sum()) + min(
            max(extra, 0), int(np.maximum(a - min_verify_len, 0).sum())
        )
    if full == 0:
        return -1.0
    return kept / full * native_capacity / geometry.capacity - 1.0


def _cell_score(
    geometry: MixedGeometry,
    steps: Sequence[MixedStep],
    accepted: Sequence[Sequence[np.ndarray]] | None,
    paid: int,
    route: MixedRoute,
) -> float:
    """How much measuring ``geometry`` can be worth over the recorded ``steps`` that could use it:
    without acceptance, steps times the rows it saves on the largest rank; with it, the sum of
    the :func:`gain_bound` of the steps where the bound reaches the consumer's minimum gain."""
    k, floor = route.physical_k, route.min_verify_len
    if accepted is None:
        return float(len(steps) * (max(geometry.native_rank_rows) - max(geometry.actual_rank_rows)))
    bounds = (gain_bound(s, a, geometry, paid, k, floor) for s, a in zip(steps, accepted, strict=True))
    return float(sum(b for b in bounds if b >= MIXED_MINIMUM_GAIN))


def plan_from_steps(
    steps: Sequence[MixedStep],
    route: MixedRoute,
    *,
    max_cells: int = MAX_MIXED_CELLS,
    max_groups: int = MAX_MIXED_CELLS,
    source: str = "workload",
    accepted: Sequence[Sequence[np.ndarray]] | None = None,
) -> MixedPlan:
    """Pick what to measure from recorded mixed steps: the cells that can pay most often first.

    Steps are grouped by their rank features (one native arm each). A compact candidate of a
    group is worth measuring only on its steps that the runtime may run compact: a step running a
    request's first context chunk stays native (:data:`SKIP_FIRST_CHUNK` when every step does).
    Given the recorded acceptance (``accepted``, per step and rank), a candidate is scored by the
    sum over those steps of :func:`gain_bound` where it reaches the consumer's 1% minimum, and
    left out when it reaches it on none (:data:`SKIP_CANNOT_PAY`: measuring it could only show
    that); without, by those steps times the rows it saves on the largest rank. Cells are taken
    by score (ties: more frequent, then the canonical geometry) up to ``max_cells``. Their groups
    are measured, and then the most frequent remaining groups' native arms (every mixed step needs
    a measured time for the gain) up to ``max_groups`` groups in all.

    Raises:
        ConfigError: no step has a real context chunk within the body buckets, the limits are
            out of range, or ``accepted`` does not match the steps.
    """
    if not 1 <= max_cells <= MAX_MIXED_CELLS:
        raise ConfigError(f"--mixed-max-cells must be in [1, {MAX_MIXED_CELLS}], got {max_cells}")
    if max_groups < 1:
        raise ConfigError(f"the mixed group limit must be >= 1, got {max_groups}")
    if accepted is not None and len(accepted) != len(steps):
        raise ConfigError(f"{len(steps)} mixed steps and {len(accepted)} accepted-count entries")
    k = route.physical_k
    members: dict[tuple[RankFeatures, ...], list[int]] = {}
    for i, step in enumerate(steps):
        if step.world_size == route.world_size and step.has_real_context():
            members.setdefault(step.features(k), []).append(i)
    scored: list[tuple[tuple[float, int, bytes], tuple[RankFeatures, ...], int]] = []
    frequent: list[tuple[int, tuple[RankFeatures, ...]]] = []
    skipped = {SKIP_FIRST_CHUNK: 0, SKIP_CANNOT_PAY: 0}
    for feats, idx in members.items():
        native = tuple(native_rows(f, k) for f in feats)
        paid = paid_bucket(native, route.body_buckets)
        if paid is None:
            continue
        frequent.append((len(idx), feats))
        _, cells = step_candidates(feats, k, route.body_buckets, min_verify_len=route.min_verify_len)
        open_steps = [i for i in idx if not first_chunk(steps[i])]
        for c in cells:
            if not open_steps:
                skipped[SKIP_FIRST_CHUNK] += 1
                continue
            acc = None if accepted is None else [accepted[i] for i in open_steps]
            score = _cell_score(c, [steps[i] for i in open_steps], acc, paid, route)
            if score <= 0:
                skipped[SKIP_CANNOT_PAY] += 1
                continue
            scored.append(((-score, -len(idx), c.canonical()), feats, c.capacity))
    if not frequent:
        raise ConfigError(
            f"{source}: no mixed step with a real context chunk fits the body buckets {list(route.body_buckets)} "
            f"at world size {route.world_size}; record a workload with prefill traffic on this deployment"
        )
    return _plan(route, steps, members, scored, frequent, max_cells, max_groups, source, skipped)


def _plan(
    route: MixedRoute,
    steps: Sequence[MixedStep],
    members: Mapping[tuple[RankFeatures, ...], Sequence[int]],
    scored: list[tuple[tuple[float, int, bytes], tuple[RankFeatures, ...], int]],
    frequent: list[tuple[int, tuple[RankFeatures, ...]]],
    max_cells: int,
    max_groups: int,
    source: str,
    skipped: Mapping[str, int],
) -> MixedPlan:
    """The plan of :func:`plan_from_steps`: the best ``max_cells`` cells' groups first, then the
    most frequent other groups' native arms, up to ``max_groups`` groups."""
    scored.sort(key=lambda x: x[0])
    chosen: dict[tuple[RankFeatures, ...], list[int]] = {}
    for _, feats, cap in scored[:max_cells]:
        chosen.setdefault(feats, []).append(cap)
    frequent.sort(key=lambda x: (-x[0], canonical_json([f.to_dict() for f in x[1]])))
    order = [f for f in chosen] + [f for _, f in frequent if f not in chosen]
    order = order[: max(max_groups, len(chosen))]
    groups = []
    for i, feats in enumerate(order):
        idx = members[feats]
        groups.append(
            _group(i, steps[idx[0]], route, workload_steps=len(idx), capacities=chosen.get(feats, []))
        )
    return MixedPlan(
        route,
        tuple(groups),
        source=source,
        workload_mixed_steps=sum(len(v) for v in members.values()),
        skipped={k: v for k, v in skipped.items() if v},
    )


def plan_from_workload(workload: Any, route: MixedRoute, **limits: Any) -> MixedPlan:
    """:func:`plan_from_steps` over a workload's mixed steps (``workload.mixed_step_rows()``), with
    each generation's recorded acceptance (``workload.arrays()``, rows in the steps' order)."""
    rows = workload.mixed_step_rows()
    if not rows:
        raise ConfigError(
            f"{workload.source or 'workload'}: the workload has no mixed step (no context chunk); record one with "
            "prefill traffic, or give a --mixed-grid"
        )
    a = workload.arrays()
    accepted = []
    for m in rows:
        rank, acc = a.rank[m.start : m.stop], a.accepted[m.start : m.stop]
        accepted.append([acc[rank == r] for r in range(m.description.world_size)])
    return plan_from_steps(
        [m.description for m in rows],
        route,
        source=f"workload {workload.identity_sha256}",
        accepted=accepted,
        **limits,
    )
