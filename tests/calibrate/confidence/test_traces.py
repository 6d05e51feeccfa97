"""Trace readers: Parquet, JSONL and TensorRT-LLM recorder shards, and every way a trace is wrong."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_calibrate.calibrate.confidence.traces import (
    RECORDER_PAIRING,
    TraceSet,
    expand_trace_paths,
    parse_trace_record,
    prefix_lengths,
    read_recorder_shard,
    read_traces,
    write_trace_jsonl,
    write_trace_parquet,
)
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.schemas import arrow_schema

K = 3


def make_traces(n: int = 60, k: int = K, requests: int = 6, seed: int = 0) -> TraceSet:
    """A small valid trace set: mixed acceptance, some censored rounds."""
    rng = np.random.default_rng(seed)
    req = np.arange(n) % requests
    rounds = np.arange(n) // requests
    verified = np.where(rng.random(n) < 0.3, rng.integers(1, k + 1, n), k)
    accepted = np.minimum(rng.integers(0, k + 1, n), verified)
    return TraceSet.from_arrays(
        request_ids=[f"r{i}" for i in req],
        rounds=rounds,
        logits=rng.normal(size=(n, k)).astype(np.float32),
        accepted=accepted,
        verified=verified,
    )


def same_rounds(a: TraceSet, b: TraceSet) -> None:
    """Assert two trace sets hold the same rounds (request names compared, not codes)."""
    key_a = sorted(zip([a.request_names[i] for i in a.request], a.round.tolist(), strict=True))
    key_b = sorted(zip([b.request_names[i] for i in b.request], b.round.tolist(), strict=True))
    assert key_a == key_b
    order_a = np.lexsort((a.round, np.array([a.request_names[i] for i in a.request])))
    order_b = np.lexsort((b.round, np.array([b.request_names[i] for i in b.request])))
    np.testing.assert_array_equal(a.logits[order_a], b.logits[order_b])
    np.testing.assert_array_equal(a.accepted[order_a], b.accepted[order_b])
    np.testing.assert_array_equal(a.verified[order_a], b.verified[order_b])


def write_table(path: Path, rows: dict[str, Any], schema: pa.Schema | None = None) -> Path:
    pq.write_table(pa.table(rows, schema=schema), path)
    return path


def valid_rows(n: int = 4, k: int = K) -> dict[str, Any]:
    return {
        "request_id": [f"q{i % 2}" for i in range(n)],
        "round": [i // 2 for i in range(n)],
        "logits": [[0.5] * k for _ in range(n)],
        "accepted": [1] * n,
        "verified": [k] * n,
    }


# ---------------------------------------------------------------------------------------------
# Round trips


def test_parquet_round_trip_streams_in_batches(tmp_path: Path) -> None:
    ts = make_traces(n=500)
    path = tmp_path / "t.parquet"
    write_trace_parquet(path, ts.batches(batch_rows=64))
    assert pq.ParquetFile(path).metadata.num_row_groups == 8
    back = read_traces([path], batch_rows=50)
    assert back.k == K and back.rounds == 500 and back.requests == ts.requests
    same_rounds(ts, back)
    assert back.sources[0].format == "parquet" and len(back.sources[0].sha256) == 64
    assert not back.synthetic


def test_parquet_schema_is_the_trace_kind(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    write_trace_parquet(path, make_traces().batches())
    assert pq.read_schema(path).remove_metadata().equals(arrow_schema("trace"))


def test_jsonl_round_trip(tmp_path: Path) -> None:
    ts = make_traces(n=120)
    path = tmp_path / "t.jsonl"
    write_trace_jsonl(path, ts)
    back = read_traces([path], batch_rows=7)
    same_rounds(ts, back)


def test_multiple_files_unify_request_ids(tmp_path: Path) -> None:
    ts = make_traces(n=120)
    first, second = ts.subset(np.arange(120) < 60), ts.subset(np.arange(120) >= 60)
    write_trace_parquet(tmp_path / "a.parquet", first.batches())
    write_trace_jsonl(tmp_path / "b.jsonl", second)
    back = read_traces([tmp_path])  # a directory expands to its trace files
    assert back.requests == ts.requests
    same_rounds(ts, back)
    assert [Path(s.path).name for s in back.sources] == ["a.parquet", "b.jsonl"]


def test_sampling_filter_and_tags(tmp_path: Path) -> None:
    rows = valid_rows(6)
    rows["sampling"] = ["greedy", "greedy", "top_p", None, "greedy", "top_p"]
    rows["temperature"] = [0.0, 0.0, 0.7, None, 0.0, 0.7]
    path = write_table(tmp_path / "t.parquet", rows)
    everything = read_traces([path])
    assert dict(everything.sampling_tags) == {"greedy@0": 3, "top_p@0.7": 2, "-@-": 1}
    greedy = read_traces([path], sampling="greedy")
    assert greedy.rounds == 3
    with pytest.raises(ConfigError, match="no rounds with sampling tag 'beam'"):
        read_traces([path], sampling="beam")


# ---------------------------------------------------------------------------------------------
# Recorder shards (torch.save'd dicts)


def save_shard(path: Path, **overrides: Any) -> Path:
    torch = pytest.importorskip("torch")
    n, k = 8, 4
    lengths = torch.tensor([0, 1, 2, 3, 4, 4, 2, 1])
    mask = (torch.arange(k)[None, :] < lengths[:, None]).to(torch.uint8)
    shard: dict[str, Any] = {
        "logits": torch.linspace(-2, 2, n * k, dtype=torch.float32).reshape(n, k),
        "prefix_mask": mask,
        "meta": {"pairing": RECORDER_PAIRING, "block_size": k},
        "request_ids": torch.tensor([7, 7, 7, 8, 8, 9, 9, 9]),
    }
    for key, value in overrides.items():
        if value is None:
            shard.pop(key, None)
        else:
            shard[key] = value
    torch.save(shard, path)
    return path


def test_recorder_shard_reads_prefix_lengths(tmp_path: Path) -> None:
    path = save_shard(tmp_path / "s0.pt")
    batch, notices = read_recorder_shard(path)
    assert notices == ()
    assert batch.accepted.tolist() == [0, 1, 2, 3, 4, 4, 2, 1]
    assert batch.verified.tolist() == [4] * 8
    assert batch.request_id.to_pylist() == ["7", "7", "7", "8", "8", "9", "9", "9"]
    assert batch.round.tolist() == [0, 1, 2, 0, 1, 0, 1, 2]
    ts = read_traces([path])
    assert ts.k == 4 and ts.requests == 3 and ts.sources[0].format == "recorder"


def test_recorder_shard_without_request_ids_says_so(tmp_path: Path) -> None:
    path = save_shard(tmp_path / "s0.pt", request_ids=None)
    ts = read_traces([path])
    assert ts.requests == 8
    assert [n.code for n in ts.notices] == ["NO_REQUEST_IDS"]


def test_recorder_shard_bfloat16_logits_and_bool_mask(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    logits = torch.zeros(8, 4, dtype=torch.bfloat16)
    mask = torch.tensor([[True, False, False, False]] * 8)
    batch, _ = read_recorder_shard(save_shard(tmp_path / "s.pt", logits=logits, prefix_mask=mask))
    assert batch.logits.dtype == np.float32 and batch.accepted.tolist() == [1] * 8


def test_recorder_shards_must_agree_on_block_size(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    save_shard(tmp_path / "a.pt")
    save_shard(
        tmp_path / "b.pt",
        logits=torch.zeros(2, 3),
        prefix_mask=torch.zeros(2, 3),
        meta={"pairing": RECORDER_PAIRING, "block_size": 3},
        request_ids=torch.tensor([1, 2]),
    )
    with pytest.raises(ConfigError, match=r"b\.pt: meta\.block_size=3 disagrees with K=4"):
        read_traces([tmp_path])


def _torch() -> Any:
    return pytest.importorskip("torch")


SHARD_CASES = [
    ("pairing_missing", lambda t: {"meta": {"block_size": 4}}, "meta.pairing is None"),
    (
        "pairing_other",
        lambda t: {"meta": {"pairing": "step_index", "block_size": 4}},
        "expected 'draft_seq_ring'",
    ),
    (
        "block_size_vs_logits",
        lambda t: {"meta": {"pairing": RECORDER_PAIRING, "block_size": 5}},
        "logits have 4 columns",
    ),
    (
        "block_size_not_int",
        lambda t: {"meta": {"pairing": RECORDER_PAIRING, "block_size": "4"}},
        "must be an integer",
    ),
    ("non_prefix_mask", lambda t: {"prefix_mask": t.tensor([[1, 0, 1, 0]] * 8)}, "not a prefix"),
    ("mask_values", lambda t: {"prefix_mask": t.full((8, 4), 2)}, "values other than 0/1"),
    ("mask_shape", lambda t: {"prefix_mask": t.ones(8, 3)}, "must match"),
    ("nan_logits", lambda t: {"logits": t.full((8, 4), float("nan"))}, "NaN/Inf"),
    ("inf_logits", lambda t: {"logits": t.full((8, 4), float("inf"))}, "NaN/Inf"),
    ("missing_meta", lambda t: {"meta": None}, r"lacks key\(s\) \['meta'\]"),
    ("verified_below_accepted", lambda t: {"verified": t.full((8,), 1)}, "accepted=2 .* exceeds verified"),
    # malformed values must be refused with the field named, never escape as numpy/torch errors
    (
        "ragged_logits",
        lambda t: {"logits": [[0.1] * 4] * 7 + [[0.1] * 3]},
        "'logits' is not a rectangular array",
    ),
    ("string_logits", lambda t: {"logits": [["x"] * 4] * 8}, "'logits' must hold numbers"),
    ("sparse_logits", lambda t: {"logits": t.zeros(8, 4).to_sparse()}, "sparse_coo tensor; save a dense one"),
    ("complex_logits", lambda t: {"logits": t.zeros(8, 4, dtype=t.complex64)}, "complex numbers"),
    ("string_mask", lambda t: {"prefix_mask": [["1"] * 4] * 8}, "'prefix_mask' must hold numbers"),
    ("lone_surrogate_request_id", lambda t: {"request_ids": ["\ud800"] * 8}, "lone surrogate"),
    ("float_request_ids", lambda t: {"request_ids": t.zeros(8)}, "request ids are strings or integers"),
    ("nested_request_ids", lambda t: {"request_ids": [[1]] * 8}, "request ids are strings or integers"),
    (
        "huge_block_size",
        lambda t: {"meta": {"pairing": RECORDER_PAIRING, "block_size": 10**400}},
        "an integer of 401 digits",
    ),
]


@pytest.mark.parametrize(("name", "change", "message"), SHARD_CASES, ids=[c[0] for c in SHARD_CASES])
def test_bad_recorder_shards(tmp_path: Path, name: str, change: Any, message: str) -> None:
    path = save_shard(tmp_path / f"{name}.pt", **change(_torch()))
    with pytest.raises(ConfigError, match=message) as info:
        read_traces([path])
    assert path.name in str(info.value)


def test_shard_that_is_not_a_dict_or_not_torch(tmp_path: Path) -> None:
    torch = _torch()
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(ConfigError, match="is a dict"):
        read_recorder_shard(tmp_path / "list.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match="cannot load as a recorder shard"):
        read_recorder_shard(tmp_path / "junk.pt")


def _edited_shard(edit: Any) -> Any:
    def make(path: Path) -> None:
        save_shard(path)
        path.write_bytes(edit(path.read_bytes()))

    return make


LOAD_CASES = [
    # each made torch.load raise something other than the errors it documents
    ("first_bit_flipped", _edited_shard(lambda b: bytes([b[0] ^ 1]) + b[1:])),
    ("truncated_half", _edited_shard(lambda b: b[: len(b) // 2])),
    ("truncated_end", _edited_shard(lambda b: b[:-30])),
    (
        "pickle_bytes_zeroed",
        _edited_shard(lambda b: b.replace(b"ctorch._utils", b"c\x00\x00\x00\x00\x00\x00._utils")),
    ),
    ("zip_directory_garbled", _edited_shard(lambda b: b[:-60] + bytes(60))),
]


def _torch_assertion_shard(path: Path) -> None:
    """A one-bit edit that makes torch.load fail one of its own format assertions."""
    torch = _torch()
    save_shard(path)
    seed = path.read_bytes()
    for at in range(len(seed)):
        data = bytearray(seed)
        data[at] ^= 1
        path.write_bytes(bytes(data))
        try:
            torch.load(path, weights_only=True)
        except AssertionError:
            return
        except Exception:
            continue
    raise AssertionError("no one-bit edit trips torch.load's format assertions")


LOAD_CASES.append(("torch_format_assertion", _torch_assertion_shard))


@pytest.mark.parametrize(("name", "make"), LOAD_CASES, ids=[c[0] for c in LOAD_CASES])
def test_unloadable_shards_are_config_errors(tmp_path: Path, name: str, make: Any) -> None:
    path = tmp_path / f"{name}.pt"
    make(path)
    with pytest.raises(ConfigError, match="cannot load as a recorder shard") as info:
        read_traces([path])
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_k_mismatch_between_shards_names_both_files(tmp_path: Path) -> None:
    torch = _torch()
    save_shard(tmp_path / "a.pt")
    save_shard(
        tmp_path / "b.pt",
        logits=torch.zeros(2, 3),
        prefix_mask=torch.zeros(2, 3),
        meta={"pairing": RECORDER_PAIRING, "block_size": 3},
    )
    with pytest.raises(ConfigError, match=r"b\.pt: meta\.block_size=3 disagrees with K=4.*came from .*a\.pt"):
        read_traces([tmp_path / "a.pt", tmp_path / "b.pt"])


def test_request_continuing_into_the_next_shard_without_rounds(tmp_path: Path) -> None:
    """A request's rounds continue across shards in the order given when no rounds are recorded."""
    torch = _torch()
    first = save_shard(tmp_path / "s0.pt", request_ids=torch.tensor([7] * 8))
    second = save_shard(tmp_path / "s1.pt", request_ids=torch.tensor([7] * 4 + [8] * 4))
    ts = read_traces([first, second])
    assert ts.rounds == 16 and ts.requests == 2
    r7 = sorted(int(r) for r, q in zip(ts.round, ts.request, strict=True) if ts.request_names[q] == "7")
    assert r7 == list(range(12))  # 0..7 from s0, then 8..11 from s1
    # shards that record their rounds are taken as they are
    with pytest.raises(ConfigError, match=r"appears more than once.*request ids collide across files"):
        read_traces([first, save_shard(tmp_path / "s2.pt", rounds=torch.arange(8))])


