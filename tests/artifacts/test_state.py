"""Tests of the rollback state: monotonic versions, corruption, faults, locking, concurrent processes."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import multiprocessing
import os
import random
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

from dspark_calibrate.artifacts import _atomic
from dspark_calibrate.artifacts._reasons import Reason
from dspark_calibrate.artifacts._state import (
    DEFAULT_STATE_LOCK_TIMEOUT_S,
    RollbackState,
    SeriesIdentity,
    StateError,
    StoredRoot,
)
from dspark_calibrate.errors import DsparkError
from tests.hangs import HANG_S, fifo_watchdog

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def _reason(fn: Callable[[], object]) -> Reason:
    with pytest.raises(StateError) as info:
        fn()
    assert isinstance(info.value, DsparkError)
    assert "\n" not in str(info.value)
    return info.value.reason


# ---------------------------------------------------------------------------------------------
# semantics
# ---------------------------------------------------------------------------------------------


def ident(
    name: str = "s", kind: str = "cost-table", legacy: str | None = None, **binding: object
) -> SeriesIdentity:
    """A series identity whose binding is ``{"gpu": name, **binding}``."""
    return SeriesIdentity(kind, {"gpu": name, **binding}, legacy)


def test_empty_state(tmp_path: Path) -> None:
    state = RollbackState(tmp_path / "state.json")
    assert state.highest(ident()) is None
    assert state.check(ident(), 0) is None
    assert state.trust_root() is None
    assert not (tmp_path / "state.json").exists()  # reading creates nothing


def test_record_and_check(tmp_path: Path) -> None:
    state = RollbackState(tmp_path / "state.json")
    state.record(ident(), 5)
    assert state.highest(ident()) == 5
    assert state.check(ident(), 5) is None  # the same artifact again is not a rollback
    assert state.check(ident(), 6) is None
    finding = state.check(ident(), 4)
    assert finding is not None
    assert finding.reason is Reason.ROLLBACK
    assert (finding.field, finding.expected, finding.actual) == ("version", 5, 4)
    assert "cost-table" in finding.message and "5" in finding.message


def test_record_never_lowers(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = RollbackState(path)
    state.record(ident(), 7)
    before = path.stat().st_mtime_ns, path.read_bytes()
    state.record(ident(), 3)
    state.record(ident(), 7)
    assert state.highest(ident()) == 7
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before  # no needless rewrite


def test_series_are_independent(tmp_path: Path) -> None:
    state = RollbackState(tmp_path / "state.json")
    state.record(ident("a"), 3)
    state.record(ident("b"), 1)
    state.record(ident("a", kind="calibration"), 9)
    assert (state.highest(ident("a")), state.highest(ident("b"))) == (3, 1)
    assert state.check(ident("b"), 2) is None


def test_unbound_fields_do_not_split_a_series(tmp_path: Path) -> None:
    """An entry counts for every artifact that agrees with it on the fields bound *now*."""
    state = RollbackState(tmp_path / "state.json")
    state.record(ident("H200", topology="TP1"), 5)
    other_topology = ident("H200", topology="DEP8")
    assert state.highest(other_topology) is None  # both fields bound: another series
    assert state.highest(other_topology, bound=("gpu",)) == 5  # topology unbound: the same one
    finding = state.check(other_topology, 4, bound=("gpu",))
    assert finding is not None and finding.reason is Reason.ROLLBACK
    assert state.highest(ident("B300", topology="TP1"), bound=("gpu",)) is None


def test_one_update_records_many_and_the_root(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = RollbackState(path)
    root = StoredRoot(3, b'{"signed":{"version":3}}')
    state.update([(ident("a"), 1), (ident("b"), 2)], root=root)
    assert (state.highest(ident("a")), state.highest(ident("b"))) == (1, 2)
    assert state.trust_root() == root
    state.update(root=StoredRoot(2, b'{"signed":{"version":2}}'))  # never lowered
    assert state.trust_root() == root


def test_file_format_is_canonical_json(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = RollbackState(path)
    state.record(SeriesIdentity("cost-table", {"gpu": "\u00e9"}), 2)
    key = "cost-table:" + hashlib.sha256(b'{"gpu":"\\u00e9"}').hexdigest()
    assert path.read_bytes() == (
        b'{"legacy_series":{},"schema_version":2,"series":{"'
        + key.encode()
        + b'":{"binding":{"gpu":"\\u00e9"},"kind":"cost-table","version":2}},"trust_root":null}'
    )


def test_schema_1_state_is_read_as_legacy_and_migrated(tmp_path: Path) -> None:
    """A file written before series identities keeps refusing what it refused."""
    path = tmp_path / "state.json"
    path.write_bytes(b'{"schema_version":1,"series":{"cost-table:old":7}}')
    state = RollbackState(path)
    old = ident(legacy="cost-table:old")
    assert state.highest(old) == 7
    finding = state.check(old, 6)
    assert finding is not None and finding.reason is Reason.ROLLBACK
    assert state.highest(ident()) is None  # no legacy key: not that series
    state.record(ident(), 8)
    data = json.loads(path.read_bytes())
    assert data["schema_version"] == 2 and data["legacy_series"] == {"cost-table:old": 7}
    assert state.highest(old) == 8  # the new entry and the legacy one are the same series


def test_state_survives_a_new_instance(tmp_path: Path) -> None:
    RollbackState(tmp_path / "state.json").record(ident(), 9)
    assert RollbackState(tmp_path / "state.json").highest(ident()) == 9


def test_parent_directory_is_created(tmp_path: Path) -> None:
    state = RollbackState(tmp_path / "var" / "lib" / "dspark" / "state.json")
    state.record(ident(), 1)
    assert state.highest(ident()) == 1


@pytest.mark.parametrize("version", [-1, True, 1.0, None], ids=["negative", "bool", "float", "none"])
def test_caller_bugs_raise_value_error(tmp_path: Path, version: object) -> None:
    state = RollbackState(tmp_path / "state.json")
    with pytest.raises(ValueError):
        state.record(ident(), version)  # type: ignore[arg-type]  # wrong types are the test
    with pytest.raises(ValueError):
        state.check(ident(), version)  # type: ignore[arg-type]  # wrong types are the test
    with pytest.raises(ValueError):
        SeriesIdentity("", {})
    with pytest.raises(ValueError):
        SeriesIdentity("cost-table", None)  # type: ignore[arg-type]  # wrong types are the test


# ---------------------------------------------------------------------------------------------
# corruption: one row per way the file can be wrong
# ---------------------------------------------------------------------------------------------

_KEY = "cost-table:" + hashlib.sha256(b'{"gpu":"s"}').hexdigest()


def _v2(series: str = "{}", root: str = "null", legacy: str = "{}") -> bytes:
    return (f'{{"legacy_series":{legacy},"schema_version":2,"series":{series},"trust_root":{root}}}').encode()


def _entry(**changes: object) -> str:
    entry: dict[str, object] = {"kind": "cost-table", "binding": {"gpu": "s"}, "version": 1, **changes}
    return json.dumps({_KEY: entry})


CORRUPT: list[tuple[str, bytes]] = [
    ("empty-file", b""),
    ("not-json", b"{"),
    ("not-utf8", b"\xff"),
    ("truncated", b'{"schema_version":1,"series":{"s":'),
    ("duplicate-key", b'{"schema_version":1,"series":{"s":1,"s":9}}'),
    ("nan", b'{"schema_version":1,"series":{"s":NaN}}'),
    ("huge-integer", b'{"schema_version":1,"series":{"s":' + b"9" * 5000 + b"}}"),
    ("top-level-list", b"[]"),
    ("missing-series", b'{"schema_version":1}'),
    ("missing-schema-version", b'{"series":{}}'),
    ("extra-key", b'{"schema_version":1,"series":{},"x":1}'),
    ("schema-version-3", b'{"schema_version":3,"series":{}}'),
    ("schema-version-bool", b'{"schema_version":true,"series":{}}'),
    ("schema-version-string", b'{"schema_version":"1","series":{}}'),
    ("series-list", b'{"schema_version":1,"series":[]}'),
    ("version-negative", b'{"schema_version":1,"series":{"s":-1}}'),
    ("version-float", b'{"schema_version":1,"series":{"s":1.5}}'),
    ("version-bool", b'{"schema_version":1,"series":{"s":true}}'),
    ("version-string", b'{"schema_version":1,"series":{"s":"3"}}'),
    ("version-null", b'{"schema_version":1,"series":{"s":null}}'),
    ("empty-series-name", b'{"schema_version":1,"series":{"":1}}'),
    # schema 2
    ("v2-missing-trust-root", b'{"legacy_series":{},"schema_version":2,"series":{}}'),
    ("v2-extra-key", b'{"legacy_series":{},"schema_version":2,"series":{},"trust_root":null,"x":1}'),
    ("v2-series-list", _v2(series="[]")),
    ("v2-entry-not-object", _v2(series=json.dumps({_KEY: 1}))),
    ("v2-entry-extra-field", _v2(series=_entry(extra=1))),
    ("v2-entry-kind-empty", _v2(series=_entry(kind=""))),
    ("v2-entry-binding-list", _v2(series=_entry(binding=[]))),
    ("v2-entry-version-negative", _v2(series=_entry(version=-1))),
    ("v2-entry-version-float", _v2(series=_entry(version=2.0))),
    ("v2-entry-key-mismatch", _v2(series=_entry(binding={"gpu": "other"}))),
    ("v2-legacy-not-object", _v2(legacy="[]")),
    ("v2-legacy-version-bool", _v2(legacy='{"s":false}')),
    ("v2-root-not-object", _v2(root="1")),
    ("v2-root-version-zero", _v2(root='{"root":{},"sha256":"00","version":0}')),
    ("v2-root-digest-mismatch", _v2(root='{"root":{},"sha256":"00","version":1}')),
    ("v2-root-extra-field", _v2(root='{"root":{},"sha256":"00","version":1,"x":1}')),
]


@pytest.mark.parametrize(("case", "content"), CORRUPT, ids=[c[0] for c in CORRUPT])
def test_corrupt_state_fails_closed_and_is_left_untouched(tmp_path: Path, case: str, content: bytes) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    state = RollbackState(path)
    assert _reason(lambda: state.highest(ident())) is Reason.STATE_CORRUPT
    assert _reason(lambda: state.check(ident(), 1)) is Reason.STATE_CORRUPT
    assert _reason(lambda: state.record(ident(), 5)) is Reason.STATE_CORRUPT
    assert path.read_bytes() == content


def test_oversized_state_is_corrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dspark_calibrate.artifacts import _state

    monkeypatch.setattr(_state, "MAX_STATE_BYTES", 16)
    path = tmp_path / "state.json"
    path.write_bytes(b'{"schema_version":1,"series":{"s":1}}')
    assert _reason(lambda: RollbackState(path).highest(ident())) is Reason.STATE_CORRUPT


# ---------------------------------------------------------------------------------------------
# I/O faults
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "err", [errno.ENOSPC, errno.EACCES, errno.EROFS, errno.EDQUOT], ids=errno.errorcode.get
)
def test_write_fault_is_unwritable_and_old_state_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    path = tmp_path / "state.json"
    state = RollbackState(path)
    state.record(ident(), 1)
    before = path.read_bytes()

    def failing_write(fd: int, data: object) -> None:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(_atomic, "_write_all", failing_write)
    with pytest.raises(StateError) as info:
        state.record(ident(), 2)
    assert info.value.reason is Reason.STATE_UNWRITABLE
    assert str(path) in str(info.value)
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []
    monkeypatch.undo()
    state.record(ident(), 2)  # the lock was released: a later update works
    assert state.highest(ident()) == 2


def test_fifo_state_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO where the state file should be is an I/O error at once, never a wait for a writer."""
    path = tmp_path / "state.json"
    os.mkfifo(path)
    state = RollbackState(path)
    with fifo_watchdog(tmp_path):
        start = time.monotonic()
        assert _reason(lambda: state.highest(ident())) is Reason.IO_ERROR
        assert _reason(lambda: state.record(ident(), 1)) is Reason.IO_ERROR
        assert _reason(lambda: state.trust_root()) is Reason.IO_ERROR
        assert time.monotonic() - start < HANG_S / 2
    assert stat.S_ISFIFO(path.lstat().st_mode)  # left as it was


