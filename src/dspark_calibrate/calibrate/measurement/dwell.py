"""The policy's dwell: how long a serving policy stays on one cell, as ``sweep --dwell`` takes it.

Pure: text and JSON in, plain values out.

At a power cap a compact saving moves with the dwell (docs/sweep.md "The policy's dwell"): a
step right after a heavier one meets the clock that step left. A policy's dwell differs by G
(``build`` reports it per G, :func:`~dspark_calibrate.calibrate.deployment.replay.policy_dwell`),
so ``--dwell`` takes one mean run for every G or one per G:

* ``2.7``: every G in runs of 2.7 steps;
* ``8=1.4,16=2.1,32=2.6,64=2.7,128=2.9,256=3.1``: each G its own, every G of the ladder named;
* ``2.7,256=3.1``: a bare value is the dwell of every G not named.

A dwell is a float (one for every G) or a mapping of G to float; a per-G text whose values are all
equal is the float, so the two spellings of one design share a sweep digest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dspark_calibrate.errors import ConfigError

__all__ = [
    "MAX_DWELL",
    "Dwell",
    "check_dwell",
    "describe_dwell",
    "dwell_at",
    "dwell_from_json",
    "dwell_option",
    "dwell_to_json",
    "parse_dwell",
    "stay_for_dwell",
]

#: One mean run for every G, or one per G.
Dwell = float | Mapping[int, float]

#: The longest mean run ``--dwell`` accepts, in steps (a visit's timed steps per cell bound the
#: runs it can hold anyway: docs/sweep.md "Interleaved visits").
MAX_DWELL = 64.0

_HINT = "1 switches cells every step; build reports the replayed policy's per G"


def stay_for_dwell(dwell: float) -> float:
    """The stay probability whose runs last ``dwell`` steps on average: ``1 − 1/dwell`` (a
    geometric run; 1 switches every step)."""
    return 1.0 - 1.0 / dwell


def _steps(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--dwell {where}: {text!r} is not a number of steps ({_HINT})") from None
    if not (math.isfinite(value) and 1.0 <= value <= MAX_DWELL):
        raise ConfigError(f"--dwell {where}: {text!r} is not a mean run of 1..{MAX_DWELL:g} steps ({_HINT})")
    return value


def _g(text: str, ladder: Sequence[int]) -> int:
    try:
        g = int(text)
    except ValueError:
        raise ConfigError(f"--dwell: {text!r} is not a G (a graph batch size of the ladder)") from None
    if g not in ladder:
        raise ConfigError(f"--dwell: G={g} is not in the ladder {list(ladder)}; name only its G")
    return g


def parse_dwell(text: str, ladder: Sequence[int]) -> Dwell:
    """``--dwell``'s text as a dwell over ``ladder`` (module docstring for the forms).

    Raises:
        ConfigError: an empty item, a value that is not a number of steps in ``1..MAX_DWELL``, a G
            outside the ladder or named twice, two bare values, or a G left without a dwell.
    """
    default: float | None = None
    per_g: dict[int, float] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise ConfigError(f"--dwell {text!r} has an empty item; write 2.7 or 8=1.4,16=2.1,...")
        if "=" not in item:
            if default is not None:
                raise ConfigError(f"--dwell {text!r} has two bare values; give one, for the G not named")
            default = _steps(item, "the bare value")
            continue
        g_text, _, steps = item.partition("=")
        g = _g(g_text.strip(), ladder)
        if g in per_g:
            raise ConfigError(f"--dwell {text!r} names G={g} twice")
        per_g[g] = _steps(steps.strip(), f"G={g}")
    missing = [g for g in ladder if g not in per_g]
    if missing and default is None:
        raise ConfigError(
            f"--dwell {text!r} gives no dwell for G={missing}; name them or add a bare value for the rest"
        )
    full = {g: per_g.get(g, default) for g in ladder}
    values = set(full.values())
    if len(values) == 1:
        (only,) = values
        assert only is not None
        return only
    return {g: float(v) for g, v in full.items() if v is not None}


def check_dwell(dwell: Dwell | None, *, interleave: bool, ladder: Sequence[int] = ()) -> None:
    """Refuse a dwell given without ``--interleave`` (the only visits that alternate cells), a
    value outside ``1..MAX_DWELL``, or, where ``ladder`` is given, a per-G dwell that does not
    name exactly its G.

    Raises:
        ConfigError: naming ``--dwell`` and the fix.
    """
    if dwell is None:
        return
    if not interleave:
        raise ConfigError("--dwell sets how long an interleaved visit stays on a cell; add --interleave")
    values = dwell.items() if isinstance(dwell, Mapping) else [(None, dwell)]
    for g, value in values:
        if not (isinstance(value, int | float) and math.isfinite(value) and 1.0 <= value <= MAX_DWELL):
            where = "" if g is None else f" at G={g}"
            raise ConfigError(f"--dwell {value!r}{where} is not a mean run of 1..{MAX_DWELL:g} steps ({_HINT})")
    if isinstance(dwell, Mapping) and ladder and sorted(dwell) != sorted(ladder):
        raise ConfigError(f"--dwell names G={sorted(dwell)}, the ladder has {sorted(ladder)}; name each G once")


def dwell_at(dwell: Dwell, g: int) -> float:
    """The mean run at ``g``."""
    return float(dwell[g]) if isinstance(dwell, Mapping) else float(dwell)


def dwell_to_json(dwell: Dwell) -> float | dict[str, float]:
    """The JSON form: the float, or ``{"G": steps}`` in ladder order."""
    if isinstance(dwell, Mapping):
        return {str(g): float(dwell[g]) for g in sorted(dwell)}
    return float(dwell)


def dwell_from_json(value: Any) -> Dwell | None:
    """A dwell from its JSON form (:func:`dwell_to_json`); None stays None.

    Raises:
        ValueError, TypeError: a value that is neither form.
    """
    if value is None:
        return None
    if isinstance(value, Mapping):
        return {int(g): float(v) for g, v in value.items()}
    return float(value)


def dwell_option(default: float, per_g: Mapping[int, float] | None = None) -> str:
    """The ``--dwell`` text that asks for ``default`` at every G but those in ``per_g`` (what a
    note tells a user to sweep at): ``2.7`` or ``2.7,8=1.9,256=3.1``."""
    parts = [f"{default:.2g}"] + [f"{g}={d:.2g}" for g, d in sorted((per_g or {}).items())]
    return ",".join(parts)


def describe_dwell(dwell: Dwell | Mapping[str, float]) -> str:
    """A dwell for a summary line: ``2.7 steps`` or ``G8 1.4, G256 3.1 steps``."""
    if isinstance(dwell, Mapping):
        parts = ", ".join(f"G{g} {float(v):g}" for g, v in sorted(dwell.items(), key=lambda x: int(x[0])))
        return f"{parts} steps"
    return f"{float(dwell):g} steps"
