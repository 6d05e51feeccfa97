"""List columns' values counted from the page headers, before anything is decoded."""

from __future__ import annotations

import io
import random

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
