"""Canonical JSON, strict JSON parsing and digests. Performs no file I/O.

Canonical JSON here is exactly what TensorRT-LLM hashes (DESIGN §6):
``json.dumps(obj, sort_keys=True, separators=(",", ":"))`` with the default ASCII escaping,
encoded as UTF-8, with NaN and ±Infinity refused. The strict parser refuses duplicate keys,
NaN/Infinity literals, integer literals longer than a fixed number of digits, nesting deeper than
a fixed limit and more values than a fixed count, because an attacker-chosen payload must have
exactly one meaning and must not reach Python's own integer-conversion or recursion limits (a bare
``ValueError`` or ``RecursionError``). Reader and writer apply the same limits (``_limits``), so
anything written can be read back.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from dspark_calibrate.artifacts._limits import MAX_DOCUMENT_DEPTH, MAX_INT_DIGITS, MAX_JSON_NODES
from dspark_calibrate.errors import InvalidValueError

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT_DIGITS",
    "JsonError",
    "canonical_json",
    "check_document",
    "encode_checked",
    "loads_strict",
    "sha256_hex",
]

#: The document limits of ``_limits`` under the names this module has always exported.
MAX_JSON_DEPTH = MAX_DOCUMENT_DEPTH
MAX_JSON_INT_DIGITS = MAX_INT_DIGITS
_INT_BOUND = 10**MAX_JSON_INT_DIGITS


class JsonError(InvalidValueError):
    """Untrusted JSON that is not acceptable (syntax, duplicate key, NaN, depth, top-level type)."""

    default_code = "JSON_INVALID"


def _leaf(obj: Any) -> int:
    """Check a value that is not an array or object; returns 1 (one value)."""
    if isinstance(obj, str) or obj is None or isinstance(obj, bool):
        return 1
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise JsonError(f"non-finite number {obj!r} cannot be written as canonical JSON")
        return 1
    if isinstance(obj, int):
        if not -_INT_BOUND < obj < _INT_BOUND:
            raise JsonError(
                f"an integer of {obj.bit_length()} bits has more than {MAX_JSON_INT_DIGITS} digits"
            )
        return 1
    raise JsonError(f"type {type(obj).__name__} is not JSON")


def _walk(obj: Any, depth: int) -> int:
    """Check one value and everything under it; returns how many values that is (itself included).

    Every read and write of a document runs this (admission reads a few dozen per bundle and
    the state on each update), so plain scalars are checked inline, without a call each.
    """
    if depth > MAX_JSON_DEPTH:
        raise JsonError(f"JSON nests deeper than {MAX_JSON_DEPTH} levels")
    values: Any
    if isinstance(obj, dict):
        for key in obj:
            if not isinstance(key, str):
                raise JsonError(f"JSON object key {key!r} is not a string")
        values = obj.values()
    elif isinstance(obj, list | tuple):
        values = obj
    else:
        return _leaf(obj)
    if depth == MAX_JSON_DEPTH and len(values):  # its values would be one level too deep
        raise JsonError(f"JSON nests deeper than {MAX_JSON_DEPTH} levels")
    nodes = 1
    for value in values:
        kind = type(value)
        if (
            kind is str
            or kind is bool
            or value is None
            or (kind is int and -_INT_BOUND < value < _INT_BOUND)
            or (kind is float and math.isfinite(value))
        ):
            nodes += 1
        else:  # a container, a subclass, or a value to refuse
            nodes += _walk(value, depth + 1)
    return nodes


def _shape(obj: Any, depth: int) -> int:
    """Values in a document :func:`json.loads` built with :func:`loads_strict`'s hooks, checking
    only the nesting depth on the way (what :func:`_walk` checks that parsing cannot).

    Such a document holds nothing else :func:`_walk` refuses: its object keys are strings (JSON
    has no others), every integer passed ``_bounded_int`` and every float ``_finite_float``
    while parsing, and NaN/Infinity literals were refused. So counting its values and measuring
    its depth is the whole check, without a type test per key and per scalar (admission parses
    ~15 documents, a state update two more).
    """
    if depth > MAX_JSON_DEPTH:
        raise JsonError(f"JSON nests deeper than {MAX_JSON_DEPTH} levels")
    kind = type(obj)
    if kind is dict:
        values: Any = obj.values()
    elif kind is list:
        values = obj
    else:
        return 1
    if depth == MAX_JSON_DEPTH and len(values):  # its values would be one level too deep
        raise JsonError(f"JSON nests deeper than {MAX_JSON_DEPTH} levels")
    nodes = 1 + len(values)
    for value in values:
        kind = type(value)
        if kind is dict or kind is list:
            nodes += _shape(value, depth + 1) - 1
    return nodes


def check_document(obj: Any) -> None:
    """Refuse a value that is not within the document limits (``_limits``): nesting deeper than
    :data:`MAX_JSON_DEPTH`, more than ``MAX_JSON_NODES`` values, an integer of more than
    :data:`MAX_JSON_INT_DIGITS` digits, NaN/Infinity, a non-string key or a non-JSON type.

    The one definition of an acceptable document, for what is written and what is read.

    Raises:
        JsonError: the first limit broken.
    """
    nodes = _walk(obj, 0)
    if nodes > MAX_JSON_NODES:
        raise JsonError(f"JSON holds {nodes} values, more than the {MAX_JSON_NODES}-value limit")


def canonical_json(obj: Any) -> bytes:
    """Encode ``obj`` as canonical JSON bytes (sorted keys, no spaces, ASCII escapes, UTF-8).

    Raises:
        JsonError: the object holds NaN/Infinity, a non-string key, or a non-JSON type.
    """
    check_document(obj)
    return encode_checked(obj)


def encode_checked(obj: Any) -> bytes:
    """:func:`canonical_json` of a value already known to be within the limits (it came from
    :func:`loads_strict`, or was checked with :func:`check_document`): the same bytes, without
    walking the value again."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # dict() builds the object in C; only a document with a repeated key pays for the search.
    # Every object of every parsed document passes here (a third of parsing a rollback state).
    out = dict(pairs)
    if len(out) != len(pairs):  # some key came twice: name the first repeated one
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JsonError(f"duplicate JSON key {key!r}")
            seen.add(key)
    return out


