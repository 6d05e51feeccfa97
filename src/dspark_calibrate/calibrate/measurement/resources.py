"""What a sweep will need before it starts: memory (weights, KV cache, activations, graph pools)
and time, against what the machine has.

Pure estimates from shapes (:func:`estimate_reference`) plus two small edge reads
(:func:`available_bytes`: ``/proc/meminfo`` and the cgroup limit on CPU, ``cudaMemGetInfo`` on a
GPU). ``sweep`` refuses a run whose estimate exceeds what is available, with the estimate and the
options that shrink it, instead of being killed for memory minutes later.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dspark_calibrate.calibrate.measurement.backends.reference import ModelShape, load_model_config
from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.calibrate.measurement.stats import Thresholds

__all__ = ["HEADROOM", "ResourceEstimate", "available_bytes", "estimate_reference", "format_bytes"]

#: Share of the available memory a sweep may plan to use: allocator fragmentation, the Python
#: process itself and the samples the sweep keeps need the rest.
HEADROOM = 0.85

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def format_bytes(n: float) -> str:
    """``1.5 GiB`` style."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True, slots=True)
class ResourceEstimate:
    """Memory parts in bytes, the FLOPs of the largest step and the least measuring time.

    Attributes:
        weights: parameters of every built layer and the LM head.
        kv_cache: the KV cache sized for ``max_rows`` rows of ``context_len + max_row_len`` tokens.
        activations: the working set of the largest cell's step.
        graph_pools: memory CUDA graphs keep for their replays (0 on CPU).
        step_flops: multiply-adds × 2 of the largest cell's step.
        replays: step replays the sweep needs at least (warm-ups, minimum rounds and samples).
    """

    weights: int
    kv_cache: int
    activations: int
    graph_pools: int
    step_flops: float
    replays: int
    device: str

    @property
    def total(self) -> int:
        """Everything together, in bytes."""
        return self.weights + self.kv_cache + self.activations + self.graph_pools

    def describe(self) -> str:
        """One line: the parts and the total."""
        return (
            f"weights {format_bytes(self.weights)} + KV cache {format_bytes(self.kv_cache)} + activations "
            f"{format_bytes(self.activations)} + graph pools {format_bytes(self.graph_pools)} = "
            f"{format_bytes(self.total)} on {self.device}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "weights_bytes": self.weights,
            "kv_cache_bytes": self.kv_cache,
            "activations_bytes": self.activations,
            "graph_pools_bytes": self.graph_pools,
            "total_bytes": self.total,
            "largest_step_flops": self.step_flops,
            "min_replays": self.replays,
            "device": self.device,
        }


