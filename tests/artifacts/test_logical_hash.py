"""Logical table hash: spec vectors, an independent row-by-row reference encoder, properties."""

from __future__ import annotations

import hashlib
import io
import json
import math
import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_calibrate.artifacts import (
    LogicalHashError,
    canonical_table_bytes,
    logical_sha256,
    logical_sha256_keys,
)
from dspark_calibrate.artifacts._logical_hash import LOGICAL_HASH_DOMAIN, type_tag

VECTORS = Path(__file__).parent.parent / "vectors" / "logical_hash"

# ------------------------------------------------------------------------------------------------
# An independent reference encoder written straight from schemas/logical_hash.md, value by value.
# ------------------------------------------------------------------------------------------------


def _ref_u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def _ref_text(s: str) -> bytes:
    b = s.encode()
    return _ref_u64(len(b)) + b


def _ref_column(values: list[Any], tag: str) -> bytes:
    out = bytes(0 if v is None else 1 for v in values)
    if tag.startswith("int") or tag.startswith("uint"):
        out += b"".join(struct.pack("<q", 0 if v is None else int(v)) for v in values)
    elif tag.startswith("float"):
        for v in values:
            x = 0.0 if v is None else float(v)
            if math.isnan(x) or math.isinf(x):
                raise ValueError("non-finite")
            out += struct.pack("<d", 0.0 if x == 0 else x)
    elif tag == "bool":
        out += bytes(1 if v else 0 for v in values)
    elif tag == "string":
        out += b"".join(_ref_u64(0 if v is None else len(v.encode())) for v in values)
        out += b"".join(v.encode() for v in values if v is not None)
    elif tag.startswith("list<"):
        child = tag[5:-1]
        out += b"".join(_ref_u64(0 if v is None else len(v)) for v in values)
        out += _ref_column([x for v in values if v is not None for x in v], child)
    else:  # pragma: no cover
        raise AssertionError(tag)
    return out


def reference_encoding(table: pa.Table, keys: list[str]) -> bytes:
    rows = table.to_pylist()
    rows.sort(key=lambda r: tuple(r[k].encode() if isinstance(r[k], str) else r[k] for k in keys))
    out = LOGICAL_HASH_DOMAIN + _ref_u64(table.num_columns)
    tags = [type_tag(f.type) for f in table.schema]
    for f, tag in zip(table.schema, tags, strict=True):
        out += _ref_text(f.name) + _ref_text(tag)
    out += _ref_u64(len(rows))
    for f, tag in zip(table.schema, tags, strict=True):
        out += _ref_column([r[f.name] for r in rows], tag)
    return out


# ------------------------------------------------------------------------------------------------
# Vectors: tables → canonical bytes → sha256, checked in and pinned.
# ------------------------------------------------------------------------------------------------

_TYPES = {
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "list<float64>": pa.list_(pa.float64()),
    "list<float32>": pa.list_(pa.float32()),
}


def _vector_cases() -> dict[str, dict[str, Any]]:
    return {
        "empty": {"keys": ["id"], "columns": [["id", "int64", []]]},
        "cost_table_small": {
            "keys": ["graph_batch_size", "verifier_budget"],
            "columns": [
                ["graph_batch_size", "int64", [16, 8, 8]],
                ["verifier_budget", "int64", [0, 24, 0]],
                ["step_time_ms", "float64", [7.25, 5.5, 6.0]],
                ["stop_reason", "string", ["precision", "cap", "precision"]],
            ],
        },
        "negative_zero_folded": {
            "keys": ["id"],
            "columns": [["id", "int64", [1, 2]], ["x", "float64", [-0.0, 0.0]]],
        },
        "nulls_and_unicode": {
            "keys": ["id"],
            "columns": [
                ["id", "string", ["b", "a", "é"]],
                ["note", "string", [None, "ünïcode ✓", ""]],
                ["v", "float64", [1.5, None, -2.25]],
                ["flag", "bool", [True, None, False]],
            ],
        },
        "lists": {
            "keys": ["position"],
            "columns": [
                ["position", "int64", [2, 1]],
                ["params", "list<float64>", [[0.5, -1.0], [1.0]]],
                ["logits", "list<float32>", [[], None]],
            ],
        },
        "int32_is_not_int64": {"keys": ["id"], "columns": [["id", "int32", [1, 2, 3]]]},
        "all_null_columns": {
            "keys": ["id"],
            "columns": [
                ["id", "int64", [2, 1]],
                *([f"none_{t}", t, [None, None]] for t in ("int32", "int64", "float32", "float64")),
                ["none_bool", "bool", [None, None]],
                ["none_string", "string", [None, None]],
                ["none_list", "list<float64>", [None, None]],
            ],
        },
    }


