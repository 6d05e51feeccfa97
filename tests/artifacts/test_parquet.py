"""Parquet read/write: atomic unsigned writes, footer key, bounded reads with reason codes."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dspark_calibrate.artifacts import (
    ArtifactReadError,
    ReadLimits,
    Reason,
    read_artifact,
    write_unsigned_artifact,
)
from dspark_calibrate.artifacts._limits import TableLimit, table_size
from dspark_calibrate.artifacts._parquet import encode_artifact
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.schemas import SCHEMA_VERSION
from tests.factories import make_cost_table, make_fingerprint, make_provenance


def _write(tmp_path: Path) -> Path:
    path = tmp_path / "cost.parquet"
    write_unsigned_artifact(
        path,
        make_cost_table(),
        kind="cost-table",
        fingerprint=make_fingerprint(),
        provenance=make_provenance(),
    )
    return path


def test_round_trip(tmp_path: Path) -> None:
    path = _write(tmp_path)
    loaded = read_artifact(path)
    assert loaded.kind == "cost-table"
    assert loaded.schema_version == SCHEMA_VERSION["cost-table"]
    assert loaded.table.equals(make_cost_table())
    assert loaded.envelope is None
    assert loaded.fingerprint_untrusted() == make_fingerprint()
    assert list(tmp_path.iterdir()) == [path]  # no temp files left behind


def test_readable_by_plain_pyarrow_and_pandas(tmp_path: Path) -> None:
    import pandas as pd
    import pyarrow.parquet as pq

    path = _write(tmp_path)
    assert pq.read_table(path).num_rows == 9
    assert len(pd.read_parquet(path)) == 9


def test_write_refuses_wrong_schema_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    with pytest.raises(ConfigError, match="step_time_ms"):
        write_unsigned_artifact(
            path,
            make_cost_table().drop_columns(["step_time_ms"]),
            kind="cost-table",
            fingerprint=make_fingerprint(),
            provenance=make_provenance(),
        )
    assert not path.exists()


def test_write_refuses_nan(tmp_path: Path) -> None:
    t = make_cost_table()
    t = t.set_column(2, "step_time_ms", pa.array([float("nan")] * t.num_rows))
    with pytest.raises(ConfigError, match="NaN"):
        write_unsigned_artifact(
            tmp_path / "x.parquet",
            t,
            kind="cost-table",
            fingerprint=make_fingerprint(),
            provenance=make_provenance(),
        )


def _footer_len_patched(data: bytes, n: int) -> bytes:
    return data[:-8] + struct.pack("<I", n) + b"PAR1"


def _footer_garbage(data: bytes) -> bytes:
    """Zero the start of the Thrift footer (its struct headers), wherever the table puts it."""
    (n,) = struct.unpack("<I", data[-8:-4])
    start = len(data) - 8 - n
    return data[:start] + b"\x00" * 32 + data[start + 32 :]


def _with_footer(data: bytes, footer: dict[str, object]) -> bytes:
    table = pq.read_table(io.BytesIO(data))
    return encode_artifact(table, footer)


def _flip_in_column(data: bytes, column: int = 2) -> bytes:
    meta = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(column)
    at = (meta.dictionary_page_offset or meta.data_page_offset) + meta.total_compressed_size // 2
    return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :]


CASES = [
    ("missing_file", None, Reason.IO_ERROR),
    ("empty_file", lambda d: b"", Reason.NOT_PARQUET),
    ("not_parquet", lambda d: b"hello world, not parquet at all", Reason.NOT_PARQUET),
    ("truncated_tail", lambda d: d[: len(d) // 2], Reason.NOT_PARQUET),
    ("truncated_head", lambda d: d[len(d) // 2 :], Reason.NOT_PARQUET),
    ("footer_len_huge", lambda d: _footer_len_patched(d, 1 << 30), Reason.FOOTER_TOO_LARGE),
    ("footer_len_past_file", lambda d: _footer_len_patched(d, len(d)), Reason.NOT_PARQUET),
    ("footer_garbage", _footer_garbage, Reason.NOT_PARQUET),
    ("page_checksum", _flip_in_column, Reason.NOT_PARQUET),
    ("foreign_footer", lambda d: _with_footer(d, {"format": "other/1"}), Reason.METADATA_INVALID),
    ("footer_without_format", lambda d: _with_footer(d, {"list": [1]}), Reason.METADATA_INVALID),
    (
        "envelope_not_object",
        lambda d: _with_footer(d, {"format": "dspark-calibrate/artifact", "envelope": "sig"}),
        Reason.METADATA_INVALID,
    ),
    (
        "page_checksum_and_foreign_footer",
        lambda d: _flip_in_column(_with_footer(d, {"format": "x"})),
        Reason.NOT_PARQUET,
    ),
]


@pytest.mark.parametrize(("name", "mutate", "reason"), CASES, ids=[c[0] for c in CASES])
def test_bad_files(tmp_path: Path, name: str, mutate: object, reason: Reason) -> None:
    path = _write(tmp_path)
    if mutate is None:
        path.unlink()
    else:
        path.write_bytes(mutate(path.read_bytes()))  # type: ignore[operator]
    with pytest.raises(ArtifactReadError) as info:
        read_artifact(path)
    assert info.value.reason is reason
    message = str(info.value)
    assert message.startswith(f"{path}: ")  # names the file
    assert "; " in message  # and says what to do about it


def test_plain_parquet_without_footer_key(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    path = tmp_path / "plain.parquet"
    pq.write_table(make_cost_table(), path)
    with pytest.raises(ArtifactReadError) as info:
        read_artifact(path)
    assert info.value.reason is Reason.METADATA_INVALID


def test_file_size_cap(tmp_path: Path) -> None:
    path = _write(tmp_path)
    with pytest.raises(ArtifactReadError, match="limit"):
        read_artifact(path, ReadLimits(max_file_bytes=100))


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "fifo.parquet"
    os.mkfifo(fifo)
    with pytest.raises(ArtifactReadError) as info:
        read_artifact(fifo)
    assert info.value.reason is Reason.IO_ERROR


def test_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dir.parquet").mkdir()
    with pytest.raises(ArtifactReadError) as info:
        read_artifact(tmp_path / "dir.parquet")
    assert info.value.reason is Reason.IO_ERROR


# ---------------------------------------------------------------------------------------------
# table limits, judged from the footer before decoding
# ---------------------------------------------------------------------------------------------


def _limits(rows: int = 4096, decoded: int = 16 << 20) -> ReadLimits:
    limit = TableLimit(max_rows=rows, max_decoded_bytes=decoded)
    return ReadLimits(tables={"cost-table": limit})


def test_footer_estimate_is_exact_for_fixed_width_columns(tmp_path: Path) -> None:
    table = pa.table({"a": pa.array(range(1000), pa.int64()), "b": pa.array([0.5] * 1000, pa.float64())})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    size = table_size(pq.ParquetFile(path).metadata)
    assert size.rows == 1000
    assert size.decoded_bytes == size.worst_case_bytes == 1000 * 8 * 2
    assert size.string_columns == () and size.list_columns == ()


def test_footer_bounds_bracket_strings_and_lists(tmp_path: Path) -> None:
    table = pa.table({"s": pa.array(["abc"] * 10), "l": pa.array([[1.0, 2.0]] * 10)})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    size = table_size(pq.ParquetFile(path).metadata)
    assert size.string_columns == ("s",) and size.list_columns == ("l.list.element",)
    assert size.decoded_bytes <= table.nbytes <= size.worst_case_bytes + 10 * 2 * 8  # list values unbounded


def test_malformed_column_chunk_metadata_is_a_read_error_not_an_abort(tmp_path: Path) -> None:
    """Some malformed chunks make pyarrow's column-chunk metadata abort the process (an unchecked C++
    exception); the reader never touches it, so the decoder reports them as corrupt instead."""
    import random
    import subprocess
    import sys

    seed_path = tmp_path / "seed.parquet"
    table = pa.table({"a": pa.array([1.0, None, 3.0] * 4), "l": pa.array([[1.0], None, [2.0, 3.0]] * 4)})
    pq.write_table(table, seed_path)  # nullable and list columns carry level histograms
    seed = seed_path.read_bytes()
    rng = random.Random(3)
    bad = tmp_path / "bad.parquet"
    for _ in range(20_000):  # find a flip whose only symptom is a level-histogram mismatch
        data = bytearray(seed)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        try:
            pq.ParquetFile(pa.BufferReader(bytes(data))).read()
        except OSError as exc:
            if "histogram size mismatch" in str(exc):
                bad.write_bytes(bytes(data))
                break
        except Exception:
            continue
    assert bad.exists(), "no histogram-mismatch mutant found"
    probe = (
        "import sys; from dspark_calibrate.artifacts import read_artifact, ArtifactReadError\n"
        "try:\n    read_artifact(sys.argv[1])\nexcept ArtifactReadError as e:\n    print(e.reason.value)"
    )
    done = subprocess.run([sys.executable, "-c", probe, str(bad)], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-500:]  # an abort is -6 (SIGABRT)
    assert done.stdout.decode().strip() in ("NOT_PARQUET", "METADATA_INVALID")


def test_rows_and_decoded_size_limits_apply_per_kind(tmp_path: Path) -> None:
    path = _write(tmp_path)  # 9 rows, a few kB decoded
    assert read_artifact(path, _limits(rows=9)).table.num_rows == 9
    with pytest.raises(ArtifactReadError) as info:
        read_artifact(path, _limits(rows=8))
    assert info.value.reason is Reason.TABLE_TOO_LARGE and "9 rows" in str(info.value)
    with pytest.raises(ArtifactReadError) as info:
        read_artifact(path, _limits(decoded=100))
    assert info.value.reason is Reason.TABLE_TOO_LARGE
    # an expected kind's limit applies even when the footer names another kind
    with pytest.raises(ArtifactReadError):
        read_artifact(path, ReadLimits(tables={"calibration": TableLimit(1, 1)}), kind="calibration")


def test_expanding_strings_are_measured_exactly_before_expanding(tmp_path: Path) -> None:
    """A dictionary whose worst case exceeds the limit is measured, and decoded when it fits."""
    path = _write(tmp_path)
    plain = read_artifact(path).table
    size = table_size(pq.ParquetFile(path).metadata)
    assert {"stop_reason", "source_result_sha256"} <= set(size.string_columns)
    fits = plain.nbytes + 64  # above the real size, below the worst case
    assert size.decoded_bytes < fits < size.worst_case_bytes
    measured = read_artifact(path, _limits(decoded=fits)).table
    assert measured.equals(plain) and measured.schema == plain.schema
    # one 400-byte string in 500 rows: a small dictionary, 200 kB once expanded
    base = read_artifact(path)
    rows = base.table.take(pa.array([i % base.table.num_rows for i in range(500)]))
    rows = rows.set_column(
        rows.schema.get_field_index("stop_reason"), "stop_reason", pa.array(["x" * 400] * 500)
    )
    path.write_bytes(encode_artifact(rows, dict(base.metadata)))
    size = table_size(pq.ParquetFile(path).metadata)
    assert size.decoded_bytes + 20_000 < 500 * 400 < size.worst_case_bytes
    with pytest.raises(ArtifactReadError) as info:
        read_artifact(path, _limits(decoded=size.decoded_bytes + 20_000))
    assert info.value.reason is Reason.TABLE_TOO_LARGE and "once decoded" in str(info.value)
    assert read_artifact(path, _limits(decoded=size.decoded_bytes + 400_000)).table.equals(rows)


def test_every_kind_has_its_own_table_limit() -> None:
    """A kind without a limit would be read under the strict default, or, unnoticed, refused."""
    from dspark_calibrate.artifacts._limits import TABLE_LIMITS
    from dspark_calibrate.schemas import KINDS

    assert sorted(set(KINDS) - set(TABLE_LIMITS)) == []
    # The bundle members a serving process admits keep the serving limit.
    for kind in ("cost-table", "calibration", "admission", "mixed-cost-table", "mixed-admission"):
        assert TABLE_LIMITS[kind].max_decoded_bytes <= 16 * 1024 * 1024, kind


def _encodings(data: bytes) -> set[tuple[str, tuple[str, ...]]]:
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    return {
        (meta.row_group(g).column(c).compression, meta.row_group(g).column(c).encodings)
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
    }


@pytest.mark.parametrize(
    ("rows", "compression", "codec", "dictionary"),
    [
        ("small", None, "UNCOMPRESSED", False),  # serving members: plain, the cheapest to decode
        ("large", None, "ZSTD", True),  # a sweep's table keeps zstd and dictionaries
        ("small", "zstd", "ZSTD", True),  # an explicit codec is honoured as before
        ("large", "none", "UNCOMPRESSED", True),
    ],
)
def test_encode_picks_plain_pages_for_small_tables(
    rows: str, compression: str | None, codec: str, dictionary: bool
) -> None:
    from dspark_calibrate.artifacts._parquet import _PLAIN_ROWS

    small = make_cost_table()
    table = small if rows == "small" else small.take([i % small.num_rows for i in range(_PLAIN_ROWS + 1)])
    data = encode_artifact(table, {"format": "x"}, compression=compression)
    found = _encodings(data)
    assert {c for c, _ in found} == {codec}
    assert any("RLE_DICTIONARY" in e or "PLAIN_DICTIONARY" in e for _, e in found) is dictionary
    assert pq.read_table(io.BytesIO(data)).equals(table)


def test_table_size_with_the_callers_columns_is_the_same(tmp_path: Path) -> None:
    table = pa.table(
        {
            "i": pa.array([1, 2, None], pa.int64()),
            "s": pa.array(["a", None, "ccc"]),
            "l": pa.array([[1.0], None, [2.0, 3.0]], pa.list_(pa.float64())),
            "ls": pa.array([["x"], [], None], pa.list_(pa.string())),
            "f": pa.array([b"ab", b"cd", b"ef"], pa.binary(2)),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    md = pq.ParquetFile(io.BytesIO(sink.getvalue())).metadata
    columns = [md.schema.column(j) for j in range(len(md.schema))]
    counts = {"l.list.element": 4, "ls.list.element": 3}
    assert table_size(md, counts, columns) == table_size(md, counts)
    assert table_size(md, None, columns) == table_size(md)
