"""The load regime a workload was served in, and the objective the gain is stated for (DESIGN §9).

A saturated engine (requests wait for a slot) turns a saved millisecond into tokens per second,
and a token the policy did not emit costs serving time later: the gain is a throughput gain with
lost tokens priced. An arrival-bound engine (free slots, arrivals set how many steps run) turns a
saved millisecond into a shorter step at the same throughput, and a request cut short finishes
inside steps that run anyway: the gain is a latency gain (per-step time at the recorded arrivals),
with no token-loss price.

The workload carries what decides it: the requests waiting for a slot at every step (workload
schema v2 ``waiting``). A step is saturated when a request waits, or when no request is still to
arrive (the drain of a closed batch: the run ends when its last request does, so a lost token
lengthens the run). Without it the regime is declared (``--regime``) or assumed saturated,
the choice that prices lost tokens and so never overstates a gain; either way the build says which
and why. Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from dspark_calibrate.errors import ConfigError

__all__ = [
    "SATURATED_STEP_SHARE",
    "Objective",
    "Regime",
    "RegimeFinding",
    "infer_regime",
]

#: A workload whose steps had requests waiting for a slot on at least this share of its steps is
#: saturated: most of the time a token not emitted now delays a waiting request.
SATURATED_STEP_SHARE = 0.5


class Regime(str, Enum):
    """What sets how many steps a run takes."""

    SATURATED = "saturated"
    ARRIVAL_BOUND = "arrival-bound"

    @property
    def default_objective(self) -> Objective:
        """Throughput where requests wait; latency where arrivals set the pace."""
        return Objective.THROUGHPUT if self is Regime.SATURATED else Objective.LATENCY


class Objective(str, Enum):
    """What the predicted gain (and the gate) measures."""

    THROUGHPUT = "throughput"  # tokens per GPU-second, lost tokens priced
    LATENCY = "latency"  # per-step time at the recorded arrivals, no token-loss price


@dataclass(frozen=True, slots=True)
class RegimeFinding:
    """The regime and objective a build states, and why.

    Attributes:
        regime: the load regime the prediction assumes.
        objective: the gain the gate tests.
        source: one sentence: recorded, declared or assumed, with the numbers.
        saturated_share: share of steps with requests waiting (None when not recorded).
        assumed: neither recorded nor declared (the build says so loudly).
    """

    regime: Regime
    objective: Objective
    source: str
    saturated_share: float | None
    assumed: bool

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "regime": self.regime.value,
            "objective": self.objective.value,
            "source": self.source,
            "saturated_share": self.saturated_share,
            "assumed": self.assumed,
        }


def _parse(value: str | Regime | Objective | None, kind: type[Regime] | type[Objective]) -> str | None:
    if value is None:
        return None
    text = value.value if isinstance(value, Enum) else str(value)
    allowed = [m.value for m in kind]
    if text not in allowed:
        flag = "--regime" if kind is Regime else "--objective"
        raise ConfigError(f"{flag} {text!r} is not one of {allowed}")
    return text


def infer_regime(
    waiting: np.ndarray,
    *,
    drain: np.ndarray | None = None,
    declared: str | Regime | None = None,
    objective: str | Objective | None = None,
) -> RegimeFinding:
    """The regime from the recorded queue depth per step, or the declared one, and the objective.

    Args:
        waiting: (S,) requests waiting for a slot at each step, NaN where not recorded.
        drain: (S,) the steps after the last request arrived (``StepValues.drain``); they count
            as saturated.
        declared: ``--regime`` (overrides the recording; a disagreement is stated).
        objective: ``--objective`` (default: the regime's own).

    Raises:
        ConfigError: an unknown regime or objective name.
    """
    declared_text = _parse(declared, Regime)
    objective_text = _parse(objective, Objective)
    w = np.asarray(waiting, dtype=np.float64)
    recorded = bool(w.size) and bool(np.isfinite(w).all())
    busy = w > 0
    if drain is not None and recorded:
        busy = busy | np.asarray(drain, dtype=bool)
    share = float(np.mean(busy)) if recorded else None
    measured = None
    if share is not None:
        measured = Regime.SATURATED if share >= SATURATED_STEP_SHARE else Regime.ARRIVAL_BOUND
    evidence = (
        f"requests waited for a slot, or none was still to arrive, on {share:.0%} of {w.size} recorded steps "
        f"(saturated at >= {SATURATED_STEP_SHARE:.0%})"
        if share is not None and math.isfinite(share)
        else "the workload records no queue depth"
    )
    if declared_text is not None:
        regime = Regime(declared_text)
        source = f"declared (--regime {regime.value}); {evidence}"
        if measured is not None and measured is not regime:
            source += f", which says {measured.value}"
        assumed = False
    elif measured is not None:
        regime, source, assumed = measured, f"recorded: {evidence}", False
    else:
        regime = Regime.SATURATED
        source = (
            f"assumed saturated: {evidence}; lost tokens are priced, which never overstates a gain. Record "
            "the queue depth (workload column `waiting`) or pass --regime arrival-bound if arrivals set the pace"
        )
        assumed = True
    chosen = Objective(objective_text) if objective_text is not None else regime.default_objective
    if objective_text is None:
        source += f"; objective {chosen.value} (the regime's own)"
    else:
        source += f"; objective {chosen.value} (--objective)"
    return RegimeFinding(regime, chosen, source, share, assumed)

