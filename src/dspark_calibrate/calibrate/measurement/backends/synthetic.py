"""The synthetic backend: an analytic staircase cost model with noise, on a virtual clock.

For tests, demos and CI on CPU. Nothing is executed: each step advances a virtual clock by the
modelled step time, so a sweep of hundreds of cells runs in well under a second and is exactly
reproducible from its seed. Everything it produces is marked synthetic (verification refuses it
unless explicitly allowed).

The model: ``T = base + per_row·G + per_tile·ceil(tokens / tile) (+ compact_overhead)`` — a
staircase in V — multiplied by a slow sinusoidal drift (heat), a cold-start penalty that decays
over the first replays after switching cells (why warm-up is needed), log-normal noise, rare
outliers, and optional throttling that slows the step and is reported through telemetry.

What separates two processes can be simulated too: ``process_rel`` draws one level shift for the
whole backend (common to every cell: the machine, the clock state at start), ``capture_rel`` a
shift per cell at every ``prepare`` (graph capture, memory placement). The sweep's own statistics
are tested against known truths of these sizes (``--backend-opt NAME=X``):

- ``epoch_shift_rel``: per epoch and per cell, a multiplicative shift of SD X (drawn when the cell
  is captured, once per capture epoch or pass; it adds to ``capture_rel`` in quadrature);
- ``heavy_shift_rel``: like ``epoch_shift_rel``, for the cells of G >= ``heavy_from_g`` only (a
  power-capped GPU's heavy steps move more between captures than its light ones);
- ``common_shift_rel``: per epoch, one shift of SD X shared by every cell (a new epoch starts with
  each process and whenever a cell is captured a second time in it);
- ``carryover_rel``: a visit that follows one to a larger G runs slower by X, decaying over
  ``carryover_decay_steps`` steps (e-folding) after the switch of G (a G's cells alternating
  among themselves keep decaying it);
- ``wander_rel``: the power controller's clock wander, shared by every cell: each step runs slower
  by ``exp(w)``, w a stationary Gauss-Markov process in (virtual) time of SD X whose correlation
  decays over ``wander_tau_s`` seconds (e-folding);
- ``capture_bias_rel``: a bias of the measurement, not of serving: every cell other than the
  native one (compact and control) runs faster by X in the sweep, so the control cell shows it
  (:meth:`SyntheticModel.true_saving` leaves it out);
- ``launch_gap_ms``: the first step after the timer waited for the device (every sample's first
  replay) costs X ms more, as a graph launched onto an idle GPU waits for the host to submit it;
  steps queued behind a running one do not. :meth:`SyntheticModel.true_saving` is the saving of
  steps launched ahead; :meth:`SyntheticModel.true_saving_synchronous` that of steps that each
  wait for the one before.

``power_capped`` runs every step at the power cap (reported as the SW power-cap reason, slower by
``power_cap_slowdown_rel``): the steady state of a serving GPU; there a cell verifying a share s
of its G's full width reports an SM clock higher by ``power_cap_clock_rel``·(1 − s). With
``clock_tau_steps`` = X > 0 that clock also sets the step's time, and the GPU gets there slowly:
its clock moves toward the running cell's by a share 1 − exp(−1/X) after every step, and a step
takes its modelled time divided by the clock (relative to the native cell's) it starts at. A cell
run alone long enough then runs at its own clock, one alternated step by step with its G's other
cells at the mix's clock; :meth:`SyntheticModel.true_saving` is the saving in the mix (the clock
the steps share cancels). The forced-K
arm costs the native step plus ``confidence_path_ms``; the control cell (V = G·(K+1)) is the
native step captured again and costs the native step.

Mixed prefill+decode steps (:meth:`SyntheticBackend.prepare_mixed`) cost ``base`` plus
``mixed_per_row_ms`` per body row of the captured capacity (pad rows included: the bucket is what
the graph runs), plus attention: ``mixed_attention_ms`` per thousand (query, key) pairs of every
context chunk (over its cached or compressed prefix and itself) and of every generation row (over
its history).
"""

from __future__ import annotations

import math
import time
from collections.abc import Hashable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dspark_calibrate.calibrate.measurement.backends import BackendBase
from dspark_calibrate.calibrate.measurement.ladder import CellKind, CellSpec
from dspark_calibrate.calibrate.measurement.mixed import MixedShape, OutputCheck
from dspark_calibrate.calibrate.measurement.telemetry import Telemetry, TelemetrySample
from dspark_calibrate.calibrate.measurement.timing import HostTimer, Step, Timer
from dspark_calibrate.errors import ConfigError

__all__ = ["SyntheticBackend", "SyntheticModel", "VirtualClock"]