def test_shards_of_one_name_in_two_folders(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = save_shard(tmp_path / "a" / "shard.pt", request_ids=None, logits=_torch().zeros(8, 4))
    b = save_shard(tmp_path / "b" / "shard.pt", request_ids=None)
    ts = read_traces([a, b])  # no request ids: every round is its own request, per file
    assert ts.rounds == 16 and ts.requests == 16
    # the same shard under two names, and the same path twice, are told apart from a collision
    import shutil

    c = save_shard(tmp_path / "c.pt")
    shutil.copy(c, tmp_path / "d.pt")
    with pytest.raises(ConfigError, match=r"d\.pt: the same file as .*c\.pt \(identical bytes\)"):
        read_traces([c, tmp_path / "d.pt"])
    with pytest.raises(ConfigError, match=r"c\.pt: given twice"):
        read_traces([c, c])


def test_empty_shard_says_so(tmp_path: Path) -> None:
    torch = _torch()
    empty = save_shard(
        tmp_path / "empty.pt", logits=torch.zeros(0, 4), prefix_mask=torch.zeros(0, 4), request_ids=None
    )
    full = save_shard(tmp_path / "full.pt")
    ts = read_traces([empty, full])
    assert [n.code for n in ts.notices] == ["EMPTY_SHARD"]
    assert ts.rounds == 8


# ---------------------------------------------------------------------------------------------
# Bad inputs, one row per way to be wrong (Parquet and JSONL readers)


def _rows(**changes: Any) -> dict[str, Any]:
    rows = valid_rows()
    rows.update(changes)
    return rows


PARQUET_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("nan_logit", _rows(logits=[[0.5, math.nan, 0.5]] + [[0.5] * 3] * 3), r"row 0 .*logits\[2\] is nan"),
    ("inf_logit", _rows(logits=[[0.5] * 3] * 3 + [[0.5, 0.5, math.inf]]), r"row 3 .*logits\[3\] is inf"),
    ("null_logit_value", _rows(logits=[[0.5, None, 0.5]] + [[0.5] * 3] * 3), "NaN/Inf or null"),
    ("null_logits", _rows(logits=[None] + [[0.5] * 3] * 3), "logits is null"),
    (
        "ragged_k",
        _rows(logits=[[0.5] * 3, [0.5] * 2, [0.5] * 3, [0.5] * 3]),
        "row 1 has 2 logits, expected K=3",
    ),
    (
        "accepted_gt_verified",
        _rows(accepted=[1, 3, 1, 1], verified=[3, 2, 3, 3]),
        "accepted=3 .*exceeds verified",
    ),
    ("verified_gt_k", _rows(verified=[3, 3, 4, 3]), "verified=4 exceeds K=3"),
    ("negative_accepted", _rows(accepted=[1, -1, 1, 1]), "accepted=-1 is negative"),
    ("negative_verified", _rows(verified=[-1, 3, 3, 3], accepted=[0, 1, 1, 1]), "verified=-1 is negative"),
    ("negative_round", _rows(round=[0, -5, 1, 1]), "round=-5 must be in"),
    ("duplicate_round", _rows(round=[0, 0, 0, 1]), "round 0 of request 'q0' appears more than once"),
    ("null_request", _rows(request_id=["q0", None, "q0", "q1"]), "request_id is null"),
    ("null_verified", _rows(verified=[3, None, 3, 3]), "verified is null"),
    (
        "request_id_not_utf8",
        _rows(request_id=pa.array([b"q0", b"q\xff", b"q0", b"q1"], pa.binary()).view(pa.string())),
        r"row 1: request_id holds bytes that are not UTF-8 \(b'\\xff' at byte 1\)",
    ),
    (
        "binary_request_id_not_utf8",
        _rows(request_id=pa.array([b"q0", b"q0", b"\xc3\x28", b"q1"], pa.binary())),
        "row 2: request_id holds bytes that are not UTF-8",
    ),
    (
        "sampling_not_utf8",
        _rows(sampling=pa.array([b"g", b"g", b"g", b"\xed\xa0\x80"], pa.binary()).view(pa.string())),
        "row 3: sampling holds bytes that are not UTF-8",
    ),
    ("request_id_wrong_type", _rows(request_id=[[1], [2], [3], [4]]), "column 'request_id' has type list"),
]


