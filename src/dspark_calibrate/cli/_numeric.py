"""Numeric option values checked while the command line is parsed: a bad one exits 2 before the
command reads a file, admits anything or writes anything.

Python turns ``nan``, ``inf`` and ``1e308`` into floats without complaint, and date arithmetic on
huge counts overflows with a bare ``OverflowError`` deep inside a command (a traceback, exit 1,
and under ``dspark-verify --fail-open-to-static`` no options written). The callbacks here are
attached to the options (``callback=``) so the values are refused as usage errors, naming the
option, the value and the range.
"""

from __future__ import annotations

import math

import typer

from dspark_calibrate.cli._common import MAX_EXPIRY, parse_expiry, utcnow
from dspark_calibrate.errors import ConfigError

__all__ = ["MAX_AGE_DAYS", "check_expires", "check_max_age_days"]

#: Largest ``--max-age-days``, in days: a century (the clock arithmetic that applies it overflows
#: near 2.9 million days, and no evidence policy looks back further than its signing keys live).
MAX_AGE_DAYS = float(MAX_EXPIRY.days)


def check_max_age_days(value: float | None) -> float | None:
    """``--max-age-days``: a finite number of days in (0, :data:`MAX_AGE_DAYS`].

    Raises:
        typer.BadParameter: NaN, infinite, not positive or too large (exit 2).
    """
    if value is None:
        return None
    if not math.isfinite(value) or not 0 < value <= MAX_AGE_DAYS:
        raise typer.BadParameter(
            f"{value!r} is not a number of days in (0, {MAX_AGE_DAYS:g}]; give the largest acceptable "
            "age, e.g. 30"
        )
    return value


def check_expires(value: str) -> str:
    """``--expires``: a duration or an ISO-8601 time, in the future and at most
    :data:`~dspark_calibrate.cli._common.MAX_EXPIRY` ahead (the command parses it again against
    its own clock reading).

    Raises:
        typer.BadParameter: not a duration or a time, in the past, or too far ahead (exit 2).
    """
    try:
        parse_expiry(value, now=utcnow())
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    return value
