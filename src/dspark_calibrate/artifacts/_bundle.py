"""Signed bundle manifests: one deployment = cost-table + calibration (+ admission) (DESIGN §4).

A bundle is a directory holding the signed member artifacts and ``bundle.dsse.json``, a DSSE
envelope around an in-toto Statement whose subjects are the members' logical hashes. Members cannot
be mixed and matched across deployments: the manifest pins each by logical hash and version, and
all members must carry the manifest's fingerprint. Verification reuses the artifact pipeline's
steps (``_verify``) for the manifest and runs the full pipeline on every member.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from securesystemslib.signer import Signer

from dspark_calibrate.artifacts._atomic import atomic_write_bytes
from dspark_calibrate.artifacts._canonical import canonical_json
from dspark_calibrate.artifacts._content import ArtifactNotice
from dspark_calibrate.artifacts._envelope import (
    BUNDLE_PREDICATE_TYPE,
    EnvelopeError,
    make_statement,
    parse_envelope,
    sign_envelope,
)
from dspark_calibrate.artifacts._files import FileTooLarge, read_regular_file
from dspark_calibrate.artifacts._models import Fingerprint, ModelError, is_sha256_hex
from dspark_calibrate.artifacts._parquet import DEFAULT_LIMITS, ReadLimits
from dspark_calibrate.artifacts._reasons import Finding, FindingsOutcome, Reason
from dspark_calibrate.artifacts._sign import format_time, parse_time, series_of
from dspark_calibrate.artifacts._state import RollbackState, SeriesIdentity, StateError
from dspark_calibrate.artifacts._trust import TrustRoot
from dspark_calibrate.artifacts._verify import (
    Expectation,
    VerificationReport,
    VerifiedArtifact,
    _statement_parts,
    _step6_freshness,
    _Stop,
    check_binding,
    check_envelope,
    series_identity,
    verify_path,
)
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.schemas import BUNDLE_KINDS

__all__ = [
    "BUNDLE_KINDS",
    "BUNDLE_MANIFEST",
    "DECODE_LAYOUT",
    "MIXED_LAYOUT",
    "BundleLayout",
    "BundleReport",
    "verify_bundle",
    "verify_inputs",
    "write_bundle",
]

BUNDLE_MANIFEST = "bundle.dsse.json"
#: Member kinds a bundle may hold; the first two are required.
_REQUIRED: tuple[str, ...] = ("cost-table", "calibration")


@dataclass(frozen=True, slots=True)
class BundleLayout:
    """What one signed manifest binds: its series name, file name, and member kinds.

    Attributes:
        name: the manifest's kind in its series (``bundle``, ``mixed-bundle``).
        manifest: the manifest's file name in the bundle directory.
        kinds: the member kinds it may hold.
        required: the kinds it must hold.
    """

    name: str
    manifest: str
    kinds: tuple[str, ...]
    required: tuple[str, ...]


#: The deployment bundle: decode cost table, calibration, admission.
DECODE_LAYOUT = BundleLayout("bundle", BUNDLE_MANIFEST, BUNDLE_KINDS, _REQUIRED)
#: The optional mixed prefill+decode evidence, in ``<bundle>/mixed/`` with its own manifest, so
#: that it is verified (and can fail) independently of the decode members (DESIGN §10).
MIXED_LAYOUT = BundleLayout(
    "mixed-bundle",
    "mixed.dsse.json",
    ("mixed-cost-table", "mixed-sweep-samples", "mixed-admission"),
    ("mixed-cost-table", "mixed-sweep-samples", "mixed-admission"),
)
_MEMBER_FILE = re.compile(r"^[A-Za-z0-9._-]+\.parquet$")
_MANIFEST_FIELDS = frozenset(
    {"schema_version", "series", "version", "issued_at", "expires_at", "fingerprint", "members"}
)


@dataclass(frozen=True)
class BundleReport(FindingsOutcome):
    """The outcome of ``verify_bundle``: manifest findings first, then the members' reports."""

    path: Path
    findings: tuple[Finding, ...]
    members: Mapping[str, VerificationReport] = field(default_factory=dict)
    version: int | None = None
    fingerprint: Fingerprint | None = None
    manifest_keyids: tuple[str, ...] = ()

    @property
    def message(self) -> str:
        """The first finding's message, or a success line."""
        if self.findings:
            return self.findings[0].message
        kinds = ", ".join(sorted(self.members))
        return f"{self.path}: valid bundle v{self.version} ({kinds})"

    def artifact(self, kind: str) -> VerifiedArtifact | None:
        """The verified member of ``kind`` (None when absent or rejected)."""
        report = self.members.get(kind)
        return report.artifact if report is not None and report.ok else None

    @property
    def notices(self) -> tuple[ArtifactNotice, ...]:
        """The members' notices, in member order (never a rejection)."""
        return tuple(n for _, r in sorted(self.members.items()) for n in r.notices)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "path": str(self.path),
            "valid": self.ok,
            "code": self.code,
            "reason": self.reason.value,
            "message": self.message,
            "version": self.version,
            "manifest_keyids": list(self.manifest_keyids),
            "findings": [f.to_dict() for f in self.findings],
            "members": {k: r.to_dict() for k, r in sorted(self.members.items())},
            "notices": [n.to_dict() for n in self.notices],
        }


