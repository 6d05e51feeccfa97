"""Parquet read/write with the ``dspark`` footer key (DESIGN §4).

Writes are atomic (the whole file is encoded in memory, then written through
``atomic_write_bytes``), so a reader never sees a partial artifact. Reads are bounded: file size,
footer size and metadata size are capped before anything is parsed, and every pyarrow error is
turned into an ``ArtifactReadError`` with a reason code. The footer is *untrusted* until the
signature verifies; this module only loads it.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dspark_calibrate.artifacts._atomic import atomic_write_bytes
from dspark_calibrate.artifacts._canonical import JsonError, canonical_json, loads_strict
from dspark_calibrate.artifacts._files import FileTooLarge, read_regular_file
from dspark_calibrate.artifacts._limits import DEFAULT_TABLE_LIMIT, TABLE_LIMITS, TableLimit, table_size
from dspark_calibrate.artifacts._logical_hash import canonical_order, logical_sha256
from dspark_calibrate.artifacts._models import Fingerprint, ModelError, Provenance
from dspark_calibrate.artifacts._parquet_pages import footer_start, list_value_counts
from dspark_calibrate.artifacts._reasons import Reason
from dspark_calibrate.errors import ConfigError, DsparkError
from dspark_calibrate.schemas import SCHEMA_VERSION, SchemaMismatch, conform_table

__all__ = [
    "DEFAULT_LIMITS",
    "FOOTER_FIELDS",
    "FOOTER_KEY",
    "FORMAT",
    "ArtifactReadError",
    "LoadedArtifact",
    "OpenedArtifact",
    "ReadLimits",
    "detached_envelope_path",
    "encode_artifact",
    "footer_metadata",
    "open_artifact",
    "read_artifact",
    "write_unsigned_artifact",
]

FOOTER_KEY = b"dspark"
#: Parquet schema-metadata key that marks a trace file written by this package (kind, version,
#: whether it is synthetic, the generator's parameters): fit's input, never an artifact. Absent
#: from traces written elsewhere. The artifact reader names such a file for what it is.
TRACE_FOOTER_KEY = b"dspark.trace"
FORMAT = "dspark-calibrate/artifact"
FORMAT_VERSION = 1
#: The fields of a format-1 ``dspark`` footer document (:func:`footer_metadata` writes exactly these).
FOOTER_FIELDS = frozenset(
    {
        "format",
        "format_version",
        "kind",
        "schema_version",
        "logical_sha256",
        "fingerprint",
        "provenance",
        "summary",
        "envelope",
    }
)
_MAGIC = b"PAR1"
#: Rows above which a table is decoded with Arrow's thread pool.
_THREADED_ROWS = 1 << 16
#: Rows from which ``open_artifact(background=True)`` decodes on a worker thread; smaller tables
#: decode inline. A bundle member (tens of rows) decodes in 0.1-0.6 ms, less than handing it to a
#: worker costs in CPU (thread wake-ups and GIL hand-offs: 0.5-1.5 ms per table on two vCPUs,
#: measured, ~5 ms of a 30 ms admission). And the serving path verifies members while every rank
#: starts at once, so no core is idle to overlap on: the worker only adds CPU there.
_BACKGROUND_ROWS = 1 << 10
#: Rows up to which ``encode_artifact`` writes a table uncompressed and without dictionaries by
#: default. Serving members (cost table, calibration, admission) have tens of rows; a larger
#: table is a sweep's, where zstd pays for itself.
_PLAIN_ROWS = 256


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """Caps applied before parsing untrusted files (bytes), and per-kind table limits.

    Defaults: our largest artifacts (raw sweep samples of a long sweep) stay far below 256 MiB; a
    footer above 8 MiB or a ``dspark`` value above 2 MiB can only be an attack or a bug. Rows and
    decoded bytes are capped per kind (``_limits.TABLE_LIMITS``), because a small file can
    describe a huge table.
    """

    max_file_bytes: int = 256 << 20
    max_footer_bytes: int = 8 << 20
    max_metadata_bytes: int = 2 << 20
    max_envelope_bytes: int = 1 << 20
    tables: Mapping[str, TableLimit] = field(default_factory=lambda: TABLE_LIMITS)

    def table_limit(self, kind: str | None) -> TableLimit:
        """The limit for a table of ``kind`` (the strict default when the kind is not known)."""
        return self.tables.get(kind, DEFAULT_TABLE_LIMIT) if kind is not None else DEFAULT_TABLE_LIMIT


DEFAULT_LIMITS = ReadLimits()


class ArtifactReadError(DsparkError):
    """An artifact file could not be read; ``reason`` says why (IO_ERROR, NOT_PARQUET, ...)."""

    def __init__(self, reason: Reason, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def detached_envelope_path(path: Path) -> Path:
    """``<file>.dsse.json`` beside an artifact."""
    return path.with_name(path.name + ".dsse.json")


@dataclass(frozen=True)
class LoadedArtifact:
    """A Parquet artifact as read from disk. Nothing here is trusted until verification passes.

    Attributes:
        path: where it was read from.
        table: the data, without schema metadata.
        metadata: the parsed ``dspark`` footer JSON (untrusted).
        envelope: the embedded DSSE envelope (JSON form), or ``None``.
        detached_envelope: bytes of ``<file>.dsse.json`` when present, else ``None``.
        file_metadata: the Parquet footer's key-value metadata (``dspark`` and any other).
    """

    path: Path
    table: pa.Table
    metadata: Mapping[str, Any]
    envelope: Mapping[str, Any] | None
    detached_envelope: bytes | None = None
    file_bytes: int = 0
    extra: Mapping[str, Any] = field(default_factory=dict)
    file_metadata: Mapping[bytes, bytes] = field(default_factory=dict)

    @property
    def kind(self) -> str | None:
        """The footer's (untrusted) kind."""
        kind = self.metadata.get("kind")
        return kind if isinstance(kind, str) else None

    @property
    def schema_version(self) -> int | None:
        """The footer's (untrusted) schema version."""
        v = self.metadata.get("schema_version")
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def fingerprint_untrusted(self) -> Fingerprint:
        """The footer's fingerprint (untrusted: for unsigned sweep/trace outputs and diagnostics).

        Raises:
            ConfigError: the footer holds no valid fingerprint.
        """
        try:
            return Fingerprint.from_dict(self.metadata.get("fingerprint") or {})
        except ModelError as exc:
            raise ConfigError(f"{self.path}: footer fingerprint is invalid: {exc}") from exc

    def provenance_untrusted(self) -> Provenance:
        """The footer's provenance (untrusted).

        Raises:
            ConfigError: the footer holds no valid provenance.
        """
        try:
            return Provenance.from_dict(self.metadata.get("provenance") or {})
        except ModelError as exc:
            raise ConfigError(f"{self.path}: footer provenance is invalid: {exc}") from exc


