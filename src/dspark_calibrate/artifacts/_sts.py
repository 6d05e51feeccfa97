"""The STS document (``sts.json``): one model, one reader, one writer (DESIGN §6).

TensorRT-LLM reads K per-position temperatures from ``sts_temperatures`` (SGLang reads the same
list as ``temperatures``); a few descriptive fields may ride along. :func:`sts_document` builds a
validated :class:`StsDocument`, :meth:`StsDocument.to_bytes` is the only way its bytes are
written (``fit`` and the TensorRT-LLM export both call it, so the file pinned by a receipt is the
file ``fit`` would write), and :func:`parse_sts_document` is the only strict reader.

Pure: no file I/O.

Example:
    >>> doc = sts_document([1.5, 2.0], max_draft_len=2)
    >>> parse_sts_document(doc.to_bytes()) == doc
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dspark_calibrate.artifacts._canonical import JsonError, canonical_json, loads_strict
from dspark_calibrate.artifacts._models import is_printable_ascii
from dspark_calibrate.errors import ConfigError

__all__ = [
    "STS_FIELDS",
    "STS_FILE",
    "STS_MIN_NUM_SAMPLES",
    "StsDocument",
    "StsError",
    "check_sts_object",
    "parse_sts_document",
    "sts_document",
]

#: The file name of the STS document in ``fit``'s output and the TensorRT-LLM package.
STS_FILE = "sts.json"
#: TensorRT-LLM's lower bound on ``num_samples`` in ``sts.json`` (calibration rounds).
STS_MIN_NUM_SAMPLES = 1000
#: Fields an STS file may hold (TensorRT-LLM reads nothing else).
STS_FIELDS = frozenset(
    {"sts_temperatures", "temperatures", "ece_before", "ece_after", "dataset", "num_samples", "max_draft_len"}
)


class StsError(ConfigError):
    """An STS document that breaks a rule; ``rule`` names it (``keys``, ``temperatures``,
    ``temperatures_alias``, ``max_draft_len``, ``num_samples``, ``ece``, ``dataset``), so a
    validator that reports findings per rule (the TensorRT-LLM export's) can use the one reader."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True, slots=True)
class StsDocument:
    """TensorRT-LLM's STS file (DESIGN §6): K temperatures plus optional descriptive fields.

    ``temperatures`` is written beside ``sts_temperatures`` with the same values (SGLang reads it).
    ``ece_before``/``ece_after`` are single numbers: the mean over positions of the equal-width
    ECE of S_j on held-out requests.
    """

    temperatures: tuple[float, ...]
    ece_before: float | None = None
    ece_after: float | None = None
    dataset: str | None = None
    num_samples: int | None = None
    max_draft_len: int | None = None

    def __post_init__(self) -> None:
        # Self-validating: a document built directly passes the same rules as one read from bytes.
        object.__setattr__(self, "temperatures", tuple(self.temperatures))
        _validated_sts(self.to_dict(), where=STS_FILE, k=None, allow_null=False, build=False)

    def to_bytes(self) -> bytes:
        """The file's bytes: canonical JSON (sorted keys, no spaces), the one way ``sts.json`` is written."""
        return canonical_json(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, with absent optional fields left out."""
        out: dict[str, Any] = {
            "sts_temperatures": list(self.temperatures),
            "temperatures": list(self.temperatures),
        }
        for name in ("ece_before", "ece_after", "dataset", "num_samples", "max_draft_len"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def _check_temperatures(values: Any, where: str, name: str, k: int | None) -> tuple[float, ...]:
    rule = "temperatures" if name == "sts_temperatures" else "temperatures_alias"
    if not isinstance(values, list | tuple) or not values:
        raise StsError(rule, f"{where}: {name} must be a non-empty list of numbers, got {values!r}")
    out = []
    for i, t in enumerate(values, start=1):
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            raise StsError(rule, f"{where}: {name}[{i}] is {t!r}; every temperature must be a finite number > 0")
        out.append(float(t))
    if k is not None and len(out) != k:
        raise StsError(rule, f"{where}: {name} has {len(out)} values, expected exactly K={k} (one per draft position)")
    return tuple(out)


def sts_document(
    temperatures: Sequence[float],
    *,
    ece_before: float | None = None,
    ece_after: float | None = None,
    dataset: str | None = None,
    num_samples: int | None = None,
    max_draft_len: int | None = None,
) -> StsDocument:
    """Build a validated :class:`StsDocument`.

    Raises:
        ConfigError: temperatures not finite and positive, K disagreeing with ``max_draft_len``,
            ``num_samples`` below 1,000, an ECE outside [0, 1], or a non-ASCII dataset name.
    """
    doc = _validated_sts(
        {
            "sts_temperatures": list(temperatures),
            "temperatures": list(temperatures),
            "ece_before": ece_before,
            "ece_after": ece_after,
            "dataset": dataset,
            "num_samples": num_samples,
            "max_draft_len": max_draft_len,
        },
        where=STS_FILE,
        k=None,
        allow_null=True,
    )
    assert doc is not None
    return doc


def _validated_sts(
    obj: Mapping[str, Any], *, where: str, k: int | None, allow_null: bool, build: bool = True
) -> StsDocument | None:
    unknown = sorted(set(obj) - STS_FIELDS)
    if unknown:
        raise StsError("keys", f"{where}: unknown key(s) {unknown}; an STS file holds only {sorted(STS_FIELDS)}")
    if "sts_temperatures" not in obj:
        raise StsError("keys", f"{where}: missing 'sts_temperatures' (the K per-position temperatures)")
    mdl = obj.get("max_draft_len")
    if mdl is not None and (isinstance(mdl, bool) or not isinstance(mdl, int) or mdl < 1):
        raise StsError("max_draft_len", f"{where}: max_draft_len must be an integer >= 1, got {mdl!r}")
    if k is None and mdl is not None:
        k = mdl
    temps = _check_temperatures(obj["sts_temperatures"], where, "sts_temperatures", k)
    if mdl is not None and mdl != len(temps):
        raise StsError("max_draft_len", f"{where}: max_draft_len={mdl} but sts_temperatures has {len(temps)} values")
    if "temperatures" in obj and obj["temperatures"] is not None:
        if _check_temperatures(obj["temperatures"], where, "temperatures", len(temps)) != temps:
            raise StsError(
                "temperatures_alias",
                f"{where}: 'temperatures' must equal 'sts_temperatures' (SGLang reads the former)"
            )
    elif "temperatures" in obj and not allow_null:
        raise StsError(
            "temperatures_alias",
            f"{where}: 'temperatures' is null; write the same list as 'sts_temperatures' or omit it"
        )
    eces: dict[str, float | None] = {}
    for name in ("ece_before", "ece_after"):
        value = obj.get(name)
        if value is None:
            if name in obj and not allow_null:
                raise StsError("ece", f"{where}: {name} is null; omit it or give a number")
            eces[name] = None
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not 0 <= value <= 1
        ):
            raise StsError("ece", f"{where}: {name} must be a number in [0, 1], got {value!r}")
        eces[name] = float(value)
    dataset = obj.get("dataset")
    if dataset is not None and not is_printable_ascii(dataset):
        raise StsError("dataset", f"{where}: dataset must be a printable ASCII string, got {dataset!r}")
    if dataset is None and "dataset" in obj and not allow_null:
        raise StsError("dataset", f"{where}: dataset is null; omit it or give a string")
    num = obj.get("num_samples")
    if num is not None and (isinstance(num, bool) or not isinstance(num, int) or num < STS_MIN_NUM_SAMPLES):
        raise StsError(
            "num_samples",
            f"{where}: num_samples must be an integer >= {STS_MIN_NUM_SAMPLES} (TensorRT-LLM's floor), "
            f"got {num!r}"
        )
    if num is None and "num_samples" in obj and not allow_null:
        raise StsError("num_samples", f"{where}: num_samples is null; omit it or give an integer")
    if not build:
        return None
    return StsDocument(
        temperatures=temps,
        ece_before=eces["ece_before"],
        ece_after=eces["ece_after"],
        dataset=dataset,
        num_samples=num,
        max_draft_len=mdl,
    )


def parse_sts_document(data: bytes | str, *, where: str = STS_FILE, k: int | None = None) -> StsDocument:
    """Parse and validate an ``sts.json`` strictly (unknown keys, nulls, NaN and duplicates refused).

    Args:
        data: the file's bytes or text.
        where: how to name the file in messages.
        k: the expected draft length, if known.

    Raises:
        ConfigError: anything TensorRT-LLM would not accept, or that this package does not write.
    """
    try:
        obj = loads_strict(data, what=where)
    except JsonError as exc:
        raise ConfigError(str(exc)) from None
    return check_sts_object(obj, where=where, k=k)


def check_sts_object(obj: Any, *, where: str = STS_FILE, k: int | None = None) -> StsDocument:
    """Validate an already-decoded ``sts.json`` object by the rules of :func:`parse_sts_document`.

    Raises:
        StsError: the first rule it breaks (``rule`` names it).
    """
    if not isinstance(obj, dict):
        raise StsError("keys", f"{where}: expected a JSON object, found {type(obj).__name__}")
    doc = _validated_sts(obj, where=where, k=k, allow_null=False)
    assert doc is not None
    return doc
