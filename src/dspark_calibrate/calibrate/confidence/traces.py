"""Draft-round traces: one internal form, three readers (Parquet, JSONL, recorder shards), writers.

A *round* is one draft block of one request: K raw confidence logits, how many draft tokens the
target accepted, and how many positions it actually verified (K when uncensored; fewer when
dynamic verification trimmed the block, which censors the label of every later position, DESIGN
§8). This module turns files into a :class:`TraceSet` of numpy arrays and refuses every way a
trace can be wrong with a :class:`~dspark_calibrate.errors.ConfigError` naming the file, the row,
the field and the fix.

Readers stream in batches (``pyarrow`` ``iter_batches``, JSONL line chunks, one shard at a time),
so what stays in memory is the arrays themselves: 34 bytes per round at K=5 (float32 logits, int8
counts, int32 request code, int64 round); reading peaks at about 150 bytes per round while the
batches and the request-id strings coexist (docs/fit.md has the measurement). torch is imported only inside the recorder-shard reader,
and shards are loaded with ``weights_only=True`` because a pickled shard could otherwise run code.

Fitting, metrics and splitting by request are left to ``confidence``, ``metrics`` and ``fit``.

Example:
    >>> import numpy as np
    >>> from dspark_calibrate.calibrate.confidence.traces import TraceSet
    >>> ts = TraceSet.from_arrays(
    ...     request_ids=["a", "a", "b"], rounds=[0, 1, 0],
    ...     logits=np.zeros((3, 2), np.float32), accepted=[2, 0, 1], verified=[2, 2, 1])
    >>> ts.k, ts.rounds, ts.requests, ts.censored_rounds
    (2, 3, 2, 1)
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import re
import stat
import struct
import zipfile
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dspark_calibrate.artifacts import (
    FOOTER_KEY,
    TRACE_FOOTER_KEY,
    JsonError,
    atomic_write_bytes,
    canonical_json,
    loads_strict,
)
from dspark_calibrate.errors import ConfigError, InvalidValueError
from dspark_calibrate.schemas import SCHEMA_VERSION, arrow_schema

__all__ = [
    "DEFAULT_BATCH_ROWS",
    "MAX_K",
    "RECORDER_PAIRING",
    "TRACE_FOOTER_KEY",
    "TRACE_SUFFIXES",
    "KMismatch",
    "Notice",
    "TraceBatch",
    "TraceRecord",
    "TraceSet",
    "TraceSource",
    "expand_trace_paths",
    "iter_trace_batches",
    "parse_trace_record",
    "prefix_lengths",
    "read_recorder_shard",
    "read_traces",
    "trace_footer",
    "write_trace_jsonl",
    "write_trace_parquet",
]

#: Largest draft length accepted; far above any DSpark block, and small enough for int8 counts.
MAX_K = 64
#: Rounds per streamed batch (rows); about 34 MiB of arrays at K=5.
DEFAULT_BATCH_ROWS = 1 << 20
#: The only pairing of recorder shards whose logits belong to the exact draft pass that was
#: verified (TensorRT-LLM's DSpark recorder); any other pairing mislabels rounds (DESIGN §8).
RECORDER_PAIRING = "draft_seq_ring"
#: File suffixes recognised when a directory is given.
TRACE_SUFFIXES: Mapping[str, str] = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".pt": "recorder",
}
#: Rounds are stored as int64 but packed with the request code into one int64 key for the
#: duplicate check, so they must stay below 2**32.
_MAX_ROUND = (1 << 32) - 1
_REQUIRED_COLUMNS = ("request_id", "round", "logits", "accepted", "verified")
_OPTIONAL_COLUMNS = ("sampling", "temperature")
_JSONL_FIELDS = frozenset(_REQUIRED_COLUMNS + _OPTIONAL_COLUMNS)
#: Largest finite float32: logits are stored as float32, so a larger number cannot be a logit.
_FLOAT32_MAX = float(np.finfo(np.float32).max)
#: What ``torch.load`` raises on a file that is not a loadable torch.save payload (a truncated or
#: edited zip, a pickle the weights-only unpickler refuses or cannot follow; torch checks parts of
#: the format with ``assert``-style AssertionErrors). Anything else is a bug and is not caught here.
_SHARD_LOAD_ERRORS: tuple[type[BaseException], ...] = (
    pickle.UnpicklingError,
    AssertionError,
    RuntimeError,
    EOFError,
    OSError,
    ValueError,
    AttributeError,
    KeyError,
    IndexError,
    TypeError,
    OverflowError,
    struct.error,
    zipfile.BadZipFile,
)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # terminal colour codes some libraries put in messages


class KMismatch(ConfigError):
    """A file (or a round) whose draft length K differs from the one already established."""

    default_code = "K_MISMATCH"


@dataclass(frozen=True, slots=True)
class Notice:
    """A warning returned as data (never printed by the library).

    Attributes:
        code: stable short code, e.g. ``FEW_ROUNDS``, ``EMPTY_RISK_SET``, ``NO_REQUEST_IDS``.
        message: one human-readable line naming what is affected and what to do.
    """

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True, slots=True)
class TraceSource:
    """One input file: where it came from and what it held.

    Attributes:
        path: the file as given.
        format: ``parquet``, ``jsonl`` or ``recorder``.
        rounds: rounds read from it (after any sampling filter).
        sha256: SHA-256 of the file bytes (pins the input in the calibration's provenance).
        synthetic: True when the file says it was generated (``traces synth``).
    """

    path: str
    format: str
    rounds: int
    sha256: str
    synthetic: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "path": self.path,
            "format": self.format,
            "rounds": self.rounds,
            "sha256": self.sha256,
            "synthetic": self.synthetic,
        }


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One round as parsed from a JSON object (the JSONL reader's unit).

    Attributes:
        request_id: the request the round belongs to.
        round: the round's index within its request (>= 0).
        logits: K raw confidence logits.
        accepted: accepted draft tokens (0..verified).
        verified: positions the target checked (accepted..K).
        sampling: optional sampling-mode tag (e.g. ``greedy``).
        temperature: optional sampling temperature tag.
    """

    request_id: str
    round: int
    logits: tuple[float, ...]
    accepted: int
    verified: int
    sampling: str | None = None
    temperature: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the JSONL line format)."""
        out: dict[str, Any] = {
            "request_id": self.request_id,
            "round": self.round,
            "logits": list(self.logits),
            "accepted": self.accepted,
            "verified": self.verified,
        }
        if self.sampling is not None:
            out["sampling"] = self.sampling
        if self.temperature is not None:
            out["temperature"] = self.temperature
        return out


@dataclass(frozen=True, slots=True, eq=False)
class TraceBatch:
    """A chunk of rounds in the internal form (all arrays have one row per round).

    Attributes:
        request_id: request of each round (Arrow string array; kept in Arrow so 10M ids cost no
            Python objects).
        round: int64 round index within the request.
        logits: float32 array of shape (n, K).
        accepted: int8 accepted draft tokens.
        verified: int8 verified positions.
        sampling: optional Arrow string array of sampling tags (nulls allowed).
        temperature: optional float64 array of temperature tags (NaN where absent).
    """

    request_id: pa.Array
    round: np.ndarray
    logits: np.ndarray
    accepted: np.ndarray
    verified: np.ndarray
    sampling: pa.Array | None = None
    temperature: np.ndarray | None = None

    @property
    def rows(self) -> int:
        """Rounds in the batch."""
        return int(self.round.shape[0])

    @property
    def k(self) -> int:
        """Draft length (logits per round)."""
        return int(self.logits.shape[1])

    def to_arrow(self) -> pa.Table:
        """The batch as a table of the ``trace`` schema."""
        n, k = self.logits.shape
        values = pa.array(np.ascontiguousarray(self.logits, dtype=np.float32).reshape(-1))
        logits = pa.FixedSizeListArray.from_arrays(values, k).cast(pa.list_(pa.float32()))
        sampling = self.sampling if self.sampling is not None else pa.nulls(n, pa.string())
        if self.temperature is not None:
            temperature = pa.array(self.temperature, pa.float64(), mask=np.isnan(self.temperature))
        else:
            temperature = pa.nulls(n, pa.float64())
        columns = [
            self.request_id.cast(pa.string()),
            pa.array(self.round, pa.int64()),
            logits,
            pa.array(self.accepted.astype(np.int64)),
            pa.array(self.verified.astype(np.int64)),
            sampling.cast(pa.string()),
            temperature,
        ]
        return pa.Table.from_arrays(columns, schema=arrow_schema("trace"))


@dataclass(frozen=True, slots=True, eq=False)
class TraceSet:
    """Every round of a calibration input, in memory, with request ids as integer codes.

    Attributes:
        k: draft length.
        request_names: distinct request ids; ``request`` indexes into it.
        request: int32 request code per round.
        round: int64 round index per round.
        logits: float32 (n, K) raw confidence logits.
        accepted: int8 accepted draft tokens.
        verified: int8 verified positions (K when uncensored).
        sources: the files read.
        sampling_tags: ``(tag, rounds)`` pairs; tag ``sampling@temperature`` with ``-`` for absent.
        notices: reader warnings (e.g. shards without request ids).
    """

    k: int
    request_names: tuple[str, ...]
    request: np.ndarray
    round: np.ndarray
    logits: np.ndarray
    accepted: np.ndarray
    verified: np.ndarray
    sources: tuple[TraceSource, ...] = ()
    sampling_tags: tuple[tuple[str, int], ...] = ()
    notices: tuple[Notice, ...] = ()

    def __post_init__(self) -> None:
        n = self.round.shape[0]
        if self.logits.ndim != 2 or self.logits.shape != (n, self.k):
            raise InvalidValueError(f"logits must have shape ({n}, {self.k}), got {self.logits.shape}")
        for name in ("request", "accepted", "verified"):
            if getattr(self, name).shape != (n,):
                raise InvalidValueError(f"{name} must have shape ({n},), got {getattr(self, name).shape}")

    @classmethod
    def from_arrays(
        cls,
        *,
        request_ids: Sequence[str] | np.ndarray | pa.Array,
        rounds: Sequence[int] | np.ndarray,
        logits: np.ndarray | Sequence[Sequence[float]],
        accepted: Sequence[int] | np.ndarray,
        verified: Sequence[int] | np.ndarray,
        where: str = "<arrays>",
    ) -> TraceSet:
        """Build and validate a trace set from plain arrays (tests, generators, adapters).

        Raises:
            ConfigError: any row is invalid (same checks as the file readers).
        """
        ids = request_ids if isinstance(request_ids, pa.Array) else pa.array(list(request_ids), pa.string())
        batch = _make_batch(
            where=where,
            row_offset=0,
            request_id=ids,
            round_=np.asarray(rounds),
            logits=np.asarray(logits, dtype=np.float32),
            accepted=np.asarray(accepted),
            verified=np.asarray(verified),
            k=None,
        )
        return _assemble([batch], batch.k, sources=(), notices=(), tags=Counter(), where=where)

    @property
    def rounds(self) -> int:
        """Number of rounds."""
        return int(self.round.shape[0])

    @property
    def requests(self) -> int:
        """Number of distinct requests."""
        return len(self.request_names)

    @property
    def censored_rounds(self) -> int:
        """Rounds whose block was not fully verified (verified < K)."""
        return int(np.count_nonzero(self.verified < self.k))

    @property
    def synthetic(self) -> bool:
        """True when any source file was generated rather than recorded."""
        return any(s.synthetic for s in self.sources)

    def rounds_per_request(self) -> np.ndarray:
        """Rounds of each request (indexed by request code)."""
        return np.bincount(self.request, minlength=self.requests)

    def subset(self, mask: np.ndarray) -> TraceSet:
        """The rounds where ``mask`` is True (request names are kept; codes stay valid)."""
        return TraceSet(
            k=self.k,
            request_names=self.request_names,
            request=self.request[mask],
            round=self.round[mask],
            logits=self.logits[mask],
            accepted=self.accepted[mask],
            verified=self.verified[mask],
            sources=self.sources,
            sampling_tags=self.sampling_tags,
            notices=self.notices,
        )

    def with_verified(self, verified: np.ndarray) -> TraceSet:
        """A copy with another ``verified`` column (re-validated against ``accepted`` and K).

        Raises:
            ConfigError: a round would have accepted > verified or verified > K.
        """
        _check_counts("<with_verified>", 0, self.accepted, np.asarray(verified), self.k, None)
        return TraceSet(
            k=self.k,
            request_names=self.request_names,
            request=self.request,
            round=self.round,
            logits=self.logits,
            accepted=self.accepted,
            verified=np.asarray(verified).astype(np.int8),
            sources=self.sources,
            sampling_tags=self.sampling_tags,
            notices=self.notices,
        )

    def batches(self, batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[TraceBatch]:
        """The rounds as batches (for writers)."""
        names = pa.array(self.request_names, pa.string())
        for start in range(0, max(self.rounds, 1), batch_rows):
            stop = min(start + batch_rows, self.rounds)
            if stop <= start:
                return
            yield TraceBatch(
                request_id=names.take(pa.array(self.request[start:stop])),
                round=self.round[start:stop],
                logits=self.logits[start:stop],
                accepted=self.accepted[start:stop],
                verified=self.verified[start:stop],
            )


# --------------------------------------------------------------------------------------------
# Validation shared by every reader


def _row_label(
    where: str, row: int, request_id: pa.Array | None, local: int, rounds: np.ndarray | None
) -> str:
    label = f"{where}: row {row}"
    if request_id is not None and 0 <= local < len(request_id):
        label += f" (request {request_id[local].as_py()!r}"
        label += f", round {int(rounds[local])})" if rounds is not None else ")"
    return label


def _check_counts(
    where: str,
    row_offset: int,
    accepted: np.ndarray,
    verified: np.ndarray,
    k: int,
    request_id: pa.Array | None,
    rounds: np.ndarray | None = None,
) -> None:
    """Refuse accepted/verified outside 0 <= accepted <= verified <= K, naming the first bad row."""
    checks = (
        (accepted < 0, "accepted", "is negative; it counts accepted draft tokens (0..K)"),
        (
            verified < 0,
            "verified",
            "is negative; it counts positions the target checked (K when the whole block was verified)",
        ),
        (
            verified > k,
            "verified",
            f"exceeds K={k}; a block has only K draft positions. Is the file from a longer "
            "draft length, or is verified counting the anchor token?",
        ),
        (
            accepted > verified,
            "accepted",
            "exceeds verified; the target cannot accept a position it did not check. Fix the "
            "exporter (accepted must count only verified positions)",
        ),
    )
    for bad, name, why in checks:
        if bad.any():
            local = int(np.flatnonzero(bad)[0])
            value = int(accepted[local] if name == "accepted" else verified[local])
            extra = f" (verified={int(verified[local])})" if name == "accepted" and value >= 0 else ""
            raise ConfigError(
                f"{_row_label(where, row_offset + local, request_id, local, rounds)}: "
                f"{name}={value}{extra} {why}; {int(bad.sum())} row(s) affected"
            )


def _as_int_array(where: str, name: str, values: np.ndarray) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise ConfigError(f"{where}: field {name!r} must hold integers, found {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ConfigError(f"{where}: field {name!r} must hold whole numbers")
        arr = arr.astype(np.int64)
    return arr.astype(np.int64, copy=False)


def _utf8_column(where: str, row_offset: int, name: str, values: pa.Array) -> pa.Array:
    """``values`` as an Arrow string array of valid UTF-8, or a ConfigError naming the first bad row.

    Parquet and Arrow do not check UTF-8 when reading, so invalid bytes would only fail later,
    far from the file; this checks once, in C++ (the row is found only on failure).
    """
    try:
        out = values.cast(pa.string())
        out.validate(full=True)
        return out
    except (pa.ArrowException, ValueError):
        pass
    try:
        raw = values.cast(pa.binary()).to_pylist()
    except (pa.ArrowException, ValueError):
        raise ConfigError(
            f"{where}: column {name!r} has type {values.type}, expected strings (or integers for request_id)"
        ) from None
    for local, item in enumerate(raw):
        if item is None:
            continue
        try:
            item.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"{where}: row {row_offset + local}: {name} holds bytes that are not UTF-8 "
                f"({item[exc.start : exc.start + 4]!r} at byte {exc.start}); fix the exporter's text encoding"
            ) from None
    raise ConfigError(f"{where}: column {name!r} is not valid UTF-8 text")


def _make_batch(
    *,
    where: str,
    row_offset: int,
    request_id: pa.Array,
    round_: np.ndarray,
    logits: np.ndarray,
    accepted: np.ndarray,
    verified: np.ndarray,
    k: int | None,
    sampling: pa.Array | None = None,
    temperature: np.ndarray | None = None,
) -> TraceBatch:
    """Validate one chunk and convert it to the internal dtypes."""
    if logits.ndim != 2:
        raise ConfigError(f"{where}: logits must be a (rounds, K) matrix, got shape {logits.shape}")
    n, kk = logits.shape
    if k is not None and kk != k:
        raise KMismatch(
            f"{where}: logits have K={kk} values per round, expected K={k}; every round of every "
            "file must come from one draft length (fit each K separately)"
        )
    if not 1 <= kk <= MAX_K:
        raise ConfigError(f"{where}: logits have K={kk} values per round; K must be in 1..{MAX_K}")
    if len(request_id) != n or round_.shape != (n,) or accepted.shape != (n,) or verified.shape != (n,):
        raise ConfigError(f"{where}: columns have different lengths (logits has {n} rows)")
    if request_id.null_count:
        local = int(np.flatnonzero(request_id.is_null().to_numpy(zero_copy_only=False))[0])
        raise ConfigError(
            f"{where}: row {row_offset + local}: request_id is null; every round needs its request"
        )
    request_id = _utf8_column(where, row_offset, "request_id", request_id)
    if sampling is not None:
        sampling = _utf8_column(where, row_offset, "sampling", sampling)
    rounds = _as_int_array(where, "round", round_)
    acc = _as_int_array(where, "accepted", accepted)
    ver = _as_int_array(where, "verified", verified)
    finite = np.isfinite(logits)
    if not finite.all():
        bad_rows = ~finite.all(axis=1)
        local = int(np.flatnonzero(bad_rows)[0])
        pos = int(np.flatnonzero(~finite[local])[0]) + 1
        raise ConfigError(
            f"{_row_label(where, row_offset + local, request_id, local, rounds)}: logits[{pos}] is "
            f"{float(logits[local, pos - 1])!r} (NaN/Inf or null); every logit must be finite. "
            f"{int(bad_rows.sum())} row(s) affected; check the recorder's dtype (fp16 overflow?)"
        )
    if (rounds < 0).any() or (rounds > _MAX_ROUND).any():
        local = int(np.flatnonzero((rounds < 0) | (rounds > _MAX_ROUND))[0])
        raise ConfigError(
            f"{_row_label(where, row_offset + local, request_id, local, None)}: round={int(rounds[local])} "
            f"must be in 0..{_MAX_ROUND}"
        )
    _check_counts(where, row_offset, acc, ver, kk, request_id, rounds)
    if temperature is not None:
        t = np.asarray(temperature, dtype=np.float64)
        present = ~np.isnan(t)
        if (present & ~(np.isfinite(t) & (t >= 0))).any():
            local = int(np.flatnonzero(present & ~(np.isfinite(t) & (t >= 0)))[0])
            raise ConfigError(
                f"{where}: row {row_offset + local}: temperature={float(t[local])!r} must be a finite "
                "number >= 0 (or absent)"
            )
        temperature = t
    return TraceBatch(
        request_id=request_id,
        round=rounds,
        logits=np.ascontiguousarray(logits, dtype=np.float32),
        accepted=acc.astype(np.int8),
        verified=ver.astype(np.int8),
        sampling=sampling,
        temperature=temperature,
    )


def _tag_counts(batch: TraceBatch) -> Counter[str]:
    """Count rounds per ``sampling@temperature`` tag (``-`` marks an absent tag)."""
    untagged_sampling = batch.sampling is None or batch.sampling.null_count == len(batch.sampling)
    untagged_temperature = batch.temperature is None or bool(np.isnan(batch.temperature).all())
    if untagged_sampling and untagged_temperature:
        return Counter({"-@-": batch.rows})
    sampling = batch.sampling if batch.sampling is not None else pa.nulls(batch.rows, pa.string())
    temp = batch.temperature if batch.temperature is not None else np.full(batch.rows, np.nan)
    temp_text = pa.array(np.where(np.isnan(temp), -1.0, np.round(temp, 6)))
    table = pa.table({"s": sampling.fill_null("-"), "t": temp_text})
    grouped = table.group_by(["s", "t"]).aggregate([([], "count_all")])
    out: Counter[str] = Counter()
    for s, t, c in zip(
        grouped.column("s").to_pylist(),
        grouped.column("t").to_pylist(),
        grouped.column("count_all").to_pylist(),
        strict=True,
    ):
        out[f"{s}@{'-' if t < 0 else format(t, 'g')}"] += int(c)
    return out


def _filter_sampling(batch: TraceBatch, sampling: str | None) -> TraceBatch:
    if sampling is None:
        return batch
    if batch.sampling is None:
        keep = np.zeros(batch.rows, dtype=bool)
    else:
        keep = pc.fill_null(pc.equal(batch.sampling, sampling), False).to_numpy(zero_copy_only=False)
    if keep.all():
        return batch
    mask = pa.array(keep)
    return TraceBatch(
        request_id=batch.request_id.filter(mask),
        round=batch.round[keep],
        logits=batch.logits[keep],
        accepted=batch.accepted[keep],
        verified=batch.verified[keep],
        sampling=batch.sampling.filter(mask) if batch.sampling is not None else None,
        temperature=batch.temperature[keep] if batch.temperature is not None else None,
    )


# --------------------------------------------------------------------------------------------
# JSONL


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (a 400-digit integer makes no readable message)."""
    if isinstance(value, int) and value.bit_length() > 3 * limit:  # str() of it may be refused
        digits = int(value.bit_length() * math.log10(2)) + 1
        if abs(value) < 10 ** (digits - 1):
            digits -= 1
        return f"<an integer of {digits} digits>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _check_text(where: str, name: str, value: str) -> None:
    """Refuse a string that UTF-8 cannot encode (a lone surrogate from a JSON ``\\ud800`` escape)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{where}: field {name!r} holds {value[exc.start : exc.end]!r} at character {exc.start}, a lone "
            "surrogate that is not Unicode text; fix the exporter's string escaping"
        ) from None


def _logit(where: str, name: str, value: float) -> float:
    """A finite logit that fits float32, or a ConfigError naming ``name``."""
    try:
        x = float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise ConfigError(
            f"{where}: {name} is {_short(value)}, too large for a number; every logit must be a finite "
            "float32 value"
        ) from None
    if not math.isfinite(x):
        raise ConfigError(f"{where}: {name} is {value!r}; every logit must be finite (NaN/Inf refused)")
    if abs(x) > _FLOAT32_MAX:
        raise ConfigError(
            f"{where}: {name} is {x!r}, beyond float32's range (±{_FLOAT32_MAX:.4g}); every logit must be a "
            "finite float32 value"
        )
    return x


def parse_trace_record(obj: Any, *, where: str = "<record>") -> TraceRecord:
    """Parse one round from a decoded JSON object (the JSONL line format).

    Required fields: ``request_id`` (string, or integer written in decimal), ``round`` (int >= 0),
    ``logits`` (list of finite numbers), ``accepted`` and ``verified`` (ints with
    0 <= accepted <= verified <= len(logits)). Optional: ``sampling`` (string or null),
    ``temperature`` (number >= 0 or null). Unknown fields are refused so a misspelt ``verified``
    cannot silently become "uncensored".

    Args:
        obj: the decoded JSON value.
        where: how to name the record in messages (file and line).

    Raises:
        ConfigError: the record is not a valid round.
    """
    _check_record_fields(obj, where)
    rid = obj["request_id"]
    if isinstance(rid, bool) or not isinstance(rid, str | int) or (isinstance(rid, str) and not rid):
        raise ConfigError(
            f"{where}: field 'request_id' must be a non-empty string or an integer, got {_short(rid)}"
        )
    if isinstance(rid, str):
        _check_text(where, "request_id", rid)
    ints: dict[str, int] = {}
    for name in ("round", "accepted", "verified"):
        value = obj[name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: field {name!r} must be an integer, got {value!r}")
        ints[name] = value
    values = _record_logits(obj["logits"], where)
    k = len(values)
    if k > MAX_K:
        raise ConfigError(f"{where}: {k} logits; K must be in 1..{MAX_K}")
    if not 0 <= ints["round"] <= _MAX_ROUND:
        raise ConfigError(f"{where}: round={ints['round']} must be in 0..{_MAX_ROUND}")
    if ints["verified"] < 0 or ints["verified"] > k:
        raise ConfigError(f"{where}: verified={ints['verified']} must be in 0..K (K={k} logits)")
    if ints["accepted"] < 0 or ints["accepted"] > ints["verified"]:
        raise ConfigError(
            f"{where}: accepted={ints['accepted']} must be in 0..verified (verified={ints['verified']}); "
            "the target cannot accept a position it did not check"
        )
    sampling = obj.get("sampling")
    if sampling is not None and not isinstance(sampling, str):
        raise ConfigError(f"{where}: field 'sampling' must be a string or null, got {_short(sampling)}")
    if sampling is not None:
        _check_text(where, "sampling", sampling)
    return TraceRecord(
        request_id=str(rid),
        round=ints["round"],
        logits=tuple(values),
        accepted=ints["accepted"],
        verified=ints["verified"],
        sampling=sampling,
        temperature=_record_temperature(obj.get("temperature"), where),
    )


def _check_record_fields(obj: Any, where: str) -> None:
    """A JSONL record is an object with every required field and no unknown one.

    Raises:
        ConfigError: another value, an unknown field (a misspelling), or a missing one.
    """
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: expected a JSON object per line, found {type(obj).__name__}")
    unknown = sorted(set(obj) - _JSONL_FIELDS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown field(s) {unknown}; allowed: {sorted(_JSONL_FIELDS)} (check the spelling)"
        )
    missing = [f for f in _REQUIRED_COLUMNS if f not in obj]
    if missing:
        hint = " (use verified=K for a fully verified block)" if "verified" in missing else ""
        raise ConfigError(f"{where}: missing field(s) {missing}{hint}")


def _record_logits(logits: Any, where: str) -> list[float]:
    """A record's ``logits``: a non-empty list of finite numbers.

    Raises:
        ConfigError: anything else, naming the first bad entry.
    """
    if not isinstance(logits, list) or not logits:
        raise ConfigError(f"{where}: field 'logits' must be a non-empty list of numbers, got {logits!r}")
    values: list[float] = []
    for i, v in enumerate(logits, start=1):
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(f"{where}: logits[{i}] must be a number, got {_short(v)}")
        values.append(_logit(where, f"logits[{i}]", v))
    return values


def _record_temperature(given: Any, where: str) -> float | None:
    """A record's optional ``temperature``: None, or a finite number >= 0.

    Raises:
        ConfigError: anything else.
    """
    if given is None:
        return None
    if isinstance(given, bool) or not isinstance(given, int | float):
        raise ConfigError(f"{where}: field 'temperature' must be a number or null, got {_short(given)}")
    try:
        temperature = float(given)
    except OverflowError:
        temperature = math.inf  # an integer too large for a float: refused just below
    if not math.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"{where}: temperature={_short(given)} must be a finite number >= 0")
    return temperature


def _records_to_batch(records: list[TraceRecord], where: str, row_offset: int, k: int | None) -> TraceBatch:
    kk = k if k is not None else len(records[0].logits)
    for i, rec in enumerate(records):
        if len(rec.logits) != kk:
            raise KMismatch(
                f"{where}: row {row_offset + i} (request {rec.request_id!r}, round {rec.round}) has "
                f"{len(rec.logits)} logits, expected K={kk}; every round must come from one draft length"
            )
    has_tags = any(r.sampling is not None or r.temperature is not None for r in records)
    return _make_batch(
        where=where,
        row_offset=row_offset,
        request_id=pa.array([r.request_id for r in records], pa.string()),
        round_=np.fromiter((r.round for r in records), np.int64, len(records)),
        logits=np.array([r.logits for r in records], dtype=np.float32),
        accepted=np.fromiter((r.accepted for r in records), np.int64, len(records)),
        verified=np.fromiter((r.verified for r in records), np.int64, len(records)),
        k=kk,
        sampling=pa.array([r.sampling for r in records], pa.string()) if has_tags else None,
        temperature=(
            np.array([np.nan if r.temperature is None else r.temperature for r in records], np.float64)
            if has_tags
            else None
        ),
    )


def _iter_jsonl(path: Path, k: int | None, batch_rows: int) -> Iterator[TraceBatch]:
    records: list[TraceRecord] = []
    row = 0
    first_row = 0
    try:
        with path.open("r", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                where = f"{path}: line {lineno}"
                try:
                    # Untrusted: the strict loader refuses duplicate keys, NaN/Infinity, huge
                    # literals and deep nesting, as for every JSON document this package reads.
                    obj = loads_strict(line, what=where)
                except JsonError as exc:
                    raise ConfigError(f"{exc}; one JSON object per line") from None
                rec = parse_trace_record(obj, where=where)
                if k is None:
                    k = len(rec.logits)
                elif len(rec.logits) != k:
                    raise KMismatch(
                        f"{where}: {len(rec.logits)} logits, expected K={k}; every round of every file must "
                        "come from one draft length (fit each K separately)"
                    )
                records.append(rec)
                row += 1
                if len(records) >= batch_rows:
                    batch = _records_to_batch(records, str(path), first_row, k)
                    k = batch.k
                    yield batch
                    records, first_row = [], row
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc}); JSONL traces are UTF-8") from None
    if records:
        yield _records_to_batch(records, str(path), first_row, k)


def write_trace_jsonl(path: Path | str, traces: TraceSet) -> None:
    """Write a trace set as JSONL (one round per line), atomically.

    Raises:
        OSError: the file cannot be written.
    """
    lines = []
    names = traces.request_names
    for i in range(traces.rounds):
        rec = TraceRecord(
            request_id=names[int(traces.request[i])],
            round=int(traces.round[i]),
            logits=tuple(float(v) for v in traces.logits[i]),
            accepted=int(traces.accepted[i]),
            verified=int(traces.verified[i]),
        )
        lines.append(json.dumps(rec.to_dict(), separators=(",", ":")))
    atomic_write_bytes(Path(path), ("\n".join(lines) + "\n").encode("utf-8"))


# --------------------------------------------------------------------------------------------
# Parquet


def trace_footer(
    *, synthetic: bool, generator: Mapping[str, Any] | None = None, k: int | None = None
) -> dict[str, Any]:
    """The ``dspark.trace`` footer document of a trace file written by this package."""
    return {
        "kind": "trace",
        "schema_version": SCHEMA_VERSION["trace"],
        "k": k,
        "synthetic": synthetic,
        "generator": dict(generator) if generator is not None else None,
    }


def _parquet_footer(path: Path, pf: pq.ParquetFile) -> dict[str, Any]:
    try:
        raw = (pf.schema_arrow.metadata or {}).get(TRACE_FOOTER_KEY)
    except (pa.ArrowException, ValueError) as exc:
        raise ConfigError(f"{path}: unreadable Parquet schema metadata ({exc})") from exc
    if raw is None:
        return {}
    try:
        doc = loads_strict(raw, what=f"{path}: the 'dspark.trace' footer")
    except JsonError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: the 'dspark.trace' footer must be a JSON object")
    version = doc.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION["trace"]:
        raise ConfigError(
            f"{path}: trace schema_version {version!r} is not supported (this version reads up to "
            f"{SCHEMA_VERSION['trace']}); upgrade dspark-calibrate"
        )
    return doc


def _list_to_matrix(where: str, col: pa.Array, row_offset: int, k: int | None) -> np.ndarray:
    if pa.types.is_fixed_size_list(col.type):
        width = col.type.list_size
        if col.null_count:
            local = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            raise ConfigError(
                f"{where}: row {row_offset + local}: logits is null; every round needs K logits"
            )
        values = col.flatten()
        return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, width)
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):
        raise ConfigError(f"{where}: column 'logits' has type {col.type}, expected list<float32>")
    if col.null_count:
        local = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise ConfigError(f"{where}: row {row_offset + local}: logits is null; every round needs K logits")
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    if len(lengths) == 0:
        return np.zeros((0, k or 0), np.float32)
    width = k if k is not None else int(lengths[0])
    if (lengths != width).any():
        local = int(np.flatnonzero(lengths != width)[0])
        raise KMismatch(
            f"{where}: row {row_offset + local} has {int(lengths[local])} logits, expected K={width}; "
            "every round of every file must come from one draft length (fit each K separately)"
        )
    values = col.flatten()
    if not pa.types.is_floating(values.type) and not pa.types.is_integer(values.type):
        raise ConfigError(f"{where}: logits hold {values.type}, expected float32 numbers")
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, width)


def _open_parquet(path: Path) -> tuple[pq.ParquetFile, list[str]]:
    """The file and its column names, or a ConfigError (corrupt footer, names that are not UTF-8)."""
    try:
        pf = pq.ParquetFile(path)
        return pf, list(pf.schema_arrow.names)
    except (pa.ArrowException, OSError, ValueError) as exc:  # ValueError: UnicodeDecodeError
        raise ConfigError(
            f"{path}: not a readable Parquet file ({exc}); copy it again from its source"
        ) from exc


def _iter_parquet(path: Path, k: int | None, batch_rows: int) -> Iterator[TraceBatch]:
    pf, names = _open_parquet(path)
    _parquet_footer(path, pf)
    missing = [c for c in _REQUIRED_COLUMNS if c not in names]
    if missing:
        raise ConfigError(
            f"{path}: missing column(s) {missing}; the trace schema needs {list(_REQUIRED_COLUMNS)} "
            f"(optional {list(_OPTIONAL_COLUMNS)}); see docs/fit.md"
        )
    columns = list(_REQUIRED_COLUMNS) + [c for c in _OPTIONAL_COLUMNS if c in names]
    row = 0
    try:
        for rb in pf.iter_batches(batch_size=batch_rows, columns=columns):
            where = str(path)
            logits = _list_to_matrix(where, rb.column("logits"), row, k)
            sampling = rb.column("sampling") if "sampling" in rb.schema.names else None
            temperature = None
            if "temperature" in rb.schema.names:
                temperature = pc.fill_null(
                    rb.column("temperature").cast(pa.float64()), float("nan")
                ).to_numpy(zero_copy_only=False)
            for name in ("round", "accepted", "verified"):
                if rb.column(name).null_count:
                    local = int(np.flatnonzero(rb.column(name).is_null().to_numpy(zero_copy_only=False))[0])
                    raise ConfigError(f"{where}: row {row + local}: {name} is null; it is required")
            batch = _make_batch(
                where=where,
                row_offset=row,
                request_id=rb.column("request_id"),
                round_=rb.column("round").to_numpy(zero_copy_only=False),
                logits=logits,
                accepted=rb.column("accepted").to_numpy(zero_copy_only=False),
                verified=rb.column("verified").to_numpy(zero_copy_only=False),
                k=k,
                sampling=sampling,
                temperature=temperature,
            )
            k = batch.k
            row += batch.rows
            yield batch
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ConfigError(f"{path}: corrupt or unreadable Parquet at row {row} ({exc})") from exc


def write_trace_parquet(
    path: Path | str,
    batches: Iterable[TraceBatch],
    *,
    footer: Mapping[str, Any] | None = None,
    compression: str = "zstd",
) -> int:
    """Write batches as a trace Parquet file (one row group per batch), atomically.

    Args:
        path: destination.
        batches: the rounds; every batch must have the same K.
        footer: the ``dspark.trace`` document (see :func:`trace_footer`); default: not synthetic.
        compression: Parquet compression codec.

    Returns:
        Rounds written.

    Raises:
        ConfigError: batches disagree on K.
        OSError: the file cannot be written.
    """
    path = Path(path)
    schema = arrow_schema("trace")
    sink = pa.BufferOutputStream()
    rows = 0
    k: int | None = None
    doc = dict(footer) if footer is not None else trace_footer(synthetic=False)
    writer: pq.ParquetWriter | None = None
    try:
        for batch in batches:
            if k is not None and batch.k != k:
                raise ConfigError(f"{path}: batches have K={batch.k} and K={k}; a trace file holds one K")
            k = batch.k
            if writer is None:
                doc.setdefault("k", k)
                if doc.get("k") is None:
                    doc["k"] = k
                meta = {TRACE_FOOTER_KEY: canonical_json(doc)}
                writer = pq.ParquetWriter(sink, schema.with_metadata(meta), compression=compression)
            writer.write_table(batch.to_arrow().replace_schema_metadata(writer.schema.metadata))
            rows += batch.rows
        if writer is None:
            meta = {TRACE_FOOTER_KEY: canonical_json(doc)}
            writer = pq.ParquetWriter(sink, schema.with_metadata(meta), compression=compression)
    finally:
        if writer is not None:
            writer.close()
    atomic_write_bytes(path, bytes(sink.getvalue().to_pybytes()))
    return rows


# --------------------------------------------------------------------------------------------
# TensorRT-LLM recorder shards


def prefix_lengths(mask: np.ndarray, *, where: str = "<mask>") -> np.ndarray:
    """Accepted lengths from a prefix mask, refusing masks that are not prefixes.

    Args:
        mask: (n, K) array of 0/1 (or bool); 1 means the position lies inside the accepted prefix.
        where: how to name the source in messages.

    Returns:
        int64 array of n accepted lengths (the number of leading ones).

    Raises:
        ConfigError: values other than 0/1, or a 1 after a 0 in some row.
    """
    m = np.asarray(mask)
    if m.ndim != 2:
        raise ConfigError(f"{where}: prefix_mask must be a (rounds, K) matrix, got shape {m.shape}")
    if m.dtype != np.bool_:
        if not np.isin(m, (0, 1)).all():
            bad = int(np.flatnonzero(~np.isin(m, (0, 1)).all(axis=1))[0])
            raise ConfigError(
                f"{where}: prefix_mask row {bad} holds values other than 0/1: {m[bad].tolist()}"
            )
        m = m.astype(np.bool_)
    if m.shape[1] > 1:
        rises = m[:, 1:] & ~m[:, :-1]
        if rises.any():
            bad_rows = rises.any(axis=1)
            bad = int(np.flatnonzero(bad_rows)[0])
            raise ConfigError(
                f"{where}: prefix_mask row {bad} is {m[bad].astype(int).tolist()}, not a prefix (a 1 "
                f"after a 0); {int(bad_rows.sum())} row(s) affected. The mask must mark the accepted "
                "prefix; was it built from per-position matches instead?"
            )
    return np.asarray(m.sum(axis=1), dtype=np.int64)


def _tensor_to_numpy(value: Any, where: str, name: str, *, numeric: bool = True) -> np.ndarray:
    """A shard field as a numpy array: a dense tensor, or a (rectangular) list of numbers.

    Raises:
        ConfigError: a sparse or quantized tensor, a ragged list, or (with ``numeric``) values
            that are not numbers; the message names the file, the field and the fix.
    """
    import torch  # the recorder-shard reader is the only place that needs torch

    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized:
            raise ConfigError(
                f"{where}: {name!r} is a {value.layout} tensor; save a dense one (tensor.to_dense())"
            )
        t = value.detach().cpu()
        if t.is_complex():
            raise ConfigError(f"{where}: {name!r} holds complex numbers ({t.dtype}); save real values")
        if t.is_floating_point() and t.dtype != torch.float32 and t.dtype != torch.float64:
            t = t.float()
        return np.asarray(t.numpy())
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{where}: {name!r} must be a tensor, got {type(value).__name__}")
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError) as exc:  # ragged nesting, mixed types
        raise ConfigError(
            f"{where}: {name!r} is not a rectangular array ({exc}); save it as a tensor of one shape"
        ) from None
    if numeric and arr.dtype.kind not in "biuf":
        raise ConfigError(
            f"{where}: {name!r} must hold numbers, found {arr.dtype} values; save a numeric tensor"
        )
    return arr


def _shard_request_ids(raw: Any, where: str) -> pa.Array:
    """A shard's ``request_ids`` (a tensor or list of integers or strings) as Arrow strings.

    Raises:
        ConfigError: another type of id, a nested list, or a string that is not Unicode text.
    """
    values = raw if isinstance(raw, list | tuple) else _tensor_to_numpy(raw, where, "request_ids").reshape(-1)
    out = []
    for i, v in enumerate(values):
        if isinstance(v, str):
            _check_text(where, f"request_ids[{i}]", v)
            out.append(v)
        elif (
            isinstance(v, int | np.integer)
            and not isinstance(v, bool | np.bool_)
            and int(v).bit_length() <= 128
        ):
            out.append(str(int(v)))
        else:
            raise ConfigError(
                f"{where}: request_ids[{i}] is {_short(v)}; request ids are strings or integers of at "
                "most 128 bits"
            )
    return pa.array(out, pa.string())


def load_shard(path: Path | str) -> Any:
    """``torch.load`` a shard as data (``weights_only=True``: a pickle could otherwise run code).

    Shared by the trace and workload readers.

    Raises:
        ConfigError: torch is missing, or the file is not a loadable torch.save payload (truncated,
            edited, not a zip or pickle); the message names the file and the fix.
    """
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read ({exc.strerror or exc}); check the path") from exc
    if not stat.S_ISREG(mode):  # a FIFO would block torch.load forever
        raise ConfigError(f"{p}: not a regular file (a FIFO, device or directory); pass a .pt shard")
    try:
        import torch
    except ImportError as exc:
        raise ConfigError(f"{path}: reading .pt recorder shards needs torch; install it") from exc
    try:
        return torch.load(p, map_location="cpu", weights_only=True)
    except OSError as exc:  # before the decoding errors: the file itself could not be read
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc}); check the path") from exc
    except pickle.UnpicklingError as exc:
        raise ConfigError(
            f"{path}: cannot load as a recorder shard: it holds objects the safe (weights-only) loader "
            "refuses, or is not a pickle; a shard holds only tensors, numbers, strings, lists and dicts"
        ) from exc
    except _SHARD_LOAD_ERRORS as exc:
        text = _ANSI.sub("", str(exc))
        detail = text.splitlines()[0][:200] if text else ""
        raise ConfigError(
            f"{path}: cannot load as a recorder shard ({type(exc).__name__}{': ' + detail if detail else ''}); "
            "expected a torch.save'd dict of tensors: copy it again from the recorder"
        ) from exc


def read_recorder_shard(
    path: Path | str, *, k: int | None = None, first_round: Mapping[str, int] | None = None
) -> tuple[TraceBatch, tuple[Notice, ...]]:
    """Read one TensorRT-LLM DSpark recorder shard (``*.pt``, a torch-saved dict).

    Expected keys: ``logits`` [N, K] float, ``prefix_mask`` [N, K] (1 inside the accepted prefix),
    ``meta`` with ``pairing == "draft_seq_ring"`` and ``block_size == K``. Optional: ``verified``
    [N] (defaults to K: the recorder logs fully verified blocks), ``request_ids`` [N] (ints or
    strings; top level or in ``meta``) and ``rounds`` [N]. Without request ids each row is its own
    request and a ``NO_REQUEST_IDS`` notice says so.

    Args:
        path: the shard.
        k: the expected draft length (from earlier files or ``--k``), if known.
        first_round: per request id, the round index its rounds continue from when the shard has
            no ``rounds`` tensor (a request that spans shards; :func:`read_traces` passes the
            rounds already read from earlier shards).

    Returns:
        The rounds and any notices.

    Raises:
        ConfigError: unreadable shard, wrong or missing pairing, block size disagreeing with K or
            the logits, a non-prefix mask, NaN/Inf logits, or inconsistent shapes.
    """
    path = Path(path)
    where = str(path)
    obj = load_shard(path)
    meta = _shard_meta(obj, where)
    logits, mask, block = _shard_matrices(obj, meta, where, k)
    accepted = prefix_lengths(mask, where=where)
    n = logits.shape[0]
    if "verified" in obj:
        verified = _tensor_to_numpy(obj["verified"], where, "verified").reshape(-1)
    else:
        verified = np.full(n, block, dtype=np.int64)
    raw_ids = obj.get("request_ids", meta.get("request_ids"))
    ids, notices = _shard_ids(raw_ids, n, path)
    if "rounds" in obj:
        rounds = _tensor_to_numpy(obj["rounds"], where, "rounds").reshape(-1)
    elif raw_ids is None or n == 0:
        rounds = np.zeros(n, dtype=np.int64)
    else:
        rounds = _rounds_by_request(ids, first_round)
    with np.errstate(over="ignore"):  # values beyond float32 become inf, refused by _make_batch
        logits32 = logits.astype(np.float32, copy=False)
    batch = _make_batch(
        where=where,
        row_offset=0,
        request_id=ids,
        round_=np.asarray(rounds),
        logits=logits32,
        accepted=accepted,
        verified=np.asarray(verified),
        k=block,
    )
    return batch, notices


def _shard_meta(obj: Any, where: str) -> dict[str, Any]:
    """The shard's ``meta``, once the shard is a dict with the required keys and the exact pairing.

    Raises:
        ConfigError: another object, a missing key, or another pairing.
    """
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: a recorder shard is a dict, found {type(obj).__name__}")
    missing = [key for key in ("logits", "prefix_mask", "meta") if key not in obj]
    if missing:
        raise ConfigError(f"{where}: recorder shard lacks key(s) {missing}")
    meta = obj["meta"]
    if not isinstance(meta, dict):
        raise ConfigError(f"{where}: 'meta' must be a dict, found {type(meta).__name__}")
    pairing = meta.get("pairing")
    if pairing != RECORDER_PAIRING:
        raise ConfigError(
            f"{where}: meta.pairing is {pairing!r}, expected {RECORDER_PAIRING!r}; only logits paired "
            "to the exact verified draft pass can be calibrated. Re-record with the draft_seq_ring pairing"
        )
    return meta


def _shard_matrices(
    obj: Mapping[str, Any], meta: Mapping[str, Any], where: str, k: int | None
) -> tuple[np.ndarray, np.ndarray, int]:
    """(logits, prefix_mask, K) of a shard, checked against each other, ``meta`` and ``k``.

    Raises:
        ConfigError: shapes or the block size disagree (:class:`KMismatch` for another K).
    """
    logits = _tensor_to_numpy(obj["logits"], where, "logits")
    mask = _tensor_to_numpy(obj["prefix_mask"], where, "prefix_mask")
    if logits.ndim != 2:
        raise ConfigError(f"{where}: logits must be [N, K], got shape {list(logits.shape)}")
    block = meta.get("block_size")
    if isinstance(block, bool) or not isinstance(block, int):
        raise ConfigError(
            f"{where}: meta.block_size must be an integer (the draft length K), got {_short(block)}"
        )
    if block != logits.shape[1]:
        raise ConfigError(
            f"{where}: meta.block_size={_short(block)} but logits have {logits.shape[1]} columns; the shard "
            "is inconsistent"
        )
    if k is not None and block != k:
        raise KMismatch(
            f"{where}: meta.block_size={block} disagrees with K={k} of the other inputs (or --k); "
            "fit each draft length separately"
        )
    if mask.shape != logits.shape:
        raise ConfigError(
            f"{where}: prefix_mask has shape {list(mask.shape)}, logits {list(logits.shape)}; they must match"
        )
    return logits, mask, block


def _shard_ids(raw_ids: Any, n: int, path: Path) -> tuple[pa.Array, tuple[Notice, ...]]:
    """The shard's request id per round, and a notice when the shard is empty or records none."""
    where = str(path)
    if n == 0:
        return pa.array([], pa.string()), (
            Notice("EMPTY_SHARD", f"{where}: the shard holds no rounds; nothing read from it"),
        )
    if raw_ids is None:
        # The path as given, not the bare file name: shards of one name in two folders stay apart.
        ids = pa.array([f"{path}#{i}" for i in range(n)], pa.string())
        return ids, (
            Notice(
                "NO_REQUEST_IDS",
                f"{where}: no request_ids; each round is treated as its own request, so the holdout "
                "and bootstrap are by round, not by request (record request ids to fix)",
            ),
        )
    return _shard_request_ids(raw_ids, where), ()


