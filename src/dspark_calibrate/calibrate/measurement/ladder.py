"""The graph ladder and the cells of a sweep: native cells and legal compact verifier budgets.

Pure functions over integers (DESIGN §2, §6). Given the draft length K and the rank-local graph
ladder, this module names every cell a sweep measures: the native cell (V = 0, the static full-K
step, one per G), the candidate compact budgets G ≤ V < G·(K+1), the full-width control
V = G·(K+1), and, where the engine offers it, the forced-K arm (V = −1: the confidence path runs
but every window is forced to K, so its cost over the native cell is the per-step overhead). Choosing which measured cells to deploy (≤ 4 compact per G, ≤ 32 in all) is left to
``build``; this module decides what to measure. What is legal is decided in one place,
``artifacts.cell_kind`` (the cost-table document's rule), which this module asks.

Example:
    >>> from dspark_calibrate.calibrate.measurement.ladder import plan_cells, parse_ladder
    >>> cells = plan_cells(k=2, ladder=parse_ladder("2"))
    >>> [(c.graph_batch_size, c.verifier_budget) for c in cells]
    [(2, 0), (2, 3), (2, 4), (2, 5), (2, 6)]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# The cell markers and kinds, and the one legality rule, belong to the cost-table document.
from dspark_calibrate.artifacts import (
    FORCED_K_BUDGET,
    NATIVE_BUDGET,
    CellKind,
    cell_kind,
    full_width,
)
from dspark_calibrate.errors import ConfigError

# Compact cells TensorRT-LLM deploys per G and in total (engine limits, DESIGN §2; defined in
# ``schemas``). ``build`` enforces them; the sweep measures more candidates so that selection has
# a choice.
from dspark_calibrate.schemas import MAX_COMPACT_CELLS_PER_G, MAX_COMPACT_CELLS_TOTAL

__all__ = [
    "FORCED_K_BUDGET",
    "MAX_COMPACT_CELLS_PER_G",
    "MAX_COMPACT_CELLS_TOTAL",
    "MAX_GRAPH_BATCH_SIZE",
    "CellKind",
    "CellSpec",
    "candidate_budgets",
    "legal_compact_budgets",
    "parse_budgets",
    "parse_ladder",
    "plan_cells",
    "validate_ladder",
]

#: Largest rank-local graph batch size accepted (rows); far above any captured decode ladder, it
#: only catches typos such as a global size passed as a rank-local one times a thousand.
MAX_GRAPH_BATCH_SIZE = 4096
#: Default number of compact candidates per G above which the legal budgets are thinned.
DEFAULT_MAX_CANDIDATES_PER_G = 48


@dataclass(frozen=True, slots=True, order=True)
class CellSpec:
    """One (G, V) cell for draft length K. Orders by (G, V), the canonical row order.

    Attributes:
        graph_batch_size: G, rank-local rows of the captured CUDA graph (pad rows included).
        verifier_budget: V, rank-local tokens the target scores; 0 names the native cell and
            :data:`FORCED_K_BUDGET` (−1) the forced-K arm.
        k: the physical draft length K.
    """

    graph_batch_size: int
    verifier_budget: int
    k: int

    def __post_init__(self) -> None:
        for name in ("graph_batch_size", "verifier_budget", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"cell {name} must be an integer, got {value!r}")
        g, v, k = self.graph_batch_size, self.verifier_budget, self.k
        if k < 1:
            raise ConfigError(f"K must be >= 1, got {k}; pass the drafter's block size with --k")
        if not 1 <= g <= MAX_GRAPH_BATCH_SIZE:
            raise ConfigError(f"graph batch size G must be in [1, {MAX_GRAPH_BATCH_SIZE}], got {g}")
        if cell_kind(g, v, k) is None:
            raise ConfigError(
                f"verifier budget V={v} is illegal for G={g}, K={k}: expected {NATIVE_BUDGET} (native), "
                f"{FORCED_K_BUDGET} (forced-K arm) or {g} <= V <= {full_width(g, k)} (one anchor per row up "
                "to the full width G*(K+1))"
            )

    @property
    def kind(self) -> CellKind:
        """Native, compact, full-width control or the forced-K arm."""
        kind = cell_kind(self.graph_batch_size, self.verifier_budget, self.k)
        assert kind is not None  # __post_init__ refused illegal cells
        return kind

    @property
    def full_width(self) -> int:
        """G·(K+1): the tokens a native step verifies."""
        return full_width(self.graph_batch_size, self.k)

    @property
    def tokens(self) -> int:
        """Tokens actually verified in one step: G·(K+1) for the native cell and the forced-K arm,
        else V."""
        return self.full_width if self.verifier_budget in (NATIVE_BUDGET, FORCED_K_BUDGET) else self.verifier_budget

    @property
    def native(self) -> CellSpec:
        """The native cell of this cell's G (the comparator its saving is paired with)."""
        return CellSpec(self.graph_batch_size, NATIVE_BUDGET, self.k)

    @property
    def key(self) -> tuple[int, int]:
        """(G, V), the cell's identity within one sweep."""
        return (self.graph_batch_size, self.verifier_budget)

    def row_lengths(self) -> tuple[int, ...]:
        """Tokens per row for a ragged step of this cell: V spread as evenly as possible.

        The first ``V mod G`` rows get one token more (q+1, the rest q), so every row verifies
        between 1 and K+1 tokens, pad rows included (DESIGN §6, idle-rank split).
        """
        g, total = self.graph_batch_size, self.tokens
        q, r = divmod(total, g)
        return tuple(q + 1 if i < r else q for i in range(g))

    def label(self) -> str:
        """Short human name, e.g. ``G8/V0`` or ``G8/V24``."""
        return f"G{self.graph_batch_size}/V{self.verifier_budget}"