def test_parent_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    state = RollbackState(tmp_path / "file" / "state.json")
    assert _reason(lambda: state.record(ident(), 1)) is Reason.STATE_UNWRITABLE


def test_state_path_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "state.json").mkdir()
    state = RollbackState(tmp_path / "state.json")
    assert _reason(lambda: state.highest(ident())) is Reason.IO_ERROR
    assert _reason(lambda: state.record(ident(), 1)) is Reason.IO_ERROR


@pytest.mark.skipif(IS_ROOT, reason="root ignores directory permissions")
def test_read_only_directory_is_unwritable(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    state = RollbackState(directory / "state.json")
    state.record(ident(), 1)
    directory.chmod(0o500)
    try:
        assert _reason(lambda: state.record(ident(), 2)) is Reason.STATE_UNWRITABLE
        assert state.highest(ident()) == 1
    finally:
        directory.chmod(0o700)


# ---------------------------------------------------------------------------------------------
# locking and concurrency
# ---------------------------------------------------------------------------------------------


def _hold_lock(
    lock_path: str, ready: multiprocessing.synchronize.Event, release: multiprocessing.synchronize.Event
) -> None:
    with FileLock(lock_path):
        ready.set()
        release.wait(10)


def test_lock_held_elsewhere_is_state_locked(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = RollbackState(path, lock_timeout_s=0.2)
    state.record(ident(), 1)
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(f"{path}.lock", ready, release))
    holder.start()
    try:
        assert ready.wait(10)
        start = time.monotonic()
        assert _reason(lambda: state.record(ident(), 2)) is Reason.STATE_LOCKED
        assert time.monotonic() - start < 5
        assert state.highest(ident()) == 1  # reading needs no lock
    finally:
        release.set()
        holder.join(10)
    state.record(ident(), 2)
    assert state.highest(ident()) == 2


def test_default_lock_wait_is_inside_the_serving_budget(tmp_path: Path) -> None:
    """Another holder makes an update fail closed within the default wait (<= 100 ms), not 2 s."""
    assert DEFAULT_STATE_LOCK_TIMEOUT_S <= 0.1
    path = tmp_path / "state.json"
    state = RollbackState(path)
    lock = FileLock(f"{path}.lock")
    with lock:  # held by this process through another file descriptor: flock excludes it too
        start = time.monotonic()
        assert _reason(lambda: state.record(ident(), 1)) is Reason.STATE_LOCKED
        waited = time.monotonic() - start
    assert DEFAULT_STATE_LOCK_TIMEOUT_S <= waited < 1.0
    state.record(ident(), 1)


def test_lock_of_a_dead_holder_is_released(tmp_path: Path) -> None:
    """A kernel lock dies with its process: a crashed verifier cannot wedge the others."""
    path = tmp_path / "state.json"
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(f"{path}.lock", ready, release))
    holder.start()
    assert ready.wait(10)
    holder.kill()
    holder.join(10)
    RollbackState(path, lock_timeout_s=2).record(ident(), 1)
    assert RollbackState(path).highest(ident()) == 1


