"""Distributed sweeps with real torch.distributed (gloo, 2 CPU processes)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticBackend
from dspark_calibrate.calibrate.measurement.distributed import SingleProcess, disagreement
from dspark_calibrate.calibrate.measurement.journal import read_journal
from dspark_calibrate.calibrate.measurement.stats import Thresholds
from dspark_calibrate.errors import ConfigError, MeasurementError

torch = pytest.importorskip("torch")


class SkewedBackend(SyntheticBackend):
    """Synthetic backend whose rank-1 copy is 20% slower but describes itself identically."""

    def __init__(self, rank: int, fail_at: int | None = None) -> None:
        super().__init__(
            seed=rank, fail_at=fail_at, base_ms=4.0 * (1.2 if rank == 1 else 1.0), noise_rel=0.001
        )

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "skewed": True}


def _scenarios(rank: int, world: int, tmp: str) -> None:
    import torch.distributed as dist

    from dspark_calibrate.calibrate.measurement.distributed import TorchDistributed
    from dspark_calibrate.calibrate.measurement.ladder import plan_cells
    from dspark_calibrate.calibrate.measurement.sweep import SweepConfig, build_fingerprint, run_sweep

    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp}/store",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    comm = TorchDistributed("cpu")
    report: dict[str, Any] = {}

    def config(backend: Any, ladder: tuple[int, ...], **kw: Any) -> SweepConfig:
        fp = build_fingerprint(
            k=3, ladder=ladder, world_size=world, backend_fields=backend.fingerprint_fields()
        )
        return SweepConfig(
            k=3,
            ladder=ladder,
            cells=plan_cells(k=3, ladder=ladder, max_per_g=3),
            protocol="adaptive",
            thresholds=kw.pop("thresholds", Thresholds.quick()),
            seed=5,
            backend=backend.describe(),
            world_size=world,
            fingerprint=fp.to_dict(),
            **kw,
        )

    # (a) ranks disagree on the ladder: the same error on every rank, nothing written
    backend = SkewedBackend(rank)
    try:
        run_sweep(
            config(backend, (2,) if rank == 0 else (2, 4)),
            backend,
            journal_path=Path(tmp) / "bad.jsonl",
            comm=comm,
        )
        report["mismatch"] = None
    except ConfigError as exc:
        report["mismatch"] = str(exc)
    report["bad_journal_exists"] = (Path(tmp) / "bad.jsonl").exists()

    # (b) lockstep sweep: a sample is the slowest rank's time
    cfg = config(backend, (2,))
    journal = Path(tmp) / "sweep.jsonl"
    result = run_sweep(cfg, backend, journal_path=journal, comm=comm)
    report["medians"] = {f"{c.spec.key}": c.summary.median_ms for c in result.cells if c.summary}
    report["sample_ranks"] = sorted(set(result.samples.column("rank").to_pylist()))
    report["complete"] = result.complete

    # (c) resume: rank 0 reads the journal and broadcasts it; nothing is re-measured
    again = run_sweep(cfg, SkewedBackend(rank), journal_path=journal, comm=comm, resume=True)
    report["resumed"] = again.resumed
    report["resumed_medians"] = {f"{c.spec.key}": c.summary.median_ms for c in again.cells if c.summary}

    # (e) a backend that fails on one rank: every rank raises, naming it, instead of hanging
    broken = SkewedBackend(rank, fail_at=30 if rank == 1 else None)
    try:
        run_sweep(config(broken, (2,)), broken, journal_path=Path(tmp) / "fail.jsonl", comm=comm)
        report["failure"] = None
    except MeasurementError as exc:
        report["failure"] = str(exc)
    if rank == 0:
        records = read_journal(Path(tmp) / "fail.jsonl").records
        report["fail_journal_visits"] = sum(1 for r in records if r["type"] == "visit")

    # (d) tensor-parallel reference model: all-reduce inside the step
    from dspark_calibrate.calibrate.measurement.backends.reference import ReferenceBackend

    ref = ReferenceBackend(config="tiny", context_len=8, max_rows=4, max_row_len=4)
    ref_cfg = SweepConfig(
        k=3,
        ladder=(2,),
        cells=plan_cells(k=3, ladder=(2,), budgets={2: (3,)}, include_control=False),
        protocol="adaptive",
        thresholds=Thresholds.quick(min_rounds=2, min_samples=2, max_samples_per_cell=6, precision_rel=0.9),
        seed=1,
        backend=ref.describe(),
        world_size=world,
        fingerprint=build_fingerprint(
            k=3, ladder=(2,), world_size=world, backend_fields=ref.fingerprint_fields()
        ).to_dict(),
    )
    ref_result = run_sweep(ref_cfg, ref, journal_path=None, comm=comm)
    report["tp_size"] = ref.describe()["tp_size"]
    report["tp_complete"] = ref_result.complete

    # (f) interleaved: every rank must run the same sequence of cells, or the all-reduce inside
    # the step would pair one rank's native step with another's compact one (or hang)
    from dataclasses import replace

    il_cfg = replace(ref_cfg, cells=plan_cells(k=3, ladder=(2,), budgets={2: (3,)}), interleave=True)
    il_result = run_sweep(il_cfg, ref, journal_path=None, comm=comm)
    report["tp_interleaved_complete"] = il_result.complete
    report["tp_interleaved_samples"] = il_result.samples.num_rows
    Path(tmp, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_scenarios, args=(2, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    for rep in (r0, r1):
        assert rep["mismatch"] and "ladder" in rep["mismatch"] and "ranks disagree" in rep["mismatch"]
        assert not rep["bad_journal_exists"]
        assert rep["complete"] and rep["sample_ranks"] == [1]  # rank 1 is slower: every sample is its time
        assert rep["resumed"] and rep["resumed_medians"] == rep["medians"]
        assert rep["tp_size"] == 2 and rep["tp_complete"]
        assert rep["tp_interleaved_complete"] and rep["tp_interleaved_samples"] > 0
        assert rep["failure"] and "rank(s) [1] of 2" in rep["failure"]
    assert "failed here" in r1["failure"] and "device lost" in r1["failure"]
    assert r0["fail_journal_visits"] >= 1
    assert r0["medians"] == r1["medians"]
    assert r0["tp_interleaved_samples"] == r1["tp_interleaved_samples"]
    assert read_journal(tmp_path / "sweep.jsonl").header["config"]["world_size"] == 2


@pytest.mark.parametrize(
    ("case", "payloads", "needle"),
    [
        ("agree", [{"k": 5}, {"k": 5}], None),
        ("k_differs", [{"k": 5}, {"k": 4}], "rank 1 sweep.k is 4, rank 0 has 5"),
        ("missing_field", [{"k": 5, "gpu": "H200"}, {"k": 5}], "sweep.gpu is null"),
        ("third_rank", [{"k": 5}, {"k": 5}, {"k": 6}], "rank 2 sweep.k"),
    ],
)
def test_disagreement_messages(case: str, payloads: list[dict[str, Any]], needle: str | None) -> None:
    message = disagreement("sweep", payloads)
    if needle is None:
        assert message is None
    else:
        assert message is not None and needle in message


def test_single_process_is_identity() -> None:
    import numpy as np

    comm = SingleProcess()
    arr = np.ones((2, 6))
    assert comm.gather_visit(arr).shape == (1, 2, 6) and comm.broadcast({"a": 1}) == {"a": 1}
    comm.agree("x", {"a": 1})
