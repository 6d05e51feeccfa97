"""The verification pipeline: the tamper matrix (one row per way to be wrong), re-encoding
invariance, ordering of checks when two defects coexist."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import math
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dspark_calibrate.artifacts import (
    BINDING_FIELDS,
    ArtifactReadError,
    Expectation,
    Finding,
    Reason,
    RollbackState,
    VerificationReport,
    _parquet,
    canonical_json,
    detached_envelope_path,
    read_artifact,
    require_valid,
    verify_artifact,
    verify_path,
    write_unsigned_artifact,
)
from dspark_calibrate.artifacts._parquet import encode_artifact
from dspark_calibrate.artifacts._trust import TrustRoot
from dspark_calibrate.errors import ArtifactRejected, ConfigError
from tests.factories import (
    NOW,
    calibration_rows,
    cost_rows,
    make_cost_table,
    make_fingerprint,
    make_provenance,
    make_table,
    nested,
    unchecked_digest,
)
from tests.hangs import HANG_S, fifo_watchdog
from tests.signing import envelope_of, make_root, make_signers, put_envelope, resign, sign_table


@dataclass
class Ctx:
    """One valid signed cost table plus everything a case may change."""

    tmp: Path
    path: Path
    signers: tuple[Any, ...]
    root: TrustRoot
    now: Any = NOW + timedelta(hours=1)
    expected: Expectation = field(
        default_factory=lambda: Expectation(kind="cost-table", fingerprint=make_fingerprint())
    )
    state: RollbackState | None = None


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    return make_signers(tmp_path_factory.mktemp("keys"), 3)


@pytest.fixture
def ctx(tmp_path: Path, keys: tuple[Any, ...]) -> Ctx:
    signers = keys[:1]
    path = sign_table(tmp_path / "cost-table.parquet", "cost-table", make_cost_table(), signers)
    return Ctx(tmp=tmp_path, path=path, signers=signers, root=make_root(signers))


def run(ctx: Ctx) -> Any:
    return verify_path(ctx.path, ctx.root, now=ctx.now, expected=ctx.expected, state=ctx.state)


def test_valid_artifact_verifies(ctx: Ctx) -> None:
    report = run(ctx)
    assert report.ok, report.findings
    art = require_valid(report)
    assert art.kind == "cost-table" and art.version == 1
    assert art.table.num_rows == 9
    assert [name for name, _ in report.timings][:2] == ["envelope", "signature"]


# -------------------------------------------------------------------------------------------------
# Mutations. Each takes the context, changes the artifact or the verifier's inputs, and the row
# states the exact reason the pipeline must report.
# -------------------------------------------------------------------------------------------------


def _rewrite_table(ctx: Ctx, fn: Callable[[pa.Table], pa.Table]) -> None:
    loaded = read_artifact(ctx.path)
    ctx.path.write_bytes(encode_artifact(fn(loaded.table), dict(loaded.metadata)))


def _set_cell(t: pa.Table, col: str, row: int, value: Any) -> pa.Table:
    values = t.column(col).to_pylist()
    values[row] = value
    return t.set_column(
        t.schema.get_field_index(col), t.schema.field(col), pa.array(values, t.schema.field(col).type)
    )


def _edit_footer(ctx: Ctx, fn: Callable[[dict[str, Any]], None]) -> None:
    loaded = read_artifact(ctx.path)
    meta = json.loads(json.dumps(dict(loaded.metadata)))
    fn(meta)
    ctx.path.write_bytes(encode_artifact(loaded.table, meta))


def _raw_footer(ctx: Ctx, raw: bytes) -> None:
    loaded = read_artifact(ctx.path)
    sink = io.BytesIO()
    pq.write_table(loaded.table.replace_schema_metadata({b"dspark": raw}), sink)
    ctx.path.write_bytes(sink.getvalue())


def _edit_envelope(ctx: Ctx, fn: Callable[[dict[str, Any]], None]) -> None:
    env = envelope_of(ctx.path)
    fn(env)
    put_envelope(ctx.path, env)


def _flip_sig(env: dict[str, Any]) -> None:
    sig = bytearray(base64.b64decode(env["signatures"][0]["sig"]))
    sig[5] ^= 0x01
    env["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()


def _flip_payload(env: dict[str, Any]) -> None:
    payload = base64.b64decode(env["payload"]).replace(b'"version":1', b'"version":2')
    env["payload"] = base64.b64encode(payload).decode()


def _pred(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    return lambda st: fn(st["predicate"])


def _flip_byte_at(ctx: Ctx, needle: bytes, delta: int = 1) -> None:
    data = bytearray(ctx.path.read_bytes())
    at = data.find(needle)
    assert at >= 0, needle
    data[at] ^= delta
    ctx.path.write_bytes(bytes(data))


def _flip_float_in_data_page(ctx: Ctx) -> None:
    # Re-encode uncompressed without dictionaries (logical content unchanged), then corrupt the
    # plain-encoded bytes of one step time so the data page still decodes, to a different value.
    loaded = read_artifact(ctx.path)
    ctx.path.write_bytes(encode_artifact(loaded.table, dict(loaded.metadata), compression="none"))
    value = loaded.table.column("step_time_ms")[3].as_py()
    # A dictionary-free re-encode is needed so the value is stored plainly.
    sink = io.BytesIO()
    meta = {b"dspark": json.dumps(dict(loaded.metadata)).encode()}
    pq.write_table(loaded.table.replace_schema_metadata(meta), sink, compression="none", use_dictionary=False)
    ctx.path.write_bytes(sink.getvalue())
    _flip_byte_at(ctx, struct.pack("<d", value)[2:], 0x10)


def _state_with(ctx: Ctx, version: int) -> None:
    state = RollbackState(ctx.tmp / "state.json")
    art = require_valid(run(ctx))
    state.record(art.identity, version)
    ctx.state = state


def _expect_fp(ctx: Ctx, **changes: Any) -> None:
    ctx.expected = dataclasses.replace(ctx.expected, fingerprint=make_fingerprint().replace(**changes))


def _other_value(name: str) -> Any:
    return {
        "gpu": "H100",
        "gpu_count": 2,
        "gpu_snapshot_sha256": "e" * 64,
        "topology": "DEP8",
        "source_head": "deadbeef",
        "source_diff_sha256": "f" * 64,
        "runtime_snapshot": "tensorrt_llm=9.9.9",
        "max_draft_len": 4,
        "rank_local_graph_batch_sizes": (8, 16, 64),
        "global_graph_batch_sizes": (8, 16, 64),
        "model_config_sha256": "9" * 64,
        "checkpoint_sha256": "8" * 64,
        "attention_backend": "flashinfer",
        "moe_backend": "cutlass",
        "kv_dtype": "fp8",
    }[name]


def _fp_case(name: str) -> Callable[[Ctx], None]:
    def apply(ctx: Ctx) -> None:
        changes: dict[str, Any] = {name: _other_value(name)}
        if name == "gpu_count":
            changes["global_graph_batch_sizes"] = (16, 32, 64)
        if name == "rank_local_graph_batch_sizes":
            changes["global_graph_batch_sizes"] = (8, 16, 64)
        if name == "global_graph_batch_sizes":
            changes["gpu_count"] = None  # only then can global sizes differ on their own
            ctx.expected = dataclasses.replace(ctx.expected, unbound_fields=frozenset({"gpu_count"}))
        _expect_fp(ctx, **changes)

    return apply


def _two_keys_root(ctx: Ctx, keys: tuple[Any, ...]) -> None:
    ctx.root = make_root(keys[:2], threshold=2)


CASES: list[tuple[str, Callable[..., None], Reason, str | None]] = [
    # --- table content edited after signing (no re-sign) ---
    (
        "cell_value",
        lambda c: _rewrite_table(c, lambda t: _set_cell(t, "step_time_ms", 0, 1.234)),
        Reason.LOGICAL_HASH_MISMATCH,
        None,
    ),
    (
        "cell_string",
        lambda c: _rewrite_table(c, lambda t: _set_cell(t, "stop_reason", 2, "cap")),
        Reason.LOGICAL_HASH_MISMATCH,
        None,
    ),
    ("row_removed", lambda c: _rewrite_table(c, lambda t: t.slice(1)), Reason.LOGICAL_HASH_MISMATCH, None),
    (
        "row_added",
        lambda c: _rewrite_table(
            c, lambda t: pa.concat_tables([t, _set_cell(t.slice(0, 1), "verifier_budget", 0, 40)])
        ),
        Reason.LOGICAL_HASH_MISMATCH,
        None,
    ),
    (
        "row_duplicated",
        lambda c: _rewrite_table(c, lambda t: pa.concat_tables([t, t.slice(0, 1)])),
        Reason.LOGICAL_HASH_MISMATCH,
        None,
    ),
    (
        "column_renamed",
        lambda c: _rewrite_table(
            c, lambda t: t.rename_columns([n if n != "p10_ms" else "p11_ms" for n in t.column_names])
        ),
        Reason.LOGICAL_HASH_MISMATCH,
        None,
    ),
    (
        "column_reordered",
        lambda c: _rewrite_table(c, lambda t: t.select([1, 0, *range(2, t.num_columns)])),
        Reason.LOGICAL_HASH_MISMATCH,
        None,
    ),
    (
        "column_retyped",
        lambda c: _rewrite_table(c, lambda t: t.set_column(7, "samples", t.column(7).cast(pa.int32()))),
        Reason.LOGICAL_HASH_MISMATCH,
        None,
    ),
    (
        "column_dropped",
        lambda c: _rewrite_table(c, lambda t: t.drop_columns(["p90_ms"])),
        Reason.LOGICAL_HASH_MISMATCH,
        None,
    ),
    (
        "nan_injected",
        lambda c: _rewrite_table(c, lambda t: _set_cell(t, "ci_high_ms", 1, float("nan"))),
        Reason.LOGICAL_HASH_MISMATCH,
        None,
    ),
    ("data_page_byte_flip", _flip_float_in_data_page, Reason.LOGICAL_HASH_MISMATCH, None),
    # --- footer metadata ---
    (
        "metadata_fingerprint_edited",
        lambda c: _edit_footer(c, lambda m: m["fingerprint"].update(gpu="H100")),
        Reason.METADATA_MISMATCH,
        "fingerprint",
    ),
    (
        "metadata_summary_edited",
        lambda c: _edit_footer(c, lambda m: m.update(summary={"gain": 0.5})),
        Reason.METADATA_MISMATCH,
        "summary",
    ),
    (
        "metadata_duplicate_keys",
        lambda c: _raw_footer(
            c, b'{"format":"dspark-calibrate/artifact","kind":"cost-table","kind":"calibration"}'
        ),
        Reason.METADATA_INVALID,
        None,
    ),
    (
        "metadata_nan",
        lambda c: _raw_footer(c, b'{"format":"dspark-calibrate/artifact","x":NaN}'),
        Reason.METADATA_INVALID,
        None,
    ),
    ("metadata_not_json", lambda c: _raw_footer(c, b"\x00\x01garbage"), Reason.METADATA_INVALID, None),
    (
        "footer_byte_flip",
        lambda c: _flip_byte_at(c, b"dspark-calibrate/artifact"),
        Reason.METADATA_INVALID,
        None,
    ),
    ("magic_byte_flip", lambda c: _flip_byte_at(c, b"PAR1"), Reason.NOT_PARQUET, None),
    ("truncated", lambda c: c.path.write_bytes(c.path.read_bytes()[:-100]), Reason.NOT_PARQUET, None),
    # --- envelope and signatures ---
    ("unsigned", lambda c: put_envelope(c.path, None), Reason.ENVELOPE_MISSING, None),
    (
        "envelope_conflict",
        lambda c: detached_envelope_path(c.path).write_bytes(_conflicting(c)),
        Reason.ENVELOPE_CONFLICT,
        None,
    ),
    (
        "envelope_too_large",
        lambda c: (put_envelope(c.path, None), detached_envelope_path(c.path).write_bytes(b" " * (2 << 20))),
        Reason.ENVELOPE_TOO_LARGE,
        None,
    ),
    (
        "envelope_not_json",
        lambda c: (put_envelope(c.path, None), detached_envelope_path(c.path).write_bytes(b"{not json")),
        Reason.ENVELOPE_INVALID,
        None,
    ),
    (
        "envelope_extra_field",
        lambda c: _edit_envelope(c, lambda e: e.update(extra=1)),
        Reason.ENVELOPE_INVALID,
        None,
    ),
    (
        "envelope_bad_base64",
        lambda c: _edit_envelope(c, lambda e: e.update(payload="!!!")),
        Reason.ENVELOPE_INVALID,
        None,
    ),
    ("signature_bytes", lambda c: _edit_envelope(c, _flip_sig), Reason.SIGNATURE_INVALID, None),
    ("envelope_payload", lambda c: _edit_envelope(c, _flip_payload), Reason.SIGNATURE_INVALID, None),
    (
        "payload_type_unsigned_change",
        lambda c: _edit_envelope(c, lambda e: e.update(payloadType="application/vnd.in-toto+json")),
        Reason.SIGNATURE_INVALID,
        None,
    ),
    (
        "signatures_removed",
        lambda c: _edit_envelope(c, lambda e: e.update(signatures=[])),
        Reason.SIGNATURE_MISSING,
        None,
    ),
    (
        "keyid_unknown",
        lambda c: _edit_envelope(c, lambda e: e["signatures"][0].update(keyid="0" * 64)),
        Reason.SIGNATURE_THRESHOLD,
        None,
    ),
    ("threshold_not_met", lambda c, k: _two_keys_root(c, k), Reason.SIGNATURE_THRESHOLD, None),
    (
        "duplicate_keyid_counted_once",
        lambda c, k: (
            _two_keys_root(c, k),
            _edit_envelope(c, lambda e: e["signatures"].append(dict(e["signatures"][0]))),
        ),
        Reason.SIGNATURE_THRESHOLD,
        None,
    ),
    (
        "wrong_trust_root",
        lambda c, k: setattr(c, "root", make_root(k[2:3])),
        Reason.SIGNATURE_THRESHOLD,
        None,
    ),
    # --- signed statement (re-signed so only this defect remains) ---
    (
        "payload_type_resigned",
        lambda c: resign(c.path, c.signers, payload_type="application/json"),
        Reason.PAYLOAD_TYPE_MISMATCH,
        "payloadType",
    ),
    ("payload_not_json", lambda c: resign(c.path, c.signers, payload=b"[1,2"), Reason.PAYLOAD_INVALID, None),
    (
        "statement_type",
        lambda c: resign(c.path, c.signers, lambda s: s.update(_type="https://in-toto.io/Statement/v0.1")),
        Reason.STATEMENT_TYPE_MISMATCH,
        "_type",
    ),
    (
        "predicate_type",
        lambda c: resign(c.path, c.signers, lambda s: s.update(predicateType="https://example.com/other")),
        Reason.PREDICATE_TYPE_MISMATCH,
        "predicateType",
    ),
    (
        "schema_version_unknown",
        lambda c: resign(c.path, c.signers, _pred(lambda p: p.update(schema_version=99))),
        Reason.SCHEMA_VERSION_UNSUPPORTED,
        "schema_version",
    ),
    (
        "kind_unknown",
        lambda c: resign(c.path, c.signers, _pred(lambda p: p.update(kind="cost-tables"))),
        Reason.KIND_MISMATCH,
        None,
    ),
    (
        "predicate_extra_field",
        lambda c: resign(c.path, c.signers, _pred(lambda p: p.update(surprise=True))),
        Reason.PREDICATE_INVALID,
        None,
    ),
    (
        "predicate_bad_version",
        lambda c: resign(c.path, c.signers, _pred(lambda p: p.update(version=0))),
        Reason.PREDICATE_INVALID,
        None,
    ),
    (
        "predicate_series_forged",
        lambda c: resign(c.path, c.signers, _pred(lambda p: p.update(series="cost-table:" + "0" * 64))),
        Reason.PREDICATE_INVALID,
        "series",
    ),
    (
        "subject_two_entries",
        lambda c: resign(c.path, c.signers, lambda s: s["subject"].append(s["subject"][0])),
        Reason.SUBJECT_INVALID,
        None,
    ),
    (
        "subject_digest",
        lambda c: resign(c.path, c.signers, lambda s: s["subject"][0]["digest"].update(sha256="0" * 64)),
        Reason.LOGICAL_HASH_MISMATCH,
        None,
    ),
    # --- freshness ---
    ("expired", lambda c: setattr(c, "now", NOW + timedelta(days=31)), Reason.EXPIRED, "expires_at"),
    (
        "expires_resigned",
        lambda c: resign(c.path, c.signers, _pred(lambda p: p.update(expires_at="2026-11-30T12:30:00Z"))),
        Reason.EXPIRED,
        "expires_at",
    ),
    (
        "issued_in_future",
        lambda c: setattr(c, "now", NOW - timedelta(hours=1)),
        Reason.NOT_YET_VALID,
        "issued_at",
    ),
    (
        "too_old_for_policy",
        lambda c: setattr(c, "expected", dataclasses.replace(c.expected, max_age=timedelta(minutes=30))),
        Reason.EXPIRED,
        "issued_at",
    ),
    ("rollback", lambda c: _state_with(c, 2), Reason.ROLLBACK, None),
    # --- binding: one row per bound fingerprint field ---
    *[
        (
            f"fingerprint_{name}",
            _fp_case(name),
            Reason.FINGERPRINT_MISMATCH
            if name not in ("checkpoint_sha256", "attention_backend", "moe_backend")
            else Reason.FINGERPRINT_MISSING,
            name,
        )
        for name in BINDING_FIELDS
    ],
    ("fingerprint_live_unestablished", lambda c: _expect_fp(c, gpu=None), Reason.FINGERPRINT_MISSING, "gpu"),
    (
        "kind_expected_other",
        lambda c: setattr(c, "expected", dataclasses.replace(c.expected, kind="calibration")),
        Reason.KIND_MISMATCH,
        "kind",
    ),
    # --- content (signed, but not acceptable) ---
    (
        "synthetic_refused",
        lambda c: resign(c.path, c.signers, _pred(lambda p: p["provenance"].update(synthetic=True))),
        Reason.SYNTHETIC_REFUSED,
        "provenance.synthetic",
    ),
]


def _conflicting(c: Ctx) -> bytes:
    other = make_table("cost-table", cost_rows())
    sign_table(c.tmp / "other.parquet", "cost-table", other, c.signers, version=7)
    return detached_envelope_path(c.tmp / "other.parquet").read_bytes()


def _content_case(rows_fn: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Callable[[Ctx], None]:
    def apply(c: Ctx) -> None:
        table = make_table("cost-table", rows_fn(cost_rows()))
        from dspark_calibrate.artifacts import logical_sha256

        digest = logical_sha256(table, "cost-table")
        resign(c.path, c.signers, lambda s: s["subject"][0]["digest"].update(sha256=digest), table=table)

    return apply


CASES += [
    (
        "native_cell_missing",
        _content_case(
            lambda r: [x for x in r if not (x["graph_batch_size"] == 16 and x["verifier_budget"] == 0)]
        ),
        Reason.NATIVE_CELL_MISSING,
        "verifier_budget",
    ),
    (
        "illegal_compact_budget",
        _content_case(lambda r: [*r[:1], {**r[1], "verifier_budget": 8}, *r[2:]]),
        Reason.CONTENT_INVALID,
        "verifier_budget",
    ),
    (
        "budget_at_full_width",
        _content_case(lambda r: [*r[:1], {**r[1], "verifier_budget": 48}, *r[2:]]),
        Reason.CONTENT_INVALID,
        "verifier_budget",
    ),
    (
        "g_outside_ladder",
        _content_case(
            lambda r: [{**x, "graph_batch_size": 64} if x["graph_batch_size"] == 32 else x for x in r]
        ),
        Reason.CONTENT_INVALID,
        "graph_batch_size",
    ),
    (
        "negative_time",
        _content_case(lambda r: [{**r[0], "step_time_ms": -1.0, "ci_low_ms": -1.1}, *r[1:]]),
        Reason.CONTENT_INVALID,
        "step_time_ms",
    ),
    (
        "ci_not_bracketing",
        _content_case(lambda r: [{**r[0], "ci_low_ms": r[0]["step_time_ms"] * 1.1}, *r[1:]]),
        Reason.CONTENT_INVALID,
        "ci_low_ms",
    ),
    # --- paired savings (cost-table schema 2): no negative or NaN bound is ever signed ---
    (
        "saving_outside_its_interval",
        _content_case(lambda r: [r[0], {**r[1], "saving": r[1]["saving_ci_high"] + 0.01}, *r[2:]]),
        Reason.CONTENT_INVALID,
        "saving",
    ),
    (
        "saving_of_one_or_more",
        _content_case(lambda r: [r[0], {**r[1], "saving": 1.0, "saving_ci_high": 1.2}, *r[2:]]),
        Reason.CONTENT_INVALID,
        "saving",
    ),
    (
        "native_with_a_saving",
        _content_case(lambda r: [{**r[0], "saving_ci_high": 0.001}, *r[1:]]),
        Reason.CONTENT_INVALID,
        "saving",
    ),
    (
        "compact_saving_bound_not_above_zero",
        _content_case(lambda r: [r[0], {**r[1], "saving_ci_low": -0.001}, *r[2:]]),
        Reason.CONTENT_INVALID,
        "saving_ci_low",
    ),
    (
        "negative_common_mode",
        _content_case(lambda r: [{**r[0], "common_mode_rel": -0.01}, *r[1:]]),
        Reason.CONTENT_INVALID,
        "common_mode_rel",
    ),
    # --- two defects: the earlier step wins ---
    (
        "two_defects_signature_and_expiry",
        lambda c: (_edit_envelope(c, _flip_sig), setattr(c, "now", NOW + timedelta(days=90))),
        Reason.SIGNATURE_INVALID,
        None,
    ),
    (
        "two_defects_hash_and_binding",
        lambda c: (_rewrite_table(c, lambda t: t.slice(1)), _expect_fp(c, gpu="H100")),
        Reason.LOGICAL_HASH_MISMATCH,
        None,
    ),
    (
        "two_defects_binding_and_synthetic",
        lambda c: (
            resign(c.path, c.signers, _pred(lambda p: p["provenance"].update(synthetic=True))),
            _expect_fp(c, topology="DEP8"),
        ),
        Reason.FINGERPRINT_MISMATCH,
        "topology",
    ),
]


# --- resource exhaustion and malformed numbers (issue: hardening) ---

HUGE = b"9" * 5000  # an integer literal beyond Python's 4,300-digit conversion limit


def _many_rows(ctx: Ctx, *, rows: int = 5000) -> None:
    """The same cells repeated past the cost-table row limit (unsigned change)."""
    _rewrite_table(ctx, lambda t: t.take(pa.array([i % t.num_rows for i in range(rows)])))


def _expanding_strings(ctx: Ctx) -> None:
    """A dictionary page of one 20 kB string used by 4,000 rows: ~80 MB once decoded."""
    loaded = read_artifact(ctx.path)
    t = loaded.table
    n = 4000
    wide = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array(["x" * 20_000]))
    rows = t.take(pa.array([i % t.num_rows for i in range(n)]))
    rows = rows.set_column(rows.schema.get_field_index("stop_reason"), "stop_reason", wide)
    ctx.path.write_bytes(encode_artifact(rows, dict(loaded.metadata)))


def _delta_encoded(ctx: Ctx, table: pa.Table) -> None:
    """``table`` written with DELTA_BYTE_ARRAY strings (prefix + suffix: long values, few bytes)."""
    loaded = read_artifact(ctx.path)
    sink = io.BytesIO()
    meta = {b"dspark": json.dumps(dict(loaded.metadata)).encode()}
    strings = [f.name for f in table.schema if pa.types.is_string(f.type)]
    pq.write_table(
        table.replace_schema_metadata(meta),
        sink,
        use_dictionary=False,
        column_encoding={name: "DELTA_BYTE_ARRAY" for name in strings},
    )
    ctx.path.write_bytes(sink.getvalue())


def _delta_expanding(ctx: Ctx) -> None:
    """4,000 rows of one 20 kB string, delta-encoded: ~80 MB once decoded, a few kB stored."""
    t = read_artifact(ctx.path).table
    rows = t.take(pa.array([i % t.num_rows for i in range(4000)]))
    wide = pa.array(["x" * 20_000] * 4000)
    _delta_encoded(ctx, rows.set_column(rows.schema.get_field_index("stop_reason"), "stop_reason", wide))


def _huge_integer_envelope(ctx: Ctx) -> None:
    env = envelope_of(ctx.path)
    put_envelope(ctx.path, None, detached=False)
    detached_envelope_path(ctx.path).write_bytes(json.dumps(env).encode()[:-1] + b',"n":' + HUGE + b"}")


def _state_file(ctx: Ctx, content: bytes | None) -> None:
    """A state file with ``content`` (None: a FIFO)."""
    path = ctx.tmp / "state.json"
    if content is None:
        os.mkfifo(path)
    else:
        path.write_bytes(content)
    ctx.state = RollbackState(path)


def _newer_under_other_conditions(ctx: Ctx, unbind: frozenset[str] = frozenset(), **changes: Any) -> None:
    """Accept and record v2 of the series made with other unbound fields; then verify v1."""
    other = sign_table(
        ctx.tmp / "newer.parquet",
        "cost-table",
        make_cost_table(),
        ctx.signers,
        version=2,
        fingerprint=make_fingerprint(**changes),
    )
    ctx.expected = dataclasses.replace(ctx.expected, unbound_fields=unbind)
    state = RollbackState(ctx.tmp / "state.json")
    newer = dataclasses.replace(ctx.expected, fingerprint=make_fingerprint(**changes))
    assert verify_path(other, ctx.root, now=ctx.now, expected=newer, state=state, record=True).ok
    ctx.state = state


CASES += [
    ("rows_above_kind_limit", _many_rows, Reason.TABLE_TOO_LARGE, None),
    ("strings_expand_past_decoded_limit", _expanding_strings, Reason.TABLE_TOO_LARGE, None),
    ("delta_strings_expand_past_decoded_limit", _delta_expanding, Reason.TABLE_TOO_LARGE, None),
    (
        "footer_integer_of_5000_digits",
        lambda c: _raw_footer(c, b'{"format":"dspark-calibrate/artifact","n":' + HUGE + b"}"),
        Reason.METADATA_INVALID,
        None,
    ),
    ("envelope_integer_of_5000_digits", _huge_integer_envelope, Reason.ENVELOPE_INVALID, None),
    (
        "payload_integer_of_5000_digits",
        lambda c: resign(c.path, c.signers, payload=b'{"n":' + HUGE + b"}"),
        Reason.PAYLOAD_INVALID,
        None,
    ),
    ("state_is_a_fifo", lambda c: _state_file(c, None), Reason.IO_ERROR, None),
    (
        "state_integer_of_5000_digits",
        lambda c: _state_file(c, b'{"schema_version":1,"series":{"s":' + HUGE + b"}}"),
        Reason.STATE_CORRUPT,
        None,
    ),
    # rollback: a newer version made under other measurement conditions (fields never bound)
    (
        "rollback_across_context_len",
        lambda c: _newer_under_other_conditions(c, context_len=4096),
        Reason.ROLLBACK,
        "version",
    ),
    (
        "rollback_across_clock_policy",
        lambda c: _newer_under_other_conditions(c, clock_policy="locked-1980mhz"),
        Reason.ROLLBACK,
        "version",
    ),
    # ... and across a field the operator unbinds
    (
        "rollback_across_unbound_gpu",
        lambda c: _newer_under_other_conditions(c, frozenset({"gpu"}), gpu="H100"),
        Reason.ROLLBACK,
        "version",
    ),
]


# --- hardening, round two: nesting, list columns, unsigned footer content ---


def _deep_state(ctx: Ctx, where: str) -> None:
    """A ~1 KB schema-2 state whose stored trust root or series binding nests 40 deep, with its
    digests made the way the state makes them (so only the depth is wrong)."""
    doc: dict[str, Any] = {"schema_version": 2, "series": {}, "legacy_series": {}, "trust_root": None}
    if where == "root":
        doc["trust_root"] = {"version": 1, "sha256": unchecked_digest(nested()), "root": nested()}
    else:
        binding = {"gpu": nested()}
        key = f"cost-table:{unchecked_digest(binding)}"
        doc["series"][key] = {"kind": "cost-table", "binding": binding, "version": 1}
    _state_file(ctx, json.dumps(doc).encode())


def _footer_with(ctx: Ctx, key: bytes, value: bytes) -> None:
    """The signed file with one more Parquet key-value pair beside ``dspark`` (unsigned)."""
    loaded = read_artifact(ctx.path)
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, loaded.table.schema, store_schema=False) as writer:
        writer.write_table(loaded.table)
        writer.add_key_value_metadata({b"dspark": canonical_json(dict(loaded.metadata)), key: value})
    ctx.path.write_bytes(sink.getvalue())


def _arrow_schema_with_more(ctx: Ctx) -> None:
    """pyarrow's ARROW:schema copy carrying schema metadata the footer does not (unsigned)."""
    loaded = read_artifact(ctx.path)
    raw = canonical_json(dict(loaded.metadata))
    sink = io.BytesIO()
    table = loaded.table.replace_schema_metadata({b"dspark": raw, b"note": b"x" * 1000})
    pq.write_table(table, sink)  # stores ARROW:schema (with both keys) and both key-value pairs
    data = sink.getvalue()
    ctx.path.write_bytes(data)