@pytest.mark.parametrize(("name", "rows", "message"), PARQUET_CASES, ids=[c[0] for c in PARQUET_CASES])
def test_bad_parquet_rows(tmp_path: Path, name: str, rows: dict[str, Any], message: str) -> None:
    path = write_table(tmp_path / f"{name}.parquet", rows)
    with pytest.raises(ConfigError, match=message) as info:
        read_traces([path])
    assert path.name in str(info.value)


def test_parquet_missing_column_names_the_fix(tmp_path: Path) -> None:
    rows = valid_rows()
    del rows["verified"]
    path = write_table(tmp_path / "t.parquet", rows)
    with pytest.raises(ConfigError, match=r"missing column\(s\) \['verified'\].*docs/fit.md"):
        read_traces([path])


def test_k_mismatch_between_files_names_both(tmp_path: Path) -> None:
    a = write_table(tmp_path / "a.parquet", valid_rows(k=3))
    b = write_table(tmp_path / "b.parquet", valid_rows(k=4))
    with pytest.raises(
        ConfigError, match=r"b\.parquet: row 0 has 4 logits, expected K=3.*came from .*a\.parquet"
    ):
        read_traces([a, b])
    with pytest.raises(ConfigError, match="expected K=5"):
        read_traces([a], k=5)