def write_bundle(
    out_dir: Path,
    members: Mapping[str, VerifiedArtifact],
    signers: Sequence[Signer],
    *,
    version: int,
    issued_at: datetime,
    expires_at: datetime,
    layout: BundleLayout = DECODE_LAYOUT,
) -> Path:
    """Write and sign ``out_dir/<layout.manifest>`` binding the given (verified) members.

    The member files must already be in ``out_dir``.

    Raises:
        ConfigError: a required member is missing, members disagree on the fingerprint, or a member
            file is not in ``out_dir``.
    """
    missing = [k for k in layout.required if k not in members]
    unknown = sorted(set(members) - set(layout.kinds))
    if missing or unknown:
        raise ConfigError(
            f"bundle needs members {list(layout.required)}; missing {missing}, unknown {unknown}"
        )
    fps = {k: a.fingerprint for k, a in members.items()}
    first = fps[layout.required[0]]
    for k, fp in fps.items():
        if fp != first:
            diff = ", ".join(n for n, _, _ in first.diff(fp))
            raise ConfigError(
                f"bundle member {k} has a different fingerprint than {layout.required[0]} ({diff})"
            )
    entries: dict[str, Any] = {}
    for k, a in sorted(members.items()):
        if a.path.parent.resolve() != out_dir.resolve():
            raise ConfigError(f"bundle member {a.path} must be inside {out_dir}")
        entries[k] = {"file": a.path.name, "logical_sha256": a.logical_sha256, "version": a.version}
    predicate = {
        "schema_version": 1,
        "series": series_of(layout.name, first),
        "version": version,
        "issued_at": format_time(issued_at),
        "expires_at": format_time(expires_at),
        "fingerprint": first.to_dict(),
        "members": entries,
    }
    statement = make_statement(layout.name, "0" * 64, BUNDLE_PREDICATE_TYPE, predicate)
    statement["subject"] = [
        {"name": k, "digest": {"sha256": e["logical_sha256"]}} for k, e in sorted(entries.items())
    ]
    envelope = sign_envelope(canonical_json(statement), signers)
    path = out_dir / layout.manifest
    atomic_write_bytes(path, canonical_json(envelope))
    return path


def _manifest_predicate(
    statement: Mapping[str, Any], where: Path, layout: BundleLayout = DECODE_LAYOUT
) -> tuple[dict[str, Any], Fingerprint, datetime, datetime]:
    subject, predicate = _statement_parts(statement, where, BUNDLE_PREDICATE_TYPE)
    if set(predicate) != _MANIFEST_FIELDS or predicate.get("schema_version") != 1:
        raise _Stop(
            [
                Finding(
                    Reason.BUNDLE_INVALID,
                    f"{where}: manifest predicate fields {sorted(predicate)} are not v1",
                )
            ]
        )
    members = predicate["members"]
    if not isinstance(members, dict) or not members or set(members) - set(layout.kinds):
        raise _Stop(
            [Finding(Reason.BUNDLE_INVALID, f"{where}: members must be a subset of {list(layout.kinds)}")]
        )
    for k, e in members.items():
        if (
            not isinstance(e, dict)
            or set(e) != {"file", "logical_sha256", "version"}
            or not isinstance(e["file"], str)
            or not _MEMBER_FILE.match(e["file"])
            or not is_sha256_hex(e["logical_sha256"])
            or not isinstance(e["version"], int)
        ):
            raise _Stop([Finding(Reason.BUNDLE_INVALID, f"{where}: member {k} entry is malformed", field=k)])
    want_subject = [
        {"name": k, "digest": {"sha256": e["logical_sha256"]}} for k, e in sorted(members.items())
    ]
    if subject != want_subject:
        raise _Stop([Finding(Reason.SUBJECT_INVALID, f"{where}: subjects do not list exactly the members")])
    try:
        fp = Fingerprint.from_dict(predicate["fingerprint"])
        issued, expires = parse_time(predicate["issued_at"]), parse_time(predicate["expires_at"])
        if isinstance(predicate["version"], bool) or not isinstance(predicate["version"], int):
            raise ModelError("version must be an integer")
    except (ModelError, ValueError, TypeError) as exc:
        raise _Stop([Finding(Reason.BUNDLE_INVALID, f"{where}: {exc}")]) from None
    if predicate["series"] != series_of(layout.name, fp):
        raise _Stop(
            [Finding(Reason.BUNDLE_INVALID, f"{where}: series does not match the fingerprint", "series")]
        )
    return predicate, fp, issued, expires


