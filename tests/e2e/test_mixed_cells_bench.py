"""``benchmarks/mixed_cells.py`` on the committed H200 mixed recording: the library's mixed
deployment path, re-run on CPU over the run's workload and mixed sweep, reproduces what the GPU
run's own build reported (why each measured cell was left out, the decode policy, the diverged
steps), so the analysis built on it describes that run."""

from __future__ import annotations

import tarfile
from collections import Counter
from pathlib import Path

import pytest
from benchmarks import mixed_cells

pytestmark = pytest.mark.slow


def test_the_run_s_mixed_build_is_reproduced(tmp_path: Path) -> None:
    with tarfile.open(mixed_cells.TGZ) as tar:
        tar.extractall(tmp_path, filter="data")
    run = mixed_cells.load(tmp_path / "toolkit", mixed_cells.RESULT)
    outcome = run.result["stages"]["build_decode_mixed"]["outcome"]
    recorded, evidence = mixed_cells.breakdown(run, mixed_cells.as_recorded(run.grid))
    counts = dict(sorted(Counter(recorded.values()).items()))
    assert f"mixed cells not deployed: {counts}" in outcome["notes"]
    assert run.decode_compact_steps == outcome["replay"]["economics"]["compact_choices"]
    assert int(evidence.diverged.sum()) == outcome["replay"]["mixed"]["mixed_part"]["diverged_steps"]
    assert dict(Counter(evidence.reason)) == outcome["replay"]["mixed"]["reasons"]
    # Under the paired bounds build uses now, the same cells: fewer dead, none deployed.
    paired, _ = mixed_cells.breakdown(run, run.grid)
    assert "deployed" not in paired.values()
    assert sum(r == "dead" for r in paired.values()) < counts["dead"]
