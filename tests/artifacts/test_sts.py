"""The STS document: one writer (to_bytes), one strict reader, refusal rows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dspark_calibrate.artifacts import (
    STS_MIN_NUM_SAMPLES,
    StsDocument,
    StsError,
    canonical_json,
    check_sts_object,
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

# (id, change to a valid file, message, the rule it breaks)
REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [
    ("unknown key", {"method": "sts"}, "unknown key", "keys"),
    ("no temperatures", {"sts_temperatures": _DROP}, "missing 'sts_temperatures'", "keys"),
    (
        "wrong count",
        {"sts_temperatures": [1.0, 1.0], "temperatures": _DROP},
        "expected exactly K=3",
        "temperatures",
    ),
    (
        "non-positive",
        {"sts_temperatures": [1.0, 0.0, 1.0], "temperatures": _DROP},
        "finite number > 0",
        "temperatures",
    ),
    ("alias differs", {"temperatures": [1.0, 1.0, 1.0]}, "must equal", "temperatures_alias"),
    ("alias not a list", {"temperatures": "1,1,1"}, "non-empty list", "temperatures_alias"),
    ("null alias", {"temperatures": None}, "is null", "temperatures_alias"),
    ("too few samples", {"num_samples": STS_MIN_NUM_SAMPLES - 1}, "num_samples", "num_samples"),
    ("null samples", {"num_samples": None}, "num_samples is null", "num_samples"),
    ("draft length not an integer", {"max_draft_len": 3.0}, "max_draft_len", "max_draft_len"),
    ("draft length disagrees", {"max_draft_len": 4}, "expected exactly K=4", "temperatures"),
    ("ECE above 1", {"ece_after": 1.5}, r"\[0, 1\]", "ece"),
    ("null ECE", {"ece_before": None}, "is null", "ece"),
    ("non-ASCII dataset", {"dataset": "kalibrierung ü"}, "printable ASCII", "dataset"),
    ("null dataset", {"dataset": None}, "dataset is null", "dataset"),
]


@pytest.mark.parametrize(
    ("change", "message", "rule"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_reader_refusals(change: dict[str, Any], message: str, rule: str) -> None:
    with pytest.raises(StsError, match=message) as exc:
        parse_sts_document(_bytes(**change))
    assert exc.value.rule == rule and isinstance(exc.value, ConfigError)
    # The decoded-object check (the TensorRT-LLM export's) is the same reader: same rule, same words.
    with pytest.raises(StsError, match=message) as again:
        check_sts_object(json.loads(_bytes(**change)))
    assert again.value.rule == rule and str(again.value) == str(exc.value)


@pytest.mark.parametrize("obj", [[1.0, 2.0], "sts", None, 3], ids=["list", "string", "null", "number"])
def test_a_non_object_breaks_the_keys_rule(obj: Any) -> None:
    with pytest.raises(StsError, match="expected a JSON object") as exc:
        check_sts_object(obj)
    assert exc.value.rule == "keys"


def test_other_k_is_refused() -> None:
    with pytest.raises(ConfigError, match="K=4"):
        parse_sts_document(valid().to_bytes(), k=4)


def test_a_document_built_directly_validates_itself() -> None:
    with pytest.raises(ConfigError, match="num_samples"):
        StsDocument((1.0,), num_samples=10)
    with pytest.raises(ConfigError, match="finite number > 0"):
        StsDocument((float("inf"),))