def _calibration_params_expanding(ctx: Ctx) -> None:
    """A signed calibration table whose ``params`` list is swapped (signed footer kept) for one
    row of 3 million equal doubles: under 2 kB stored, 24 MB once decoded (a 128-million-value
    one is 50 kB and gigabytes)."""
    path = sign_table(
        ctx.tmp / "calibration.parquet",
        "calibration",
        make_table("calibration", calibration_rows()),
        ctx.signers,
    )
    loaded = read_artifact(path)
    t = loaded.table
    params = pa.array([[0.5] * 3_000_000] + [[0.5]] * (t.num_rows - 1), t.schema.field("params").type)
    table = t.set_column(t.schema.get_field_index("params"), t.schema.field("params"), params)
    path.write_bytes(encode_artifact(table, dict(loaded.metadata)))
    ctx.path = path
    ctx.expected = dataclasses.replace(ctx.expected, kind="calibration")


CASES += [
    ("state_trust_root_nested_40_deep", lambda c: _deep_state(c, "root"), Reason.STATE_CORRUPT, None),
    ("state_binding_nested_40_deep", lambda c: _deep_state(c, "binding"), Reason.STATE_CORRUPT, None),
    (
        "calibration_params_expand_past_decoded_limit",
        _calibration_params_expanding,
        Reason.TABLE_TOO_LARGE,
        None,
    ),
    (
        "footer_unknown_field",
        lambda c: _edit_footer(c, lambda m: m.update(note="unsigned")),
        Reason.METADATA_MISMATCH,
        "footer",
    ),
    (
        "footer_extra_key_value_pair_100_kb",
        lambda c: _footer_with(c, b"note", b"x" * 100_000),
        Reason.METADATA_MISMATCH,
        "key_value_metadata",
    ),
    (
        "arrow_schema_with_unsigned_metadata",
        _arrow_schema_with_more,
        Reason.METADATA_MISMATCH,
        "key_value_metadata",
    ),
]


