"""The admission sentinel: re-measure a few cells live and refuse a table the hardware contradicts.

A signed cost table can be authentic, fresh and bound to the right fingerprint and still be wrong
for this host (a firmware update, a throttled part, a changed clock policy). The sentinel times a
few cells (by default the largest G's native cell and one of its compact cells) through a backend,
and fails when a measured median falls outside the stored CI of the median widened by a relative
tolerance. Its cost (wall time) is reported.

The judgement (:func:`judge`) is a pure function of the stored cells and the measured samples.
The backend comes from the caller: :attr:`SentinelPolicy.loader` builds it from the policy's
backend name and options (``dspark_calibrate.calibrate.measurement.load_sentinel_backend`` adapts
the sweep backends). This module never imports the calibration stack; a serving process pays for
it only if its loader does, and only when a sentinel runs (DESIGN §3).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from dspark_calibrate.artifacts import Finding, Reason
from dspark_calibrate.errors import ConfigError, MeasurementError

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "DEFAULT_SENTINEL_SAMPLES",
    "DEFAULT_SENTINEL_TOLERANCE",
    "CellCheck",
    "SentinelBackend",
    "SentinelLoader",
    "SentinelPolicy",
    "SentinelReport",
    "StoredCell",
    "default_cells",
    "judge",
    "run_sentinel",
    "stored_cells",
]

#: Relative widening of the stored CI of the median (0.05 = 5 %). The stored CI is tight (the
#: sweep stops on CI precision, typically ±0.5 %), while a handful of live samples in a serving
#: process sees more noise and heat; 5 % still catches the 20 % shifts seen across engine builds
#: (DESIGN §1).
DEFAULT_SENTINEL_TOLERANCE = 0.05
#: Timed samples per cell. Odd, so the median is one sample; 9 keeps the sentinel under ~1 s for
#: 50 ms steps.
DEFAULT_SENTINEL_SAMPLES = 9


class SentinelBackend(Protocol):
    """What the sentinel needs from a backend: time a few steps of one cell on this host."""

    @property
    def synthetic(self) -> bool:
        """True when the times are modelled, not measured (refused unless the policy allows it)."""
        ...

    def measure(
        self,
        graph_batch_size: int,
        verifier_budget: int,
        max_draft_len: int,
        *,
        warmup: int,
        replays: int,
        samples: int,
    ) -> Sequence[float]:
        """Prepare the cell, run ``warmup`` untimed steps, return ``samples`` timed samples (ms).

        Raises:
            MeasurementError: the step could not be timed (a vanished GPU, non-finite times).
            ConfigError: the backend cannot build this cell.
        """
        ...

    def close(self) -> None:
        """Release what the backend holds (graphs, engines)."""
        ...


#: Builds the backend a policy names from ``(backend, backend_options)``; raises ``ConfigError``
#: (or ``ImportError``) when it cannot.
SentinelLoader = Callable[[str, Mapping[str, Any]], SentinelBackend]


@dataclass(frozen=True, slots=True)
class SentinelPolicy:
    """How the sentinel runs.

    Attributes:
        backend: the backend to re-measure with, as the loader names it (for the sweep backends: a
            built-in name, entry point or ``pkg.mod:Factory`` import string); it is also reported.
        backend_options: keyword options for the backend factory.
        loader: builds the backend from ``backend`` and ``backend_options``, e.g.
            ``dspark_calibrate.calibrate.measurement.load_sentinel_backend``. Without one the
            sentinel fails with ``BACKEND_IMPORT_ERROR`` (static K).
        tolerance: relative widening of the stored CI (``[lo·(1-tol), hi·(1+tol)]``).
        cells: ``(G, V)`` cells to re-measure; ``None`` picks :func:`default_cells`.
        samples: timed samples per cell (the median is judged).
        warmup: untimed steps per cell before timing.
        replays: back-to-back steps per timed sample.
        allow_synthetic: accept a backend that reports ``synthetic`` (tests and demos only).
    """

    backend: str
    backend_options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    loader: SentinelLoader | None = field(default=None, compare=False)
    tolerance: float = DEFAULT_SENTINEL_TOLERANCE
    cells: tuple[tuple[int, int], ...] | None = None
    samples: int = DEFAULT_SENTINEL_SAMPLES
    warmup: int = 3
    replays: int = 1
    allow_synthetic: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.backend, str) or not self.backend:
            raise ConfigError("sentinel backend must be a name or an import string like pkg.mod:Factory")
        if isinstance(self.tolerance, bool) or not isinstance(self.tolerance, (int, float)):
            raise ConfigError(f"sentinel tolerance must be a number in [0, 1), got {self.tolerance!r}")
        if not (math.isfinite(self.tolerance) and 0 <= self.tolerance < 1):
            raise ConfigError(f"sentinel tolerance must be in [0, 1), got {self.tolerance!r}")
        for name, minimum in (("samples", 1), ("warmup", 0), ("replays", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(f"sentinel {name} must be an integer >= {minimum}, got {value!r}")
        object.__setattr__(self, "backend_options", MappingProxyType(dict(self.backend_options)))
        if self.cells is not None:
            cells = tuple((int(g), int(v)) for g, v in self.cells)
            if not cells:
                raise ConfigError(
                    "sentinel cells must name at least one (G, V) cell, or be None for the default"
                )
            object.__setattr__(self, "cells", cells)


@dataclass(frozen=True, slots=True, order=True)
class StoredCell:
    """One cell of the verified cost table, as the sentinel judges it (times in ms)."""

    graph_batch_size: int
    verifier_budget: int
    step_time_ms: float
    ci_low_ms: float
    ci_high_ms: float


@dataclass(frozen=True, slots=True)
class CellCheck:
    """The sentinel's verdict on one cell.

    Attributes:
        cell: the stored cell.
        allowed_low_ms, allowed_high_ms: the stored CI widened by the tolerance.
        measured_median_ms: median of the live samples (NaN when none were usable).
        samples_ms: the live samples.
        ok: the median lies inside the allowed interval.
    """

    cell: StoredCell
    allowed_low_ms: float
    allowed_high_ms: float
    measured_median_ms: float
    samples_ms: tuple[float, ...]
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (NaN rendered as None)."""
        median = self.measured_median_ms
        return {
            "graph_batch_size": self.cell.graph_batch_size,
            "verifier_budget": self.cell.verifier_budget,
            "stored_median_ms": self.cell.step_time_ms,
            "stored_ci_ms": [self.cell.ci_low_ms, self.cell.ci_high_ms],
            "allowed_ms": [self.allowed_low_ms, self.allowed_high_ms],
            "measured_median_ms": median if math.isfinite(median) else None,
            "samples": len(self.samples_ms),
            "ok": self.ok,
        }


