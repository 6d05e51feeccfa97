"""The fused serving planner (the device planner inside the engine's cell graphs) on the CPU.

An engine's buffers are emulated with CPU tensors that share memory with the host arrays (on
CUDA one input copy per step moves them): the fused planner must commit exactly the cells of the
lagged ``ServingPlanner``, write exactly the reference allocation into the window buffer, count
the same statistics, keep every step native under ``force_native``, survive non-finite logits,
refuse buffers it cannot use, and its compiled ranking and allocation must equal the eager one.
"""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest
import torch

from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.device_planner import (
    DevicePlanner,
    ServingPlanner,
    compiled_parts,
    lagged_cell,
)
from dspark_calibrate.runtime_plugin.fused_planner import FusedServingPlanner, decision_size
from dspark_calibrate.runtime_plugin.planner import StepRows, allocate, plan
from tests.runtime_plugin.test_device_planner import _steps
from tests.runtime_plugin.test_planner import CAL, K, staircase_table


class _Buffers:
    """One G's engine buffers: host arrays and CPU tensors over the same memory."""

    def __init__(self, g: int, d: int) -> None:
        self.logits_host = np.zeros((g, K), dtype=np.float32)
        self.ints_host = np.zeros(3, dtype=np.int64)
        self.logits = torch.from_numpy(self.logits_host).view(1, g, K)
        self.ints = torch.from_numpy(self.ints_host)
        self.windows = torch.zeros(g, dtype=torch.int64)
        self.decision = torch.zeros(d, dtype=torch.float32)  # the engine's float32 output region

    def kwargs(self) -> dict[str, Any]:
        return {
            "logits": self.logits,
            "ints": self.ints,
            "ints_host": self.ints_host,
            "windows": self.windows,
            "decision": self.decision,
        }


def _fused(force_native: bool = False) -> tuple[FusedServingPlanner, dict[int, _Buffers]]:
    table = staircase_table()
    fused = FusedServingPlanner(DevicePlanner(table, CAL), force_native=force_native)
    bufs = {g: _Buffers(g, fused.decision_size(g)) for g in table.graph_batch_sizes}
    for g, b in bufs.items():
        fused.bind(g, **b.kwargs())
    return fused, bufs


def _step(
    fused: FusedServingPlanner, bufs: dict[int, _Buffers], x: np.ndarray, observe: bool = True
) -> tuple[int, int]:
    """One engine step: commit, write the logits, run the hooks as the cell's graph does, observe."""
    g, v = fused.commit([x.shape[0]])
    b = bufs[g]
    b.logits_host[: x.shape[0]] = x
    critical, beside = fused.hooks(g)
    critical()
    beside()
    if observe:
        fused.observe(b.decision.numpy().copy())
    return g, v


def test_commits_the_lagged_cells_and_allocates_them_exactly() -> None:
    table = staircase_table()
    fused, bufs = _fused()
    lagged = ServingPlanner(DevicePlanner(table, CAL))
    steps = _steps(80, seed=3)
    previous: tuple[int, int] | None = None
    for x in steps:
        rows = StepRows.single_rank(x.astype(np.float64))
        got = _step(fused, bufs, x)
        assert got == lagged.launch(x, [x.shape[0]]) == lagged_cell(table, previous, [x.shape[0]])
        g, v = got
        if v:
            ref = allocate(table, CAL, rows, graph_batch_size=g, verifier_budget=v)
            assert bufs[g].windows[: x.shape[0]].tolist() == ref.windows.tolist()
        same = plan(table, CAL, rows)
        previous = (same.graph_batch_size, same.verifier_budget)
    mine, theirs = fused.finish(), lagged.finish()
    for key in (
        "steps",
        "selected_compact_steps",
        "committed_compact_steps",
        "lag_disagreements",
        "verified_tokens",
    ):
        assert mine[key] == theirs[key], key
    assert mine["lag_score_loss"] == pytest.approx(theirs["lag_score_loss"], rel=1e-5)
    assert 0 < mine["committed_compact_steps"] < len(steps)
    assert mine["mode"] == "fused" and mine["snapshot_late"] == 0


