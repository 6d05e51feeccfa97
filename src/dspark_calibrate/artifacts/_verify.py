"""The one verification pipeline for signed artifacts (DESIGN §4, STYLE rule 4).

``verify_artifact`` runs the eight ordered checks on an artifact already loaded into memory and
returns a ``VerificationReport``; it never raises for bad evidence. ``dspark-verify``, ``build``'s
self-check, ``export`` and the runtime admission hook all call it. File reading is the caller's
edge (``read_artifact``), or ``verify_path``'s, which decodes a large table while steps 1-4 run; the
clock is passed in as ``now``; the rollback state is injected.

Ordering is a security property: nothing from the payload is parsed before the signature over its
DSSE PAE has been checked, and after that only the signed bytes are read — the untrusted footer
copy of the fingerprint/provenance is never consulted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pyarrow as pa

from dspark_calibrate.artifacts._canonical import JsonError, loads_strict
from dspark_calibrate.artifacts._content import ArtifactNotice, content_findings, content_notices
from dspark_calibrate.artifacts._envelope import (
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    EnvelopeError,
    ParsedEnvelope,
    parse_envelope,
    verify_signatures,
)
from dspark_calibrate.artifacts._logical_hash import LogicalHashError, logical_sha256
from dspark_calibrate.artifacts._mixed_geometry import MixedLive
from dspark_calibrate.artifacts._models import (
    TRTLLM_FINGERPRINT_FIELDS,
    Fingerprint,
    ModelError,
    Provenance,
    fingerprint_flag,
    is_sha256_hex,
)
from dspark_calibrate.artifacts._parquet import (
    DEFAULT_LIMITS,
    FOOTER_FIELDS,
    FOOTER_KEY,
    ArtifactReadError,
    LoadedArtifact,
    OpenedArtifact,
    ReadLimits,
    open_artifact,
)
from dspark_calibrate.artifacts._reasons import Finding, FindingsOutcome, Reason
from dspark_calibrate.artifacts._sign import parse_time, series_of
from dspark_calibrate.artifacts._state import RollbackState, SeriesIdentity, StateError, StoredRoot
from dspark_calibrate.artifacts._trust import TrustRoot, TrustRootError, check_root_rollback, load_seen_root
from dspark_calibrate.errors import ArtifactRejected
from dspark_calibrate.schemas import (
    ADMISSION_PREDICTION_KEYS,
    ARTIFACT_KINDS,
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
)

__all__ = [
    "BINDING_FIELDS",
    "CLOCK_SKEW",
    "Expectation",
    "VerificationReport",
    "VerifiedArtifact",
    "bound_fields",
    "check_binding",
    "check_envelope",
    "check_freshness",
    "check_mixed_binding",
    "check_trust_root_freshness",
    "require_valid",
    "series_identity",
    "verify_artifact",
    "verify_path",
]

#: Fingerprint fields compared against the expected/live deployment (DESIGN §5). Measurement
#: conditions (context_len, clock_policy) describe how the table was made, not what runs, so they
#: are shown but not bound.
BINDING_FIELDS: tuple[str, ...] = (
    *TRTLLM_FINGERPRINT_FIELDS,
    "model_config_sha256",
    "checkpoint_sha256",
    "attention_backend",
    "moe_backend",
    "kv_dtype",
)


def series_identity(kind: str, fingerprint: Fingerprint, signed_series: str | None = None) -> SeriesIdentity:
    """The rollback series of an artifact: its kind and the values of every binding field.

    Fields outside :data:`BINDING_FIELDS` (measurement conditions) never enter it; which binding
    fields count is the verifier's choice at check time (:func:`bound_fields`). ``signed_series``
    (the predicate's ``series``) is the key older state files used.
    """
    values = fingerprint.to_dict()
    return SeriesIdentity(kind, {name: values[name] for name in BINDING_FIELDS}, signed_series)


def bound_fields(expected: Expectation) -> tuple[str, ...]:
    """The binding fields that define a series for this verifier: all but the unbound ones."""
    return tuple(name for name in BINDING_FIELDS if name not in expected.unbound_fields)


#: Tolerated clock difference between the signing host and the verifier for issued_at.
CLOCK_SKEW = timedelta(minutes=5)

_PREDICATE_FIELDS = frozenset(
    {
        "kind",
        "schema_version",
        "series",
        "version",
        "issued_at",
        "expires_at",
        "fingerprint",
        "provenance",
        "summary",
    }
)
_STATEMENT_FIELDS = frozenset({"_type", "subject", "predicateType", "predicate"})


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the verifier expects of an artifact beyond a valid signature.

    Attributes:
        kind: required kind, or ``None`` for any signable kind.
        fingerprint: the expected (or live) deployment; ``None`` skips binding (step 7).
        unbound_fields: binding fields deliberately not compared (reported as skipped).
        allow_synthetic: accept artifacts made from synthetic measurements (demos, tests).
        max_age: refuse artifacts issued longer ago than this, if set.
        mixed: the live route facts (body buckets, execution mode) mixed artifacts are bound to in
            step 7; ``None`` skips that binding (decode kinds never read it).
    """

    kind: str | None = None
    fingerprint: Fingerprint | None = None
    unbound_fields: frozenset[str] = frozenset()
    allow_synthetic: bool = False
    max_age: timedelta | None = None
    mixed: MixedLive | None = None


@dataclass(frozen=True)
class VerifiedArtifact:
    """An artifact whose signature, hash, freshness, binding and content all passed.

    Only the signed predicate's values appear here; ``summary`` is read-only.
    """

    path: Path
    kind: str
    schema_version: int
    series: str
    version: int
    issued_at: datetime
    expires_at: datetime
    fingerprint: Fingerprint
    provenance: Provenance
    summary: Mapping[str, Any]
    table: pa.Table
    logical_sha256: str
    signer_keyids: tuple[str, ...]
    identity: SeriesIdentity
    notices: tuple[ArtifactNotice, ...] = ()


@dataclass(frozen=True)
class VerificationReport(FindingsOutcome):
    """The outcome of ``verify_artifact``: findings in pipeline order, and the artifact if valid."""

    path: Path | None
    findings: tuple[Finding, ...]
    artifact: VerifiedArtifact | None = None
    timings: tuple[tuple[str, float], ...] = ()
    skipped_fields: tuple[str, ...] = ()
    context: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when there is no finding and the artifact is available."""
        return not self.findings and self.artifact is not None

    @property
    def notices(self) -> tuple[ArtifactNotice, ...]:
        """What a consumer should know about the accepted artifact (never a rejection)."""
        return self.artifact.notices if self.artifact is not None else ()

    @property
    def message(self) -> str:
        """The first finding's message, or a one-line success summary."""
        if self.findings:
            return self.findings[0].message
        a = self.artifact
        assert a is not None
        return f"{self.path}: valid {a.kind} v{a.version} (series {a.series}), signed by {', '.join(a.signer_keyids)}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready report (for ``--json``)."""
        a = self.artifact
        return {
            "path": str(self.path) if self.path else None,
            "valid": self.ok,
            "code": self.code,
            "reason": self.reason.value,
            "message": self.message,
            "findings": [f.to_dict() for f in self.findings],
            "skipped_fields": list(self.skipped_fields),
            "timings_ms": {name: round(s * 1000, 4) for name, s in self.timings},
            "artifact": None
            if a is None
            else {
                "kind": a.kind,
                "schema_version": a.schema_version,
                "series": a.series,
                "version": a.version,
                "issued_at": a.issued_at.isoformat(),
                "expires_at": a.expires_at.isoformat(),
                "logical_sha256": a.logical_sha256,
                "signer_keyids": list(a.signer_keyids),
                "fingerprint": a.fingerprint.to_dict(),
                "rows": a.table.num_rows,
                "notices": [n.to_dict() for n in a.notices],
                # What an admission's prediction assumes (absent keys: built before they existed).
                **(
                    {"prediction": {k: a.summary.get(k) for k in ADMISSION_PREDICTION_KEYS}}
                    if a.kind == "admission"
                    else {}
                ),
            },
            **({"context": dict(self.context)} if self.context else {}),
        }


def require_valid(report: VerificationReport) -> VerifiedArtifact:
    """Return the verified artifact or raise ``ArtifactRejected`` (STYLE rule 6).

    Raises:
        ArtifactRejected: the report holds findings.
    """
    if not report.ok or report.artifact is None:
        raise ArtifactRejected(report, f"{report.code}: {report.message}")
    return report.artifact


# ---------------------------------------------------------------------------------------------
# Steps. Each returns findings (empty = pass) and, where later steps need it, a parsed value.
# ---------------------------------------------------------------------------------------------


class _Stop(Exception):
    """Internal: ends the pipeline at the current step with these findings."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = tuple(findings)
        super().__init__(findings[0].message if findings else "")


def _step1_envelope(loaded: LoadedArtifact | OpenedArtifact, limits: ReadLimits) -> ParsedEnvelope:
    where = loaded.path
    embedded, detached = loaded.envelope, loaded.detached_envelope
    if embedded is None and detached is None:
        raise _Stop(
            [
                Finding(
                    Reason.ENVELOPE_MISSING,
                    f"{where}: unsigned (no envelope in the footer, no {where.name}.dsse.json); sign it with "
                    "`dspark-calibrate sign` or `build`",
                )
            ]
        )
    try:
        env = parse_envelope(
            embedded if embedded is not None else detached or b"", max_bytes=limits.max_envelope_bytes
        )
        # The detached copy is normally the canonical JSON of the embedded one (which parsing
        # it encoded, to measure it); only a copy that differs in bytes needs parsing to tell a
        # harmless re-encoding from a conflict.
        if embedded is not None and detached is not None and detached != env.encoded:
            other = parse_envelope(detached, max_bytes=limits.max_envelope_bytes)
            if (other.payload_type, other.payload) != (env.payload_type, env.payload):
                raise _Stop(
                    [
                        Finding(
                            Reason.ENVELOPE_CONFLICT,
                            f"{where}: the embedded envelope and {where.name}.dsse.json sign different payloads; "
                            "remove the stale detached file or sign again",
                        )
                    ]
                )
    except EnvelopeError as exc:
        raise _Stop([Finding(exc.reason, f"{where}: {exc}")]) from None
    return env


def check_envelope(
    env: ParsedEnvelope, trust_root: TrustRoot, where: Path | str
) -> tuple[tuple[str, ...], dict[str, Any]]:
    """Steps (2) and (3): signatures by a threshold of trusted keys, payloadType, then parse.

    Shared by artifacts and bundle manifests. Returns the accepted keyids and the parsed statement.

    Raises:
        _Stop: with the findings of the first failing step.
    """
    # (2) signature over DSSE PAE by >= threshold unique trusted keys
    result = verify_signatures(env, trust_root.artifact_keys, trust_root.artifact_threshold)
    if result.findings:
        raise _Stop(
            [
                Finding(f.reason, f"{where}: {f.message}", f.field, f.expected, f.actual)
                for f in result.findings
            ]
        )
    # (3) payloadType, then parse *those* bytes (the signed ones) and nothing else
    if env.payload_type != PAYLOAD_TYPE:
        raise _Stop(
            [
                Finding(
                    Reason.PAYLOAD_TYPE_MISMATCH,
                    f"{where}: payloadType is {env.payload_type!r}, expected {PAYLOAD_TYPE!r}",
                    field="payloadType",
                    expected=PAYLOAD_TYPE,
                    actual=env.payload_type,
                )
            ]
        )
    try:
        statement = loads_strict(env.payload, what=f"{where}: signed payload")
    except JsonError as exc:
        raise _Stop([Finding(Reason.PAYLOAD_INVALID, str(exc))]) from None
    if not isinstance(statement, dict):
        raise _Stop([Finding(Reason.PAYLOAD_INVALID, f"{where}: signed payload is not a JSON object")])
    return result.accepted_keyids, statement


def _statement_parts(
    statement: Mapping[str, Any], where: Path | str, predicate_type: str
) -> tuple[list[Any], dict[str, Any]]:
    if set(statement) != _STATEMENT_FIELDS or statement.get("_type") != STATEMENT_TYPE:
        raise _Stop(
            [
                Finding(
                    Reason.STATEMENT_TYPE_MISMATCH,
                    f"{where}: payload is not an in-toto Statement v1 (_type {statement.get('_type')!r}, "
                    f"fields {sorted(statement)})",
                    field="_type",
                    expected=STATEMENT_TYPE,
                    actual=statement.get("_type"),
                )
            ]
        )
    if statement["predicateType"] != predicate_type:
        raise _Stop(
            [
                Finding(
                    Reason.PREDICATE_TYPE_MISMATCH,
                    f"{where}: predicateType is {statement['predicateType']!r}, expected {predicate_type!r}",
                    field="predicateType",
                    expected=predicate_type,
                    actual=statement["predicateType"],
                )
            ]
        )
    subject, predicate = statement["subject"], statement["predicate"]
    if not isinstance(subject, list) or not isinstance(predicate, dict):
        raise _Stop(
            [Finding(Reason.PREDICATE_INVALID, f"{where}: subject must be a list and predicate an object")]
        )
    return subject, predicate


def _step4_predicate(
    statement: Mapping[str, Any], expected: Expectation, where: Path
) -> tuple[str, dict[str, Any], Fingerprint, Provenance, str, datetime, datetime]:
    subject, predicate = _statement_parts(statement, where, PREDICATE_TYPE)
    kind = _step4_kind(predicate, expected, where)
    # A known schema_version rejects unknown fields: no decision may rest on fields we do not read.
    if set(predicate) != _PREDICATE_FIELDS:
        extra, missing = (
            sorted(set(predicate) - _PREDICATE_FIELDS),
            sorted(_PREDICATE_FIELDS - set(predicate)),
        )
        raise _Stop(
            [
                Finding(
                    Reason.PREDICATE_INVALID, f"{where}: predicate fields: extra {extra}, missing {missing}"
                )
            ]
        )
    digest = _step4_subject(subject, kind, where)
    try:
        fp = Fingerprint.from_dict(predicate["fingerprint"])
        prov = Provenance.from_dict(predicate["provenance"])
        version = predicate["version"]
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ModelError(f"version must be an integer >= 1, got {version!r}")
        if not isinstance(predicate["summary"], dict):
            raise ModelError("summary must be an object")
        issued = parse_time(predicate["issued_at"])
        expires = parse_time(predicate["expires_at"])
    except (ModelError, ValueError, TypeError) as exc:
        raise _Stop([Finding(Reason.PREDICATE_INVALID, f"{where}: {exc}")]) from None
    if predicate["series"] != series_of(kind, fp):
        raise _Stop(
            [
                Finding(
                    Reason.PREDICATE_INVALID,
                    f"{where}: series does not match kind + fingerprint digest",
                    "series",
                )
            ]
        )
    return kind, predicate, fp, prov, digest, issued, expires


def _step4_kind(predicate: Mapping[str, Any], expected: Expectation, where: Path) -> str:
    """The signed kind: an artifact kind, at a schema version this tool reads, the one expected."""
    kind = predicate.get("kind")
    if kind not in ARTIFACT_KINDS:
        raise _Stop([Finding(Reason.KIND_MISMATCH, f"{where}: signed kind {kind!r} is not an artifact kind")])
    sv = predicate.get("schema_version")
    supported = SUPPORTED_SCHEMA_VERSIONS[kind]
    if isinstance(sv, bool) or sv not in supported:
        raise _Stop(
            [
                Finding(
                    Reason.SCHEMA_VERSION_UNSUPPORTED,
                    f"{where}: {kind} schema_version {sv!r} is not supported (this tool reads "
                    f"{', '.join(map(str, supported))}); upgrade dspark-calibrate or rebuild the artifact",
                    field="schema_version",
                    expected=SCHEMA_VERSION[kind],
                    actual=sv,
                )
            ]
        )
    if expected.kind is not None and kind != expected.kind:
        raise _Stop(
            [
                Finding(
                    Reason.KIND_MISMATCH,
                    f"{where}: is a {kind} artifact, expected {expected.kind}",
                    field="kind",
                    expected=expected.kind,
                    actual=kind,
                )
            ]
        )
    return str(kind)


def _step4_subject(subject: Any, kind: str, where: Path) -> str:
    """The table digest the statement's one subject names."""
    if (
        len(subject) != 1
        or not isinstance(subject[0], dict)
        or set(subject[0]) != {"name", "digest"}
        or subject[0]["name"] != kind
        or not isinstance(subject[0]["digest"], dict)
        or set(subject[0]["digest"]) != {"sha256"}
        or not is_sha256_hex(subject[0]["digest"]["sha256"])
    ):
        raise _Stop(
            [
                Finding(
                    Reason.SUBJECT_INVALID,
                    f"{where}: subject must be exactly [{{name: {kind!r}, digest: {{sha256: <64 hex>}}}}]",
                )
            ]
        )
    digest: str = subject[0]["digest"]["sha256"]
    return digest


def _step5_hash(table: pa.Table, kind: str, digest: str, where: Path) -> None:
    try:
        actual = logical_sha256(table, kind)
    except LogicalHashError as exc:
        raise _Stop(
            [
                Finding(
                    Reason.LOGICAL_HASH_MISMATCH, f"{where}: table cannot be hashed ({exc}); it was altered"
                )
            ]
        ) from None
    if actual != digest:
        raise _Stop(
            [
                Finding(
                    Reason.LOGICAL_HASH_MISMATCH,
                    f"{where}: table content does not match its signature (logical sha256 {actual}, "
                    f"signed {digest}); the file was altered after signing",
                    expected=digest,
                    actual=actual,
                )
            ]
        )


def _step5_footer_consistent(
    loaded: LoadedArtifact | OpenedArtifact, predicate: Mapping[str, Any], digest: str, where: Path
) -> None:
    """The untrusted footer copy must say what the signed predicate says, and nothing more.

    Verification never *reads* the footer copy, but tools outside this pipeline (pandas users,
    dashboards) do; a footer that disagrees with the signature is tampering and is refused. So is
    a field the format does not have, or a Parquet key-value pair besides ``dspark``: the signature
    covers neither, and an edited copy must not pass as the signed file.
    """
    meta = loaded.metadata
    extra = sorted(set(meta) - FOOTER_FIELDS)
    other = sorted(k.decode("utf-8", "replace") for k in loaded.file_metadata if k != FOOTER_KEY)
    arrow = loaded.file_metadata.get(ARROW_SCHEMA_KEY)
    if other == [ARROW_SCHEMA_KEY.decode()] and arrow is not None and _arrow_schema_agrees(arrow, loaded):
        other = []
    for name, unsigned, what in (
        ("footer", extra, "'dspark' footer fields"),
        ("key_value_metadata", other, "Parquet key-value metadata keys"),
    ):
        if unsigned:
            raise _Stop(
                [
                    Finding(
                        Reason.METADATA_MISMATCH,
                        f"{where}: {what} {unsigned[:5]} are not part of the format and not signed; the file "
                        "was edited after signing: sign the artifact again, or copy it from its source",
                        field=name,
                    )
                ]
            )
    claims = {
        "kind": predicate["kind"],
        "schema_version": predicate["schema_version"],
        "logical_sha256": digest,
        "fingerprint": predicate["fingerprint"],
        "provenance": predicate["provenance"],
        "summary": predicate["summary"],
    }
    changed = sorted(k for k, v in claims.items() if meta.get(k) != v)
    if changed:
        raise _Stop(
            [
                Finding(
                    Reason.METADATA_MISMATCH,
                    f"{where}: footer metadata {changed} differs from the signed predicate; the footer was edited "
                    "after signing (the signed values are authoritative); sign the artifact again",
                    field=changed[0],
                )
            ]
        )


#: pyarrow's own copy of the Arrow schema in a Parquet footer (``pq.write_table`` adds it).
ARROW_SCHEMA_KEY = b"ARROW:schema"


def _arrow_schema_agrees(encoded: bytes, loaded: LoadedArtifact | OpenedArtifact) -> bool:
    """True when ``ARROW:schema`` (a re-encoding by pyarrow keeps one) says nothing the file does
    not: its schema metadata is exactly the footer's ``dspark`` value, and no field carries
    metadata of its own (the types it restores are covered by the logical hash)."""
    import base64

    try:
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(encoded, validate=True)))
    except (ValueError, pa.ArrowException):
        return False
    if dict(schema.metadata or {}) != {FOOTER_KEY: loaded.file_metadata.get(FOOTER_KEY)}:
        return False
    fields = list(schema)
    while fields:
        f = fields.pop()
        if f.metadata:
            return False
        fields.extend(f.type.field(i) for i in range(f.type.num_fields))
    return True


