"""The ``trtllm`` backend: time real TensorRT-LLM decode steps through its LLM API.

Drives ``tensorrt_llm.LLM`` with the ladder as ``cuda_graph_config.batch_sizes`` (padding on) and
per-iteration statistics enabled; for each cell it keeps ``G`` generation requests in flight with
the verifier budget forced to V (through a user hook, since the knob is engine-build specific) and
reads per-iteration step times from ``llm.get_stats()``. Only aligned steady-state decode steps
count: no context requests in the iteration, exactly the cell's number of generation requests,
contiguous iterations after a warm-up skip and before the drain tail.

The parsing, alignment and cell-mapping logic is pure (:func:`parse_iteration_stats`,
:func:`steady_decode_steps`, :func:`cell_for_rows`) and tested on recorded stats; the engine path
needs ``tensorrt_llm`` and a GPU.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dspark_calibrate.calibrate.measurement.backends import BackendBase, resolve_factory
from dspark_calibrate.calibrate.measurement.ladder import CellSpec
from dspark_calibrate.calibrate.measurement.telemetry import Telemetry, open_telemetry
from dspark_calibrate.calibrate.measurement.timing import Step, Timer
from dspark_calibrate.errors import ConfigError, MeasurementError

__all__ = [
    "IterationStat",
    "TrtllmBackend",
    "cell_for_rows",
    "parse_iteration_stats",
    "steady_decode_steps",
]


@dataclass(frozen=True, slots=True)
class IterationStat:
    """The fields of one TensorRT-LLM iteration-stats record this backend uses."""

    iteration: int
    latency_ms: float
    context_requests: int
    generation_requests: int
    draft_tokens: int | None


def _get(rec: Mapping[str, Any], *path: str) -> Any:
    cur: Any = rec
    for key in path:
        if not isinstance(cur, Mapping) or key not in cur:
            return None
        cur = cur[key]
    return cur


def parse_iteration_stats(records: Iterable[Mapping[str, Any] | str]) -> list[IterationStat]:
    """Parse ``llm.get_stats()`` records (dicts or JSON strings) into :class:`IterationStat`.

    Uses ``iter``, ``iterLatencyMS``, ``inflightBatchingStats.numContextRequests`` /
    ``numGenRequests`` and, when present, ``specDecodingStats.numDraftTokens``.

    Raises:
        ConfigError: a record lacks a required field or holds a non-finite latency.
    """
    out = []
    for n, raw in enumerate(records):
        try:
            rec = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as exc:
            raise ConfigError(f"iteration stats record {n}: not JSON ({exc})") from exc
        it, lat = _get(rec, "iter"), _get(rec, "iterLatencyMS")
        ctx = _get(rec, "inflightBatchingStats", "numContextRequests")
        gen = _get(rec, "inflightBatchingStats", "numGenRequests")
        if (
            not isinstance(it, int)
            or not isinstance(lat, int | float)
            or not isinstance(ctx, int)
            or not isinstance(gen, int)
        ):
            raise ConfigError(
                f"iteration stats record {n} lacks iter/iterLatencyMS/"
                "inflightBatchingStats.numContextRequests/"
                "numGenRequests; enable iteration stats (enable_iter_perf_stats=True) with inflight batching"
            )
        if not math.isfinite(lat) or lat <= 0:
            raise ConfigError(
                f"iteration stats record {n} (iter {it}): iterLatencyMS={lat!r} is not a positive finite time"
            )
        draft = _get(rec, "specDecodingStats", "numDraftTokens")
        out.append(IterationStat(it, float(lat), ctx, gen, draft if isinstance(draft, int) else None))
    return out


def cell_for_rows(rows: int, *, ladder: Sequence[int], k: int, verifier_budget: int) -> CellSpec:
    """The captured cell a step with ``rows`` generation requests runs in (padding to the ladder).

    Raises:
        ConfigError: more rows than the largest captured G.
    """
    fitting = [g for g in sorted(ladder) if g >= rows]
    if rows < 1 or not fitting:
        raise ConfigError(f"{rows} generation requests do not fit the ladder {list(ladder)}")
    return CellSpec(fitting[0], verifier_budget, k)


def steady_decode_steps(
    stats: Sequence[IterationStat], *, rows: int, k: int | None = None, skip: int = 4, tail: int = 2
) -> list[IterationStat]:
    """Aligned steady-state decode iterations with exactly ``rows`` generation requests.

    An iteration counts when it has no context request and ``rows`` generation requests (and, when
    the record has draft counts and ``k`` is given, ``rows·k`` draft tokens). Counting iterations
    form runs of consecutive ``iter`` numbers; the first ``skip`` (warm-up after admission or a
    graph switch) and the last ``tail`` (drain as requests finish) of every run are dropped.
    """
    keep = [
        s
        for s in stats
        if s.context_requests == 0
        and s.generation_requests == rows
        and (k is None or s.draft_tokens is None or s.draft_tokens == rows * k)
    ]
    keep.sort(key=lambda s: s.iteration)
    out: list[IterationStat] = []
    run: list[IterationStat] = []
    for s in [*keep, None]:
        if s is not None and (not run or s.iteration == run[-1].iteration + 1):
            run.append(s)
            continue
        out.extend(run[skip : len(run) - tail if tail else None])
        run = [s] if s is not None else []
    return out


class _EngineStep:
    """Placeholder step: the engine advances itself; :class:`_TrtllmTimer` drives it."""

    def __init__(self, cell: CellSpec) -> None:
        self.cell = cell

    def __call__(self) -> None:
        raise RuntimeError("trtllm steps are driven by the backend's timer, not called directly")


class _TrtllmTimer:
    def __init__(self, backend: TrtllmBackend) -> None:
        self._b = backend

    def now(self) -> float:
        import time

        return time.perf_counter()

    def warm(self, step: Step, replays: int) -> None:
        assert isinstance(step, _EngineStep)
        self._b.collect(step.cell, replays)

    def measure(
        self, step: Step, *, replays: int, samples: int, on_sample: Callable[[int], None] | None = None
    ) -> list[float]:
        assert isinstance(step, _EngineStep)
        times = self._b.collect(step.cell, replays * samples)
        out = []
        for i in range(samples):
            chunk = times[i * replays : (i + 1) * replays]
            out.append(sum(chunk) / len(chunk))
            if on_sample is not None:
                on_sample(i)
        return out


class TrtllmBackend(BackendBase):
    """TensorRT-LLM LLM-API backend; see the module docstring.

    Args:
        model: model path or name for ``tensorrt_llm.LLM``.
        ladder: the graph ladder (captured as ``cuda_graph_config.batch_sizes``).
        force_budget: ``pkg.mod:fn`` called as ``fn(llm, V)`` before a cell (V = 0: native);
            required for compact cells.
        llm_args: extra keyword arguments for ``LLM`` (speculative config, parallelism, ...).
        prompt_len: prompt tokens per request.
        skip: warm-up iterations dropped per run.
        tail: drain iterations dropped per run.
        telemetry_device: NVML index for telemetry.
    """

    name = "trtllm"
    synthetic = False

    def __init__(
        self,
        model: str,
        ladder: Sequence[int],
        force_budget: str | None = None,
        llm_args: Mapping[str, Any] | None = None,
        prompt_len: int = 128,
        skip: int = 4,
        tail: int = 2,
        telemetry_device: int | None = 0,
    ) -> None:
        try:
            import tensorrt_llm
            from tensorrt_llm.llmapi import CudaGraphConfig
        except ImportError as exc:
            raise ConfigError(
                "the trtllm backend needs tensorrt_llm; run it on a TensorRT-LLM image"
            ) from exc
        self._trt = tensorrt_llm
        self._ladder = tuple(sorted(ladder))
        self._force: Callable[[Any, int], None] | None = (
            resolve_factory(force_budget) if force_budget else None
        )
        self._force_spec = force_budget
        self._args = dict(llm_args or {})
        self._prompt_len = prompt_len
        self._skip, self._tail = skip, tail
        self._telemetry_device = telemetry_device
        self._model = model
        self.llm = tensorrt_llm.LLM(
            model=model,
            cuda_graph_config=CudaGraphConfig(batch_sizes=list(self._ladder), enable_padding=True),
            enable_iter_perf_stats=True,
            **self._args,
        )

    def prepare(self, cell: CellSpec) -> Step:
        """Force the cell's budget and return the engine-driven placeholder step.

        Raises:
            ConfigError: a compact cell without a ``force_budget`` hook.
        """
        if cell.verifier_budget and self._force is None:
            raise ConfigError(f"{cell.label()}: compact cells need --backend-opt force_budget=pkg.mod:fn")
        return _EngineStep(cell)

    def collect(self, cell: CellSpec, steps: int) -> list[float]:
        """Run ``G`` requests until ``steps`` aligned decode iterations were seen; their times in ms.

        Raises:
            MeasurementError: the engine finished without enough aligned iterations.
        """
        from tensorrt_llm import SamplingParams

        if self._force is not None:
            self._force(self.llm, cell.verifier_budget)
        rows = cell.graph_batch_size
        want = steps + self._skip + self._tail
        params = SamplingParams(max_tokens=max(8, want * (cell.k + 1)), ignore_eos=True)
        prompts = [[1 + (i % 100)] * self._prompt_len for i in range(rows)]
        self.llm.get_stats(timeout=0.1)  # drain stats left by the previous cell
        self.llm.generate(prompts, params, use_tqdm=False)
        stats = parse_iteration_stats(self.llm.get_stats(timeout=2.0))
        steady = steady_decode_steps(stats, rows=rows, k=cell.k, skip=self._skip, tail=self._tail)
        if len(steady) < steps:
            raise MeasurementError(
                f"{cell.label()}: only {len(steady)} aligned decode iterations of {steps} needed; "
                "raise max tokens"
            )
        return [s.latency_ms for s in steady[:steps]]

    def timer(self) -> Timer:
        """A timer that runs the engine and reads iteration latencies."""
        return _TrtllmTimer(self)

    def telemetry(self) -> Telemetry:
        """NVML telemetry."""
        return open_telemetry(self._telemetry_device)

    def describe(self) -> dict[str, Any]:
        """Model, ladder, engine version, hook and LLM arguments."""
        return {
            "name": self.name,
            "model": self._model,
            "ladder": list(self._ladder),
            "tensorrt_llm": getattr(self._trt, "__version__", None),
            "force_budget": self._force_spec,
            "llm_args": json.loads(json.dumps(self._args, default=str)),
            "skip": self._skip,
            "tail": self._tail,
        }

    def close(self) -> None:
        """Shut the engine down."""
        shutdown = getattr(self.llm, "shutdown", None)
        if callable(shutdown):
            shutdown()