def footer_metadata(
    *,
    kind: str,
    table: pa.Table,
    fingerprint: Fingerprint,
    provenance: Provenance,
    summary: Mapping[str, Any] | None = None,
    envelope: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the ``dspark`` footer document for a table of ``kind``."""
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "schema_version": SCHEMA_VERSION[kind],
        "logical_sha256": logical_sha256(table, kind),
        "fingerprint": fingerprint.to_dict(),
        "provenance": provenance.to_dict(),
        "summary": dict(summary) if summary is not None else {},
        "envelope": dict(envelope) if envelope is not None else None,
    }


def encode_artifact(
    table: pa.Table,
    metadata: Mapping[str, Any],
    *,
    compression: str | None = None,
    row_group_size: int | None = None,
) -> bytes:
    """Encode a table and its footer document as Parquet bytes.

    The file carries nothing a reader ignores: no ARROW:schema (which would hold a second, unread
    base64 copy of the footer), no min/max statistics, and CRC-32 page checksums that the reader
    verifies. So a changed byte either changes what verification reads or fails to decode; our
    column types all survive Parquet without the Arrow schema.

    Without an explicit ``compression``, a table of at most :data:`_PLAIN_ROWS` rows (every
    serving bundle member) is stored uncompressed and without dictionaries: it is a few KiB
    either way, and decoding it plainly takes about half the CPU of zstd with dictionaries (each
    zstd page sets up a decompression context), paid by every serving rank at every admission.
    Larger tables (sweeps, samples) keep zstd. Readers accept any encoding.
    """
    plain = compression is None and table.num_rows <= _PLAIN_ROWS
    sink = pa.BufferOutputStream()
    writer = pq.ParquetWriter(
        sink,
        table.schema.remove_metadata(),
        compression="none" if plain else (compression or "zstd"),
        use_dictionary=not plain,
        store_schema=False,
        write_statistics=False,
        write_page_checksum=True,
    )
    try:
        writer.write_table(table.replace_schema_metadata(None), row_group_size=row_group_size)
        writer.add_key_value_metadata({FOOTER_KEY: canonical_json(metadata)})
    finally:
        writer.close()
    return bytes(sink.getvalue().to_pybytes())


def write_unsigned_artifact(
    path: Path | str,
    table: pa.Table,
    *,
    kind: str,
    fingerprint: Fingerprint,
    provenance: Provenance,
    summary: Mapping[str, Any] | None = None,
) -> str:
    """Conform ``table`` to its kind's schema and write it atomically, unsigned.

    Returns:
        The logical SHA-256 of the written table.

    Raises:
        ConfigError: the table does not match the kind's schema or cannot be hashed.
    """
    path = Path(path)
    try:
        table = canonical_order(conform_table(kind, table), kind)
        metadata = footer_metadata(
            kind=kind, table=table, fingerprint=fingerprint, provenance=provenance, summary=summary
        )
    except (SchemaMismatch, ValueError) as exc:
        raise ConfigError(f"{path}: cannot write {kind} artifact: {exc}") from exc
    atomic_write_bytes(path, encode_artifact(table, metadata))
    return str(metadata["logical_sha256"])


def _check_footer(data: bytes, path: Path, limits: ReadLimits) -> None:
    if len(data) < 12 or data[:4] != _MAGIC or data[-4:] != _MAGIC:
        raise ArtifactReadError(
            Reason.NOT_PARQUET,
            f"{path}: not a Parquet file (magic bytes missing or truncated); copy the artifact again from its source",
        )
    (footer_len,) = struct.unpack("<I", data[-8:-4])
    if footer_len > limits.max_footer_bytes:
        raise ArtifactReadError(
            Reason.FOOTER_TOO_LARGE,
            f"{path}: Parquet footer is {footer_len} bytes, above the {limits.max_footer_bytes}-byte limit; "
            "refused unread (no artifact this tool writes has one so large)",
        )
    if footer_len + 12 > len(data):
        raise ArtifactReadError(
            Reason.NOT_PARQUET,
            f"{path}: Parquet footer length exceeds the file (truncated?); copy the artifact again from its source",
        )


_POOL: tuple[int, ThreadPoolExecutor] | None = None


def _decode_pool() -> ThreadPoolExecutor:
    """This process's decode workers (a child after ``fork`` makes its own; the parent's are gone)."""
    global _POOL
    pool = _POOL
    if pool is None or pool[0] != os.getpid():
        pool = (os.getpid(), ThreadPoolExecutor(max_workers=4, thread_name_prefix="dspark-parquet-decode"))
        _POOL = pool
    return pool[1]


def _corrupt(path: Path, exc: Exception) -> ArtifactReadError:
    return ArtifactReadError(
        Reason.NOT_PARQUET,
        f"{path}: corrupt Parquet ({exc}); the file changed after it was written: copy it again from "
        "its source or rebuild it",
    )


@dataclass(frozen=True, slots=True)
class _Measure:
    """Decode ``columns`` as dictionaries and measure the dense size before expanding them."""

    data: bytes = field(repr=False)
    columns: tuple[str, ...]
    kind: str | None
    max_decoded_bytes: int


def _decode(pf: pq.ParquetFile, path: Path, measure: _Measure | None = None) -> pa.Table:
    try:
        if measure is None:
            # Arrow's own threads only pay off on large tables; a bundle member is a few
            # hundred rows, decoded here while eight ranks start at once on a few cores.
            threads = pf.metadata.num_rows > _THREADED_ROWS
            return pf.read(use_threads=threads).replace_schema_metadata(None)
        return _decode_measured(path, measure)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _corrupt(path, exc) from exc


def _decode_measured(path: Path, measure: _Measure) -> pa.Table:
    """Decode with the dictionary-encoded string columns kept as dictionaries (which never expand),
    add up their dense size exactly, and expand them only when the whole table is within the limit.

    Raises:
        ArtifactReadError: TABLE_TOO_LARGE.
    """
    try:
        pf = pq.ParquetFile(
            pa.BufferReader(measure.data),
            page_checksum_verification=True,
            read_dictionary=list(measure.columns),
        )
        table = pf.read().replace_schema_metadata(None)
    except (pa.ArrowException, OSError, ValueError) as exc:
        # A corrupt page, or an encoding that cannot be decoded as a dictionary (DELTA_BYTE_ARRAY):
        # either way the strings were not measured, so they are not expanded.
        raise ArtifactReadError(
            Reason.TABLE_TOO_LARGE,
            f"{path}: its string columns may take more than the {measure.max_decoded_bytes}-byte limit of "
            f"{'a ' + measure.kind if measure.kind else 'an artifact'} table once decoded, and could not "
            f"be measured first ({exc}); refused: check that this is the right file, or rebuild it",
        ) from exc
    total = 0
    fields = []
    for f, column in zip(table.schema, table.columns, strict=True):
        if not pa.types.is_dictionary(f.type):
            total += column.nbytes
            fields.append(f)
            continue
        for chunk in column.chunks:
            lengths = pc.binary_length(chunk.dictionary).take(chunk.indices)
            total += int(pc.sum(lengths).as_py() or 0) + 4 * (len(chunk) + 1)
        fields.append(f.with_type(f.type.value_type))
    if total > measure.max_decoded_bytes:
        raise _too_large(
            path, measure.kind, f"{total} bytes once decoded", f"{measure.max_decoded_bytes}-byte"
        )
    schema = pa.schema(fields)
    return pa.Table.from_arrays(
        [c.cast(f.type) if c.type != f.type else c for c, f in zip(table.columns, schema, strict=True)],
        schema=schema,
    )


def _too_large(path: Path, kind: str | None, what: str, limit: str) -> ArtifactReadError:
    return ArtifactReadError(
        Reason.TABLE_TOO_LARGE,
        f"{path}: the table holds {what}, above the {limit} limit of {'a ' + kind if kind else 'an artifact'} "
        "table; refused before decoding (no real table of this kind is so large: check that this is the "
        "right file, or rebuild it)",
    )


def _footer_kind(raw_meta: bytes) -> str | None:
    """The footer's (untrusted) kind, used only to pick a table limit when none is expected."""
    try:
        meta = loads_strict(raw_meta, what="footer")
    except JsonError:
        return None
    kind = meta.get("kind") if isinstance(meta, dict) else None
    return kind if isinstance(kind, str) else None


