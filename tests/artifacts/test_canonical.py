"""Canonical JSON and the strict parser: fixed examples, refusals, hypothesis properties."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_calibrate.artifacts import JsonError, canonical_json, loads_strict
from dspark_calibrate.artifacts._canonical import MAX_JSON_INT_DIGITS


def test_matches_trtllm_canonical_form() -> None:
    obj = {"b": [1, 2.5, "é"], "a": {"z": None, "y": True}}
    assert canonical_json(obj) == json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    assert canonical_json(obj) == b'{"a":{"y":true,"z":null},"b":[1,2.5,"\\u00e9"]}'


@pytest.mark.parametrize(
    ("name", "obj"),
    [
        ("nan", {"x": float("nan")}),
        ("inf", [float("inf")]),
        ("neg_inf", {"a": {"b": [float("-inf")]}}),
        ("non_string_key", {1: "x"}),
        ("set", {"x": {1, 2}}),
        ("bytes", {"x": b"raw"}),
        ("integer_of_65_digits", {"x": 10**64}),
    ],
)
def test_canonical_refuses(name: str, obj: Any) -> None:
    with pytest.raises(JsonError):
        canonical_json(obj)


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("duplicate_key", '{"a": 1, "a": 2}'),
        ("nested_duplicate", '{"x": {"k": 1, "k": 1}}'),
        ("nan_literal", '{"a": NaN}'),
        ("infinity_literal", "[Infinity]"),
        ("neg_infinity_literal", "[-Infinity]"),
        ("overflow_to_inf", "[1e999]"),
        ("syntax", '{"a": '),
        ("not_utf8", b"\xff\xfe"),
        ("too_deep", "[" * 100_000 + "]" * 100_000),
        ("integer_of_5000_digits", "[" + "9" * 5000 + "]"),
        ("negative_integer_of_65_digits", '{"v": -' + "1" * 65 + "}"),
    ],
)
def test_strict_parser_refuses(name: str, text: str | bytes) -> None:
    with pytest.raises(JsonError):
        loads_strict(text.encode() if isinstance(text, str) else text, what="doc")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('{"a": 1, "b": 2, "a": 3}', "a"),  # not adjacent
        ('{"x": [{"k": 1}, {"m": 1, "n": 2, "m": 1}]}', "m"),  # deep, equal values
        ('{"z": 1, "y": 2, "y": 3, "z": 4}', "y"),  # the first key seen twice is named
    ],
)
def test_a_repeated_key_is_refused_and_named(text: str, key: str) -> None:
    with pytest.raises(JsonError) as info:
        loads_strict(text, what="doc")
    assert f"duplicate JSON key {key!r}" in str(info.value)


def test_objects_without_repeated_keys_keep_every_pair_in_order() -> None:
    assert list(loads_strict('{"b": 1, "a": {"d": [], "c": null}}').items()) == [
        ("b", 1),
        ("a", {"d": [], "c": None}),
    ]


def test_integers_up_to_the_digit_limit_round_trip() -> None:
    big = 10**MAX_JSON_INT_DIGITS - 1
    assert loads_strict(canonical_json([big, -big])) == [big, -big]


def test_huge_integer_is_the_documents_error_not_a_bare_value_error() -> None:
    with pytest.raises(JsonError, match=r"footer of x\.parquet: integer literal of 5000 digits"):
        loads_strict(b'{"n":' + b"9" * 5000 + b"}", what="footer of x.parquet")


def test_strict_parser_message_names_document() -> None:
    with pytest.raises(JsonError, match=r"footer of x\.parquet"):
        loads_strict(b'{"a":1,"a":2}', what="footer of x.parquet")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_property_round_trip_and_idempotence(obj: Any) -> None:
    data = canonical_json(obj)
    parsed = loads_strict(data)
    assert canonical_json(parsed) == data
    assert data.isascii()


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), st.integers(), max_size=6))
def test_property_key_order_irrelevant(d: dict[str, int]) -> None:
    reversed_d = dict(reversed(list(d.items())))
    assert canonical_json(d) == canonical_json(reversed_d)


def _nested_text(depth: int) -> str:
    """``depth`` levels of alternating arrays and objects around 1 (the top-level value is level 0)."""
    opens = "".join('{"x":' if i % 2 else "[" for i in range(depth))
    return opens + "1" + "".join("}" if i % 2 else "]" for i in reversed(range(depth)))


@pytest.mark.parametrize("depth", [0, 1, 31, 32, 33, 40, 2000])
def test_reader_and_writer_share_the_depth_limit(depth: int) -> None:
    """What canonical_json writes, loads_strict reads: a document the writer refuses (nested past
    32 levels) is refused by the reader as the document's own error, never accepted and then
    crashing the first writer that re-encodes it."""
    from dspark_calibrate.artifacts import MAX_DOCUMENT_DEPTH

    text = _nested_text(depth)
    if depth <= MAX_DOCUMENT_DEPTH:
        doc = loads_strict(text)
        assert doc == json.loads(text) and canonical_json(doc) == text.encode()
    else:
        with pytest.raises(JsonError, match="nest"):
            loads_strict(text, what="state.json")
        if depth < 900:  # beyond that Python's own parser and encoder give up first
            with pytest.raises(JsonError, match="deeper"):
                canonical_json(json.loads(text))


def test_reader_and_writer_share_the_node_limit() -> None:
    from dspark_calibrate.artifacts import MAX_JSON_NODES

    fits = [0] * (MAX_JSON_NODES - 1)  # with the list itself: exactly the limit
    assert loads_strict(json.dumps(fits)) == fits and canonical_json(fits)
    with pytest.raises(JsonError, match="values"):
        loads_strict(json.dumps([*fits, 0]))
    with pytest.raises(JsonError, match="values"):
        canonical_json([*fits, 0])


# -- loads_strict's walk: depth and count only, the same verdicts as check_document ------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=4)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_parsed_walk_counts_as_check_document_does(value: Any) -> None:
    from dspark_calibrate.artifacts import _canonical

    assert _canonical._shape(value, 0) == _canonical._walk(value, 0)
    assert loads_strict(json.dumps(value)) == value


def _nested(depth: int, leaf: Any) -> Any:
    for i in range(depth):
        leaf = [leaf] if i % 2 else {"k": leaf}
    return leaf


@pytest.mark.parametrize("leaf", [1, [], {}])
@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_parsed_depth_limit_is_check_documents(leaf: Any, extra: int) -> None:
    from dspark_calibrate.artifacts._canonical import MAX_JSON_DEPTH, check_document

    doc = _nested(MAX_JSON_DEPTH + extra, leaf)
    try:
        check_document(doc)
        expected = True
    except JsonError:
        expected = False
    try:
        loads_strict(json.dumps(doc))
        parsed = True
    except JsonError:
        parsed = False
    assert parsed is expected


def test_parsed_node_limit_is_check_documents(monkeypatch: pytest.MonkeyPatch) -> None:
    from dspark_calibrate.artifacts import _canonical

    monkeypatch.setattr(_canonical, "MAX_JSON_NODES", 10)
    ok, over = json.dumps([[1, 2], {"a": [3, 4, 5]}, 6]), json.dumps([[1, 2], {"a": [3, 4, 5, 6]}, 7])
    assert loads_strict(ok)  # 10 values
    with pytest.raises(JsonError, match="11 values"):
        loads_strict(over)
    with pytest.raises(JsonError, match="11 values"):
        _canonical.check_document(json.loads(over))