def _rounds_by_request(ids: pa.Array, first_round: Mapping[str, int] | None) -> np.ndarray:
    """Rounds in shard order within each request, continuing from earlier shards (``first_round``)."""
    encoded = pc.dictionary_encode(ids)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    rounds = np.zeros(len(codes), dtype=np.int64)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_codes)) + 1]
    first = np.repeat(starts, np.diff(np.r_[starts, len(codes)]))
    rounds[order] = np.arange(len(codes)) - first
    if first_round:
        offsets = np.array([first_round.get(name, 0) for name in encoded.dictionary.to_pylist()], np.int64)
        rounds += offsets[codes]
    return rounds


# --------------------------------------------------------------------------------------------
# Dispatch and assembly


def _format_of(path: Path) -> str:
    fmt = TRACE_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise ConfigError(
            f"{path}: unknown trace format {path.suffix!r}; use one of {sorted(TRACE_SUFFIXES)}"
        )
    return fmt


def _other_output(path: Path) -> bool:
    """A file in a trace directory that another stage wrote: a sweep journal or an artifact."""
    name = path.name.lower()
    if name.endswith(".journal.jsonl"):
        return True
    if path.suffix.lower() not in (".parquet", ".pq"):
        return False
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException):
        return False  # the reader reports it properly
    # artifacts.FOOTER_KEY marks this package's signed and unsigned artifacts (sweeps, workloads,
    # ...): a Parquet file that has it is another stage's output, never a trace.
    return FOOTER_KEY in meta


