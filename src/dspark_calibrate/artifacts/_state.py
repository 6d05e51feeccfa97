"""Rollback protection: the highest accepted version per series, and the newest trust root seen.

DESIGN §4 (freshness): ``version`` is monotonic per series. A verifier refuses an artifact whose
version is below the highest it has accepted for the same series, so an attacker cannot replay an
older, validly signed table; and it refuses a trust root older than the newest it has accepted,
so a revoked key cannot come back with an old root (TUF's client rule).

**Series identity.** A series is the artifact's kind plus the fingerprint fields the verifier
*binds* (``BINDING_FIELDS`` minus the ones the operator unbinds). Fields that are never bound
(``context_len``, ``clock_policy``) or that this verifier unbinds cannot start a new series, or an
old version made under other measurement conditions would pass as a "new" series. So each entry
stores the kind and the values of every binding field, and :meth:`RollbackState.check` takes the
highest version over the entries of that kind that agree with the artifact on every field bound
*now*; a later change of the unbound set neither forgets history nor splits a series.

**File.** Canonical JSON::

    {"schema_version": 2,
     "series": {"<kind>:<sha256 of the binding values>": {"kind": ..., "binding": {...}, "version": N}},
     "legacy_series": {"<kind>:<fingerprint digest>": N},
     "trust_root": null | {"version": N, "sha256": "<hex>", "root": {...root.json...}}}

A schema-1 file (``{"schema_version": 1, "series": {key: version}}``, keyed by the digest of the
whole fingerprint) is read as ``legacy_series``: those entries keep refusing what they refused
(an artifact is also checked against its signed ``series`` key), nothing new is written under old
keys, and the next update writes schema 2. Older tools refuse a schema-2 file (fail closed).

Updates are read-modify-write under an exclusive kernel lock (``flock`` on ``<path>.lock``,
released if the holder dies) with a bounded wait, and replace the file atomically, so concurrent
verifiers on one host never lose an update or see a partial file, and nothing stored is ever
lowered. Any doubt (corrupt file, lock not obtained in time, disk full) raises
:class:`StateError`; callers fail closed. Reads are bounded (a FIFO or device at the path is
refused, never waited on).

**Who may touch it.** Whoever can delete or rewrite the state resets rollback protection, and
whoever can open the lock file can hold it forever (``flock`` needs only read access), so the
state is private to the verifier's user, whatever the umask: missing directories are created 0700,
the state file and the lock 0600 (a lock this user owns with wider bits, as older versions made
it, is narrowed when opened). A state, a lock or a directory that another user could have changed
is refused with ``STATE_INSECURE`` before it is trusted: the state or lock owned by another user or
writable by group or others, or its directory writable by group or others without the sticky bit
(which would let them delete or replace it), or owned by another user than this one or root.

This module does the state file's I/O and nothing else: it does not decide *whether* to record
(the verification pipeline records only fully verified artifacts and roots).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import math
import os
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_calibrate.artifacts._atomic import atomic_write_bytes, fsync_directory, make_private_dirs
from dspark_calibrate.artifacts._canonical import (
    JsonError,
    canonical_json,
    encode_checked,
    loads_strict,
    sha256_hex,
)
from dspark_calibrate.artifacts._files import FileTooLarge, read_regular_file_stat
from dspark_calibrate.artifacts._limits import MAX_STATE_BYTES
from dspark_calibrate.artifacts._reasons import Finding, Reason
from dspark_calibrate.errors import DsparkError, InvalidValueError

__all__ = [
    "DEFAULT_STATE_LOCK_TIMEOUT_S",
    "MAX_STATE_BYTES",
    "STATE_SCHEMA_VERSION",
    "RollbackState",
    "SeriesIdentity",
    "StateError",
    "StoredRoot",
]

#: Version of the state file format (1: keyed by the whole fingerprint's digest; read as legacy).
STATE_SCHEMA_VERSION = 2
_LEGACY_SCHEMA_VERSION = 1
#: Default wait for the state lock, in seconds. Admission runs inside a serving start whose
#: budget is 100 ms; waiting longer for another verifier is worse than failing closed to static K.
DEFAULT_STATE_LOCK_TIMEOUT_S = 0.1
#: How often a waiting verifier retries the lock, in seconds (one non-blocking flock call each):
#: a fraction of the wait, so a lock released mid-wait is taken within a ms or so. With eight
#: verifiers queued behind one lock, each hand-over waits half a poll on average, so the last one
#: in the queue waits about 3.5 polls for nothing; a poll costs a few microseconds of CPU.
_LOCK_POLL_S = 0.001
#: Permission bits of the state and its lock: only their user may read or write them.
_FILE_MODE = 0o600
#: Opening the state only to hold it (see update): never through a symlink, never waiting on a FIFO.
_HOLD_FLAGS = (
    os.O_RDONLY
    | os.O_NONBLOCK
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NOCTTY", 0)
)
_LOCK_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class StateError(DsparkError):
    """The rollback state cannot be read or updated; the verifier must fail closed.

    Attributes:
        reason: ``STATE_LOCKED``, ``STATE_CORRUPT``, ``STATE_UNWRITABLE``, ``STATE_INSECURE``
            (another user could have changed it) or ``IO_ERROR`` (the file exists but cannot be
            read).
    """

    def __init__(self, reason: Reason, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class SeriesIdentity:
    """Which series an accepted artifact belongs to.

    Attributes:
        kind: the artifact kind (``bundle`` for manifests).
        binding: the JSON form of every binding field of its signed fingerprint (field -> value).
        legacy: its signed ``series`` string (kind + digest of the whole fingerprint), the key of
            schema-1 state files; checked, never written.
    """

    kind: str
    binding: Mapping[str, Any]
    legacy: str | None = None
    _key: str | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise InvalidValueError(f"series kind must be a non-empty string, got {self.kind!r}")
        if not isinstance(self.binding, Mapping):
            raise InvalidValueError(f"series binding must be a mapping, got {type(self.binding).__name__}")

    @property
    def key(self) -> str:
        """The entry's key in the state file: ``<kind>:<sha256 of the binding values>``."""
        if self._key is None:  # computed once: an update asks for it before and under the lock
            object.__setattr__(self, "_key", _series_key(self.kind, canonical_json(dict(self.binding))))
        assert self._key is not None
        return self._key

    def matches(self, kind: str, binding: Mapping[str, Any], bound: Iterable[str]) -> bool:
        """True when ``(kind, binding)`` is this series as seen by a verifier binding ``bound``."""
        return kind == self.kind and all(binding.get(name) == self.binding.get(name) for name in bound)


