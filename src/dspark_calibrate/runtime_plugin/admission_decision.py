"""The admission decision: what the engine should run and why, as one frozen record. No I/O.

:func:`~dspark_calibrate.runtime_plugin.admission.admit` returns it; engine adapters
(:mod:`.engine`, :mod:`.trtllm`) and rank agreement (:mod:`.ranks`) consume it, so it lives below
all of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import dspark_calibrate
from dspark_calibrate.artifacts import Finding, Fingerprint, Reason, canonical_json, sha256_hex
from dspark_calibrate.runtime_plugin.economics import AdmissionEconomics
from dspark_calibrate.runtime_plugin.sentinel import SentinelReport

if TYPE_CHECKING:
    from dspark_calibrate.artifacts import BundleReport, MixedReport, VerifiedArtifact
    from dspark_calibrate.runtime_plugin.mixed import MixedCostTable

__all__ = ["STATIC_ENGINE_CONFIG", "AdmissionDecision", "MixedAdmission"]

#: Engine configuration of every inactive decision: static K, nothing else.
STATIC_ENGINE_CONFIG: Mapping[str, Any] = MappingProxyType({"enable_confidence_scheduling": False})


def _plain(obj: Any) -> Any:
    """Read-only containers → JSON-ready ones."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return [_plain(v) for v in obj]
    return obj


