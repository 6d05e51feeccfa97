"""Ladder and legal-cell rules (DESIGN §2, §6)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dspark_calibrate.calibrate.measurement.ladder import (
    CellKind,
    CellSpec,
    candidate_budgets,
    legal_compact_budgets,
    parse_budgets,
    parse_ladder,
    plan_cells,
)
from dspark_calibrate.errors import ConfigError


def test_plan_has_native_candidates_and_control_per_g() -> None:
    cells = plan_cells(k=5, ladder=(8, 16, 32))
    assert list(cells) == sorted(cells) and len(set(cells)) == len(cells)
    for g in (8, 16, 32):
        mine = [c for c in cells if c.graph_batch_size == g]
        kinds = [c.kind for c in mine]
        assert kinds.count(CellKind.NATIVE) == 1 and kinds.count(CellKind.CONTROL) == 1
        compact = [c.verifier_budget for c in mine if c.kind is CellKind.COMPACT]
        assert all(g < v < g * 6 for v in compact)
    # G=8 has 39 legal budgets above V=G: all kept; G=32 is thinned to 48 with both ends.
    assert [
        c.verifier_budget for c in cells if c.graph_batch_size == 8 and c.kind is CellKind.COMPACT
    ] == list(range(9, 48))
    big = candidate_budgets(32, 5)
    assert len(big) == 48 and big[0] == 33 and big[-1] == 191


def test_explicit_budgets_and_no_control() -> None:
    cells = plan_cells(k=3, ladder=(4,), budgets={4: (4, 10)}, include_control=False)
    assert [c.key for c in cells] == [(4, 0), (4, 4), (4, 10)]


def test_cell_properties() -> None:
    native, compact, control = CellSpec(4, 0, 3), CellSpec(4, 6, 3), CellSpec(4, 16, 3)
    assert (native.kind, compact.kind, control.kind) == (CellKind.NATIVE, CellKind.COMPACT, CellKind.CONTROL)
    assert (native.tokens, compact.tokens, control.tokens) == (16, 6, 16)
    assert compact.row_lengths() == (2, 2, 1, 1)
    assert legal_compact_budgets(4, 3) == range(4, 16)
    assert compact.label() == "G4/V6"


@given(g=st.integers(1, 64), k=st.integers(1, 8), data=st.data())
def test_row_lengths_are_feasible(g: int, k: int, data: st.DataObject) -> None:
    v = data.draw(st.sampled_from([0, *range(g, g * (k + 1) + 1)]))
    cell = CellSpec(g, v, k)
    lengths = cell.row_lengths()
    assert len(lengths) == g and sum(lengths) == cell.tokens
    assert all(1 <= n <= k + 1 for n in lengths) and max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize(
    ("case", "call"),
    [
        ("k_zero", lambda: plan_cells(k=0, ladder=(8,))),
        ("k_negative", lambda: plan_cells(k=-1, ladder=(8,))),
        ("empty_ladder", lambda: plan_cells(k=5, ladder=())),
        ("duplicate_g", lambda: plan_cells(k=5, ladder=(8, 16, 8))),
        ("g_zero", lambda: plan_cells(k=5, ladder=(0, 8))),
        ("g_huge", lambda: plan_cells(k=5, ladder=(10**6,))),
        ("v_below_g", lambda: plan_cells(k=3, ladder=(4,), budgets={4: (3,)})),
        ("v_full_width", lambda: plan_cells(k=3, ladder=(4,), budgets={4: (16,)})),
        ("v_zero_in_budgets", lambda: plan_cells(k=3, ladder=(4,), budgets={4: (0,)})),
        ("budgets_for_unknown_g", lambda: plan_cells(k=3, ladder=(4,), budgets={8: (9,)})),
        ("cell_v_illegal", lambda: CellSpec(4, 17, 3)),
        ("cell_k_zero", lambda: CellSpec(4, 0, 0)),
        ("cell_bool", lambda: CellSpec(True, 0, 3)),
        ("ladder_text", lambda: parse_ladder("8,x")),
        ("ladder_empty_text", lambda: parse_ladder(" , ")),
        ("ladder_dupe_text", lambda: parse_ladder("8,8")),
        ("budgets_no_colon", lambda: parse_budgets(["16-20"])),
        ("budgets_bad_g", lambda: parse_budgets(["x:20"])),
        ("budgets_bad_v", lambda: parse_budgets(["16:2o"])),
        ("budgets_twice", lambda: parse_budgets(["16:20", "16:24"])),
        ("max_per_g_small", lambda: candidate_budgets(8, 5, max_per_g=1)),
    ],
)
def test_bad_input_is_a_config_error(case: str, call: object) -> None:
    with pytest.raises(ConfigError):
        call()  # type: ignore[operator]  # the table holds zero-argument callables


def test_messages_name_the_problem() -> None:
    with pytest.raises(ConfigError, match=r"\[8\] more than once"):
        parse_ladder("8,16,8")
    with pytest.raises(ConfigError, match="4 <= V < 16"):
        plan_cells(k=3, ladder=(4,), budgets={4: (20,)})


def test_parse_round_trip() -> None:
    assert parse_ladder("32, 8,16") == (8, 16, 32)
    assert parse_budgets(["16:20,24", "32:40"]) == {16: (20, 24), 32: (40,)}