@pytest.mark.parametrize(("name", "mutate", "reason", "field_name"), CASES, ids=[c[0] for c in CASES])
def test_tamper_matrix(
    ctx: Ctx,
    keys: tuple[Any, ...],
    name: str,
    mutate: Callable[..., None],
    reason: Reason,
    field_name: str | None,
) -> None:
    if mutate.__code__.co_argcount == 2:
        mutate(ctx, keys)
    else:
        mutate(ctx)
    with fifo_watchdog(ctx.tmp):  # a read that blocks on a FIFO returns late, and wrong
        started = time.monotonic()
        report = run(ctx)
        sequential = _sequential(ctx)
        elapsed = time.monotonic() - started
    assert elapsed < HANG_S, "a read blocked"
    assert not report.ok
    assert report.reason is reason, (report.code, report.message)
    if field_name is not None:
        assert report.findings[0].field == field_name
    # verify_path decodes the table while checking the signature; reading first and then
    # verifying must reach exactly the same findings.
    assert [f.code for f in sequential.findings] == [f.code for f in report.findings]
    assert report.message  # one human line
    with pytest.raises(ArtifactRejected):
        require_valid(report)


def test_matrix_is_large_and_distinct() -> None:
    assert len(CASES) >= 30
    assert len({c[0] for c in CASES}) == len(CASES)