def verify_bundle(
    path: Path | str,
    trust_root: TrustRoot,
    *,
    now: datetime,
    expected: Expectation = Expectation(),
    state: RollbackState | None = None,
    record: bool = False,
    required: Sequence[str] | None = None,
    limits: ReadLimits = DEFAULT_LIMITS,
    layout: BundleLayout = DECODE_LAYOUT,
) -> BundleReport:
    """Verify a bundle directory (or its manifest path) and every member.

    ``layout`` names the manifest and its member kinds (the decode bundle by default;
    :data:`MIXED_LAYOUT` for ``<bundle>/mixed``); ``required`` defaults to the layout's.

    Manifest: signature (2), payload (3), predicate (4), freshness and rollback (6), binding (7).
    Members: the full artifact pipeline each, then the bundle's own checks: the member's logical hash
    and version are the ones the manifest pins, and its fingerprint is the manifest's. State is
    recorded (manifest and members) only when everything passed.
    """
    path = Path(path)
    required = layout.required if required is None else tuple(required)
    bundle_dir = path if path.is_dir() else path.parent
    manifest = bundle_dir / layout.manifest if path.is_dir() else path
    members: dict[str, VerificationReport] = {}
    try:
        keyids, predicate, fp, identity = _check_manifest(
            _read_manifest(manifest, limits),
            manifest,
            trust_root,
            expected=expected,
            state=state,
            now=now,
            limits=limits,
            layout=layout,
            required=required,
        )
        entries: dict[str, Any] = predicate["members"]
        findings: list[Finding] = []
        for kind, entry in sorted(entries.items()):
            member_path = bundle_dir / entry["file"]
            report = verify_path(
                member_path,
                trust_root,
                now=now,
                expected=replace(expected, kind=kind),
                state=state,
                record=False,
                limits=limits,
            )
            members[kind] = report
            findings.extend(_member_findings(report, kind, member_path, entry, fp, manifest))
        if findings:
            raise _Stop(findings)
        if record and state is not None:
            _record(state, manifest, [(identity, predicate["version"])], members)
    except _Stop as stop:
        return BundleReport(path=bundle_dir, findings=stop.findings, members=members)
    return BundleReport(
        path=bundle_dir,
        findings=(),
        members=members,
        version=predicate["version"],
        fingerprint=fp,
        manifest_keyids=keyids,
    )


def _check_manifest(
    raw: bytes,
    manifest: Path,
    trust_root: TrustRoot,
    *,
    expected: Expectation,
    state: RollbackState | None,
    now: datetime,
    limits: ReadLimits,
    layout: BundleLayout,
    required: Sequence[str],
) -> tuple[tuple[str, ...], dict[str, Any], Fingerprint, SeriesIdentity]:
    """The manifest's steps: signature, payload, predicate, freshness and rollback, binding, and
    the required members; ``(keyids, predicate, fingerprint, series identity)`` or :class:`_Stop`."""
    try:
        env = parse_envelope(raw, max_bytes=limits.max_envelope_bytes)
    except EnvelopeError as exc:
        raise _Stop([Finding(exc.reason, f"{manifest}: {exc}")]) from None
    keyids, statement = check_envelope(env, trust_root, manifest)
    predicate, fp, issued, expires = _manifest_predicate(statement, manifest, layout)
    identity = series_identity("bundle", fp, predicate["series"])
    _step6_freshness(identity, predicate, issued, expires, now, expected, state, manifest)
    if expected.fingerprint is not None:
        binding, _ = check_binding(fp, expected.fingerprint, unbound=expected.unbound_fields, where=manifest)
        if binding:
            raise _Stop(binding)
    entries: dict[str, Any] = predicate["members"]
    missing = [k for k in required if k not in entries]
    if missing:
        raise _Stop(
            [
                Finding(
                    Reason.BUNDLE_MEMBER_MISSING,
                    f"{manifest}: required member(s) {missing} not in the bundle",
                    field=missing[0],
                )
            ]
        )
    return keyids, predicate, fp, identity


