"""The bounded YAML loader: plain types only, and every document limit, on both parsers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_calibrate.artifacts import MAX_DOCUMENT_DEPTH, MAX_YAML_NODES, YamlError, _yaml, load_yaml


@pytest.fixture(params=[loader.__name__ for loader in _yaml._LOADERS], autouse=True)
def loader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Every test runs on libyaml's parser and on the pure-Python one."""
    chosen = next(x for x in _yaml._LOADERS if x.__name__ == request.param)
    monkeypatch.setattr(_yaml, "_LOADERS", [chosen])
    yield request.param


def _alias_bomb(levels: int, width: int) -> str:
    lines = ["a0: &a0 [1, 2]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


#: (id, document, text the error names)
REFUSED = [
    (
        "nested-past-the-limit",
        "a: " + "[" * (MAX_DOCUMENT_DEPTH + 1) + "]" * (MAX_DOCUMENT_DEPTH + 1),
        "nest",
    ),
    ("nested-2000-deep", "[" * 2000 + "]" * 2000, "nest"),
    (
        "nested-through-an-alias",
        "a: &a " + "[" * 20 + "1" + "]" * 20 + "\nb: " + "[" * 20 + "*a" + "]" * 20,
        "nest",
    ),
    ("integer-of-5000-digits", "a: " + "9" * 5000, "digit"),
    ("hex-integer-of-200-digits", "a: 0x" + "f" * 200, "digit"),
    ("sexagesimal-of-300-parts", "a: " + ":".join(["59"] * 300), "digit"),
    ("too-many-nodes", "[" + ", ".join(["1"] * (MAX_YAML_NODES + 1)) + "]", "nodes"),
    ("alias-bomb", _alias_bomb(8, 10), "nodes"),
    ("recursive-alias", "a: &a [*a]", "recursive"),
    ("repeated-key", "a: 1\na: 2\n", "repeats"),
    ("repeated-key-in-flow", "{a: 1, a: 2}", "repeats"),
    ("python-object", "a: !!python/object:os.system x", "constructor"),
    ("bad-date", "a: 2024-13-45", "month"),
    ("two-documents", "a: 1\n---\nb: 2\n", "single document"),
    ("syntax", "a: [", "YAML"),
    ("not-utf8", b"a: \xff", "UTF-8"),
]


@pytest.mark.parametrize(("name", "doc", "named"), REFUSED, ids=[r[0] for r in REFUSED])
def test_refused_as_the_documents_own_error(name: str, doc: str | bytes, named: str) -> None:
    started = time.monotonic()
    with pytest.raises(YamlError) as info:
        load_yaml(doc, what="base.yaml")
    assert time.monotonic() - started < 5
    assert str(info.value).startswith("base.yaml: ") and named in str(info.value), str(info.value)
    assert "\n" not in str(info.value).split(" (")[0]


ACCEPTED = [
    ("empty", "", None),
    (
        "options",
        "max_batch_size: 64\nspeculative_config:\n  decoding_type: DSpark\n",
        {"max_batch_size": 64, "speculative_config": {"decoding_type": "DSpark"}},
    ),
    ("at-the-depth-limit", "[" * (MAX_DOCUMENT_DEPTH + 1) + "]" * (MAX_DOCUMENT_DEPTH + 1), None),
    ("aliases-within-the-limit", "a: &a [1, 2]\nb: *a\n", {"a": [1, 2], "b": [1, 2]}),
    (
        "merge-key-overridden",
        "base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n",
        {"base": {"x": 1, "y": 2}, "c": {"x": 3, "y": 2}},
    ),
    ("64-digit-integer", "a: " + "9" * 64, {"a": int("9" * 64)}),
    ("a-thousand-batch-sizes", "a: [" + ", ".join(map(str, range(1000))) + "]", {"a": list(range(1000))}),
]


@pytest.mark.parametrize(("name", "doc", "expected"), ACCEPTED, ids=[r[0] for r in ACCEPTED])
def test_accepted(name: str, doc: str, expected: Any) -> None:
    got = load_yaml(doc)
    if expected is not None or name == "empty":
        assert got == expected


plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63)
    | st.floats(allow_nan=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=5),
    max_leaves=30,
)


@settings(max_examples=100, deadline=None)
@given(plain)
def test_whatever_safe_dump_writes_within_the_limits_loads_back(doc: Any) -> None:
    assert load_yaml(yaml.safe_dump(doc)) == yaml.safe_load(yaml.safe_dump(doc))