@dataclass(frozen=True, slots=True)
class SyntheticModel:
    """Parameters of the synthetic cost model (times in ms, rates relative)."""

    base_ms: float = 4.0
    per_row_ms: float = 0.02
    per_tile_ms: float = 0.25
    tile: int = 16
    compact_overhead_ms: float = 0.05
    noise_rel: float = 0.003
    drift_rel: float = 0.004
    drift_period_s: float = 30.0
    cold_penalty_rel: float = 0.05
    cold_decay_steps: float = 0.7
    outlier_prob: float = 0.002
    throttle_prob: float = 0.0
    throttle_slowdown_rel: float = 0.15
    confidence_path_ms: float = 0.04
    process_rel: float = 0.0
    capture_rel: float = 0.0
    power_capped: bool = False
    power_cap_slowdown_rel: float = 0.03
    mixed_per_row_ms: float = 0.02
    mixed_attention_ms: float = 0.004
    epoch_shift_rel: float = 0.0
    heavy_shift_rel: float = 0.0
    heavy_from_g: float = 0.0
    common_shift_rel: float = 0.0
    carryover_rel: float = 0.0
    carryover_decay_steps: float = 8.0
    power_cap_clock_rel: float = 0.0
    capture_bias_rel: float = 0.0
    launch_gap_ms: float = 0.0
    clock_tau_steps: float = 0.0
    wander_rel: float = 0.0
    wander_tau_s: float = 0.2

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if isinstance(value, bool):
                continue
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"synthetic model {name}={value!r} must be finite and >= 0")
        if (
            self.tile < 1
            or self.base_ms <= 0
            or self.drift_period_s <= 0
            or self.carryover_decay_steps <= 0
            or self.wander_tau_s <= 0
        ):
            raise ConfigError(
                "synthetic model needs tile >= 1, base_ms > 0, drift_period_s > 0, carryover_decay_steps > 0"
                " and wander_tau_s > 0"
            )

    def expected_ms(self, cell: CellSpec) -> float:
        """Noise-free step time of a cell (before the process, capture and power-cap factors)."""
        t = self.base_ms + self.per_row_ms * cell.graph_batch_size
        t += self.per_tile_ms * math.ceil(cell.tokens / self.tile)
        if cell.kind is CellKind.FORCED_K:
            t += self.confidence_path_ms
        elif cell.kind is CellKind.COMPACT:
            t += self.compact_overhead_ms
        return t

    def true_saving(self, cell: CellSpec) -> float:
        """The noise-free saving ``1 − T(cell)/T(native)`` (0 for the control: the native step again)."""
        return 1.0 - self.expected_ms(cell) / self.expected_ms(cell.native)

    def true_saving_synchronous(self, cell: CellSpec) -> float:
        """The noise-free saving when every step pays the launch gap (a serving loop that waits
        for each step before launching the next)."""
        gap = self.launch_gap_ms
        return 1.0 - (self.expected_ms(cell) + gap) / (self.expected_ms(cell.native) + gap)

    def clock_rel(self, cell: Hashable) -> float:
        """The SM clock a cell settles to under the power cap, relative to its native cell's
        (1 off the cap, and for every step that is not a decode cell)."""
        if not self.power_capped or not isinstance(cell, CellSpec):
            return 1.0
        return 1.0 + self.power_cap_clock_rel * (1.0 - cell.tokens / cell.full_width)

    def mixed_expected_ms(self, shape: MixedShape) -> float:
        """Noise-free time of one rank's mixed step (see the module docstring)."""
        pairs = sum(c.size * ((c.compressed or c.position) + (c.size + 1) / 2) for c in shape.context)
        pairs += sum(
            r * (g.history + (r + 1) / 2)
            for g, r in zip(shape.generations, shape.generation_rows, strict=True)
        )
        return (
            self.base_ms + self.mixed_per_row_ms * shape.capacity + self.mixed_attention_ms * pairs / 1000.0
        )


