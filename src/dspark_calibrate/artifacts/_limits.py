"""Per-kind table limits, checked from the Parquet footer before any page is decoded.

A Parquet file is a compressed, run-length-encoded description of a table: a file of 0.74 MB can
describe 300 million rows that take gigabytes once decoded. The file-size cap (``ReadLimits``)
therefore bounds nothing about memory. Each kind has a row limit and a decoded-size limit instead,
set from what the kind holds (DESIGN §4) with a wide margin, and :func:`table_size` estimates the
decoded size from the footer alone:

- fixed-width columns: values × width, exact (the footer counts values per column chunk);
- byte-array (string) columns: 4 offset bytes per value plus the chunk's uncompressed bytes,
  exact for plain encodings; a dictionary-encoded chunk repeats its dictionary's entries, so its
  worst case is values × dictionary bytes: when that worst case is above the limit the reader
  decodes the column as a dictionary (which never expands) and measures it exactly first;
- ``DELTA_BYTE_ARRAY`` chunks store each value as a shared prefix plus a suffix, so nothing in the
  footer bounds them: refused (no writer of this tool uses that encoding).

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
    }
)
#: A table whose kind is not known yet (no expected kind, footer kind unknown): the serving limit.
DEFAULT_TABLE_LIMIT = TableLimit(max_rows=4096, max_decoded_bytes=16 * _MIB)

# Decoded bytes per value of each fixed-width physical type (booleans counted as a byte, INT96
# as its 12 stored bytes: both overestimates, which only makes the check stricter).
_WIDTH = {"BOOLEAN": 1, "INT32": 4, "INT64": 8, "INT96": 12, "FLOAT": 4, "DOUBLE": 8}
_OFFSET_BYTES = 4  # an Arrow int32 offset per variable-length value (and per list)
_DICTIONARY_ENCODINGS = frozenset({"PLAIN_DICTIONARY", "RLE_DICTIONARY"})


@dataclass(frozen=True, slots=True)
class TableSize:
    """What a Parquet footer says about the table it describes.

    Attributes:
        rows: the footer's row count.
        decoded_bytes: decoded size, exact except for dictionary-encoded byte-array columns,
            which count only their stored bytes here.
        worst_case_bytes: ``decoded_bytes`` with every dictionary-encoded byte-array chunk at
            its worst case (values × dictionary bytes).
        dictionary_columns: byte-array columns with a dictionary-encoded chunk.
        nested_dictionary: one of them is inside a list (it cannot be measured as a dictionary).
        unboundable: ``(column, encoding)`` of a chunk whose decoded size cannot be bounded from
            the footer, or None.
    """

    rows: int
    decoded_bytes: int
    worst_case_bytes: int
    dictionary_columns: tuple[str, ...]
    nested_dictionary: bool
    unboundable: tuple[str, str] | None


def table_size(metadata: pq.FileMetaData) -> TableSize:
    """Estimate the decoded size of the table ``metadata`` describes, without decoding it."""
    schema = metadata.schema
    decoded = worst = 0
    dictionary: dict[str, None] = {}
    nested_dictionary = False
    unboundable: tuple[str, str] | None = None
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        for j in range(group.num_columns):
            chunk = group.column(j)
            values = max(chunk.num_values, 0)
            physical = chunk.physical_type
            name = chunk.path_in_schema
            nested = schema.column(j).max_repetition_level > 0
            list_offsets = values * _OFFSET_BYTES if nested else 0
            if physical in _WIDTH:
                size = values * _WIDTH[physical] + list_offsets
                decoded += size
                worst += size
                continue
            if physical == "FIXED_LEN_BYTE_ARRAY":
                size = values * max(schema.column(j).length, 0) + list_offsets
                decoded += size
                worst += size
                continue
            # BYTE_ARRAY: offsets plus the value bytes.
            encodings = set(chunk.encodings)
            if "DELTA_BYTE_ARRAY" in encodings and unboundable is None:
                unboundable = (name, "DELTA_BYTE_ARRAY")
            stored = values * _OFFSET_BYTES + list_offsets + max(chunk.total_uncompressed_size, 0)
            decoded += stored
            if chunk.has_dictionary_page or encodings & _DICTIONARY_ENCODINGS:
                worst += stored + values * max(chunk.total_uncompressed_size, 0)
                nested_dictionary = nested_dictionary or nested
                dictionary[name] = None
            else:
                worst += stored
    return TableSize(
        rows=metadata.num_rows,
        decoded_bytes=decoded,
        worst_case_bytes=worst,
        dictionary_columns=tuple(dictionary),
        nested_dictionary=nested_dictionary,
        unboundable=unboundable,
    )
