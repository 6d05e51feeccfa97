"""Synthetic draft-round traces from a known ground truth (``dspark-calibrate traces synth``).

The truth is STS-shaped: position j accepts with probability sigmoid(logit_j / T*_j), and a round's
accepted length is the number of leading accepted positions. Logits are heterogeneous on purpose:
a two-component mixture per position (confident and unsure drafts) whose means fall with the
position, plus a per-request offset (easy and hard requests) and a per-round offset shared by the
positions of one block (correlated positions). A calibrator that recovers T*_j from such data
recovers it from the risk sets, not from one well-behaved distribution.

Censoring imitates dynamic verification: a chosen fraction of rounds is trimmed. In ``confidence``
mode the verified length is the number of positions whose raw cumulative confidence
prod_{i<=j} sigmoid(logit_i) exceeds a random threshold (so trimming depends on the logits, as a
confidence scheduler's does, but never on the outcome); in ``random`` mode it is uniform on
1..K−1. Either way ``accepted = min(true accepted, verified)``.

Everything is deterministic in (spec, batch size). Writing uses ``traces.write_trace_parquet``
with a ``dspark.trace`` footer marking the file synthetic and recording the spec and the truth.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from scipy.special import expit

from dspark_calibrate.calibrate.confidence.traces import (
    DEFAULT_BATCH_ROWS,
    MAX_K,
    TraceBatch,
    TraceSet,
    trace_footer,
    write_trace_parquet,
)
from dspark_calibrate.errors import ConfigError

__all__ = [
    "CENSOR_MODES",
    "DEFAULT_TRUE_TEMPERATURES",
    "SynthSpec",
    "SynthSummary",
    "generate_batches",
    "synth_traces",
    "write_synth_traces",
]

#: Default truth for K = 5: under-confident early positions (T < 1), over-confident late ones.
DEFAULT_TRUE_TEMPERATURES: tuple[float, ...] = (0.7, 0.9, 1.1, 1.4, 1.8)
CENSOR_MODES: tuple[str, ...] = ("confidence", "random")
#: Largest synthetic trace (rounds); beyond it a single in-memory Parquet encode is unreasonable.
MAX_SYNTH_ROUNDS = 200_000_000


@dataclass(frozen=True, slots=True)
class SynthSpec:
    """Parameters of a synthetic trace.

    Attributes:
        rounds: rounds to generate (>= 1).
        k: draft length.
        temperatures: true T*_1..T*_K (default: :data:`DEFAULT_TRUE_TEMPERATURES`, extended or cut
            to K).
        rounds_per_request: mean rounds per request (geometric lengths).
        censor_fraction: fraction of rounds whose block is trimmed (0 = uncensored).
        censor_mode: ``confidence`` or ``random`` (see the module docstring).
        request_spread: standard deviation of the per-request logit offset.
        seed: random seed.
        sampling: optional ``sampling`` tag written on every round.
    """

    rounds: int
    k: int = 5
    temperatures: tuple[float, ...] | None = None
    rounds_per_request: float = 200.0
    censor_fraction: float = 0.0
    censor_mode: str = "confidence"
    request_spread: float = 0.75
    seed: int = 0
    sampling: str | None = None

    def __post_init__(self) -> None:
        if (
            isinstance(self.rounds, bool)
            or not isinstance(self.rounds, int)
            or not 1 <= self.rounds <= MAX_SYNTH_ROUNDS
        ):
            raise ConfigError(f"--rounds {self.rounds!r} must be an integer in 1..{MAX_SYNTH_ROUNDS}")
        if not 1 <= self.k <= MAX_K:
            raise ConfigError(f"--k {self.k!r} must be in 1..{MAX_K}")
        if self.temperatures is not None:
            temps = tuple(float(t) for t in self.temperatures)
            if len(temps) != self.k:
                raise ConfigError(
                    f"--temperatures has {len(temps)} values but --k is {self.k}; give one true "
                    "temperature per position"
                )
            if not all(math.isfinite(t) and t > 0 for t in temps):
                raise ConfigError(f"--temperatures {list(temps)}: every temperature must be finite and > 0")
            object.__setattr__(self, "temperatures", temps)
        if not (math.isfinite(self.rounds_per_request) and self.rounds_per_request >= 1):
            raise ConfigError(f"--rounds-per-request {self.rounds_per_request!r} must be >= 1")
        if not 0.0 <= self.censor_fraction <= 1.0:
            raise ConfigError(f"--censor-fraction {self.censor_fraction!r} must be in [0, 1]")
        if self.censor_fraction > 0 and self.k < 2:
            raise ConfigError("--censor-fraction needs --k >= 2 (a trimmed block verifies 1..K-1 positions)")
        if self.censor_mode not in CENSOR_MODES:
            raise ConfigError(f"--censor-mode {self.censor_mode!r} must be one of {list(CENSOR_MODES)}")
        if not (math.isfinite(self.request_spread) and self.request_spread >= 0):
            raise ConfigError(f"--request-spread {self.request_spread!r} must be a finite number >= 0")
        if self.seed < 0:
            raise ConfigError(f"--seed {self.seed} must be >= 0")

    def true_temperatures(self) -> tuple[float, ...]:
        """T*_1..T*_K."""
        if self.temperatures is not None:
            return self.temperatures
        base = DEFAULT_TRUE_TEMPERATURES
        if self.k <= len(base):
            return base[: self.k]
        return base + tuple(base[-1] + 0.3 * i for i in range(1, self.k - len(base) + 1))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (recorded in the trace footer)."""
        return {
            "rounds": self.rounds,
            "k": self.k,
            "temperatures": list(self.true_temperatures()),
            "rounds_per_request": self.rounds_per_request,
            "censor_fraction": self.censor_fraction,
            "censor_mode": self.censor_mode,
            "request_spread": self.request_spread,
            "seed": self.seed,
            "sampling": self.sampling,
        }