def test_same_file_twice_is_a_duplicate(tmp_path: Path) -> None:
    a = write_table(tmp_path / "a.parquet", valid_rows())
    with pytest.raises(ConfigError, match="given twice"):
        read_traces([a, a])


def test_not_parquet_and_unknown_suffix_and_missing(tmp_path: Path) -> None:
    (tmp_path / "x.parquet").write_bytes(b"PAR1 nope")
    with pytest.raises(ConfigError, match="not a readable Parquet file"):
        read_traces([tmp_path / "x.parquet"])
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match=r"unknown trace format '\.csv'"):
        read_traces([tmp_path / "x.csv"])
    with pytest.raises(ConfigError, match="no such trace file"):
        read_traces([tmp_path / "missing.parquet"])
    with pytest.raises(ConfigError, match="no trace files given"):
        expand_trace_paths([])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="holds no trace files"):
        expand_trace_paths([empty])


def _line(**changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "request_id": "r",
        "round": 0,
        "logits": [0.1, 0.2, 0.3],
        "accepted": 1,
        "verified": 3,
    }
    for key, value in changes.items():
        if value is ...:
            obj.pop(key)
        else:
            obj[key] = value
    return obj


JSONL_CASES: list[tuple[str, str, str]] = [
    ("not_json", "{oops", "not valid UTF-8 JSON"),
    (
        "nan_literal",
        '{"request_id":"r","round":0,"logits":[NaN,0,0],"accepted":0,"verified":3}',
        "literal NaN is not allowed",
    ),
    (
        "infinity_literal",
        '{"request_id":"r","round":0,"logits":[0,-Infinity,0],"accepted":0,"verified":3}',
        "literal -Infinity is not allowed",
    ),
    (
        "huge_number",
        '{"request_id":"r","round":0,"logits":[1e999,0,0],"accepted":0,"verified":3}',
        "number 1e999 is not finite",
    ),
    (
        "duplicate_key",
        '{"request_id":"r","round":0,"logits":[0,0,0],"accepted":0,"accepted":3,"verified":3}',
        "duplicate JSON key 'accepted'",
    ),
    ("array_line", "[1,2,3]", "expected a JSON object per line"),
    ("missing_verified", json.dumps(_line(verified=...)), r"missing field\(s\) \['verified'\].*verified=K"),
    ("misspelt_field", json.dumps({**_line(), "verifed": 3}), r"unknown field\(s\) \['verifed'\]"),
    ("bool_accepted", json.dumps(_line(accepted=True)), "'accepted' must be an integer"),
    ("float_round", json.dumps(_line(round=1.5)), "'round' must be an integer"),
    ("string_logit", json.dumps(_line(logits=[0.1, "x", 0.3])), r"logits\[2\] must be a number"),
    ("empty_logits", json.dumps(_line(logits=[])), "non-empty list"),
    ("accepted_gt_verified", json.dumps(_line(accepted=3, verified=2)), "accepted=3 must be in 0..verified"),
    ("verified_gt_k", json.dumps(_line(verified=4)), r"verified=4 must be in 0..K \(K=3"),
    ("negative_temperature", json.dumps(_line(temperature=-1)), "temperature=-1"),
    ("empty_request", json.dumps(_line(request_id="")), "non-empty string"),
    (
        "integer_logit_of_400_digits",
        '{"request_id":"r","round":0,"logits":[' + "9" * 400 + ',0,0],"accepted":0,"verified":3}',
        "integer literal of 400 digits is longer than the 64-digit limit",
    ),
    (
        "integer_temperature_of_400_digits",
        '{"request_id":"r","round":0,"logits":[0,0,0],"accepted":0,"verified":3,"temperature":'
        + "9" * 400
        + "}",
        "integer literal of 400 digits",
    ),
    (
        "logit_beyond_float32",
        json.dumps(_line(logits=[1e39, 0.0, 0.0])),
        r"logits\[1\] is 1e\+39, beyond float32",
    ),
    (
        "lone_surrogate_request_id",
        '{"request_id":"a\\ud800","round":0,"logits":[0,0,0],"accepted":0,"verified":3}',
        "'request_id' holds '\\\\ud800' at character 1, a lone surrogate",
    ),
    (
        "lone_surrogate_sampling",
        '{"request_id":"r","round":0,"logits":[0,0,0],"accepted":0,"verified":3,"sampling":"\\udc80"}',
        "'sampling' holds .* a lone surrogate",
    ),
    ("nested_5000_deep", '{"request_id":"r","x":' + "[" * 5000 + "]" * 5000 + "}", "nests too deeply"),
    ("nested_40_deep", '{"request_id":"r","x":' + "[" * 40 + "]" * 40 + "}", "nests deeper than 32 levels"),
]