def expand_trace_paths(paths: Sequence[Path | str]) -> list[Path]:
    """Expand directories into their trace files (sorted by name); keep files as given.

    Raises:
        ConfigError: a path does not exist, a directory holds no trace files, or nothing is given.
    """
    out: list[Path] = []
    if not paths:
        raise ConfigError("no trace files given; pass --traces FILE (Parquet, JSONL or recorder .pt)")
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found = sorted(
                c
                for c in p.iterdir()
                if c.is_file() and c.suffix.lower() in TRACE_SUFFIXES and not _other_output(c)
            )
            if not found:
                raise ConfigError(
                    f"{p}: directory holds no trace files ({', '.join(sorted(TRACE_SUFFIXES))}); "
                    "pass the directory the recorder wrote, or the trace files themselves"
                )
            out.extend(found)
        elif p.is_file():
            _format_of(p)
            out.append(p)
        else:
            raise ConfigError(f"{p}: no such trace file or directory")
    return out


def iter_trace_batches(
    path: Path | str, *, k: int | None = None, batch_rows: int = DEFAULT_BATCH_ROWS
) -> Iterator[TraceBatch]:
    """Stream one trace file as validated batches.

    Args:
        path: a ``.parquet``/``.pq``, ``.jsonl``/``.ndjson`` or recorder ``.pt`` file.
        k: the expected draft length, if known.
        batch_rows: rounds per batch (recorder shards come as one batch).

    Raises:
        ConfigError: the file is unreadable or holds an invalid round.
    """
    p = Path(path)
    fmt = _format_of(p)
    if fmt == "parquet":
        yield from _iter_parquet(p, k, batch_rows)
    elif fmt == "jsonl":
        yield from _iter_jsonl(p, k, batch_rows)
    else:
        batch, _ = read_recorder_shard(p, k=k)
        yield batch


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    return h.hexdigest()