def test_extra_untrusted_signature_is_ignored(ctx: Ctx, keys: tuple[Any, ...]) -> None:
    # Sign again with a trusted and an untrusted key: the untrusted one neither helps nor hurts.
    resign(ctx.path, (ctx.signers[0], keys[2]))
    assert run(ctx).ok


def test_threshold_two_of_three(tmp_path: Path, keys: tuple[Any, ...]) -> None:
    path = sign_table(tmp_path / "c.parquet", "cost-table", make_cost_table(), keys[:2])
    root = make_root(keys, threshold=2)
    assert verify_path(path, root, now=NOW + timedelta(hours=1)).ok


def test_binding_reports_every_differing_field(ctx: Ctx) -> None:
    _expect_fp(ctx, gpu="H100", topology="DEP8")
    report = run(ctx)
    assert [f.code for f in report.findings] == ["FINGERPRINT_MISMATCH:gpu", "FINGERPRINT_MISMATCH:topology"]


def test_unbound_fields_are_skipped(ctx: Ctx) -> None:
    _expect_fp(ctx, gpu="H100")
    ctx.expected = dataclasses.replace(ctx.expected, unbound_fields=frozenset({"gpu"}))
    report = run(ctx)
    assert report.ok and report.skipped_fields == ("gpu",)


