"""Multi-rank sweeps under ``torchrun``: lockstep cells, slowest-rank samples, agreement checks.

All ranks run the same cell in the same order (the order is a pure function of the seed and the
shared journal state), synchronise before each visit, and after it gather every rank's samples;
a sample is the slowest rank's time (the MAX over ranks), dropped if any rank was throttled.
Before measuring, ranks compare their ladder, K, configuration and fingerprint; any difference is a
:class:`~dspark_calibrate.errors.ConfigError` raised on every rank, listing what differs, and
nothing is written. Rank 0 alone writes the journal and the outputs; on ``--resume`` it reads the
journal and broadcasts it. The same code serves multi-node launches (``torchrun --nnodes``).

:class:`SingleProcess` is the one-rank stand-in; :class:`TorchDistributed` wraps an initialised
``torch.distributed`` process group (NCCL or gloo). torch is imported only by the latter.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from dspark_calibrate.errors import ConfigError

__all__ = [
    "VISIT_FIELDS",
    "Communicator",
    "SingleProcess",
    "TorchDistributed",
    "from_environment",
]

#: Columns of the per-visit array each rank contributes: time (ms), SM clock (MHz),
#: temperature (°C), power (W), throttle reasons (bit mask; NaN when unknown), visit seconds, the
#: sample's first replay (ms; NaN when not timed apart).
VISIT_FIELDS: tuple[str, ...] = (
    "ms",
    "sm_clock_mhz",
    "temperature_c",
    "power_w",
    "throttle_reasons",
    "seconds",
    "first_ms",
)


class Communicator(Protocol):
    """Collective operations the sweep harness needs."""

    rank: int
    world_size: int

    def gather_visit(self, local: np.ndarray) -> np.ndarray:
        """All-gather a ``(samples, len(VISIT_FIELDS))`` float64 array → ``(world, samples, fields)``."""
        ...

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (JSON-serialisable objects)."""
        ...

    def agree(self, what: str, payload: Mapping[str, Any]) -> None:
        """Check that every rank holds the same ``payload``.

        Raises:
            ConfigError: on every rank, naming the ranks and the fields that differ.
        """
        ...

    def barrier(self) -> None:
        """Wait for every rank."""
        ...


class SingleProcess:
    """One rank: every collective is the identity."""

    rank = 0
    world_size = 1

    def gather_visit(self, local: np.ndarray) -> np.ndarray:
        """``local[None]``."""
        return np.asarray(local, dtype=np.float64)[None]

    def broadcast(self, obj: Any) -> Any:
        """``obj``."""
        return obj

    def agree(self, what: str, payload: Mapping[str, Any]) -> None:
        """Nothing to compare."""
        return None

    def barrier(self) -> None:
        """Nothing to wait for."""
        return None


def disagreement(what: str, payloads: list[Mapping[str, Any]]) -> str | None:
    """Describe how ranks' payloads differ from rank 0's, or ``None`` when all agree (pure)."""
    base = payloads[0]
    lines = []
    for rank, other in enumerate(payloads[1:], start=1):
        fields = sorted(k for k in set(base) | set(other) if base.get(k) != other.get(k))
        for key in fields:
            a = json.dumps(base.get(key), sort_keys=True)[:120]
            b = json.dumps(other.get(key), sort_keys=True)[:120]
            lines.append(f"rank {rank} {what}.{key} is {b}, rank 0 has {a}")
    if not lines:
        return None
    return (
        f"ranks disagree on the {what} ({len(lines)} difference(s)): "
        + "; ".join(lines)
        + "; launch every rank with the same arguments on identical GPUs"
    )


class TorchDistributed:
    """A :class:`Communicator` over an initialised ``torch.distributed`` default group.

    Args:
        device: where collective tensors live (``cuda:<local_rank>`` for NCCL, ``cpu`` for gloo).
    """

    def __init__(self, device: str = "cpu") -> None:
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised; call from_environment() first")
        self._torch = torch
        self._dist = dist
        self._device = torch.device(device)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()

    def gather_visit(self, local: np.ndarray) -> np.ndarray:
        """All-gather each rank's visit array (same shape on every rank)."""
        torch = self._torch
        t = torch.as_tensor(np.ascontiguousarray(local, dtype=np.float64), device=self._device)
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        self._dist.all_gather(out, t)
        return np.stack([o.cpu().numpy() for o in out])

    def broadcast(self, obj: Any) -> Any:
        """Broadcast a picklable object from rank 0."""
        box = [obj if self.rank == 0 else None]
        self._dist.broadcast_object_list(box, src=0, device=self._device)
        return box[0]

    def agree(self, what: str, payload: Mapping[str, Any]) -> None:
        """All-gather ``payload`` and compare; raise the same error on every rank."""
        gathered: list[Any] = [None] * self.world_size
        self._dist.all_gather_object(gathered, dict(payload))
        message = disagreement(what, gathered)
        if message is not None:
            raise ConfigError(f"rank {self.rank}: {message}")

    def barrier(self) -> None:
        """``torch.distributed.barrier``."""
        if self._device.type == "cuda":
            self._dist.barrier(device_ids=[self._device.index or 0])
        else:
            self._dist.barrier()


def from_environment(backend: str | None = None, timeout_s: float = 600.0) -> Communicator:
    """A communicator for this process: :class:`TorchDistributed` under ``torchrun``, else one rank.

    Reads ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK`` (set by torchrun). With more than one rank,
    initialises the default process group (NCCL when CUDA is available, else gloo, unless
    ``backend`` says otherwise) and binds this rank to GPU ``LOCAL_RANK``.

    Raises:
        ConfigError: malformed torchrun environment variables.
    """
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError as exc:
        raise ConfigError(f"WORLD_SIZE/LOCAL_RANK must be integers: {exc}") from exc
    if world <= 1:
        return SingleProcess()
    import torch
    import torch.distributed as dist

    use_cuda = torch.cuda.is_available() and backend in (None, "nccl")
    chosen = backend or ("nccl" if use_cuda else "gloo")
    device = "cpu"
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    if not dist.is_initialized():
        dist.init_process_group(chosen, timeout=datetime.timedelta(seconds=timeout_s))
    return TorchDistributed(device=device)
