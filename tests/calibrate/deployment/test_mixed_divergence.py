"""Mixed geometries under a decode policy that emits fewer tokens than the recording.

A mixed cell is keyed by its exact geometry, generation histories included. Once the decode policy
cuts a request short (it emits fewer tokens than static K did on some step), every later mixed
step holding that request has a history the recording does not have: the runtime finds no cell.
These tests hold the replay to that (``first_losses``, ``prepare_mixed(diverged=)``) and to when
it applies (``histories_follow_tokens``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from dspark_calibrate.artifacts import Expectation, verify_bundle, verify_mixed
from dspark_calibrate.calibrate.deployment.build import build_bundle, load_build_inputs
from dspark_calibrate.calibrate.deployment.cells import CellGrid
from dspark_calibrate.calibrate.deployment.mixed import (
    MixedEvidence,
    MixedGrid,
    histories_follow_tokens,
    prepare_mixed,
)
from dspark_calibrate.calibrate.deployment.mixed_build import MIXED_MINIMUM_GAIN, deploy_mixed
from dspark_calibrate.calibrate.deployment.replay import (
    choose_steps,
    estimate_drain_guard,
    first_losses,
    prepare_evidence,
)
from dspark_calibrate.calibrate.deployment.workload import write_workload
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.planner import Calibration
from tests.calibrate.build_factories import build_options
from tests.mixed_bundles import LATER, MixedBundle
from tests.signing import make_root, make_signers


def _inputs(b: MixedBundle) -> tuple[Any, MixedGrid, Calibration]:
    inputs = load_build_inputs(
        [b.files.sweep], b.files.calibration, b.files.workload, mixed_sweep=b.files.mixed_sweep
    )
    assert inputs.mixed is not None
    grid = MixedGrid.from_rows(inputs.mixed.rows, inputs.mixed.route, inputs.mixed.protocol_sha256)
    calibration = Calibration.from_rows(inputs.calibration_table.to_pylist())
    return inputs, grid, calibration


def _replay(b: MixedBundle, diverged: dict[int, int] | None) -> MixedEvidence:
    inputs, grid, calibration = _inputs(b)
    deployed, _ = grid.deployable(MIXED_MINIMUM_GAIN)
    return prepare_mixed(
        inputs.workload,
        grid,
        calibration,
        deployed,
        minimum_predicted_gain=MIXED_MINIMUM_GAIN,
        diverged=diverged,
    )


def _requests(ev: MixedEvidence) -> list[set[int]]:
    return [set(ev.row_request[ev.row_step == i].tolist()) for i in range(ev.steps)]


def test_without_divergence_the_recorded_geometries_recur(mixed_tp1: MixedBundle) -> None:
    ev = _replay(mixed_tp1, None)
    assert not ev.diverged.any() and "diverged" not in ev.reason
    assert (ev.cell >= 0).any(), "the fixture's deployed cells are chosen on some steps"


def test_a_request_cut_short_before_a_step_makes_it_native(mixed_tp1: MixedBundle) -> None:
    plain = _replay(mixed_tp1, None)
    base = _replay(mixed_tp1, {})  # the model on, no decode loss: only mixed steps' own losses
    holds = _requests(plain)
    compact = np.flatnonzero(base.cell >= 0)
    i = int(compact[len(compact) // 2])
    step = int(plain.step_id[i])
    victim = min(holds[i])
    got = _replay(mixed_tp1, {victim: step - 1})
    for j in range(got.steps):
        # Before the victim's loss takes effect: as without it. From then on, a step holding the
        # victim is native, uncovered, and emits every token.
        if got.step_id[j] < step:
            assert got.reason[j] == base.reason[j] and got.cell[j] == base.cell[j], j
        elif victim in holds[j]:
            assert got.reason[j] == "diverged" and got.cell[j] == -1 and not got.covered[j], j
            assert got.tokens[j] == got.static_tokens[j]
    assert got.reason[i] == "diverged" and base.reason[i] == "compact"


def test_every_request_cut_short_from_the_start_leaves_every_step_native(mixed_tp1: MixedBundle) -> None:
    plain = _replay(mixed_tp1, None)
    everyone = {r: -1 for held in _requests(plain) for r in held}
    got = _replay(mixed_tp1, everyone)
    assert got.diverged.all() and set(got.reason) == {"diverged"}
    assert (got.cell == -1).all() and not got.covered.any()
    np.testing.assert_array_equal(got.tokens, got.static_tokens)


def test_losses_of_compact_mixed_steps_carry_forward(mixed_tp1: MixedBundle) -> None:
    """With the model on and no decode loss, a compact mixed step that cuts a request short still
    shifts that request's later steps; the first compact step is as recorded."""
    plain = _replay(mixed_tp1, None)
    got = _replay(mixed_tp1, {})
    holds = _requests(got)
    first_compact = int(np.flatnonzero(plain.cell >= 0)[0])
    assert got.cell[first_compact] == plain.cell[first_compact]
    lost: dict[int, int] = {}
    for j in range(got.steps):
        rows = got.row_step == j
        expected = any(lost.get(r, got.step_id[j]) < got.step_id[j] for r in holds[j])
        assert bool(got.diverged[j]) == expected, j
        for r in got.row_request[rows][got.row_tokens[rows] < got.row_static[rows]].tolist():
            lost.setdefault(int(r), int(got.step_id[j]))
    if (plain.tokens < plain.static_tokens).any():
        assert got.diverged.any(), "a cut-short request held by a later step diverges it"


