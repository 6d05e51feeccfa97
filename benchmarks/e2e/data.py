"""The offline corpus of the end-to-end experiment: the Python standard library's own source files.

Nothing is downloaded. The corpus is every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``
outside ``site-packages``/``dist-packages`` and the test suites, read as raw bytes (the tokenizer
is the identity on bytes: vocabulary 256). Files are split deterministically by the SHA-256 of
their relative path into a training part (concatenated into one ``uint8`` array) and a held-out
part, from which the prompts of trace collection and of the experiment are cut. Prompts start at
a line start and have a fixed length, so every request prefills the same number of tokens.

This module does file I/O only; it imports neither torch nor the toolkit.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["VOCAB", "Corpus", "load_corpus", "sample_prompts"]

#: Byte-level vocabulary: token id = byte value.
VOCAB = 256
#: Directory names whose files are left out: third-party packages and the (huge, repetitive)
#: test suites, which would dominate the corpus.
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})
#: Share of files (by path hash) kept out of training for prompts.
_HELDOUT_PER_MILLE = 150
#: Separator between concatenated training files.
_SEPARATOR = b"\n\n"


@dataclass(frozen=True, slots=True)
class Corpus:
    """The training bytes and the held-out files.

    Attributes:
        root: the stdlib directory read.
        train: concatenated training files, ``uint8``.
        heldout: held-out file contents, in path order.
        files_train: number of training files.
    """

    root: str
    train: np.ndarray
    heldout: tuple[bytes, ...]
    files_train: int

    def describe(self) -> dict[str, object]:
        """JSON-ready summary for the result file."""
        return {
            "root": self.root,
            "train_bytes": int(self.train.size),
            "train_files": self.files_train,
            "heldout_files": len(self.heldout),
            "heldout_bytes": sum(len(h) for h in self.heldout),
        }


def _stdlib_files(root: Path) -> list[Path]:
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_DIRS.intersection(rel.parts[:-1]):
            continue
        files.append(path)
    return files


def load_corpus(max_train_bytes: int, *, root: str | None = None) -> Corpus:
    """Read the stdlib sources and split them into training bytes and held-out files.

    Args:
        max_train_bytes: cap on the training array (files are taken in path order until full).
        root: directory to read instead of the running interpreter's stdlib (tests).

    Returns:
        The corpus.

    Raises:
        FileNotFoundError: no usable source file was found under the root.
    """
    base = Path(root or sysconfig.get_paths()["stdlib"])
    train_parts: list[bytes] = []
    heldout: list[bytes] = []
    used = 0
    for path in _stdlib_files(base):
        rel = path.relative_to(base).as_posix().encode()
        bucket = int.from_bytes(hashlib.sha256(rel).digest()[:4], "little") % 1000
        try:
            data = path.read_bytes()
        except OSError:
            continue  # unreadable file: the corpus is whatever the machine offers
        if len(data) < 256:
            continue
        if bucket < _HELDOUT_PER_MILLE:
            heldout.append(data)
        elif used < max_train_bytes:
            take = data[: max_train_bytes - used]
            train_parts.append(take + _SEPARATOR)
            used += len(take) + len(_SEPARATOR)
    if not train_parts or not heldout:
        raise FileNotFoundError(f"no Python source files usable as a corpus under {base}")
    train = np.frombuffer(b"".join(train_parts), dtype=np.uint8).copy()
    return Corpus(root=str(base), train=train, heldout=tuple(heldout), files_train=len(train_parts))


def sample_prompts(files: tuple[bytes, ...], count: int, length: int, *, seed: int) -> np.ndarray:
    """Cut ``count`` prompts of exactly ``length`` bytes from ``files``, each starting a line.

    Args:
        files: file contents to cut from (held-out files for serving, training ones for rollouts).
        count: prompts wanted.
        length: bytes per prompt.
        seed: selects files and offsets.

    Returns:
        ``int64`` array of shape ``(count, length)``.

    Raises:
        ValueError: no file is long enough.
    """
    usable = [f for f in files if len(f) > length + 1]
    if not usable:
        raise ValueError(f"no file longer than {length + 1} bytes to cut prompts from")
    rng = np.random.default_rng(seed)
    out = np.empty((count, length), dtype=np.int64)
    for i in range(count):
        data = usable[int(rng.integers(len(usable)))]
        start = int(rng.integers(0, len(data) - length))
        newline = data.rfind(b"\n", 0, start)
        start = 0 if newline < 0 else newline + 1
        start = min(start, len(data) - length)
        out[i] = np.frombuffer(data[start : start + length], dtype=np.uint8)
    return out
