"""The replayed policy's dwell (how long it stays on one cell) and the build's note when the sweep
timed its cells at another."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dspark_calibrate.calibrate.deployment.build import dwell_note
from dspark_calibrate.calibrate.deployment.replay import policy_dwell


def test_the_dwell_of_a_known_sequence() -> None:
    """Step ids out of order are put in order first; a change of G ends a run like a change of V."""
    g = np.array([8, 8, 8, 8, 16, 16, 8, 8])
    v = np.array([0, 0, 16, 16, 0, 32, 32, 32])
    ids = np.arange(8)
    shuffle = np.array([3, 0, 6, 1, 7, 2, 5, 4])
    out = policy_dwell(ids[shuffle], g[shuffle], v[shuffle])
    # runs: (8,0)x2, (8,16)x2, (16,0)x1, (16,32)x1, (8,32)x2
    assert out["steps"] == pytest.approx(8 / 5)
    assert out["per_g"] == {"8": pytest.approx(6 / 3), "16": pytest.approx(2 / 2)}


def test_no_step_has_no_dwell() -> None:
    empty = np.array([], dtype=np.int64)
    assert policy_dwell(empty, empty, empty) == {"steps": None, "per_g": {}}


def test_a_policy_that_never_switches_has_one_run() -> None:
    out = policy_dwell(np.arange(50), np.full(50, 64), np.full(50, 128))
    assert out == {"steps": 50.0, "per_g": {"64": 50.0}}


_DWELL = {"steps": 2.7, "per_g": {"256": 3.1, "8": 1.9}}


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (
            {"mix_term": {"measured": True, "stays": [0.0, 0.75]}},
            "half its rounds switching cells every step",
        ),
        (
            {"mix_term": {"measured": False, "dwell": 6.0, "stays": [5 / 6]}},
            "in runs of 6 steps (--dwell), more than 25% off at G=[8, 256]",
        ),
        (
            {"mix_term": {"measured": False, "dwell": 2.7}},
            "in runs of 2.7 steps (--dwell), more than 25% off at G=[8]",
        ),
        (
            {"mix_term": {"measured": False, "dwell": {"8": 1.9, "256": 6.0}}},
            "in runs of G8 1.9, G256 6 steps (--dwell), more than 25% off at G=[256]",
        ),
        (
            {"mix_term": {"measured": False, "dwell": {"8": 1.9, "128": 3.1}}},
            "more than 25% off at G=[256]",
        ),
        ({"mix_term": {"measured": False}, "throttle": {"power_capped_share": 0.9}}, "timed each cell alone"),
        ({"throttle": {"power_capped_share": 0.6}}, "timed each cell alone"),
    ],
    ids=[
        "two-designs", "another-dwell", "one-dwell-off-at-one-g", "per-g-off-at-one-g",
        "per-g-without-a-g-the-policy-ran", "one-cell-per-visit-capped", "old-sweep-capped",
    ],
)  # fmt: skip
def test_the_build_says_when_the_sweep_timed_another_dwell(extra: dict[str, Any], says: str) -> None:
    """The note names the G the sweep missed and the --dwell to sweep at: the policy's overall
    dwell and each G's own where it sits more than 25% from that (G=8 here, not G=256)."""
    note = dwell_note(_DWELL, extra)
    assert note is not None and says in note
    assert "stays 2.7 steps on a cell (G8 1.9, G256 3.1)" in note and "--dwell 2.7,8=1.9 measures" in note


@pytest.mark.parametrize(
    "measured",
    [{"8": 1.9, "256": 3.1}, {"8": 2.2, "256": 2.6}, {"8": 1.6, "256": 3.8}, {"8": 2.0, "64": 9.0, "256": 3.0}],
    ids=["the-policys", "inside-25pct", "inside-25pct-other-side", "a-g-the-policy-never-ran"],
)
def test_a_sweep_at_the_policys_dwell_per_g_needs_no_note(measured: dict[str, float]) -> None:
    assert dwell_note(_DWELL, {"mix_term": {"measured": False, "dwell": measured}}) is None


@pytest.mark.parametrize("measured", [2.7, 2.45, 3.05])
def test_one_dwell_for_every_g_needs_no_note_where_each_g_is_near_it(measured: float) -> None:
    near = {"steps": 2.7, "per_g": {"256": 3.0, "8": 2.5}}
    assert dwell_note(near, {"mix_term": {"measured": False, "dwell": measured}}) is None
    note = dwell_note(near, {"mix_term": {"measured": False, "dwell": 4.5}})
    assert note is not None and "--dwell 2.7 measures" in note


def test_a_replay_without_steps_needs_no_note() -> None:
    assert dwell_note({"steps": None, "per_g": {}}, {}) is None


@pytest.mark.parametrize(
    "extra", [{}, {"mix_term": {"measured": False}, "throttle": {"power_capped_share": 0.2}}]
)
def test_a_sweep_of_single_cells_off_the_cap_needs_no_note(extra: dict[str, Any]) -> None:
    """Off the power cap the clock does not follow the mix, so the dwell does not move a saving."""
    assert dwell_note(_DWELL, extra) is None
