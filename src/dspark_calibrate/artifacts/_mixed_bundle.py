"""The optional mixed evidence of a bundle: ``<bundle>/mixed/`` and its own manifest (DESIGN §10).

A bundle built with a mixed sweep holds, beside its decode members, a directory ``mixed/`` with
three signed members (``mixed-cost-table``, ``mixed-sweep-samples``, ``mixed-admission``), the
result files the mixed receipt's hashes point at (``results/``) and a manifest
``mixed.dsse.json`` binding the members (:data:`~._bundle.MIXED_LAYOUT`). It is verified on its
own, after the decode bundle, so that bad mixed evidence leaves mixed steps native and never
turns off an admitted decode policy.

:func:`verify_mixed` runs the manifest and every member through the one verification pipeline,
then the checks across them:

- the admission artifact pins the decode members it was built with (their logical hashes): the
  mixed evidence cannot be moved to another deployment's bundle;
- both summaries state the same route and protocol; the admission replays exactly the table's cells;
- every result file exists, is a bounded regular file and has the SHA-256 the signed summary
  pins; the measurement-results file is the canonical JSON of the cells' measurement hashes in
  cell order (TensorRT-LLM's ``measurement_results_sha256``);
- every cell's measurement hash is the logical hash of its paired samples in the samples member.

I/O: reads the result files; the members through the pipeline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from dspark_calibrate.artifacts._bundle import MIXED_LAYOUT, BundleReport, verify_bundle
from dspark_calibrate.artifacts._canonical import JsonError, canonical_json, loads_strict, sha256_hex
from dspark_calibrate.artifacts._files import FileTooLarge, read_regular_file
from dspark_calibrate.artifacts._logical_hash import logical_sha256
from dspark_calibrate.artifacts._parquet import DEFAULT_LIMITS, ReadLimits
from dspark_calibrate.artifacts._reasons import Finding, FindingsOutcome, Reason
from dspark_calibrate.artifacts._state import RollbackState
from dspark_calibrate.artifacts._trust import TrustRoot
from dspark_calibrate.artifacts._verify import Expectation, VerifiedArtifact
from dspark_calibrate.schemas import MIXED_RESULT_FILES

__all__ = [
    "MIXED_DIR",
    "MIXED_FILES",
    "MixedReport",
    "measurement_result",
    "measurement_results_bytes",
    "verify_mixed",
]

#: The mixed evidence's directory inside a bundle.
MIXED_DIR = "mixed"
#: Member file names inside ``mixed/``.
MIXED_FILES: Mapping[str, str] = {
    "mixed-cost-table": "mixed-cost-table.parquet",
    "mixed-sweep-samples": "mixed-sweep-samples.parquet",
    "mixed-admission": "mixed-admission.parquet",
}
#: Largest result file read back (a selector replay of 10^6 mixed steps is 16 MB).
MAX_RESULT_BYTES = 64 << 20


def measurement_results_bytes(hashes: list[str]) -> bytes:
    """TensorRT-LLM's canonical JSON of the cells' measurement hashes, in cell order."""
    return canonical_json(list(hashes))


def measurement_result(samples: pa.Table, mixed_group: int, capacity: int) -> str:
    """The measurement hash of a cell: the logical hash of its group's native samples and its own."""
    mask = pc.and_(
        pc.equal(samples.column("mixed_group"), mixed_group),
        pc.is_in(samples.column("capacity"), value_set=pa.array([0, capacity], pa.int64())),
    )
    return logical_sha256(samples.filter(mask), "mixed-sweep-samples")


