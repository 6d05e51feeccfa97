"""Hypothesis strategies that mutate valid inputs: raw bytes, and JSON documents by structure.

A mutation is data (a tuple of operations), drawn by hypothesis and applied to a seed by a pure
function, so a failing case prints as a short, replayable list of edits.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

__all__ = [
    "INTERESTING_BYTES",
    "INTERESTING_JSON",
    "ByteOp",
    "JsonOp",
    "apply_bytes",
    "apply_json",
    "byte_ops",
    "json_ops",
    "json_text",
]

#: Byte strings that tend to break parsers: boundaries, encodings, numbers past every limit.
INTERESTING_BYTES: tuple[bytes, ...] = (
    b"\x00",
    b"\xff",
    b"\x80",
    b"\xc3\x28",  # invalid UTF-8
    b"\xed\xa0\x80",  # an encoded surrogate (invalid UTF-8)
    b"\\ud800",  # a lone surrogate escape (valid JSON, not encodable as UTF-8)
    b"9" * 5000,  # past Python's int-conversion limit
    b"1e999",
    b"-0",
    b"NaN",
    b"Infinity",
    b'"',
    b"{",
    b"[" * 64,
    b"PAR1",
    b"\n",
)

#: JSON values (as text) that probe type and range checks.
INTERESTING_JSON: tuple[str, ...] = (
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1.5",
    "-0.0",
    "1e308",
    "1e-320",
    "9223372036854775808",
    "-9223372036854775809",
    "9" * 400,  # parses, but overflows a float
    "-" + "9" * 400,
    "9" * 5000,  # past Python's int-conversion limit
    '"\\ud800"',
    '"\\udc80x"',
    '""',
    '"x"',
    '"' + "a" * 70 + '"',
    '"2030-01-01T00:00:00Z"',
    "[]",
    "{}",
    "[" * 40 + "]" * 40,
    '{"a":1,"a":2}',
)


@dataclass(frozen=True, slots=True)
class ByteOp:
    """One edit of a byte string; positions are taken modulo the current length."""

    kind: str  # flip | set | insert | delete | truncate | duplicate
    at: int
    value: int = 0
    data: bytes = b""


_positions = st.integers(min_value=0, max_value=1 << 30)

byte_op = st.one_of(
    st.builds(ByteOp, st.just("flip"), _positions, st.integers(0, 7)),
    st.builds(ByteOp, st.just("set"), _positions, st.integers(0, 255)),
    st.builds(
        ByteOp,
        st.just("insert"),
        _positions,
        st.just(0),
        st.sampled_from(INTERESTING_BYTES) | st.binary(min_size=1, max_size=16),
    ),
    st.builds(ByteOp, st.just("delete"), _positions, st.integers(1, 64)),
    st.builds(ByteOp, st.just("truncate"), _positions),
    st.builds(ByteOp, st.just("duplicate"), _positions, st.integers(1, 64)),
)


def byte_ops(max_ops: int = 6) -> st.SearchStrategy[tuple[ByteOp, ...]]:
    """One to ``max_ops`` byte edits."""
    return st.lists(byte_op, min_size=1, max_size=max_ops).map(tuple)


def apply_bytes(seed: bytes, ops: Sequence[ByteOp]) -> bytes:
    """Apply ``ops`` to ``seed`` in order (pure)."""
    data = bytearray(seed)
    for op in ops:
        n = len(data)
        if op.kind == "insert":
            at = op.at % (n + 1)
            data[at:at] = op.data
            continue
        if n == 0:
            continue
        at = op.at % n
        if op.kind == "flip":
            data[at] ^= 1 << op.value
        elif op.kind == "set":
            data[at] = op.value
        elif op.kind == "delete":
            del data[at : at + op.value]
        elif op.kind == "truncate":
            del data[at:]
        elif op.kind == "duplicate":
            data[at:at] = data[at : at + op.value]
    return bytes(data)


# --------------------------------------------------------------------------------------------
# JSON by structure. A document is edited as a tree whose leaves may be raw JSON text (so a
# mutant can hold what json.dumps cannot write: 5,000-digit integers, duplicate keys).
# --------------------------------------------------------------------------------------------


class Raw(str):
    """JSON text inserted verbatim."""


@dataclass(frozen=True, slots=True)
class JsonOp:
    """One structural edit: ``path`` is a walk of indices into the tree (taken modulo sizes)."""

    kind: str  # replace | delete | add | duplicate_key | wrap
    path: tuple[int, ...]
    text: str = "null"
    key: str = "x"


_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
_json_value = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)

#: Replacement JSON text: interesting literals or random documents.
json_text = st.sampled_from(INTERESTING_JSON) | _json_value.map(lambda v: json.dumps(v))


def json_ops(keys: Sequence[str] = (), max_ops: int = 4) -> st.SearchStrategy[tuple[JsonOp, ...]]:
    """One to ``max_ops`` structural edits; added keys come from ``keys`` (known field names) or
    are random."""
    key = st.sampled_from(tuple(keys)) | st.text(max_size=8) if keys else st.text(max_size=8)
    path = st.lists(st.integers(0, 1 << 16), min_size=0, max_size=6).map(tuple)
    op = st.builds(
        JsonOp,
        st.sampled_from(("replace", "replace", "delete", "add", "duplicate_key", "wrap")),
        path,
        json_text,
        key,
    )
    return st.lists(op, min_size=1, max_size=max_ops).map(tuple)


def _walk(tree: Any, path: tuple[int, ...]) -> tuple[Any, Any]:
    """The container and key/index that ``path`` reaches (stopping at the last container)."""
    parent: Any = None
    where: Any = None
    node = tree
    for step in path:
        if isinstance(node, dict) and node:
            keys = list(node)
            parent, where = node, keys[step % len(keys)]
        elif isinstance(node, list) and node:
            parent, where = node, step % len(node)
        else:
            break
        node = parent[where]
    return parent, where


class _DupKey:
    """A dict key written as ``name``: lets one object hold the same key twice."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def apply_json(doc: Any, ops: Sequence[JsonOp]) -> bytes:
    """Apply ``ops`` to a copy of ``doc`` and write it as JSON text (UTF-8 bytes)."""
    tree = json.loads(json.dumps(doc))
    for op in ops:
        parent, where = _walk(tree, op.path)
        if parent is None:  # the root itself
            if op.kind in ("replace", "wrap"):
                tree = Raw(op.text) if op.kind == "replace" else [tree]
            continue
        if op.kind == "replace":
            parent[where] = Raw(op.text)
        elif op.kind == "delete":
            del parent[where]
        elif op.kind == "wrap":
            parent[where] = [parent[where]]
        elif op.kind == "add" and isinstance(parent, dict):
            parent[op.key] = Raw(op.text)
        elif op.kind == "add":
            parent.insert(where, Raw(op.text))
        elif op.kind == "duplicate_key" and isinstance(parent, dict):
            parent[_DupKey(str(where.name if isinstance(where, _DupKey) else where))] = Raw(op.text)
    return _write(tree).encode("utf-8", "surrogatepass")


def _write(node: Any) -> str:
    if isinstance(node, Raw):
        return str(node)
    if isinstance(node, dict):
        parts = [
            f"{json.dumps(k.name if isinstance(k, _DupKey) else str(k))}:{_write(v)}" for k, v in node.items()
        ]
        return "{" + ",".join(parts) + "}"
    if isinstance(node, list):
        return "[" + ",".join(_write(v) for v in node) + "]"
    return json.dumps(node)