def _record_many(path: str, worker: int, rounds: int) -> None:
    state = RollbackState(Path(path), lock_timeout_s=30)
    versions = [worker + 8 * r for r in range(rounds)]
    random.Random(worker).shuffle(versions)
    for version in versions:
        state.record(ident("shared"), version)
        state.record(ident(f"own-{worker}"), version)


def test_the_replaced_file_is_freed_after_the_lock_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old state's inode is held open across the rename and closed after the lock: freeing
    its blocks is not part of the time other verifiers wait."""
    from dspark_calibrate.artifacts import _state

    path = tmp_path / "state.json"
    state = RollbackState(path)
    state.record(ident(), 1)
    old_inode = path.stat().st_ino
    # Closes of a descriptor of the old file once it has been replaced (the last reference: the
    # close that frees it), and whether this update still held the lock then.
    freed: list[bool] = []
    real_close = os.close

    def lock_held() -> bool:
        probe = os.open(f"{path}.lock", os.O_RDWR)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            real_close(probe)  # also drops the probe's own lock, if it got one
        return False

    def close(fd: int) -> None:
        if os.fstat(fd).st_ino == old_inode and path.stat().st_ino != old_inode:
            freed.append(lock_held())
        real_close(fd)

    monkeypatch.setattr(_state.os, "close", close)
    state.record(ident(), 2)
    monkeypatch.undo()
    assert path.stat().st_ino != old_inode  # replaced
    assert freed == [False]  # held across the rename, closed once the lock was released
    assert RollbackState(path).highest(ident()) == 2


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_updates_leak_no_descriptor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither a write, nor an update with nothing to write, nor a failed write keeps the
    replaced file (or the lock) open."""
    path = tmp_path / "state.json"
    state = RollbackState(path)
    state.record(ident(), 1)
    before = _open_fds()
    state.record(ident(), 2)
    RollbackState(path).update([(ident(), 1)], root=None)  # holds everything already
    fresh = RollbackState(path)
    fresh.update([(ident("other"), 1)])

    def failing_write(fd: int, data: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(_atomic, "_write_all", failing_write)
    assert _reason(lambda: state.record(ident(), 3)) is Reason.STATE_UNWRITABLE
    monkeypatch.undo()
    assert _open_fds() == before
    assert RollbackState(path).highest(ident()) == 2


def test_eight_processes_keep_the_maximum_and_the_file_always_parses(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    rounds = 6
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_record_many, args=(str(path), w, rounds)) for w in range(8)]
    for w in workers:
        w.start()
    reads = 0
    while any(w.is_alive() for w in workers):
        if path.exists():
            # Every observed state is complete and valid (atomic replacement), never a partial file.
            data = json.loads(path.read_bytes())
            assert data["schema_version"] == 2
            reads += 1
        time.sleep(0.001)
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    state = RollbackState(path)
    assert state.highest(ident("shared")) == 7 + 8 * (rounds - 1)
    for worker in range(8):
        assert state.highest(ident(f"own-{worker}")) == worker + 8 * (rounds - 1)
    assert _leftovers(tmp_path) == []
    assert reads > 0