def _is_synthetic(path: Path, fmt: str) -> bool:
    if fmt != "parquet":
        return False
    pf, _ = _open_parquet(path)
    return bool(_parquet_footer(path, pf).get("synthetic", False))


def _assemble(
    batches: list[TraceBatch],
    k: int,
    *,
    sources: tuple[TraceSource, ...],
    notices: tuple[Notice, ...],
    tags: Counter[str],
    where: str,
    origins: Sequence[int] = (),
) -> TraceSet:
    if batches:
        ids = pc.dictionary_encode(pa.chunked_array([b.request_id for b in batches], pa.string()))
        codes = np.concatenate(
            [c.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False) for c in ids.chunks]
        )
        names = tuple(ids.chunks[-1].dictionary.to_pylist()) if ids.num_chunks else ()
        rounds = np.concatenate([b.round for b in batches])
        logits = np.concatenate([b.logits for b in batches]) if len(batches) > 1 else batches[0].logits
        accepted = np.concatenate([b.accepted for b in batches])
        verified = np.concatenate([b.verified for b in batches])
    else:
        codes = np.zeros(0, np.int32)
        names = ()
        rounds = np.zeros(0, np.int64)
        logits = np.zeros((0, k), np.float32)
        accepted = np.zeros(0, np.int8)
        verified = np.zeros(0, np.int8)
    if rounds.size:
        key = (codes.astype(np.int64) << 32) | rounds
        ordered = np.sort(key)
        dup = ordered[1:] == ordered[:-1]
        if dup.any():
            first = int(ordered[1:][dup][0])
            rid, rnd = names[first >> 32], first & _MAX_ROUND
            raise ConfigError(
                f"{where}: round {rnd} of request {rid!r} appears more than once ({int(dup.sum())} duplicate "
                f"key(s)); {_duplicate_cause(key == first, batches, origins, sources)}"
            )
    return TraceSet(
        k=k,
        request_names=names,
        request=codes,
        round=rounds,
        logits=logits,
        accepted=accepted,
        verified=verified,
        sources=sources,
        sampling_tags=tuple(sorted(tags.items())),
        notices=notices,
    )


