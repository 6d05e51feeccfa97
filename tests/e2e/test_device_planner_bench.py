"""``benchmarks/device_planner.py`` in its tiny CPU mode, and its conversion of an e2e run's bracket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from benchmarks import device_planner

pytestmark = pytest.mark.slow


def test_tiny_run_writes_the_result(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    try:
        assert (
            device_planner.main(["--tiny", "--out", str(tmp_path), "--bracket-runs", "2", "--levels", "2,8"])
            == 0
        )
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
    result = json.loads((tmp_path / "device_planner.json").read_text())
    assert result["status"] == "done" and result["identical_outputs"] is True
    for key in ("gpu", "commit", "command", "settings", "verdict", "micro"):
        assert key in result, key
    assert "benchmarks/device_planner.py --tiny" in result["command"]
    assert set(result["levels"]) == {"2", "8"}
    for row in result["levels"].values():
        for key in ("device_overhead_ms", "host_overhead_ms", "device_fused_overhead_ms", "static_step_ms"):
            assert isinstance(row[key], float), key
        assert len(row["ci"]["device"]) == 2 and len(row["ci"]["host"]) == 2 and row["runs"] == 2
    micro = result["micro"]
    assert set(micro["per_g"]) == {"2", "4", "8"}
    assert micro["decisions_equal_to_reference"]["equal"] == micro["decisions_equal_to_reference"]["steps"]
    compiled = micro["compiled_decisions_equal_to_reference"]
    assert compiled["equal"] == compiled["windows_equal"] == compiled["steps"] > 0


def test_from_e2e_converts_the_bracket(tmp_path: Path) -> None:
    arm = {"overhead_ms": 0.03, "ci": [0.02, 0.04], "runs": 6, "cycles": 300, "static_mean_ms": 8.0}
    host = {**arm, "overhead_ms": 0.27, "ci": [0.25, 0.29]}
    e2e = {
        "gpu": {"name": "NVIDIA H200"},
        "commit": "abc",
        "command": "python3 benchmarks/e2e/run.py",
        "stages": {
            "bracket": {
                "levels": {
                    "256": {"arms": {"forced-host": host, "forced-device-lagged": arm}},
                    "8": {"arms": {"forced-host": host, "forced-device-lagged": arm}},
                }
            }
        },
    }
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps(e2e))
    assert device_planner.main(["--from-e2e", str(path), "--out", str(tmp_path), "--modes", "lagged"]) == 0
    out = json.loads((tmp_path / "device_planner.json").read_text())
    row = out["levels"]["256"]
    assert (row["device_overhead_ms"], row["host_overhead_ms"]) == (0.03, 0.27)
    assert row["ci"] == {"device": [0.02, 0.04], "host": [0.25, 0.29]}
    assert out["verdict"] == {
        "concurrency": 256,
        "target_ms": 0.05,
        "device_overhead_ms": 0.03,
        "device_upper_ms": 0.04,
        "meets_target": True,
    }
    assert out["gpu"]["name"] == "NVIDIA H200" and out["commit"] == "abc"
