"""The package's exception hierarchy, split by who is at fault (STYLE rule 7).

Imports nothing of ours. Misuse of the API (calls out of order, wrong types) raises the
built-in ``RuntimeError``/``TypeError`` instead of these.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ArtifactRejected",
    "ConfigError",
    "DsparkError",
    "MeasurementError",
    "ProbeError",
]


class DsparkError(Exception):
    """Base class of every error this package raises on purpose."""


class ArtifactRejected(DsparkError):
    """The evidence is bad: an artifact failed verification.

    Attributes:
        report: the ``VerificationReport`` that explains the rejection (typed as ``Any`` so that
            this module imports nothing of ours).
    """

    def __init__(self, report: Any, message: str | None = None) -> None:
        self.report = report
        super().__init__(message if message is not None else str(report))


class ProbeError(DsparkError):
    """The live environment (GPU, NVML, source tree, engine) could not be read."""


class MeasurementError(DsparkError):
    """A sweep or a backend produced unusable data (non-finite times, a vanished GPU, ...)."""


class ConfigError(DsparkError):
    """Bad user input: a file, field or flag that is wrong. The message names it and the fix."""
