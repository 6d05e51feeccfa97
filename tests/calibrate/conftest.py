"""Factories and fakes for the calibrate tests (no mocks: the synthetic backend runs for real)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticBackend
from dspark_calibrate.calibrate.measurement.ladder import plan_cells
from dspark_calibrate.calibrate.measurement.stats import Thresholds
from dspark_calibrate.calibrate.measurement.sweep import SweepConfig, build_fingerprint


class FakeClock:
    """A clock that advances only when told (seconds)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


def make_config(
    backend: SyntheticBackend | None = None,
    *,
    k: int = 3,
    ladder: tuple[int, ...] = (2, 4),
    thresholds: Thresholds | None = None,
    protocol: str = "adaptive",
    seed: int = 0,
    max_per_g: int = 6,
    forced_k: bool = False,
    **overrides: Any,
) -> tuple[SweepConfig, SyntheticBackend]:
    """A small synthetic sweep configuration and its backend (``forced_k``: with the overhead arm)."""
    backend = backend or SyntheticBackend(seed=seed)
    cells = plan_cells(k=k, ladder=ladder, max_per_g=max_per_g, include_forced_k=forced_k)
    fp = build_fingerprint(k=k, ladder=ladder, world_size=1, backend_fields=backend.fingerprint_fields())
    config = SweepConfig(
        k=k,
        ladder=ladder,
        cells=cells,
        protocol=protocol,
        thresholds=thresholds or Thresholds.quick(),
        seed=seed,
        backend=backend.describe(),
        fingerprint=fp.to_dict(),
        **overrides,
    )
    return config, backend


@pytest.fixture
def config_factory() -> Callable[..., tuple[SweepConfig, SyntheticBackend]]:
    """The :func:`make_config` factory."""
    return make_config


@pytest.fixture
def out_path(tmp_path: Path) -> Path:
    """Where a test sweep writes its summary."""
    return tmp_path / "sweep.parquet"
