"""The mixed prefill+decode selector: which body capacity a mixed step runs in (DESIGN §10).

Mirrors TensorRT-LLM's mixed path as ``TRTLLM_MIXED.md`` reads it from its source. For a step
whose ranks run context chunks beside generation requests:

1. per rank, the features, the reserve (context rows + K+1 rows per non-eligible generation)
   and the native rows (the reserve + K+1 rows per eligible generation);
2. for every body bucket below the native (paid) bucket at which every rank keeps its reserve
   and the verify floor of its eligible generations, the geometry the runtime builds there
   (:func:`~dspark_calibrate.artifacts.step_candidates`) and its exact cell, if the table has
   one (no nearest-cell fallback: an uncovered geometry stays native);
3. yields over the eligible generations, summed over ranks: native ``e + Σ S`` (every position),
   a bucket ``e + Σ floor survivals + the top extra remaining survivals``, ``extra`` being the
   rows the bucket leaves a rank above its reserve and floor; a bucket passes when
   ``Y_c / candidate_upper_ms`` is above ``Y_n / native_lower_ms`` and at least ``(1 + gain)``
   times it; the best score wins, ties to the smaller capacity;
4. allocation: every (generation, position above the floor) is ranked by survival, ties by
   position then request, and the rank's extra rows go to the best, so each generation verifies
   a prefix.

Choices where the source is silent, stated in ``docs/mixed.md``: context chunks do not enter the
yields (they are the same under every bucket); a step in which a request runs its first context
chunk (position 0, nothing compressed) stays native, as the consumer's runtime keeps first chunks
native.

Pure numpy: no torch, no ``dspark_calibrate.calibrate``, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dspark_calibrate.artifacts import (
    MixedGeometry,
    MixedRoute,
    MixedStep,
    ModelError,
    RankFeatures,
    ReceiptEconomics,
    is_sha256_hex,
    step_candidates,
)
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.schemas import MAX_MIXED_CELLS, MIXED_GATES, MIXED_RESULT_FILES

__all__ = [
    "MixedCell",
    "MixedChoice",
    "MixedCostTable",
    "MixedEconomics",
    "choose_mixed",
    "first_chunk",
    "mixed_windows",
]


@dataclass(frozen=True, slots=True)
class MixedCell:
    """One deployed mixed cell: its exact geometry and the two bounds the runtime decides with."""

    geometry: MixedGeometry
    native_lower_ms: float
    candidate_upper_ms: float
    measurement_result_sha256: str = ""

    def __post_init__(self) -> None:
        for name in ("native_lower_ms", "candidate_upper_ms"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ConfigError(f"mixed cell {name} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class MixedCostTable:
    """The deployed mixed cells, looked up by exact geometry.

    Raises:
        ConfigError: more than 256 cells, two cells of one geometry, or a gain below 1%.
    """

    route: MixedRoute
    cells: tuple[MixedCell, ...]
    minimum_predicted_gain: float = 0.01
    _lookup: dict[MixedGeometry, MixedCell] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.cells) > MAX_MIXED_CELLS:
            raise ConfigError(f"{len(self.cells)} mixed cells; at most {MAX_MIXED_CELLS}")
        if not math.isfinite(self.minimum_predicted_gain) or self.minimum_predicted_gain < 0.01:
            raise ConfigError(
                f"mixed minimum_predicted_gain must be >= 0.01, got {self.minimum_predicted_gain!r}"
            )
        lookup: dict[MixedGeometry, MixedCell] = {}
        for c in self.cells:
            if c.geometry in lookup:
                raise ConfigError("two mixed cells share one geometry; the runtime looks cells up exactly")
            lookup[c.geometry] = c
        object.__setattr__(self, "_lookup", lookup)

    def lookup(self, geometry: MixedGeometry) -> MixedCell | None:
        """The cell of exactly this geometry (rank order included), or None: the step stays native."""
        return self._lookup.get(geometry)

    @classmethod
    def from_rows(
        cls, rows: Iterable[Mapping[str, Any]], route: MixedRoute, *, minimum_predicted_gain: float
    ) -> MixedCostTable:
        """From ``mixed-cost-table`` rows (geometry columns, the two bounds, the measurement hash)."""
        cells = tuple(
            MixedCell(
                MixedGeometry.from_flat(
                    r["rank_features"], r["capacity"], r["actual_rank_rows"], r["native_rank_rows"]
                ),
                float(r["native_lower_ms"]),
                float(r["candidate_upper_ms"]),
                str(r["measurement_result_sha256"]),
            )
            for r in rows
        )
        return cls(route, cells, float(minimum_predicted_gain))


def first_chunk(step: MixedStep) -> bool:
    """True when some rank runs a request's first context chunk (the step stays native)."""
    return any(c.real and c.position == 0 and c.compressed == 0 for r in step.ranks for c in r.context)


