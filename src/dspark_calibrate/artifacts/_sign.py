"""Signing: turn an unsigned table of a known kind into a signed artifact (DESIGN §4).

:func:`sign_table` signs in memory and :func:`write_signed` writes; :func:`sign_artifact` does
both for a loaded file. The predicate is built from the table's own footer (fingerprint,
provenance, summary) plus the freshness fields given here; the subject digest is the logical hash recomputed from the table, never
the footer's claim. The envelope is embedded in the footer and written as ``<file>.dsse.json``; both
writes are atomic, the detached file first so that a crash leaves at worst a conflicting pair, which
verification refuses (fail closed) until the artifact is signed again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from securesystemslib.signer import Signer

from dspark_calibrate.artifacts._atomic import atomic_write_bytes
from dspark_calibrate.artifacts._canonical import canonical_json
from dspark_calibrate.artifacts._envelope import PREDICATE_TYPE, make_statement, sign_envelope
from dspark_calibrate.artifacts._logical_hash import LogicalHashError, canonical_order, logical_sha256
from dspark_calibrate.artifacts._models import Fingerprint, ModelError, Provenance
from dspark_calibrate.artifacts._parquet import (
    LoadedArtifact,
    detached_envelope_path,
    encode_artifact,
    footer_metadata,
)
from dspark_calibrate.errors import ConfigError, InvalidValueError
from dspark_calibrate.schemas import ARTIFACT_KINDS, SCHEMA_VERSION, SchemaMismatch, conform_table

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "SignedArtifact",
    "SignedTable",
    "build_predicate",
    "format_time",
    "parse_time",
    "series_of",
    "sign_artifact",
    "sign_table",
    "write_signed",
]


def format_time(t: datetime) -> str:
    """RFC 3339 UTC with second precision and a ``Z`` suffix (the only form we sign)."""
    if t.tzinfo is None:
        raise InvalidValueError("timestamps must be timezone-aware")
    return t.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


_SIGNED_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


def parse_time(text: str) -> datetime:
    """Parse the signed timestamp form ``YYYY-MM-DDTHH:MM:SSZ``.

    Raises:
        InvalidValueError: any other form.
    """
    if not isinstance(text, str) or not _SIGNED_TIME.match(text):
        raise InvalidValueError(f"timestamp {text!r} is not of the form YYYY-MM-DDTHH:MM:SSZ")
    return datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC)


def series_of(kind: str, fingerprint: Fingerprint) -> str:
    """The freshness series of an artifact: kind + fingerprint digest (DESIGN §4)."""
    return f"{kind}:{fingerprint.digest()}"


@dataclass(frozen=True, slots=True)
class SignedArtifact:
    """What ``sign_artifact`` wrote."""

    path: Path
    detached_path: Path
    kind: str
    logical_sha256: str
    series: str
    version: int
    keyids: tuple[str, ...]


def build_predicate(
    *,
    kind: str,
    fingerprint: Fingerprint,
    provenance: Provenance,
    summary: Mapping[str, Any],
    version: int,
    issued_at: datetime,
    expires_at: datetime,
) -> dict[str, Any]:
    """The signed predicate of an artifact (``predicate.schema.json``)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError(f"--version must be an integer >= 1, got {version!r}")
    if expires_at <= issued_at:
        raise ConfigError(
            f"--expires ({format_time(expires_at)}) must be later than the issue time ({format_time(issued_at)})"
        )
    return {
        "kind": kind,
        "schema_version": SCHEMA_VERSION[kind],
        "series": series_of(kind, fingerprint),
        "version": version,
        "issued_at": format_time(issued_at),
        "expires_at": format_time(expires_at),
        "fingerprint": fingerprint.to_dict(),
        "provenance": provenance.to_dict(),
        "summary": dict(summary),
    }


def _signable(table: pa.Table, kind: str, where: Path | str) -> tuple[pa.Table, str]:
    """``(table in canonical order, logical hash)`` of what is signed.

    Raises:
        ConfigError: a table that does not match its schema or cannot be hashed.
    """
    try:
        table = canonical_order(conform_table(kind, table), kind)
        digest = logical_sha256(table, kind)
    except (SchemaMismatch, LogicalHashError) as exc:
        raise ConfigError(f"{where}: cannot sign: {exc}") from exc
    return table, digest


@dataclass(frozen=True, slots=True)
class SignedTable:
    """A table signed in memory: what :func:`write_signed` writes, nothing written yet.

    Attributes:
        kind: the artifact kind.
        table: the table in canonical order.
        metadata: the ``dspark`` footer document, envelope included.
        envelope: the DSSE envelope (also written detached).
        predicate: the signed predicate.
        logical_sha256: the subject digest.
        keyids: the signers' key ids, sorted.
    """

    kind: str
    table: pa.Table
    metadata: Mapping[str, Any]
    envelope: Mapping[str, Any]
    predicate: Mapping[str, Any]
    logical_sha256: str
    keyids: tuple[str, ...]

    def artifact_bytes(self) -> bytes:
        """The Parquet file's bytes (table and footer)."""
        return encode_artifact(self.table, self.metadata)

    def envelope_bytes(self) -> bytes:
        """The detached envelope file's bytes."""
        return canonical_json(self.envelope)