def _check_table(
    pf: pq.ParquetFile, data: bytes, raw_meta: bytes, path: Path, limits: ReadLimits, kind: str | None
) -> _Measure | None:
    """Rows and decoded size from the footer against the kind's limit, before any page is decoded.

    With no expected kind, the footer's own kind picks the limit (untrusted: the signature check
    refuses a kind that differs from the signed one; a footer without a kind gets the strict
    default). The serving path always expects a kind (the bundle manifest names each member's).

    Returns:
        How to decode when dictionary-encoded strings might expand past the limit, else None.

    Raises:
        ArtifactReadError: TABLE_TOO_LARGE.
    """
    try:
        metadata = pf.metadata
        schema = metadata.schema
        leaves = [schema.column(j) for j in range(len(schema))]
        paths = [c.path for c in leaves]
        lists = [path for c, path in zip(leaves, paths, strict=True) if c.max_repetition_level > 0]
        counts = list_value_counts(data, footer_start(data), paths, lists)
        size = table_size(metadata, counts, leaves)
    except (pa.ArrowException, OSError, ValueError) as exc:  # e.g. a column name that is not UTF-8
        raise _corrupt(path, exc) from exc
    if kind is None:
        kind = _footer_kind(raw_meta)
    limit = limits.table_limit(kind)
    if size.rows > limit.max_rows:
        raise _too_large(path, kind, f"{size.rows} rows", f"{limit.max_rows}-row")
    # Each list column alone, named: its values are the one part of a table a small file can blow
    # up without bound (run-length-encoded levels), counted from its page headers.
    for column, nbytes in size.list_bytes.items():
        if nbytes > limit.max_decoded_bytes:
            what = f"{size.list_values[column]} values in list column {column} ({nbytes} bytes once decoded)"
            raise _too_large(path, kind, what, f"{limit.max_decoded_bytes}-byte")
    if size.decoded_bytes > limit.max_decoded_bytes:
        raise _too_large(
            path, kind, f"at least {size.decoded_bytes} bytes once decoded", f"{limit.max_decoded_bytes}-byte"
        )
    if size.worst_case_bytes <= limit.max_decoded_bytes:
        return None
    return _Measure(data, size.string_columns, kind, limit.max_decoded_bytes)


