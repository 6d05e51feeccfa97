"""Ingest a TensorRT-LLM profiler raw-samples JSONL into the same summary a sweep produces.

Each line is one timed step: ``batch_size`` (G), ``verify_len`` (V), ``step_time_ms``,
``iteration`` and optionally ``measured_tokens``. ``verify_len`` 0 or G·(K+1) names the native
(static full-K) step; G ≤ V < G·(K+1) a compact cell. A line whose ``measured_tokens`` differs from
the tokens its cell verifies is misaligned and skipped (counted). Consecutive lines of one cell form
one round, so an interleaved profile yields a hierarchical interval and a back-to-back profile a
single-round one (flagged ``single_round``). Pure parsing plus one file read; no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_calibrate.artifacts import JsonError, loads_strict
from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.errors import ConfigError

__all__ = ["ImportedSamples", "ProfilerSample", "group_rounds", "parse_profiler_jsonl", "read_profiler_jsonl"]

_REQUIRED = ("batch_size", "verify_len", "step_time_ms", "iteration")
_OPTIONAL = ("measured_tokens",)


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
    misaligned = 0
    allowed = set(_REQUIRED) | set(_OPTIONAL)
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
        missing = sorted(set(_REQUIRED) - set(rec))
        extra = sorted(set(rec) - allowed)
        if missing or extra:
            raise ConfigError(
                f"{where}: missing fields {missing}, unknown fields {extra}; expected {list(_REQUIRED)}"
            )
        g, v = _int(rec, "batch_size", where), _int(rec, "verify_len", where)
        iteration = _int(rec, "iteration", where)
        ms = rec["step_time_ms"]
        if isinstance(ms, bool) or not isinstance(ms, int | float) or not math.isfinite(ms) or ms <= 0:
            raise ConfigError(f"{where}: step_time_ms must be a finite positive number, got {ms!r}")
        if g not in ladder:
            raise ConfigError(
                f"{where}: batch_size {g} is not in the ladder {list(ladder)}; pass the captured --ladder"
            )
        if v == g * (k + 1):
            v = 0  # the profiler's full-width step is the native cell
        cell = CellSpec(g, v, k)
        measured = rec.get("measured_tokens")
        if measured is not None and measured != cell.tokens:
            misaligned += 1
            continue
        samples.append(ProfilerSample(cell, iteration, float(ms)))
    if not samples:
        raise ConfigError(f"{source}: no usable samples")
    return ImportedSamples(tuple(samples), misaligned, source)


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


def group_rounds(samples: Sequence[ProfilerSample]) -> dict[CellSpec, list[tuple[int, float]]]:
    """Per cell, ``(round, ms)`` pairs: each run of consecutive lines of one cell is one round."""
    out: dict[CellSpec, list[tuple[int, float]]] = {}
    runs: dict[CellSpec, int] = {}
    previous: CellSpec | None = None
    for s in samples:
        if s.cell != previous:
            runs[s.cell] = runs.get(s.cell, -1) + 1
            previous = s.cell
        out.setdefault(s.cell, []).append((runs[s.cell], s.step_time_ms))
    return out