def _table(case: dict[str, Any]) -> pa.Table:
    return pa.table({name: pa.array(values, type=_TYPES[t]) for name, t, values in case["columns"]})


@pytest.mark.parametrize("name", sorted(_vector_cases()))
def test_vectors(name: str, update_goldens: bool) -> None:
    case = _vector_cases()[name]
    table = _table(case)
    encoded = canonical_table_bytes(table, case["keys"])
    assert encoded == reference_encoding(table, case["keys"])
    path = VECTORS / f"{name}.json"
    record = {
        "description": f"logical hash v1 vector: {name}",
        "keys": case["keys"],
        "columns": case["columns"],
        "canonical_hex": encoded.hex(),
        "sha256": hashlib.sha256(encoded).hexdigest(),
    }
    if update_goldens:
        path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    assert path.exists(), f"{path} missing; run pytest --update-goldens to create it"
    golden = json.loads(path.read_text(encoding="utf-8"))
    assert golden["canonical_hex"] == encoded.hex()
    assert golden["sha256"] == logical_sha256_keys(table, case["keys"])


def test_vector_files_are_all_checked() -> None:
    on_disk = {p.stem for p in VECTORS.glob("*.json")}
    assert on_disk == set(_vector_cases())


# ------------------------------------------------------------------------------------------------
# Invariance and sensitivity.
# ------------------------------------------------------------------------------------------------


def _rewrite(table: pa.Table, **kwargs: Any) -> pa.Table:
    buf = io.BytesIO()
    pq.write_table(table, buf, **kwargs)
    buf.seek(0)
    return pq.read_table(buf)


BASE = pa.table(
    {
        "graph_batch_size": pa.array([8, 8, 16, 16, 32], pa.int64()),
        "verifier_budget": pa.array([0, 24, 0, 48, 0], pa.int64()),
        "step_time_ms": pa.array([5.1, 4.7, 6.3, 5.2, 8.8]),
        "stop_reason": pa.array(["precision", "cap", "precision", "precision", "budget"]),
    }
)
KEYS = ["graph_batch_size", "verifier_budget"]


@pytest.mark.parametrize("compression", ["none", "snappy", "zstd", "gzip", "brotli"])
@pytest.mark.parametrize("row_group_size", [1, 2, 1000])
def test_reencoding_keeps_hash(compression: str, row_group_size: int) -> None:
    again = _rewrite(
        BASE, compression=compression, row_group_size=row_group_size, use_dictionary=row_group_size == 2
    )
    assert logical_sha256_keys(again, KEYS) == logical_sha256_keys(BASE, KEYS)


def test_row_order_on_disk_does_not_matter() -> None:
    shuffled = BASE.take(pa.array([4, 2, 0, 3, 1]))
    assert logical_sha256_keys(shuffled, KEYS) == logical_sha256_keys(BASE, KEYS)


def test_large_types_coincide() -> None:
    large = BASE.set_column(3, "stop_reason", BASE.column("stop_reason").cast(pa.large_string()))
    assert logical_sha256_keys(large, KEYS) == logical_sha256_keys(BASE, KEYS)


SENSITIVE = [
    ("value", lambda t: t.set_column(2, "step_time_ms", pa.array([5.1, 4.7, 6.3, 5.2, 8.80001]))),
    ("row_removed", lambda t: t.slice(0, 4)),
    (
        "row_added",
        lambda t: pa.concat_tables(
            [t, t.slice(0, 1).set_column(1, "verifier_budget", pa.array([16], pa.int64()))]
        ),
    ),
    (
        "column_renamed",
        lambda t: t.rename_columns(["graph_batch_size", "verifier_budget", "step_ms", "stop_reason"]),
    ),
    ("column_reordered", lambda t: t.select([0, 1, 3, 2])),
    ("column_retyped", lambda t: t.set_column(0, "graph_batch_size", t.column(0).cast(pa.int32()))),
    ("column_dropped", lambda t: t.drop_columns(["stop_reason"])),
    (
        "string_changed",
        lambda t: t.set_column(
            3, "stop_reason", pa.array(["precision", "cap", "precision", "precision", "budgeT"])
        ),
    ),
    ("null_inserted", lambda t: t.set_column(2, "step_time_ms", pa.array([5.1, None, 6.3, 5.2, 8.8]))),
]