def test_synthetic_allowed_when_asked(ctx: Ctx) -> None:
    resign(ctx.path, ctx.signers, _pred(lambda p: p["provenance"].update(synthetic=True)))
    ctx.expected = dataclasses.replace(ctx.expected, allow_synthetic=True)
    assert run(ctx).ok


def test_detached_envelope_alone_suffices(ctx: Ctx) -> None:
    env = envelope_of(ctx.path)
    put_envelope(ctx.path, None, detached=False)
    detached_envelope_path(ctx.path).write_bytes(json.dumps(env).encode())
    assert run(ctx).ok


def test_state_records_only_after_success(ctx: Ctx) -> None:
    state = RollbackState(ctx.tmp / "state.json")
    _expect_fp(ctx, gpu="H100")
    verify_path(ctx.path, ctx.root, now=ctx.now, expected=ctx.expected, state=state, record=True)
    assert (
        not (ctx.tmp / "state.json").exists()
        or state.highest(require_valid(verify_path(ctx.path, ctx.root, now=ctx.now, state=None)).identity)
        is None
    )
    ok = verify_path(ctx.path, ctx.root, now=ctx.now, state=state, record=True)
    assert ok.ok and state.highest(ok.artifact.identity) == 1


def test_calibration_k_consistency(tmp_path: Path, keys: tuple[Any, ...]) -> None:
    rows = calibration_rows(k=4)  # fingerprint says K=5
    table = make_table("calibration", rows)
    path = sign_table(tmp_path / "cal.parquet", "calibration", table, keys[:1])
    report = verify_path(path, make_root(keys[:1]), now=NOW + timedelta(hours=1))
    assert report.reason is Reason.K_INCONSISTENT


