"""How many values each list column of a Parquet file decodes to, read before anything is decoded.

A list column's values are not bounded by anything pyarrow's footer API exposes safely: the
repetition and definition levels are run-length encoded, so a 50 KB file can hold one row whose
list decodes to 128 million doubles (gigabytes in the decoder). The count is in the file, though:
every data page header states its ``num_values`` (level slots: values, nulls and empty lists),
and the decoder produces exactly the pages it reads. pyarrow's per-column-chunk metadata cannot
be used to find the pages (it aborts the process on some malformed chunks, see ``_limits``), so
this module reads the Thrift footer and the page headers itself: a minimal reader of Thrift's
compact protocol that keeps the few fields it needs and skips the rest.

It walks each list column chunk the way Arrow's page reader does (``ComputeColumnChunkRange``
and ``SerializedPageReader::NextPage``): from the dictionary page (or the first data page) over
``total_compressed_size`` bytes, padded by 100 bytes for files that claim an old parquet-mr
writer, reading page headers while fewer values than the chunk declares have been seen. The sum of
the data pages' ``num_values`` over that walk is what the decoder will produce, at most.

Anything malformed raises :class:`PageHeaderError` (the reader reports ``NOT_PARQUET``). Performs
no I/O: it reads the file's bytes, already in memory.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dspark_calibrate.errors import InvalidValueError

__all__ = ["PageHeaderError", "footer_start", "list_value_counts"]


class PageHeaderError(InvalidValueError):
    """A Parquet footer or page header that cannot be read (truncated, out of range, malformed)."""

    default_code = "NOT_PARQUET"


# Thrift compact protocol type ids.
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)
_FIXED = {_BYTE: 1, _DOUBLE: 8}
#: Deepest struct/container nesting skipped (Parquet's metadata nests ~6 levels).
_MAX_NESTING = 64
#: Most elements in one Thrift list, set or map: a bound on work per container (a footer of the
#: largest accepted size cannot hold more elements than bytes anyway).
_MAX_ELEMENTS = 1 << 24
# Page types (parquet.thrift PageType).
_DATA_PAGE, _DATA_PAGE_V2 = 0, 3
#: Arrow pads a column chunk's byte range by this much for files of parquet-mr 1.2.8 and older
#: (PARQUET-816: their sizes left out the dictionary page header).
_PARQUET_816_PADDING = 100
_PARQUET_MR = re.compile(r"^\s*parquet-mr\b(?:\s+version\s+(\d+)\.(\d+)\.(\d+))?", re.IGNORECASE)


class _Reader:
    """Thrift compact protocol over ``data[pos:end]``."""

    __slots__ = ("data", "end", "pos")

    def __init__(self, data: bytes, pos: int, end: int) -> None:
        self.data, self.pos, self.end = data, pos, end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise PageHeaderError("truncated Thrift data")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def varint(self) -> int:
        value, self.pos = _varint(self.data, self.pos, self.end)
        return value

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise PageHeaderError("Thrift value runs past its data")
        self.pos += n

    def binary(self) -> bytes:
        n = self.varint()
        start = self.pos
        self.skip_bytes(n)
        return self.data[start : self.pos]

    def field(self, last: int) -> tuple[int, int]:
        """``(field id, type)`` of the next field of a struct (type ``_STOP`` at its end)."""
        header = self.byte()
        kind = header & 0x0F
        if kind == _STOP:
            return 0, _STOP
        delta = header >> 4
        return (last + delta if delta else self.zigzag()), kind

    def container(self) -> tuple[int, int]:
        """``(size, element type)`` of a list or set."""
        header = self.byte()
        size = header >> 4
        if size == 15:
            size = self.varint()
        if size > _MAX_ELEMENTS:
            raise PageHeaderError(f"Thrift list of {size} elements")
        return size, header & 0x0F

    def value(self, kind: int, depth: int = 0) -> Any:
        """Read a value of ``kind``: ints and binaries are returned, containers and structs skipped
        (None), except where :meth:`struct` asks for their fields."""
        if depth > _MAX_NESTING:
            raise PageHeaderError("Thrift data nests too deeply")
        if kind in (_TRUE, _FALSE):
            return kind == _TRUE
        if kind in _FIXED:
            self.skip_bytes(_FIXED[kind])
            return None
        if kind in (_I16, _I32, _I64):
            return self.zigzag()
        if kind == _BINARY:
            return self.binary()
        if kind in (_LIST, _SET):
            size, element = self.container()
            for _ in range(size):
                if element in (_TRUE, _FALSE):
                    self.skip_bytes(1)  # booleans inside containers take one byte each
                else:
                    self.value(element, depth + 1)
            return None
        if kind == _MAP:
            size = self.varint()
            if size > _MAX_ELEMENTS:
                raise PageHeaderError(f"Thrift map of {size} entries")
            if size:
                types = self.byte()
                for _ in range(size):
                    self.value(types >> 4, depth + 1)
                    self.value(types & 0x0F, depth + 1)
            return None
        if kind == _STRUCT:
            self.struct({}, depth + 1)
            return None
        raise PageHeaderError(f"unknown Thrift type {kind}")

    def struct(self, wanted: Mapping[int, Any], depth: int = 0) -> dict[int, Any]:
        """Read a struct; returns the fields named in ``wanted`` (id -> what it must be: ``_INT``,
        ``_BIN``, a mapping for a nested struct, ``("list", spec)`` for a list of ``spec``).

        Fields not wanted are skipped by :func:`_skip` (what :meth:`value` reads, in one tight
        function: the footer's schema and column metadata are mostly skipped, on every admission).

        Raises:
            PageHeaderError: a wanted field of another type, or malformed data.
        """
        out: dict[int, Any] = {}
        last = 0
        data, end = self.data, self.end
        while True:
            # The field header, as :meth:`field` reads it.
            pos = self.pos
            if pos >= end:
                raise PageHeaderError("truncated Thrift data")
            header = data[pos]
            self.pos = pos + 1
            kind = header & 0x0F
            if kind == _STOP:
                return out
            delta = header >> 4
            last = last + delta if delta else self.zigzag()
            spec = wanted.get(last, _SKIP)
            if spec is _SKIP:
                if kind in _SCALARS:
                    if depth > _MAX_NESTING:
                        raise PageHeaderError("Thrift data nests too deeply")
                    self.pos = _skip_scalar(data, self.pos, end, kind)
                else:
                    self.pos = _skip(data, self.pos, end, kind, depth)
            elif spec is _INT and kind in _INTS and depth <= _MAX_NESTING:
                out[last] = self.zigzag()
            else:
                out[last] = self._typed(kind, spec, depth, last)

    def _typed(self, kind: int, spec: Any, depth: int, fid: int) -> Any:
        if type(spec) is tuple:
            if kind != _LIST:
                raise PageHeaderError(f"Thrift field {fid} is not a list")
            size, element = self.container()
            return [self._typed(element, spec[1], depth + 1, fid) for _ in range(size)]
        if type(spec) is dict:  # the specs below are plain dicts
            if kind != _STRUCT:
                raise PageHeaderError(f"Thrift field {fid} is not a struct")
            return self.struct(spec, depth + 1)
        if (spec is _INT and kind not in (_I16, _I32, _I64)) or (spec is _BIN and kind != _BINARY):
            raise PageHeaderError(f"Thrift field {fid} has type {kind}")
        return self.value(kind, depth)


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """``(value, next position)`` of the varint at ``pos``: the one decoder of Thrift varints here
    (:meth:`_Reader.varint` and :func:`_skip` both read through it)."""
    shift = result = 0
    while pos < end:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise PageHeaderError("Thrift varint longer than 64 bits")
    raise PageHeaderError("truncated Thrift data")


def _skip(data: bytes, pos: int, end: int, kind: int, depth: int) -> int:
    """Skip one value of ``kind`` at ``data[pos:end]``; returns the position after it.

    Reads exactly what :meth:`_Reader.value` reads and refuses what it refuses (truncation, a
    varint over 64 bits, nesting over :data:`_MAX_NESTING`, containers over
    :data:`_MAX_ELEMENTS`, unknown types), without a method call per value: a struct's or a
    list's integers and binaries are skipped inline.

    Raises:
        PageHeaderError: malformed data.
    """
    if depth > _MAX_NESTING:
        raise PageHeaderError("Thrift data nests too deeply")
    if kind == _STRUCT:
        depth += 1
        while True:
            if pos >= end:
                raise PageHeaderError("truncated Thrift data")
            header = data[pos]
            pos += 1
            field = header & 0x0F
            if field == _STOP:
                return pos
            if not header >> 4:  # a long-form field id: a zigzag varint (the id is not needed)
                _, pos = _varint(data, pos, end)
            if depth > _MAX_NESTING:
                raise PageHeaderError("Thrift data nests too deeply")
            pos = (
                _skip_scalar(data, pos, end, field)
                if field in _SCALARS
                else _skip(data, pos, end, field, depth)
            )
    if kind in _SCALARS:
        return _skip_scalar(data, pos, end, kind)
    if kind in (_LIST, _SET):
        if pos >= end:
            raise PageHeaderError("truncated Thrift data")
        header = data[pos]
        pos += 1
        size = header >> 4
        if size == 15:
            size, pos = _varint(data, pos, end)
        if size > _MAX_ELEMENTS:
            raise PageHeaderError(f"Thrift list of {size} elements")
        element = header & 0x0F
        if element in (_TRUE, _FALSE):  # booleans inside containers take one byte each
            if pos + size > end:
                raise PageHeaderError("Thrift value runs past its data")
            return pos + size
        if size and depth + 1 > _MAX_NESTING:
            raise PageHeaderError("Thrift data nests too deeply")
        if element in _SCALARS:
            for _ in range(size):
                pos = _skip_scalar(data, pos, end, element)
        else:
            for _ in range(size):
                pos = _skip(data, pos, end, element, depth + 1)
        return pos
    if kind == _MAP:
        size, pos = _varint(data, pos, end)
        if size > _MAX_ELEMENTS:
            raise PageHeaderError(f"Thrift map of {size} entries")
        if size:
            if pos >= end:
                raise PageHeaderError("truncated Thrift data")
            types = data[pos]
            pos += 1
            for _ in range(size):
                pos = _skip(data, pos, end, types >> 4, depth + 1)
                pos = _skip(data, pos, end, types & 0x0F, depth + 1)
        return pos
    raise PageHeaderError(f"unknown Thrift type {kind}")


_INTS = frozenset({_I16, _I32, _I64})
#: Types :func:`_skip_scalar` skips (every type but containers, structs and unknown ids).
_SCALARS = frozenset({_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY})


def _skip_scalar(data: bytes, pos: int, end: int, kind: int) -> int:
    """Skip one value of a scalar ``kind`` (one of :data:`_SCALARS`); returns the next position.

    A field's booleans carry their value in the type id (no byte); fixed-width values are that
    many bytes; integers are varints; binaries a varint length and the bytes.
    """
    if kind == _BINARY:
        n, pos = _varint(data, pos, end)
        if pos + n > end:
            raise PageHeaderError("Thrift value runs past its data")
        return pos + n
    if kind in (_TRUE, _FALSE):
        return pos
    if kind in (_BYTE, _DOUBLE):
        n = _FIXED[kind]
        if pos + n > end:
            raise PageHeaderError("Thrift value runs past its data")
        return pos + n
    start = pos  # a varint whose value is not needed: its bytes up to the last one
    while True:
        if pos >= end:
            raise PageHeaderError("truncated Thrift data")
        b = data[pos]
        pos += 1
        if not b & 0x80:
            return pos
        if pos - start >= 10:
            raise PageHeaderError("Thrift varint longer than 64 bits")


_SKIP, _INT, _BIN = object(), object(), object()
# parquet.thrift, only the fields read here.
_COLUMN_META = {3: ("list", _BIN), 5: _INT, 7: _INT, 9: _INT, 11: _INT}  # path, num_values, size, offsets
_FILE_META = {4: ("list", {1: ("list", {3: _COLUMN_META})}), 6: _BIN}  # row_groups[].columns[]; created_by
_PAGE_HEADER = {1: _INT, 2: _INT, 3: _INT, 5: {1: _INT}, 8: {1: _INT}}


@dataclass(frozen=True, slots=True)
class _Chunk:
    path: str
    num_values: int
    start: int
    length: int


def _chunks(meta: dict[int, Any], leaves: Sequence[str], wanted: set[str]) -> list[_Chunk]:
    out: list[_Chunk] = []
    for group in meta.get(4) or []:
        columns = group.get(1) or []
        if len(columns) != len(leaves):
            raise PageHeaderError(
                f"a row group has {len(columns)} column chunks, the schema {len(leaves)} columns"
            )
        for leaf, column in zip(leaves, columns, strict=True):
            if leaf not in wanted:
                continue
            cm = column.get(3)
            if cm is None or any(k not in cm for k in (5, 7, 9)):
                raise PageHeaderError(f"column chunk of {leaf} has no metadata")
            path = ".".join(p.decode("utf-8", "replace") for p in cm.get(3) or [])
            if path != leaf:
                raise PageHeaderError(f"column chunk {path!r} is not the schema's column {leaf!r}")
            start = cm[9]
            if 11 in cm and cm[11] > 0 and start > cm[11]:
                start = cm[11]
            out.append(_Chunk(leaf, cm[5], start, cm[7]))
    return out


def _pads(created_by: bytes | None) -> bool:
    """True when Arrow pads column ranges for this writer (parquet-mr older than 1.2.9)."""
    m = _PARQUET_MR.match((created_by or b"").decode("utf-8", "replace"))
    if m is None:
        return False
    if m.group(1) is None:
        return True  # a parquet-mr without a version reads as version 0
    return tuple(int(g) for g in m.groups()) < (1, 2, 9)


def _walk(data: bytes, chunk: _Chunk, pad: bool) -> int:
    """Level slots the decoder reads from one column chunk's pages."""
    if chunk.start < 0 or chunk.length < 0 or chunk.start + chunk.length > len(data):
        raise PageHeaderError(f"column chunk of {chunk.path} lies outside the file")
    end = chunk.start + chunk.length
    if pad:
        end = min(len(data), end + _PARQUET_816_PADDING)
    pos, seen = chunk.start, 0
    while seen < chunk.num_values and pos < end:
        reader = _Reader(data, pos, end)
        header = reader.struct(_PAGE_HEADER)
        kind, size = header.get(1), header.get(3)
        if kind is None or size is None or size < 0 or (header.get(2) or 0) < 0:
            raise PageHeaderError(f"malformed page header in {chunk.path}")
        for page_type, field in ((_DATA_PAGE, 5), (_DATA_PAGE_V2, 8)):
            if kind == page_type:
                n = (header.get(field) or {}).get(1)
                if n is None or n < 0:
                    raise PageHeaderError(f"data page of {chunk.path} without a value count")
                seen += n
        pos = reader.pos + size
    return seen


def list_value_counts(
    data: bytes, footer_start: int, leaves: Sequence[str], lists: Sequence[str]
) -> dict[str, int]:
    """Level slots (values, nulls, empty lists) each list column decodes to, over all row groups.

    Args:
        data: the whole Parquet file.
        footer_start: offset of the Thrift ``FileMetaData`` (its length is checked by the caller).
        leaves: every leaf column's dotted path, in schema order.
        lists: the leaf paths inside a list.

    Raises:
        PageHeaderError: the footer or a page header cannot be read.
    """
    if not lists:
        return {}
    meta = _Reader(data, footer_start, len(data) - 8).struct(_FILE_META)
    pad = _pads(meta.get(6))
    counts = dict.fromkeys(lists, 0)
    for chunk in _chunks(meta, leaves, set(lists)):
        counts[chunk.path] += _walk(data, chunk, pad)
    return counts


def footer_start(data: bytes) -> int:
    """Offset of the Thrift footer of a Parquet file whose magic and length were checked."""
    length = int.from_bytes(data[-8:-4], "little")
    return len(data) - 8 - length