def check_freshness(
    *,
    identity: SeriesIdentity,
    bound: Sequence[str],
    version: int,
    issued_at: datetime,
    expires_at: datetime,
    now: datetime,
    max_age: timedelta | None,
    state: RollbackState | None,
    where: Path | str,
) -> list[Finding]:
    """Step (6): expiry, issue time, maximum age and rollback. Reads (does not write) the state.

    Rollback compares ``version`` with the highest accepted version of ``identity``'s series as
    defined by the ``bound`` fields (see ``_state``).
    """
    out: list[Finding] = []
    if now >= expires_at:
        out.append(
            Finding(
                Reason.EXPIRED,
                f"{where}: expired at {expires_at.isoformat()} (now {now.replace(microsecond=0).isoformat()}); "
                "re-measure or re-sign with a later --expires",
                field="expires_at",
            )
        )
    elif issued_at > now + CLOCK_SKEW:
        out.append(
            Finding(
                Reason.NOT_YET_VALID,
                f"{where}: issued in the future ({issued_at.isoformat()}); check the signing host's clock",
                field="issued_at",
            )
        )
    elif max_age is not None and now - issued_at > max_age:
        out.append(
            Finding(
                Reason.EXPIRED,
                f"{where}: issued {issued_at.isoformat()}, older than the allowed {max_age}; re-measure",
                field="issued_at",
            )
        )
    if not out and state is not None:
        try:
            finding = state.check(identity, version, bound)
        except StateError as exc:
            return [Finding(exc.reason, f"{where}: {exc}")]
        if finding is not None:
            out.append(
                Finding(
                    finding.reason,
                    f"{where}: {finding.message}",
                    finding.field,
                    finding.expected,
                    finding.actual,
                )
            )
    return out