# -------------------------------------------------------------------------------------------------
# verify_path decodes the table on a worker thread while steps 1-4 run. Same findings, same
# precedence (a table that does not decode is reported before anything else), in any process.
# -------------------------------------------------------------------------------------------------


def _sequential(ctx: Ctx) -> Any:
    """Read first, then verify: the order the pipeline's findings must not depend on."""
    try:
        loaded = read_artifact(ctx.path)
    except ArtifactReadError as exc:
        return VerificationReport(path=ctx.path, findings=(Finding(exc.reason, str(exc)),))
    return verify_artifact(loaded, ctx.root, now=ctx.now, expected=ctx.expected, state=ctx.state)


def _corrupt_column_chunk(path: Path, column: int = 2) -> None:
    """Flip one byte in the middle of a column chunk's pages: its page checksum no longer matches."""
    meta = pq.ParquetFile(path).metadata.row_group(0).column(column)
    start = meta.dictionary_page_offset or meta.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + meta.total_compressed_size // 2] ^= 0x40
    path.write_bytes(bytes(data))


UNDECODABLE_TABLE_FIRST: list[tuple[str, Callable[[Ctx], None]]] = [
    ("alone", lambda c: None),
    ("with_bad_signature", lambda c: _edit_envelope(c, _flip_sig)),
    ("with_no_envelope", lambda c: put_envelope(c.path, None)),
    ("with_wrong_expected_kind", lambda c: setattr(c, "expected", Expectation(kind="calibration"))),
    (
        "with_foreign_footer",
        lambda c: c.path.write_bytes(encode_artifact(read_artifact(c.path).table, {"format": "other/1"})),
    ),
]