def test_force_native_commits_native_and_still_runs_the_path() -> None:
    fused, bufs = _fused(force_native=True)
    steps = _steps(40, seed=1)
    assert all(_step(fused, bufs, x)[1] == 0 for x in steps)
    stats = fused.finish()
    assert stats["committed_compact_steps"] == 0 and stats["selected_compact_steps"] > 0
    assert stats["verified_tokens"] == sum(x.shape[0] * (K + 1) for x in steps)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_logits_are_counted_and_the_next_step_is_native(bad: float) -> None:
    fused, bufs = _fused()
    good = np.full((6, K), 4.0, dtype=np.float32)
    for _ in range(3):
        _step(fused, bufs, good)
    assert fused._latest is not None and fused._latest[2] != 0  # a compact decision is in force
    broken = good.copy()
    broken[2, 1] = bad
    _step(fused, bufs, broken)
    assert _step(fused, bufs, good)[1] == 0  # the decision beside the broken step was native
    stats = fused.finish()
    assert stats["non_finite_steps"] == 1


def test_an_unobserved_step_leaves_the_next_one_native() -> None:
    fused, bufs = _fused()
    good = np.full((6, K), 4.0, dtype=np.float32)
    for _ in range(3):
        _step(fused, bufs, good)
    _step(fused, bufs, good, observe=False)
    assert _step(fused, bufs, good)[1] == 0
    assert fused.finish()["snapshot_late"] == 1


def test_rows_above_the_ladder_or_none_run_the_static_fallback() -> None:
    fused, _ = _fused()
    assert fused.commit([0]) == (0, 0)
    assert fused.commit([10_000]) == (0, 0)
    assert fused.finish()["no_graph_steps"] == 2


def _bad_bind(field: str, value: Any) -> dict[str, Any]:
    b = _Buffers(16, decision_size(len(staircase_table().compact_budgets(16))))
    kwargs = b.kwargs()
    kwargs[field] = value
    return kwargs


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("logits", torch.zeros(1, 8, K), "logits must be"),
        ("logits", torch.zeros(1, 16, K, dtype=torch.int64), "logits must be"),
        ("ints", torch.zeros(3, dtype=torch.int32), "ints must be"),
        ("ints", torch.zeros(4, dtype=torch.int64), "ints must be"),
        ("ints_host", np.zeros(3, dtype=np.int32), "ints_host"),
        ("windows", torch.zeros(8, dtype=torch.int64), "window target"),
        ("windows", torch.zeros(16, dtype=torch.float32), "window target"),
        ("decision", torch.zeros(3), "decision target"),
        (
            "decision",
            torch.zeros(decision_size(len(staircase_table().compact_budgets(16))), dtype=torch.int64),
            "decision target",
        ),
    ],
)
def test_bind_refuses_buffers_it_cannot_use(field: str, value: Any, match: str) -> None:
    fused = FusedServingPlanner(DevicePlanner(staircase_table(), CAL))
    with pytest.raises(ConfigError, match=match):
        fused.bind(16, **_bad_bind(field, value))


def test_bind_refuses_a_g_off_the_ladder_and_a_multi_rank_planner() -> None:
    fused = FusedServingPlanner(DevicePlanner(staircase_table(), CAL))
    with pytest.raises(ConfigError, match="not on the ladder"):
        fused.bind(12, **_Buffers(12, 5).kwargs())
    with pytest.raises(ConfigError, match="one rank"):
        FusedServingPlanner(DevicePlanner(staircase_table(), CAL, num_ranks=2))
    with pytest.raises(ConfigError, match="one entry"):
        fused.commit([3, 4])


def test_decision_size_is_the_steps_decision_vector() -> None:
    table = staircase_table()
    dp = DevicePlanner(table, CAL)
    for g in table.graph_batch_sizes:
        assert decision_size(dp.step(g).columns) == dp.step(g).decision.numel()


#: The compiler the CPU test can use: inductor needs a C++ compiler; without one the same graphs
#: are traced and run by AOT autograd (what would break under compilation, a graph break or an
#: unsupported in-place write, still shows).
CPU_BACKEND = "inductor" if shutil.which("g++") or shutil.which("c++") else "aot_eager"