def legal_compact_budgets(g: int, k: int) -> range:
    """Every legal compact budget for one G: ``range(G, G·(K+1))``.

    Raises:
        ConfigError: G or K out of range.
    """
    CellSpec(g, NATIVE_BUDGET, k)  # validates G and K
    return range(g, full_width(g, k))


def candidate_budgets(g: int, k: int, *, max_per_g: int = DEFAULT_MAX_CANDIDATES_PER_G) -> tuple[int, ...]:
    """The compact budgets to measure for one G by default.

    V = G is legal but never carries a real row (every row is an anchor; DESIGN §6), so it is left
    out. When the remaining legal budgets number at most ``max_per_g`` all are kept; otherwise
    ``max_per_g`` budgets evenly spread from G+1 to G·(K+1)−1, both ends included.

    Raises:
        ConfigError: ``max_per_g`` < 2, or G/K out of range.
    """
    if max_per_g < 2:
        raise ConfigError(f"max candidates per G must be >= 2, got {max_per_g}")
    legal = list(legal_compact_budgets(g, k))[1:]
    if len(legal) <= max_per_g:
        return tuple(legal)
    lo, hi = legal[0], legal[-1]
    picks = {lo + round(i * (hi - lo) / (max_per_g - 1)) for i in range(max_per_g)}
    return tuple(sorted(picks))


def validate_ladder(ladder: Iterable[int]) -> tuple[int, ...]:
    """Check a graph ladder: non-empty, positive integers, no duplicates; returns it sorted.

    Raises:
        ConfigError: empty, non-integer, out of range or duplicated sizes.
    """
    values = list(ladder)
    if not values:
        raise ConfigError("the graph ladder is empty; pass the captured batch sizes, e.g. --ladder 8,16,32")
    for g in values:
        if isinstance(g, bool) or not isinstance(g, int) or not 1 <= g <= MAX_GRAPH_BATCH_SIZE:
            raise ConfigError(f"graph batch size {g!r} must be an integer in [1, {MAX_GRAPH_BATCH_SIZE}]")
    dupes = sorted({g for g in values if values.count(g) > 1})
    if dupes:
        raise ConfigError(f"the graph ladder lists {dupes} more than once; each captured G appears once")
    return tuple(sorted(values))