@dataclass(frozen=True, slots=True)
class MixedChoice:
    """What the runtime runs for one mixed step.

    Attributes:
        capacity: the chosen cell's body bucket, or None when the step stays native.
        cell: the chosen cell (None: native).
        native_capacity: the paid bucket (None when the step exceeds every bucket).
        native_yield, yield_: the native yield and the chosen one (equal when native).
        covered: some candidate geometry of the step has a cell.
        reason: ``compact``, ``native_score``, ``no_cell``, ``first_chunk``, ``no_candidate`` or
            ``outside_grid``.
    """

    capacity: int | None
    cell: MixedCell | None
    native_capacity: int | None
    native_yield: float
    yield_: float
    covered: bool
    reason: str


def _rank_yields(
    survivals: np.ndarray, eligible: np.ndarray, extra: int, floor: int
) -> tuple[float, float, np.ndarray]:
    """(native yield, candidate yield, grants per eligible row) of one rank.

    ``survivals`` (n, K) of the rank's generations in request order; ``eligible`` (n,) mask.
    """
    s = survivals[eligible]
    e = s.shape[0]
    if e == 0:
        return 0.0, 0.0, np.zeros(0, dtype=np.int64)
    k = s.shape[1]
    native = float(e + s.sum())
    base = float(e + s[:, :floor].sum())
    if extra <= 0:
        return native, base, np.zeros(e, dtype=np.int64)
    cand = s[:, floor:].reshape(-1)  # request-major: entry i is request i // cols, position i % cols
    cols = k - floor
    req = np.repeat(np.arange(e), cols)
    if extra >= cand.size:
        return native, base + float(cand.sum()), np.full(e, cols, dtype=np.int64)
    # Rank every (request, position) by survival; ties by position, then request (value-independent).
    order = np.lexsort((req, np.tile(np.arange(cols), e), -cand))
    take = order[:extra]
    grants = np.bincount(req[take], minlength=e).astype(np.int64)
    return native, base + float(cand[take].sum()), grants


def choose_mixed(
    step: MixedStep,
    survivals: Sequence[np.ndarray],
    table: MixedCostTable | None,
    *,
    features: Sequence[RankFeatures] | None = None,
) -> MixedChoice:
    """The runtime's choice for one mixed step (see the module docstring). Pure.

    Args:
        step: the step, per rank.
        survivals: per rank, the (n_r, K) survivals of its generations in the step's order.
        table: the deployed cells (None: no mixed evidence, native).
        features: the step's rank features when already computed (``step.features(K)``).
    """
    route = table.route if table is not None else None
    k = route.physical_k if route is not None else (survivals[0].shape[1] if survivals else 1)
    if table is None or route is None:
        return MixedChoice(None, None, None, 0.0, 0.0, False, "no_cell")
    floor = route.min_verify_len
    feats = tuple(features) if features is not None else step.features(k)
    paid, candidates = step_candidates(feats, k, route.body_buckets, min_verify_len=floor)
    masks = [np.array([g.eligible for g in r.generations], dtype=bool) for r in step.ranks]
    native_yield = sum(_rank_yields(s, m, 0, floor)[0] for s, m in zip(survivals, masks, strict=True))
    if paid is None:
        return MixedChoice(None, None, None, native_yield, native_yield, False, "outside_grid")
    if not candidates:
        return MixedChoice(None, None, paid, native_yield, native_yield, False, "no_candidate")
    cells = [(geo, table.lookup(geo)) for geo in candidates]
    covered = any(c is not None for _, c in cells)
    if first_chunk(step):
        return MixedChoice(None, None, paid, native_yield, native_yield, covered, "first_chunk")
    best: tuple[float, int, MixedCell, float] | None = None
    for geo, cell in cells:
        if cell is None:
            continue
        y = 0.0
        for f, s, m, rows in zip(feats, survivals, masks, geo.actual_rank_rows, strict=True):
            extra = rows - f.reserve - (1 + floor) * f.eligible_generations
            y += _rank_yields(s, m, extra, floor)[1]
        score = y / cell.candidate_upper_ms
        native_score = native_yield / cell.native_lower_ms
        if score > native_score and score >= native_score * (1.0 + table.minimum_predicted_gain):
            key = (score, -geo.capacity)
            if best is None or key > (best[0], -best[1]):
                best = (score, geo.capacity, cell, y)
    if best is None:
        reason = "native_score" if covered else "no_cell"
        return MixedChoice(None, None, paid, native_yield, native_yield, covered, reason)
    return MixedChoice(best[1], best[2], paid, native_yield, best[3], True, "compact")