class _PendingTable:
    """A table being decoded: on a worker thread (``background`` and at least
    :data:`_BACKGROUND_ROWS` rows), or inline (a smaller table, or no worker can be had)."""

    def __init__(
        self, pf: pq.ParquetFile, path: Path, *, background: bool, measure: _Measure | None = None
    ) -> None:
        self._future: Future[pa.Table] | None = None
        self._table: pa.Table | None = None
        self._error: ArtifactReadError | None = None
        if background and pf.metadata.num_rows >= _BACKGROUND_ROWS:
            started = threading.Event()

            def job() -> pa.Table:
                started.set()
                return _decode(pf, path, measure)

            try:
                self._future = _decode_pool().submit(job)
            except RuntimeError:  # interpreter shutting down, or no thread could be started
                self._future = None
            else:
                # Block until the worker runs: waiting hands it the GIL now, so decoding starts
                # before this thread parses JSON rather than at its next blocking call (a few
                # percent of a small artifact's verification). Pyarrow decodes without the GIL,
                # so both proceed in parallel from here.
                started.wait(timeout=1.0)
                return
        try:
            self._table = _decode(pf, path, measure)
        except ArtifactReadError as exc:
            self._error = exc

    def result(self) -> pa.Table:
        """The decoded table.

        Raises:
            ArtifactReadError: NOT_PARQUET (corrupt pages, failed page checksum, bad encoding).
        """
        if self._future is not None:
            try:
                self._table = self._future.result()
            except ArtifactReadError as exc:
                self._error = exc
            self._future = None
        if self._error is not None:
            raise self._error
        assert self._table is not None
        return self._table


