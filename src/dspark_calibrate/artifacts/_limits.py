"""Every limit on what the tool reads from an untrusted file, in one place, with units and why.

Two families:

**Documents** (JSON and YAML): the strict JSON parser (``_canonical.loads_strict``), the canonical
JSON writer (``_canonical.canonical_json``) and the bounded YAML loader (``_yaml.load_yaml``) all
apply :data:`MAX_DOCUMENT_DEPTH`, :data:`MAX_INT_DIGITS` and a node count, so what the tool writes it
can read back, and a document that would exhaust the interpreter (deep nesting, a huge integer,
millions of nodes, an alias bomb) is refused as that document's own error. Each kind of file also has
a byte limit, checked before a byte is parsed (:func:`~dspark_calibrate.artifacts._files.read_regular_file`).

**Tables**: a Parquet file is a compressed, run-length-encoded description of a table: a file of
0.74 MB can describe 300 million rows that take gigabytes once decoded. The file-size cap
(``ReadLimits``) therefore bounds nothing about memory. Each kind has a row limit and a decoded-size
limit instead, set from what the kind holds (DESIGN §4) with a wide margin, and :func:`table_size`
bounds the decoded size from the footer alone.

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
- list columns: 4 offset bytes per row, plus their values, which nothing in pyarrow's footer
  bounds (run-length-encoded levels can describe any number of them): ``_parquet_pages`` counts
  them from the column chunks' own Thrift metadata and page headers (``list_values`` here).

Performs no I/O: it reads an already parsed ``pyarrow.parquet.FileMetaData``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from dspark_calibrate.errors import InvalidValueError

if TYPE_CHECKING:  # only annotated: the document limits are read where pyarrow is not needed
    import pyarrow.parquet as pq

__all__ = [
    "DEFAULT_TABLE_LIMIT",
    "MAX_DOCUMENT_DEPTH",
    "MAX_INT_DIGITS",
    "MAX_JSON_NODES",
    "MAX_OPTIONS_YAML_BYTES",
    "MAX_STATE_BYTES",
    "MAX_YAML_NODES",
    "TABLE_LIMITS",
    "TableLimit",
    "TableSize",
    "table_size",
]

_KIB = 1 << 10
_MIB = 1 << 20
_GIB = 1 << 30

# -- documents (JSON and YAML) ---------------------------------------------------------------------

#: Deepest nesting of a JSON or YAML document, in levels (the top-level value is level 0). Our own
#: documents nest fewer than 8 levels (a state entry's binding values: 4); TUF roots and engine
#: options about as many. Python's parsers recurse per level and give up near 1,000 with a bare
#: RecursionError, so the reader stops far sooner, and the writer refuses to write what the reader
#: would refuse.
MAX_DOCUMENT_DEPTH = 32
#: Longest integer literal, in decimal digits (sign not counted). Every integer our documents hold
#: fits in 64 bits (at most 20 digits); Python refuses to convert literals of more than 4,300
#: digits with a bare ValueError, and arithmetic on huge ones is slow, so longer literals are
#: refused first, as the document's own error.
MAX_INT_DIGITS = 64
#: Most values (objects, arrays, scalars) in one JSON document. A rollback state of 4,000 series
#: is ~120,000; signed payloads and footers hold a few thousand. Bounds the CPU every later walk
#: over the document costs (validation, canonical re-encoding, hashing).
MAX_JSON_NODES = 1 << 20
#: Most nodes in one YAML document, aliases counted as often as they are used (so an alias bomb,
#: a few lines that expand to millions of nodes, is refused). PyYAML composes ~50,000 nodes per
#: second in pure Python; an engine options file holds a few hundred (a CUDA-graph batch-size list
#: of 1,000 entries fits): the cap keeps a hostile file under half a second.
MAX_YAML_NODES = 1 << 14
#: Largest ``extra_llm_api_options`` YAML read, in bytes. Engine option files are a few KiB; a
#: megabyte of YAML costs PyYAML ~9 s and ~460 MB, so the cap is far below that.
MAX_OPTIONS_YAML_BYTES = 256 * _KIB
#: Largest rollback state file read, in bytes. One series entry is ~1 KiB with its binding values
#: and the stored trust root a few KiB: 4 MiB holds ~4,000 series (a new series per engine build,
#: four per deployment), and parses in well under 100 ms into well under 100 MB.
MAX_STATE_BYTES = 4 * _MIB

# -- tables ----------------------------------------------------------------------------------------


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
        decoded_bytes: a lower bound of the decoded size (exact for flat fixed-width columns;
            list values counted as their level slots, which are at least the values).
        worst_case_bytes: an upper bound (list columns' values only when their counts are given).
        string_columns: the flat byte-array columns (the ones whose size the bounds bracket).
        list_columns: columns inside a list.
        list_values: level slots (values, nulls, empty lists) per list column, when counted.
        list_bytes: decoded bytes of those slots' values per list column (a lower bound).
    """

    rows: int
    decoded_bytes: int
    worst_case_bytes: int
    string_columns: tuple[str, ...]
    list_columns: tuple[str, ...]
    list_values: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    list_bytes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


def table_size(
    metadata: pq.FileMetaData,
    list_values: Mapping[str, int] | None = None,
    columns: Sequence[pq.ColumnSchema] | None = None,
) -> TableSize:
    """Bound the decoded size of the table ``metadata`` describes, without decoding it.

    Args:
        metadata: the file's footer, as pyarrow parsed it.
        list_values: level slots per list column (``_parquet_pages.list_value_counts``); without
            them a list column counts its offsets only and its values are unbounded.
        columns: ``metadata.schema``'s leaf columns in order, when the caller has them already.
    """
    groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
    group_rows = [max(g.num_rows, 0) for g in groups]
    rows = max(metadata.num_rows, sum(group_rows), 0)
    largest_group = max((max(g.total_byte_size, 0) for g in groups), default=0)
    # The most bytes one value of a row group can decode to, summed over its rows.
    string_worst = sum(
        r * (_OFFSET_BYTES + max(g.total_byte_size, 0)) for r, g in zip(group_rows, groups, strict=True)
    )
    if columns is None:
        schema = metadata.schema
        columns = [schema.column(j) for j in range(len(schema))]
    decoded = worst = 0
    strings: list[str] = []
    lists: list[str] = []
    counts = dict(list_values or {})
    list_bytes: dict[str, int] = {}
    for column in columns:
        # Each property is read once: pyarrow builds its value anew on every access.
        physical = column.physical_type
        width = _WIDTH.get(physical)
        if column.max_repetition_level > 0:
            path = column.path
            lists.append(path)
            slots = max(counts.get(path, 0), 0)
            if width is not None:
                low = high = slots * width
            elif physical == "FIXED_LEN_BYTE_ARRAY":
                low = high = slots * max(column.length, 0)
            else:  # strings in a list: an offset each, and at most a row group's bytes each
                low, high = slots * _OFFSET_BYTES, slots * (_OFFSET_BYTES + largest_group)
            decoded += rows * _OFFSET_BYTES + low
            worst += rows * _OFFSET_BYTES + high
            if path in counts:
                list_bytes[path] = low
        elif width is not None:
            decoded += rows * width
            worst += rows * width
        elif physical == "FIXED_LEN_BYTE_ARRAY":
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
        list_values=MappingProxyType({p: counts[p] for p in lists if p in counts}),
        list_bytes=MappingProxyType(list_bytes),
    )
