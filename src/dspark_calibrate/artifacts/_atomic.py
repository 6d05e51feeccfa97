"""Atomic, durable file writes: a reader sees the old file or the whole new one, never a part.

The one primitive every writer in the package uses (Parquet artifacts, envelopes, keys, the trust
root, the rollback state, engine options). It imports only the standard library, so ``calibrate``
can use it on GPU images without ``cryptography`` (DESIGN §3). It does not lock: callers that
read-modify-write (the rollback state) hold their own lock around it.

A write replaces a regular file, or creates one; it never replaces anything else. A rename over a
device node, a FIFO or a socket would silently remove it (``--emit-trtllm-options /dev/full`` run
as root once turned the device into a YAML file), so :func:`check_output_path` refuses them, and
refuses a symlink to another directory (the write would replace the link, not the file the user
meant); a symlink to a file in the same directory is written through (versioned configs).
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
from pathlib import Path

__all__ = [
    "atomic_write_bytes",
    "check_output_path",
    "fsync_directory",
    "make_private_dirs",
    "publish_directory",
]

# Errors from os.link() that mean "this filesystem has no hard links" (FAT, some FUSE and network
# mounts), as opposed to "the target exists" or a real I/O fault.
_NO_HARDLINK_ERRNOS = frozenset(
    {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}
)

# Flags for files we create. O_NOFOLLOW: a symlink planted at the temporary name must not redirect
# the write; O_EXCL: the temporary name must be new, so no other process shares the inode.
_CREATE_FLAGS = (
    os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` to ``fd`` (os.write may write less than asked)."""
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _create_exclusive(path: Path, mode: int) -> int:
    """Create ``path`` (which must not exist) with exactly ``mode`` and return its descriptor.

    ``os.open`` applies the umask, which can only remove bits, so the file is never wider than
    ``mode`` at any moment; ``fchmod`` then sets exactly ``mode`` (the umask may have removed bits
    the caller asked for, e.g. group read on a public file).
    """
    fd = os.open(path, _CREATE_FLAGS, mode)
    try:
        os.fchmod(fd, mode)
    except OSError:
        os.close(fd)
        raise
    return fd


def _not_a_file(path: Path, what: str, code: int = errno.EINVAL) -> OSError:
    # OSError(errno, ...) is the errno's own subclass (EISDIR: IsADirectoryError).
    return OSError(code, f"{what}; give the path of a regular file (or of a new one)", str(path))


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """Where a write to ``path`` lands: ``path`` itself, or the file a symlink in the same
    directory names.

    Returns:
        The path to write (missing, or an existing regular file).

    Raises:
        OSError: ``EISDIR`` for a directory; ``EINVAL`` for a device, FIFO or socket, or a symlink
            to one of those or to another directory.
    """
    target = Path(path)
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return target
    if stat.S_ISREG(info.st_mode):
        return target
    if stat.S_ISDIR(info.st_mode):
        raise _not_a_file(target, "a directory", errno.EISDIR)
    if not stat.S_ISLNK(info.st_mode):
        raise _not_a_file(target, "not a regular file (a device, FIFO or socket)")
    resolved = Path(os.path.realpath(target))
    if resolved.parent != Path(os.path.realpath(target.parent)):
        raise _not_a_file(target, f"a symlink out of its directory (to {resolved})")
    try:
        info = os.lstat(resolved)
    except FileNotFoundError:
        return resolved
    if not stat.S_ISREG(info.st_mode):
        raise _not_a_file(target, f"a symlink to {resolved}, which is not a regular file")
    return resolved


def fsync_directory(directory: Path) -> None:
    """Make a rename or link in ``directory`` durable.

    Some filesystems refuse fsync on a directory (EINVAL); the rename is still atomic there, only
    its durability across a power loss is up to the filesystem, so that one error is tolerated.
    """
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    finally:
        os.close(fd)


def _write_in_place_exclusive(path: Path, data: bytes | bytearray | memoryview, mode: int) -> None:
    """No-clobber fallback for filesystems without hard links: create ``path`` with O_EXCL.

    The file becomes visible before it is complete, but it is never written over an existing file;
    a partial file is removed on failure.
    """
    fd = _create_exclusive(path, mode)
    complete = False
    try:
        _write_all(fd, data)
        os.fsync(fd)
        complete = True
    finally:
        os.close(fd)
        if not complete:
            path.unlink(missing_ok=True)