@dataclass(frozen=True, eq=False)
class OpenedArtifact:
    """An artifact whose file, footer and envelopes are read and whose table may still be decoding.

    Everything verification needs before the logical hash (step 5) is here, so the pipeline checks
    the signature while the table decodes. Nothing here is trusted until verification passes.
    """

    path: Path
    metadata: Mapping[str, Any]
    envelope: Mapping[str, Any] | None
    detached_envelope: bytes | None
    file_bytes: int
    pending: _PendingTable
    file_metadata: Mapping[bytes, bytes] = field(default_factory=dict)

    def table(self) -> pa.Table:
        """Wait for the table (same as ``LoadedArtifact.table`` once loaded).

        Raises:
            ArtifactReadError: NOT_PARQUET.
        """
        return self.pending.result()

    def loaded(self) -> LoadedArtifact:
        """The fully read artifact.

        Raises:
            ArtifactReadError: NOT_PARQUET.
        """
        return LoadedArtifact(
            path=self.path,
            table=self.table(),
            metadata=self.metadata,
            envelope=self.envelope,
            detached_envelope=self.detached_envelope,
            file_bytes=self.file_bytes,
            file_metadata=self.file_metadata,
        )


def read_artifact(
    path: Path | str, limits: ReadLimits = DEFAULT_LIMITS, *, kind: str | None = None
) -> LoadedArtifact:
    """Read a Parquet artifact, its ``dspark`` footer and any detached envelope, within ``limits``.

    Args:
        path: the artifact.
        limits: size caps applied before parsing.
        kind: the kind the caller expects, whose table limit applies (default: the footer's).

    Raises:
        ArtifactReadError: IO_ERROR, NOT_PARQUET, FOOTER_TOO_LARGE, TABLE_TOO_LARGE,
            METADATA_INVALID or ENVELOPE_TOO_LARGE, with a message naming the file.
    """
    return open_artifact(path, limits, background=False, kind=kind).loaded()


