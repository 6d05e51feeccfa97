"""The runtime facade: ``choose_planner`` returns the planner docs/runtime.md recommends for the
device it gets, typed, and the package names the serving planners without importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dspark_calibrate import runtime_plugin
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.device_planner import DevicePlanner, ServingPlanner
from dspark_calibrate.runtime_plugin.engine import (
    PLANNER_MODES,
    DynamicVerifier,
    PlannerChoice,
    choose_planner,
)
from dspark_calibrate.runtime_plugin.fused_planner import FusedServingPlanner
from tests.runtime_plugin.test_planner import CAL, K, staircase_table


def _verifier(floor: int = 1) -> DynamicVerifier:
    return DynamicVerifier(staircase_table(), CAL, digest="0" * 64, min_verify_len=floor)


CHOICES = [
    # id, keyword arguments, kind, planner class, mode
    ("the device code on the CPU: fused", {"device": "cpu"}, "device", FusedServingPlanner, "fused"),
    ("lagged", {"device": "cpu", "mode": "lagged"}, "device", ServingPlanner, "lagged"),
    ("sync", {"device": "cpu", "mode": "sync"}, "device", ServingPlanner, "sync"),
    ("host requested", {"prefer": "host", "device": "cpu"}, "host", DynamicVerifier, None),
    (
        "multi-rank lagged",
        {"device": "cpu", "mode": "lagged", "num_ranks": 2},
        "device",
        ServingPlanner,
        "lagged",
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "kind", "cls", "mode"), [c[1:] for c in CHOICES], ids=[c[0] for c in CHOICES]
)
def test_choice(kwargs: dict[str, object], kind: str, cls: type, mode: str | None) -> None:
    verifier = _verifier(floor=2)
    choice = choose_planner(verifier, **kwargs)  # type: ignore[arg-type]
    assert (choice.kind, type(choice.planner), choice.mode, choice.fallback) == (kind, cls, mode, None)
    if isinstance(choice.planner, DynamicVerifier):
        assert choice.planner is verifier
        return
    device_planner = choice.planner.planner
    assert isinstance(device_planner, DevicePlanner)
    assert device_planner.min_verify_len == 2 and device_planner.table is verifier.cost_table
    assert device_planner.device.type == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")
def test_on_a_cpu_host_the_default_is_the_host_planner() -> None:
    choice = choose_planner(_verifier())
    assert choice.kind == "host" and isinstance(choice.planner, DynamicVerifier)
    assert choice.reason_code == "PLANNER_FALLBACK:cuda" and choice.mode is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_default_is_the_fused_compiled_planner() -> None:
    choice = choose_planner(_verifier())
    assert choice.kind == "device" and isinstance(choice.planner, FusedServingPlanner)
    assert choice.planner.planner.compile and choice.planner.planner.device.type == "cuda"
    assert choice.mode == "fused" and "compiled" in choice.message


def test_compile_defaults_to_the_fused_mode_and_can_be_set() -> None:
    def compiled(**kwargs: object) -> bool:
        planner = choose_planner(_verifier(), device="cpu", **kwargs).planner  # type: ignore[arg-type]
        assert not isinstance(planner, DynamicVerifier)
        return planner.planner.compile

    assert compiled() and not compiled(mode="lagged")
    assert not compiled(compile=False) and compiled(mode="sync", compile=True)


def test_force_native_reaches_the_serving_planner() -> None:
    for mode in PLANNER_MODES:
        planner = choose_planner(_verifier(), device="cpu", mode=mode, force_native=True).planner
        assert not isinstance(planner, DynamicVerifier) and planner.force_native, mode


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prefer": "gpu"}, "prefer"),
        ({"mode": "eager"}, "mode"),
        ({"device": "cpu", "num_ranks": 2}, "one rank"),
        ({"device": "cpu", "dtype": "float16"}, "dtype"),
    ],
    ids=["unknown-prefer", "unknown-mode", "fused-with-two-ranks", "unknown-dtype"],
)
def test_refuses_what_it_cannot_build(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        choose_planner(_verifier(), **kwargs)  # type: ignore[arg-type]


def test_the_fused_choice_serves_steps() -> None:
    choice = choose_planner(_verifier(), device="cpu")
    fused = choice.planner
    assert isinstance(fused, FusedServingPlanner)
    g = 8
    logits = torch.zeros(1, g, K)
    ints_host = np.zeros(3, dtype=np.int64)
    windows = torch.zeros(g, dtype=torch.int64)
    decision = torch.zeros(fused.decision_size(g))
    fused.bind(
        g,
        logits=logits,
        ints=torch.from_numpy(ints_host),
        ints_host=ints_host,
        windows=windows,
        decision=decision,
    )
    cells = []
    for _ in range(3):
        cells.append(fused.commit([6]))
        logits[0, :6] = -3.0
        critical, beside = fused.hooks(g)
        critical()
        beside()
        fused.observe(decision.numpy().copy())
    assert cells == [(8, 0), (8, 16), (8, 16)]  # native first, then the decision beside each step
    assert fused.finish()["steps"] == 3


def test_choice_is_typed_without_any() -> None:
    assert (
        PlannerChoice.__annotations__["planner"] == "DynamicVerifier | FusedServingPlanner | ServingPlanner"
    )
    assert choose_planner.__annotations__["return"] == "PlannerChoice"


def test_the_package_names_the_serving_planners() -> None:
    for name in ("DevicePlanner", "ServingPlanner", "FusedServingPlanner", "PLANNER_MODES", "choose_planner"):
        assert name in runtime_plugin.__all__ and name in dir(runtime_plugin)
    assert runtime_plugin.FusedServingPlanner is FusedServingPlanner
    assert runtime_plugin.ServingPlanner is ServingPlanner and runtime_plugin.DevicePlanner is DevicePlanner
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        runtime_plugin.Nothing  # type: ignore[attr-defined]  # noqa: B018


def test_the_serving_planners_load_torch_only_when_read(tmp_path: Path) -> None:
    script = """
import json, sys
import dspark_calibrate.runtime_plugin as rp
before = "torch" in sys.modules
cls = rp.FusedServingPlanner
from dspark_calibrate.runtime_plugin.fused_planner import FusedServingPlanner
print(json.dumps([before, "torch" in sys.modules, cls is FusedServingPlanner]))
"""
    # The package under test, whichever checkout that is (the interpreter may have another installed).
    src = str(Path(runtime_plugin.__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, check=True, cwd=tmp_path, timeout=120, env=env
    )
    assert json.loads(out.stdout.decode().strip().splitlines()[-1]) == [False, True, True]


@pytest.mark.parametrize(
    ("given", "current", "expected"),
    [
        ("cpu", 0, "cpu"),
        ("cuda", 1, "cuda:1"),
        ("cuda", 0, "cuda:0"),
        ("cuda:2", 1, "cuda:2"),
    ],
)
def test_an_unindexed_cuda_device_means_the_current_one(
    monkeypatch: pytest.MonkeyPatch, given: str, current: int, expected: str
) -> None:
    """A planner built for "cuda" names the index its engine's tensors carry (cuda:N, never cuda)."""
    from dspark_calibrate.runtime_plugin import device_planner

    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    assert device_planner._indexed(torch.device(given)) == torch.device(expected)