@dataclass(frozen=True, slots=True)
class SentinelReport:
    """What the sentinel found and what it cost.

    Attributes:
        ok: every checked cell passed.
        findings: why it failed (empty when ok).
        checks: one entry per measured cell.
        cost_s: wall time of the whole sentinel (backend load, capture, warm-up and timing).
        backend: the backend spec used.
    """

    ok: bool
    findings: tuple[Finding, ...]
    checks: tuple[CellCheck, ...]
    cost_s: float
    backend: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok,
            "backend": self.backend,
            "cost_ms": round(self.cost_s * 1e3, 3),
            "findings": [f.to_dict() for f in self.findings],
            "checks": [c.to_dict() for c in self.checks],
        }


def stored_cells(cost_table: pa.Table) -> dict[tuple[int, int], StoredCell]:
    """The cells of a verified cost table keyed by ``(G, V)``."""
    columns = [
        cost_table.column(name).to_pylist()
        for name in ("graph_batch_size", "verifier_budget", "step_time_ms", "ci_low_ms", "ci_high_ms")
    ]
    return {
        (int(g), int(v)): StoredCell(int(g), int(v), float(t), float(lo), float(hi))
        for g, v, t, lo, hi in zip(*columns, strict=True)
    }


def default_cells(cells: Mapping[tuple[int, int], StoredCell]) -> tuple[tuple[int, int], ...]:
    """The largest G's native cell and one compact cell.

    The compact cell is the smallest compact V of the largest G that has one: the cheapest step, so
    a fixed offset (the usual symptom of another engine build) is the largest relative shift there.
    """
    if not cells:
        return ()
    ladder = sorted({g for g, _ in cells})
    out: list[tuple[int, int]] = []
    if (ladder[-1], 0) in cells:
        out.append((ladder[-1], 0))
    for g in reversed(ladder):
        compact = sorted(v for gg, v in cells if gg == g and v != 0)
        if compact:
            out.append((g, compact[0]))
            break
    return tuple(out)


def judge(
    cells: Sequence[StoredCell], samples: Mapping[tuple[int, int], Sequence[float]], tolerance: float
) -> tuple[tuple[CellCheck, ...], tuple[Finding, ...]]:
    """Compare live samples with the stored cells. Pure.

    A cell fails when its samples are missing or non-finite, or when their median lies outside
    ``[ci_low·(1 - tolerance), ci_high·(1 + tolerance)]``.

    Returns:
        One check per cell (in the given order) and one ``SENTINEL_FAILED`` finding per failing cell.
    """
    checks: list[CellCheck] = []
    findings: list[Finding] = []
    for cell in cells:
        key = (cell.graph_batch_size, cell.verifier_budget)
        raw = tuple(float(x) for x in samples.get(key, ()))
        lo, hi = cell.ci_low_ms * (1 - tolerance), cell.ci_high_ms * (1 + tolerance)
        usable = bool(raw) and all(math.isfinite(x) and x > 0 for x in raw)
        median = statistics.median(raw) if usable else math.nan
        ok = usable and lo <= median <= hi
        checks.append(CellCheck(cell, lo, hi, median, raw, ok))
        if ok:
            continue
        name = f"(G={key[0]}, V={key[1]})"
        if not usable:
            message = (
                f"sentinel: cell {name} produced no usable samples ({len(raw)} taken); check the backend"
            )
        else:
            message = (
                f"sentinel: cell {name} measures {median:.4g} ms live, outside the signed CI "
                f"[{cell.ci_low_ms:.4g}, {cell.ci_high_ms:.4g}] ms widened by {tolerance:.0%} to "
                f"[{lo:.4g}, {hi:.4g}] ms; this host does not match the measured deployment, re-run sweep"
            )
        findings.append(
            Finding(
                Reason.SENTINEL_FAILED,
                message,
                field=f"G{key[0]}V{key[1]}",
                expected=[lo, hi],
                actual=median if usable else None,
            )
        )
    return tuple(checks), tuple(findings)