def open_artifact(
    path: Path | str,
    limits: ReadLimits = DEFAULT_LIMITS,
    *,
    background: bool = True,
    kind: str | None = None,
) -> OpenedArtifact:
    """Read an artifact's file, footer and envelopes; decode a large table in the background.

    Errors are those of ``read_artifact`` and take the same precedence: a table that fails to
    decode is reported (by ``OpenedArtifact.table``, or here when the footer is also bad) before
    any footer or envelope problem, exactly as a sequential read would report it.

    Args:
        path: the artifact.
        limits: size caps applied before parsing.
        background: decode a large table on a worker thread, overlapping the caller's work.
        kind: the kind the caller expects, whose table limit applies (default: the footer's).

    Raises:
        ArtifactReadError: IO_ERROR, NOT_PARQUET, FOOTER_TOO_LARGE, TABLE_TOO_LARGE (rows or
            decoded size above the kind's limit, judged from the footer before decoding),
            METADATA_INVALID or ENVELOPE_TOO_LARGE, with a message naming the file.
    """
    path = Path(path)
    try:
        data = read_regular_file(path, limits.max_file_bytes)
    except FileTooLarge as big:
        raise ArtifactReadError(
            Reason.NOT_PARQUET,
            f"{path}: {big.size} bytes is above the {limits.max_file_bytes}-byte artifact limit; refused unread",
        ) from None
    except OSError as exc:
        raise ArtifactReadError(
            Reason.IO_ERROR,
            f"{path}: cannot read ({exc.strerror or exc}); check the path and its permissions",
        ) from exc
    size = len(data)
    _check_footer(data, path, limits)
    try:
        pf = pq.ParquetFile(pa.BufferReader(data), page_checksum_verification=True)
        # The Parquet footer's own key-value pairs; the base64 copy pyarrow keeps inside
        # ARROW:schema is never consulted, so there is exactly one place the key is read from.
        kv = pf.metadata.metadata or {}
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _corrupt(path, exc) from exc
    raw_meta = kv.get(FOOTER_KEY)
    if raw_meta is None:
        if TRACE_FOOTER_KEY in kv:
            raise ArtifactReadError(
                Reason.METADATA_INVALID,
                f"{path}: a draft-round trace table (footer key 'dspark.trace'), not a signed artifact; "
                "traces are never signed: give them to `dspark-calibrate fit --traces`",
            )
        raise ArtifactReadError(
            Reason.METADATA_INVALID,
            f"{path}: no 'dspark' footer key; not a dspark-calibrate artifact (a plain table is signed with "
            "`dspark-calibrate sign`)",
        )
    if len(raw_meta) > limits.max_metadata_bytes:
        raise ArtifactReadError(
            Reason.FOOTER_TOO_LARGE,
            f"{path}: 'dspark' footer value is {len(raw_meta)} bytes, above {limits.max_metadata_bytes}; refused unread",
        )
    measure = _check_table(pf, data, raw_meta, path, limits, kind)
    pending = _PendingTable(pf, path, background=background, measure=measure)
    try:
        metadata, envelope, detached = _read_footer_and_envelopes(path, raw_meta, limits)
    except ArtifactReadError:
        pending.result()  # a corrupt table is reported first, as in a sequential read
        raise
    return OpenedArtifact(
        path=path,
        metadata=metadata,
        envelope=envelope,
        detached_envelope=detached,
        file_bytes=size,
        pending=pending,
        file_metadata=MappingProxyType(dict(kv)),
    )


def _read_footer_and_envelopes(
    path: Path, raw_meta: bytes, limits: ReadLimits
) -> tuple[dict[str, Any], Mapping[str, Any] | None, bytes | None]:
    try:
        metadata = loads_strict(raw_meta, what=f"{path}: 'dspark' footer")
    except JsonError as exc:
        raise ArtifactReadError(Reason.METADATA_INVALID, str(exc)) from exc
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ArtifactReadError(
            Reason.METADATA_INVALID,
            f"{path}: 'dspark' footer is not a {FORMAT} document; the footer was edited or written by another "
            "tool: rebuild the artifact",
        )
    envelope = metadata.get("envelope")
    if envelope is not None and not isinstance(envelope, dict):
        raise ArtifactReadError(
            Reason.METADATA_INVALID,
            f"{path}: footer 'envelope' must be an object or null; the footer was edited: sign the artifact again",
        )
    dpath = detached_envelope_path(path)
    try:
        detached = read_regular_file(dpath, limits.max_envelope_bytes)
    except FileNotFoundError:
        detached = None
    except FileTooLarge as big:
        raise ArtifactReadError(
            Reason.ENVELOPE_TOO_LARGE,
            f"{dpath}: {big.size} bytes, above the {limits.max_envelope_bytes}-byte limit; remove or replace this "
            "detached envelope",
        ) from None
    except OSError as exc:
        raise ArtifactReadError(
            Reason.IO_ERROR,
            f"{dpath}: cannot read ({exc.strerror or exc}); check its permissions or remove it",
        ) from exc
    return metadata, envelope, detached