def sign_table(
    table: pa.Table,
    signers: Sequence[Signer],
    *,
    kind: str,
    fingerprint: Fingerprint,
    provenance: Provenance,
    summary: Mapping[str, Any],
    version: int,
    expires_at: datetime,
    issued_at: datetime,
    where: Path | str = "<table>",
) -> SignedTable:
    """Sign a table in memory (no I/O): conform it, hash it, build the predicate and envelope.

    Args:
        table: the rows to sign (conformed to ``kind``'s schema and put in canonical order here).
        signers: one or more signers (local keys or external KMS/HSM signers).
        kind: the artifact kind.
        fingerprint, provenance, summary: the footer's and predicate's values.
        version: the artifact's version in its series (monotonic, checked at runtime).
        expires_at: when the artifact stops being acceptable.
        issued_at: the signing time.
        where: names the table in error messages.

    Raises:
        ConfigError: unknown kind, no signers, or a table that does not match its schema or
            cannot be hashed.
    """
    if kind not in ARTIFACT_KINDS:
        raise ConfigError(
            f"{where}: kind {kind!r} cannot be signed; signable kinds: {', '.join(ARTIFACT_KINDS)}"
        )
    if not signers:
        raise ConfigError("no signing key given: pass --key (or an external signer URI)")
    table, digest = _signable(table, kind, where)
    predicate = build_predicate(
        kind=kind,
        fingerprint=fingerprint,
        provenance=provenance,
        summary=summary,
        version=version,
        issued_at=issued_at,
        expires_at=expires_at,
    )
    statement = make_statement(kind, digest, PREDICATE_TYPE, predicate)
    envelope = sign_envelope(canonical_json(statement), signers)
    metadata = footer_metadata(
        kind=kind,
        table=table,
        fingerprint=fingerprint,
        provenance=provenance,
        summary=summary,
        envelope=envelope,
    )
    return SignedTable(
        kind=kind,
        table=table,
        metadata=metadata,
        envelope=envelope,
        predicate=predicate,
        logical_sha256=digest,
        keyids=tuple(sorted({s["keyid"] for s in envelope["signatures"]})),
    )


def write_signed(signed: SignedTable, path: Path) -> SignedArtifact:
    """Write a signed table and its detached envelope, each atomically (the detached file first;
    see the module docstring)."""
    detached = detached_envelope_path(path)
    atomic_write_bytes(detached, signed.envelope_bytes())
    atomic_write_bytes(path, signed.artifact_bytes())
    return SignedArtifact(
        path=path,
        detached_path=detached,
        kind=signed.kind,
        logical_sha256=signed.logical_sha256,
        series=signed.predicate["series"],
        version=signed.predicate["version"],
        keyids=signed.keyids,
    )


def sign_artifact(
    loaded: LoadedArtifact,
    signers: Sequence[Signer],
    *,
    version: int,
    expires_at: datetime,
    issued_at: datetime,
    out: Path | None = None,
    kind: str | None = None,
    fingerprint: Fingerprint | None = None,
    provenance: Provenance | None = None,
    summary: Mapping[str, Any] | None = None,
) -> SignedArtifact:
    """Sign a loaded (unsigned or previously signed) table and write it with its envelope:
    :func:`sign_table`, then :func:`write_signed`.

    Args:
        loaded: the table and its (untrusted) footer; fields not overridden below come from it.
        signers: one or more signers (local keys or external KMS/HSM signers).
        version: the artifact's version in its series (monotonic, checked at runtime).
        expires_at: when the artifact stops being acceptable.
        issued_at: the signing time.
        out: where to write (default: in place).
        kind: override the footer's kind (e.g. ``sweep`` → ``cost-table`` is done by build, not here).
        fingerprint, provenance, summary: override the footer's values.

    Returns:
        What was written.

    Raises:
        ConfigError: unknown kind, a table that does not match its schema or cannot be hashed,
            invalid footer fields, no signers.
    """
    path = Path(out) if out is not None else loaded.path
    kind = kind or loaded.kind
    if kind not in ARTIFACT_KINDS:
        raise ConfigError(
            f"{loaded.path}: kind {kind!r} cannot be signed; signable kinds: {', '.join(ARTIFACT_KINDS)}"
        )
    if not signers:
        raise ConfigError("no signing key given: pass --key (or an external signer URI)")
    try:
        fingerprint = fingerprint or Fingerprint.from_dict(loaded.metadata.get("fingerprint") or {})
        provenance = provenance or Provenance.from_dict(loaded.metadata.get("provenance") or {})
    except ModelError as exc:
        raise ConfigError(f"{loaded.path}: cannot sign: {exc}") from exc
    if summary is None:
        raw = loaded.metadata.get("summary")
        summary = raw if isinstance(raw, Mapping) else {}
    signed = sign_table(
        loaded.table,
        signers,
        kind=kind,
        fingerprint=fingerprint,
        provenance=provenance,
        summary=summary,
        version=version,
        expires_at=expires_at,
        issued_at=issued_at,
        where=loaded.path,
    )
    return write_signed(signed, path)
