"""The package's exception hierarchy, split by who is at fault (STYLE rule 7).

Imports nothing of ours. Every error this package raises on purpose derives from
:class:`DsparkError` and carries a stable :attr:`~DsparkError.code` for machines (``--json``,
logs, tests); the message is for people and may change. Misuse of the API (calls out of order,
wrong types) raises the built-in ``RuntimeError``/``TypeError`` instead of these.

    DsparkError
    ├── ArtifactRejected    the evidence is bad (a failed verification)
    ├── ProbeError          the live environment could not be read
    ├── MeasurementError    a sweep or a backend produced unusable data
    ├── ConfigError         bad user input: a file, field or flag
    └── InvalidValueError   a value this package cannot take (also a ValueError)
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "ArtifactRejected",
    "ConfigError",
    "DsparkError",
    "InvalidValueError",
    "MeasurementError",
    "ProbeError",
]


class DsparkError(Exception):
    """Base class of every error this package raises on purpose.

    Attributes:
        default_code: the code of this class of error; subclasses name their own.
    """

    default_code: ClassVar[str] = "DSPARK_ERROR"

    @property
    def code(self) -> str:
        """A stable reason code: the instance's ``reason`` (a ``Reason`` value) when it carries
        one, as verification, trust-root, envelope and state errors do; else the class's code."""
        reason = getattr(self, "reason", None)
        value = getattr(reason, "value", reason)
        return value if isinstance(value, str) else self.default_code


class ArtifactRejected(DsparkError):
    """The evidence is bad: an artifact failed verification.

    Attributes:
        report: the ``VerificationReport`` that explains the rejection (typed as ``Any`` so that
            this module imports nothing of ours); its first reason is the error's code.
    """

    default_code = "ARTIFACT_REJECTED"

    def __init__(self, report: Any, message: str | None = None) -> None:
        self.report = report
        super().__init__(message if message is not None else str(report))

    @property
    def reason(self) -> Any:
        """The report's first reason, when it has one (a report, or a sequence of findings)."""
        reason = getattr(self.report, "reason", None)
        if reason is None and isinstance(self.report, (tuple, list)) and self.report:
            reason = getattr(self.report[0], "reason", None)
        return reason


class ProbeError(DsparkError):
    """The live environment (GPU, NVML, source tree, engine) could not be read."""

    default_code = "PROBE_ERROR"


class MeasurementError(DsparkError):
    """A sweep or a backend produced unusable data (non-finite times, a vanished GPU, ...)."""

    default_code = "MEASUREMENT_ERROR"


class ConfigError(DsparkError):
    """Bad user input: a file, field or flag that is wrong. The message names it and the fix."""

    default_code = "CONFIG_ERROR"


class InvalidValueError(DsparkError, ValueError):
    """A value this package cannot take: a malformed encoding, an impossible model field, an
    argument out of range. The message names the value and what is allowed.

    Also a ``ValueError``, deliberately: Python code expects a bad value to raise one, earlier
    releases of this package raised plain ``ValueError`` here (``ModelError``, ``JsonError``,
    ``LogicalHashError`` and ``SchemaMismatch`` were ``ValueError`` subclasses), and callers catch it.
    """

    default_code = "INVALID_VALUE"