@dataclass(frozen=True, slots=True)
class StoredRoot:
    """The newest trust root a verifier accepted (canonical ``root.json`` bytes and version).

    Attributes:
        version: its version.
        raw: its canonical bytes.
        doc: the same document parsed, when at hand (saves parsing ``raw`` on every write).
    """

    version: int
    raw: bytes = field(repr=False)
    doc: Any = field(default=None, repr=False, compare=False)

    @property
    def sha256(self) -> str:
        """SHA-256 of :attr:`raw`."""
        return hashlib.sha256(self.raw).hexdigest()


def _series_key(kind: str, binding: bytes) -> str:
    """``<kind>:<sha256 of the canonical binding values>``."""
    return f"{kind}:{sha256_hex(binding)}"


@dataclass(frozen=True, slots=True)
class _Entry:
    kind: str
    binding: Mapping[str, Any]
    version: int


@dataclass(slots=True)
class _Contents:
    series: dict[str, _Entry] = field(default_factory=dict)
    legacy: dict[str, int] = field(default_factory=dict)
    root: StoredRoot | None = None

    def copy(self) -> _Contents:
        """A copy that can be changed without changing this one (entries are immutable)."""
        return _Contents(dict(self.series), dict(self.legacy), self.root)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": STATE_SCHEMA_VERSION,
            "series": {
                key: {"kind": e.kind, "binding": dict(e.binding), "version": e.version}
                for key, e in self.series.items()
            },
            "legacy_series": dict(self.legacy),
            "trust_root": None
            if self.root is None
            else {
                "version": self.root.version,
                "sha256": self.root.sha256,
                "root": self.root.doc if self.root.doc is not None else loads_strict(self.root.raw),
            },
        }