class VirtualClock:
    """A clock that only moves when told to (seconds)."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def __call__(self) -> float:
        """Current virtual time."""
        return self.t

    def advance(self, seconds: float) -> None:
        """Move forward by ``seconds``."""
        self.t += seconds


class _SyntheticTelemetry:
    def __init__(self, backend: SyntheticBackend) -> None:
        self._backend = backend

    def read(self) -> TelemetrySample:
        throttled = self._backend.last_throttled
        model = self._backend.model
        capped = model.power_capped
        clock = (1755.0 if capped else 1980.0) * self._backend.clock_state()
        return TelemetrySample(
            sm_clock_mhz=1500.0 if throttled else clock,
            temperature_c=60.0 + 10.0 * self._backend.drift(),
            power_w=700.0 if capped else 500.0,
            throttle_reasons=(0x20 if throttled else 0) | (0x4 if capped else 0),
        )

    def describe(self) -> str:
        return "synthetic"


class _SyntheticStep:
    def __init__(
        self, backend: SyntheticBackend, cell: Hashable, expected_ms: float, capture_factor: float
    ) -> None:
        self._backend = backend
        self._cell = cell
        self._expected = expected_ms * capture_factor * backend.process_factor

    def __call__(self) -> None:
        self._backend.run(self._cell, self._expected)


class SyntheticBackend(BackendBase):
    """Analytic staircase backend on a :class:`VirtualClock`.

    Args:
        seed: noise seed.
        fail_at: raise ``RuntimeError`` on this step number (tests of failure handling).
        nan_at: return NaN timings from this step number on (tests of non-finite handling).
        real_delay_s: also sleep this long per step in real time (tests that kill a running sweep).
        **model: overrides of :class:`SyntheticModel` fields.
    """

    name = "synthetic"
    synthetic = True
    supports_forced_k = True

    def __init__(
        self,
        seed: int = 0,
        fail_at: int | None = None,
        nan_at: int | None = None,
        real_delay_s: float = 0.0,
        **model: Any,
    ) -> None:
        unknown = sorted(set(model) - set(SyntheticModel.__dataclass_fields__))
        if unknown:
            raise ConfigError(f"synthetic backend: unknown option(s) {unknown}")
        self.model = SyntheticModel(**model)
        self.seed = int(seed)
        self.clock = VirtualClock()
        self._last: Hashable | None = None
        self._since_switch = 0
        self._since_g_change = 0
        self._steps = 0
        self._fail_at = fail_at
        self._nan_at = nan_at
        self._real_delay_s = float(real_delay_s)
        self.last_throttled = False
        self._idle = True  # the device has nothing queued: the next step pays the launch gap
        self._clock_state = 1.0  # the SM clock relative to the native cell's (clock_tau_steps)
        self.begin(0)

    def begin(self, round_index: int) -> None:
        """A process starting at ``round_index`` draws its own noise, capture and process shifts
        (reproducible from the seed and the round, so a resumed pass is a new process, not a replay
        of the first one)."""
        start = [self.seed] if round_index == 0 else [self.seed, 1_000_003 + round_index]
        self._rng = np.random.default_rng(start)
        # Separate streams, so simulating a process or a capture shift leaves the noise unchanged.
        self._capture_rng = np.random.default_rng([*start, 1])
        self.process_factor = math.exp(
            float(np.random.default_rng([*start, 2]).normal(0.0, self.model.process_rel))
        )
        # A process starts an epoch: its common shift, and no cell captured in it yet.
        self._common_rng = np.random.default_rng([*start, 3])
        self._wander_rng = np.random.default_rng([*start, 4])
        self._wander = float(self._wander_rng.normal(0.0, self.model.wander_rel))  # stationary at start
        self._wander_at = self.clock()
        self._new_epoch()
        self._previous_g: int | None = None

    def _new_epoch(self) -> None:
        self._epoch_cells: set[Hashable] = set()
        self._common_factor = math.exp(float(self._common_rng.normal(0.0, self.model.common_shift_rel)))

    def _capture_factor(self, cell: Hashable) -> float:
        """The shift a capture of ``cell`` draws: its own (``capture_rel`` and ``epoch_shift_rel``)
        times the epoch's common shift; a cell captured twice in one epoch starts the next."""
        if cell in self._epoch_cells:
            self._new_epoch()
        self._epoch_cells.add(cell)
        m = self.model
        sd = math.hypot(m.capture_rel, m.epoch_shift_rel)
        if m.heavy_shift_rel and isinstance(cell, CellSpec) and cell.graph_batch_size >= m.heavy_from_g:
            sd = math.hypot(sd, m.heavy_shift_rel)
        return math.exp(float(self._capture_rng.normal(0.0, sd))) * self._common_factor

    @property
    def last_cell(self) -> Hashable | None:
        """The cell of the last step run."""
        return self._last

    def clock_state(self) -> float:
        """The SM clock now, relative to the native cell's: the last cell's settled clock, or with
        ``clock_tau_steps`` where the GPU's clock has got to (module docstring)."""
        if self.model.clock_tau_steps > 0.0:
            return self._clock_state
        return self.model.clock_rel(self._last)

    def drift(self) -> float:
        """Relative drift now, in [-1, 1] (scaled by ``drift_rel`` in the model)."""
        return math.sin(2 * math.pi * self.clock() / self.model.drift_period_s)

    def run(self, cell: Hashable, expected_ms: float) -> None:
        """Advance the clock by one modelled step of ``cell``.

        Raises:
            RuntimeError: at step ``fail_at`` (simulated device loss).
        """
        self._steps += 1
        if self._real_delay_s:
            time.sleep(self._real_delay_s)
        if self._fail_at is not None and self._steps >= self._fail_at:
            raise RuntimeError(f"synthetic device lost at step {self._steps}")
        if self._nan_at is not None and self._steps >= self._nan_at:
            self.clock.advance(math.nan)
            return
        m = self.model
        g = cell.graph_batch_size if isinstance(cell, CellSpec) else None
        if cell != self._last:
            last_g = self._last.graph_batch_size if isinstance(self._last, CellSpec) else None
            if g != last_g:  # the carry-over is the G's: it decays over the steps since G changed
                self._previous_g, self._since_g_change = last_g, 0
            self._last, self._since_switch = cell, 0
        cold = m.cold_penalty_rel * math.exp(-self._since_switch / max(m.cold_decay_steps, 1e-9))
        carry = 0.0
        if g is not None and self._previous_g is not None and self._previous_g > g:
            carry = m.carryover_rel * math.exp(-self._since_g_change / m.carryover_decay_steps)
        self._since_switch += 1
        self._since_g_change += 1
        factor = (1.0 + m.drift_rel * self.drift() + cold) * (1.0 + carry)
        factor *= math.exp(self._rng.normal(0.0, m.noise_rel))
        if self._rng.random() < m.outlier_prob:
            factor *= 1.0 + self._rng.uniform(0.2, 1.0)
        self.last_throttled = bool(self._rng.random() < m.throttle_prob)
        if self.last_throttled:
            factor *= 1.0 + m.throttle_slowdown_rel
        if m.power_capped:
            factor *= 1.0 + m.power_cap_slowdown_rel
        if m.wander_rel > 0.0:
            factor *= math.exp(self._wander_now())
        if m.clock_tau_steps > 0.0:
            factor /= self._clock_state
            target = m.clock_rel(cell)
            self._clock_state += (target - self._clock_state) * -math.expm1(-1.0 / m.clock_tau_steps)
        gap = m.launch_gap_ms if self._idle else 0.0
        self._idle = False
        self.clock.advance((expected_ms * factor + gap) / 1000.0)

    def _wander_now(self) -> float:
        """The clock wander at the virtual time now (``wander_rel``): the process moved on from
        its last value by the time since, exactly (an Ornstein-Uhlenbeck step)."""
        m = self.model
        now = self.clock()
        keep = math.exp(-max(now - self._wander_at, 0.0) / m.wander_tau_s)
        fresh = math.sqrt(max(1.0 - keep * keep, 0.0)) * m.wander_rel
        self._wander = keep * self._wander + fresh * float(self._wander_rng.standard_normal())
        self._wander_at = now
        return self._wander

    def _wait_idle(self) -> None:
        """The timer waited for the device: nothing is queued any more."""
        self._idle = True

    def prepare(self, cell: CellSpec) -> Step:
        """A step that advances the virtual clock by the modelled time (a fresh capture shift)."""
        bias = 1.0 - self.model.capture_bias_rel if cell.kind in (CellKind.COMPACT, CellKind.CONTROL) else 1.0
        return _SyntheticStep(self, cell, self.model.expected_ms(cell) * bias, self._capture_factor(cell))

    def prepare_mixed(self, shape: MixedShape) -> Step:
        """A mixed step on the virtual clock (see the module docstring)."""
        return _SyntheticStep(self, shape, self.model.mixed_expected_ms(shape), self._capture_factor(shape))

    def check_mixed(self, native: MixedShape, candidate: MixedShape) -> OutputCheck:
        """Nothing runs, so nothing can disagree: every verified generation row counts as checked."""
        return OutputCheck(
            sum(candidate.generation_rows), 0, "synthetic: no forward runs; nothing was compared"
        )

    def timer(self) -> Timer:
        """A host timer on the virtual clock; its waits leave the device idle (``launch_gap_ms``)."""
        return HostTimer(clock=self.clock, sync=self._wait_idle)

    def telemetry(self) -> Telemetry:
        """Synthetic readings that report throttling when the model throttled."""
        return _SyntheticTelemetry(self)

    def describe(self) -> dict[str, Any]:
        """Name, seed and model parameters."""
        return {"name": self.name, "seed": self.seed, "model": asdict(self.model)}

    def fingerprint_fields(self) -> dict[str, Any]:
        """``gpu`` = ``synthetic``."""
        return {"gpu": "synthetic"}