def check_trust_root_freshness(
    root: TrustRoot,
    state: RollbackState | None,
    *,
    now: datetime,
    chain: Sequence[bytes] = (),
    record: bool = True,
    where: Path | str = "trust root",
) -> Finding | None:
    """Refuse a trust root older than the newest one this verifier accepted; remember a newer one.

    Run once per verification run, before any artifact (``dspark-verify`` and ``admit`` both do).
    Without a state there is nothing to compare with and nothing is checked. A newer root is
    accepted only through a valid rotation chain from the stored one (``chain`` holds the roots
    in between) and, with ``record``, stored at once, as a TUF client does.

    Returns:
        None when the root is acceptable, else a ``TRUST_ROOT_ROLLBACK``,
        ``TRUST_ROOT_ROTATION_INVALID``, ``TRUST_ROOT_INVALID`` or state finding.
    """
    if state is None:
        return None
    try:
        stored = state.trust_root()
        seen = _stored_root(state, stored.raw) if stored is not None and stored.raw != root.raw else None
        check_root_rollback(root, seen, chain, now)
        if record and (stored is None or stored.version < root.version):
            state.update(root=StoredRoot(root.version, root.raw))
    except TrustRootError as exc:
        return Finding(exc.reason, f"{where}: {exc}", field="trust_root")
    except StateError as exc:  # the state's own defect: its message names the state file
        return Finding(exc.reason, str(exc))
    return None


