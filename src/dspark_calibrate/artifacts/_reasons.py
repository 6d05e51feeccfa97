"""Stable reason codes and findings of the verification pipeline (DESIGN §4, STYLE rule 5).

Reason values are part of the artifact contract: add new ones, never rename or reuse one.
Performs no I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = ["Finding", "FindingsOutcome", "Reason"]


class Reason(str, enum.Enum):
    """Why an artifact, a bundle or an admission was rejected (or ``OK``)."""

    OK = "OK"
    # (1) reading: files and envelopes
    IO_ERROR = "IO_ERROR"
    NOT_PARQUET = "NOT_PARQUET"
    FOOTER_TOO_LARGE = "FOOTER_TOO_LARGE"
    METADATA_INVALID = "METADATA_INVALID"
    ENVELOPE_MISSING = "ENVELOPE_MISSING"
    ENVELOPE_TOO_LARGE = "ENVELOPE_TOO_LARGE"
    ENVELOPE_INVALID = "ENVELOPE_INVALID"
    ENVELOPE_CONFLICT = "ENVELOPE_CONFLICT"
    # (2) signatures
    SIGNATURE_MISSING = "SIGNATURE_MISSING"
    SIGNATURE_INVALID = "SIGNATURE_INVALID"
    SIGNATURE_THRESHOLD = "SIGNATURE_THRESHOLD"
    # (3) payload
    PAYLOAD_TYPE_MISMATCH = "PAYLOAD_TYPE_MISMATCH"
    PAYLOAD_INVALID = "PAYLOAD_INVALID"
    # (4) statement and predicate
    STATEMENT_TYPE_MISMATCH = "STATEMENT_TYPE_MISMATCH"
    PREDICATE_TYPE_MISMATCH = "PREDICATE_TYPE_MISMATCH"
    SCHEMA_VERSION_UNSUPPORTED = "SCHEMA_VERSION_UNSUPPORTED"
    KIND_MISMATCH = "KIND_MISMATCH"
    PREDICATE_INVALID = "PREDICATE_INVALID"
    SUBJECT_INVALID = "SUBJECT_INVALID"
    # (5) table
    TABLE_TOO_LARGE = "TABLE_TOO_LARGE"
    SCHEMA_MISMATCH = "SCHEMA_MISMATCH"
    LOGICAL_HASH_MISMATCH = "LOGICAL_HASH_MISMATCH"
    # (6) freshness
    EXPIRED = "EXPIRED"
    NOT_YET_VALID = "NOT_YET_VALID"
    ROLLBACK = "ROLLBACK"
    STATE_LOCKED = "STATE_LOCKED"
    STATE_UNWRITABLE = "STATE_UNWRITABLE"
    STATE_CORRUPT = "STATE_CORRUPT"
    STATE_INSECURE = "STATE_INSECURE"
    # (7) binding
    FINGERPRINT_MISMATCH = "FINGERPRINT_MISMATCH"
    FINGERPRINT_MISSING = "FINGERPRINT_MISSING"
    # (8) content
    CONTENT_INVALID = "CONTENT_INVALID"
    NATIVE_CELL_MISSING = "NATIVE_CELL_MISSING"
    K_INCONSISTENT = "K_INCONSISTENT"
    SYNTHETIC_REFUSED = "SYNTHETIC_REFUSED"
    MIXED_GEOMETRY_INVALID = "MIXED_GEOMETRY_INVALID"
    # Not a rejection: the bundle was built without mixed evidence, so mixed steps run native.
    MIXED_ABSENT = "MIXED_ABSENT"
    # trust root
    TRUST_ROOT_INVALID = "TRUST_ROOT_INVALID"
    TRUST_ROOT_EXPIRED = "TRUST_ROOT_EXPIRED"
    TRUST_ROOT_ROTATION_INVALID = "TRUST_ROOT_ROTATION_INVALID"
    TRUST_ROOT_ROLLBACK = "TRUST_ROOT_ROLLBACK"
    # bundles and admission
    BUNDLE_INVALID = "BUNDLE_INVALID"
    BUNDLE_MEMBER_MISSING = "BUNDLE_MEMBER_MISSING"
    BUNDLE_MEMBER_MISMATCH = "BUNDLE_MEMBER_MISMATCH"
    CROSS_MEMBER_MISMATCH = "CROSS_MEMBER_MISMATCH"
    GAIN_NOT_PROVEN = "GAIN_NOT_PROVEN"
    LIVE_PROBE_FAILED = "LIVE_PROBE_FAILED"
    SENTINEL_FAILED = "SENTINEL_FAILED"
    BACKEND_IMPORT_ERROR = "BACKEND_IMPORT_ERROR"
    RANK_DISAGREEMENT = "RANK_DISAGREEMENT"
    INTERNAL_ERROR = "INTERNAL_ERROR"
    METADATA_MISMATCH = "METADATA_MISMATCH"
    # runtime adapters
    EXPORT_FAILED = "EXPORT_FAILED"
    CONFIG_INVALID = "CONFIG_INVALID"
    PLANNER_FALLBACK = "PLANNER_FALLBACK"  # the device planner cannot run; the host planner does


@dataclass(frozen=True, slots=True)
class Finding:
    """One reason an input was rejected, with enough detail to fix it.

    Attributes:
        reason: the stable code.
        message: one human line naming the file, the field, expected vs actual, and the fix.
        field: the field concerned (rendered as ``REASON:field``), if any.
        expected: the expected value, if one applies.
        actual: the value found, if one applies.
    """

    reason: Reason
    message: str
    field: str | None = None
    expected: Any = None
    actual: Any = None

    @property
    def code(self) -> str:
        """The reason code with its field, e.g. ``FINGERPRINT_MISMATCH:gpu``."""
        return f"{self.reason.value}:{self.field}" if self.field else self.reason.value

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (expected/actual kept as given; callers keep them JSON-safe)."""
        return {
            "code": self.code,
            "reason": self.reason.value,
            "field": self.field,
            "message": self.message,
            "expected": self.expected,
            "actual": self.actual,
        }


class FindingsOutcome:
    """Shared surface of reports that hold ``findings`` in pipeline order (artifact and bundle).

    Subclasses are dataclasses with a ``findings: tuple[Finding, ...]`` field; the first finding is
    the earliest failing step and names the outcome.
    """

    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not self.findings

    def __bool__(self) -> bool:
        return self.ok

    @property
    def reason(self) -> Reason:
        """The first (earliest-step) reason, or ``Reason.OK``."""
        return self.findings[0].reason if self.findings else Reason.OK

    @property
    def code(self) -> str:
        """The first finding's code (``REASON:field``), or ``OK``."""
        return self.findings[0].code if self.findings else Reason.OK.value
