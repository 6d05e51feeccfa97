"""Live fingerprint collection on an in-memory fake host: precedence, probes, missing fields."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dspark_calibrate.errors import ConfigError, ProbeError
from dspark_calibrate.runtime_plugin.live import (
    GpuInfo,
    SystemEnvironment,
    collect_live,
    model_config_digest,
    normalize_gpu_name,
)

H200 = GpuInfo(
    name="H200", memory_total_bytes=143771 << 20, driver_version="580.159.04", compute_capability="9.0"
)


@dataclass
class FakeEnvironment:
    """Implements LiveEnvironment in memory."""

    devices: tuple[GpuInfo, ...] | None = (H200,)
    env: dict[str, str] = field(default_factory=dict)
    head: str | None = "0123abc"
    versions: dict[str, str] = field(default_factory=lambda: {"torch": "2.11.0", "tensorrt_llm": "1.3.0"})

    def gpus(self) -> tuple[tuple[GpuInfo, ...] | None, str]:
        return (self.devices, "fake-nvml") if self.devices else (None, "no GPU visible (fake)")

    def getenv(self, name: str) -> str | None:
        return self.env.get(name)

    def git(self, source_dir: Path) -> tuple[str | None, str | None, str]:
        if self.head is None:
            return None, None, "git failed (fake)"
        return self.head, "d" * 64, f"git:{source_dir}"

    def package_version(self, name: str) -> str | None:
        return self.versions.get(name)


def test_full_collection() -> None:
    ctx = collect_live(
        max_draft_len=5,
        rank_local_graph_batch_sizes=[8, 16],
        topology="TP1",
        source_dir=Path("/src"),
        env=FakeEnvironment(),
    )
    fp = ctx.fingerprint
    assert fp.gpu == "H200" and fp.gpu_count == 1
    assert fp.global_graph_batch_sizes == (8, 16)
    assert fp.source_head == "0123abc" and fp.source_diff_sha256 == "d" * 64
    assert (
        fp.runtime_snapshot
        == "tensorrt_llm=1.3.0;torch=2.11.0;flashinfer-python=absent;deep_gemm=absent;triton=absent"
    )
    assert ctx.sources["gpu"] == "fake-nvml"
    assert fp.trtllm_fields()  # all ten established
    assert "kv_dtype" in ctx.missing


def test_explicit_arguments_win_over_probes() -> None:
    env = FakeEnvironment(env={"DSPARK_TOPOLOGY": "DEP8", "WORLD_SIZE": "8"})
    ctx = collect_live(topology="TP2", gpu="B300", gpu_count=2, env=env)
    assert ctx.fingerprint.topology == "TP2" and ctx.sources["topology"] == "argument"
    assert ctx.fingerprint.gpu == "B300" and ctx.fingerprint.gpu_count == 2


def test_environment_used_when_no_argument() -> None:
    env = FakeEnvironment(env={"DSPARK_TOPOLOGY": "DEP8", "WORLD_SIZE": "8", "DSPARK_SOURCE_HEAD": "feed"})
    ctx = collect_live(rank_local_graph_batch_sizes=[4], env=env)
    assert ctx.fingerprint.topology == "DEP8" and ctx.sources["topology"] == "env:DSPARK_TOPOLOGY"
    assert ctx.fingerprint.gpu_count == 8  # WORLD_SIZE, not the one visible device
    assert ctx.fingerprint.global_graph_batch_sizes == (32,)


ENV = {
    "DSPARK_TOPOLOGY": "DEP8",
    "DSPARK_SOURCE_HEAD": "feed",
    "DSPARK_SOURCE_DIFF_SHA256": "e" * 64,
    "DSPARK_RUNTIME_SNAPSHOT": "tensorrt_llm=9.9",
    "WORLD_SIZE": "8",
}
#: (id, collect_live arguments, host, field, value, source): explicit options beat environment
#: variables beat probes (docs/fingerprint.md), and a probe the operator asked for is an option.
PRECEDENCE = [
    ("topology-argument-over-env", {"topology": "TP2"}, {}, "topology", "TP2", "argument"),
    ("topology-env", {}, {}, "topology", "DEP8", "env:DSPARK_TOPOLOGY"),
    ("source-head-argument-over-env", {"source_head": "cafe"}, {}, "source_head", "cafe", "argument"),
    ("source-dir-over-env-head", {"source_dir": Path("/src")}, {}, "source_head", "0123abc", "git:/src"),
    (
        "source-dir-over-env-diff",
        {"source_dir": Path("/src")},
        {},
        "source_diff_sha256",
        "d" * 64,
        "git:/src",
    ),
    ("source-head-env-without-source-dir", {}, {}, "source_head", "feed", "env:DSPARK_SOURCE_HEAD"),
    (
        "failed-source-dir-is-not-replaced-by-env",
        {"source_dir": Path("/src")},
        {"head": None},
        "source_head",
        None,
        None,
    ),
    (
        "runtime-argument-over-env",
        {"runtime_snapshot": "tensorrt_llm=1.3.0"},
        {},
        "runtime_snapshot",
        "tensorrt_llm=1.3.0",
        "argument",
    ),
    (
        "requested-packages-over-env",
        {"runtime_packages": ("tensorrt_llm",)},
        {},
        "runtime_snapshot",
        "tensorrt_llm=1.3.0",
        "installed package versions",
    ),
    (
        "runtime-env-over-default-packages",
        {},
        {},
        "runtime_snapshot",
        "tensorrt_llm=9.9",
        "env:DSPARK_RUNTIME_SNAPSHOT",
    ),
    ("gpu-count-argument-over-env", {"gpu_count": 2}, {}, "gpu_count", 2, "argument"),
    ("gpu-count-env-over-visible-devices", {}, {}, "gpu_count", 8, "env:WORLD_SIZE"),
]


@pytest.mark.parametrize(
    ("name", "arguments", "host", "field_name", "value", "source"), PRECEDENCE, ids=[r[0] for r in PRECEDENCE]
)
def test_precedence(
    name: str,
    arguments: dict[str, object],
    host: dict[str, object],
    field_name: str,
    value: object,
    source: str | None,
) -> None:
    env = FakeEnvironment(env=dict(ENV), **host)  # type: ignore[arg-type]
    ctx = collect_live(rank_local_graph_batch_sizes=[8], env=env, **arguments)  # type: ignore[arg-type]
    assert getattr(ctx.fingerprint, field_name) == value
    assert ctx.sources.get(field_name) == source
    if value is None:
        assert field_name in ctx.missing


def test_nothing_guessed_without_gpu() -> None:
    ctx = collect_live(env=FakeEnvironment(devices=None, head=None), source_dir=Path("/x"))
    fp = ctx.fingerprint
    assert fp.gpu is None and fp.gpu_snapshot_sha256 is None and fp.gpu_count is None
    assert {"gpu", "gpu_snapshot_sha256", "gpu_count", "topology", "source_head", "max_draft_len"} <= set(
        ctx.missing
    )
    assert "no GPU" in ctx.problems["gpu"]


def test_mixed_gpus_are_not_collapsed() -> None:
    env = FakeEnvironment(devices=(H200, GpuInfo(name="H100")))
    ctx = collect_live(env=env)
    assert ctx.fingerprint.gpu is None and "differ" in ctx.problems["gpu"]


def test_snapshot_independent_of_device_order() -> None:
    other = GpuInfo(name="H200", memory_total_bytes=1, driver_version="x")
    a = collect_live(env=FakeEnvironment(devices=(H200, other))).fingerprint.gpu_snapshot_sha256
    b = collect_live(env=FakeEnvironment(devices=(other, H200))).fingerprint.gpu_snapshot_sha256
    assert a == b


def test_invalid_value_is_a_probe_error() -> None:
    with pytest.raises(ProbeError):
        collect_live(source_diff_sha256="not-a-digest", env=FakeEnvironment())


def test_model_config_digest_ignores_formatting(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"hidden_size": 7168, "num_layers": 61}))
    b.write_text(json.dumps({"num_layers": 61, "hidden_size": 7168}, indent=4))
    assert model_config_digest(a) == model_config_digest(b)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError):
        model_config_digest(tmp_path / "bad.json")


def test_gpu_name_normalisation() -> None:
    assert normalize_gpu_name("NVIDIA H200") == "H200"
    assert normalize_gpu_name("NVIDIA  H100 80GB HBM3") == "H100 80GB HBM3"
    assert normalize_gpu_name("B300") == "B300"


def test_real_system_on_cpu_reports_no_gpu(tmp_path: Path) -> None:
    gpus, why = SystemEnvironment().gpus()
    if gpus is not None:  # pragma: no cover - only on GPU hosts
        pytest.skip("a GPU is visible")
    assert why
    head, diff, _ = SystemEnvironment().git(tmp_path)  # not a git checkout
    assert head is None and diff is None
