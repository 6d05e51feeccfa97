"""List columns' values counted from the page headers, before anything is decoded."""

from __future__ import annotations

import io
import random
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_calibrate.artifacts import _parquet_pages as pages
from dspark_calibrate.artifacts._limits import table_size
from dspark_calibrate.artifacts._parquet_pages import PageHeaderError, _pads, footer_start, list_value_counts


def _encode(table: pa.Table, **options: object) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, **options)  # type: ignore[arg-type]
    return sink.getvalue()


def _counts(data: bytes) -> dict[str, int]:
    md = pq.ParquetFile(io.BytesIO(data)).metadata
    leaves = [md.schema.column(j) for j in range(len(md.schema))]
    lists = [c.path for c in leaves if c.max_repetition_level > 0]
    return list_value_counts(data, footer_start(data), [c.path for c in leaves], lists)


def _slots(column: pa.ChunkedArray) -> int:
    """Level slots of a list column as Parquet stores them: one per value, per null list, per empty list."""
    total = 0
    for chunk in column.chunks:
        lengths = pc.list_value_length(chunk).to_pylist()
        total += sum(1 if n is None or n == 0 else n for n in lengths)
    return total


lists = st.lists(
    st.one_of(st.none(), st.lists(st.one_of(st.none(), st.floats(allow_nan=False, width=64)), max_size=30)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(
    rows=lists,
    dictionary=st.booleans(),
    version=st.sampled_from(["1.0", "2.0"]),
    compression=st.sampled_from(["none", "zstd", "snappy"]),
    row_group_size=st.integers(1, 70),
    page_rows=st.sampled_from([1, 7, 1024]),
)
def test_counts_are_the_level_slots_decoded(
    rows: list[list[float | None] | None],
    dictionary: bool,
    version: str,
    compression: str,
    row_group_size: int,
    page_rows: int,
) -> None:
    table = pa.table(
        {"id": pa.array(range(len(rows)), pa.int64()), "params": pa.array(rows, pa.list_(pa.float64()))}
    )
    data = _encode(
        table,
        use_dictionary=dictionary,
        data_page_version=version,
        compression=compression,
        row_group_size=row_group_size,
        write_batch_size=page_rows,
        data_page_size=64,
    )
    assert _counts(data) == {"params.list.element": _slots(table.column("params"))}


def test_a_million_equal_values_in_a_kilobyte_are_counted() -> None:
    table = pa.table({"params": pa.array([[0.5] * 1_000_000], pa.list_(pa.float64()))})
    data = _encode(table, compression="zstd")
    assert len(data) < 4096
    counts = _counts(data)
    assert counts == {"params.list.element": 1_000_000}
    size = table_size(pq.ParquetFile(io.BytesIO(data)).metadata, counts)
    assert size.list_bytes == {"params.list.element": 8_000_000} and size.decoded_bytes >= 8_000_000


def test_no_list_columns_reads_nothing() -> None:
    data = _encode(pa.table({"a": [1, 2, 3]}))
    assert _counts(data) == {}


def test_byte_flips_are_read_errors_or_counts_never_crashes() -> None:
    table = pa.table({"params": pa.array([[1.0, 2.0], None, [], [3.0]] * 50, pa.list_(pa.float64()))})
    seed = _encode(table, data_page_size=64, write_batch_size=8)
    rng = random.Random(11)
    for _ in range(2000):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            md = pq.ParquetFile(io.BytesIO(bytes(data))).metadata
            leaves = [md.schema.column(j) for j in range(len(md.schema))]
        except Exception:  # the footer itself is broken: pyarrow refuses it first
            continue
        lists_ = [c.path for c in leaves if c.max_repetition_level > 0]
        try:
            counts = list_value_counts(
                bytes(data), footer_start(bytes(data)), [c.path for c in leaves], lists_
            )
        except PageHeaderError:
            continue
        assert all(isinstance(v, int) and v >= 0 for v in counts.values())


@pytest.mark.parametrize(
    ("created_by", "pads"),
    [
        ("parquet-cpp-arrow version 26.0.1", False),
        ("parquet-mr version 1.12.3 (build abc)", False),
        ("parquet-mr version 1.2.9", False),
        ("parquet-mr version 1.2.8", True),
        ("parquet-mr", True),
        ("PARQUET-MR version 1.0.0", True),
        ("", False),
    ],
)
def test_old_parquet_mr_ranges_are_padded_as_arrow_pads_them(created_by: str, pads: bool) -> None:
    assert _pads(created_by.encode()) is pads


# -- the fast skipper against the plain reader it replaced ----------------------------------------


class _PlainReader:
    """The Thrift compact reader as first written (one method call per value): the reference the
    fast :func:`_skip` and :meth:`_Reader.struct` must agree with, value for value and error for
    error."""

    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self.data, self.pos, self.end = data, pos, end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise PageHeaderError("truncated")
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if not b & 0x80:
                return result
            shift += 7
            if shift > 63:
                raise PageHeaderError("long varint")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise PageHeaderError("past end")
        self.pos += n

    def value(self, kind: int, depth: int = 0) -> Any:
        if depth > pages._MAX_NESTING:
            raise PageHeaderError("deep")
        if kind in (1, 2):
            return kind == 1
        if kind in (3, 7):
            self.skip_bytes(1 if kind == 3 else 8)
            return None
        if kind in (4, 5, 6):
            return self.zigzag()
        if kind == 8:
            n = self.varint()
            start = self.pos
            self.skip_bytes(n)
            return self.data[start : self.pos]
        if kind in (9, 10):
            header = self.byte()
            size = header >> 4
            if size == 15:
                size = self.varint()
            if size > pages._MAX_ELEMENTS:
                raise PageHeaderError("big list")
            for _ in range(size):
                if header & 0x0F in (1, 2):
                    self.skip_bytes(1)
                else:
                    self.value(header & 0x0F, depth + 1)
            return None
        if kind == 11:
            size = self.varint()
            if size > pages._MAX_ELEMENTS:
                raise PageHeaderError("big map")
            if size:
                types = self.byte()
                for _ in range(size):
                    self.value(types >> 4, depth + 1)
                    self.value(types & 0x0F, depth + 1)
            return None
        if kind == 12:
            self.struct({}, depth + 1)
            return None
        raise PageHeaderError("unknown type")

    def struct(self, wanted: Any, depth: int = 0) -> dict[int, Any]:
        out: dict[int, Any] = {}
        last = 0
        while True:
            header = self.byte()
            kind = header & 0x0F
            if kind == 0:
                return out
            last = last + (header >> 4) if header >> 4 else self.zigzag()
            spec = wanted.get(last, pages._SKIP)
            if spec is pages._SKIP:
                self.value(kind, depth)
            else:
                out[last] = self.typed(kind, spec, depth)

    def typed(self, kind: int, spec: Any, depth: int) -> Any:
        if isinstance(spec, tuple):
            if kind != 9:
                raise PageHeaderError("not a list")
            header = self.byte()
            size = header >> 4
            if size == 15:
                size = self.varint()
            if size > pages._MAX_ELEMENTS:
                raise PageHeaderError("big list")
            return [self.typed(header & 0x0F, spec[1], depth + 1) for _ in range(size)]
        if isinstance(spec, dict):
            if kind != 12:
                raise PageHeaderError("not a struct")
            return self.struct(spec, depth + 1)
        if (spec is pages._INT and kind not in (4, 5, 6)) or (spec is pages._BIN and kind != 8):
            raise PageHeaderError("wrong type")
        return self.value(kind, depth)


def _both(data: bytes, start: int, spec: Any) -> tuple[Any, Any]:
    out = []
    for reader in (pages._Reader(data, start, len(data) - 8), _PlainReader(data, start, len(data) - 8)):
        try:
            out.append((reader.struct(spec), reader.pos))
        except PageHeaderError:
            out.append("error")
    return out[0], out[1]


def _footers() -> list[bytes]:
    from tests.factories import make_cost_table

    nested = pa.table(
        {
            "params": pa.array([[1.0, 2.0], None, [], [3.0]] * 50, pa.list_(pa.float64())),
            "s": pa.array(["a", None, "bc", ""] * 50),
            "b": pa.array([True, False, None, True] * 50),
        }
    )
    return [
        _encode(nested, data_page_size=64, write_batch_size=8),
        _encode(nested, compression="zstd", use_dictionary=False, write_statistics=True),
        _encode(make_cost_table(), compression="none", use_dictionary=False, store_schema=False),
    ]


@pytest.mark.parametrize("which", [0, 1, 2])
def test_fast_reader_agrees_with_the_plain_reader_on_footers_and_byte_flips(which: int) -> None:
    """Every footer, and 600 copies with 1-4 bytes changed, read the same (values, end position,
    or a PageHeaderError) by the fast reader and by the plain one it replaced."""
    seed = _footers()[which]
    start = footer_start(seed)
    assert _both(seed, start, pages._FILE_META)[0] != "error"
    rng = random.Random(which)
    errors = 0
    for _ in range(600):
        data = bytearray(seed)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(start, len(data) - 8)] = rng.randrange(256)
        fast, plain = _both(bytes(data), start, pages._FILE_META)
        assert fast == plain
        errors += fast == "error"
    assert 0 < errors < 600  # both outcomes were exercised


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=64), kind=st.integers(0, 15), depth=st.sampled_from([0, 63, 64, 65])
)
def test_skip_agrees_with_the_plain_reader_on_any_bytes(data: bytes, kind: int, depth: int) -> None:
    plain = _PlainReader(data, 0, len(data))
    try:
        plain.value(kind, depth)
        expected: Any = plain.pos
    except PageHeaderError:
        expected = "error"
    try:
        got: Any = pages._skip(data, 0, len(data), kind, depth)
    except PageHeaderError:
        got = "error"
    assert got == expected


@pytest.mark.parametrize(
    ("name", "data", "kind"),
    [
        ("long_varint", bytes([0x80] * 10 + [0x01]), 6),
        ("truncated_varint", bytes([0x80, 0x80]), 5),
        ("binary_past_end", bytes([0x05, 0x61]), 8),
        ("double_past_end", bytes(7), 7),
        ("list_too_long", bytes([0xF5, 0xFF, 0xFF, 0xFF, 0x0F]), 9),
        ("bool_list_past_end", bytes([0x31, 0x01]), 9),
        ("unknown_type", b"\x00", 13),
        ("unterminated_struct", bytes([0x15, 0x02]), 12),
        ("deep_struct", bytes([0x1C] * 70), 12),
    ],
)
def test_skip_refuses_malformed_values(name: str, data: bytes, kind: int) -> None:
    with pytest.raises(PageHeaderError):
        pages._skip(data, 0, len(data), kind, 0)
    with pytest.raises(PageHeaderError):
        _PlainReader(data, 0, len(data)).value(kind, 0)
