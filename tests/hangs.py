"""Turn a hang on a FIFO into a test failure instead of a stuck test run.

A reader that opens a FIFO without O_NONBLOCK blocks until a writer appears. ``fifo_watchdog``
plays that writer after a delay: every FIFO under a directory is opened for writing (which only
succeeds while a reader is blocked on it) and closed at once, so the blocked reader sees end of
file, returns late with a wrong answer, and the test's own time and reason assertions fail.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["HANG_S", "fifo_watchdog"]

#: How long a read may block before the watchdog releases it, in seconds: far above any bounded
#: read, short enough to keep a failing run quick.
HANG_S = 5.0


def _release(directory: Path) -> None:
    for path in directory.rglob("*"):
        try:
            if not stat.S_ISFIFO(path.lstat().st_mode):
                continue
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno not in (errno.ENXIO, errno.ENOENT):  # ENXIO: nobody is reading it
                raise
            continue
        os.close(fd)


@contextlib.contextmanager
def fifo_watchdog(directory: Path, after_s: float = HANG_S) -> Iterator[None]:
    """Release readers blocked on FIFOs under ``directory`` every ``after_s`` seconds."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(after_s):
            _release(directory)

    thread = threading.Thread(target=watch, name="fifo-watchdog", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=after_s + 1)