@pytest.mark.parametrize("background", [True, False], ids=["worker", "inline"])
@pytest.mark.parametrize(
    ("name", "other_defect"), UNDECODABLE_TABLE_FIRST, ids=[c[0] for c in UNDECODABLE_TABLE_FIRST]
)
def test_undecodable_table_is_reported_first(
    ctx: Ctx,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    other_defect: Callable[[Ctx], None],
    background: bool,
) -> None:
    if background:  # this small table decodes on a worker too
        monkeypatch.setattr(_parquet, "_BACKGROUND_ROWS", 0)
    else:  # no worker thread can be started: the table decodes inline, same outcome
        monkeypatch.setattr(_parquet, "_decode_pool", _no_threads)
    other_defect(ctx)
    _corrupt_column_chunk(ctx.path)
    report = run(ctx)
    assert report.reason is Reason.NOT_PARQUET, (report.code, report.message)
    assert str(ctx.path) in report.message
    assert _sequential(ctx).reason is Reason.NOT_PARQUET


def _no_threads() -> Any:
    raise RuntimeError("can't start new thread")


def test_inline_decode_when_no_thread_can_start(ctx: Ctx, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_parquet, "_BACKGROUND_ROWS", 0)
    monkeypatch.setattr(_parquet, "_decode_pool", _no_threads)
    report = run(ctx)
    assert report.ok, report.message
    assert report.artifact is not None and report.artifact.table.equals(read_artifact(ctx.path).table)