def test_repr_names_the_file(tmp_path: Path) -> None:
    state = RollbackState(tmp_path / "state.json")
    assert "state.json" in repr(state)
    assert state.path == tmp_path / "state.json"
    with pytest.raises(ValueError):
        RollbackState(tmp_path / "x", lock_timeout_s=-1)


# ---------------------------------------------------------------------------------------------
# who may touch the state: created private whatever the umask, refused when another user could
# ---------------------------------------------------------------------------------------------

OTHER_UID = 65534  # nobody


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_state_and_new_directories_are_private_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "new" / "sub" / "state.json"
    old = os.umask(umask)
    try:
        RollbackState(path).record(ident(), 1)
    finally:
        os.umask(old)
    modes = {p: stat.S_IMODE(os.stat(p).st_mode) for p in (path.parent.parent, path.parent)}
    assert modes == {path.parent.parent: 0o700, path.parent: 0o700}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(f"{path}.lock").st_mode) == 0o600


def test_an_old_public_lock_is_made_private(tmp_path: Path) -> None:
    """Older versions left the lock 0644: anyone could open it and hold it."""
    path = tmp_path / "state.json"
    Path(f"{path}.lock").touch(mode=0o644)
    os.chmod(f"{path}.lock", 0o644)
    RollbackState(path).record(ident(), 1)
    assert stat.S_IMODE(os.stat(f"{path}.lock").st_mode) == 0o600


