"""Mixed prefill+decode evidence for build: the measured cells and what every mixed step does.

:class:`MixedGrid` holds a mixed sweep's measurements: per group (a step's rank features) its
native arm, and per cell (an exact geometry) its time, paired saving and the two bounds the
runtime decides with (:func:`paired_bounds`: the native arm's lower bound, and the candidate's
upper bound in the same frame, from the paired saving). :func:`prepare_mixed` replays
every mixed step of a workload through the runtime's own mixed selector
(:func:`~dspark_calibrate.runtime_plugin.mixed.choose_mixed`) and records its group, its choice
and its tokens; :mod:`.replay` prices the result in the same joint resampling as decode steps.

Pure: values in, values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc

from dspark_calibrate.artifacts import MixedGeometry, MixedRoute, RankFeatures, dead_cell, geometry_violations
from dspark_calibrate.calibrate.deployment.cells import CellTime
from dspark_calibrate.calibrate.deployment.workload import Workload
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.mixed import MixedCell, MixedCostTable, choose_mixed, mixed_windows
from dspark_calibrate.runtime_plugin.planner import Calibration

__all__ = [
    "MixedArm",
    "MixedCellTime",
    "MixedEvidence",
    "MixedGrid",
    "histories_follow_tokens",
    "paired_bounds",
    "prepare_mixed",
]


@dataclass(frozen=True, slots=True)
class MixedArm:
    """A measured group: one step's rank features and its native arm.

    Attributes:
        group_sha256: the group's identity (canonical hash of its rank features).
        features: every rank's features.
        native_capacity: the paid bucket.
        time: the native arm's time (``verifier_budget`` 0), with its level SD.
        mixed_group: the group's number in the sweep.
        workload_steps: recorded steps with these features when the sweep was planned.
    """

    group_sha256: str
    features: tuple[RankFeatures, ...]
    native_capacity: int
    time: CellTime
    mixed_group: int
    workload_steps: int = 0


@dataclass(frozen=True, slots=True)
class MixedCellTime:
    """A measured mixed cell.

    Attributes:
        geometry: the exact key.
        group: the index of its group in :attr:`MixedGrid.groups`.
        time: the cell's time and paired saving (``verifier_budget`` = its capacity).
        native_lower_ms, candidate_upper_ms: what the runtime decides with.
        measurement_result_sha256: the logical hash of the cell's paired samples.
        accuracy_rows, accuracy_mismatches: the backend's output check (0 rows: not checked).
        samples: the cell's kept samples; stop_reason: why it stopped.
        sha256: the geometry's identity (computed once).
    """

    geometry: MixedGeometry
    group: int
    time: CellTime
    native_lower_ms: float
    candidate_upper_ms: float
    measurement_result_sha256: str
    accuracy_rows: int
    accuracy_mismatches: int
    samples: int
    stop_reason: str
    sha256: str = ""

    def __post_init__(self) -> None:
        if not self.sha256:
            object.__setattr__(self, "sha256", self.geometry.sha256())


def paired_bounds(native_lower_ms: float, saving_ci_low: float) -> tuple[float, float]:
    """The two times the runtime decides a mixed cell with: ``(native_lower_ms, candidate_upper_ms)``.

    The runtime accepts a bucket when ``Y_c / candidate_upper_ms >= (1 + gain) · Y_n /
    native_lower_ms``: only the ratio ``candidate_upper_ms / native_lower_ms`` decides (buckets of
    one step share their native arm). That ratio must bound ``T(cell) / T(native)``, the
    quantity the sweep measures *paired* (both arms in the same rounds, DESIGN §7): its upper
    bound is ``1 − saving_ci_low``. The ends of the two arms' absolute intervals would bound it
    too, but each carries the level shift the two arms share (the process, the clocks), which
    cancels in the ratio: on one H200 that made cells "dead" whose paired saving was 7-14%, its
    lower bound up to 7% (docs/mixed.md §11). So the native arm's lower bound is kept as the
    frame and the candidate's bound is stated in it: ``native_lower_ms · (1 − saving_ci_low)``.
    An unpaired saving (no round pairing) is the two absolute ends' ratio already, so this gives
    the old bounds back.
    """
    return native_lower_ms, native_lower_ms * (1.0 - saving_ci_low)


def _time(row: Mapping[str, Any], index: int, arm: int) -> CellTime:
    return CellTime(
        index,
        arm,
        float(row["step_time_ms"]),
        float(row["ci_low_ms"]),
        float(row["ci_high_ms"]),
        str(row["source_result_sha256"]),
        float(row["saving"]),
        float(row["saving_ci_low"]),
        float(row["saving_ci_high"]),
        int(row["paired_rounds"]),
        float(row["common_mode_rel"]),
        float(row["level_rel"]),
    )


@dataclass(frozen=True, eq=False)
class MixedGrid:
    """A mixed sweep's groups and cells (see the module docstring).

    Attributes:
        route: K, world size, buckets, execution mode, verify floor.
        protocol_sha256: the mixed sweep's configuration digest (its measurement protocol).
        groups: the measured native arms.
        cells: the measured cells (every compact arm whose geometry is valid).
        dropped: cells left out, with why.
    """

    route: MixedRoute
    protocol_sha256: str
    groups: tuple[MixedArm, ...]
    cells: tuple[MixedCellTime, ...]
    dropped: tuple[tuple[str, str], ...] = ()
    _group_of: dict[tuple[RankFeatures, ...], int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        index: dict[tuple[RankFeatures, ...], int] = {}
        for i, g in enumerate(self.groups):
            if g.features in index:
                raise ConfigError(
                    f"two mixed sweep groups have the same rank features ({g.group_sha256})"
                )
            index[g.features] = i
        seen: set[MixedGeometry] = set()
        for c in self.cells:
            if c.geometry in seen:
                raise ConfigError(
                    f"mixed geometry {c.sha256} is measured twice; merge sweeps without overlap"
                )
            seen.add(c.geometry)
        object.__setattr__(self, "_group_of", index)

    @classmethod
    def from_rows(
        cls, rows: Iterable[Mapping[str, Any]], route: MixedRoute, protocol_sha256: str
    ) -> MixedGrid:
        """From ``mixed-sweep`` rows; a cell whose geometry breaks an invariant is dropped (named)."""
        rows = list(rows)
        groups: list[MixedArm] = []
        by_group: dict[int, int] = {}
        for r in sorted((r for r in rows if r["capacity"] == 0), key=lambda r: r["mixed_group"]):
            geo = MixedGeometry.from_flat(
                r["rank_features"], r["native_capacity"], r["native_rank_rows"], r["native_rank_rows"]
            )
            by_group[r["mixed_group"]] = len(groups)
            groups.append(
                MixedArm(
                    str(r["group_sha256"]),
                    geo.rank_features,
                    int(r["native_capacity"]),
                    _time(r, len(groups), 0),
                    int(r["mixed_group"]),
                    int(r["workload_steps"]),
                )
            )
        cells, dropped = [], []
        for r in sorted(
            (r for r in rows if r["capacity"] != 0), key=lambda r: (r["mixed_group"], r["capacity"])
        ):
            geo = MixedGeometry.from_flat(
                r["rank_features"], r["capacity"], r["actual_rank_rows"], r["native_rank_rows"]
            )
            h = by_group.get(r["mixed_group"])
            if h is None:
                dropped.append((str(r["geometry_sha256"]), "no native arm in the sweep"))
                continue
            found = geometry_violations(
                geo,
                k=route.physical_k,
                buckets=route.body_buckets,
                world_size=route.world_size,
                min_verify_len=route.min_verify_len,
            )
            if found:
                dropped.append((str(r["geometry_sha256"]), found[0].describe()))
                continue
            time = _time(r, h, int(r["capacity"]))
            lower, upper = paired_bounds(groups[h].time.ci_low_ms, time.saving_ci_low)
            cells.append(
                MixedCellTime(
                    geo,
                    h,
                    time,
                    lower,
                    upper,
                    str(r["source_result_sha256"]),
                    int(r["accuracy_rows"]),
                    int(r["accuracy_mismatches"]),
                    int(r["samples"]),
                    str(r["stop_reason"]),
                )
            )
        return cls(route, protocol_sha256, tuple(groups), tuple(cells), tuple(dropped))

    def group_of(self, features: tuple[RankFeatures, ...]) -> int | None:
        """The index of the group with these rank features, or None (the step is not priced)."""
        return self._group_of.get(features)

    def deployable(self, minimum_predicted_gain: float) -> tuple[list[MixedCellTime], list[tuple[str, str]]]:
        """Cells a bundle may deploy, and the others with why: a deployed cell saves for sure
        (its paired interval lies above 0), is not dead under its bounds (:func:`paired_bounds`:
        its saving's lower bound reaches the margin, ``gain / (1 + gain)``), and its outputs were
        never seen to disagree with its native arm's."""
        keep, left = [], []
        for c in self.cells:
            low = c.time.saving_ci_low
            if low <= 0:
                left.append((c.sha256, f"not_significant: saving_ci_low {low:.4g} <= 0"))
            elif dead_cell(c.native_lower_ms, c.candidate_upper_ms, minimum_predicted_gain):
                margin = minimum_predicted_gain / (1.0 + minimum_predicted_gain)
                left.append(
                    (
                        c.sha256,
                        f"dead: candidate_upper_ms x (1 + gain) > native_lower_ms (saving_ci_low {low:.4g} "
                        f"below the margin {margin:.4g})",
                    )
                )
            elif c.accuracy_mismatches:
                left.append(
                    (c.sha256, f"accuracy: {c.accuracy_mismatches} of {c.accuracy_rows} rows disagree")
                )
            else:
                keep.append(c)
        return keep, left

    def table(self, cells: Sequence[MixedCellTime], minimum_predicted_gain: float) -> MixedCostTable:
        """The runtime's view of ``cells``."""
        return MixedCostTable(
            self.route,
            tuple(
                MixedCell(c.geometry, c.native_lower_ms, c.candidate_upper_ms, c.measurement_result_sha256)
                for c in cells
            ),
            minimum_predicted_gain,
        )


@dataclass(frozen=True, eq=False)
class MixedEvidence:
    """What every mixed step of a workload does under a deployed mixed table.

    Attributes:
        grid: the measured cells.
        deployed: the deployed cells, indexed by ``cell``.
        step_id: (M,) the mixed steps.
        group: (M,) the step's group in ``grid.groups``, -1 when no native arm was measured (the
            step cannot be priced).
        cell: (M,) the chosen deployed cell, -1 when the step stays native.
        static_tokens, tokens: (M,) tokens emitted at full verification and under the choice.
        covered: (M,) some candidate geometry of the step has a deployed cell.
        reason: (M,) the selector's reason (``compact``, ``native_score``, ``no_cell``, ...), or
            ``diverged``: a generation row's KV history under the policy differs from the recorded
            one, so the recorded geometry does not recur and the step runs native.
        diverged: (M,) the steps whose reason is ``diverged``.
        row_step, row_request, row_static, row_tokens: per generation row of the mixed steps
            (``row_step`` indexes the steps) for the request bootstrap.
    """

    grid: MixedGrid
    deployed: tuple[MixedCellTime, ...]
    step_id: np.ndarray
    group: np.ndarray
    cell: np.ndarray
    static_tokens: np.ndarray
    tokens: np.ndarray
    covered: np.ndarray
    reason: tuple[str, ...]
    diverged: np.ndarray
    row_step: np.ndarray
    row_request: np.ndarray
    row_static: np.ndarray
    row_tokens: np.ndarray

    @property
    def steps(self) -> int:
        """Mixed steps of the workload."""
        return int(self.step_id.shape[0])

    @property
    def priced(self) -> np.ndarray:
        """(M,) steps with a measured native arm."""
        out: np.ndarray = self.group >= 0
        return out


def histories_follow_tokens(workload: Workload) -> bool:
    """Whether the workload's recorded generation histories follow the tokens each request has
    emitted: some request's history differs between two of its mixed steps.

    Then a decode policy that emits fewer tokens shifts later histories away from the recorded
    ones (:func:`prepare_mixed`'s ``diverged``). A recording whose every request keeps one history
    (an engine keying a fixed KV length; the synthetic workloads) has geometries that recur.
    """
    mixed = workload.mixed
    if mixed is None:
        return False
    gens = mixed.filter(pc.equal(mixed.column("role"), "generation")).select(["request_id", "history"])
    if gens.num_rows == 0:
        return False
    spread = gens.group_by("request_id").aggregate([("history", "min"), ("history", "max")])
    lo = spread.column("history_min").to_numpy()
    hi = spread.column("history_max").to_numpy()
    return bool((hi > lo).any())


@dataclass
class _Histories:
    """Which requests' KV histories under the policy still equal the recorded ones.

    A mixed cell is keyed by its exact geometry, generation histories included. ``first`` maps a
    request (its workload code) to the first step at which the policy emitted fewer tokens for it
    than static K did (the decode policy's, :func:`~.replay.first_losses`, then each compact mixed
    step's as the steps are replayed in order). A later step holding that request has a history the
    recording does not have, so the runtime finds no cell for it (see
    :func:`histories_follow_tokens` for when this applies).
    """

    first: dict[int, int]

    def shifted(self, step: int, requests: Sequence[int]) -> bool:
        """Some request of ``step`` was cut short before it."""
        return any(self.first.get(r, step) < step for r in requests)

    def cut(self, step: int, requests: Sequence[int]) -> None:
        """``requests`` emitted fewer tokens than static K at ``step``."""
        for r in requests:
            if step < self.first.get(r, step + 1):
                self.first[r] = step


def _check_deployment(workload: Workload, calibration: Calibration, route: MixedRoute) -> None:
    """Refuse a workload or calibration of another K or world size than the mixed cells'."""
    k = route.physical_k
    if workload.k != k or calibration.k != k:
        raise ConfigError(
            f"K mismatch: mixed cells K={k}, calibration K={calibration.k}, workload K={workload.k}"
        )
    if workload.num_ranks != route.world_size:
        raise ConfigError(
            f"the workload has {workload.num_ranks} ranks, the mixed cells {route.world_size}; record the workload "
            "on this deployment"
        )


def prepare_mixed(
    workload: Workload,
    grid: MixedGrid,
    calibration: Calibration,
    deployed: Sequence[MixedCellTime],
    *,
    minimum_predicted_gain: float,
    diverged: Mapping[int, int] | None = None,
) -> MixedEvidence:
    """Replay every mixed step through the runtime's mixed selector with ``deployed`` cells.

    ``diverged``: the decode policy's first token loss per request (:class:`_Histories`); a step
    it makes unrecognisable runs native with reason ``diverged``. ``None``: every recorded
    geometry recurs.

    Raises:
        ConfigError: K or world size of the workload differ from the grid's.
    """
    route = grid.route
    k = route.physical_k
    _check_deployment(workload, calibration, route)
    table = grid.table(deployed, minimum_predicted_gain) if deployed else None
    index = {c.geometry: i for i, c in enumerate(deployed)}
    a = workload.arrays()
    steps = workload.mixed_step_rows()
    m = len(steps)
    step_id = np.array([s.step for s in steps], dtype=np.int64)
    group, cell = (np.full(m, -1, dtype=np.int64) for _ in range(2))
    static, tokens = (np.zeros(m, dtype=np.int64) for _ in range(2))
    covered, shifted = (np.zeros(m, dtype=bool) for _ in range(2))
    histories = None if diverged is None else _Histories(dict(diverged))
    reasons: list[str] = []
    row_step, row_request, row_static, row_tokens = [], [], [], []
    for i, s in enumerate(steps):
        feats = s.description.features(k)
        h = grid.group_of(feats)
        group[i] = -1 if h is None else h
        rows = np.arange(s.start, s.stop)
        surv_all = calibration.survival(a.logits[rows]) if rows.size else np.zeros((0, k))
        ranks = a.rank[rows]
        survivals = [surv_all[ranks == r] for r in range(route.world_size)]
        requests = a.request[rows].tolist()
        shifted[i] = histories is not None and histories.shifted(s.step, requests)
        choice = choose_mixed(s.description, survivals, None if shifted[i] else table, features=feats)
        reasons.append("diverged" if shifted[i] else choice.reason)
        covered[i] = choice.covered
        windows = mixed_windows(s.description, survivals, choice, k, route.min_verify_len, features=feats)
        w = np.concatenate(windows) if windows else np.zeros(0, dtype=np.int64)
        acc = a.accepted[rows]
        emitted = np.minimum(acc, w) + 1
        if histories is not None:
            histories.cut(s.step, np.asarray(requests)[emitted < acc + 1].tolist())
        static[i] = int((acc + 1).sum())
        tokens[i] = int(emitted.sum())
        if choice.cell is not None:
            cell[i] = index[choice.cell.geometry]
        row_step.append(np.full(rows.size, i, dtype=np.int64))
        row_request.append(a.request[rows])
        row_static.append(acc + 1)
        row_tokens.append(emitted)

    def cat(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    return MixedEvidence(
        grid=grid,
        deployed=tuple(deployed),
        step_id=step_id,
        group=group,
        cell=cell,
        static_tokens=static,
        tokens=tokens,
        covered=covered,
        reason=tuple(reasons),
        diverged=shifted,
        row_step=cat(row_step),
        row_request=cat(row_request),
        row_static=cat(row_static),
        row_tokens=cat(row_tokens),
    )
