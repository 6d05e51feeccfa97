"""The outcome of every statistical decision: ``Decision(status, reason)`` (STYLE rule 11).

One type for sweep stopping, drift checks, cell selection, the replayed gain and the admission
gain test. ``status`` has four values so that uncertainty is never quietly turned into a yes or a
no: only the caller decides what ``UNDECIDED`` means (measure more, or fall back), and ``UNKNOWN``
marks input that cannot carry a decision at all.

Imports nothing of ours, like ``errors``: every layer may use it.

Example:
    >>> from dspark_calibrate.decision import Decision, Status
    >>> d = Decision(Status.UNDECIDED, "ci_straddles_zero", "gain +1.0%, 95% CI [-0.5%, +2.5%]")
    >>> d.stops
    False
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Decision", "Status"]


class Status(enum.StrEnum):
    """Outcome of a statistical decision."""

    ACCEPT = "ACCEPT"
    REJECT = "REJECT"
    UNDECIDED = "UNDECIDED"  # the evidence does not settle it yet (e.g. an interval straddles the bar)
    UNKNOWN = "UNKNOWN"  # unusable input: NaN, non-positive values, too few samples, nothing given


@dataclass(frozen=True, slots=True)
class Decision:
    """A statistical decision with its reason.

    Attributes:
        status: ACCEPT / REJECT / UNDECIDED / UNKNOWN.
        reason: a stable short code, e.g. a sweep :class:`StopReason` value, ``too_few_samples``,
            ``non_finite``, ``gain_proven`` or ``no_drain_guard``; tests and tools match on it.
        detail: one human-readable line; its wording may change.
    """

    status: Status
    reason: str
    detail: str = ""

    @property
    def stops(self) -> bool:
        """True when the status is final (ACCEPT or REJECT): a sweep stops measuring the cell."""
        return self.status in (Status.ACCEPT, Status.REJECT)