def _stored_root(state: RollbackState, raw: bytes) -> TrustRoot:
    """The newest root the state keeps, loaded; a stored root that is not a valid root is the
    state's defect (``STATE_CORRUPT`` naming the state file), not the pinned root's.

    Raises:
        StateError: ``STATE_CORRUPT``.
    """
    try:
        return load_seen_root(raw)
    except TrustRootError as exc:
        raise StateError(
            Reason.STATE_CORRUPT,
            f"{state.path}: the trust root stored in the rollback state is not a valid root ({exc}); "
            "restore the state from a backup, or delete it only if you accept that older artifacts and "
            "trust roots become admissible again",
        ) from exc


def check_binding(
    signed: Fingerprint,
    expected: Fingerprint,
    *,
    unbound: frozenset[str] = frozenset(),
    where: Path | str = "",
) -> tuple[list[Finding], tuple[str, ...]]:
    """Step (7): compare the signed fingerprint with the expected/live one, field by field.

    Returns:
        The findings (one per differing or unestablished field, in BINDING_FIELDS order) and the fields
        that were skipped because the caller unbound them.
    """
    out: list[Finding] = []
    skipped = tuple(sorted(f for f in BINDING_FIELDS if f in unbound))
    # Declaration order puts causes before derived fields (gpu_count before global sizes).
    for name in BINDING_FIELDS:
        if name in unbound:
            continue
        a, b = getattr(signed, name), getattr(expected, name)
        if a == b:
            continue
        show_a = list(a) if isinstance(a, tuple) else a
        show_b = list(b) if isinstance(b, tuple) else b
        if b is None:
            out.append(
                Finding(
                    Reason.FINGERPRINT_MISSING,
                    f"{where}: fingerprint.{name} is {show_a!r} in the artifact but the live deployment's value "
                    f"could not be established; pass it with {fingerprint_flag(name)} (docs/fingerprint.md) or unbind it "
                    f"with --unbind {name}",
                    field=name,
                    expected=show_b,
                    actual=show_a,
                )
            )
        elif a is None:
            out.append(
                Finding(
                    Reason.FINGERPRINT_MISSING,
                    f"{where}: the artifact does not bind fingerprint.{name} (live: {show_b!r}); rebuild it with this field",
                    field=name,
                    expected=show_b,
                    actual=None,
                )
            )
        else:
            out.append(
                Finding(
                    Reason.FINGERPRINT_MISMATCH,
                    f"{where}: fingerprint.{name} is {show_a!r}, expected {show_b!r}; re-run sweep/build for this deployment",
                    field=name,
                    expected=show_b,
                    actual=show_a,
                )
            )
    return out, skipped


