"""A bundle's mixed evidence: verified on its own, one rejection per way it can be wrong.

Each row changes a valid bundle's ``mixed/`` in one way (signing a changed member and the mixed
manifest again where the defect is behind a signature), and the decode bundle stays valid.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from dspark_calibrate.artifacts import (
    Expectation,
    MixedLive,
    Reason,
    logical_sha256,
    read_artifact,
    verify_bundle,
    verify_mixed,
)
from dspark_calibrate.artifacts._mixed_bundle import MIXED_DIR, MIXED_FILES
from dspark_calibrate.schemas import MIXED_RESULT_FILES
from tests.mixed_bundles import LATER, MixedBundle, copy_bundle, resign_mixed

EXPECT = Expectation(allow_synthetic=True)


def _verify(bundle: Path, b: MixedBundle, expected: Expectation = EXPECT) -> Any:
    decode = verify_bundle(bundle, b.root, now=LATER, expected=expected)
    assert decode.ok, decode.message
    return verify_mixed(bundle, b.root, now=LATER, decode=decode, expected=expected)


def test_valid_mixed_evidence(mixed_dep8: MixedBundle) -> None:
    report = _verify(mixed_dep8.bundle, mixed_dep8)
    assert report.ok and report.present, report.message
    assert set(report.bundle.members) == set(MIXED_FILES)
    assert set(report.results) == set(MIXED_RESULT_FILES)
    costs = report.artifact("mixed-cost-table")
    assert costs is not None and costs.table.num_rows >= 1
    hashes = costs.table.column("measurement_result_sha256").to_pylist()
    assert json.loads(report.results["measurement_results"]) == hashes


def test_a_bundle_without_mixed_evidence(mixed_dep8: MixedBundle, tmp_path: Path) -> None:
    bundle = copy_bundle(mixed_dep8, tmp_path)
    shutil.rmtree(bundle / MIXED_DIR)
    report = _verify(bundle, mixed_dep8)
    assert not report.present and not report.ok and report.findings == ()


def _unlink(rel: str) -> Callable[[Path, MixedBundle], None]:
    return lambda bundle, b: (bundle / MIXED_DIR / rel).unlink()


def _append(rel: str) -> Callable[[Path, MixedBundle], None]:
    def edit(bundle: Path, b: MixedBundle) -> None:
        with open(bundle / MIXED_DIR / rel, "ab") as f:
            f.write(b" ")

    return edit


def _summary(kind: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Path, MixedBundle], None]:
    return lambda bundle, b: resign_mixed(bundle, kind, b.signers, b.root, summary=change)


def _table(kind: str, change: Callable[[pa.Table], pa.Table]) -> Callable[[Path, MixedBundle], None]:
    return lambda bundle, b: resign_mixed(bundle, kind, b.signers, b.root, table=change)


def _other_decode_pin(s: dict[str, Any]) -> None:
    s["decode_members"] = {**s["decode_members"], "cost-table": "0" * 64}


def _other_protocol(s: dict[str, Any]) -> None:
    s["protocol_sha256"] = "0" * 64


def _rotate_hashes(t: pa.Table) -> pa.Table:
    """Swap the cells' measurement hashes (each still a hash of some cell's samples)."""
    col = t.column("measurement_result_sha256").to_pylist()
    i = t.schema.get_field_index("measurement_result_sha256")
    return t.set_column(i, "measurement_result_sha256", pa.array(col[1:] + col[:1]))


def _drop_admission_cell(t: pa.Table) -> pa.Table:
    return t.slice(1)


def _edit_samples(t: pa.Table) -> pa.Table:
    i = t.schema.get_field_index("step_time_ms")
    ms = t.column(i).to_pylist()
    ms[0] = ms[0] * 0.5
    return t.set_column(i, t.schema.field(i), pa.array(ms, type=t.schema.field(i).type))


Case = tuple[str, Callable[[Path, MixedBundle], None], Reason, str | None]
CASES: list[Case] = [
    ("manifest missing", _unlink("mixed.dsse.json"), Reason.BUNDLE_MEMBER_MISSING, None),
    ("member missing", _unlink(MIXED_FILES["mixed-admission"]), Reason.BUNDLE_MEMBER_MISSING, None),
    ("member edited", _append(MIXED_FILES["mixed-cost-table"]), Reason.NOT_PARQUET, None),
    (
        "result file missing",
        _unlink(MIXED_RESULT_FILES["accuracy"]),
        Reason.BUNDLE_MEMBER_MISSING,
        "accuracy",
    ),
    (
        "result file edited",
        _append(MIXED_RESULT_FILES["runtime_invariants"]),
        Reason.BUNDLE_MEMBER_MISMATCH,
        "runtime_invariants",
    ),
    (
        "moved from another bundle",
        _summary("mixed-admission", _other_decode_pin),
        Reason.CROSS_MEMBER_MISMATCH,
        "decode_members",
    ),
    (
        "cost table and admission disagree on the protocol",
        _summary("mixed-cost-table", _other_protocol),
        Reason.CROSS_MEMBER_MISMATCH,
        "protocol_sha256",
    ),
    (
        "admission replays other cells",
        _table("mixed-admission", _drop_admission_cell),
        Reason.CROSS_MEMBER_MISMATCH,
        "cells",
    ),
    (
        "measurement hashes not the listed ones",
        _table("mixed-cost-table", _rotate_hashes),
        Reason.CROSS_MEMBER_MISMATCH,
        "measurement_results",
    ),
    (
        "a cell's samples changed",
        _table("mixed-sweep-samples", _edit_samples),
        Reason.CROSS_MEMBER_MISMATCH,
        "measurement_result_sha256",
    ),
]


@pytest.mark.parametrize(("mutate", "reason", "field"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_mixed_evidence_is_rejected_and_decode_stays_valid(
    mixed_dep8: MixedBundle,
    tmp_path: Path,
    mutate: Callable[[Path, MixedBundle], None],
    reason: Reason,
    field: str | None,
) -> None:
    bundle = copy_bundle(mixed_dep8, tmp_path)
    mutate(bundle, mixed_dep8)
    report = _verify(bundle, mixed_dep8)
    assert report.present and not report.ok
    found = {(f.reason, f.field) for f in report.findings}
    assert any(r is reason and (field is None or f == field) for r, f in found), report.findings


def test_the_live_route_binds_the_mixed_evidence(mixed_dep8: MixedBundle) -> None:
    buckets = (96, 128, 192, 256, 384, 512)
    ok = _verify(
        mixed_dep8.bundle,
        mixed_dep8,
        Expectation(allow_synthetic=True, mixed=MixedLive(buckets, "BREAKABLE")),
    )
    assert ok.ok, ok.message
    for live, field in (
        (MixedLive(buckets[:5], "BREAKABLE"), "body_buckets"),
        (MixedLive(buckets, "PIECEWISE"), "execution_mode"),
    ):
        bad = _verify(mixed_dep8.bundle, mixed_dep8, Expectation(allow_synthetic=True, mixed=live))
        assert not bad.ok and any(field in (f.field or "") for f in bad.findings), bad.findings


def test_synthetic_mixed_evidence_needs_allow_synthetic(mixed_dep8: MixedBundle) -> None:
    decode = verify_bundle(mixed_dep8.bundle, mixed_dep8.root, now=LATER, expected=EXPECT)
    report = verify_mixed(
        mixed_dep8.bundle, mixed_dep8.root, now=LATER, decode=decode, expected=Expectation()
    )
    assert not report.ok and report.reason is Reason.SYNTHETIC_REFUSED


def test_samples_member_is_the_sweeps(mixed_dep8: MixedBundle) -> None:
    """The bundle's samples are the mixed sweep's own (same logical hash)."""
    sweep = read_artifact(mixed_dep8.files.mixed_sweep)
    samples = read_artifact(mixed_dep8.bundle / MIXED_DIR / MIXED_FILES["mixed-sweep-samples"])
    digest = logical_sha256(samples.table, "mixed-sweep-samples")
    assert digest == sweep.provenance_untrusted().extra["samples_logical_sha256"]