@dataclass(frozen=True, slots=True)
class SynthSummary:
    """What :func:`write_synth_traces` wrote."""

    path: str
    rounds: int
    requests: int
    k: int
    censored_rounds: int
    mean_accepted: float
    temperatures: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "path": self.path,
            "rounds": self.rounds,
            "requests": self.requests,
            "k": self.k,
            "censored_rounds": self.censored_rounds,
            "mean_accepted": self.mean_accepted,
            "temperatures": list(self.temperatures),
        }


def _request_lengths(spec: SynthSpec, rng: np.random.Generator) -> np.ndarray:
    p = 1.0 / spec.rounds_per_request
    lengths: list[np.ndarray] = []
    total = 0
    while total < spec.rounds:
        need = spec.rounds - total
        draw = rng.geometric(p, size=max(16, int(need * p * 1.2) + 16))
        lengths.append(draw)
        total += int(draw.sum())
    out = np.concatenate(lengths)
    cum = np.cumsum(out)
    last = int(np.searchsorted(cum, spec.rounds))
    out = out[: last + 1].copy()
    out[-1] -= int(cum[last] - spec.rounds)
    return out


@dataclass(frozen=True, slots=True, eq=False)
class _Plan:
    """Request layout of a synthetic trace: contiguous requests with their logit offsets."""

    lengths: np.ndarray
    starts: np.ndarray
    offsets: np.ndarray

    @property
    def requests(self) -> int:
        return int(self.lengths.shape[0])

    def names(self) -> tuple[str, ...]:
        return tuple(f"req-{i:08d}" for i in range(self.requests))


def _plan(spec: SynthSpec) -> _Plan:
    setup = np.random.default_rng(np.random.SeedSequence([spec.seed, 0]))
    lengths = _request_lengths(spec, setup)
    offsets = np.asarray(setup.normal(0.0, spec.request_spread, size=lengths.shape[0]))
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return _Plan(lengths=lengths, starts=starts, offsets=offsets)


