"""Collect the live deployment fingerprint (DESIGN §5).

Each field is established by the first of, in this order (docs/fingerprint.md):

1. an explicit value (engine arguments such as K, graph ladder, topology; ``--live-*``);
2. an explicitly requested probe: ``source_dir`` (``--live-source-dir``) decides ``source_head``
   and ``source_diff_sha256``, an explicit ``runtime_packages`` list decides ``runtime_snapshot``;
   when such a probe cannot tell, the field is reported missing, never taken from elsewhere;
3. an environment variable (``DSPARK_TOPOLOGY``, ``DSPARK_SOURCE_HEAD``,
   ``DSPARK_SOURCE_DIFF_SHA256``, ``DSPARK_RUNTIME_SNAPSHOT``, ``WORLD_SIZE``);
4. a default probe (NVML, then torch.cuda; the versions of the default runtime packages).

So a variable left in a serving node's environment can never override what the operator asked
for (a stale ``DSPARK_SOURCE_HEAD`` would otherwise hide a dirty engine tree named by
``--live-source-dir``). A field that cannot be established stays ``None`` and is reported in
``LiveContext.problems`` with the reason; nothing is guessed.

The probes sit behind the ``LiveEnvironment`` protocol so the collection logic is tested on CPU
with an in-memory fake; ``SystemEnvironment`` is the real edge. torch is imported only when NVML is
not available and torch can be imported.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol

from dspark_calibrate.artifacts import (
    Fingerprint,
    ModelError,
    canonical_json,
    fingerprint_flag,
    loads_strict,
    read_regular_file,
    sha256_hex,
)
from dspark_calibrate.errors import ConfigError, ProbeError

__all__ = [
    "CPU_DEVICE",
    "DEFAULT_RUNTIME_PACKAGES",
    "SYNTHETIC_DEVICE",
    "SYNTHETIC_SNAPSHOT_SHA256",
    "GpuInfo",
    "LiveContext",
    "LiveEnvironment",
    "SystemEnvironment",
    "collect_live",
    "model_config_digest",
    "normalize_gpu_name",
]

#: The ``gpu`` value of a deployment that runs on the CPU; its snapshot is the CPU model's.
CPU_DEVICE = "cpu"
#: The ``gpu`` value of the synthetic backend's simulated device, and its fixed snapshot.
SYNTHETIC_DEVICE = "synthetic"
SYNTHETIC_SNAPSHOT_SHA256 = hashlib.sha256(b"synthetic").hexdigest()
#: Packages whose versions make up ``runtime_snapshot`` when it is not given explicitly.
DEFAULT_RUNTIME_PACKAGES: tuple[str, ...] = (
    "tensorrt_llm",
    "torch",
    "flashinfer-python",
    "deep_gemm",
    "triton",
)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    """One visible GPU, as far as the probe could read it (no serials/UUIDs: a table must transfer
    between identical GPUs of a fleet)."""

    name: str
    memory_total_bytes: int | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    vbios_version: str | None = None
    compute_capability: str | None = None
    multiprocessors: int | None = None

    def snapshot(self) -> dict[str, Any]:
        """The fields that enter ``gpu_snapshot_sha256``."""
        return {
            "name": self.name,
            "memory_total_bytes": self.memory_total_bytes,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "vbios_version": self.vbios_version,
            "compute_capability": self.compute_capability,
            "multiprocessors": self.multiprocessors,
        }


class LiveEnvironment(Protocol):
    """What the collector may ask of the host. Each method returns ``None`` when it cannot tell."""

    def gpus(self) -> tuple[tuple[GpuInfo, ...] | None, str]:
        """Visible GPUs and the source used (e.g. ``"nvml"``), or ``(None, why)``."""
        ...

    def getenv(self, name: str) -> str | None:
        """An environment variable."""
        ...

    def git(self, source_dir: Path) -> tuple[str | None, str | None, str]:
        """``(head, diff_sha256, why)`` of a git source tree."""
        ...

    def package_version(self, name: str) -> str | None:
        """Installed version of a distribution, or None."""
        ...


def normalize_gpu_name(name: str) -> str:
    """``"NVIDIA H200"`` → ``"H200"``: the vendor prefix is dropped, the rest is kept verbatim."""
    name = " ".join(name.split())
    for prefix in ("NVIDIA ", "Nvidia "):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


class SystemEnvironment:
    """The real host: NVML (nvidia-ml-py), then torch.cuda; ``git``; importlib.metadata."""

    def gpus(self) -> tuple[tuple[GpuInfo, ...] | None, str]:
        """Read visible GPUs via NVML, falling back to torch.cuda."""
        nvml, why_nvml = self._nvml()
        if nvml is not None:
            return nvml, "nvml"
        torch_gpus, why_torch = self._torch()
        if torch_gpus is not None:
            return torch_gpus, "torch.cuda"
        return None, f"no GPU visible ({why_nvml}; {why_torch})"

    @staticmethod
    def _nvml() -> tuple[tuple[GpuInfo, ...] | None, str]:
        if importlib.util.find_spec("pynvml") is None:
            return None, "nvidia-ml-py not installed"
        import pynvml

        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            return None, f"NVML unavailable ({exc})"
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
            out = []
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            indices = list(range(pynvml.nvmlDeviceGetCount()))
            if (
                visible is not None
                and visible.strip()
                and all(p.strip().isdigit() for p in visible.split(","))
            ):
                indices = [int(p) for p in visible.split(",") if int(p) in indices]
            for i in indices:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
                try:
                    vbios = pynvml.nvmlDeviceGetVbiosVersion(h)
                except pynvml.NVMLError:
                    vbios = None
                out.append(
                    GpuInfo(
                        name=normalize_gpu_name(str(pynvml.nvmlDeviceGetName(h))),
                        memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                        driver_version=str(driver),
                        cuda_driver_version=f"{cuda // 1000}.{(cuda % 1000) // 10}",
                        vbios_version=vbios,
                        compute_capability=f"{major}.{minor}",
                    )
                )
            return (tuple(out) if out else None), "nvml: no device"
        except pynvml.NVMLError as exc:
            return None, f"NVML query failed ({exc})"
        finally:
            pynvml.nvmlShutdown()

    @staticmethod
    def _torch() -> tuple[tuple[GpuInfo, ...] | None, str]:
        if importlib.util.find_spec("torch") is None:
            return None, "torch not installed"
        import torch

        if not torch.cuda.is_available():
            return None, "torch.cuda not available"
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append(
                GpuInfo(
                    name=normalize_gpu_name(p.name),
                    memory_total_bytes=int(p.total_memory),
                    compute_capability=f"{p.major}.{p.minor}",
                    multiprocessors=int(p.multi_processor_count),
                )
            )
        return tuple(out), "torch.cuda"

    def getenv(self, name: str) -> str | None:
        """An environment variable (empty counts as unset)."""
        value = os.environ.get(name)
        return value if value else None

    def git(self, source_dir: Path) -> tuple[str | None, str | None, str]:
        """HEAD commit and SHA-256 of ``git diff HEAD --binary`` (uncommitted changes) of a tree."""
        try:
            head = (
                subprocess.run(
                    ["git", "-C", str(source_dir), "rev-parse", "HEAD"],
                    capture_output=True,
                    check=True,
                    timeout=30,
                )
                .stdout.decode()
                .strip()
            )
            diff = subprocess.run(
                ["git", "-C", str(source_dir), "diff", "HEAD", "--binary"],
                capture_output=True,
                check=True,
                timeout=60,
            ).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            return None, None, f"git failed in {source_dir}: {exc}"
        return head, hashlib.sha256(diff).hexdigest(), f"git:{source_dir}"

    def package_version(self, name: str) -> str | None:
        """Installed version of a distribution."""
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    def cpu(self) -> dict[str, Any]:
        """What identifies this host's CPU model (no serials): architecture, model name, cores."""
        model = None
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if line.lower().startswith("model name"):
                        model = line.partition(":")[2].strip()
                        break
        except OSError:
            model = None
        return {
            "machine": platform.machine(),
            "model": model or platform.processor(),
            "cores": os.cpu_count(),
        }


