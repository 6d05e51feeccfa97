"""Signing in memory: ``sign_table`` then ``write_signed`` writes what ``sign_artifact`` writes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from dspark_calibrate.artifacts import (
    detached_envelope_path,
    read_artifact,
    sign_artifact,
    sign_table,
    write_signed,
    write_unsigned_artifact,
)
from dspark_calibrate.errors import ConfigError
from tests.factories import make_cost_table, make_fingerprint, make_provenance
from tests.signing import make_signers

NOW = datetime(2025, 1, 1, tzinfo=UTC)
EXPIRES = NOW + timedelta(days=30)


def test_in_memory_signing_writes_the_bytes_of_sign_then_write(tmp_path: Path) -> None:
    signers = list(make_signers(tmp_path))
    fp, prov, summary = make_fingerprint(), make_provenance(), {"note": "x", "values": [1, 2.5]}
    table = make_cost_table()
    old = tmp_path / "old.parquet"
    write_unsigned_artifact(old, table, kind="cost-table", fingerprint=fp, provenance=prov, summary=summary)
    sign_artifact(read_artifact(old), signers, version=3, expires_at=EXPIRES, issued_at=NOW)
    signed = sign_table(
        table,
        signers,
        kind="cost-table",
        fingerprint=fp,
        provenance=prov,
        summary=summary,
        version=3,
        expires_at=EXPIRES,
        issued_at=NOW,
    )
    new = tmp_path / "new.parquet"
    written = write_signed(signed, new)
    assert new.read_bytes() == old.read_bytes()
    assert detached_envelope_path(new).read_bytes() == detached_envelope_path(old).read_bytes()
    assert (written.version, written.kind, written.logical_sha256) == (3, "cost-table", signed.logical_sha256)


def test_sign_table_writes_nothing_and_refuses_unknown_kinds(tmp_path: Path) -> None:
    signers = list(make_signers(tmp_path))
    before = sorted(tmp_path.rglob("*"))
    args = {"fingerprint": make_fingerprint(), "provenance": make_provenance(), "summary": {}}
    sign_table(
        make_cost_table(), signers, kind="cost-table", version=1, expires_at=EXPIRES, issued_at=NOW, **args
    )
    assert sorted(tmp_path.rglob("*")) == before
    with pytest.raises(ConfigError, match="cannot be signed"):
        sign_table(
            make_cost_table(), signers, kind="trace", version=1, expires_at=EXPIRES, issued_at=NOW, **args
        )