@pytest.mark.parametrize(
    ("name", "spoil"),
    [
        ("state-world-writable", lambda p: os.chmod(p, 0o666)),
        ("state-group-writable", lambda p: os.chmod(p, 0o660)),
        ("directory-world-writable", lambda p: os.chmod(p.parent, 0o777)),
        ("directory-group-writable", lambda p: os.chmod(p.parent, 0o770)),
    ],
)
def test_a_state_others_may_change_is_insecure(
    tmp_path: Path, name: str, spoil: Callable[[Path], None]
) -> None:
    path = tmp_path / "d" / "state.json"
    state = RollbackState(path)
    state.record(ident(), 2)
    spoil(path)
    assert _reason(lambda: state.highest(ident())) is Reason.STATE_INSECURE
    assert _reason(lambda: state.record(ident(), 3)) is Reason.STATE_INSECURE
    assert json.loads(path.read_bytes())["series"]  # left as it was


def test_a_sticky_shared_directory_is_accepted(tmp_path: Path) -> None:
    """With the sticky bit (/tmp), others cannot delete or rename this user's files."""
    path = tmp_path / "shared" / "state.json"
    path.parent.mkdir()
    os.chmod(path.parent, 0o1777)
    RollbackState(path).record(ident(), 1)
    assert RollbackState(path).highest(ident()) == 1