def check_mixed_binding(
    summary: Mapping[str, Any], live: MixedLive, *, where: Path | str = ""
) -> list[Finding]:
    """Step (7) for mixed kinds: the signed route's body buckets and execution mode against the
    live deployment's (K and the world size are the fingerprint's, bound above)."""
    route = summary.get("route")
    out: list[Finding] = []
    if not isinstance(route, Mapping):
        return [
            Finding(
                Reason.PREDICATE_INVALID,
                f"{where}: a mixed artifact's summary needs its route",
                field="route",
            )
        ]
    for name, live_value in (
        ("body_buckets", list(live.body_buckets) if live.body_buckets is not None else None),
        ("execution_mode", live.execution_mode),
    ):
        signed = route.get(name)
        if live_value is None:
            out.append(
                Finding(
                    Reason.FINGERPRINT_MISSING,
                    f"{where}: route.{name} is {signed!r} in the evidence but the live value was not given; pass "
                    f"--live-{name.replace('_', '-')}",
                    field=name,
                    actual=signed,
                )
            )
        elif signed != live_value:
            out.append(
                Finding(
                    Reason.FINGERPRINT_MISMATCH,
                    f"{where}: route.{name} is {signed!r}, the live deployment runs {live_value!r}; measure this "
                    "deployment's mixed steps",
                    field=name,
                    expected=live_value,
                    actual=signed,
                )
            )
    return out