def _duplicate_cause(
    rows: np.ndarray, batches: list[TraceBatch], origins: Sequence[int], sources: tuple[TraceSource, ...]
) -> str:
    """Say where a repeated (request, round) key comes from, and what to do about it."""
    if len(origins) != len(batches) or not sources:
        return "every (request, round) pair must be unique"
    per_row = np.repeat(np.asarray(origins), [b.rows for b in batches])
    files = sorted({int(i) for i in per_row[rows]})
    if len(files) == 1:
        return f"both in {sources[files[0]].path}: the file repeats a round; fix the exporter"
    paths = [sources[i].path for i in files]
    return (
        f"in {' and '.join(paths)}: request ids collide across files; give each run distinct request "
        "ids (or a rounds tensor that continues them), or fit the runs separately"
    )


def _refuse_repeat(path: Path, digest: str, seen: Mapping[str, Path]) -> None:
    """Refuse a file whose bytes were already given (caught before reading: a recorder shard given
    twice would otherwise look like a request continuing into the next shard).

    Raises:
        ConfigError: the same path twice, or another path with identical bytes.
    """
    if digest in seen:
        same = seen[digest].resolve() == path.resolve()
        raise ConfigError(
            f"{path}: {'given twice' if same else f'the same file as {seen[digest]} (identical bytes)'}; "
            "give each trace file once"
        )


