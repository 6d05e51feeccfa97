"""Bundles written by released versions still verify with the current code (STYLE rule 18)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from dspark_calibrate.artifacts import LEGACY_UNPAIRED_COSTS, Expectation, load_trust_root, verify_bundle

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


def test_a_pre_pairing_cost_table_carries_its_notice() -> None:
    """Schema-1 cost tables verify, and every consumer is told they were priced the old way."""
    folder, now = VECTORS[0]
    root = load_trust_root((COMPAT / folder / "trust-root.json").read_bytes(), now=now)
    report = verify_bundle(
        COMPAT / folder / "bundle", root, now=now, expected=Expectation(allow_synthetic=True)
    )
    assert [n.code for n in report.notices] == [LEGACY_UNPAIRED_COSTS]
    cost = report.to_dict()["members"]["cost-table"]["artifact"]
    assert cost["schema_version"] == 1
    assert [n["code"] for n in cost["notices"]] == [LEGACY_UNPAIRED_COSTS]
    assert report.to_dict()["notices"][0]["message"].startswith(
        str(COMPAT / folder / "bundle" / "cost-table.parquet")
    )
