"""Ingest a TensorRT-LLM profiler raw-samples JSONL into the same summary a sweep produces.

Each line is one timed step: ``batch_size`` (G), ``verify_len`` (V), ``step_time_ms``,
``iteration`` and optionally ``measured_tokens``. ``verify_len`` 0 or G·(K+1) names the native
(static full-K) step; G ≤ V < G·(K+1) a compact cell. A line whose ``measured_tokens`` differs from
the tokens its cell verifies is misaligned and skipped (counted). Consecutive lines of one cell form
one round, so an interleaved profile yields a hierarchical interval and a back-to-back profile a
single-round one (flagged ``single_round``). Pure parsing plus one file read; no torch.

Mixed prefill+decode records carry ``mixed_geometry`` (the consumer's geometry object: rank
features, capacity, actual and native rank rows), ``step_time_ms`` and ``iteration``; a record
whose actual rows equal its native rows is the step's native arm (in its paid bucket).
``parse_mixed_profiler_jsonl`` reads them for ``sweep --mixed``; the decode parser skips them
(and counts them), and the mixed parser skips decode records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_calibrate.artifacts import NATIVE_BUDGET, JsonError, MixedGeometry, full_width, loads_strict
from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.errors import ConfigError

__all__ = [
    "ImportedMixedSamples",
    "ImportedSamples",
    "MixedProfilerSample",
    "ProfilerSample",
    "group_rounds",
    "parse_mixed_profiler_jsonl",
    "parse_profiler_jsonl",
    "read_profiler_jsonl",
]

_REQUIRED_FIELDS = ("batch_size", "verify_len", "step_time_ms", "iteration")
_OPTIONAL = ("measured_tokens",)
_MIXED_FIELDS = ("mixed_geometry", "step_time_ms", "iteration")


@dataclass(frozen=True, slots=True)
class ProfilerSample:
    """One profiler line, mapped to its cell."""

    cell: CellSpec
    iteration: int
    step_time_ms: float


@dataclass(frozen=True, slots=True)
class ImportedSamples:
    """Parsed samples in file order plus the count of misaligned lines skipped."""

    samples: tuple[ProfilerSample, ...]
    misaligned: int
    source: str
    mixed_skipped: int = 0


@dataclass(frozen=True, slots=True)
class MixedProfilerSample:
    """One mixed profiler line: its geometry, iteration and time."""

    geometry: MixedGeometry
    iteration: int
    step_time_ms: float

    @property
    def cell(self) -> MixedGeometry:
        """The record's key (consecutive records of one geometry form one round)."""
        return self.geometry


@dataclass(frozen=True, slots=True)
class ImportedMixedSamples:
    """Parsed mixed samples in file order, and the count of decode records skipped."""

    samples: tuple[MixedProfilerSample, ...]
    decode_skipped: int
    source: str


def _records(lines: Iterable[str | bytes], source: str) -> Iterable[tuple[str, dict[str, Any]]]:
    for n, raw in enumerate(lines, start=1):
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if not text.strip():
            continue
        where = f"{source} line {n}"
        try:
            rec = loads_strict(text, what=where)
        except JsonError as exc:
            raise ConfigError(str(exc)) from exc
        if not isinstance(rec, dict):
            raise ConfigError(f"{where}: expected a JSON object")
        yield where, rec


def _time(rec: Mapping[str, Any], where: str) -> float:
    ms = rec["step_time_ms"]
    if isinstance(ms, bool) or not isinstance(ms, int | float) or not math.isfinite(ms) or ms <= 0:
        raise ConfigError(f"{where}: step_time_ms must be a finite positive number, got {ms!r}")
    return float(ms)


def _int(rec: Mapping[str, Any], name: str, where: str) -> int:
    value = rec.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: field {name!r} must be an integer, got {value!r}")
    return value


