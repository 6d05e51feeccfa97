"""Bundles written by released versions still verify with the current code (STYLE rule 18)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from dspark_calibrate.artifacts import Expectation, load_trust_root, verify_bundle

COMPAT = Path(__file__).resolve().parents[1] / "vectors" / "compat"
#: (folder, the instant inside the vector's validity window at which it is verified)
VECTORS = [("v0.1.0", datetime(2026, 12, 1, 19, 0, tzinfo=UTC))]


@pytest.mark.parametrize(("folder", "now"), VECTORS, ids=[v[0] for v in VECTORS])
def test_released_bundle_still_verifies(folder: str, now: datetime) -> None:
    root = load_trust_root((COMPAT / folder / "trust-root.json").read_bytes(), now=now)
    report = verify_bundle(
        COMPAT / folder / "bundle", root, now=now, expected=Expectation(allow_synthetic=True)
    )
    assert report.ok, f"{report.code}: {report.message}"


@pytest.mark.parametrize(("folder", "now"), VECTORS, ids=[v[0] for v in VECTORS])
def test_released_bundle_is_still_refused_when_synthetic_is_not_allowed(folder: str, now: datetime) -> None:
    root = load_trust_root((COMPAT / folder / "trust-root.json").read_bytes(), now=now)
    report = verify_bundle(COMPAT / folder / "bundle", root, now=now, expected=Expectation())
    assert not report.ok
    assert report.code.startswith("SYNTHETIC_REFUSED")
