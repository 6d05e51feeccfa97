"""Per-kind table limits, checked from the Parquet footer before any page is decoded.

A Parquet file is a compressed, run-length-encoded description of a table: a file of 0.74 MB can
describe 300 million rows that take gigabytes once decoded. The file-size cap (``ReadLimits``)
therefore bounds nothing about memory. Each kind has a row limit and a decoded-size limit instead,
set from what the kind holds (DESIGN §4) with a wide margin, and :func:`table_size` bounds the
decoded size from the footer alone.

Only the file's row counts, its row groups' uncompressed sizes and its schema are read here:
pyarrow builds the per-column-chunk metadata (``RowGroupMetaData.column``) in C++ that aborts the
whole process on some malformed chunks (an unchecked C++ exception), so no reader of untrusted
files may touch it; the decoder itself reports the same defects as errors. From what is safe:

- flat fixed-width columns: rows × width, exact;
- flat byte-array (string) columns: 4 offset bytes per row plus the value bytes. Whatever the
  encoding (plain, dictionary, delta), no value is longer than its row group's uncompressed
  bytes, so rows × (4 + those bytes) is a true worst case; a dictionary can make the real size
  that large (one long entry repeated). When the worst case is above the limit the reader decodes
  the strings as dictionaries (which never expand), adds up their dense size exactly, and refuses
  or expands them; an encoding that cannot be decoded that way is refused;
- list columns: 4 offset bytes per row; their values are not bounded by anything in the footer
  (run-length-encoded levels), a residual risk the threat model in docs/runtime.md states.

Performs no I/O: it reads an already parsed ``pyarrow.parquet.FileMetaData``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import pyarrow.parquet as pq

from dspark_calibrate.errors import InvalidValueError

__all__ = [
    "DEFAULT_TABLE_LIMIT",
    "TABLE_LIMITS",
    "TableLimit",
    "TableSize",
    "table_size",
]

_MIB = 1 << 20
_GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class TableLimit:
    """The largest table of one kind a reader decodes.

    Attributes:
        max_rows: rows.
        max_decoded_bytes: bytes of decoded Arrow data (column buffers).
    """

    max_rows: int
    max_decoded_bytes: int

    def __post_init__(self) -> None:
        if self.max_rows < 1 or self.max_decoded_bytes < 1:
            raise InvalidValueError(f"table limits must be positive, got {self}")


#: Limits per kind, with why each is far above anything real. Serving-path kinds (the bundle
#: members) are small; build-host kinds are large, capped only to keep a crafted file from taking
#: the host's memory.
TABLE_LIMITS: Mapping[str, TableLimit] = MappingProxyType(
    {
        # One row per deployed cell: at most 32 compact cells plus one native cell per G, and
        # engine graph ladders hold at most a few hundred sizes. A real table is < 100 KiB.
        "cost-table": TableLimit(max_rows=4096, max_decoded_bytes=16 * _MIB),
        # One row per draft position 1..K (K is single digits in practice).
        "calibration": TableLimit(max_rows=1024, max_decoded_bytes=16 * _MIB),
        # One row per replayed compact cell (at most 32 deployed).
        "admission": TableLimit(max_rows=4096, max_decoded_bytes=16 * _MIB),
        # Per-cell summary of a sweep: every candidate cell of a ladder, a few thousand at most.
        "sweep": TableLimit(max_rows=1 << 20, max_decoded_bytes=1 * _GIB),
        # Every timed sample of a sweep (~100 B decoded each): ~10^6 for a long multi-rank sweep.
        "sweep-samples": TableLimit(max_rows=1 << 26, max_decoded_bytes=8 * _GIB),
        # Draft rounds and recorded serving steps for fit and replay: ~10^7 rows in the largest
        # benchmarks (benchmarks/RESULTS.md), ~100 B each.
        "trace": TableLimit(max_rows=1 << 28, max_decoded_bytes=32 * _GIB),
        "workload": TableLimit(max_rows=1 << 28, max_decoded_bytes=32 * _GIB),
        "workload-mixed": TableLimit(max_rows=1 << 28, max_decoded_bytes=32 * _GIB),
        # Mixed evidence: at most 256 deployed geometries, each a handful of rows (its cells and
        # the native row), so the serving kinds keep the serving limit.
        "mixed-cost-table": TableLimit(max_rows=4096, max_decoded_bytes=16 * _MIB),
        "mixed-admission": TableLimit(max_rows=4096, max_decoded_bytes=16 * _MIB),
        # A mixed sweep measures at most 256 geometries per plan; its samples are a sweep's.
        "mixed-sweep": TableLimit(max_rows=1 << 20, max_decoded_bytes=1 * _GIB),
        "mixed-sweep-samples": TableLimit(max_rows=1 << 26, max_decoded_bytes=8 * _GIB),
    }
)
#: A table whose kind is not known yet (no expected kind, footer kind unknown): the serving limit.
DEFAULT_TABLE_LIMIT = TableLimit(max_rows=4096, max_decoded_bytes=16 * _MIB)

# Decoded bytes per value of each fixed-width physical type (booleans counted as a byte, INT96
# as its 12 stored bytes: both overestimates, which only makes the check stricter).
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}
_OFFSET_BYTES = 4  # an Arrow int32 offset per variable-length value (and per list)


@dataclass(frozen=True, slots=True)
class TableSize:
    """What a Parquet footer says about the table it describes.

    Attributes:
        rows: rows (the larger of the file's count and the sum of its row groups').
        decoded_bytes: a lower bound of the decoded size (exact for flat fixed-width columns).
        worst_case_bytes: an upper bound, except for list columns' values.
        string_columns: the flat byte-array columns (the ones whose size the bounds bracket).
        list_columns: columns inside a list.
    """

    rows: int
    decoded_bytes: int
    worst_case_bytes: int
    string_columns: tuple[str, ...]
    list_columns: tuple[str, ...]


def table_size(metadata: pq.FileMetaData) -> TableSize:
    """Bound the decoded size of the table ``metadata`` describes, without decoding it."""
    groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    group_rows = [max(g.num_rows, 0) for g in groups]
    rows = max(metadata.num_rows, sum(group_rows), 0)
    # The most bytes one value of a row group can decode to, summed over its rows.
    string_worst = sum(
        r * (_OFFSET_BYTES + max(g.total_byte_size, 0)) for r, g in zip(group_rows, groups, strict=True)
    )
    schema = metadata.schema
    decoded = worst = 0
    strings: list[str] = []
    lists: list[str] = []
    for j in range(len(schema)):
        column = schema.column(j)
        if column.max_repetition_level > 0:
            lists.append(column.path)
            decoded += rows * _OFFSET_BYTES
            worst += rows * _OFFSET_BYTES
        elif column.physical_type in _WIDTH:
            decoded += rows * _WIDTH[column.physical_type]
            worst += rows * _WIDTH[column.physical_type]
        elif column.physical_type == "FIXED_LEN_BYTE_ARRAY":
            decoded += rows * max(column.length, 0)
            worst += rows * max(column.length, 0)
        else:  # BYTE_ARRAY
            strings.append(column.path)
            decoded += rows * _OFFSET_BYTES
            worst += string_worst
    return TableSize(
        rows=rows,
        decoded_bytes=decoded,
        worst_case_bytes=worst,
        string_columns=tuple(strings),
        list_columns=tuple(lists),
    )
