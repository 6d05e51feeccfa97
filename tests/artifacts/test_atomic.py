"""Tests of atomic_write_bytes: all-or-nothing replacement, exact modes, cleanup, no-clobber."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dspark_calibrate.artifacts import _atomic
from dspark_calibrate.artifacts._atomic import atomic_write_bytes, check_output_path, publish_directory


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_writes_new_file(tmp_path: Path) -> None:
    target = tmp_path / "a.bin"
    atomic_write_bytes(target, b"hello")
    assert target.read_bytes() == b"hello"
    assert _leftovers(tmp_path) == []


def test_replaces_existing_file_as_a_new_inode(tmp_path: Path) -> None:
    target = tmp_path / "a.bin"
    target.write_bytes(b"old content")
    with open(target, "rb") as reader:
        atomic_write_bytes(target, b"new")
        # A reader that opened the old file keeps seeing the old, complete content.
        assert reader.read() == b"old content"
    assert target.read_bytes() == b"new"


@pytest.mark.parametrize(
    ("umask_bits", "mode"),
    [(0o000, 0o600), (0o077, 0o644), (0o022, 0o600), (0o000, 0o644), (0o027, 0o640)],
    ids=["private-under-open-umask", "public-under-strict-umask", "private", "public", "group"],
)
def test_final_mode_is_exactly_the_requested_mode(tmp_path: Path, umask_bits: int, mode: int) -> None:
    old = os.umask(umask_bits)
    try:
        atomic_write_bytes(tmp_path / "f", b"x", mode=mode)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "f") == mode


def test_private_file_is_never_wider_than_requested(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Observe the temporary file's mode at the moment its data is fsynced (umask fully open)."""
    seen: list[int] = []
    real_fsync = os.fsync

    def spy(fd: int) -> None:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            seen.append(stat.S_IMODE(st.st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    old = os.umask(0)
    try:
        atomic_write_bytes(tmp_path / "key.pem", b"secret", mode=0o600)
    finally:
        os.umask(old)
    assert seen == [0o600]


def test_replacing_a_wide_file_with_a_private_one_narrows_it(tmp_path: Path, umask: None) -> None:
    target = tmp_path / "k"
    target.write_bytes(b"x")
    target.chmod(0o666)
    atomic_write_bytes(target, b"y", mode=0o600)
    assert _mode(target) == 0o600


@pytest.mark.parametrize(
    "fault",
    ["enospc-on-write", "eio-on-fsync", "keyboard-interrupt"],
)
def test_failure_removes_temp_file_and_keeps_old_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    target = tmp_path / "state.json"
    target.write_bytes(b"old")

    def fail_write(fd: int, data: object) -> None:
        if fault == "keyboard-interrupt":
            raise KeyboardInterrupt
        raise OSError(errno.ENOSPC, "No space left on device")

    def fail_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    if fault == "eio-on-fsync":
        monkeypatch.setattr(os, "fsync", fail_fsync)
    else:
        monkeypatch.setattr(_atomic, "_write_all", fail_write)
    expected: type[BaseException] = KeyboardInterrupt if fault == "keyboard-interrupt" else OSError
    with pytest.raises(expected):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert _leftovers(tmp_path) == []


def test_target_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError):
        atomic_write_bytes(tmp_path / "d", b"x")
    assert _leftovers(tmp_path) == []


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        atomic_write_bytes(tmp_path / "missing" / "f", b"x")


def test_refuses_non_bytes(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        atomic_write_bytes(tmp_path / "f", "text")  # type: ignore[arg-type]  # the wrong type is the test


def test_accepts_bytearray_and_memoryview(tmp_path: Path) -> None:
    atomic_write_bytes(tmp_path / "a", bytearray(b"ab"))
    atomic_write_bytes(tmp_path / "b", memoryview(b"cd"))
    assert (tmp_path / "a").read_bytes() == b"ab"
    assert (tmp_path / "b").read_bytes() == b"cd"


def test_large_write_is_complete(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    atomic_write_bytes(tmp_path / "big", data)
    assert (tmp_path / "big").read_bytes() == data


class TestNoOverwrite:
    def test_creates_new_file(self, tmp_path: Path, umask: None) -> None:
        atomic_write_bytes(tmp_path / "k.pem", b"key", mode=0o600, overwrite=False)
        assert (tmp_path / "k.pem").read_bytes() == b"key"
        assert _mode(tmp_path / "k.pem") == 0o600
        assert _leftovers(tmp_path) == []

    def test_refuses_existing_file(self, tmp_path: Path) -> None:
        (tmp_path / "k.pem").write_bytes(b"original")
        with pytest.raises(FileExistsError):
            atomic_write_bytes(tmp_path / "k.pem", b"replacement", overwrite=False)
        assert (tmp_path / "k.pem").read_bytes() == b"original"
        assert _leftovers(tmp_path) == []

    def test_refuses_dangling_symlink(self, tmp_path: Path) -> None:
        (tmp_path / "k.pem").symlink_to(tmp_path / "elsewhere")
        with pytest.raises(FileExistsError):
            atomic_write_bytes(tmp_path / "k.pem", b"x", overwrite=False)
        assert not (tmp_path / "elsewhere").exists()

    @pytest.mark.parametrize("exists", [False, True], ids=["new", "existing"])
    def test_fallback_without_hard_links(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exists: bool, umask: None
    ) -> None:
        def no_links(src: object, dst: object, **kwargs: object) -> None:
            raise OSError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(os, "link", no_links)
        target = tmp_path / "k.pem"
        if exists:
            target.write_bytes(b"original")
            with pytest.raises(FileExistsError):
                atomic_write_bytes(target, b"new", mode=0o600, overwrite=False)
            assert target.read_bytes() == b"original"
        else:
            atomic_write_bytes(target, b"new", mode=0o600, overwrite=False)
            assert target.read_bytes() == b"new"
            assert _mode(target) == 0o600
        assert _leftovers(tmp_path) == []


def test_concurrent_writers_never_expose_a_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "shared"
    payloads = [bytes([i]) * 65536 for i in range(4)]
    atomic_write_bytes(target, payloads[0])
    stop = threading.Event()
    bad: list[bytes] = []

    def writer(data: bytes) -> None:
        for _ in range(25):
            atomic_write_bytes(target, data)

    def reader() -> None:
        while not stop.is_set():
            content = target.read_bytes()
            if content not in payloads:
                bad.append(content[:16])

    threads = [threading.Thread(target=writer, args=(p,)) for p in payloads]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert bad == []
    assert _leftovers(tmp_path) == []


def test_module_imports_without_cryptography() -> None:
    """calibrate writes through this module on GPU images that may lack cryptography (DESIGN §3)."""
    code = (
        "import sys; sys.modules['cryptography'] = None\n"
        "import importlib.util, pathlib\n"
        f"spec = importlib.util.spec_from_file_location('atomic_only', {str(Path(_atomic.__file__))!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "assert 'cryptography' not in {k for k, v in sys.modules.items() if v is not None}\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_publish_directory_replaces_whole(tmp_path: Path) -> None:
    from dspark_calibrate.artifacts import publish_directory

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    staged = tmp_path / ".out.staged"
    staged.mkdir()
    (staged / "new.txt").write_text("new")
    publish_directory(staged, out)
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging or backup left
    # A first publish, with nothing to replace.
    fresh = tmp_path / ".fresh.staged"
    fresh.mkdir()
    publish_directory(fresh, tmp_path / "fresh")
    assert (tmp_path / "fresh").is_dir() and not fresh.exists()


# --- a write replaces a regular file or creates one, never anything else ---


def _device(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))  # /dev/full's numbers


NOT_REGULAR = [
    ("character-device", _device, OSError),
    ("fifo", lambda p: os.mkfifo(p), OSError),
    ("directory", lambda p: p.mkdir(), IsADirectoryError),
    ("symlink-to-another-directory", lambda p: p.symlink_to(p.parent.parent / "outside"), OSError),
    ("symlink-to-a-fifo", lambda p: (os.mkfifo(p.with_name("f")), p.symlink_to("f")), OSError),
]


@pytest.mark.parametrize(("name", "make", "error"), NOT_REGULAR, ids=[c[0] for c in NOT_REGULAR])
def test_what_is_not_a_regular_file_is_never_replaced(
    tmp_path: Path, name: str, make: Any, error: type[OSError]
) -> None:
    target = tmp_path / "d" / "out.yaml"
    target.parent.mkdir()
    make(target)
    before = os.lstat(target)
    with pytest.raises(error):
        atomic_write_bytes(target, b"x")
    after = os.lstat(target)
    assert (after.st_ino, after.st_mode) == (before.st_ino, before.st_mode)
    assert _leftovers(target.parent) == []
    assert not (tmp_path / "outside").exists()


def test_a_symlink_in_the_same_directory_is_written_through(tmp_path: Path) -> None:
    (tmp_path / "opts.v1.yaml").write_bytes(b"old")
    (tmp_path / "opts.yaml").symlink_to("opts.v1.yaml")
    atomic_write_bytes(tmp_path / "opts.yaml", b"new")
    assert (tmp_path / "opts.yaml").is_symlink() and (tmp_path / "opts.v1.yaml").read_bytes() == b"new"
    assert check_output_path(tmp_path / "opts.yaml") == (tmp_path / "opts.v1.yaml").resolve()


def test_publish_directory_never_moves_a_non_directory(tmp_path: Path) -> None:
    staged = tmp_path / "staged"
    staged.mkdir()
    out = tmp_path / "out"
    os.mkfifo(out)
    with pytest.raises(NotADirectoryError):
        publish_directory(staged, out)
    assert stat.S_ISFIFO(os.lstat(out).st_mode) and staged.is_dir()