def _check_version(version: int) -> None:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InvalidValueError(f"version must be an integer >= 0, got {version!r}")


def _is_version(value: Any, minimum: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


class RollbackState:
    """The highest accepted version per series and the newest trust root, persisted in ``path``.

    Args:
        path: the state file (created on first update, with its parent directory).
        lock_timeout_s: how long an update waits for the lock before ``STATE_LOCKED`` (seconds).
        snapshot: checks read the file once and keep using what they read (with this object's
            own updates), instead of re-reading it on every check. For an object that lives for
            one verification run (an admission): it then checks all its artifacts against one
            state, and under contention does not parse the file again for each artifact as
            other verifiers change it. An update always re-reads the file under the lock, so
            nothing stored is ever lost or lowered; a version another verifier records meanwhile
            is seen by the next run (as it would be had it been recorded a moment later).
    """

    __slots__ = ("_lock_path", "_lock_timeout_s", "_memo", "_path", "_snapshot")

    def __init__(
        self, path: Path, *, lock_timeout_s: float = DEFAULT_STATE_LOCK_TIMEOUT_S, snapshot: bool = False
    ) -> None:
        if not (
            isinstance(lock_timeout_s, int | float) and math.isfinite(lock_timeout_s) and lock_timeout_s >= 0
        ):
            raise InvalidValueError(f"lock_timeout_s must be a finite number >= 0, got {lock_timeout_s!r}")
        self._path = Path(path)
        self._lock_path = Path(f"{self._path}.lock")
        self._lock_timeout_s = float(lock_timeout_s)
        # The last bytes read and what they hold: a file read again is parsed again only when its
        # bytes changed (with ``snapshot``, checks do not read it again at all).
        self._memo: tuple[bytes, _Contents] | None = None
        self._snapshot = snapshot

    @property
    def path(self) -> Path:
        """The state file."""
        return self._path

    def __repr__(self) -> str:
        return f"RollbackState({str(self._path)!r})"

    # ----------------------------------------------------------------------------------------
    # reading
    # ----------------------------------------------------------------------------------------

    def _read(self, *, fresh: bool = False) -> _Contents:
        """The stored contents; empty when the file does not exist yet.

        No lock is needed to read: writers replace the file atomically, so a reader sees one
        complete version or the other. With ``snapshot`` (and not ``fresh``) the contents read
        before are returned without reading the file again.

        Raises:
            StateError: ``STATE_INSECURE``, ``STATE_CORRUPT`` or ``IO_ERROR``.
        """
        if self._snapshot and not fresh and self._memo is not None:
            return self._memo[1].copy()
        self._check_directory()
        try:
            data, info = read_regular_file_stat(self._path, MAX_STATE_BYTES)
        except FileNotFoundError:
            return _Contents()
        except FileTooLarge as big:
            raise self._corrupt(f"{big.size} bytes, larger than {MAX_STATE_BYTES}") from None
        except OSError as exc:
            raise StateError(
                Reason.IO_ERROR,
                f"{self._path}: cannot read the rollback state ({exc.strerror or exc}); it must be a "
                "regular file: check the path and its permissions",
            ) from exc
        self._check_private(info, self._path, "rollback state")
        if self._memo is not None and self._memo[0] == data:
            return self._memo[1].copy()
        try:
            obj: Any = loads_strict(data, what="rollback state")
        except JsonError as exc:
            raise self._corrupt(str(exc)) from exc
        contents = self._validate(obj)
        self._memo = (data, contents)
        return contents.copy()

    def _insecure(self, detail: str) -> StateError:
        return StateError(
            Reason.STATE_INSECURE,
            f"{detail}: another user could delete or change the rollback state and so reset rollback "
            "protection; keep it in a directory only this user (or root) owns and can write, e.g. "
            "`install -d -m 700 DIR`, and let the verifier create the state there",
        )

    def _check_private(self, info: os.stat_result, path: Path, what: str) -> None:
        """Refuse a state or lock file another user owns or may write."""
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid != os.geteuid():
            raise self._insecure(
                f"{path}: the {what} is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()})"
            )
        if mode & 0o022:
            raise self._insecure(f"{path}: the {what} is writable by group or others (mode {mode:o})")

    def _check_directory(self) -> None:
        """Refuse a state directory another user may write (and so delete the state from)."""
        directory = self._path.parent
        try:
            info = os.stat(directory)
        except FileNotFoundError:
            return  # created private by the first update
        except OSError:
            return  # reading the state reports what is wrong with the path
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid not in (os.geteuid(), 0):
            raise self._insecure(f"{directory}: the state directory is owned by uid {info.st_uid}")
        if mode & 0o022 and not mode & stat.S_ISVTX:
            raise self._insecure(
                f"{directory}: the state directory is writable by group or others (mode {mode:o})"
            )

    def _corrupt(self, detail: str) -> StateError:
        return StateError(
            Reason.STATE_CORRUPT,
            f"{self._path}: rollback state is corrupt ({detail}); restore it from a backup, or delete it "
            "only if you accept that older artifacts and trust roots become admissible again",
        )

    def _validate(self, obj: Any) -> _Contents:
        if not isinstance(obj, Mapping) or "schema_version" not in obj:
            raise self._corrupt("expected an object with a schema_version")
        version = obj["schema_version"]
        if isinstance(version, bool) or version not in (_LEGACY_SCHEMA_VERSION, STATE_SCHEMA_VERSION):
            raise self._corrupt(
                f"schema_version is {version!r}, expected {STATE_SCHEMA_VERSION} (or {_LEGACY_SCHEMA_VERSION}, "
                "read as legacy); a newer dspark-calibrate wrote it: upgrade this one"
            )
        if version == _LEGACY_SCHEMA_VERSION:
            if set(obj) != {"schema_version", "series"}:
                raise self._corrupt("a schema-1 state holds exactly the keys schema_version and series")
            return _Contents(legacy=self._legacy(obj["series"], "series"))
        expected = {"schema_version", "series", "legacy_series", "trust_root"}
        if set(obj) != expected:
            raise self._corrupt(
                f"keys: extra {sorted(set(obj) - expected)}, missing {sorted(expected - set(obj))}"
            )
        out = _Contents(legacy=self._legacy(obj["legacy_series"], "legacy_series"))
        series = obj["series"]
        if not isinstance(series, Mapping):
            raise self._corrupt("series is not an object")
        for key, entry in series.items():
            if (
                not isinstance(entry, Mapping)
                or set(entry) != {"kind", "binding", "version"}
                or not isinstance(entry["kind"], str)
                or not entry["kind"]
                or not isinstance(entry["binding"], Mapping)
                or not _is_version(entry["version"])
            ):
                raise self._corrupt(
                    f"series entry {key!r} must be {{kind: non-empty string, binding: object, version: integer >= 0}}"
                )
            # The document passed loads_strict: its parts are within the limits already.
            if _series_key(entry["kind"], encode_checked(entry["binding"])) != key:
                raise self._corrupt(f"series entry {key!r} does not match its kind and binding values")
            out.series[key] = _Entry(entry["kind"], entry["binding"], entry["version"])
        root = obj["trust_root"]
        if root is not None:
            if (
                not isinstance(root, Mapping)
                or set(root) != {"version", "sha256", "root"}
                or not _is_version(root["version"], 1)
                or not isinstance(root["root"], Mapping)
            ):
                raise self._corrupt(
                    "trust_root must be null or {version: integer >= 1, sha256, root: object}"
                )
            stored = StoredRoot(root["version"], encode_checked(root["root"]), root["root"])
            if stored.sha256 != root["sha256"]:
                raise self._corrupt("trust_root.sha256 does not match the stored root")
            out.root = stored
        return out

    def _legacy(self, series: Any, name: str) -> dict[str, int]:
        if not isinstance(series, Mapping):
            raise self._corrupt(f"{name} is not an object")
        out: dict[str, int] = {}
        for key, version in series.items():
            if not key or not _is_version(version):
                raise self._corrupt(f"{name} {key!r} has version {version!r}, expected an integer >= 0")
            out[key] = version
        return out

    def highest(self, identity: SeriesIdentity, bound: Iterable[str] | None = None) -> int | None:
        """The highest version recorded for ``identity`` as seen when binding ``bound``, or None.

        Every entry of the same kind that agrees with ``identity`` on each field of ``bound``
        (default: every field of ``identity.binding``) counts, and so does the schema-1 entry
        under ``identity.legacy``.

        Raises:
            StateError: ``STATE_INSECURE``, ``STATE_CORRUPT`` or ``IO_ERROR``.
        """
        contents = self._read()
        bound = tuple(identity.binding if bound is None else bound)
        # identity.matches with the roles swapped (the comparison is symmetric): no SeriesIdentity
        # per stored entry, of which an admission checks every one four times.
        versions = [e.version for e in contents.series.values() if identity.matches(e.kind, e.binding, bound)]
        if identity.legacy is not None and identity.legacy in contents.legacy:
            versions.append(contents.legacy[identity.legacy])
        return max(versions) if versions else None

    def check(
        self, identity: SeriesIdentity, version: int, bound: Iterable[str] | None = None
    ) -> Finding | None:
        """A ``ROLLBACK`` finding when ``version`` is below the highest recorded one, else None.

        An equal version is accepted: re-admitting the same artifact (a restart) is not a rollback.

        Raises:
            StateError: ``STATE_INSECURE``, ``STATE_CORRUPT`` or ``IO_ERROR``.
            ValueError: a negative/non-integer version (a caller bug).
        """
        _check_version(version)
        highest = self.highest(identity, bound)
        if highest is not None and version < highest:
            return Finding(
                Reason.ROLLBACK,
                f"version {version} of this {identity.kind} series is older than version {highest} already "
                f"accepted (state {self._path}); deploy version >= {highest}",
                field="version",
                expected=highest,
                actual=version,
            )
        return None

    def trust_root(self) -> StoredRoot | None:
        """The newest trust root recorded, or None.

        Raises:
            StateError: ``STATE_INSECURE``, ``STATE_CORRUPT`` or ``IO_ERROR``.
        """
        return self._read().root

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

    @staticmethod
    def _apply(
        contents: _Contents, accepted: list[tuple[SeriesIdentity, int]], root: StoredRoot | None
    ) -> bool:
        """Raise ``contents`` to hold ``accepted`` and ``root``; True when anything changed."""
        changed = False
        for identity, version in accepted:
            stored = contents.series.get(identity.key)
            if stored is None or stored.version < version:
                contents.series[identity.key] = _Entry(identity.kind, dict(identity.binding), version)
                changed = True
        if root is not None and (contents.root is None or contents.root.version < root.version):
            contents.root = root
            changed = True
        return changed

    def record(self, identity: SeriesIdentity, version: int) -> None:
        """Raise the stored version of ``identity`` to ``version`` (never lowers it).

        Raises:
            StateError: as :meth:`update`.
            ValueError: a negative/non-integer version (a caller bug).
        """
        self.update([(identity, version)])

    def update(
        self, accepted: Iterable[tuple[SeriesIdentity, int]] = (), *, root: StoredRoot | None = None
    ) -> None:
        """Record accepted versions and the newest trust root in one locked, atomic update.

        Holds ``<path>.lock`` (waiting at most the lock timeout) while reading, comparing and
        atomically replacing the file; the old file stays intact when anything fails. When the
        file already holds everything, it is neither locked nor rewritten. A stored version or
        root is never lowered: a root is replaced only by one of a higher version. Missing
        directories are created 0700, the file and its lock 0600.

        Raises:
            StateError: ``STATE_LOCKED`` (lock not obtained within the timeout),
                ``STATE_INSECURE`` (state, lock or directory another user could change),
                ``STATE_CORRUPT`` (the existing file is not a valid state; it is left untouched),
                ``STATE_UNWRITABLE`` (directory, lock or file cannot be written: ENOSPC, EACCES, ...),
                ``IO_ERROR`` (the existing file cannot be read).
            ValueError: a negative/non-integer version (a caller bug).
        """
        accepted = list(accepted)
        for _, version in accepted:
            _check_version(version)
        # Most updates change nothing (a restart re-admits what is recorded; of many processes
        # admitting one bundle, only the first writes). Stored values only ever rise and the file
        # is replaced atomically, so a file that already holds everything needs no lock at all.
        try:
            if not self._apply(self._read(), accepted, root):
                return
        except StateError:
            pass  # reported below, under the lock, with the directory's own error if it has one
        try:
            make_private_dirs(self._path.parent)
        except OSError as exc:
            raise self._unwritable(exc, "create the state directory") from exc
        self._check_directory()
        fd = self._lock()
        replaced: int | None = None
        try:
            # The file about to be replaced stays open until the lock is released: the rename
            # then only unlinks it, and freeing its blocks (about as long as the rename itself)
            # happens when it is closed, outside the lock.
            replaced = self._open_current()
            contents = self._read(fresh=True)
            if not self._apply(contents, accepted, root):
                return
            data = canonical_json(contents.to_json())
            try:
                # The lock is held only while reading, merging and renaming; the rename is made
                # durable (directory fsync) after it is released, before this update returns.
                atomic_write_bytes(self._path, data, mode=_FILE_MODE, sync_directory=False)
            except OSError as exc:
                raise self._unwritable(exc, "write the rollback state") from exc
            self._memo = (data, contents.copy())
        finally:
            os.close(fd)  # closing the descriptor releases the flock
            if replaced is not None:
                os.close(replaced)
        try:
            fsync_directory(self._path.parent)
        except OSError as exc:
            raise self._unwritable(exc, "make the rollback state durable") from exc

    def _open_current(self) -> int | None:
        """A read-only descriptor of the state file as it is now (never through a symlink), or
        None when there is none to open; only held, never read (:meth:`_read` reads and checks)."""
        try:
            fd = os.open(self._path, _HOLD_FLAGS)
        except OSError:
            return None  # missing, a symlink, unreadable: _read reports what matters
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except OSError:
            regular = False
        if not regular:
            os.close(fd)
            return None
        return fd

    def _lock(self) -> int:
        """Open ``<path>.lock`` (0600, never through a symlink) and hold its exclusive ``flock``,
        waiting at most the lock timeout; returns the descriptor (closing it unlocks).

        A kernel lock, not a marker file: it vanishes with a crashed holder, so a dead verifier
        cannot wedge the others. The lock file is kept between uses so that every process locks the
        same inode.

        Raises:
            StateError: ``STATE_LOCKED`` (not obtained in time), ``STATE_INSECURE`` (the lock is
                another user's, or not a regular file), ``STATE_UNWRITABLE`` (it cannot be created).
        """
        try:
            fd = os.open(self._lock_path, _LOCK_FLAGS, _FILE_MODE)
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
                raise self._insecure(f"{self._lock_path}: the state lock is a symlink") from exc
            raise self._unwritable(exc, "create or open the lock file") from exc
        held = False
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise self._insecure(f"{self._lock_path}: the state lock is not a regular file")
            if info.st_uid != os.geteuid():
                raise self._insecure(f"{self._lock_path}: the state lock is owned by uid {info.st_uid}")
            if stat.S_IMODE(info.st_mode) != _FILE_MODE:
                os.fchmod(fd, _FILE_MODE)  # os.open's mode is narrowed by the umask; and old locks were 0644
            self._wait_for_lock(fd)
            held = True
        finally:
            if not held:  # whatever stopped us (an error, an interrupt): no descriptor is leaked
                os.close(fd)
        return fd

    def _wait_for_lock(self, fd: int) -> None:
        """Take the ``flock`` on ``fd``, retrying every few ms until the lock timeout."""
        started = time.monotonic()
        deadline = started + self._lock_timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            except OSError as exc:
                raise self._unwritable(exc, "lock the lock file") from exc
            now = time.monotonic()
            if now >= deadline:
                raise StateError(
                    Reason.STATE_LOCKED,
                    f"{self._lock_path}: rollback state is locked by another process for more than "
                    f"{self._lock_timeout_s:g}s (waited {now - started:.3f}s); retry, or check for a stuck "
                    "verifier",
                )
            time.sleep(min(_LOCK_POLL_S, deadline - now))
