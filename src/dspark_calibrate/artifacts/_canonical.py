"""Canonical JSON, strict JSON parsing and digests. Performs no file I/O.

Canonical JSON here is exactly what TensorRT-LLM hashes (DESIGN §6):
``json.dumps(obj, sort_keys=True, separators=(",", ":"))`` with the default ASCII escaping,
encoded as UTF-8, with NaN and ±Infinity refused. The strict parser refuses duplicate keys,
NaN/Infinity literals, integer literals longer than a fixed number of digits and nesting deeper
than a fixed limit, because an attacker-chosen payload must have exactly one meaning and must not
reach Python's own integer-conversion limit (a bare ``ValueError``).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from dspark_calibrate.errors import InvalidValueError

__all__ = [
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT_DIGITS",
    "JsonError",
    "canonical_json",
    "loads_strict",
    "sha256_hex",
]

#: Deepest nesting accepted from untrusted JSON; our documents nest fewer than 8 levels.
MAX_JSON_DEPTH = 32
#: Longest integer literal accepted or written, in decimal digits (sign not counted). Every integer
#: our documents hold fits in 64 bits (at most 20 digits); Python refuses to convert literals of
#: more than 4,300 digits with a bare ValueError, so a longer literal is refused here first, as
#: the document's own error.
MAX_JSON_INT_DIGITS = 64
_INT_BOUND = 10**MAX_JSON_INT_DIGITS


class JsonError(InvalidValueError):
    """Untrusted JSON that is not acceptable (syntax, duplicate key, NaN, depth, top-level type)."""

    default_code = "JSON_INVALID"


def _check_finite(obj: Any, depth: int = 0) -> None:
    if depth > MAX_JSON_DEPTH:
        raise JsonError(f"JSON nests deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(obj, float):
        if not math.isfinite(obj):
            raise JsonError(f"non-finite number {obj!r} cannot be written as canonical JSON")
    elif isinstance(obj, int) and not isinstance(obj, bool) and not -_INT_BOUND < obj < _INT_BOUND:
        raise JsonError(f"an integer of {obj.bit_length()} bits has more than {MAX_JSON_INT_DIGITS} digits")
    elif isinstance(obj, dict):
        for key, value in obj.items():
            if not isinstance(key, str):
                raise JsonError(f"JSON object key {key!r} is not a string")
            _check_finite(value, depth + 1)
    elif isinstance(obj, list | tuple):
        for value in obj:
            _check_finite(value, depth + 1)
    elif obj is None or isinstance(obj, bool | int | str):
        return
    else:
        raise JsonError(f"type {type(obj).__name__} is not JSON")


def canonical_json(obj: Any) -> bytes:
    """Encode ``obj`` as canonical JSON bytes (sorted keys, no spaces, ASCII escapes, UTF-8).

    Raises:
        JsonError: the object holds NaN/Infinity, a non-string key, or a non-JSON type.
    """
    _check_finite(obj)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JsonError(f"duplicate JSON key {key!r}")
        out[key] = value
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
    literals longer than :data:`MAX_JSON_INT_DIGITS`, deep nesting.

    Args:
        data: UTF-8 bytes or text.
        what: how to name the document in error messages.

    Raises:
        JsonError: the text is not acceptable JSON; the message names ``what``.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
        # The hooks run during parsing, so no second walk over the result is needed.
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
        )
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