@dataclass(frozen=True)
class LiveContext:
    """The live deployment as established, with where each field came from and what is missing."""

    fingerprint: Fingerprint
    sources: Mapping[str, str] = field(default_factory=dict)
    problems: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[GpuInfo, ...] = ()

    @property
    def missing(self) -> tuple[str, ...]:
        """Fields that could not be established (sorted)."""
        return tuple(sorted(self.problems))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "fingerprint": self.fingerprint.to_dict(),
            "sources": dict(self.sources),
            "missing": {k: self.problems[k] for k in self.missing},
            "gpus": [g.snapshot() for g in self.gpus],
        }


#: Largest model ``config.json`` read, in bytes (HF configs are a few KiB; a path to the weights
#: by mistake is refused unread).
MAX_MODEL_CONFIG_BYTES = 4 << 20


def model_config_digest(path: Path) -> str:
    """SHA-256 of the canonical JSON of an HF-style ``config.json`` (formatting-independent).

    Raises:
        ConfigError: unreadable or not JSON.
    """
    try:
        data = loads_strict(read_regular_file(path, MAX_MODEL_CONFIG_BYTES), what=str(path))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read model config ({exc}); pass the model's config.json") from exc
    return sha256_hex(canonical_json(data))


def _runtime_snapshot(env: LiveEnvironment, packages: Sequence[str]) -> str:
    parts = []
    for name in packages:
        version = env.package_version(name)
        parts.append(f"{name}={version if version is not None else 'absent'}")
    return ";".join(parts)


