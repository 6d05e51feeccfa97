"""Bundle manifests: members bound by logical hash and version, no mix-and-match across bundles."""

from __future__ import annotations

import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from dspark_calibrate.artifacts import (
    BUNDLE_MANIFEST,
    Expectation,
    Reason,
    RollbackState,
    require_valid,
    verify_bundle,
    verify_path,
    write_bundle,
)
from dspark_calibrate.errors import ConfigError
from tests.factories import NOW, calibration_rows, cost_rows, make_fingerprint, make_table
from tests.signing import make_root, make_signers, resign, sign_table

LATER = NOW + timedelta(hours=1)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    return make_signers(tmp_path_factory.mktemp("keys"), 2)


def make_bundle(tmp: Path, signers: Any, *, version: int = 1, fp: Any = None, scale: float = 1.0) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    fp = fp or make_fingerprint()
    rows = [
        {
            **r,
            "step_time_ms": r["step_time_ms"] * scale,
            "ci_low_ms": r["ci_low_ms"] * scale,
            "ci_high_ms": r["ci_high_ms"] * scale,
        }
        for r in cost_rows()
    ]
    ct = sign_table(
        tmp / "cost-table.parquet",
        "cost-table",
        make_table("cost-table", rows),
        signers,
        version=version,
        fingerprint=fp,
    )
    cal = sign_table(
        tmp / "calibration.parquet",
        "calibration",
        make_table("calibration", calibration_rows()),
        signers,
        version=version,
        fingerprint=fp,
    )
    root = make_root(signers)
    members = {
        "cost-table": require_valid(verify_path(ct, root, now=LATER)),
        "calibration": require_valid(verify_path(cal, root, now=LATER)),
    }
    write_bundle(tmp, members, signers, version=version, issued_at=NOW, expires_at=NOW + timedelta(days=30))
    return tmp


def test_valid_bundle(tmp_path: Path, keys: Any) -> None:
    b = make_bundle(tmp_path / "b", keys[:1])
    report = verify_bundle(
        b, make_root(keys[:1]), now=LATER, expected=Expectation(fingerprint=make_fingerprint())
    )
    assert report.ok, report.message
    assert set(report.members) == {"cost-table", "calibration"}
    assert report.artifact("cost-table") is not None
    # the manifest path works as well as the directory
    assert verify_bundle(b / BUNDLE_MANIFEST, make_root(keys[:1]), now=LATER).ok


def test_member_swapped_from_another_bundle(tmp_path: Path, keys: Any) -> None:
    a = make_bundle(tmp_path / "a", keys[:1])
    b = make_bundle(tmp_path / "b", keys[:1], scale=1.1)  # same deployment, other measurements
    shutil.copy(b / "cost-table.parquet", a / "cost-table.parquet")
    shutil.copy(b / "cost-table.parquet.dsse.json", a / "cost-table.parquet.dsse.json")
    report = verify_bundle(a, make_root(keys[:1]), now=LATER)
    assert report.reason is Reason.BUNDLE_MEMBER_MISMATCH
    assert report.findings[0].field == "cost-table"


def test_member_from_other_deployment(tmp_path: Path, keys: Any) -> None:
    a = make_bundle(tmp_path / "a", keys[:1])
    other = make_bundle(tmp_path / "o", keys[:1], fp=make_fingerprint(gpu="H100"))
    shutil.copy(other / "calibration.parquet", a / "calibration.parquet")
    shutil.copy(other / "calibration.parquet.dsse.json", a / "calibration.parquet.dsse.json")
    report = verify_bundle(a, make_root(keys[:1]), now=LATER)
    # Same rows, same version, so the logical hash matches: the fingerprint is what gives it away.
    assert report.reason is Reason.CROSS_MEMBER_MISMATCH
    assert report.findings[0].field == "gpu"


def test_member_missing_file(tmp_path: Path, keys: Any) -> None:
    a = make_bundle(tmp_path / "a", keys[:1])
    (a / "calibration.parquet").unlink()
    report = verify_bundle(a, make_root(keys[:1]), now=LATER)
    # A file the signed manifest names is missing: the evidence is incomplete, not an I/O error.
    assert report.reason is Reason.BUNDLE_MEMBER_MISSING and report.findings[0].field == "calibration"


def test_manifest_missing(tmp_path: Path, keys: Any) -> None:
    a = make_bundle(tmp_path / "a", keys[:1])
    (a / BUNDLE_MANIFEST).unlink()
    assert verify_bundle(a, make_root(keys[:1]), now=LATER).reason is Reason.BUNDLE_MEMBER_MISSING


def test_manifest_signed_by_untrusted_key(tmp_path: Path, keys: Any) -> None:
    a = make_bundle(tmp_path / "a", keys[1:2])
    assert verify_bundle(a, make_root(keys[:1]), now=LATER).reason is Reason.SIGNATURE_THRESHOLD


def test_tampered_member_is_reported(tmp_path: Path, keys: Any) -> None:
    a = make_bundle(tmp_path / "a", keys[:1])
    resign(a / "cost-table.parquet", keys[:1], lambda s: s["predicate"].update(version=5))
    report = verify_bundle(a, make_root(keys[:1]), now=LATER)
    assert report.reason is Reason.BUNDLE_MEMBER_MISMATCH  # re-signed member is a different version


def test_manifest_expired_and_binding(tmp_path: Path, keys: Any) -> None:
    a = make_bundle(tmp_path / "a", keys[:1])
    root = make_root(keys[:1])
    assert verify_bundle(a, root, now=NOW + timedelta(days=31)).reason is Reason.EXPIRED
    wrong = Expectation(fingerprint=make_fingerprint(topology="DEP8"))
    report = verify_bundle(a, root, now=LATER, expected=wrong)
    assert report.code == "FINGERPRINT_MISMATCH:topology"


def test_rollback_of_whole_bundle(tmp_path: Path, keys: Any) -> None:
    root = make_root(keys[:1])
    state = RollbackState(tmp_path / "state.json")
    v2 = make_bundle(tmp_path / "v2", keys[:1], version=2)
    assert verify_bundle(v2, root, now=LATER, state=state, record=True).ok
    v1 = make_bundle(tmp_path / "v1", keys[:1], version=1)
    assert verify_bundle(v1, root, now=LATER, state=state).reason is Reason.ROLLBACK


def test_write_bundle_refuses_mismatched_members(tmp_path: Path, keys: Any) -> None:
    root = make_root(keys[:1])
    ct = sign_table(
        tmp_path / "cost-table.parquet", "cost-table", make_table("cost-table", cost_rows()), keys[:1]
    )
    cal = sign_table(
        tmp_path / "calibration.parquet",
        "calibration",
        make_table("calibration", calibration_rows()),
        keys[:1],
        fingerprint=make_fingerprint(kv_dtype="fp8"),
    )
    members = {
        "cost-table": require_valid(verify_path(ct, root, now=LATER)),
        "calibration": require_valid(verify_path(cal, root, now=LATER)),
    }
    with pytest.raises(ConfigError, match="kv_dtype"):
        write_bundle(
            tmp_path, members, keys[:1], version=1, issued_at=NOW, expires_at=NOW + timedelta(days=1)
        )
    with pytest.raises(ConfigError, match="missing"):
        write_bundle(
            tmp_path,
            {"cost-table": members["cost-table"]},
            keys[:1],
            version=1,
            issued_at=NOW,
            expires_at=NOW + timedelta(days=1),
        )
    assert not (tmp_path / BUNDLE_MANIFEST).exists()