@dataclass(frozen=True, slots=True)
class MixedAdmission:
    """Whether mixed prefill+decode steps may run compact, decided apart from decode (DESIGN §10).

    Inactive mixed evidence leaves mixed steps native; it never turns off an admitted decode
    policy. An inactive decode decision clears it.

    Attributes:
        active: mixed steps may use the deployed mixed cells.
        reason_code: ``OK``, or why not (e.g. ``BUNDLE_MEMBER_MISSING:mixed``, ``GAIN_NOT_PROVEN:mixed``).
        message: one human line.
        findings: every finding of the failing check.
        cells: deployed mixed cells when active.
        version: the mixed manifest's version.
        allow_synthetic: the policy accepted synthetic evidence (the export needs to know).
        table: the runtime's mixed cost table when active (not part of equality).
        report: the verification report (not part of equality).
    """

    active: bool
    reason_code: str
    message: str
    findings: tuple[Finding, ...] = ()
    cells: int = 0
    version: int | None = None
    allow_synthetic: bool = False
    table: MixedCostTable | None = field(default=None, repr=False, compare=False)
    report: MixedReport | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "active": self.active,
            "reason_code": self.reason_code,
            "message": self.message,
            "cells": self.cells,
            "version": self.version,
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """What the engine should run, and why.

    Attributes:
        active: dynamic verification may be enabled; False means static K.
        reason: the first reason (``Reason.OK`` when active).
        reason_code: the reason with its field, e.g. ``FINGERPRINT_MISMATCH:gpu``.
        message: one human line naming the file, the field and the fix.
        findings: every finding of the failing step, in pipeline order.
        cost_table, calibration, admission: the verified members (read-only), when they verified.
        economics: the admission artifact's economics, when parsed.
        engine_config: engine-neutral fields to hand the engine (:data:`STATIC_ENGINE_CONFIG` when
            inactive); adapters such as ``trtllm.decoding_fields`` translate them.
        timings_ms: per-check wall time in ms (``total`` included).
        bundle_path: the bundle directory or manifest given.
        bundle_sha256: SHA-256 of the manifest file's bytes (``bundle.dsse.json``), when readable.
        bundle_version: the verified manifest's version.
        trust_root_version, trust_root_sha256: the trust root used.
        live_fingerprint: the live fingerprint bound against.
        sentinel: the sentinel's report, when it ran.
        decided_at: the ``now`` of the decision.
        bundle_report: the full verification report (for exporters; not part of equality).
        mixed: the mixed prefill+decode decision (None: not decided, e.g. decode failed first).
    """

    active: bool
    reason: Reason
    reason_code: str
    message: str
    findings: tuple[Finding, ...] = ()
    cost_table: VerifiedArtifact | None = None
    calibration: VerifiedArtifact | None = None
    admission: VerifiedArtifact | None = None
    economics: AdmissionEconomics | None = None
    engine_config: Mapping[str, Any] = field(default_factory=lambda: STATIC_ENGINE_CONFIG)
    timings_ms: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    bundle_path: Path | None = None
    bundle_sha256: str | None = None
    bundle_version: int | None = None
    trust_root_version: int | None = None
    trust_root_sha256: str | None = None
    live_fingerprint: Fingerprint | None = None
    sentinel: SentinelReport | None = None
    decided_at: datetime | None = None
    bundle_report: BundleReport | None = field(default=None, repr=False, compare=False)
    mixed: MixedAdmission | None = None

    def __bool__(self) -> bool:
        return self.active

    @property
    def members(self) -> Mapping[str, VerifiedArtifact]:
        """The verified members by kind."""
        out = {
            k: a
            for k, a in (
                ("cost-table", self.cost_table),
                ("calibration", self.calibration),
                ("admission", self.admission),
            )
            if a is not None
        }
        return MappingProxyType(out)

    def agreement_digest(self) -> str:
        """SHA-256 of what the engine will do: active or not, its configuration, the bundle when active.

        Ranks compare this (``ranks.agree``); inactive decisions digest equal whatever their reason.
        """
        body = {
            "active": self.active,
            "engine_config": _plain(self.engine_config),
            "bundle_sha256": self.bundle_sha256 if self.active else None,
        }
        return sha256_hex(canonical_json(body))

    def fallback(self, finding: Finding) -> AdmissionDecision:
        """This decision made inactive for ``finding`` (members kept for diagnostics)."""
        return replace(
            self,
            active=False,
            reason=finding.reason,
            reason_code=finding.code,
            message=finding.message,
            findings=(finding,),
            engine_config=STATIC_ENGINE_CONFIG,
            mixed=None
            if self.mixed is None
            else replace(
                self.mixed,
                active=False,
                reason_code=finding.code,
                message=f"decode scheduling is off ({finding.code}); mixed evidence is cleared with it",
                table=None,
            ),
        )

    def with_timing(self, name: str, seconds: float) -> AdmissionDecision:
        """A copy with one more timing entry (ms)."""
        timings = dict(self.timings_ms)
        timings[name] = round(seconds * 1e3, 4)
        return replace(self, timings_ms=MappingProxyType(timings))

    def log_record(self) -> dict[str, Any]:
        """The structured fields of the decision's log line and metrics callback (JSON-ready)."""
        return {
            "event": "dspark.admission",
            "active": self.active,
            "reason_code": self.reason_code,
            "message": self.message,
            "bundle": str(self.bundle_path) if self.bundle_path is not None else None,
            "bundle_sha256": self.bundle_sha256,
            "bundle_version": self.bundle_version,
            "member_versions": {k: a.version for k, a in sorted(self.members.items())},
            "member_sha256": {k: a.logical_sha256 for k, a in sorted(self.members.items())},
            "trust_root_version": self.trust_root_version,
            "trust_root_sha256": self.trust_root_sha256,
            "tool_version": dspark_calibrate.__version__,
            "timings_ms": {k: v for k, v in self.timings_ms.items() if "." not in k},
            "sentinel_cost_ms": round(self.sentinel.cost_s * 1e3, 3) if self.sentinel is not None else None,
            "decided_at": self.decided_at.isoformat() if self.decided_at is not None else None,
            "mixed": None
            if self.mixed is None
            else {
                "active": self.mixed.active,
                "reason_code": self.mixed.reason_code,
                "cells": self.mixed.cells,
            },
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for ``--json`` and reports)."""
        return {
            **self.log_record(),
            "timings_ms": dict(self.timings_ms),
            "findings": [f.to_dict() for f in self.findings],
            "engine_config": _plain(self.engine_config),
            "economics": self.economics.to_dict() if self.economics is not None else None,
            "live_fingerprint": self.live_fingerprint.to_dict()
            if self.live_fingerprint is not None
            else None,
            "sentinel": self.sentinel.to_dict() if self.sentinel is not None else None,
            "mixed": self.mixed.to_dict() if self.mixed is not None else None,
        }
