"""The one fingerprint-file reader: accepted forms, and one row per way a file can be wrong."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from dspark_calibrate.artifacts import Fingerprint, read_fingerprint
from dspark_calibrate.artifacts._inputs import MAX_FINGERPRINT_FILE_BYTES
from dspark_calibrate.errors import ConfigError

FIELDS = {"gpu": "H200", "max_draft_len": 5, "rank_local_graph_batch_sizes": [8, 16]}


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(FIELDS, id="fields"),
        pytest.param({"fingerprint": FIELDS, "sha256": "x"}, id="trtllm-live"),
    ],
)
def test_reads_both_forms(tmp_path: Path, doc: dict[str, object]) -> None:
    path = tmp_path / "fp.json"
    path.write_text(json.dumps(doc))
    assert read_fingerprint(path) == Fingerprint(
        gpu="H200", max_draft_len=5, rank_local_graph_batch_sizes=(8, 16)
    )


def _write(text: str) -> Callable[[Path], None]:
    return lambda p: p.write_text(text)


BAD: list[tuple[str, Callable[[Path], None], str]] = [
    ("missing", lambda p: None, "cannot read fingerprint"),
    ("directory", lambda p: p.mkdir(), "cannot read fingerprint"),
    ("fifo", lambda p: os.mkfifo(p), "cannot read fingerprint"),
    ("too-large", _write(" " * (MAX_FINGERPRINT_FILE_BYTES + 1)), "larger than"),
    ("not-json", _write("{gpu: H200"), "invalid fingerprint"),
    ("duplicate-key", _write('{"gpu": "H200", "gpu": "H100"}'), "invalid fingerprint"),
    ("not-an-object", _write("[1, 2]"), "invalid fingerprint"),
    ("unknown-field", _write('{"gpu": "H200", "colour": "blue"}'), "colour"),
    ("impossible-value", _write('{"max_draft_len": -1}'), "invalid fingerprint"),
]


@pytest.mark.parametrize(("make", "message"), [(m, msg) for _, m, msg in BAD], ids=[n for n, _, _ in BAD])
def test_refuses(tmp_path: Path, make: Callable[[Path], None], message: str) -> None:
    path = tmp_path / "fp.json"
    make(path)
    with pytest.raises(ConfigError, match=message) as info:
        read_fingerprint(path)
    assert str(path) in str(info.value)


def test_schema_and_flags_cover_every_fingerprint_field() -> None:
    from dspark_calibrate.artifacts import FINGERPRINT_FLAGS, Fingerprint
    from dspark_calibrate.schemas import json_schema

    fields = set(Fingerprint.field_names())
    assert set(json_schema("fingerprint")["properties"]) == fields
    assert set(FINGERPRINT_FLAGS) == fields
