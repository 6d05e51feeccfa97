"""The cost-table document: the one legality rule, CostCell, CostTable and DrainGuard round trips."""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa
import pytest

from dspark_calibrate.artifacts import (
    DRAIN_GUARD_FIELDS,
    FORCED_K_BUDGET,
    NATIVE_BUDGET,
    CellKind,
    CostCell,
    CostTable,
    DrainGuard,
    cell_kind,
    full_width,
    is_deployable,
    logical_sha256,
)
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.schemas import DRAIN_GUARD_SUMMARY_KEYS, arrow_schema

K = 3
G = 4  # full width G*(K+1) = 16

# (id, V, kind, deployable) for G=4, K=3: the markers and both ends of every inequality.
CELL_ROWS: list[tuple[str, int, CellKind | None, bool]] = [
    ("native marker", NATIVE_BUDGET, CellKind.NATIVE, True),
    ("forced-K marker", FORCED_K_BUDGET, CellKind.FORCED_K, False),
    ("below the markers", -2, None, False),
    ("between 0 and G", 1, None, False),
    ("V = G-1", G - 1, None, False),
    ("V = G (legal, carries no real row)", G, CellKind.COMPACT, False),
    ("V = G+1", G + 1, CellKind.COMPACT, True),
    ("V = G(K+1)-1", G * (K + 1) - 1, CellKind.COMPACT, True),
    ("V = G(K+1) (control)", G * (K + 1), CellKind.CONTROL, False),
    ("V = G(K+1)+1", G * (K + 1) + 1, None, False),
]


@pytest.mark.parametrize(
    ("v", "kind", "deployable"), [r[1:] for r in CELL_ROWS], ids=[r[0] for r in CELL_ROWS]
)
def test_cell_kind_and_deployability(v: int, kind: CellKind | None, deployable: bool) -> None:
    assert cell_kind(G, v, K) is kind
    assert is_deployable(G, v, K) is deployable


def test_markers_and_full_width() -> None:
    assert (NATIVE_BUDGET, FORCED_K_BUDGET) == (0, -1)
    assert full_width(G, K) == 16


def test_drain_guard_fields_are_the_schemas_summary_keys() -> None:
    assert DRAIN_GUARD_FIELDS is DRAIN_GUARD_SUMMARY_KEYS
    guard = DrainGuard(1.25, 3.5, 0.0, G)
    assert tuple(guard.to_dict()) == DRAIN_GUARD_FIELDS
    assert DrainGuard.from_dict(guard.to_dict()) == guard


def make_cell(g: int, v: int, t: float, **overrides: Any) -> CostCell:
    """A complete cost-table row (every column of the current schema)."""
    base: dict[str, Any] = {
        "ci_low_ms": t * 0.99,
        "ci_high_ms": t * 1.01,
        "p10_ms": t * 0.98,
        "p90_ms": t * 1.02,
        "samples": 200,
        "stop_reason": "precision",
        "source_result_sha256": f"{g:032x}{v:032x}",
        "saving": 0.0 if v == 0 else 0.1,
        "saving_ci_low": 0.0 if v == 0 else 0.05,
        "saving_ci_high": 0.0 if v == 0 else 0.15,
        "paired_rounds": 30,
        "common_mode_rel": 0.01,
        "level_rel": 0.005,
        "control_bias": None,
        "control_widened": False,
        "paired_rel": 0.002,
    }
    base.update(overrides)
    return CostCell(g, v, t, **base)


def make_cells() -> list[CostCell]:
    return [
        make_cell(4, 0, 10.0),
        make_cell(4, 8, 8.0),
        make_cell(8, 0, 12.0),
        make_cell(8, 20, 10.5),
        make_cell(8, 24, 11.0),
    ]


def test_arrow_round_trip_keeps_every_row() -> None:
    table = CostTable.from_cost_cells(K, reversed(make_cells()))
    arrow = table.to_arrow()
    assert arrow.schema.equals(arrow_schema("cost-table"))
    assert arrow.column("verifier_budget").to_pylist() == [0, 8, 0, 20, 24]  # canonical (G, V) order
    back = CostTable.from_arrow(arrow, K)
    assert back == table and back.rows == table.rows
    assert back.to_arrow().equals(arrow)
    assert logical_sha256(back.to_arrow(), "cost-table") == logical_sha256(arrow, "cost-table")