def verify_artifact(
    loaded: LoadedArtifact,
    trust_root: TrustRoot,
    *,
    now: datetime,
    expected: Expectation = Expectation(),
    state: RollbackState | None = None,
    record: bool = False,
    limits: ReadLimits = DEFAULT_LIMITS,
    clock: Callable[[], float] = time.perf_counter,
) -> VerificationReport:
    """Run the ordered checks of DESIGN §4 on a loaded artifact.

    Steps:
        (1) read the envelope (footer or detached), size limits, conflicts
        (2) signature over DSSE PAE by >= threshold unique trusted keys
        (3) payloadType, then parse *those* bytes
        (4) predicateType, schema_version, kind, exact predicate fields, subject
        (5) recompute the logical hash of the loaded table and compare; the footer copy must agree
        (6) expiry, issue time, maximum age, rollback
        (7) binding: fingerprint vs expected/live, field by field
        (8) content rules (legal cells, native cell per G, finite positive times, K, synthetic)

    Args:
        loaded: the artifact as read (untrusted).
        trust_root: the pinned, already-verified trust root.
        now: the current time (timezone-aware).
        expected: kind, fingerprint and policy expectations.
        state: rollback state; read in step 6, written only when ``record`` and all steps pass.
        record: record the accepted version in ``state``.
        limits: size limits for envelopes.
        clock: monotonic clock for step timings (injected for tests).

    Returns:
        The report; ``report.ok`` is True only when every step passed.
    """
    return _pipeline(
        loaded,
        lambda: loaded.table,
        trust_root,
        now=now,
        expected=expected,
        state=state,
        record=record,
        limits=limits,
        clock=clock,
    )