@pytest.mark.slow
def test_compiled_parts_equal_the_eager_ops() -> None:
    table = staircase_table()
    g = table.graph_batch_sizes[1]
    eager, compiled = DevicePlanner(table, CAL).step(g), DevicePlanner(table, CAL).step(g)
    critical, select = compiled_parts(compiled, backend=CPU_BACKEND)
    rng = np.random.default_rng(7)
    budgets = table.compact_budgets(g)
    for trial in range(6):
        n = int(rng.integers(1, g + 1))
        x = rng.normal(0.5, 2.0, (1, g, K)).astype(np.float32)
        if trial == 5:
            x[0, 0, 2] = np.nan
        column = int(rng.integers(-1, len(budgets)))
        for step in (eager, compiled):
            step.logits.copy_(torch.from_numpy(x))
            step.ints.copy_(torch.tensor([n, column, 0]))
        eager.enqueue_critical()
        eager.enqueue_select()
        critical()
        select()
        assert torch.equal(eager.windows, compiled.windows), (trial, n, column)
        assert torch.equal(eager._order, compiled._order)
        torch.testing.assert_close(eager._ranked, compiled._ranked, rtol=0, atol=1e-15)
        assert eager.read().column == compiled.read().column
        torch.testing.assert_close(eager.decision, compiled.decision, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_the_counted_allocation_equals_the_sorted_order_on_ties() -> None:
    table = staircase_table()
    step = DevicePlanner(table, CAL).step(16)
    budgets = table.compact_budgets(16)
    rng = np.random.default_rng(11)
    for _ in range(20):
        n = int(rng.integers(1, 17))
        # Few distinct values: many exact ties, broken by position, then row.
        x = rng.choice([-1.0, 0.5, 3.0], size=(1, 16, K)).astype(np.float32)
        step.logits.copy_(torch.from_numpy(x))
        step.ints.copy_(torch.tensor([n, int(rng.integers(0, len(budgets))), 0]))
        step.enqueue_critical()
        step.enqueue_select()
        per = int(step._extra[int(step.ints[1]), n])
        if per < 0:
            continue
        grant = torch.zeros_like(step._cand, dtype=torch.bool)
        grant[0, step._order[0, :per]] = True  # the first `per` of the stable sort
        floor = step.planner.min_verify_len
        want = floor + grant.view(1, K - floor, 16).sum(dim=1)
        assert torch.equal(step.windows, want)


def test_a_compiler_that_fails_falls_back_to_the_eager_ops() -> None:
    fused, bufs = _fused()
    x = np.full((6, K), 4.0, dtype=np.float32)
    step = fused._steps[8]

    def broken() -> None:
        raise RuntimeError("no compiler here")

    step._critical_fn = step._select_fn = broken
    for _ in range(3):
        _step(fused, bufs, x)
    assert step._critical_fn is None and step._select_fn is None
    assert step.compile_error == "RuntimeError: no compiler here"
    assert bufs[8].windows[:6].tolist() != [0] * 6  # the eager ops wrote the windows
    assert fused.finish()["compile_errors"] == ["RuntimeError: no compiler here"]


@pytest.mark.parametrize(
    "damage",
    [lambda d: d[:2], lambda d: np.full_like(d, np.nan), lambda d: np.full_like(d, 99.0)],
    ids=["short", "nan", "column"],
)
def test_a_damaged_decision_is_counted_and_the_next_step_runs_native(damage: Any) -> None:
    fused, bufs = _fused()
    good = np.full((6, K), 4.0, dtype=np.float32)
    for _ in range(3):
        _step(fused, bufs, good)
    g, _ = fused.commit([6])
    fused.hooks(g)[0]()
    fused.hooks(g)[1]()
    fused.observe(damage(bufs[g].decision.numpy().copy()))
    assert _step(fused, bufs, good)[1] == 0
    stats = fused.finish()
    assert stats["bad_decisions"] == 1 and stats["snapshot_late"] == 1
