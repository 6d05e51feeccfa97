"""Fingerprint and Provenance models: validation, round trips, unknown fields, digests."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_calibrate.artifacts import TRTLLM_FINGERPRINT_FIELDS, Fingerprint, ModelError, Provenance
from tests.factories import make_fingerprint, make_provenance


def test_round_trip() -> None:
    fp = make_fingerprint()
    assert Fingerprint.from_dict(fp.to_dict()) == fp
    prov = make_provenance(extra={"samples_sha256": "d" * 64})
    assert Provenance.from_dict(prov.to_dict()) == prov


def test_trtllm_fields_are_the_ten_in_order() -> None:
    fields = make_fingerprint().trtllm_fields()
    assert tuple(fields) == TRTLLM_FINGERPRINT_FIELDS
    assert fields["rank_local_graph_batch_sizes"] == [8, 16, 32]


def test_trtllm_fields_refuse_missing() -> None:
    with pytest.raises(ModelError, match="topology"):
        make_fingerprint(topology=None).trtllm_fields()


BAD: list[tuple[str, dict[str, Any]]] = [
    ("gpu_empty", {"gpu": ""}),
    ("gpu_not_ascii", {"gpu": "H200✓"}),
    ("gpu_count_zero", {"gpu_count": 0}),
    ("gpu_count_bool", {"gpu_count": True}),
    ("snapshot_upper_hex", {"gpu_snapshot_sha256": "A" * 64}),
    ("snapshot_short", {"gpu_snapshot_sha256": "a" * 63}),
    ("k_zero", {"max_draft_len": 0}),
    (
        "ladder_unsorted",
        {"rank_local_graph_batch_sizes": (16, 8, 32), "global_graph_batch_sizes": (16, 8, 32)},
    ),
    ("ladder_duplicate", {"rank_local_graph_batch_sizes": (8, 8), "global_graph_batch_sizes": (8, 8)}),
    ("ladder_empty", {"rank_local_graph_batch_sizes": ()}),
    ("global_not_g_times_count", {"global_graph_batch_sizes": (8, 16, 64)}),
    ("context_negative", {"context_len": -1}),
]


@pytest.mark.parametrize(("name", "change"), BAD, ids=[b[0] for b in BAD])
def test_fingerprint_refuses(name: str, change: dict[str, Any]) -> None:
    with pytest.raises(ModelError):
        make_fingerprint(**change)


def test_from_dict_refuses_unknown_fields() -> None:
    data = make_fingerprint().to_dict() | {"surprise": 1}
    with pytest.raises(ModelError, match="surprise"):
        Fingerprint.from_dict(data)
    with pytest.raises(ModelError, match="surprise"):
        Provenance.from_dict(make_provenance().to_dict() | {"surprise": 1})


def test_provenance_refuses_nan() -> None:
    with pytest.raises(ValueError):
        make_provenance(stopping_rule={"precision": float("nan")})


def test_diff_lists_sorted_fields() -> None:
    a = make_fingerprint()
    b = a.replace(gpu="H100", topology="TP2")
    assert [d[0] for d in a.diff(b)] == ["gpu", "topology"]


def test_missing_reports_unestablished() -> None:
    assert Fingerprint(gpu="H200").missing(("gpu", "topology")) == ("topology",)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=20))
def test_digest_changes_with_any_field(topology: str) -> None:
    base = make_fingerprint()
    changed = base.replace(topology=topology)
    assert (changed.digest() == base.digest()) == (topology == base.topology)