@pytest.mark.parametrize(("name", "mutate"), SENSITIVE, ids=[s[0] for s in SENSITIVE])
def test_changes_change_hash(name: str, mutate: Any) -> None:
    assert logical_sha256_keys(mutate(BASE), KEYS) != logical_sha256_keys(BASE, KEYS)


REFUSED = [
    ("nan", pa.table({"id": [1], "x": [float("nan")]}), ["id"]),
    ("inf", pa.table({"id": [1], "x": [float("inf")]}), ["id"]),
    ("neg_inf_in_list", pa.table({"id": [1], "x": pa.array([[1.0, float("-inf")]])}), ["id"]),
    ("duplicate_key", pa.table({"id": [1, 1], "x": [1.0, 2.0]}), ["id"]),
    ("null_key", pa.table({"id": pa.array([1, None], pa.int64())}), ["id"]),
    ("float_key", pa.table({"x": [1.0, 2.0]}), ["x"]),
    ("missing_key", pa.table({"x": [1]}), ["id"]),
    (
        "key_column_twice",
        pa.Table.from_arrays([pa.array([1, 2]), pa.array([2, 1])], names=["id", "id"]),
        ["id"],
    ),
    ("list_key", pa.table({"id": pa.array([[1], [2]])}), ["id"]),
    ("unsupported_type", pa.table({"id": [1], "t": pa.array([1], pa.timestamp("s"))}), ["id"]),
    ("uint64_overflow", pa.table({"id": pa.array([2**63], pa.uint64())}), []),
]


@pytest.mark.parametrize(("name", "table", "keys"), REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_tables(name: str, table: pa.Table, keys: list[str]) -> None:
    with pytest.raises(LogicalHashError):
        logical_sha256_keys(table, keys)


def test_kind_uses_its_key_columns() -> None:
    t = pa.table({"position": pa.array([2, 1], pa.int64()), "method": ["sts", "platt"]})
    assert logical_sha256(t, "calibration") == logical_sha256_keys(t, ["position"])


# ------------------------------------------------------------------------------------------------
# Properties (hypothesis): implementation == reference; re-encoding invariant; any change detected.
# ------------------------------------------------------------------------------------------------

finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
maybe_text = st.none() | st.text(max_size=8)
rows = st.lists(
    st.tuples(finite, maybe_text, st.none() | st.lists(finite, max_size=3), st.booleans()), max_size=12
)


def _prop_table(data: list[tuple[float, str | None, list[float] | None, bool]]) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(list(range(len(data))), pa.int64()),
            "x": pa.array([r[0] for r in data], pa.float64()),
            "s": pa.array([r[1] for r in data], pa.string()),
            "l": pa.array([r[2] for r in data], pa.list_(pa.float64())),
            "b": pa.array([r[3] for r in data], pa.bool_()),
        }
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows)
def test_property_matches_reference(data: list[Any]) -> None:
    table = _prop_table(data)
    assert canonical_table_bytes(table, ["id"]) == reference_encoding(table, ["id"])


layout_rows = st.lists(
    st.tuples(st.integers(0, 3), finite, st.none() | st.booleans(), st.none() | st.text(max_size=4)),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout_rows, st.randoms(use_true_random=False), st.integers(0, 5), st.integers(1, 4))
def test_property_layout_does_not_matter(data: list[Any], rnd: Any, start: int, pieces: int) -> None:
    """Shuffled rows, a two-column key with ties, array offsets and several chunks: same bytes.

    Exercises the one-pass order check (ties on the first key, early exit), the sort fallback,
    and buffers read at a non-zero offset (bit-packed booleans and validity included).
    """
    full = [(g, i, x, b, s) for i, (g, x, b, s) in enumerate(data)]
    rnd.shuffle(full)
    expected = reference_encoding(_layout_table(full), ["g", "i"])
    for rows_ in (full, sorted(full, key=lambda r: (r[0], r[1]))):  # sort path, then one-pass path
        pad = [(9, -1 - j, 0.5, j % 2 == 0, "pad") for j in range(start)]
        table = _layout_table(pad + rows_).slice(start)  # every buffer now read at an offset
        cuts = sorted(rnd.sample(range(len(rows_) + 1), min(pieces, len(rows_) + 1)))
        chunked = pa.concat_tables(
            [table.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, len(rows_)], strict=True)]
        )
        assert canonical_table_bytes(table, ["g", "i"]) == expected
        assert canonical_table_bytes(chunked, ["g", "i"]) == expected