def _generate(spec: SynthSpec, plan: _Plan, batch_rows: int) -> Iterator[tuple[np.ndarray, TraceBatch]]:
    """Yield (request codes, batch) chunks."""
    k = spec.k
    temps = np.asarray(spec.true_temperatures())
    names = pa.array(plan.names(), pa.string())
    # Mixture per position: confident drafts around +2.2, unsure ones around -0.6, both drifting
    # down with the position.
    pos = np.arange(k)
    mu_hi, sd_hi = 2.2 - 0.25 * pos, 1.0 + 0.05 * pos
    mu_lo, sd_lo = -0.6 - 0.2 * pos, 1.5
    w_hi = 0.7 - 0.04 * pos
    for chunk, start in enumerate(range(0, spec.rounds, batch_rows)):
        stop = min(start + batch_rows, spec.rounds)
        n = stop - start
        rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 1, chunk]))
        row = np.arange(start, stop)
        req = np.searchsorted(plan.starts, row, side="right") - 1
        rnd = row - plan.starts[req]
        hi = rng.random((n, k)) < w_hi
        logits = np.where(hi, rng.normal(mu_hi, sd_hi, (n, k)), rng.normal(mu_lo, sd_lo, (n, k)))
        logits += plan.offsets[req, None] + rng.normal(0.0, 0.5, (n, 1))
        logits = logits.astype(np.float32)
        p_true = expit(logits.astype(np.float64) / temps)
        ok = rng.random((n, k)) < p_true
        accepted = np.cumprod(ok, axis=1).sum(axis=1)
        verified = np.full(n, k, dtype=np.int64)
        if spec.censor_fraction > 0:
            trim = rng.random(n) < spec.censor_fraction
            if spec.censor_mode == "random":
                v = rng.integers(1, k, size=n)
            else:
                raw = np.cumprod(expit(logits.astype(np.float64)), axis=1)
                tau = rng.uniform(0.15, 0.85, size=(n, 1))
                v = np.clip((raw >= tau).sum(axis=1), 1, k - 1)
            verified = np.where(trim, v, verified)
            accepted = np.minimum(accepted, verified)
        batch = TraceBatch(
            request_id=names.take(pa.array(req)),
            round=rnd.astype(np.int64),
            logits=logits,
            accepted=accepted.astype(np.int8),
            verified=verified.astype(np.int8),
            sampling=pa.array([spec.sampling] * n, pa.string()) if spec.sampling is not None else None,
        )
        yield req.astype(np.int32), batch


def generate_batches(spec: SynthSpec, *, batch_rows: int = DEFAULT_BATCH_ROWS) -> Iterator[TraceBatch]:
    """Generate the rounds of ``spec`` as batches (deterministic in spec and ``batch_rows``)."""
    for _, batch in _generate(spec, _plan(spec), batch_rows):
        yield batch


def synth_traces(spec: SynthSpec, *, batch_rows: int = DEFAULT_BATCH_ROWS) -> TraceSet:
    """Generate ``spec`` in memory as a :class:`TraceSet` (request ids ``req-00000000``...)."""
    plan = _plan(spec)
    parts = list(_generate(spec, plan, batch_rows))
    return TraceSet(
        k=spec.k,
        request_names=plan.names(),
        request=np.concatenate([c for c, _ in parts]),
        round=np.concatenate([b.round for _, b in parts]),
        logits=np.concatenate([b.logits for _, b in parts]),
        accepted=np.concatenate([b.accepted for _, b in parts]),
        verified=np.concatenate([b.verified for _, b in parts]),
    )


def write_synth_traces(
    path: Path | str,
    spec: SynthSpec,
    *,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    extra: Mapping[str, Any] | None = None,
) -> SynthSummary:
    """Generate ``spec`` and write it as a synthetic trace Parquet file (atomically).

    Raises:
        ConfigError: invalid spec.
        OSError: the file cannot be written.
    """
    plan = _plan(spec)
    counts = {"censored": 0, "accepted": 0}

    def counted() -> Iterator[TraceBatch]:
        for _, batch in _generate(spec, plan, batch_rows):
            counts["censored"] += int((batch.verified < spec.k).sum())
            counts["accepted"] += int(batch.accepted.astype(np.int64).sum())
            yield batch

    generator = {**spec.to_dict(), **(dict(extra) if extra else {})}
    footer = trace_footer(synthetic=True, generator=generator, k=spec.k)
    rows = write_trace_parquet(path, counted(), footer=footer)
    return SynthSummary(
        path=str(path),
        rounds=rows,
        requests=plan.requests,
        k=spec.k,
        censored_rounds=counts["censored"],
        mean_accepted=counts["accepted"] / max(rows, 1),
        temperatures=spec.true_temperatures(),
    )