def test_times_match_from_cells() -> None:
    table = CostTable.from_cost_cells(K, make_cells())
    assert table == CostTable.from_cells(K, {c.key: c.step_time_ms for c in make_cells()})
    assert table.compact_budgets(8) == (20, 24) and table.time(4, 8) == 8.0


def test_a_legacy_table_reads_with_absent_columns_as_none() -> None:
    v1 = pa.Table.from_pylist(
        [
            {n: make_cell(4, v, t).to_dict()[n] for n in arrow_schema("cost-table", 1).names}
            for v, t in ((0, 10.0), (8, 8.0))
        ],
        schema=arrow_schema("cost-table", 1),
    )
    table = CostTable.from_arrow(v1, K)
    assert (
        table.rows[1].saving is None
        and table.rows[1].source_result_sha256 == make_cell(4, 8, 8.0).source_result_sha256
    )


def _refused(cells: list[CostCell]) -> None:
    CostTable.from_cost_cells(K, cells)


# (id, how the valid cells are changed, message)
TABLE_REFUSALS: list[tuple[str, Any, str]] = [
    ("no native cell", lambda cs: cs[1:], "no native cell"),
    ("V below G", lambda cs: [*cs, make_cell(4, 3, 9.0)], "outside G <= V"),
    ("V above the full width", lambda cs: [*cs, make_cell(4, 17, 9.0)], "outside G <= V"),
    ("forced-K arm", lambda cs: [*cs, make_cell(4, FORCED_K_BUDGET, 9.0)], "must be >= 0"),
    ("a cell twice", lambda cs: [*cs, cs[1]], "more than once"),
    (
        "five compact cells for one G",
        lambda cs: [*cs, *(make_cell(8, v, 11.0) for v in (9, 10, 11))],
        "engine limit",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "message"), [r[1:] for r in TABLE_REFUSALS], ids=[r[0] for r in TABLE_REFUSALS]
)
def test_table_refusals(mutate: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _refused(mutate(make_cells()))


# (id, field overrides of one cell, message)
CELL_REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("non-finite time", {"step_time_ms": float("nan")}, "finite"),
    ("zero time", {"step_time_ms": 0.0}, "finite"),
    ("median outside its interval", {"ci_low_ms": 9.0, "ci_high_ms": 9.5}, "ci_low_ms <= step_time_ms"),
    ("G zero", {"graph_batch_size": 0}, "graph batch size"),
    ("boolean V", {"verifier_budget": True}, "integer"),
]


@pytest.mark.parametrize(
    ("change", "message"), [r[1:] for r in CELL_REFUSALS], ids=[r[0] for r in CELL_REFUSALS]
)
def test_cell_refusals(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(make_cell(4, 8, 10.0), **change)


def test_cell_dict_round_trip_and_unknown_columns() -> None:
    cell = make_cell(4, 8, 8.0)
    assert CostCell.from_dict(cell.to_dict()) == cell
    with pytest.raises(ConfigError, match="unknown columns"):
        CostCell.from_dict({**cell.to_dict(), "extra": 1})


# (id, cells, message): tables the selector accepts but a signed cost table may not carry.
UNSIGNABLE: list[tuple[str, list[CostCell], str]] = [
    ("V = G", [make_cell(4, 0, 10.0), make_cell(4, 4, 9.0)], "not deployable"),
    ("control", [make_cell(4, 0, 10.0), make_cell(4, 16, 10.1)], "not deployable"),
    ("incomplete row", [make_cell(4, 0, 10.0, samples=None)], "lacks"),
]


@pytest.mark.parametrize(("cells", "message"), [r[1:] for r in UNSIGNABLE], ids=[r[0] for r in UNSIGNABLE])
def test_to_arrow_refuses_what_cannot_be_signed(cells: list[CostCell], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        CostTable.from_cost_cells(K, cells).to_arrow()


def test_a_times_only_table_cannot_be_signed() -> None:
    with pytest.raises(ConfigError, match="times only"):
        CostTable.from_cells(K, {(4, 0): 10.0}).to_arrow()
