"""Rollback protection: the highest accepted version per series, kept in a small state file.

DESIGN §4 (freshness): ``series`` is kind + fingerprint digest and ``version`` is monotonic per
series. A verifier refuses an artifact whose version is below the highest it has accepted, so an
attacker cannot replay an older, validly signed table.

The file is canonical JSON ``{"schema_version": 1, "series": {series: version}}``. Updates are
read-modify-write under an exclusive file lock (``<path>.lock``, a kernel ``flock`` released if
the holder dies) and replace the file atomically, so concurrent verifiers on one host never lose
an update or see a partial file, and a stored version is never lowered. Any doubt (corrupt file,
lock not obtained, disk full) raises :class:`StateError`; callers fail closed.

This module does the state file's I/O and nothing else: it does not decide *whether* to record
(the verification pipeline records only fully verified artifacts).
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from dspark_calibrate.artifacts._atomic import atomic_write_bytes
from dspark_calibrate.artifacts._canonical import JsonError, canonical_json, loads_strict
from dspark_calibrate.artifacts._reasons import Finding, Reason
from dspark_calibrate.errors import DsparkError

__all__ = ["MAX_STATE_BYTES", "STATE_SCHEMA_VERSION", "RollbackState", "StateError"]

#: Version of the state file format.
STATE_SCHEMA_VERSION = 1
#: Largest state file read, in bytes. One series entry is ~100 bytes; 16 MiB is far beyond any
#: deployment and keeps a wrong path from being read into memory.
MAX_STATE_BYTES = 16 << 20


class StateError(DsparkError):
    """The rollback state cannot be read or updated; the verifier must fail closed.

    Attributes:
        reason: ``STATE_LOCKED``, ``STATE_CORRUPT``, ``STATE_UNWRITABLE`` or ``IO_ERROR`` (the
            file exists but cannot be read).
    """

    def __init__(self, reason: Reason, message: str) -> None:
        self.reason = reason
        super().__init__(message)


def _check_series(series: str) -> None:
    if not isinstance(series, str) or not series:
        raise ValueError(f"series must be a non-empty string, got {series!r}")


def _check_version(version: int) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise ValueError(f"version must be an integer >= 0, got {version!r}")


class RollbackState:
    """The highest accepted version per series, persisted in ``path``.

    Args:
        path: the state file (created on first :meth:`record`, with its parent directory).
        lock_timeout_s: how long :meth:`record` waits for the lock before ``STATE_LOCKED``.
    """

    __slots__ = ("_lock_path", "_lock_timeout_s", "_path")

    def __init__(self, path: Path, *, lock_timeout_s: float = 2.0) -> None:
        if lock_timeout_s < 0:
            raise ValueError(f"lock_timeout_s must be >= 0, got {lock_timeout_s!r}")
        self._path = Path(path)
        self._lock_path = Path(f"{self._path}.lock")
        self._lock_timeout_s = float(lock_timeout_s)

    @property
    def path(self) -> Path:
        """The state file."""
        return self._path

    def __repr__(self) -> str:
        return f"RollbackState({str(self._path)!r})"

    # ----------------------------------------------------------------------------------------
    # reading
    # ----------------------------------------------------------------------------------------

    def _read(self) -> dict[str, int]:
        """The stored map; empty when the file does not exist yet.

        No lock is needed to read: writers replace the file atomically, so a reader sees one
        complete version or the other.
        """
        try:
            with open(self._path, "rb") as handle:
                data = handle.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StateError(
                Reason.IO_ERROR,
                f"{self._path}: cannot read the rollback state ({exc.strerror}); check its permissions",
            ) from exc
        if len(data) > MAX_STATE_BYTES:
            raise self._corrupt(f"larger than {MAX_STATE_BYTES} bytes")
        try:
            obj: Any = loads_strict(data, what="rollback state")
        except JsonError as exc:
            raise self._corrupt(str(exc)) from exc
        return self._validate(obj)

    def _corrupt(self, detail: str) -> StateError:
        return StateError(
            Reason.STATE_CORRUPT,
            f"{self._path}: rollback state is corrupt ({detail}); restore it from a backup, or delete it "
            "only if you accept that older artifacts become admissible again",
        )

    def _validate(self, obj: Any) -> dict[str, int]:
        if not isinstance(obj, Mapping) or set(obj) != {"schema_version", "series"}:
            raise self._corrupt("expected exactly the keys schema_version and series")
        if obj["schema_version"] != STATE_SCHEMA_VERSION or isinstance(obj["schema_version"], bool):
            raise self._corrupt(
                f"schema_version is {obj['schema_version']!r}, expected {STATE_SCHEMA_VERSION}"
            )
        series = obj["series"]
        if not isinstance(series, Mapping):
            raise self._corrupt("series is not an object")
        out: dict[str, int] = {}
        for name, version in series.items():
            if not name or isinstance(version, bool) or not isinstance(version, int) or version < 0:
                raise self._corrupt(f"series {name!r} has version {version!r}, expected an integer >= 0")
            out[name] = version
        return out

    def highest(self, series: str) -> int | None:
        """The highest version recorded for ``series``, or None when none was.

        Raises:
            StateError: ``STATE_CORRUPT`` or ``IO_ERROR``.
        """
        _check_series(series)
        return self._read().get(series)

    def check(self, series: str, version: int) -> Finding | None:
        """A ``ROLLBACK`` finding when ``version`` is below the highest recorded one, else None.

        An equal version is accepted: re-admitting the same artifact (a restart) is not a rollback.

        Raises:
            StateError: ``STATE_CORRUPT`` or ``IO_ERROR``.
            ValueError: an empty series or a negative/non-integer version (a caller bug).
        """
        _check_version(version)
        highest = self.highest(series)
        if highest is not None and version < highest:
            return Finding(
                Reason.ROLLBACK,
                f"version {version} of series {series} is older than version {highest} already accepted "
                f"(state {self._path}); deploy version >= {highest}",
                field="version",
                expected=highest,
                actual=version,
            )
        return None

    # ----------------------------------------------------------------------------------------
    # writing
    # ----------------------------------------------------------------------------------------

    def _unwritable(self, exc: OSError, what: str) -> StateError:
        hint = {
            errno.ENOSPC: "free disk space",
            errno.EDQUOT: "free quota",
            errno.EACCES: "fix the directory's permissions",
            errno.EPERM: "fix the directory's permissions",
            errno.EROFS: "put the state file on a writable filesystem",
        }.get(exc.errno if exc.errno is not None else -1, "check the path")
        return StateError(
            Reason.STATE_UNWRITABLE,
            f"{self._path}: cannot {what} ({exc.strerror or exc}); {hint}",
        )

    def record(self, series: str, version: int) -> None:
        """Raise the stored version of ``series`` to ``version`` (never lowers it).

        Holds ``<path>.lock`` while reading, comparing and atomically replacing the file; the old
        file stays intact when anything fails.

        Raises:
            StateError: ``STATE_LOCKED`` (lock not obtained within the timeout),
                ``STATE_CORRUPT`` (the existing file is not a valid state; it is left untouched),
                ``STATE_UNWRITABLE`` (directory, lock or file cannot be written: ENOSPC, EACCES, ...),
                ``IO_ERROR`` (the existing file cannot be read).
            ValueError: an empty series or a negative/non-integer version (a caller bug).
        """
        _check_series(series)
        _check_version(version)
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._unwritable(exc, "create the state directory") from exc
        # A kernel lock (flock), not a marker file: it vanishes with a crashed holder, so a dead
        # verifier cannot wedge the others. The lock file is kept between uses so that every
        # process locks the same inode.
        lock = FileLock(
            self._lock_path,
            timeout=self._lock_timeout_s,
            preserve_lock_file=True,
            fallback_to_soft=False,
        )
        try:
            lock.acquire()
        except Timeout as exc:  # before OSError: filelock's Timeout subclasses it
            raise StateError(
                Reason.STATE_LOCKED,
                f"{self._lock_path}: rollback state is locked by another process for more than "
                f"{self._lock_timeout_s:g}s; retry, or check for a stuck verifier",
            ) from exc
        except OSError as exc:
            raise self._unwritable(exc, "create or lock the lock file") from exc
        try:
            current = self._read()
            stored = current.get(series)
            if stored is not None and stored >= version:
                return
            current[series] = version
            data = canonical_json({"schema_version": STATE_SCHEMA_VERSION, "series": current})
            try:
                atomic_write_bytes(self._path, data, mode=0o644)
            except OSError as exc:
                raise self._unwritable(exc, "write the rollback state") from exc
        finally:
            lock.release()