class _Found:
    """The fingerprint fields established so far, where each came from, and why others are not."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}
        self.problems: dict[str, str] = {}

    def put(self, name: str, value: Any, source: str) -> None:
        """Record ``name`` unless it is None or already known (the first source wins)."""
        if value is not None and name not in self.values:
            self.values[name] = value
            self.sources[name] = source

    def missing(self) -> dict[str, str]:
        """Why each unknown field is unknown (a probe's own reason first, then the hint)."""
        for name, why in _MISSING_HINTS:
            if name not in self.values:
                self.problems.setdefault(name, why)
        for name in (
            "model_config_sha256",
            "checkpoint_sha256",
            "attention_backend",
            "moe_backend",
            "kv_dtype",
        ):
            if name not in self.values:
                self.problems.setdefault(name, f"not given ({fingerprint_flag(name)})")
        for name in list(self.problems):
            if name in self.values:
                del self.problems[name]
        return self.problems


#: Why a field no argument or probe established is missing, and how to give it.
_MISSING_HINTS = (
    ("topology", "not given (--live-topology or DSPARK_TOPOLOGY)"),
    ("source_head", "not given (--live-source-dir, --live-source-head or DSPARK_SOURCE_HEAD)"),
    ("source_diff_sha256", "not given (--live-source-dir or DSPARK_SOURCE_DIFF_SHA256)"),
    ("max_draft_len", "not given (the engine's K: --live-k)"),
    ("rank_local_graph_batch_sizes", "not given (the engine's graph ladder: --live-ladder)"),
    ("global_graph_batch_sizes", "needs the ladder and the GPU count"),
    ("gpu_count", "no GPU visible and WORLD_SIZE unset (--live-gpu-count)"),
)

#: Fingerprint fields the environment may give: (field, variable).
_ENVIRONMENT_FIELDS = (
    ("topology", "DSPARK_TOPOLOGY"),
    ("source_head", "DSPARK_SOURCE_HEAD"),
    ("source_diff_sha256", "DSPARK_SOURCE_DIFF_SHA256"),
    ("runtime_snapshot", "DSPARK_RUNTIME_SNAPSHOT"),
)


def _probe_environment(found: _Found, env: LiveEnvironment, decided: frozenset[str]) -> None:
    """The ``DSPARK_*`` variables, and ``WORLD_SIZE`` for the GPU count; fields in ``decided``
    belong to an explicitly requested probe and are not read from the environment."""
    for name, var in _ENVIRONMENT_FIELDS:
        if name not in decided:
            found.put(name, env.getenv(var), f"env:{var}")
    world = env.getenv("WORLD_SIZE")
    if world is not None and world.isdigit():
        found.put("gpu_count", int(world), "env:WORLD_SIZE")


def _probe_gpus(found: _Found, env: LiveEnvironment) -> tuple[GpuInfo, ...] | None:
    """The GPU name, count and snapshot (or the synthetic device's, or the CPU's on request);
    returns the visible GPUs."""
    gpus, gpu_source = env.gpus()
    cpu_probe = getattr(env, "cpu", None)
    if found.values.get("gpu") == SYNTHETIC_DEVICE:
        # The synthetic backend's simulated device: one fixed snapshot, nothing to probe.
        found.put("gpu_count", 1, "synthetic")
        found.put("gpu_snapshot_sha256", SYNTHETIC_SNAPSHOT_SHA256, "synthetic")
    elif found.values.get("gpu") == CPU_DEVICE and not gpus and callable(cpu_probe):
        # A deployment that runs on the CPU (the reference backend's CPU path): its "GPU" is the
        # CPU model, probed like a GPU would be. Only on request (--live-gpu cpu): a GPU host
        # whose probes failed must report the GPU fields as missing, not describe its CPU.
        found.put("gpu_count", 1, "cpu")
        found.put("gpu_snapshot_sha256", sha256_hex(canonical_json({"cpu": cpu_probe()})), "cpu")
    elif gpus:
        names = sorted({g.name for g in gpus})
        if len(names) == 1:
            found.put("gpu", names[0], gpu_source)
        else:
            found.problems.setdefault("gpu", f"visible GPUs differ ({names}); pass --live-gpu")
        found.put("gpu_count", len(gpus), f"{gpu_source}: visible devices")
        snapshot = sorted((g.snapshot() for g in gpus), key=lambda s: canonical_json(s))
        found.put("gpu_snapshot_sha256", sha256_hex(canonical_json(snapshot)), gpu_source)
    else:
        for name in ("gpu", "gpu_snapshot_sha256"):
            if name not in found.values:
                found.problems[name] = f"{gpu_source} (--live-gpu cpu for a CPU deployment)"
    return gpus


def _probe_source(found: _Found, env: LiveEnvironment, source_dir: Path) -> None:
    """The engine source's git head and diff digest, unless both were given."""
    if "source_head" in found.values and "source_diff_sha256" in found.values:
        return
    head, diff, why = env.git(source_dir)
    found.put("source_head", head, why)
    found.put("source_diff_sha256", diff, why)
    if head is None:
        found.problems.setdefault("source_head", why)


def _probe_requested(
    found: _Found, env: LiveEnvironment, source_dir: Path | None, runtime_packages: Sequence[str] | None
) -> frozenset[str]:
    """The probes asked for explicitly; returns the fields they decide (whether or not they could
    tell: the environment does not stand in for a requested probe)."""
    decided: set[str] = set()
    if source_dir is not None:
        _probe_source(found, env, source_dir)
        decided |= {"source_head", "source_diff_sha256"}
    if runtime_packages is not None:
        found.put("runtime_snapshot", _runtime_snapshot(env, runtime_packages), "installed package versions")
        decided.add("runtime_snapshot")
    return frozenset(decided)


def collect_live(
    *,
    max_draft_len: int | None = None,
    rank_local_graph_batch_sizes: Sequence[int] | None = None,
    topology: str | None = None,
    gpu: str | None = None,
    gpu_count: int | None = None,
    source_dir: Path | None = None,
    source_head: str | None = None,
    source_diff_sha256: str | None = None,
    runtime_snapshot: str | None = None,
    runtime_packages: Sequence[str] | None = None,
    model_config: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: LiveEnvironment | None = None,
) -> LiveContext:
    """Establish the live fingerprint: explicit values, then explicitly requested probes, then
    environment variables, then default probes (the module docstring); report what is missing.

    Environment variables read when no explicit value or requested probe decides the field:
    ``DSPARK_TOPOLOGY``, ``DSPARK_SOURCE_HEAD``, ``DSPARK_SOURCE_DIFF_SHA256``,
    ``DSPARK_RUNTIME_SNAPSHOT``, and ``WORLD_SIZE`` for the GPU count.

    Args:
        max_draft_len, rank_local_graph_batch_sizes, topology, gpu, gpu_count, source_head,
            source_diff_sha256, runtime_snapshot: explicit values (engine arguments) that win.
        source_dir: a git checkout of the engine source, probed for head and diff digest (an
            explicit request: ``DSPARK_SOURCE_*`` are then not read).
        runtime_packages: packages whose versions form the runtime snapshot; given explicitly,
            the probe wins over ``DSPARK_RUNTIME_SNAPSHOT``; by default
            (:data:`DEFAULT_RUNTIME_PACKAGES`) the variable wins, for a verifier that runs beside
            the engine's environment rather than in it.
        model_config: the model's ``config.json``, digested into ``model_config_sha256``.
        overrides: any other fingerprint fields given explicitly (e.g. ``kv_dtype``).
        env: the host probe (default: the real system).

    Raises:
        ProbeError: the values found do not form a valid fingerprint (e.g. a malformed digest).
    """
    env = env or SystemEnvironment()
    found = _Found()
    found.put("max_draft_len", max_draft_len, "argument")
    found.put(
        "rank_local_graph_batch_sizes",
        tuple(rank_local_graph_batch_sizes) if rank_local_graph_batch_sizes else None,
        "argument",
    )
    found.put("topology", topology, "argument")
    found.put("gpu", gpu, "argument")
    found.put("gpu_count", gpu_count, "argument")
    found.put("source_head", source_head, "argument")
    found.put("source_diff_sha256", source_diff_sha256, "argument")
    found.put("runtime_snapshot", runtime_snapshot, "argument")
    for name, value in (overrides or {}).items():
        found.put(name, tuple(value) if isinstance(value, list) else value, "argument")
    _probe_environment(found, env, _probe_requested(found, env, source_dir, runtime_packages))
    gpus = _probe_gpus(found, env)
    found.put(
        "runtime_snapshot", _runtime_snapshot(env, DEFAULT_RUNTIME_PACKAGES), "installed package versions"
    )
    if model_config is not None:
        found.put("model_config_sha256", model_config_digest(model_config), f"file:{model_config}")
    rl, n = found.values.get("rank_local_graph_batch_sizes"), found.values.get("gpu_count")
    if rl is not None and n is not None:
        found.put(
            "global_graph_batch_sizes", tuple(int(g) * int(n) for g in rl), "rank-local sizes x gpu_count"
        )
    values, sources, problems = found.values, found.sources, found.missing()
    try:
        fp = Fingerprint.from_dict(values)
    except ModelError as exc:
        raise ProbeError(f"live fingerprint is invalid: {exc}") from exc
    return LiveContext(
        fingerprint=fp,
        sources=MappingProxyType(sources),
        problems=MappingProxyType(problems),
        gpus=tuple(gpus or ()),
    )
