"""Signing fixtures shared by tests: keys, trust roots, signed artifacts, and re-signing helpers.

``resign`` rewrites an artifact's envelope (embedded and detached) after mutating its statement,
so a negative case fails at the intended step rather than at the signature check (STYLE rule 17).
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from dspark_calibrate.artifacts import (
    Fingerprint,
    Provenance,
    canonical_json,
    detached_envelope_path,
    generate_keypair,
    init_root,
    load_signer,
    public_key_of,
    read_artifact,
    sign_artifact,
)
from dspark_calibrate.artifacts._envelope import sign_envelope
from dspark_calibrate.artifacts._parquet import encode_artifact
from dspark_calibrate.artifacts._trust import TrustRoot
from tests.factories import NOW, make_fingerprint, make_provenance, write_unsigned


@dataclass(frozen=True)
class Keyring:
    """Signers and the root that trusts them."""

    signers: tuple[Any, ...]
    root: TrustRoot


def make_signers(tmp: Path, n: int = 1, algorithm: str = "ed25519", prefix: str = "k") -> tuple[Any, ...]:
    out = []
    for i in range(n):
        pair = generate_keypair(tmp, algorithm=algorithm, name=f"{prefix}{i}")  # type: ignore[arg-type]
        out.append(load_signer(pair.private_path))
    return tuple(out)


def make_root(
    signers: Sequence[Any],
    *,
    threshold: int = 1,
    expires: datetime | None = None,
    artifact_threshold: int | None = None,
) -> TrustRoot:
    keys = [public_key_of(s) for s in signers]
    return init_root(
        root_signers=list(signers),
        root_keys=keys,
        root_threshold=threshold,
        artifact_keys=keys,
        artifact_threshold=artifact_threshold if artifact_threshold is not None else threshold,
        expires=expires or NOW + timedelta(days=365),
    )


def sign_table(
    path: Path,
    kind: str,
    table: pa.Table,
    signers: Sequence[Any],
    *,
    version: int = 1,
    fingerprint: Fingerprint | None = None,
    provenance: Provenance | None = None,
    summary: dict[str, Any] | None = None,
    issued_at: datetime = NOW,
    expires_at: datetime | None = None,
) -> Path:
    """Write an unsigned table and sign it (no schema conformance, so bad tables can be signed)."""
    write_unsigned(
        path,
        kind,
        table,
        fingerprint=fingerprint or make_fingerprint(),
        provenance=provenance or make_provenance(),
        summary=summary,
    )
    loaded = read_artifact(path)
    # sign_artifact conforms the table to its kind; bad tables are signed through resign() instead.
    sign_artifact(
        loaded,
        list(signers),
        version=version,
        issued_at=issued_at,
        expires_at=expires_at or issued_at + timedelta(days=30),
    )
    return path


def envelope_of(path: Path) -> dict[str, Any]:
    env = read_artifact(path).envelope
    assert env is not None
    return dict(env)


def statement_of(path: Path) -> dict[str, Any]:
    return json.loads(base64.b64decode(envelope_of(path)["payload"]))


def put_envelope(
    path: Path, envelope: dict[str, Any] | None, *, detached: bool = True, table: pa.Table | None = None
) -> None:
    """Replace the embedded (and detached) envelope, optionally with another table, keeping the footer."""
    loaded = read_artifact(path)
    meta = dict(loaded.metadata)
    meta["envelope"] = envelope
    path.write_bytes(encode_artifact(table if table is not None else loaded.table, meta))
    d = detached_envelope_path(path)
    if detached and envelope is not None:
        d.write_bytes(canonical_json(envelope))
    elif d.exists():
        d.unlink()


def resign(
    path: Path,
    signers: Sequence[Any],
    mutate_statement: Callable[[dict[str, Any]], None] | None = None,
    *,
    table: pa.Table | None = None,
    payload: bytes | None = None,
    payload_type: str | None = None,
    sync_footer: bool = True,
) -> None:
    """Mutate the signed statement (and/or table) and sign it again with ``signers``.

    With ``sync_footer`` the footer's untrusted copy is updated to match, so only the intended
    defect remains.
    """
    statement = statement_of(path)
    if mutate_statement is not None:
        mutate_statement(statement)
    body = payload if payload is not None else canonical_json(statement)
    kwargs = {"payload_type": payload_type} if payload_type is not None else {}
    env = sign_envelope(body, list(signers), **kwargs)
    loaded = read_artifact(path)
    meta = dict(loaded.metadata)
    meta["envelope"] = env
    pred = statement.get("predicate") if isinstance(statement, dict) else None
    if sync_footer and isinstance(pred, dict):
        for key in ("kind", "schema_version", "fingerprint", "provenance", "summary"):
            if key in pred:
                meta[key] = pred[key]
        with contextlib.suppress(KeyError, IndexError, TypeError):
            meta["logical_sha256"] = statement["subject"][0]["digest"]["sha256"]
    path.write_bytes(encode_artifact(table if table is not None else loaded.table, meta))
    detached_envelope_path(path).write_bytes(canonical_json(env))


#: File names of bundle members (as ``build`` writes them).
MEMBER_FILES: dict[str, str] = {
    "cost-table": "cost-table.parquet",
    "calibration": "calibration.parquet",
    "admission": "admission.parquet",
}


def sign_bundle(
    directory: Path,
    tables: dict[str, tuple[pa.Table, dict[str, Any] | None]],
    signers: Sequence[Any],
    *,
    version: int,
    fingerprint: Fingerprint,
    provenance: Provenance | None,
    issued_at: datetime,
    expires_at: datetime,
    manifest: bool = True,
) -> Path:
    """Sign each member table, verify it, and (optionally) write the bundle manifest over them."""
    from dspark_calibrate.artifacts import Expectation, require_valid, verify_path, write_bundle

    root = make_root(signers)
    synthetic = bool(provenance is not None and provenance.synthetic)
    verified = {}
    for kind, (table, summary) in tables.items():
        path = sign_table(
            directory / MEMBER_FILES[kind],
            kind,
            table,
            signers,
            version=version,
            fingerprint=fingerprint,
            provenance=provenance,
            summary=summary,
            issued_at=issued_at,
            expires_at=expires_at,
        )
        verified[kind] = require_valid(
            verify_path(path, root, now=issued_at, expected=Expectation(allow_synthetic=synthetic))
        )
    if manifest:
        write_bundle(
            directory, verified, list(signers), version=version, issued_at=issued_at, expires_at=expires_at
        )
    return directory