def _step6_freshness(
    identity: SeriesIdentity,
    predicate: Mapping[str, Any],
    issued: datetime,
    expires: datetime,
    now: datetime,
    expected: Expectation,
    state: RollbackState | None,
    where: Path | str,
) -> None:
    """Step 6: expiry, age and rollback of the artifact's series (DESIGN §4)."""
    fresh = check_freshness(
        identity=identity,
        bound=bound_fields(expected),
        version=predicate["version"],
        issued_at=issued,
        expires_at=expires,
        now=now,
        max_age=expected.max_age,
        state=state,
        where=where,
    )
    if fresh:
        raise _Stop(fresh)


def _step7_binding(
    kind: str, fp: Fingerprint, predicate: Mapping[str, Any], expected: Expectation, where: Path | str
) -> tuple[list[Finding], tuple[str, ...]]:
    """Step 7: the fingerprint against the expected one, then a mixed kind's route.

    Returns:
        ``(findings, fields left unbound)``; the unbound fields are reported with the findings too.
    """
    skipped: tuple[str, ...] = ()
    if expected.fingerprint is not None:
        binding, skipped = check_binding(
            fp, expected.fingerprint, unbound=expected.unbound_fields, where=where
        )
        if binding:
            return binding, skipped
    if expected.mixed is not None and kind.startswith("mixed-"):
        return check_mixed_binding(predicate["summary"], expected.mixed, where=where), skipped
    return [], skipped


def _step8_content(
    kind: str,
    table: pa.Table,
    fp: Fingerprint,
    prov: Provenance,
    predicate: Mapping[str, Any],
    expected: Expectation,
    where: Path | str,
) -> None:
    """Step 8: the kind's content rules over the verified table and its signed fields."""
    content = content_findings(
        kind,
        table,
        fp,
        prov.to_dict(),
        allow_synthetic=expected.allow_synthetic,
        where=str(where),
        schema_version=predicate["schema_version"],
        summary=predicate["summary"],
    )
    if content:
        raise _Stop(content)


def _record(state: RollbackState, identity: SeriesIdentity, version: int, where: Path) -> None:
    """Record the accepted version of the artifact's series in the rollback state."""
    try:
        state.record(identity, version)
    except StateError as exc:
        raise _Stop([Finding(exc.reason, f"{where}: {exc}")]) from None