@pytest.mark.parametrize(("name", "text", "message"), JSONL_CASES, ids=[c[0] for c in JSONL_CASES])
def test_bad_jsonl_lines(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = tmp_path / f"{name}.jsonl"
    path.write_text(json.dumps(_line(request_id="ok")) + "\n\n" + text + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as info:
        read_traces([path])
    assert f"{path}: line 3" in str(info.value)


def test_jsonl_k_mismatch_within_and_between_files(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [_line(round=0), _line(round=1, logits=[0.0, 0.0], verified=2)]
    path.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    with pytest.raises(ConfigError, match="line 2: 2 logits, expected K=3"):
        read_traces([path])
    first = tmp_path / "first.jsonl"
    first.write_text(json.dumps(_line()), encoding="utf-8")
    second = tmp_path / "second.jsonl"
    second.write_text(json.dumps(_line(logits=[0.0] * 4, verified=4)), encoding="utf-8")
    with pytest.raises(
        ConfigError, match=r"second\.jsonl: line 1: 4 logits, expected K=3.*came from .*first\.jsonl"
    ):
        read_traces([first, second])


def test_jsonl_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xff\xfe{}\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_traces([path])


def test_parse_trace_record_accepts_integer_request_ids() -> None:
    rec = parse_trace_record(_line(request_id=17, sampling="greedy", temperature=0))
    assert rec.request_id == "17" and rec.sampling == "greedy" and rec.temperature == 0.0


# ---------------------------------------------------------------------------------------------
# Properties of the parsers

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    k = draw(st.integers(1, 8))
    verified = draw(st.integers(0, k))
    return {
        "request_id": draw(st.text(min_size=1, max_size=12)),
        "round": draw(st.integers(0, 2**32 - 1)),
        "logits": draw(st.lists(finite, min_size=k, max_size=k)),
        "accepted": draw(st.integers(0, verified)),
        "verified": verified,
        **draw(st.fixed_dictionaries({}, optional={"sampling": st.none() | st.text(max_size=5)})),
    }


@given(records())
def test_valid_records_parse_and_round_trip(obj: dict[str, Any]) -> None:
    rec = parse_trace_record(json.loads(json.dumps(obj)))
    again = parse_trace_record(json.loads(json.dumps(rec.to_dict())))
    assert again == rec
    assert list(rec.logits) == [float(x) for x in obj["logits"]]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(json_values)
def test_arbitrary_json_either_parses_or_raises_config_error(obj: Any) -> None:
    try:
        rec = parse_trace_record(obj)
    except ConfigError:
        return
    assert 0 <= rec.accepted <= rec.verified <= len(rec.logits)
    assert all(math.isfinite(v) for v in rec.logits)


@given(
    st.integers(1, 8).flatmap(
        lambda k: st.tuples(st.just(k), st.lists(st.integers(0, k), min_size=1, max_size=30))
    )
)
def test_prefix_masks_give_their_lengths(case: tuple[int, list[int]]) -> None:
    k, lengths = case
    mask = (np.arange(k)[None, :] < np.asarray(lengths)[:, None]).astype(np.uint8)
    assert prefix_lengths(mask).tolist() == lengths


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(2, 8).flatmap(
        lambda k: st.lists(st.lists(st.integers(0, 1), min_size=k, max_size=k), min_size=1, max_size=20)
    )
)
def test_any_mask_is_either_a_prefix_or_refused(rows: list[list[int]]) -> None:
    mask = np.asarray(rows, dtype=np.uint8)
    is_prefix = all(r == sorted(r, reverse=True) for r in rows)
    if is_prefix:
        assert prefix_lengths(mask).tolist() == [sum(r) for r in rows]
    else:
        with pytest.raises(ConfigError, match="not a prefix"):
            prefix_lengths(mask)


FOOTER_CASES: list[tuple[str, bytes, str]] = [
    (
        "duplicate_key",
        b'{"schema_version":1,"synthetic":false,"synthetic":true}',
        "duplicate JSON key 'synthetic'",
    ),
    ("nan_literal", b'{"schema_version":1,"x":NaN}', "literal NaN is not allowed"),
    ("not_utf8", b'{"schema_version":1,"x":"\xff"}', "not valid UTF-8 JSON"),
    ("deep", b'{"x":' + b"[" * 40 + b"]" * 40 + b"}", "nests deeper than 32 levels"),
    ("not_an_object", b"[1]", "must be a JSON object"),
]


@pytest.mark.parametrize(("name", "footer", "message"), FOOTER_CASES, ids=[c[0] for c in FOOTER_CASES])
def test_bad_trace_footers(tmp_path: Path, name: str, footer: bytes, message: str) -> None:
    """The 'dspark.trace' footer is untrusted JSON, read by the same strict loader."""
    table = pa.table(valid_rows()).replace_schema_metadata({b"dspark.trace": footer})
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path)
    with pytest.raises(ConfigError, match=message) as info:
        read_traces([path])
    assert "'dspark.trace' footer" in str(info.value)