def test_first_losses_is_the_first_step_each_request_emits_less(mixed_tp1: MixedBundle) -> None:
    inputs, _, calibration = _inputs(mixed_tp1)
    grid = CellGrid.from_rows(inputs.k, inputs.sweep_rows)
    ev = prepare_evidence(inputs.workload, grid, calibration, per_row=True)
    guard, _ = estimate_drain_guard(ev, minimum_predicted_gain=0.0)
    column = choose_steps(ev, minimum_predicted_gain=0.0, drain_guard=guard).column
    got = first_losses(ev, column)
    brute: dict[int, int] = {}
    for row in range(ev.row_step.shape[0]):
        s = ev.row_step[row]
        if s < 0 or column[s] < 0:
            continue
        if ev.row_tokens[row, column[s]] < ev.row_static_tokens[row]:
            r, t = int(ev.row_request[row]), int(ev.step_id[s])
            brute[r] = min(brute.get(r, t), t)
    assert got == brute and got, "the fixture's decode policy cuts some request short"
    assert first_losses(ev, np.full(ev.steps, -1)) == {}


@pytest.mark.parametrize(
    ("case", "column", "per_row"),
    [("no per-row tokens", "policy", False), ("a column per step missing", "short", True)],
)
def test_first_losses_refuses_what_it_cannot_read(
    mixed_tp1: MixedBundle, case: str, column: str, per_row: bool
) -> None:
    inputs, _, calibration = _inputs(mixed_tp1)
    grid = CellGrid.from_rows(inputs.k, inputs.sweep_rows)
    ev = prepare_evidence(inputs.workload, grid, calibration, per_row=per_row)
    col = np.full(ev.steps if column == "policy" else ev.steps - 1, -1)
    with pytest.raises(ConfigError, match="first_losses"):
        first_losses(ev, col)


def test_histories_follow_tokens_only_where_a_request_s_history_changes(mixed_tp1: MixedBundle) -> None:
    inputs, _, _ = _inputs(mixed_tp1)
    wl = inputs.workload
    assert wl.mixed is not None
    assert histories_follow_tokens(wl) is False  # the synthetic recording keys a fixed KV length
    history = wl.mixed.column("history").to_numpy(zero_copy_only=False).copy()
    role = wl.mixed.column("role").to_numpy(zero_copy_only=False)
    first_generation = int(np.flatnonzero(role == "generation")[0])
    history[first_generation] += 1
    grown = wl.mixed.set_column(wl.mixed.schema.get_field_index("history"), "history", pa.array(history))
    assert histories_follow_tokens(_with_mixed(wl, grown)) is True
    assert histories_follow_tokens(_with_mixed(wl, None)) is False


def _with_mixed(wl: Any, mixed: pa.Table | None) -> Any:
    import dataclasses

    return dataclasses.replace(wl, mixed=mixed)


def test_build_prices_diverged_steps_native_where_histories_follow_tokens(
    mixed_tp1: MixedBundle, tmp_path: Path
) -> None:
    """The same inputs with one request's recorded history changed between its mixed steps: build
    turns the model on, names the diverged steps and covers fewer steps than it did."""
    inputs, _, _ = _inputs(mixed_tp1)
    wl = inputs.workload
    assert wl.mixed is not None
    history = wl.mixed.column("history").to_numpy(zero_copy_only=False).copy()
    role = wl.mixed.column("role").to_numpy(zero_copy_only=False)
    last_generation = int(np.flatnonzero(role == "generation")[-1])
    history[last_generation] += 1  # the last mixed step's geometry: unmeasured from now on
    grown = wl.mixed.set_column(wl.mixed.schema.get_field_index("history"), "history", pa.array(history))
    path = tmp_path / "workload.parquet"
    write_workload(path, _with_mixed(wl, grown), fingerprint=mixed_tp1.files.fingerprint)
    signers = make_signers(tmp_path / "keys", 1)
    result = build_bundle(
        load_build_inputs(
            [mixed_tp1.files.sweep],
            mixed_tp1.files.calibration,
            path,
            mixed_sweep=mixed_tp1.files.mixed_sweep,
        ),
        tmp_path / "bundle",
        signers=signers,
        trust_root=make_root(signers),
        options=build_options(allow_synthetic=True),
    )
    before = mixed_tp1.result.mixed_summary
    after = result.mixed_summary
    assert before is not None and after is not None
    assert before["mixed_part"]["diverged_steps"] == 0
    assert after["mixed_part"]["diverged_steps"] > 0
    assert after["mixed_part"]["covered_steps"] < before["mixed_part"]["covered_steps"]
    assert any("cut short earlier" in n for n in result.notes), result.notes
    # The signed evidence with the new count verifies like any other.
    root = make_root(signers)
    allow = Expectation(allow_synthetic=True)
    decode = verify_bundle(tmp_path / "bundle", root, now=LATER, expected=allow)
    assert verify_mixed(tmp_path / "bundle", root, now=LATER, decode=decode, expected=allow).ok


def test_a_cell_no_step_chooses_says_what_its_steps_did(mixed_tp1: MixedBundle) -> None:
    """Build's reason for a cell no step chooses names the runtime's reasons on its group's steps:
    with every request cut short from the start, every step of every group diverged."""
    inputs, grid, calibration = _inputs(mixed_tp1)
    everyone = {r: -1 for held in _requests(_replay(mixed_tp1, None)) for r in held}
    deployed, left, _ = deploy_mixed(
        inputs.workload, grid, calibration, minimum_predicted_gain=MIXED_MINIMUM_GAIN, diverged=everyone
    )
    never = [why for _, why in left if why.startswith("never_chosen:")]
    assert not deployed and never
    assert all("(its steps: diverged " in why and why.endswith(")") for why in never), never[:3]
