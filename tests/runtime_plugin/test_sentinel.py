"""The sentinel: default cells, the pure judgement, and runs through backends by import string."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dspark_calibrate.artifacts import Reason
from dspark_calibrate.calibrate.measurement.sentinel_backend import load_sentinel_backend
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.sentinel import (
    SentinelPolicy,
    StoredCell,
    default_cells,
    judge,
    run_sentinel,
    stored_cells,
)
from tests.factories import K, make_cost_table

FAKE = "tests.runtime_plugin.fake_backends"


def _policy(**kwargs: Any) -> SentinelPolicy:
    """A policy whose backends are the sweep backends, as a serving process would pass them."""
    return SentinelPolicy(loader=load_sentinel_backend, **kwargs)


def _cell(g: int = 32, v: int = 0, t: float = 10.0, lo: float = 9.9, hi: float = 10.1) -> StoredCell:
    return StoredCell(g, v, t, lo, hi)


def test_default_cells_are_largest_native_and_its_smallest_compact() -> None:
    cells = stored_cells(make_cost_table())
    assert default_cells(cells) == ((32, 0), (32, 64))
    only_small_compact = {k: c for k, c in cells.items() if k[0] != 32 or k[1] == 0}
    assert default_cells(only_small_compact) == ((32, 0), (16, 32))
    assert default_cells({}) == ()


@pytest.mark.parametrize(
    ("samples", "ok"),
    [
        ([10.0] * 5, True),
        ([10.6] * 5, True),  # inside [9.9*0.95, 10.1*1.05] = [9.405, 10.605]
        ([10.7] * 5, False),
        ([9.3] * 5, False),
        ([10.0, 10.0, 50.0, 10.0, 10.0], True),  # the median ignores one outlier
        ([], False),
        ([10.0, math.nan, 10.0], False),
        ([10.0, -1.0, 10.0], False),
    ],
)
def test_judge_widens_the_stored_ci_by_the_tolerance(samples: list[float], ok: bool) -> None:
    checks, findings = judge([_cell()], {(32, 0): samples}, 0.05)
    assert checks[0].ok is ok
    assert (not findings) is ok
    if not ok:
        assert findings[0].reason is Reason.SENTINEL_FAILED and findings[0].field == "G32V0"
    assert checks[0].allowed_low_ms == pytest.approx(9.405)
    assert checks[0].allowed_high_ms == pytest.approx(10.605)


def test_run_sentinel_passes_on_agreeing_hardware() -> None:
    report = run_sentinel(make_cost_table(), K, _policy(backend=f"{FAKE}:ScaledBackend", samples=3, warmup=1))
    assert report.ok and not report.findings
    assert [(c.cell.graph_batch_size, c.cell.verifier_budget) for c in report.checks] == [(32, 0), (32, 64)]
    assert all(len(c.samples_ms) == 3 for c in report.checks)
    assert report.cost_s >= 0 and report.to_dict()["cost_ms"] >= 0


def test_run_sentinel_explicit_cells_and_unknown_cells() -> None:
    policy = _policy(backend=f"{FAKE}:ScaledBackend", cells=((8, 16),), backend_options={"scale": 0.8})
    report = run_sentinel(make_cost_table(), K, policy)
    assert not report.ok and report.findings[0].field == "G8V16"
    missing = run_sentinel(make_cost_table(), K, _policy(backend=f"{FAKE}:ScaledBackend", cells=((8, 24),)))
    assert missing.findings[0].reason is Reason.SENTINEL_FAILED and missing.findings[0].field == "cells"


def test_backend_options_the_factory_refuses_are_an_import_error() -> None:
    policy = _policy(backend=f"{FAKE}:ScaledBackend", backend_options={"no_such_option": 1})
    assert run_sentinel(make_cost_table(), K, policy).findings[0].reason is Reason.BACKEND_IMPORT_ERROR


def test_without_a_loader_the_sentinel_fails_closed() -> None:
    report = run_sentinel(make_cost_table(), K, SentinelPolicy(backend=f"{FAKE}:ScaledBackend"))
    assert not report.ok and report.findings[0].reason is Reason.BACKEND_IMPORT_ERROR
    assert report.findings[0].field == "loader" and not report.checks


def test_a_loader_that_cannot_import_is_an_import_error() -> None:
    def broken(spec: str, options: Any) -> Any:
        raise ImportError(f"no module for {spec}")

    policy = SentinelPolicy(backend="pkg.mod:Factory", loader=broken)
    assert run_sentinel(make_cost_table(), K, policy).findings[0].reason is Reason.BACKEND_IMPORT_ERROR


def test_synthetic_backend_needs_explicit_permission() -> None:
    base = {"backend": f"{FAKE}:ScaledBackend", "backend_options": {"synthetic": True}}
    refused = run_sentinel(make_cost_table(), K, _policy(**base))
    assert refused.findings[0].reason is Reason.SYNTHETIC_REFUSED
    assert run_sentinel(make_cost_table(), K, _policy(**base, allow_synthetic=True)).ok


@pytest.mark.parametrize(
    "kwargs",
    [
        {"backend": ""},
        {"tolerance": -0.1},
        {"tolerance": float("nan")},
        {"samples": 0},
        {"warmup": -1},
        {"replays": 0},
        {"cells": ()},
    ],
)
def test_policy_validates_itself(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"backend": "x:y", **kwargs}
    with pytest.raises(ConfigError):
        SentinelPolicy(**args)  # type: ignore[arg-type]