def _layer_params(s: ModelShape, *, moe: bool, tp: int, ep: int) -> int:
    if s.mla:
        assert s.q_lora_rank and s.kv_lora_rank and s.qk_nope and s.qk_rope and s.v_head
        h = s.heads // tp
        attn = (
            s.hidden * s.q_lora_rank
            + s.q_lora_rank * h * (s.qk_nope + s.qk_rope)
            + 2 * h * s.qk_nope * s.kv_lora_rank
            + s.hidden * (s.kv_lora_rank + s.qk_rope)
            + h * s.v_head * s.hidden
        )
    else:
        h, kvh = s.heads // tp, max(1, s.kv_heads // tp)
        attn = s.hidden * h * s.head_dim + s.hidden * 2 * kvh * s.head_dim + h * s.head_dim * s.hidden
    if not moe:
        return attn + 3 * s.hidden * (s.intermediate // tp)
    inter = s.moe_intermediate // tp
    experts = (s.experts // ep) * 3 * s.hidden * inter
    shared = 3 * s.hidden * inter * s.shared_experts
    return attn + s.hidden * s.experts + experts + shared


def estimate_reference(
    options: Mapping[str, Any],
    cells: Sequence[CellSpec],
    thresholds: Thresholds,
    *,
    device: str,
    tp: int = 1,
) -> ResourceEstimate:
    """Estimate the reference backend's memory and work for these cells (no tensor is made).

    Args:
        options: the backend options (``config``, ``layers``, ``context_len``, ``dtype``,
            ``max_rows``, ``max_row_len``, ``lm_head``, ``ep``), defaults as the backend's.
        cells: the cells the sweep will measure.
        thresholds: the measurement thresholds (for the least number of replays).
        device: ``cpu`` or ``cuda``.
        tp: tensor-parallel ranks (shards weights and the cache).

    Raises:
        ConfigError: an unreadable config or an impossible shape.
    """
    cfg, _ = load_model_config(options.get("config", "tiny"))
    s = ModelShape.from_config(cfg, layers=options.get("layers"))
    dtype = str(options.get("dtype") or ("bfloat16" if device == "cuda" else "float32"))
    width = _DTYPE_BYTES.get(dtype, 4)
    ctx = int(options.get("context_len", 256))
    max_rows = int(options.get("max_rows", 256))
    max_row_len = int(options.get("max_row_len", 16))
    ep = int(options.get("ep", 1))
    lm_head = bool(options.get("lm_head", True))
    params = sum(
        _layer_params(s, moe=bool(s.experts) and i >= s.dense_layers, tp=tp, ep=ep) for i in range(s.layers)
    )
    params += s.hidden * (s.vocab // tp) if lm_head else 0
    span = ctx + max_row_len
    per_token_cache = (
        (s.kv_lora_rank or 0) + (s.qk_rope or 0) if s.mla else 2 * max(1, s.kv_heads // tp) * s.head_dim
    )
    kv = s.layers * max_rows * span * per_token_cache * width
    tokens = max((c.tokens for c in cells), default=1)
    rows = max((c.graph_batch_size for c in cells), default=1)
    heads = s.heads // tp
    qmax = max((max(c.row_lengths()) for c in cells), default=1)
    # Largest live tensors of one layer: hidden states, MLP intermediates and the attention
    # scores of every row's padded queries over its whole span (kept in fp32 for the softmax).
    inter = max(s.intermediate, s.moe_intermediate * max(1, s.top_k)) // tp
    scores = rows * heads * qmax * (ctx + qmax) * 4
    acts = int(tokens * (4 * s.hidden + 3 * inter) * width + 2 * scores + tokens * (s.vocab // tp) * width)
    pools = acts * 2 if device == "cuda" else 0
    head_dim = (s.kv_lora_rank or 0) + (s.qk_rope or 0) if s.mla else s.head_dim
    attn_flops = 4.0 * s.layers * rows * heads * qmax * (ctx + qmax) * head_dim
    active = params - (
        sum(
            (s.experts // ep - min(s.experts // ep, math.ceil(tokens * s.top_k / ep)))
            * 3
            * s.hidden
            * (s.moe_intermediate // tp)
            for i in range(s.layers)
            if s.experts and i >= s.dense_layers
        )
    )
    flops = 2.0 * active * tokens + attn_flops
    th = thresholds
    per_cell = th.warmup_steps * max(1, th.min_epochs) + th.min_rounds * (
        th.rewarm_steps + th.samples_per_visit * th.replays_per_sample
    )
    return ResourceEstimate(
        weights=int(params * width),
        kv_cache=int(kv),
        activations=acts,
        graph_pools=pools,
        step_flops=flops,
        replays=per_cell * len(cells),
        device=device,
    )


def _meminfo_available() -> int | None:
    try:
        text = Path("/proc/meminfo").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_available() -> int | None:
    base = Path("/sys/fs/cgroup")
    try:
        limit = (base / "memory.max").read_text().strip()
        used = int((base / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    if limit == "max" or not limit.isdigit():
        return None
    return max(int(limit) - used, 0)


def available_bytes(device: str, torch: Any | None = None) -> int | None:
    """Memory this process can still take on ``device`` (``None``: unknown).

    CPU: the smaller of ``MemAvailable`` and the cgroup's limit less its usage. CUDA: the free
    memory the driver reports for the current device.
    """
    if device == "cuda":
        if torch is None:
            return None
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    values = [v for v in (_meminfo_available(), _cgroup_available()) if v is not None]
    return min(values) if values else None


def matmul_flops_per_second(torch: Any, device: str, dtype: str, *, n: int = 512, repeats: int = 4) -> float:
    """FLOP/s of an n×n matmul on ``device``: the yardstick for a step's time before it exists."""
    import time

    dt = getattr(torch, dtype if dtype in _DTYPE_BYTES else "float32")
    a = torch.randn(n, n, device=device, dtype=dt)
    b = torch.randn(n, n, device=device, dtype=dt)
    (a @ b).sum().item()  # warm up (kernel selection)
    start = time.perf_counter()
    for _ in range(repeats):
        c = a @ b
    c.sum().item()  # synchronises on CUDA
    seconds = max(time.perf_counter() - start, 1e-9)
    return 2.0 * n**3 * repeats / seconds