def _read_manifest(manifest: Path, limits: ReadLimits) -> bytes:
    """The manifest's bytes (bounded); raises :class:`_Stop` when it is missing, too large or
    unreadable."""
    try:
        return read_regular_file(manifest, limits.max_envelope_bytes)
    except FileNotFoundError:
        raise _Stop(
            [
                Finding(
                    Reason.BUNDLE_MEMBER_MISSING,
                    f"{manifest}: bundle manifest not found",
                    field="manifest",
                )
            ]
        ) from None
    except FileTooLarge as big:
        raise _Stop(
            [Finding(Reason.ENVELOPE_TOO_LARGE, f"{manifest}: {big.size} bytes is above the limit")]
        ) from None
    except OSError as exc:
        raise _Stop([Finding(Reason.IO_ERROR, f"{manifest}: cannot read ({exc.strerror or exc})")]) from None


def _member_findings(
    report: VerificationReport,
    kind: str,
    member_path: Path,
    entry: Mapping[str, Any],
    fp: Fingerprint,
    manifest: Path,
) -> list[Finding]:
    """Why a member the manifest names does not stand: its file is missing, it failed its own
    verification, or it is not the member the manifest pins (empty: it stands)."""
    if report.reason is Reason.IO_ERROR and not member_path.exists():
        # A file the signed manifest names is gone: the bundle is incomplete, which is a
        # rejection of the evidence, not an I/O problem of the caller.
        return [
            Finding(
                Reason.BUNDLE_MEMBER_MISSING,
                f"{manifest}: names the {kind} member {entry['file']}, which is missing from "
                f"{member_path.parent}; copy the whole bundle directory again, or rebuild it",
                field=kind,
            )
        ]
    if not report.ok:
        return list(report.findings)
    return _member_mismatch(report, kind, member_path, entry, fp)


def _member_mismatch(
    report: VerificationReport, kind: str, member_path: Path, entry: Mapping[str, Any], fp: Fingerprint
) -> list[Finding]:
    """A verified member that is not the one the manifest pins (logical hash, version), or whose
    fingerprint is not the bundle's; empty when it is."""
    art = report.artifact
    assert art is not None
    if art.logical_sha256 != entry["logical_sha256"] or art.version != entry["version"]:
        return [
            Finding(
                Reason.BUNDLE_MEMBER_MISMATCH,
                f"{member_path}: is not the {kind} this bundle pins (logical sha256 "
                f"{art.logical_sha256} v{art.version}, pinned {entry['logical_sha256']} "
                f"v{entry['version']}); restore the bundle's own file",
                field=kind,
                expected=entry["logical_sha256"],
                actual=art.logical_sha256,
            )
        ]
    if art.fingerprint != fp:
        diff = [n for n, _, _ in art.fingerprint.diff(fp)]
        return [
            Finding(
                Reason.CROSS_MEMBER_MISMATCH,
                f"{member_path}: fingerprint differs from the bundle's in {diff}",
                field=diff[0] if diff else kind,
            )
        ]
    return []


def _record(
    state: RollbackState,
    manifest: Path,
    accepted: list[tuple[SeriesIdentity, int]],
    members: Mapping[str, VerificationReport],
) -> None:
    """Record the manifest's and its members' versions in one locked, atomic state update."""
    for report in members.values():
        a = report.artifact
        assert a is not None
        accepted.append((a.identity, a.version))
    try:
        state.update(accepted)
    except StateError as exc:
        raise _Stop([Finding(exc.reason, f"{manifest}: {exc}")]) from None


def verify_inputs(
    paths: Sequence[Path | str],
    trust_root: TrustRoot,
    *,
    now: datetime,
    expected: Expectation = Expectation(),
    state: RollbackState | None = None,
    record: bool = False,
) -> list[VerificationReport | BundleReport]:
    """Verify each path: a directory as a bundle (:func:`verify_bundle`), a file as one artifact
    (:func:`verify_path`). The one call behind ``dspark-verify``'s artifact check."""
    out: list[VerificationReport | BundleReport] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            out.append(
                verify_bundle(path, trust_root, now=now, expected=expected, state=state, record=record)
            )
        else:
            out.append(verify_path(path, trust_root, now=now, expected=expected, state=state, record=record))
    return out
