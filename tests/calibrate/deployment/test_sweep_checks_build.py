"""The sweep's bias checks on the build side: CellTime reads them (or their absence), build copies
them into the signed cost table and names a G whose control is biased."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from dspark_calibrate.artifacts import verify_bundle
from dspark_calibrate.calibrate.deployment.build import build_bundle, load_build_inputs
from dspark_calibrate.calibrate.deployment.cells import CHECK_COLUMNS, CellGrid, control_notes
from dspark_calibrate.errors import ConfigError
from tests.calibrate.build_factories import build_files, build_options, sweep_rows, write_sweep
from tests.factories import NOW, K
from tests.signing import make_root, make_signers

#: G=16's control saves 0.95% [0.15, 1.75]: biased; the others are clean.
BIASED = 16


def _checked_rows() -> list[dict[str, Any]]:
    rows = sweep_rows()
    for r in rows:
        g = r["graph_batch_size"]
        bias = (0.0095, 0.0015, 0.0175) if g == BIASED else (0.0005, -0.003, 0.004)
        r.update(
            control_bias=bias[0],
            control_bias_ci_low=bias[1],
            control_bias_ci_high=bias[2],
            control_widened=g == BIASED and r["verifier_budget"] > 0,
            paired_rel=0.004,
            paired_rel_upper=0.0065,
            clock_rel=1.0 if r["verifier_budget"] == 0 else 1.02,
            power_rel=1.0,
            carryover_rel=0.001 * (g < 32),
        )
    return rows


def test_cells_read_the_checks_and_legacy_rows_read_as_unchecked() -> None:
    grid = CellGrid.from_rows(K, _checked_rows())
    cell = grid.compact(BIASED)[0]
    assert cell.control_widened and cell.control_bias == pytest.approx(0.0095)
    assert (cell.paired_rel, cell.paired_rel_upper, cell.clock_rel) == (0.004, 0.0065, 1.02)
    legacy = CellGrid.from_rows(K, sweep_rows()).compact(BIASED)[0]
    assert all(getattr(legacy, n) is None for n in CHECK_COLUMNS if n != "control_widened")
    assert legacy.control_widened is False


@pytest.mark.parametrize(
    ("case", "change"),
    [
        ("nan_clock", {"clock_rel": math.nan}),
        ("inf_bias", {"control_bias": math.inf}),
        ("negative_sd", {"paired_rel": -0.001}),
    ],
)
def test_cells_refuse_unusable_checks(case: str, change: dict[str, float]) -> None:
    rows = _checked_rows()
    compact = next(
        r for r in rows if r["graph_batch_size"] < r["verifier_budget"] < r["graph_batch_size"] * (K + 1)
    )
    compact.update(change)
    with pytest.raises(ConfigError, match="finite"):
        CellGrid.from_rows(K, rows)


def test_notes_name_the_biased_g_only() -> None:
    notes = control_notes(CellGrid.from_rows(K, _checked_rows()))
    assert len(notes) == 1 and f"G={BIASED}" in notes[0] and "+0.95%" in notes[0] and "widened" in notes[0]
    assert control_notes(CellGrid.from_rows(K, sweep_rows())) == []


def test_build_signs_the_checks_and_names_the_biased_g(tmp_path: Path) -> None:
    files = build_files(tmp_path / "inputs")
    write_sweep(files.sweep, _checked_rows())
    signers = make_signers(tmp_path / "keys", 1)
    root = make_root(signers)
    inputs = load_build_inputs([files.sweep], files.calibration, files.workload)
    built = build_bundle(
        inputs, tmp_path / "bundle", signers=signers, trust_root=root, options=build_options()
    )
    assert any(f"control bias at G={BIASED}" in n for n in built.notes)
    ct = verify_bundle(built.out_dir, root, now=NOW + timedelta(hours=1)).artifact("cost-table")
    assert ct is not None and ct.schema_version == 3
    source = {(r["graph_batch_size"], r["verifier_budget"]): r for r in _checked_rows()}
    for row in ct.table.to_pylist():
        src = source[(row["graph_batch_size"], row["verifier_budget"])]
        assert all(row[n] == pytest.approx(src[n]) for n in CHECK_COLUMNS), row