@dataclass(frozen=True)
class MixedReport(FindingsOutcome):
    """The outcome of :func:`verify_mixed`.

    Attributes:
        path: the ``mixed/`` directory.
        present: the bundle has mixed evidence (False: nothing to verify, ``findings`` empty).
        findings: what is wrong, in pipeline order.
        bundle: the mixed manifest's report.
        results: result file name → its bytes (verified against the signed hashes).
    """

    path: Path
    present: bool
    findings: tuple[Finding, ...]
    bundle: BundleReport | None = None
    results: Mapping[str, bytes] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when mixed evidence is present and everything verified."""
        return self.present and not self.findings

    def artifact(self, kind: str) -> VerifiedArtifact | None:
        """A verified member (None when absent or rejected)."""
        return self.bundle.artifact(kind) if self.bundle is not None else None

    @property
    def message(self) -> str:
        """One line: why it failed, or what verified."""
        if not self.present:
            return f"{self.path}: no mixed evidence"
        if self.findings:
            return self.findings[0].message
        return f"{self.path}: valid mixed evidence v{self.bundle.version if self.bundle else '?'}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "path": str(self.path),
            "present": self.present,
            "valid": self.ok,
            "code": self.code if self.present else "ABSENT",
            "message": self.message,
            "findings": [f.to_dict() for f in self.findings],
            "bundle": self.bundle.to_dict() if self.bundle is not None else None,
        }


def _mismatch(where: Path, message: str, field_name: str) -> Finding:
    return Finding(Reason.CROSS_MEMBER_MISMATCH, f"{where}: {message}", field=field_name)


def _results(path: Path, pins: Any, limits: ReadLimits) -> tuple[dict[str, bytes], list[Finding]]:
    out: dict[str, bytes] = {}
    found: list[Finding] = []
    if not isinstance(pins, Mapping) or set(pins) != set(MIXED_RESULT_FILES):
        return out, [
            Finding(
                Reason.CONTENT_INVALID,
                f"{path}: the admission summary must pin {sorted(MIXED_RESULT_FILES)}",
                "results",
            )
        ]
    for name, rel in MIXED_RESULT_FILES.items():
        file = path / rel
        try:
            data = read_regular_file(file, min(MAX_RESULT_BYTES, limits.max_file_bytes))
        except FileNotFoundError:
            found.append(
                Finding(
                    Reason.BUNDLE_MEMBER_MISSING,
                    f"{file}: result file missing; rebuild the bundle",
                    field=name,
                )
            )
            continue
        except FileTooLarge:
            found.append(
                Finding(Reason.CONTENT_INVALID, f"{file}: larger than the result file limit", field=name)
            )
            continue
        except OSError as exc:
            found.append(Finding(Reason.IO_ERROR, f"{file}: cannot read ({exc.strerror or exc})", field=name))
            continue
        if sha256_hex(data) != pins[name]:
            found.append(
                Finding(
                    Reason.BUNDLE_MEMBER_MISMATCH,
                    f"{file}: its bytes do not have the SHA-256 the signed admission pins; restore the bundle's own file",
                    field=name,
                    expected=pins[name],
                    actual=sha256_hex(data),
                )
            )
            continue
        out[name] = data
    return out, found


def cross_findings(
    path: Path,
    costs: VerifiedArtifact,
    samples: VerifiedArtifact,
    admission: VerifiedArtifact,
    decode: BundleReport,
    results: Mapping[str, bytes],
) -> list[Finding]:
    """The checks across the mixed members, the decode bundle and the result files. Pure."""
    out: list[Finding] = []
    cs, asum = costs.summary, admission.summary
    pins = asum.get("decode_members")
    have = {k: r.artifact.logical_sha256 for k, r in decode.members.items() if r.artifact is not None}
    if pins != have:
        out.append(
            _mismatch(
                path,
                f"the mixed evidence was built with decode members {pins!r}, this bundle holds {have!r}; mixed "
                "evidence belongs to the bundle it was built with",
                "decode_members",
            )
        )
    for key in ("route", "protocol_sha256", "minimum_predicted_gain"):
        if cs.get(key) != asum.get(key):
            out.append(_mismatch(path, f"mixed cost table and admission disagree on {key}", key))
    if samples.summary.get("route") != cs.get("route"):
        out.append(_mismatch(path, "mixed samples and cost table disagree on the route", "route"))
    table_cells = costs.table.column("geometry_sha256").to_pylist()
    if sorted(admission.table.column("geometry_sha256").to_pylist()) != sorted(table_cells):
        out.append(
            _mismatch(path, "the mixed admission does not replay exactly the cost table's cells", "cells")
        )
    hashes = costs.table.column("measurement_result_sha256").to_pylist()
    listed = results.get("measurement_results")
    if listed is not None and listed != measurement_results_bytes(hashes):
        out.append(
            _mismatch(
                path,
                "measurement_results.json is not the canonical list of the cells' measurement hashes",
                "measurement_results",
            )
        )
    groups = costs.table.column("mixed_group").to_pylist()
    caps = costs.table.column("capacity").to_pylist()
    for i, (g, c, h) in enumerate(zip(groups, caps, hashes, strict=True)):
        if measurement_result(samples.table, int(g), int(c)) != h:
            out.append(
                _mismatch(
                    path,
                    f"mixed cell {i}: its measurement hash is not the logical hash of its paired samples in the "
                    "samples member; the cell was not measured as stated",
                    "measurement_result_sha256",
                )
            )
            break
    source = results.get("source_and_measurements")
    if source is not None:
        try:
            doc = loads_strict(source, what="source_and_measurements.json")
        except JsonError as exc:
            out.append(Finding(Reason.CONTENT_INVALID, f"{path}: {exc}", field="source_and_measurements"))
        else:
            if not isinstance(doc, Mapping) or doc.get("samples_logical_sha256") != samples.logical_sha256:
                out.append(
                    _mismatch(
                        path,
                        "source_and_measurements.json names another samples table",
                        "source_and_measurements",
                    )
                )
    return out


def _fingerprint_differs(path: Path, report: BundleReport, decode: BundleReport) -> Finding | None:
    """The finding when the mixed manifest's fingerprint is not the decode bundle's, else None."""
    if report.fingerprint is not None and decode.fingerprint is not None:
        if report.fingerprint == decode.fingerprint:
            return None
        diff = [n for n, _, _ in report.fingerprint.diff(decode.fingerprint)]
    else:
        diff = ["fingerprint"]
    return _mismatch(
        path, f"the mixed evidence's fingerprint differs from the bundle's in {diff}", "fingerprint"
    )


def verify_mixed(
    bundle_dir: Path | str,
    trust_root: TrustRoot,
    *,
    now: datetime,
    decode: BundleReport,
    expected: Expectation = Expectation(),
    state: RollbackState | None = None,
    record: bool = False,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> MixedReport:
    """Verify a bundle's mixed evidence (see the module docstring); never raises for bad evidence.

    Args:
        bundle_dir: the bundle directory (its ``mixed/`` is verified).
        trust_root: the pinned trust root.
        now: the current time.
        decode: the decode bundle's passing report (the mixed evidence must pin its members).
        expected: as for the decode bundle; ``expected.mixed`` binds the live route.
        state, record, limits: as :func:`~._bundle.verify_bundle` (recorded only when valid).
    """
    base = Path(bundle_dir)
    base = base if base.is_dir() else base.parent
    path = base / MIXED_DIR
    if not path.exists():
        return MixedReport(path=path, present=False, findings=())
    if not decode.ok:
        return MixedReport(
            path=path,
            present=True,
            findings=(
                Finding(Reason.BUNDLE_INVALID, f"{path}: the decode bundle did not verify", field="decode"),
            ),
        )
    report = verify_bundle(
        path,
        trust_root,
        now=now,
        expected=replace(expected, kind=None),
        state=state,
        record=False,
        limits=limits,
        layout=MIXED_LAYOUT,
    )
    if not report.ok:
        return MixedReport(path=path, present=True, findings=report.findings, bundle=report)
    costs, samples, admission = (report.artifact(k) for k in MIXED_LAYOUT.kinds)
    assert costs is not None and samples is not None and admission is not None
    differs = _fingerprint_differs(path, report, decode)
    if differs is not None:
        return MixedReport(path=path, present=True, findings=(differs,), bundle=report)
    results, found = _results(path, admission.summary.get("results"), limits)
    found += cross_findings(path, costs, samples, admission, decode, results)
    if found:
        return MixedReport(path=path, present=True, findings=tuple(found), bundle=report, results=results)
    if record and state is not None:
        recorded = verify_bundle(
            path,
            trust_root,
            now=now,
            expected=replace(expected, kind=None),
            state=state,
            record=True,
            limits=limits,
            layout=MIXED_LAYOUT,
        )
        if not recorded.ok:
            return MixedReport(
                path=path, present=True, findings=recorded.findings, bundle=recorded, results=results
            )
    return MixedReport(path=path, present=True, findings=(), bundle=report, results=results)