def _report(
    policy: SentinelPolicy,
    started: float,
    clock: Callable[[], float],
    findings: Sequence[Finding],
    checks: Sequence[CellCheck] = (),
) -> SentinelReport:
    return SentinelReport(
        ok=not findings,
        findings=tuple(findings),
        checks=tuple(checks),
        cost_s=clock() - started,
        backend=policy.backend,
    )


def _setup_problem(
    policy: SentinelPolicy,
    table_cells: Mapping[tuple[int, int], StoredCell],
    wanted: Sequence[tuple[int, int]],
) -> Finding | None:
    """Why the sentinel cannot start: cells the table does not hold, or no backend loader."""
    unknown = [c for c in wanted if c not in table_cells]
    if unknown or not wanted:
        return Finding(
            Reason.SENTINEL_FAILED,
            f"sentinel: cells {unknown or 'none'} are not in the verified cost table; "
            "choose cells the table holds",
            field="cells",
        )
    if policy.loader is None:
        return Finding(
            Reason.BACKEND_IMPORT_ERROR,
            "sentinel: no backend loader given; pass SentinelPolicy(loader=...), e.g. "
            "dspark_calibrate.calibrate.measurement.load_sentinel_backend",
            field="loader",
        )
    return None


def _measure(
    backend: SentinelBackend, wanted: Sequence[tuple[int, int]], max_draft_len: int, policy: SentinelPolicy
) -> dict[tuple[int, int], list[float]]:
    """The backend's samples of each wanted cell, with the policy's warm-up, replays and count."""
    samples: dict[tuple[int, int], list[float]] = {}
    for g, v in wanted:
        samples[(g, v)] = list(
            backend.measure(
                g,
                v,
                max_draft_len,
                warmup=policy.warmup,
                replays=policy.replays,
                samples=policy.samples,
            )
        )
    return samples


def run_sentinel(
    cost_table: pa.Table,
    max_draft_len: int,
    policy: SentinelPolicy,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> SentinelReport:
    """Re-measure cells of a verified cost table through a backend and judge them.

    Args:
        cost_table: the verified cost table (its rows are trusted).
        max_draft_len: K of the deployment.
        policy: backend, cells, tolerance and sample counts.
        clock: wall clock for the reported cost (injected in tests).

    Returns:
        The report. No loader, or a backend it cannot import or construct, gives
        ``BACKEND_IMPORT_ERROR``; a synthetic backend under a strict policy ``SYNTHETIC_REFUSED``; a
        cell absent from the table, a ``MeasurementError`` or a median outside the widened CI
        ``SENTINEL_FAILED``.
        Any other exception propagates to the admission boundary.
    """
    started = clock()
    table_cells = stored_cells(cost_table)
    wanted = policy.cells if policy.cells is not None else default_cells(table_cells)
    problem = _setup_problem(policy, table_cells, wanted)
    if problem is not None:
        return _report(policy, started, clock, [problem])
    assert policy.loader is not None
    try:
        backend = policy.loader(policy.backend, policy.backend_options)
    except (ConfigError, ImportError) as exc:
        return _report(
            policy,
            started,
            clock,
            [Finding(Reason.BACKEND_IMPORT_ERROR, f"sentinel: {exc}", field="backend")],
        )
    try:
        if backend.synthetic and not policy.allow_synthetic:
            return _report(
                policy,
                started,
                clock,
                [
                    Finding(
                        Reason.SYNTHETIC_REFUSED,
                        f"sentinel: backend {policy.backend!r} is synthetic; it cannot vouch for this host",
                        field="backend",
                    )
                ],
            )
        samples = _measure(backend, wanted, max_draft_len, policy)
    except (MeasurementError, ConfigError) as exc:
        return _report(policy, started, clock, [Finding(Reason.SENTINEL_FAILED, f"sentinel: {exc}")])
    finally:
        backend.close()
    checks, findings = judge([table_cells[c] for c in wanted], samples, policy.tolerance)
    return _report(policy, started, clock, findings, checks)