def atomic_write_bytes(
    path: str | os.PathLike[str],
    data: bytes | bytearray | memoryview,
    *,
    mode: int = 0o644,
    overwrite: bool = True,
    sync_directory: bool = True,
) -> None:
    """Write ``data`` to ``path`` atomically and durably.

    The bytes go to a new temporary file in the same directory (so the final rename cannot cross
    filesystems), created with ``mode`` from the start: a 0600 private key is never readable by
    others, not even for an instant. The temporary file is fsynced, renamed over ``path``
    (``os.replace``), and the directory is fsynced so the rename survives a crash. On any failure,
    including KeyboardInterrupt, the temporary file is removed and an existing ``path`` is left as
    it was.

    Args:
        path: the destination file.
        data: the complete new content.
        mode: permission bits of the new file (exactly these; the umask does not widen or narrow
            the final file, and never widens it in between).
        overwrite: when False, refuse to replace an existing ``path`` (``FileExistsError``). The
            file is published with ``os.link``, which fails instead of replacing, so two writers
            racing for a new name cannot silently overwrite each other.
        sync_directory: fsync the directory after the rename (default). A caller that holds a
            lock around the write may pass False and call :func:`fsync_directory` after
            releasing it, before relying on the write.

    Raises:
        FileExistsError: ``overwrite`` is False and ``path`` exists.
        OSError: ``overwrite`` and ``path`` is not a regular file (:func:`check_output_path`), the directory is
            missing or unwritable, the disk is full, ... (the caller maps it to its own error type
            with the path and the fix).
        TypeError: ``data`` is not bytes-like.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"atomic_write_bytes needs bytes, got {type(data).__name__}")
    # Without overwrite nothing existing is touched (link() fails on any name that exists, a
    # dangling symlink included), so only a replacing write needs to know what it would replace.
    target = check_output_path(path) if overwrite else Path(path)
    directory = target.parent
    # A random suffix, not the pid: two threads of one process must not collide either.
    tmp = directory / f".{target.name}.{secrets.token_hex(8)}.tmp"
    fd = _create_exclusive(tmp, mode)
    published = False
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if overwrite:
            os.replace(tmp, target)
        else:
            try:
                # link() never replaces: it fails with EEXIST when the name is taken.
                os.link(tmp, target)
            except FileExistsError:
                raise
            except OSError as exc:
                if exc.errno not in _NO_HARDLINK_ERRNOS:
                    raise
                _write_in_place_exclusive(target, data, mode)
        published = True
        if sync_directory:
            fsync_directory(directory)
    finally:
        # After os.replace the temporary name is gone; in every other case it is still ours.
        if not (published and overwrite):
            tmp.unlink(missing_ok=True)


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and any missing parents with mode exactly 0700, whatever the umask.

    ``mkdir(mode=...)`` is narrowed by the umask, and ``mkdir -p`` (``parents=True``) gives the
    parents the umask's default mode (0777 under ``umask 000``): a directory holding a private key
    or the rollback state must never be writable or listable by others, so each level created
    here is chmod-ed to 0700. Existing directories are left as they are (their callers check them).

    Raises:
        OSError: a level cannot be created, or exists and is not a directory.
    """
    missing: list[Path] = []
    level = Path(directory)
    while not level.is_dir():
        missing.append(level)
        if level.parent == level:
            break
        level = level.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not path.is_dir():
                raise
            continue  # made concurrently by another process: checked like any existing directory
        os.chmod(path, 0o700)  # mkdir's mode is narrowed by the umask; make it exact


def publish_directory(staged: Path, out: Path) -> None:
    """Replace ``out`` with the fully written directory ``staged`` (same parent directory).

    A previous ``out`` is first moved aside, then ``staged`` is renamed into place and the old one
    removed, so readers see either the old or the new directory, never a mix; on failure the old
    one is put back.

    Raises:
        OSError: ``out`` exists and is not a directory (a file, a device, a symlink: refused
            before anything moves), or a rename failed (``staged`` is left for the caller to
            remove).
    """
    backup = None
    try:
        info = os.lstat(out)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISDIR(info.st_mode):
        raise OSError(
            errno.ENOTDIR,
            "not a directory (or a symlink); give a new path or an existing directory",
            str(out),
        )
    if info is not None:
        backup = out.parent / f".{out.name}.old-{secrets.token_hex(6)}"
        os.replace(out, backup)
    try:
        os.replace(staged, out)
    except OSError:
        if backup is not None:
            os.replace(backup, out)
        raise
    fsync_directory(out.parent)
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)
