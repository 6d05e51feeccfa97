"""The sweep journal: an append-only JSON-lines file, written per visit, that makes a sweep resumable.

The first line is a header naming the configuration digest; every later line is one record
(a visit with its samples, a cell's stop decision, the end of a round, the end of the sweep). Each
record reaches the file with one ``write`` as soon as it exists, so a killed process loses at most
the record being written (a torn last line, cut off on resume). ``fsync`` — which guards against a
machine crash rather than a killed process — runs on every record that ends a round and otherwise
at most once per ``SYNC_INTERVAL_S``, so that on slow file systems it does not dominate short visits.
Only this module reads or writes journal files; what the records mean is ``sweep.py``'s business.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_calibrate.artifacts import JsonError, canonical_json, loads_strict
from dspark_calibrate.errors import ConfigError

__all__ = [
    "JOURNAL_FORMAT",
    "JOURNAL_VERSION",
    "SYNC_INTERVAL_S",
    "Journal",
    "JournalContents",
    "read_journal",
]

JOURNAL_FORMAT = "dspark-calibrate/sweep-journal"
JOURNAL_VERSION = 1
#: Longest time (seconds) a written visit may wait for its fsync; bounds what a machine crash loses.
SYNC_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class JournalContents:
    """A parsed journal: header, records in order, and whether a torn tail was found."""

    header: Mapping[str, Any]
    records: tuple[Mapping[str, Any], ...]
    torn_tail_bytes: int


def read_journal(path: Path) -> JournalContents:
    """Parse a journal, tolerating only a torn (incomplete) last line.

    Raises:
        ConfigError: the file cannot be read, has no valid header, or is corrupt before its last line.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the sweep journal: {exc}") from exc
    lines = data.split(b"\n")
    tail = lines.pop()  # bytes after the last newline: empty, or a torn record
    records: list[Mapping[str, Any]] = []
    torn = len(tail)
    for i, line in enumerate(lines):
        try:
            obj = loads_strict(line, what=f"{path} line {i + 1}")
        except JsonError as exc:
            if i == len(lines) - 1 and not tail:
                torn = len(line) + 1  # a complete-looking but unparsable last line
                break
            raise ConfigError(
                f"{path}: journal line {i + 1} is corrupt ({exc}); the journal cannot be resumed"
            ) from exc
        if not isinstance(obj, dict) or "type" not in obj:
            raise ConfigError(f"{path}: journal line {i + 1} is not a record object")
        records.append(obj)
    if not records or records[0].get("type") != "header":
        raise ConfigError(f"{path}: not a sweep journal (no header line); start without --resume")
    header = records[0]
    if header.get("format") != JOURNAL_FORMAT or header.get("version") != JOURNAL_VERSION:
        raise ConfigError(
            f"{path}: journal format {header.get('format')!r} v{header.get('version')!r} is not "
            f"{JOURNAL_FORMAT!r} v{JOURNAL_VERSION}; start a new sweep without --resume"
        )
    return JournalContents(header=header, records=tuple(records[1:]), torn_tail_bytes=torn)


class Journal:
    """An open journal for appending. Use :meth:`create` or :meth:`resume`."""

    def __init__(self, path: Path, fd: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._fd = fd
        self._clock = clock
        self._synced_at = clock()

    @classmethod
    def create(cls, path: Path, header: Mapping[str, Any]) -> Journal:
        """Create a new journal with its header (fsynced).

        Raises:
            ConfigError: the file exists (resume it or remove it) or cannot be created.
        """
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        except FileExistsError:
            raise ConfigError(
                f"{path}: a sweep journal already exists; pass --resume to continue it, "
                "or remove it to start over"
            ) from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot create the sweep journal: {exc}") from exc
        journal = cls(path, fd)
        journal.append({**header, "type": "header", "format": JOURNAL_FORMAT, "version": JOURNAL_VERSION})
        _fsync_dir(path.parent)
        return journal

    @classmethod
    def resume(
        cls, path: Path, config_digest: str, config: Mapping[str, Any] | None = None
    ) -> tuple[Journal, JournalContents]:
        """Open an existing journal for appending after checking its configuration digest.

        A torn last line is truncated away before appending.

        Raises:
            ConfigError: no journal, a corrupt one, or one written for another configuration.
        """
        if not path.exists():
            raise ConfigError(f"{path}: no sweep journal to resume; run without --resume to start one")
        contents = read_journal(path)
        found = contents.header.get("config_digest")
        if found != config_digest:
            diff = _config_diff(contents.header.get("config"), config)
            raise ConfigError(
                f"{path}: journal was written for configuration {found!s}, this sweep is "
                f"{config_digest}{diff}; resume with the same arguments, or start a new journal "
                "(remove the file or choose another --out)"
            )
        try:
            if contents.torn_tail_bytes:
                size = path.stat().st_size
                os.truncate(path, size - contents.torn_tail_bytes)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot reopen the sweep journal: {exc}") from exc
        return cls(path, fd), contents

    def append(self, record: Mapping[str, Any]) -> None:
        """Append one record and fsync."""
        self.append_many((record,))

    def append_many(self, records: Iterable[Mapping[str, Any]], *, sync: bool = True) -> None:
        """Append records as one write; fsync when ``sync`` or when the last fsync is too old.

        Args:
            records: JSON records.
            sync: fsync now (round ends, stop decisions); otherwise fsync only if the last one
                is older than :data:`SYNC_INTERVAL_S`.
        """
        data = b"".join(canonical_json(dict(r)) + b"\n" for r in records)
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        now = self._clock()
        if sync or now - self._synced_at >= SYNC_INTERVAL_S:
            os.fsync(self._fd)
            self._synced_at = now

    def close(self) -> None:
        """Fsync and close the file descriptor (idempotent)."""
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1


def _config_diff(old: object, new: Mapping[str, Any] | None) -> str:
    """Name the top-level configuration fields that differ, sorted, journal value vs this sweep's."""
    if not isinstance(old, dict) or new is None:
        return ""
    changed = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a != b:
            changed.append(f"{key}: journal {_short(a)} vs now {_short(b)}")
    return " (differs in " + "; ".join(changed) + ")" if changed else ""


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
