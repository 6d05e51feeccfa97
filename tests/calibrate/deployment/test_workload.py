"""Workload traces: the table, its reader/writer, recorder shards, and the synthetic generator."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dspark_calibrate.artifacts import logical_sha256
from dspark_calibrate.calibrate.deployment.workload import (
    read_recorder_shards,
    read_workload,
    synthesize_workload,
    workload_from_arrays,
    workload_from_recorder_payloads,
    write_workload,
)
from dspark_calibrate.errors import ConfigError

K = 5


def _columns(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "step": np.array([0, 0, 1, 1, 1]),
        "rank": np.array([0, 0, 0, 1, 1]),
        "request_id": ["b", "a", "a", "c", "d"],
        "logits": np.arange(25, dtype=np.float32).reshape(5, K) / 10,
        "accepted": np.array([0, 5, 2, 1, 3]),
        "output_len": np.array([0, 0, 6, 0, 0]),
    }
    base.update(overrides)
    return base


def test_round_trip_keeps_identity_and_flags(tmp_path: Path) -> None:
    w = workload_from_arrays(**_columns(), approximate=True, notes=("two ranks",), source="unit")
    assert w.k == K and w.num_ranks == 2 and w.steps == 2 and w.rows == 5
    assert w.table.column("request_id").to_pylist()[:2] == ["a", "b"]  # canonical (step, rank, request) order
    path = tmp_path / "w.parquet"
    digest = write_workload(path, w)
    back = read_workload(path, k=K)
    assert digest == w.identity_sha256 == back.identity_sha256 == logical_sha256(back.table, "workload")
    assert back.approximate and back.notes == ("two ranks",) and back.source == "unit"
    a = back.arrays()
    assert a.logits.shape == (5, K) and a.logits.dtype == np.float32
    assert a.request.tolist() == [0, 1, 0, 2, 3]  # codes follow the request_id order


def test_plain_parquet_without_footer_is_accepted(tmp_path: Path) -> None:
    w = workload_from_arrays(**_columns())
    path = tmp_path / "plain.parquet"
    pq.write_table(w.table, path)
    assert read_workload(path).identity_sha256 == w.identity_sha256


BAD_COLUMNS = [
    ("accepted above K", {"accepted": np.array([0, 6, 2, 1, 3])}, "accepted"),
    ("negative step", {"step": np.array([-1, 0, 1, 1, 1])}, "step"),
    ("duplicate request in a step", {"request_id": ["a", "a", "a", "c", "d"]}, "appears twice"),
    ("non-finite logit", {"logits": np.full((5, K), np.inf, dtype=np.float32)}, "finite"),
]


@pytest.mark.parametrize(
    ("overrides", "match"), [c[1:] for c in BAD_COLUMNS], ids=[c[0] for c in BAD_COLUMNS]
)
def test_bad_workloads_are_refused(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        workload_from_arrays(**_columns(**overrides))


def test_workload_from_another_k_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.parquet"
    write_workload(path, workload_from_arrays(**_columns()))
    with pytest.raises(ConfigError, match="K=5 logits per row, the deployment has K=4"):
        read_workload(path, k=4)


def test_other_artifact_kind_is_refused(tmp_path: Path) -> None:
    from tests.calibrate.build_factories import write_calibration

    path = write_calibration(tmp_path / "c.parquet")
    with pytest.raises(ConfigError, match="expected a workload"):
        read_workload(path)


def _payload(rank: int, n: int, *, step_id: bool, seed: int, ids: bool = False) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    acc = rng.integers(0, K + 1, n)
    p: dict[str, Any] = {
        "pairing": "draft_seq_ring",
        "logits": rng.normal(size=(n, K)).astype(np.float32),
        "prefix_mask": (np.arange(K)[None, :] < acc[:, None]).astype(np.float32),
        "graph_batch_size": np.full(n, 4, dtype=np.int32),
        "max_draft_len": K,
        "rank": rank,
        "rows_seen": n,
        "rows_written": n,
    }
    if step_id:
        p["step_id"] = np.repeat(np.arange(n // 4), 4)[:n]
    if ids:
        p["request_id"] = np.tile(np.arange(4) + 100 * rank, n // 4)[:n]
    return p


def test_recorder_shards_with_step_ids() -> None:
    w = workload_from_recorder_payloads(
        [_payload(0, 12, step_id=True, seed=1, ids=True), _payload(1, 8, step_id=True, seed=2, ids=True)]
    )
    assert not w.approximate and w.num_ranks == 2 and w.steps == 3 and w.rows == 20
    assert any("counter" in n for n in w.notes)
    a = w.arrays()
    assert a.accepted.max() <= K
    # output_len estimated from accepted lengths: a request's second row starts after its first's tokens
    first = (a.step == 0) & (a.rank == 0)
    second = (a.step == 1) & (a.rank == 0)
    assert np.array_equal(a.output_len[second], a.accepted[first] + 1)


def test_recorder_shards_without_step_ids_are_approximate() -> None:
    w = workload_from_recorder_payloads([_payload(0, 10, step_id=False, seed=3)])
    assert w.approximate and w.steps == 3  # 4 + 4 + 2 rows
    assert any("approximate" in n for n in w.notes)
    assert any("request ids absent" in n for n in w.notes)


def test_recorder_shards_must_agree_on_k() -> None:
    other = _payload(1, 4, step_id=True, seed=4) | {"max_draft_len": 4}
    with pytest.raises(ConfigError, match="disagree on max_draft_len"):
        workload_from_recorder_payloads([_payload(0, 4, step_id=True, seed=4), other])
    with pytest.raises(ConfigError, match="lacks"):
        workload_from_recorder_payloads([{"max_draft_len": K, "rank": 0}])


def test_read_pt_shards(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    p = _payload(0, 8, step_id=True, seed=5)
    payload = {k: (torch.from_numpy(np.asarray(v)) if isinstance(v, np.ndarray) else v) for k, v in p.items()}
    path = tmp_path / "trace.rank0.pt"
    torch.save(payload, path)
    w = read_recorder_shards([path])
    assert w.rows == 8 and w.steps == 2
    with pytest.raises(ConfigError, match="cannot read"):
        read_recorder_shards([tmp_path / "missing.pt"])


def test_synthetic_workload_is_deterministic_and_marked() -> None:
    a = synthesize_workload(k=K, steps=300, ranks=2, max_rows=16, seed=7)
    b = synthesize_workload(k=K, steps=300, ranks=2, max_rows=16, seed=7)
    c = synthesize_workload(k=K, steps=300, ranks=2, max_rows=16, seed=8)
    assert a.identity_sha256 == b.identity_sha256 != c.identity_sha256
    assert a.synthetic and a.num_ranks == 2 and a.steps == 300
    arr = a.arrays()
    counts = np.bincount(arr.step * 2 + arr.rank)
    assert counts.min() >= 1 and counts.max() <= 16
    assert 0 < arr.accepted.mean() < K
    with pytest.raises(ConfigError):
        synthesize_workload(k=K, steps=0)


def test_synthetic_logits_follow_the_sts_temperatures() -> None:
    w = synthesize_workload(k=2, steps=3000, max_rows=8, seed=1, temperatures=(2.0, 3.0))
    a = w.arrays()
    p1 = 1 / (1 + np.exp(-a.logits[:, 0] / 2.0))
    # calibrated: the mean predicted first-position acceptance matches the observed rate
    assert abs(p1.mean() - (a.accepted >= 1).mean()) < 0.02
    assert isinstance(w.table, pa.Table)


def _workload_app() -> Any:
    import typer

    from dspark_calibrate.cli import workload as workload_cli

    app = typer.Typer()
    workload_cli.register(app)
    return app


def test_cli_synth_and_import(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    runner = CliRunner()
    out = tmp_path / "w.parquet"
    res = runner.invoke(
        _workload_app(),
        [
            "workload",
            "synth",
            "--out",
            str(out),
            "--steps",
            "50",
            "--max-rows",
            "8",
            "--temperatures",
            "1.2,1.3",
            "--k",
            "2",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["synthetic"] is True and doc["steps"] == 50 and doc["k"] == 2
    assert read_workload(out, k=2).synthetic
    bad = runner.invoke(_workload_app(), ["workload", "synth", "--out", str(out), "--temperatures", "x"])
    assert bad.exit_code == 2 and "not a list of numbers" in bad.stderr
    missing = runner.invoke(
        _workload_app(), ["workload", "import-trtllm", str(tmp_path / "nope.pt"), "--out", str(out)]
    )
    assert missing.exit_code == 2


def _save(path: Path, obj: Any) -> Path:
    import torch

    torch.save(obj, path)
    return path


def _fit_shard(path: Path) -> Path:
    """A fit recorder shard (draft_seq_ring traces), not a confidence-trace workload shard."""
    import torch

    return _save(
        path,
        {
            "logits": torch.zeros(4, K),
            "prefix_mask": torch.zeros(4, K),
            "meta": {"pairing": "draft_seq_ring", "block_size": K},
        },
    )


def _payload_with(**changes: Any) -> Any:
    def make(path: Path) -> Path:
        import torch

        payload = {
            k: (torch.from_numpy(np.asarray(v)) if isinstance(v, np.ndarray) else v)
            for k, v in _payload(0, 8, step_id=True, seed=1).items()
        }
        payload.update(changes)
        return _save(path, {k: v for k, v in payload.items() if v is not None})

    return make


#: Files that are not TensorRT-LLM confidence-trace shards, or hold a field of the wrong kind:
#: each printed a traceback (exit 1); now exit 2 with one line naming the file and the field.
NOT_WORKLOAD_SHARDS = [
    ("fit_recorder_shard", _fit_shard, r"s\.pt: 'max_draft_len' must be an integer, found missing"),
    ("list_payload", lambda p: _save(p, [1, 2, 3]), r"s\.pt: not a recorder payload: a list"),
    (
        "not_a_torch_file",
        lambda p: (p.write_bytes(b"PAR1 not torch"), p)[1],
        r"s\.pt: cannot load as a recorder shard",
    ),
    (
        "max_draft_len_string",
        _payload_with(max_draft_len="5"),
        r"'max_draft_len' must be an integer, found str",
    ),
    ("rank_float_tensor", _payload_with(rank=[0.5]), r"'rank' must be an integer"),
    (
        "ragged_logits",
        _payload_with(logits=[[0.1] * K] * 7 + [[0.1]]),
        r"'logits' is not a rectangular numeric array",
    ),
    ("string_mask", _payload_with(prefix_mask=[["1"] * K] * 8), r"'prefix_mask' must hold numbers"),
    ("step_id_wrong_length", _payload_with(step_id=[0, 1]), r"'step_id' must be a vector of 8 values"),
    (
        "nan_graph_batch_size",
        _payload_with(graph_batch_size=[float("nan")] * 8, step_id=None),
        r"'graph_batch_size' holds NaN",
    ),
]


@pytest.mark.parametrize(
    ("name", "make", "message"), NOT_WORKLOAD_SHARDS, ids=[c[0] for c in NOT_WORKLOAD_SHARDS]
)
def test_import_trtllm_refuses_what_is_not_a_workload_shard(
    tmp_path: Path, name: str, make: Any, message: str
) -> None:
    from typer.testing import CliRunner

    shard = make(tmp_path / "s.pt")
    res = CliRunner().invoke(
        _workload_app(), ["workload", "import-trtllm", str(shard), "--out", str(tmp_path / "w.parquet")]
    )
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert res.exit_code == 2, res.output
    assert re.search(message, " ".join(res.stderr.split())), res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.stderr
    assert not (tmp_path / "w.parquet").exists()


def test_import_trtllm_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    import os

    from tests.hangs import fifo_watchdog

    fifo = tmp_path / "s.pt"
    os.mkfifo(fifo)
    with fifo_watchdog(tmp_path), pytest.raises(ConfigError, match="not a regular file"):
        read_recorder_shards([fifo])


# --- mixed steps: the workload-mixed companion table -----------------------------------------------


def _mixed_workload(tmp_path: Path) -> tuple[Path, Any]:
    from dspark_calibrate.calibrate.deployment.workload import synthesize_mixed_workload

    w = synthesize_mixed_workload(k=3, steps=300, ranks=2, seed=1, prefill_share=0.5)
    path = tmp_path / "w.parquet"
    write_workload(path, w)
    return path, w


def test_mixed_steps_round_trip_with_their_companion(tmp_path: Path) -> None:
    from dspark_calibrate.calibrate.deployment.workload import mixed_path

    path, w = _mixed_workload(tmp_path)
    assert mixed_path(path).is_file()
    back = read_workload(path, k=3)
    assert back.mixed is not None and back.mixed.equals(w.mixed)
    steps = back.mixed_step_rows()
    assert 0.35 < len(steps) / back.steps < 0.65  # about the asked prefill share
    for s in steps[:20]:
        assert s.description.has_real_context()
        assert s.stop - s.start == sum(len(r.generations) for r in s.description.ranks)


def _edit_companion(path: Path, change: Any) -> None:
    from dspark_calibrate.calibrate.deployment.workload import mixed_path

    companion = mixed_path(path)
    table = pq.read_table(companion)
    pq.write_table(change(table), companion)


def _drop_first_generation(t: pa.Table) -> pa.Table:
    role = t.column("role").to_pylist()
    i = role.index("generation")
    return pa.concat_tables([t.slice(0, i), t.slice(i + 1)]).replace_schema_metadata(t.schema.metadata)


def test_a_missing_or_edited_companion_is_refused(tmp_path: Path) -> None:
    from dspark_calibrate.calibrate.deployment.workload import mixed_path

    path, _ = _mixed_workload(tmp_path)
    _edit_companion(path, _drop_first_generation)
    with pytest.raises(ConfigError, match=r"needs its mixed entry|logical hash"):
        read_workload(path, k=3)
    mixed_path(path).unlink()
    with pytest.raises(ConfigError, match="cannot be read"):
        read_workload(path, k=3)


def _context_payload(rank: int) -> dict[str, Any]:
    p = _payload(rank, 8, step_id=True, seed=rank, ids=True)
    p["logits"] = p["logits"][:, :K]
    p["history"] = np.full(8, 300, dtype=np.int64)
    if rank == 0:  # one chunk in step 1 (rows 4..7): that step is mixed
        p["context_step_id"] = np.array([1])
        p["context_request_id"] = np.array([999])
        p["context_chunk_size"] = np.array([64])
        p["context_position"] = np.array([128])
    return p


def test_recorder_shards_with_context_chunks_give_mixed_steps() -> None:
    w = workload_from_recorder_payloads([_context_payload(0), _context_payload(1)])
    steps = w.mixed_step_rows()
    assert [s.step for s in steps] == [1]
    (step,) = steps
    r0 = step.description.ranks[0]
    assert [(c.size, c.position) for c in r0.context] == [(64, 128)]
    assert all(g.history == 300 for r in step.description.ranks for g in r.generations)
    broken = _context_payload(0)
    del broken["history"]
    with pytest.raises(ConfigError, match="history"):
        workload_from_recorder_payloads([broken])