def parse_profiler_jsonl(
    lines: Iterable[str | bytes], *, k: int, ladder: Sequence[int], source: str = "<input>"
) -> ImportedSamples:
    """Parse profiler lines (pure).

    Raises:
        ConfigError: a malformed line, a G outside the ladder, an illegal V or a non-finite time;
            the message names the line.
    """
    samples: list[ProfilerSample] = []
    misaligned = mixed = 0
    allowed = set(_REQUIRED_FIELDS) | set(_OPTIONAL)
    for where, rec in _records(lines, source):
        if "mixed_geometry" in rec:
            mixed += 1  # a mixed prefill+decode step: `sweep --mixed` imports it
            continue
        missing = sorted(set(_REQUIRED_FIELDS) - set(rec))
        extra = sorted(set(rec) - allowed)
        if missing or extra:
            raise ConfigError(
                f"{where}: missing fields {missing}, unknown fields {extra}; expected {list(_REQUIRED_FIELDS)}"
            )
        g, v = _int(rec, "batch_size", where), _int(rec, "verify_len", where)
        iteration = _int(rec, "iteration", where)
        ms = _time(rec, where)
        if g not in ladder:
            raise ConfigError(
                f"{where}: batch_size {g} is not in the ladder {list(ladder)}; pass the captured --ladder"
            )
        if v == full_width(g, k):
            v = NATIVE_BUDGET  # the profiler's full-width step is the native cell
        cell = CellSpec(g, v, k)
        measured = rec.get("measured_tokens")
        if measured is not None and measured != cell.tokens:
            misaligned += 1
            continue
        samples.append(ProfilerSample(cell, iteration, float(ms)))
    if not samples:
        hint = f" ({mixed} mixed records: import them with sweep --mixed)" if mixed else ""
        raise ConfigError(f"{source}: no usable samples{hint}")
    return ImportedSamples(tuple(samples), misaligned, source, mixed)


def parse_mixed_profiler_jsonl(
    lines: Iterable[str | bytes], *, source: str = "<input>"
) -> ImportedMixedSamples:
    """Parse the mixed records of a profiler JSONL (pure); decode records are skipped and counted.

    Raises:
        ConfigError: a malformed record (unknown fields, a malformed geometry, a bad time).
    """
    samples: list[MixedProfilerSample] = []
    decode = 0
    for where, rec in _records(lines, source):
        if "mixed_geometry" not in rec:
            decode += 1
            continue
        if set(rec) != set(_MIXED_FIELDS):
            raise ConfigError(f"{where}: a mixed record has exactly {list(_MIXED_FIELDS)}, got {sorted(rec)}")
        geometry = MixedGeometry.from_dict(rec["mixed_geometry"], where=f"{where}: mixed_geometry")
        samples.append(MixedProfilerSample(geometry, _int(rec, "iteration", where), _time(rec, where)))
    if not samples:
        raise ConfigError(f"{source}: no mixed records (lines with mixed_geometry)")
    return ImportedMixedSamples(tuple(samples), decode, source)


def read_profiler_jsonl(path: Path, *, k: int, ladder: Sequence[int]) -> ImportedSamples:
    """Read and parse a profiler JSONL file.

    Raises:
        ConfigError: unreadable or malformed file.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read profiler samples: {exc}") from exc
    return parse_profiler_jsonl(data.splitlines(), k=k, ladder=ladder, source=str(path))


def group_rounds(samples: Sequence[Any]) -> dict[Any, list[tuple[int, float]]]:
    """Per cell (a sample's ``cell``), ``(round, ms)`` pairs: each run of consecutive lines of one
    cell is one round."""
    out: dict[Any, list[tuple[int, float]]] = {}
    runs: dict[Any, int] = {}
    previous: Any = None
    for s in samples:
        if s.cell != previous:
            runs[s.cell] = runs.get(s.cell, -1) + 1
            previous = s.cell
        out.setdefault(s.cell, []).append((runs[s.cell], s.step_time_ms))
    return out