def _file_batches(
    path: Path, fmt: str, k: int | None, batch_rows: int, next_round: dict[str, int], notices: list[Notice]
) -> Iterable[TraceBatch]:
    """The batches of one trace file; a recorder shard is read whole, continuing each request's
    rounds from ``next_round`` (advanced here) and adding its notices to ``notices``."""
    if fmt != "recorder":
        return iter_trace_batches(path, k=k, batch_rows=batch_rows)
    batch, shard_notices = read_recorder_shard(path, k=k, first_round=next_round)
    notices.extend(shard_notices)
    _advance_rounds(next_round, batch)
    return [batch]


def read_traces(
    paths: Sequence[Path | str],
    *,
    k: int | None = None,
    sampling: str | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
) -> TraceSet:
    """Read every trace file into one validated :class:`TraceSet`.

    Args:
        paths: files or directories (expanded with :func:`expand_trace_paths`).
        k: the expected draft length; default: the first file's.
        sampling: keep only rounds with this ``sampling`` tag.
        batch_rows: rounds per streamed batch.

    Returns:
        All rounds, request ids unified across files.

    Raises:
        ConfigError: any file or round is invalid, files disagree on K, a (request, round) key
            repeats, or nothing is left after the sampling filter.
    """
    files = expand_trace_paths(paths)
    batches: list[TraceBatch] = []
    sources: list[TraceSource] = []
    notices: list[Notice] = []
    tags: Counter[str] = Counter()
    origins: list[int] = []  # the file of each kept batch, for messages
    first_file: Path | None = None
    # Per request id of recorder shards: the round after the last one read. A shard without a
    # ``rounds`` tensor continues each request from there (a request spanning shards).
    next_round: dict[str, int] = {}
    seen: dict[str, Path] = {}  # file digest -> first path with it
    for index, path in enumerate(files):
        fmt = _format_of(path)
        file_rows = 0
        digest = _sha256_file(path)
        _refuse_repeat(path, digest, seen)
        seen[digest] = path
        try:
            for batch in _file_batches(path, fmt, k, batch_rows, next_round, notices):
                if k is None and batch.rows:
                    k = batch.k
                    first_file = path
                tags.update(_tag_counts(batch))
                kept = _filter_sampling(batch, sampling)
                if kept.rows:
                    batches.append(kept)
                    origins.append(index)
                    file_rows += kept.rows
        except KMismatch as exc:
            if first_file is not None and first_file != path:
                raise KMismatch(f"{exc} [K={k} came from {first_file}]") from None
            raise
        sources.append(
            TraceSource(
                path=str(path),
                format=fmt,
                rounds=file_rows,
                sha256=digest,
                synthetic=_is_synthetic(path, fmt),
            )
        )
    if k is None or not batches:
        detail = f" with sampling tag {sampling!r}" if sampling is not None else ""
        raise ConfigError(f"{', '.join(str(f) for f in files)}: no rounds{detail}; nothing to calibrate")
    where = files[0].name if len(files) == 1 else f"{len(files)} trace files"
    return _assemble(
        batches,
        k,
        sources=tuple(sources),
        notices=tuple(notices),
        tags=tags,
        where=where,
        origins=origins,
    )


def _advance_rounds(next_round: dict[str, int], batch: TraceBatch) -> None:
    """Raise ``next_round[id]`` past the rounds of each request id in ``batch``."""
    if not batch.rows:
        return
    encoded = pc.dictionary_encode(batch.request_id)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    highest = np.full(len(encoded.dictionary), -1, np.int64)
    np.maximum.at(highest, codes, batch.round)
    for name, top in zip(encoded.dictionary.to_pylist(), highest.tolist(), strict=True):
        next_round[name] = max(next_round.get(name, 0), top + 1)