def test_small_tables_decode_inline_and_large_ones_on_a_worker(
    ctx: Ctx, monkeypatch: pytest.MonkeyPatch
) -> None:
    pools: list[Any] = []
    real = _parquet._decode_pool
    monkeypatch.setattr(_parquet, "_decode_pool", lambda: pools.append(real()) or pools[-1])
    assert run(ctx).ok
    assert pools == []  # a bundle-sized table: handing it to a worker costs more than it decodes
    monkeypatch.setattr(_parquet, "_BACKGROUND_ROWS", read_artifact(ctx.path).table.num_rows)
    assert run(ctx).ok
    assert len(pools) == 1


def test_many_threads_verify_at_once(ctx: Ctx, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """More callers than decode workers: every one gets its own, correct answer."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(_parquet, "_BACKGROUND_ROWS", 0)  # these small tables use the workers too

    bad = tmp_path / "bad.parquet"
    bad.write_bytes(ctx.path.read_bytes())
    _corrupt_column_chunk(bad)
    paths = [ctx.path, bad] * 12
    with ThreadPoolExecutor(max_workers=len(paths)) as pool:
        reasons = list(
            pool.map(lambda p: verify_path(p, ctx.root, now=ctx.now, expected=ctx.expected).reason, paths)
        )
    assert reasons == [Reason.OK, Reason.NOT_PARQUET] * 12


def _verify_in_child(path: Path, root: TrustRoot, now: Any, out: Any) -> None:
    out.put(verify_path(path, root, now=now).reason.value)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_verifies(ctx: Ctx, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child forked after the parent used the decode workers (which it does not inherit)."""
    import multiprocessing

    monkeypatch.setattr(_parquet, "_BACKGROUND_ROWS", 0)  # this small table uses the workers too
    assert run(ctx).ok  # the parent's workers exist now
    mp = multiprocessing.get_context("fork")
    out = mp.Queue()
    # Under fork the arguments are inherited, not pickled.
    child = mp.Process(target=_verify_in_child, args=(ctx.path, ctx.root, ctx.now, out))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert out.get(timeout=5) == Reason.OK.value


# -------------------------------------------------------------------------------------------------
# Re-encoding invariance: the same signed table rewritten with other compressions and row groups.
# -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", "snappy", "gzip", "zstd", "brotli"])
@pytest.mark.parametrize("row_group_size", [1, 3, 64])
def test_reencoded_signed_table_still_verifies(ctx: Ctx, compression: str, row_group_size: int) -> None:
    loaded = read_artifact(ctx.path)
    shuffled = loaded.table.take(pa.array(list(reversed(range(loaded.table.num_rows)))))
    ctx.path.write_bytes(
        encode_artifact(
            shuffled, dict(loaded.metadata), compression=compression, row_group_size=row_group_size
        )
    )
    assert run(ctx).ok


def test_delta_encoded_strings_still_verify(ctx: Ctx) -> None:
    """Re-encoding invariance covers the delta string encoding too (within the size limits)."""
    _delta_encoded(ctx, read_artifact(ctx.path).table)
    assert run(ctx).ok


def test_random_byte_flips_never_change_what_is_read(ctx: Ctx) -> None:
    """Every single-bit edit is rejected unless it leaves the read content identical.

    The file holds no unread copies (no ARROW:schema, no statistics) and page checksums are
    verified, so accepted flips can only touch bytes with no meaning (page-header fields the reader
    does not use, a digit beyond float precision in the footer JSON); checked on seeded offsets.
    """
    import random

    original = require_valid(run(ctx))
    data = ctx.path.read_bytes()
    rng = random.Random(5)
    accepted = 0
    for offset in rng.sample(range(len(data)), 400):
        edited = bytearray(data)
        edited[offset] ^= 1 << rng.randrange(8)
        ctx.path.write_bytes(bytes(edited))
        report = run(ctx)
        if report.ok:
            accepted += 1
            art = report.artifact
            assert art is not None
            assert art.table.equals(original.table), offset
            assert dict(art.summary) == dict(original.summary) and art.fingerprint == original.fingerprint
    # Page-header fields the reader does not use are the rest; most flips land in content.
    assert accepted <= 400 * 0.15


def test_a_nan_saving_bound_cannot_even_be_written(tmp_path: Path) -> None:
    """The logical hash refuses NaN, so no NaN bound ever reaches a signature."""
    rows = cost_rows()
    rows[1]["saving_ci_high"] = math.nan
    with pytest.raises(ConfigError, match="saving_ci_high"):
        write_unsigned_artifact(
            tmp_path / "c.parquet",
            make_table("cost-table", rows),
            kind="cost-table",
            fingerprint=make_fingerprint(),
            provenance=make_provenance(),
        )


def test_a_pyarrow_rewrite_with_its_schema_copy_still_verifies(ctx: Ctx) -> None:
    """``pq.write_table`` keeps an ARROW:schema copy of the footer: allowed when it says exactly
    what the file says (re-encoding invariance, DESIGN §4)."""
    loaded = read_artifact(ctx.path)
    sink = io.BytesIO()
    pq.write_table(
        loaded.table.replace_schema_metadata({b"dspark": canonical_json(dict(loaded.metadata))}),
        sink,
        compression="gzip",
    )
    ctx.path.write_bytes(sink.getvalue())
    assert b"ARROW:schema" in (pq.ParquetFile(ctx.path).metadata.metadata or {})
    assert run(ctx).ok
