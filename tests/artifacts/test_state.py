"""Tests of the rollback state: monotonic versions, corruption, faults, locking, concurrent processes."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

from dspark_calibrate.artifacts import _atomic
from dspark_calibrate.artifacts._reasons import Reason
from dspark_calibrate.artifacts._state import RollbackState, StateError
from dspark_calibrate.errors import DsparkError

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


def test_empty_state(tmp_path: Path) -> None:
    state = RollbackState(tmp_path / "state.json")
    assert state.highest("cost-table:abc") is None
    assert state.check("cost-table:abc", 0) is None
    assert not (tmp_path / "state.json").exists()  # reading creates nothing


def test_record_and_check(tmp_path: Path) -> None:
    state = RollbackState(tmp_path / "state.json")
    state.record("s", 5)
    assert state.highest("s") == 5
    assert state.check("s", 5) is None  # the same artifact again is not a rollback
    assert state.check("s", 6) is None
    finding = state.check("s", 4)
    assert finding is not None
    assert finding.reason is Reason.ROLLBACK
    assert (finding.field, finding.expected, finding.actual) == ("version", 5, 4)
    assert "s" in finding.message and "5" in finding.message


def test_record_never_lowers(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = RollbackState(path)
    state.record("s", 7)
    before = path.stat().st_mtime_ns, path.read_bytes()
    state.record("s", 3)
    state.record("s", 7)
    assert state.highest("s") == 7
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before  # no needless rewrite


def test_series_are_independent(tmp_path: Path) -> None:
    state = RollbackState(tmp_path / "state.json")
    state.record("a", 3)
    state.record("b", 1)
    assert (state.highest("a"), state.highest("b")) == (3, 1)
    assert state.check("b", 2) is None


def test_file_format_is_canonical_json(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = RollbackState(path)
    state.record("b:1", 2)
    state.record("a:\u00e9", 10)
    assert path.read_bytes() == b'{"schema_version":1,"series":{"a:\\u00e9":10,"b:1":2}}'
    assert json.loads(path.read_bytes()) == {"schema_version": 1, "series": {"a:\u00e9": 10, "b:1": 2}}


def test_state_survives_a_new_instance(tmp_path: Path) -> None:
    RollbackState(tmp_path / "state.json").record("s", 9)
    assert RollbackState(tmp_path / "state.json").highest("s") == 9


def test_parent_directory_is_created(tmp_path: Path) -> None:
    state = RollbackState(tmp_path / "var" / "lib" / "dspark" / "state.json")
    state.record("s", 1)
    assert state.highest("s") == 1


@pytest.mark.parametrize(
    ("series", "version"),
    [("", 1), ("s", -1), ("s", True), ("s", 1.0), (None, 1)],
    ids=["empty-series", "negative", "bool", "float", "series-none"],
)
def test_caller_bugs_raise_value_error(tmp_path: Path, series: object, version: object) -> None:
    state = RollbackState(tmp_path / "state.json")
    with pytest.raises(ValueError):
        state.record(series, version)  # type: ignore[arg-type]  # wrong types are the test
    with pytest.raises(ValueError):
        state.check(series, version)  # type: ignore[arg-type]  # wrong types are the test


# ---------------------------------------------------------------------------------------------
# corruption: one row per way the file can be wrong
# ---------------------------------------------------------------------------------------------

CORRUPT: list[tuple[str, bytes]] = [
    ("empty-file", b""),
    ("not-json", b"{"),
    ("not-utf8", b"\xff"),
    ("truncated", b'{"schema_version":1,"series":{"s":'),
    ("duplicate-key", b'{"schema_version":1,"series":{"s":1,"s":9}}'),
    ("nan", b'{"schema_version":1,"series":{"s":NaN}}'),
    ("top-level-list", b"[]"),
    ("missing-series", b'{"schema_version":1}'),
    ("missing-schema-version", b'{"series":{}}'),
    ("extra-key", b'{"schema_version":1,"series":{},"x":1}'),
    ("schema-version-2", b'{"schema_version":2,"series":{}}'),
    ("schema-version-bool", b'{"schema_version":true,"series":{}}'),
    ("schema-version-string", b'{"schema_version":"1","series":{}}'),
    ("series-list", b'{"schema_version":1,"series":[]}'),
    ("version-negative", b'{"schema_version":1,"series":{"s":-1}}'),
    ("version-float", b'{"schema_version":1,"series":{"s":1.5}}'),
    ("version-bool", b'{"schema_version":1,"series":{"s":true}}'),
    ("version-string", b'{"schema_version":1,"series":{"s":"3"}}'),
    ("version-null", b'{"schema_version":1,"series":{"s":null}}'),
    ("empty-series-name", b'{"schema_version":1,"series":{"":1}}'),
]


@pytest.mark.parametrize(("case", "content"), CORRUPT, ids=[c[0] for c in CORRUPT])
def test_corrupt_state_fails_closed_and_is_left_untouched(tmp_path: Path, case: str, content: bytes) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content)
    state = RollbackState(path)
    assert _reason(lambda: state.highest("s")) is Reason.STATE_CORRUPT
    assert _reason(lambda: state.check("s", 1)) is Reason.STATE_CORRUPT
    assert _reason(lambda: state.record("s", 5)) is Reason.STATE_CORRUPT
    assert path.read_bytes() == content


def test_oversized_state_is_corrupt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dspark_calibrate.artifacts import _state

    monkeypatch.setattr(_state, "MAX_STATE_BYTES", 16)
    path = tmp_path / "state.json"
    path.write_bytes(b'{"schema_version":1,"series":{"s":1}}')
    assert _reason(lambda: RollbackState(path).highest("s")) is Reason.STATE_CORRUPT


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
    state.record("s", 1)
    before = path.read_bytes()

    def failing_write(fd: int, data: object) -> None:
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(_atomic, "_write_all", failing_write)
    with pytest.raises(StateError) as info:
        state.record("s", 2)
    assert info.value.reason is Reason.STATE_UNWRITABLE
    assert str(path) in str(info.value)
    assert path.read_bytes() == before
    assert _leftovers(tmp_path) == []
    monkeypatch.undo()
    state.record("s", 2)  # the lock was released: a later update works
    assert state.highest("s") == 2


def test_parent_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    state = RollbackState(tmp_path / "file" / "state.json")
    assert _reason(lambda: state.record("s", 1)) is Reason.STATE_UNWRITABLE


def test_state_path_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "state.json").mkdir()
    state = RollbackState(tmp_path / "state.json")
    assert _reason(lambda: state.highest("s")) is Reason.IO_ERROR
    assert _reason(lambda: state.record("s", 1)) is Reason.IO_ERROR


@pytest.mark.skipif(IS_ROOT, reason="root ignores directory permissions")
def test_read_only_directory_is_unwritable(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    state = RollbackState(directory / "state.json")
    state.record("s", 1)
    directory.chmod(0o500)
    try:
        assert _reason(lambda: state.record("s", 2)) is Reason.STATE_UNWRITABLE
        assert state.highest("s") == 1
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
    state.record("s", 1)
    ctx = multiprocessing.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(f"{path}.lock", ready, release))
    holder.start()
    try:
        assert ready.wait(10)
        start = time.monotonic()
        assert _reason(lambda: state.record("s", 2)) is Reason.STATE_LOCKED
        assert time.monotonic() - start < 5
        assert state.highest("s") == 1  # reading needs no lock
    finally:
        release.set()
        holder.join(10)
    state.record("s", 2)
    assert state.highest("s") == 2


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
    RollbackState(path, lock_timeout_s=2).record("s", 1)
    assert RollbackState(path).highest("s") == 1


def _record_many(path: str, worker: int, rounds: int) -> None:
    state = RollbackState(Path(path), lock_timeout_s=30)
    versions = [worker + 8 * r for r in range(rounds)]
    random.Random(worker).shuffle(versions)
    for version in versions:
        state.record("shared", version)
        state.record(f"own-{worker}", version)


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
            assert data["schema_version"] == 1
            reads += 1
        time.sleep(0.001)
    for w in workers:
        w.join(30)
        assert w.exitcode == 0
    state = RollbackState(path)
    assert state.highest("shared") == 7 + 8 * (rounds - 1)
    for worker in range(8):
        assert state.highest(f"own-{worker}") == worker + 8 * (rounds - 1)
    assert _leftovers(tmp_path) == []
    assert reads > 0


def test_repr_names_the_file(tmp_path: Path) -> None:
    state = RollbackState(tmp_path / "state.json")
    assert "state.json" in repr(state)
    assert state.path == tmp_path / "state.json"
    with pytest.raises(ValueError):
        RollbackState(tmp_path / "x", lock_timeout_s=-1)