def parse_ladder(text: str) -> tuple[int, ...]:
    """Parse ``"8,16,32"`` into a validated ladder.

    Raises:
        ConfigError: not a comma-separated list of integers, or an invalid ladder.
    """
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ConfigError(
            f"--ladder {text!r} is not a comma-separated list of integers; give the captured sizes, e.g. 8,16,32"
        ) from None
    return validate_ladder(values)


def parse_budgets(specs: Sequence[str]) -> dict[int, tuple[int, ...]]:
    """Parse per-G budget lists such as ``["16:20,24,32", "32:40,64"]``.

    Raises:
        ConfigError: malformed text or a G given twice.
    """
    out: dict[int, tuple[int, ...]] = {}
    for spec in specs:
        head, sep, tail = spec.partition(":")
        g: int | None = None
        budgets: tuple[int, ...] = ()
        if sep:
            try:
                g = int(head)
                budgets = tuple(int(p) for p in tail.split(",") if p.strip())
            except ValueError:
                g = None
        if g is None:
            raise ConfigError(f"--budgets {spec!r} must look like G:V1,V2,... e.g. 16:20,24,32")
        if g in out:
            raise ConfigError(f"--budgets gives G={g} twice; list all its budgets in one option")
        out[g] = budgets
    return out


def plan_cells(
    *,
    k: int,
    ladder: Sequence[int],
    budgets: Mapping[int, Sequence[int]] | None = None,
    max_per_g: int = DEFAULT_MAX_CANDIDATES_PER_G,
    include_control: bool = True,
    include_forced_k: bool = False,
) -> tuple[CellSpec, ...]:
    """Every cell a sweep measures, sorted by (G, V).

    Each G gets its native cell, its candidate compact budgets (``budgets[G]`` when given, else
    :func:`candidate_budgets`), unless ``include_control`` is False the full-width control, and
    with ``include_forced_k`` the forced-K arm (V = −1, for backends that offer it).

    Args:
        k: physical draft length K (≥ 1).
        ladder: rank-local graph batch sizes.
        budgets: explicit compact budgets per G; each must be legal for its G.
        max_per_g: default candidates per G before thinning.
        include_control: measure V = G·(K+1) as well.
        include_forced_k: measure the forced-K arm of every G as well.

    Raises:
        ConfigError: K < 1, a bad ladder, budgets for a G outside the ladder, or an illegal V.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"K must be an integer >= 1, got {k!r}; pass the drafter's block size with --k")
    gs = validate_ladder(ladder)
    budgets = dict(budgets or {})
    stray = sorted(set(budgets) - set(gs))
    if stray:
        raise ConfigError(f"--budgets names G={stray}, which is not in the ladder {list(gs)}")
    cells: set[CellSpec] = set()
    for g in gs:
        cells.add(CellSpec(g, NATIVE_BUDGET, k))
        chosen = budgets.get(g)
        vs = tuple(chosen) if chosen is not None else candidate_budgets(g, k, max_per_g=max_per_g)
        for v in vs:
            if v == NATIVE_BUDGET:
                raise ConfigError(f"--budgets for G={g} lists V=0; the native cell is always measured")
            if cell_kind(g, v, k) is not CellKind.COMPACT:
                raise ConfigError(
                    f"--budgets for G={g}: V={v} is not a legal compact budget; "
                    f"expected {g} <= V < {full_width(g, k)}"
                )
            cells.add(CellSpec(g, v, k))
        if include_control:
            cells.add(CellSpec(g, full_width(g, k), k))
        if include_forced_k:
            cells.add(CellSpec(g, FORCED_K_BUDGET, k))
    return tuple(sorted(cells))