def _pipeline(
    head: LoadedArtifact | OpenedArtifact,
    table_of: Callable[[], pa.Table],
    trust_root: TrustRoot,
    *,
    now: datetime,
    expected: Expectation,
    state: RollbackState | None,
    record: bool,
    limits: ReadLimits,
    clock: Callable[[], float],
) -> VerificationReport:
    """The one pipeline behind ``verify_artifact`` and ``verify_path``.

    Steps 1-4 need only the footer and envelopes (``head``); the table is first asked for in
    step 5, so ``verify_path`` decodes a large one while the signature is checked. A table that cannot be
    decoded is reported before any step's finding, as if it had been read first.
    """
    where = head.path
    timings: list[tuple[str, float]] = []
    t0 = clock()

    def lap(name: str) -> None:
        nonlocal t0
        t1 = clock()
        timings.append((name, t1 - t0))
        t0 = t1

    skipped: tuple[str, ...] = ()
    try:
        # (1) read the envelope (footer or detached), size limits
        env = _step1_envelope(head, limits)
        lap("envelope")
        # (2) + (3) signatures over PAE, payloadType, parse the signed bytes
        keyids, statement = check_envelope(env, trust_root, where)
        lap("signature")
        # (4) predicateType, schema_version, kind
        kind, predicate, fp, prov, digest, issued, expires = _step4_predicate(statement, expected, where)
        lap("predicate")
        # (5) recompute the logical hash of the loaded table, compare
        table = table_of()
        lap("table")  # waiting for the decode that ran during steps 1-4
        _step5_hash(table, kind, digest, where)
        _step5_footer_consistent(head, predicate, digest, where)
        lap("logical_hash")
        # (6) expiry, rollback (the series is the kind + the bound fingerprint fields, DESIGN §4)
        identity = series_identity(kind, fp, predicate["series"])
        _step6_freshness(identity, predicate, issued, expires, now, expected, state, where)
        lap("freshness")
        # (7) binding: fingerprint vs expected/live, field by field (all differing fields reported)
        binding, skipped = _step7_binding(kind, fp, predicate, expected, where)
        if binding:
            raise _Stop(binding)
        lap("binding")
        # (8) content rules
        _step8_content(kind, table, fp, prov, predicate, expected, where)
        lap("content")
        if record and state is not None:
            _record(state, identity, predicate["version"], where)
            lap("record")
    except _Stop as stop:
        findings = stop.findings
        try:
            table_of()
        except ArtifactReadError as exc:
            findings = (Finding(exc.reason, str(exc)),)
        return VerificationReport(
            path=where, findings=findings, timings=tuple(timings), skipped_fields=skipped
        )
    except ArtifactReadError as exc:  # the table did not decode (asked for in step 5)
        return VerificationReport(
            path=where, findings=(Finding(exc.reason, str(exc)),), timings=tuple(timings)
        )
    artifact = _verified_artifact(
        where, kind, predicate, fp, prov, table, digest, keyids, identity, issued=issued, expires=expires
    )
    return VerificationReport(
        path=where, findings=(), artifact=artifact, timings=tuple(timings), skipped_fields=skipped
    )


def _verified_artifact(
    where: Path,
    kind: str,
    predicate: Mapping[str, Any],
    fp: Fingerprint,
    prov: Provenance,
    table: pa.Table,
    digest: str,
    keyids: tuple[str, ...],
    identity: SeriesIdentity,
    *,
    issued: datetime,
    expires: datetime,
) -> VerifiedArtifact:
    """The artifact every step accepted, with its signed fields and the kind's notices."""
    return VerifiedArtifact(
        path=where,
        kind=kind,
        schema_version=predicate["schema_version"],
        series=predicate["series"],
        version=predicate["version"],
        issued_at=issued,
        expires_at=expires,
        fingerprint=fp,
        provenance=prov,
        summary=MappingProxyType(predicate["summary"]),
        table=table,
        logical_sha256=digest,
        signer_keyids=keyids,
        identity=identity,
        notices=content_notices(kind, predicate["schema_version"], where=str(where)),
    )


def verify_path(
    path: Path | str,
    trust_root: TrustRoot,
    *,
    now: datetime,
    expected: Expectation = Expectation(),
    state: RollbackState | None = None,
    record: bool = False,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> VerificationReport:
    """Read an artifact file (the I/O edge) and verify it; read errors become findings.

    A large table decodes on a worker thread while steps 1-4 check the envelope and signature
    (``open_artifact``); a small one, such as a bundle member, decodes inline.
    """
    try:
        opened = open_artifact(path, limits, kind=expected.kind)
    except ArtifactReadError as exc:
        return VerificationReport(path=Path(path), findings=(Finding(exc.reason, str(exc)),))
    return _pipeline(
        opened,
        opened.table,
        trust_root,
        now=now,
        expected=expected,
        state=state,
        record=record,
        limits=limits,
        clock=time.perf_counter,
    )