@pytest.mark.skipif(not IS_ROOT, reason="handing a file to another user needs root")
@pytest.mark.parametrize("what", ["state", "lock", "directory"])
def test_a_state_another_user_owns_is_insecure(tmp_path: Path, what: str) -> None:
    path = tmp_path / "d" / "state.json"
    RollbackState(path).record(ident(), 1)
    target = {"state": path, "lock": Path(f"{path}.lock"), "directory": path.parent}[what]
    os.chown(target, OTHER_UID, OTHER_UID)
    state = RollbackState(path)
    assert _reason(lambda: state.record(ident(), 2)) is Reason.STATE_INSECURE


def test_a_lock_that_is_a_symlink_is_never_followed(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, f"{path}.lock")
    assert _reason(lambda: RollbackState(path).record(ident(), 1)) is Reason.STATE_INSECURE
    assert victim.read_bytes() == b"precious"


def _open_as_other(paths: list[str], result: multiprocessing.queues.Queue) -> None:  # type: ignore[type-arg]
    os.setgid(OTHER_UID)
    os.setuid(OTHER_UID)
    for path in paths:
        try:
            os.close(os.open(path, os.O_RDONLY))
        except PermissionError:
            result.put("refused")
        else:
            result.put("opened")


@pytest.mark.skipif(not IS_ROOT, reason="acting as another user needs root")
def test_another_user_cannot_open_the_lock() -> None:
    """flock needs only read access: a lock others can open is a lock others can hold forever."""
    import shutil
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="dspark-lock-", dir="/tmp"))  # reachable by others
    try:
        os.chmod(shared, 0o755)
        path = shared / "state.json"
        RollbackState(path).record(ident(), 1)
        control = shared / "readable"
        control.touch()
        os.chmod(control, 0o644)  # the old lock's mode: the other user can open that
        ctx = multiprocessing.get_context("fork")
        result = ctx.Queue()
        child = ctx.Process(target=_open_as_other, args=([str(control), f"{path}.lock"], result))
        child.start()
        child.join(30)
        assert [result.get(timeout=5), result.get(timeout=5)] == ["opened", "refused"]
    finally:
        shutil.rmtree(shared)


def test_a_snapshot_reads_once_and_its_update_loses_nothing(tmp_path: Path) -> None:
    """One admission checks against one reading of the state; its update re-reads under the lock,
    so what another verifier recorded meanwhile is kept (and seen from then on)."""
    path = tmp_path / "state.json"
    RollbackState(path).record(ident("a"), 1)
    mine = RollbackState(path, snapshot=True)
    assert mine.highest(ident("a")) == 1
    RollbackState(path).record(ident("a"), 5)  # another verifier, meanwhile
    assert mine.highest(ident("a")) == 1  # the snapshot
    mine.record(ident("b"), 2)
    assert RollbackState(path).highest(ident("a")) == 5 and RollbackState(path).highest(ident("b")) == 2
    assert mine.highest(ident("a")) == 5  # its own update read the file again
    assert RollbackState(path).highest(ident("a")) == 5