def _refuse_constant(name: str) -> Any:
    raise JsonError(f"JSON literal {name} is not allowed")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # e.g. 1e999 overflows to inf
        raise JsonError(f"number {text} is not finite")
    return value


def _bounded_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > MAX_JSON_INT_DIGITS:
        raise JsonError(
            f"integer literal of {digits} digits is longer than the {MAX_JSON_INT_DIGITS}-digit limit"
        )
    return int(text)


def loads_strict(data: bytes | str, *, what: str = "JSON document") -> Any:
    """Parse untrusted JSON, refusing duplicate keys, NaN/Infinity, overflowing numbers, integer
    literals longer than :data:`MAX_JSON_INT_DIGITS`, nesting deeper than :data:`MAX_JSON_DEPTH`
    and more values than ``MAX_JSON_NODES`` (the limits :func:`canonical_json` writes within).

    Args:
        data: UTF-8 bytes or text.
        what: how to name the document in error messages.

    Raises:
        JsonError: the text is not acceptable JSON; the message names ``what``.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
        # The hooks refuse duplicates, constants and huge literals while parsing; depth and size
        # are checked by one walk over the result (the parser's own recursion stops near 1,000
        # levels with RecursionError, handled below): check_document's limits, see _shape.
        obj = json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
        )
        nodes = _shape(obj, 0)
        if nodes > MAX_JSON_NODES:
            raise JsonError(f"JSON holds {nodes} values, more than the {MAX_JSON_NODES}-value limit")
        return obj
    except JsonError as exc:
        raise JsonError(f"{what}: {exc}") from None
    except RecursionError:
        raise JsonError(f"{what}: nests too deeply") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JsonError(f"{what}: not valid UTF-8 JSON ({exc})") from None
    except ValueError as exc:  # any other conversion the parser refuses: still this document's error
        raise JsonError(f"{what}: not acceptable JSON ({exc})") from None


def sha256_hex(data: bytes) -> str:
    """Lowercase hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()