def _layout_table(rows_: list[tuple[int, int, float, bool | None, str | None]]) -> pa.Table:
    return pa.table(
        {
            "g": pa.array([r[0] for r in rows_], pa.int64()),
            "i": pa.array([r[1] for r in rows_], pa.int32()),
            "x": pa.array([r[2] for r in rows_], pa.float64()),
            "b": pa.array([r[3] for r in rows_], pa.bool_()),
            "s": pa.array([r[4] for r in rows_], pa.string()),
        }
    )


@settings(max_examples=60, deadline=None)
@given(rows, st.sampled_from(["zstd", "snappy", "gzip", "none"]), st.integers(1, 5))
def test_property_reencoding_invariant(data: list[Any], compression: str, rg: int) -> None:
    table = _prop_table(data)
    assert logical_sha256_keys(_rewrite(table, compression=compression, row_group_size=rg), ["id"]) == (
        logical_sha256_keys(table, ["id"])
    )


@settings(max_examples=150, deadline=None)
@given(rows.filter(bool), st.data())
def test_property_any_cell_change_detected(data: list[Any], draw: st.DataObject) -> None:
    table = _prop_table(data)
    row = draw.draw(st.integers(0, len(data) - 1))
    col = draw.draw(st.sampled_from(["x", "s", "l", "b"]))
    values = table.column(col).to_pylist()
    old = values[row]
    new = draw.draw(
        {
            "x": finite,
            "s": maybe_text,
            "l": st.none() | st.lists(finite, max_size=3),
            "b": st.booleans(),
        }[col].filter(lambda v: not _same(v, old))
    )
    values[row] = new
    changed = table.set_column(
        table.schema.get_field_index(col), col, pa.array(values, table.schema.field(col).type)
    )
    assert logical_sha256_keys(changed, ["id"]) != logical_sha256_keys(table, ["id"])


def _same(a: Any, b: Any) -> bool:
    """Equal under the encoding (−0.0 == 0.0)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == b
    return type(a) is type(b) and a == b


def test_concurrent_hashing_of_different_sizes_agrees() -> None:
    """Threads hashing tables of growing sizes share the validity buffer without corrupting it."""
    from concurrent.futures import ThreadPoolExecutor

    tables = [pa.table({"id": pa.array(range(n), pa.int64())}) for n in (10, 5_000, 200, 50_000, 1)]
    expected = [logical_sha256_keys(t, ["id"]) for t in tables]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(5):
            got = list(pool.map(lambda t: logical_sha256_keys(t, ["id"]), tables * 4))
            assert got == expected * 4


# Several float64 columns, as a cost table has: checked for NaN, ±Inf and −0.0 in one pass, and
# column by column only when that pass finds one.
many_floats = st.lists(st.tuples(finite, finite, st.none() | finite), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(many_floats, st.integers(0, 3))
def test_property_several_float_columns_match_reference(data: list[Any], start: int) -> None:
    pad = [(1.5, 2.5, None)] * start
    rows_ = pad + data
    table = pa.table(
        {
            "id": pa.array(range(len(rows_)), pa.int64()),
            "a": pa.array([r[0] for r in rows_], pa.float64()),
            "b": pa.array([r[1] for r in rows_], pa.float64()),
            "c": pa.array([r[2] for r in rows_], pa.float64()),
        }
    ).slice(start)  # read at an offset, too
    assert canonical_table_bytes(table, ["id"]) == reference_encoding(table, ["id"])


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("column", ["a", "b"])
def test_non_finite_in_one_of_several_float_columns_is_refused_by_name(bad: float, column: str) -> None:
    values = {"a": [0.5, -0.0, 2.0], "b": [1.0, 2.0, 3.0]}
    values[column][2] = bad
    table = pa.table(
        {"id": pa.array([1, 2, 3], pa.int64()), **{k: pa.array(v, pa.float64()) for k, v in values.items()}}
    )
    with pytest.raises(LogicalHashError, match=f"column {column}: row 2"):
        logical_sha256_keys(table, ["id"])
