"""Bounded reads of untrusted files: the one way the serving path reads a file.

A path that should name an artifact, an envelope, a trust root, the rollback state or a config file
may name a FIFO, a device or a directory instead (by mistake or by an attacker with write access
to the directory). ``open()`` on a FIFO blocks until a writer appears, so a serving start would
hang forever. :func:`read_regular_file` opens without blocking, checks the open descriptor with
``fstat`` (the file checked is the file read) and reads at most the caller's limit, so every read
is bounded in time and memory. Imports only the standard library (DESIGN §3: ``calibrate`` may use
it on GPU images without ``cryptography``); ``errors`` is its one import of ours.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from dspark_calibrate.errors import DsparkError

__all__ = ["FileTooLarge", "read_regular_file", "read_regular_file_stat"]

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
_CHUNK = 1 << 20  # bytes per read() call


class FileTooLarge(OSError, DsparkError):
    """A file larger than the caller's limit; refused unread (``errno.EFBIG``).

    An ``OSError`` (callers that report any unreadable file catch it with the rest) and a
    ``DsparkError``.

    Attributes:
        size: the size found, in bytes (at least ``limit + 1`` when the file grew while read).
        limit: the caller's limit, in bytes.
    """

    default_code = "FILE_TOO_LARGE"

    def __init__(self, path: Path | str, size: int, limit: int) -> None:
        super().__init__(errno.EFBIG, f"{size} bytes, above the {limit}-byte limit", str(path))
        self.size = size
        self.limit = limit


def read_regular_file(path: Path | str, max_bytes: int) -> bytes:
    """Read a regular file of at most ``max_bytes`` bytes, without ever blocking.

    Args:
        path: the file.
        max_bytes: the largest size accepted, in bytes.

    Returns:
        The file's bytes.

    Raises:
        FileTooLarge: larger than ``max_bytes`` (before reading, or grown while reading).
        OSError: missing (``FileNotFoundError``), unreadable, or not a regular file (``EINVAL``:
            a FIFO, socket, device or directory).
    """
    return read_regular_file_stat(path, max_bytes)[0]


def read_regular_file_stat(path: Path | str, max_bytes: int) -> tuple[bytes, os.stat_result]:
    """:func:`read_regular_file`, with the ``fstat`` of the descriptor read (owner and mode of
    exactly the file whose bytes are returned).

    Raises:
        FileTooLarge, OSError: as :func:`read_regular_file`.
    """
    fd = os.open(path, _READ_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket, device or directory)", str(path))
        if info.st_size > max_bytes:
            raise FileTooLarge(path, info.st_size, max_bytes)
        chunks = []
        remaining = info.st_size + 1  # one byte more detects growth while reading
        while remaining > 0:
            chunk = os.read(fd, min(remaining, _CHUNK))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            raise FileTooLarge(path, len(data), max_bytes)
        return data, info
    finally:
        os.close(fd)
