"""The logical table hash: SHA-256 over a canonical encoding of an Arrow table (DESIGN §4).

Parquet bytes are not canonical (writer version, compression, row groups and statistics all change
them), so signatures cover the *logical* table instead. The encoding is specified in
``schemas/logical_hash.md`` and pinned by the vectors in ``tests/vectors/logical_hash/``.
Performs no I/O; encodes column by column with numpy so a 5,000-row table hashes in about a
millisecond.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_calibrate.artifacts._arrow_numpy import indices_array, numeric_values, valid_mask
from dspark_calibrate.errors import InvalidValueError
from dspark_calibrate.schemas import key_columns

__all__ = [
    "LOGICAL_HASH_DOMAIN",
    "LogicalHashError",
    "canonical_order",
    "canonical_table_bytes",
    "logical_sha256",
    "logical_sha256_keys",
    "type_tag",
]

#: Domain-separation prefix; the trailing version changes if the encoding ever changes.
LOGICAL_HASH_DOMAIN = b"dspark-calibrate/logical-table\x00v1\x00"

_INT_TYPES = {
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
}  # fmt: skip
_FLOAT_TYPES = {"halffloat": "float16", "float": "float32", "double": "float64"}


class LogicalHashError(InvalidValueError):
    """The table cannot be hashed: unsupported type, NaN/Inf, null or duplicate key, bad key name."""

    default_code = "LOGICAL_HASH_INVALID"


def type_tag(typ: pa.DataType) -> str:
    """The canonical type tag of an Arrow type (string/large_string and list/large_list coincide).

    Raises:
        LogicalHashError: the type is not one the encoding supports.
    """
    name = str(typ)
    if name in _INT_TYPES:
        return name
    if name in _FLOAT_TYPES:
        return _FLOAT_TYPES[name]
    if pa.types.is_boolean(typ):
        return "bool"
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return "string"
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return f"list<{type_tag(typ.value_type)}>"
    raise LogicalHashError(f"column type {typ} is not supported by the logical hash")


def _u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def _text(s: str) -> bytes:
    raw = s.encode("utf-8")
    return _u64(len(raw)) + raw


_ONES = np.ones(0, dtype=np.uint8)


def _validity(n: int, valid: np.ndarray | None) -> memoryview:
    """One byte per slot: 0x01 where it holds a value, 0x00 where null (``valid`` None: no null)."""
    global _ONES
    if valid is not None:
        return valid.view(np.uint8).data
    # One shared read-only buffer of 0x01 bytes, grown on demand. Work on a local reference:
    # another thread may swap the global meanwhile, and the slice must come from a buffer known
    # to hold n bytes.
    ones = _ONES
    if ones.size < n:
        ones = np.ones(max(n, 2 * ones.size), dtype=np.uint8)
        ones.flags.writeable = False
        _ONES = ones
    return ones.data[:n]


def _check_finite_f8(values: np.ndarray, path: str) -> np.ndarray:
    """``values`` (contiguous little-endian binary64) with −0.0 folded; NaN/±Inf raise."""
    finite = np.isfinite(values)
    if not finite.all():
        bad = int(np.flatnonzero(~finite)[0])
        raise LogicalHashError(
            f"column {path}: row {bad} holds {values[bad]!r}; NaN and Infinity are not allowed"
        )
    # Only a column holding a sign bit can hold −0.0; most columns (times, clocks) hold none.
    if np.signbit(values).any():
        negative_zero = (values == 0.0) & np.signbit(values)
        if negative_zero.any():
            values = values.copy()  # never write into Arrow's buffer
            values[negative_zero] = 0.0  # fold -0.0 into +0.0
    return values


def _bool_values(arr: pa.Array) -> np.ndarray:
    """One byte per value (0x01 true, 0x00 false) from Arrow's bit-packed, LSB-first buffer."""
    n = len(arr)
    if n == 0:
        return np.zeros(0, dtype=np.uint8)
    bits = np.frombuffer(arr.buffers()[1], dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little")[arr.offset : arr.offset + n]


def _offsets(arr: pa.Array) -> np.ndarray:
    """The n + 1 int32 offsets of a string or list array (of its own slice)."""
    n = len(arr)
    if n == 0:
        return np.zeros(1, dtype="<i4")
    return np.frombuffer(arr.buffers()[1], dtype="<i4")[arr.offset : arr.offset + n + 1]


def _string_bytes(arr: pa.Array, offsets: np.ndarray, valid: np.ndarray | None) -> Iterator[memoryview]:
    """The UTF-8 bytes of the values, in row order (a null slot contributes none)."""
    data = arr.buffers()[2]
    if len(arr) == 0 or data is None:
        return
    view = memoryview(data)
    if valid is None or not np.diff(offsets)[~valid].any():
        yield view[int(offsets[0]) : int(offsets[-1])]
        return
    for i in np.flatnonzero(valid):  # Arrow lets a null slot point at bytes: skip them
        yield view[int(offsets[i]) : int(offsets[i + 1])]


def _encode(arr: pa.Array, path: str, tag: str) -> Iterator[bytes | memoryview]:
    """Yield the canonical bytes of one column (or list child) in row order.

    Chunks are buffers (memoryviews of numpy or Arrow memory) fed straight to the hash, so a
    column that is already int64 or non-negative-zero float64 is hashed without a copy. Values
    are read from the Arrow buffers (``_arrow_numpy``), not with pyarrow's conversions, which
    import pandas.
    """
    n = len(arr)
    if n and arr.null_count == n and not tag.startswith("list<"):
        # Every slot null (a cost table's optional columns, when no row has them): validity all
        # 0x00 and each slot its zero value, which is all zero bytes in every encoding: 8 per int
        # (0), float (+0.0) and string (length 0, no text), 1 per bool.
        yield bytes(n)
        yield bytes(n if tag == "bool" else 8 * n)
        return
    typ = arr.type
    if pa.types.is_large_string(typ):
        arr = arr.cast(pa.string())
    elif pa.types.is_large_list(typ):
        arr = arr.cast(pa.list_(typ.value_type))
    # Null slots encode as the zero value (0, +0.0, false, empty); the validity bytes keep them
    # distinct. What a null slot's own bytes in the data buffer hold is never read.
    valid = valid_mask(arr) if arr.null_count else None
    yield _validity(n, valid)
    if tag in _INT_TYPES:
        values = numeric_values(arr)
        if valid is not None:
            values = np.where(valid, values, 0)
        if tag == "uint64" and values.size and int(values.max()) > np.iinfo(np.int64).max:
            raise LogicalHashError(f"column {path}: uint64 value exceeds the int64 range")
        yield np.ascontiguousarray(values.astype("<i8", copy=False)).data
    elif tag.startswith("float"):
        values = numeric_values(arr)
        if valid is not None:
            values = np.where(valid, values, 0.0)
        yield _check_finite_f8(np.ascontiguousarray(values.astype("<f8", copy=False)), path).data
    elif tag == "bool":
        bools = _bool_values(arr)
        yield (bools if valid is None else bools & valid).data
    elif tag == "string":
        offsets = _offsets(arr)
        lengths = np.diff(offsets)
        yield (lengths if valid is None else np.where(valid, lengths, 0)).astype("<u8").data
        yield from _string_bytes(arr, offsets, valid)
    else:  # list<...>
        lengths = np.diff(_offsets(arr))
        yield (lengths if valid is None else np.where(valid, lengths, 0)).astype("<u8").data
        child = pc.list_flatten(arr)  # leaves out what null slots point at
        yield from _encode(child, path + "[]", tag[5:-1])


def _array(column: pa.ChunkedArray) -> pa.Array:
    # Tables read from one row group have one chunk; combining it would copy for nothing.
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _key_arrays(table: pa.Table, keys: Sequence[str]) -> list[pa.Array]:
    schema = table.schema
    names = schema.names
    missing = [k for k in keys if k not in names]
    if missing:
        raise LogicalHashError(f"key column(s) {missing} not in table columns {names}")
    arrays = []
    for k in keys:
        if names.count(k) > 1:
            raise LogicalHashError(f"key column {k} appears more than once")
        i = names.index(k)
        typ = schema.field(i).type
        if pa.types.is_floating(typ) or pa.types.is_list(typ) or pa.types.is_large_list(typ):
            raise LogicalHashError(f"key column {k} must be an integer or string column")
        arr = _array(table.column(i))
        if arr.null_count:
            raise LogicalHashError(f"key column {k} holds null values")
        arrays.append(arr)
    return arrays


def _strictly_increasing(cols: Sequence[np.ndarray]) -> bool:
    """Whether each row is lexicographically strictly after the previous one (one pass, no sort)."""
    n = cols[0].size - 1
    after = np.zeros(n, dtype=bool)  # decided: row i+1 > row i
    tied = np.ones(n, dtype=bool)  # undecided: equal on every key so far
    step = np.empty(n, dtype=bool)
    for c in cols:
        hi, lo = c[1:], c[:-1]
        np.greater(hi, lo, out=step)
        step &= tied
        after |= step
        np.equal(hi, lo, out=step)
        tied &= step
        if not tied.any():  # every pair decided: later keys cannot change the answer
            break
    return bool(after.all())


def _canonical_order(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    arrays = _key_arrays(table, keys)
    if table.num_rows <= 1 or not keys:
        return table
    if all(pa.types.is_integer(a.type) for a in arrays):
        # Integer keys (every artifact kind). Our writers store rows in canonical order, so first
        # check in one vectorised pass whether each row is strictly after the previous one; only
        # otherwise sort (numpy's stable lexsort) and reorder.
        cols = [numeric_values(a) for a in arrays]
        if _strictly_increasing(cols):
            return table
        order = np.lexsort(cols[::-1])
        differs = np.zeros(table.num_rows - 1, dtype=bool)
        for c in cols:
            sc = c[order]
            differs |= sc[1:] != sc[:-1]
        ordered = table.take(indices_array(order))
    else:
        ordered = table.take(pc.sort_indices(table, sort_keys=[(k, "ascending") for k in keys]))
        differs = np.zeros(ordered.num_rows - 1, dtype=bool)
        for k in keys:
            col = ordered.column(k).combine_chunks()
            differs |= _bool_values(pc.not_equal(col.slice(1), col.slice(0, len(col) - 1))).astype(bool)
    if not differs.all():
        row = int(np.flatnonzero(~differs)[0]) + 1
        dup = {k: ordered.column(k)[row].as_py() for k in keys}
        raise LogicalHashError(f"duplicate key {dup}: rows must be unique in {list(keys)}")
    return ordered


def canonical_order(table: pa.Table, kind: str) -> pa.Table:
    """The table with its rows in canonical order (writers store it so, making verification cheaper).

    Raises:
        LogicalHashError: null, float or duplicate keys.
    """
    return _canonical_order(table, key_columns(kind))


def _chunks(table: pa.Table, keys: Sequence[str]) -> Iterator[bytes | memoryview]:
    ordered = _canonical_order(table, keys)
    schema = ordered.schema
    names = tuple(schema.names)
    tags = tuple(type_tag(t) for t in schema.types)
    yield _schema_header(names, tags)
    yield _u64(ordered.num_rows)
    arrays = [_array(column) for column in ordered.columns]
    plain = _plain_float64(arrays, tags)
    for name, tag, arr, values in zip(names, tags, arrays, plain, strict=True):
        if values is not None:
            # What _encode yields for this column: all slots valid, the stored values unchanged.
            yield _validity(len(arr), None)
            yield values
        else:
            yield from _encode(arr, name, tag)


@functools.lru_cache(maxsize=64)
def _schema_header(names: tuple[str, ...], tags: tuple[str, ...]) -> bytes:
    """The encoding's schema part: domain, column count, then each name and type tag. A pure
    function of the names and tags (each artifact kind has one schema, hashed at every
    admission), so it is memoised on exactly those strings."""
    header = [LOGICAL_HASH_DOMAIN, _u64(len(tags))]
    for name, tag in zip(names, tags, strict=True):
        header += (_text(name), _text(tag))
    return b"".join(header)


def _plain_float64(arrays: Sequence[pa.Array], tags: Sequence[str]) -> list[memoryview | None]:
    """Per column, the stored bytes of a float64 column without nulls when they are already its
    canonical encoding (every value finite, none with its sign bit set, so no −0.0 to fold), else
    None.

    One finiteness and sign check over all such columns at once instead of one per column (a
    cost table has ~20, hashed at every admission). When any value fails, every column is None
    and goes through :func:`_encode`, which reports or folds it exactly as before.
    """
    out: list[memoryview | None] = [None] * len(arrays)
    views: dict[int, np.ndarray] = {}
    for i, (arr, tag) in enumerate(zip(arrays, tags, strict=True)):
        if tag == "float64" and len(arr) and not arr.null_count and str(arr.type) == "double":
            views[i] = numeric_values(arr)
    if views:
        joined = np.concatenate(list(views.values()))
        if np.isfinite(joined).all() and not np.signbit(joined).any():
            for i, values in views.items():
                out[i] = values.data
    return out


def canonical_table_bytes(table: pa.Table, keys: Sequence[str]) -> bytes:
    """The full canonical encoding (for test vectors and debugging; hashing streams it instead)."""
    return b"".join(_chunks(table, keys))


def logical_sha256_keys(table: pa.Table, keys: Sequence[str]) -> str:
    """Logical SHA-256 of ``table`` with rows ordered by ``keys`` (which must be unique, non-null)."""
    digest = hashlib.sha256()
    for chunk in _chunks(table, keys):
        digest.update(chunk)
    return digest.hexdigest()


def logical_sha256(table: pa.Table, kind: str) -> str:
    """Logical SHA-256 of a table of a known kind (its key columns define the row order).

    Raises:
        LogicalHashError: unsupported type, NaN/Inf, null or duplicate key.
        SchemaMismatch: unknown kind.
    """
    return logical_sha256_keys(table, key_columns(kind))