def mixed_windows(
    step: MixedStep,
    survivals: Sequence[np.ndarray],
    choice: MixedChoice,
    k: int,
    min_verify_len: int = 1,
    *,
    features: Sequence[RankFeatures] | None = None,
) -> list[np.ndarray]:
    """Draft tokens each generation verifies under the choice, per rank (K for non-eligible rows
    and for every row of a native step)."""
    out = []
    cell = choice.cell
    feats = tuple(features) if features is not None else None
    for r, (part, s) in enumerate(zip(step.ranks, survivals, strict=True)):
        if cell is None:
            out.append(np.full(len(part.generations), k, dtype=np.int64))
            continue
        mask = np.array([g.eligible for g in part.generations], dtype=bool)
        w = np.full(mask.shape[0], k, dtype=np.int64)
        if mask.any():
            f = feats[r] if feats is not None else part.features(k)
            extra = (
                cell.geometry.actual_rank_rows[r] - f.reserve - (1 + min_verify_len) * f.eligible_generations
            )
            _, _, grants = _rank_yields(s, mask, extra, min_verify_len)
            w[mask] = min_verify_len + grants
        out.append(w)
    return out


# ---------------------------------------------------------------------------------------------
# The mixed admission artifact's signed economics
# ---------------------------------------------------------------------------------------------


def _num(summary: Mapping[str, Any], name: str, minimum: float | None = None) -> float:
    v = summary.get(name)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise ModelError(f"mixed summary.{name} must be a finite number, got {v!r}")
    if minimum is not None and v < minimum:
        raise ModelError(f"mixed summary.{name} must be >= {minimum}, got {v!r}")
    return float(v)


@dataclass(frozen=True, slots=True)
class MixedEconomics:
    """The mixed receipt's economics and gates, from the ``mixed-admission`` signed summary."""

    policy_steps: int
    compact_choices: int
    gross_compact_value_ms_lower_bound: float
    fixed_confidence_path_overhead_ms_upper_bound: float
    safety_margin_ms: float
    admitted: bool
    gates: Mapping[str, bool]
    predicted_gain: float
    predicted_gain_ci_low: float
    predicted_gain_ci_high: float

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> MixedEconomics:
        """Read and validate; the admitted flag must be the consumer's rule recomputed.

        Raises:
            ModelError: a missing or impossible value.
        """
        try:
            receipt = ReceiptEconomics.from_dict(summary)
        except ModelError as exc:
            raise ModelError(f"mixed summary: {exc}") from exc
        gates = summary.get("gates")
        if (
            not isinstance(gates, Mapping)
            or set(gates) != set(MIXED_GATES)
            or not all(isinstance(v, bool) for v in gates.values())
        ):
            raise ModelError(f"mixed summary.gates must hold exactly {list(MIXED_GATES)} as booleans")
        results = summary.get("results")
        if (
            not isinstance(results, Mapping)
            or set(results) != set(MIXED_RESULT_FILES)
            or not all(is_sha256_hex(v) for v in results.values())
        ):
            raise ModelError(
                f"mixed summary.results must pin exactly {sorted(MIXED_RESULT_FILES)} by SHA-256"
            )
        econ = cls(
            policy_steps=receipt.policy_steps,
            compact_choices=receipt.compact_choices,
            gross_compact_value_ms_lower_bound=float(receipt.gross_compact_value_ms_lower_bound),
            fixed_confidence_path_overhead_ms_upper_bound=float(
                receipt.fixed_confidence_path_overhead_ms_upper_bound
            ),
            safety_margin_ms=float(receipt.safety_margin_ms),
            admitted=bool(summary.get("admitted")),
            gates=dict(gates),
            predicted_gain=_num(summary, "predicted_gain"),
            predicted_gain_ci_low=_num(summary, "predicted_gain_ci_low"),
            predicted_gain_ci_high=_num(summary, "predicted_gain_ci_high"),
        )
        if summary.get("admitted") is not econ.receipt_rule():
            raise ModelError(
                f"mixed summary.admitted is {summary.get('admitted')!r} but the receipt rule gives {econ.receipt_rule()}"
            )
        return econ

    @property
    def receipt(self) -> ReceiptEconomics:
        """The five fields the receipt rule reads."""
        return ReceiptEconomics.of(self)

    def net_ms(self) -> float:
        """gross − policy_steps · overhead − margin (the consumer's recomputation)."""
        return self.receipt.net_value_ms

    def receipt_rule(self) -> bool:
        """The one receipt rule (``artifacts.ReceiptEconomics``): compact_choices > 0 and net > 0."""
        return self.receipt.admitted

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "policy_steps": self.policy_steps,
            "compact_choices": self.compact_choices,
            "net_value_ms": self.net_ms(),
            "admitted": self.admitted,
            "gates": dict(self.gates),
            "predicted_gain": self.predicted_gain,
            "predicted_gain_ci": [self.predicted_gain_ci_low, self.predicted_gain_ci_high],
        }
