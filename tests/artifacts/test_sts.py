"""The STS document: one writer (to_bytes), one strict reader, refusal rows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dspark_calibrate.artifacts import (
    STS_MIN_NUM_SAMPLES,
    StsDocument,
    canonical_json,
    parse_sts_document,
    sts_document,
)
from dspark_calibrate.errors import ConfigError


def valid() -> StsDocument:
    return sts_document(
        [1.25, 1.5, 2.0],
        ece_before=0.05,
        ece_after=0.01,
        dataset="dspark-calibrate calibration " + "d" * 64,
        num_samples=STS_MIN_NUM_SAMPLES,
        max_draft_len=3,
    )


def test_round_trip_is_byte_exact() -> None:
    doc = valid()
    data = doc.to_bytes()
    assert data == canonical_json(doc.to_dict())
    back = parse_sts_document(data, k=3)
    assert back == doc and back.to_bytes() == data
    obj = json.loads(data)
    assert obj["temperatures"] == obj["sts_temperatures"] == [1.25, 1.5, 2.0]


def test_optional_fields_are_left_out() -> None:
    doc = sts_document([1.0])
    assert json.loads(doc.to_bytes()) == {"sts_temperatures": [1.0], "temperatures": [1.0]}


def _bytes(**change: Any) -> bytes:
    obj = valid().to_dict()
    for key, value in change.items():
        if value is _DROP:
            del obj[key]
        else:
            obj[key] = value
    return json.dumps(obj).encode()


_DROP = object()

# (id, change to a valid file, message)
REFUSALS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown key", {"method": "sts"}, "unknown key"),
    ("no temperatures", {"sts_temperatures": _DROP}, "missing 'sts_temperatures'"),
    ("wrong count", {"sts_temperatures": [1.0, 1.0], "temperatures": _DROP}, "expected exactly K=3"),
    ("non-positive", {"sts_temperatures": [1.0, 0.0, 1.0], "temperatures": _DROP}, "finite number > 0"),
    ("alias differs", {"temperatures": [1.0, 1.0, 1.0]}, "must equal"),
    ("null alias", {"temperatures": None}, "is null"),
    ("too few samples", {"num_samples": STS_MIN_NUM_SAMPLES - 1}, "num_samples"),
    ("ECE above 1", {"ece_after": 1.5}, r"\[0, 1\]"),
    ("non-ASCII dataset", {"dataset": "kalibrierung ü"}, "printable ASCII"),
]


@pytest.mark.parametrize(("change", "message"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_reader_refusals(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_sts_document(_bytes(**change))


def test_other_k_is_refused() -> None:
    with pytest.raises(ConfigError, match="K=4"):
        parse_sts_document(valid().to_bytes(), k=4)


def test_a_document_built_directly_validates_itself() -> None:
    with pytest.raises(ConfigError, match="num_samples"):
        StsDocument((1.0,), num_samples=10)
    with pytest.raises(ConfigError, match="finite number > 0"):
        StsDocument((float("inf"),))
