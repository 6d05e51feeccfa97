"""The runtime admission hook: activate dynamic verification only on authenticated, bound, fresh
evidence, and fall back to static K on any doubt (DESIGN §4–§6, STYLE rule 13).

``admit(bundle, trust_root, ...)`` runs in the serving process (or just before it starts) and
returns an :class:`AdmissionDecision`; it never raises. Checks, in order:

    (1) trust root: ``root.json`` read and verified by ``artifacts.read_trust_root`` (bounded,
        regular files only; signatures, expiry), or a given ``TrustRoot`` checked for expiry; with
        a rollback state, never older than the newest root accepted before and newer only through
        a rotation chain (TUF's client rule)
    (2) live deployment: the given context, or collected by ``live.collect_live`` (explicit engine
        arguments win over probes)
    (3) the bundle, through the artifacts pipeline (``verify_bundle``): manifest and every member —
        signatures, payload, predicate, logical hash, expiry, maximum age, rollback, binding to the
        live fingerprint field by field, content, synthetic evidence — the manifest binding exactly
        these members; accepted versions are recorded in the rollback state
    (4) cross-member checks the pipeline cannot make alone: the admission artifact's cells are
        cells of the cost table, the calibration carries a finite positive STS temperature for
        every position 1..K, the cost table has a compact cell
    (5) economics: the admission artifact's signed summary is well formed and its predicted-gain
        lower bound exceeds the policy minimum (a three-way-plus-unknown test, STYLE rule 11);
        the reference selector accepts the members (drain guard, gain threshold, calibration)
    (6) sentinel (optional): re-measure a few cells live
    (7) rank agreement, when ``torch.distributed`` is initialised (``ranks.agree``)

and, once decode scheduling is admitted, apart from it, the bundle's optional mixed prefill+decode
evidence (DESIGN §10): its own manifest and members through the same pipeline (bound to the live
fingerprint and to the live body buckets and execution mode), the checks across them and the
decode members, every gate of its receipt and its economics. Invalid or missing mixed evidence
leaves mixed steps native (``decision.mixed`` says why) and never turns off the decode decision;
an inactive decode decision clears it. The mixed checks catch the failures bad evidence can cause
(the consumer's own list: I/O, type, value, key and arithmetic errors), so that only a defect of
this package, not bad mixed evidence, reaches the one fail-closed boundary.

then one structured log line and the optional metrics callback. The only broad ``except`` of the
package lives in :func:`admit`: an unexpected exception anywhere becomes an inactive decision with
``INTERNAL_ERROR`` and the exception's repr, logged once.

The decision record lives in :mod:`.admission_decision` and the economics and gain test in
:mod:`.economics` (both re-exported here), so that the engine adapters and rank agreement can use
them without importing this module.

I/O here: reading ``root.json`` (``artifacts.read_trust_root``), rotation-chain roots and the
bundle manifest's bytes (for its digest) through ``artifacts.read_regular_file`` (bounded: a FIFO
is refused, never waited on), and the clock when ``now`` is not given. Verification I/O belongs to
the artifacts pipeline; the checks in steps (4) and (5) are pure functions.
"""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from dspark_calibrate.artifacts import (
    DEFAULT_LIMITS,
    DEFAULT_STATE_LOCK_TIMEOUT_S,
    Calibration,
    Finding,
    Fingerprint,
    MixedLive,
    MixedRoute,
    ModelError,
    ReadLimits,
    Reason,
    RollbackState,
    read_regular_file,
    sha256_hex,
)
from dspark_calibrate.decision import Status
from dspark_calibrate.errors import ConfigError, DsparkError, ProbeError
from dspark_calibrate.runtime_plugin.admission_decision import (
    STATIC_ENGINE_CONFIG,
    AdmissionDecision,
    MixedAdmission,
)
from dspark_calibrate.runtime_plugin.economics import (
    ADMISSION_SUMMARY_FIELDS,
    AdmissionEconomics,
    GainStatus,
    GainVerdict,
    gain_test,
)
from dspark_calibrate.runtime_plugin.engine import planner_inputs
from dspark_calibrate.runtime_plugin.live import LiveContext, collect_live
from dspark_calibrate.runtime_plugin.mixed import MixedCostTable, MixedEconomics
from dspark_calibrate.runtime_plugin.ranks import agree
from dspark_calibrate.runtime_plugin.sentinel import SentinelPolicy, run_sentinel

if TYPE_CHECKING:
    import pyarrow as pa

    from dspark_calibrate.artifacts import BundleReport, MixedReport, TrustRoot, VerifiedArtifact

__all__ = [
    "ADMISSION_SUMMARY_FIELDS",
    "DEFAULT_MAX_ARTIFACT_AGE",
    "STATIC_ENGINE_CONFIG",
    "AdmissionDecision",
    "AdmissionEconomics",
    "AdmissionPolicy",
    "GainStatus",
    "GainVerdict",
    "LiveSpec",
    "MetricsCallback",
    "admit",
    "cross_member_findings",
    "gain_test",
]

logger = logging.getLogger(__name__)

#: Refuse evidence issued longer ago than this (strict default). Step times drift with driver and
#: firmware updates; a month is the longest we let a table stand without re-measurement, even when
#: its signed expiry is later.
DEFAULT_MAX_ARTIFACT_AGE = timedelta(days=30)
#: The required bundle members by default: the gain test needs the admission artifact.
_ALL_MEMBERS: tuple[str, ...] = ("admission", "calibration", "cost-table")

#: What ``live=`` accepts: a collected context, a fingerprint, or ``collect_live`` keyword arguments.
LiveSpec = LiveContext | Fingerprint | Mapping[str, Any] | None
#: Receives the decision's JSON-ready log record once per admission.
MetricsCallback = Callable[[Mapping[str, Any]], None]


# ---------------------------------------------------------------------------------------------
# Policy
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    """What admission demands. The defaults are strict.

    Attributes:
        allow_synthetic: accept evidence made from synthetic measurements (demos and tests only).
        max_artifact_age: refuse artifacts and manifests issued longer ago than this (``None``: only
            the signed expiry applies).
        state_path: the rollback state file (highest accepted version per series, newest trust
            root seen); ``None`` disables rollback protection, of artifacts and of the trust root.
        record_state: record accepted versions and a newer trust root in the state (off: check only).
        state_lock_timeout_s: how long recording waits for the state lock before ``STATE_LOCKED``
            (seconds; the default keeps a contended admission inside the serving path's 100 ms).
        trust_root_chain: ``root.json`` files of the versions between the newest root recorded in
            the state and the pinned one, when the pinned root skips versions (TUF rotation chain).
        required_members: bundle members that must be present (cost-table and calibration always).
        unbound_fields: fingerprint fields deliberately not compared with the live deployment.
        min_gain_lower_bound: the admission artifact's predicted-gain CI lower bound must exceed
            this (relative gain; 0.0 = "proven positive"). ``None`` skips the gain test.
        sentinel: re-measure cells live before activating; ``None`` = off.
        rank_agreement: exchange decisions across ranks when torch.distributed is initialised.
        limits: size limits for reading untrusted files.
        mixed: decide the bundle's mixed prefill+decode evidence too (off: mixed steps native).
        mixed_live: the live body buckets and execution mode mixed evidence is bound to (None:
            not established, so mixed evidence is not admitted).
    """

    allow_synthetic: bool = False
    max_artifact_age: timedelta | None = DEFAULT_MAX_ARTIFACT_AGE
    state_path: Path | None = None
    record_state: bool = True
    state_lock_timeout_s: float = DEFAULT_STATE_LOCK_TIMEOUT_S
    trust_root_chain: tuple[Path, ...] = ()
    required_members: tuple[str, ...] = _ALL_MEMBERS
    unbound_fields: frozenset[str] = frozenset()
    min_gain_lower_bound: float | None = 0.0
    sentinel: SentinelPolicy | None = None
    rank_agreement: bool = True
    limits: ReadLimits = DEFAULT_LIMITS
    mixed: bool = True
    mixed_live: MixedLive | None = None

    def __post_init__(self) -> None:
        members = tuple(sorted(set(self.required_members)))
        unknown = sorted(set(members) - set(_ALL_MEMBERS))
        if unknown or not {"calibration", "cost-table"} <= set(members):
            raise ConfigError(
                f"required_members {list(self.required_members)}: must include cost-table and calibration "
                f"and name only {list(_ALL_MEMBERS)} (unknown: {unknown})"
            )
        object.__setattr__(self, "required_members", members)
        unbound = frozenset(self.unbound_fields)
        bad = sorted(unbound - set(Fingerprint.field_names()))
        if bad:
            raise ConfigError(
                f"unbound_fields {bad} are not fingerprint fields; choose from {Fingerprint.field_names()}"
            )
        object.__setattr__(self, "unbound_fields", unbound)
        if self.state_path is not None:
            object.__setattr__(self, "state_path", Path(self.state_path))
        object.__setattr__(self, "trust_root_chain", tuple(Path(p) for p in self.trust_root_chain))
        if self.max_artifact_age is not None and self.max_artifact_age <= timedelta(0):
            raise ConfigError(f"max_artifact_age must be positive, got {self.max_artifact_age}")
        if self.min_gain_lower_bound is not None and not math.isfinite(self.min_gain_lower_bound):
            raise ConfigError(f"min_gain_lower_bound must be finite, got {self.min_gain_lower_bound!r}")
        if not (math.isfinite(self.state_lock_timeout_s) and self.state_lock_timeout_s >= 0):
            raise ConfigError(f"state_lock_timeout_s must be >= 0, got {self.state_lock_timeout_s!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for logs and reports)."""
        return {
            "allow_synthetic": self.allow_synthetic,
            "max_artifact_age_s": self.max_artifact_age.total_seconds() if self.max_artifact_age else None,
            "state_path": str(self.state_path) if self.state_path else None,
            "state_lock_timeout_s": self.state_lock_timeout_s,
            "trust_root_chain": [str(p) for p in self.trust_root_chain],
            "required_members": list(self.required_members),
            "unbound_fields": sorted(self.unbound_fields),
            "min_gain_lower_bound": self.min_gain_lower_bound,
            "sentinel": None
            if self.sentinel is None
            else {
                "backend": self.sentinel.backend,
                "tolerance": self.sentinel.tolerance,
                "samples": self.sentinel.samples,
            },
            "rank_agreement": self.rank_agreement,
            "mixed": self.mixed,
            "mixed_live": None
            if self.mixed_live is None
            else {
                "body_buckets": list(self.mixed_live.body_buckets)
                if self.mixed_live.body_buckets is not None
                else None,
                "execution_mode": self.mixed_live.execution_mode,
            },
        }


# ---------------------------------------------------------------------------------------------
# Cross-member checks (pure)
# ---------------------------------------------------------------------------------------------


def _cells(table: pa.Table) -> set[tuple[int, int]]:
    g = table.column("graph_batch_size").to_pylist()
    v = table.column("verifier_budget").to_pylist()
    return {(int(a), int(b)) for a, b in zip(g, v, strict=True)}


def sts_temperatures(calibration: pa.Table) -> tuple[float, ...]:
    """The temperatures the engine applies, in position order: the calibration model's STS rule
    (``Calibration.from_rows(..., use="sts")``, the rule the TensorRT-LLM export follows too).

    Raises:
        ConfigError: a position has no finite temperature > 0 (the engine applies STS only).
    """
    rows = calibration.select(["position", "method", "temperature"]).to_pylist()
    temps = Calibration.from_rows(rows, use="sts").sts_temperatures()
    assert temps is not None  # use="sts" makes every position STS
    return temps


def cross_member_findings(
    cost_table: VerifiedArtifact, calibration: VerifiedArtifact, admission: VerifiedArtifact | None
) -> list[Finding]:
    """Checks across verified members that no single artifact's pipeline can make. Pure.

    Same K and same fingerprint are already enforced by the bundle pipeline (every member carries
    the manifest's fingerprint, content rules tie positions and cells to its K).
    """
    out: list[Finding] = []
    cells = _cells(cost_table.table)
    compact = {c for c in cells if c[1] != 0}
    if admission is not None:
        extra = sorted(_cells(admission.table) - cells)
        if extra:
            out.append(
                Finding(
                    Reason.CROSS_MEMBER_MISMATCH,
                    f"{admission.path}: replayed cells {extra} are not in the cost table "
                    f"{cost_table.path.name}; the members come from different builds, rebuild the bundle",
                    field="admission.cells",
                    expected=sorted(cells),
                    actual=extra,
                )
            )
    try:
        sts_temperatures(calibration.table)
    except ConfigError as exc:
        out.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{calibration.path}: {exc}; the engine applies sequential temperature scaling, refit with "
                "--method sts",
                field="calibration.temperature",
            )
        )
    if not compact:
        out.append(
            Finding(
                Reason.GAIN_NOT_PROVEN,
                f"{cost_table.path}: the cost table has only native cells; nothing to activate",
                field="cost_table.cells",
            )
        )
    return out


def _frozen(obj: Any) -> Any:
    """JSON-like containers → read-only ones."""
    if isinstance(obj, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in obj.items()})
    if isinstance(obj, (list, tuple)):
        return tuple(_frozen(v) for v in obj)
    return obj


# ---------------------------------------------------------------------------------------------
# admit
# ---------------------------------------------------------------------------------------------


class _Run:
    """Bookkeeping of one admission: timings and what is known so far (for every outcome)."""

    def __init__(self, bundle: Any, now: datetime | None) -> None:
        self.started = time.perf_counter()
        self._lap = self.started
        self.stage = "start"
        self.timings: dict[str, float] = {}
        self.info: dict[str, Any] = {"decided_at": now}
        if isinstance(bundle, (str, Path)):
            self.info["bundle_path"] = Path(bundle)

    def enter(self, stage: str) -> None:
        """Start timing a check."""
        self.stage = stage
        self._lap = time.perf_counter()

    def done(self) -> None:
        """Stop timing the current check."""
        self.timings[self.stage] = round((time.perf_counter() - self._lap) * 1e3, 4)

    def timings_ms(self) -> Mapping[str, float]:
        """The timings so far, with ``total``."""
        out = dict(self.timings)
        out["total"] = round((time.perf_counter() - self.started) * 1e3, 4)
        return MappingProxyType(out)

    def inactive(self, findings: Sequence[Finding], **extra: Any) -> AdmissionDecision:
        """An inactive decision for ``findings`` with everything known so far."""
        self.info.update(extra)
        first = findings[0]
        if "mixed" not in self.info:
            self.info["mixed"] = MixedAdmission(
                False,
                first.code,
                f"decode scheduling is not admitted ({first.code}); mixed evidence is cleared with it",
            )
        return AdmissionDecision(
            active=False,
            reason=first.reason,
            reason_code=first.code,
            message=first.message,
            findings=tuple(findings),
            timings_ms=self.timings_ms(),
            **self.info,
        )


def _load_root(trust_root: Any, now: datetime) -> tuple[TrustRoot | None, Finding | None]:
    """Step (1): a path is read and verified; a loaded root is checked for expiry."""
    from dspark_calibrate.artifacts import TrustRoot, TrustRootError, read_trust_root

    if isinstance(trust_root, TrustRoot):
        if trust_root.is_expired(now):
            return None, Finding(
                Reason.TRUST_ROOT_EXPIRED,
                f"trust root v{trust_root.version} expired at {trust_root.expires.isoformat()}; "
                "rotate it with `dspark-calibrate trust rotate`",
                field="expires",
            )
        return trust_root, None
    if not isinstance(trust_root, (str, Path)):
        raise TypeError(f"trust_root must be a path or a TrustRoot, got {type(trust_root).__name__}")
    try:
        return read_trust_root(trust_root, now=now), None
    except TrustRootError as exc:
        return None, Finding(exc.reason, str(exc), field="trust_root")


def _read_chain(paths: Sequence[Path]) -> tuple[list[bytes], Finding | None]:
    """The rotation chain's ``root.json`` files (bounded reads), or the finding for one that fails."""
    from dspark_calibrate.artifacts import MAX_TRUST_ROOT_BYTES

    out: list[bytes] = []
    for path in paths:
        try:
            out.append(read_regular_file(path, MAX_TRUST_ROOT_BYTES))
        except OSError as exc:  # FileTooLarge included
            return [], Finding(
                Reason.TRUST_ROOT_INVALID,
                f"{path}: cannot read this rotation-chain root ({exc.strerror or exc}); pass the root.json "
                "files between the accepted and the pinned trust root",
                field="trust_root_chain",
            )
    return out, None


def _resolve_live(live: LiveSpec) -> LiveContext:
    """Step (2): the live context as given, or collected (explicit arguments win over probes)."""
    if isinstance(live, LiveContext):
        return live
    if isinstance(live, Fingerprint):
        return LiveContext(
            fingerprint=live, sources=MappingProxyType({n: "argument" for n in live.field_names()})
        )
    if live is None:
        return collect_live()
    if isinstance(live, Mapping):
        return collect_live(**dict(live))
    raise TypeError(
        f"live must be a LiveContext, a Fingerprint or collect_live arguments, got {type(live).__name__}"
    )


def _manifest_bytes(bundle: Path, limits: ReadLimits) -> bytes | None:
    """The bundle manifest's bytes for its digest, or None (verification reports why)."""
    from dspark_calibrate.artifacts import BUNDLE_MANIFEST

    manifest = bundle / BUNDLE_MANIFEST if bundle.is_dir() else bundle
    try:
        return read_regular_file(manifest, limits.max_envelope_bytes)
    except OSError:  # FileTooLarge included
        return None


def _special_files(bundle: Path) -> list[Finding]:
    """Entries of the bundle directory that are not regular files (FIFOs, devices, sockets).

    Reading one could block the serving start forever, so they are refused before the pipeline
    opens anything; what the files contain is the pipeline's business.
    """
    directory = bundle if bundle.is_dir() else bundle.parent
    out: list[Finding] = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return out  # the pipeline reports a missing or unreadable bundle
    for entry in entries:
        try:
            mode = os.stat(entry.path).st_mode
        except OSError:
            continue  # a dangling link: the pipeline reports it if the manifest names it
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            out.append(
                Finding(
                    Reason.IO_ERROR,
                    f"{entry.path}: not a regular file (a FIFO, device or socket); a bundle holds only files",
                    field=entry.name,
                )
            )
    return out


def _engine_config(
    cost_table: VerifiedArtifact,
    calibration: VerifiedArtifact,
    econ: AdmissionEconomics | None,
    bundle_sha256: str | None,
    mixed: MixedAdmission | None = None,
) -> Mapping[str, Any]:
    config: Mapping[str, Any] = _frozen(
        {
            "enable_confidence_scheduling": True,
            "max_draft_len": cost_table.fingerprint.max_draft_len,
            "sts_temperatures": list(sts_temperatures(calibration.table)),
            "cells": [list(c) for c in sorted(_cells(cost_table.table))],
            "minimum_predicted_gain": econ.minimum_predicted_gain if econ is not None else None,
            "bundle_sha256": bundle_sha256,
            # Ranks must agree on the mixed decision too: it changes the rows a mixed step runs.
            "mixed": {
                "active": mixed is not None and mixed.active,
                "cells": mixed.cells if mixed is not None else 0,
                "version": mixed.version if mixed is not None else None,
            },
        }
    )
    return config


#: Failures bad mixed evidence can cause in the mixed checks (the consumer's loader catches the
#: same kinds); anything else is a defect and reaches ``admit``'s one fail-closed boundary.
_MIXED_FAILURES = (DsparkError, OSError, ValueError, KeyError, TypeError, ArithmeticError)


def _mixed_inactive(finding: Finding, **info: Any) -> MixedAdmission:
    return MixedAdmission(False, finding.code, finding.message, (finding,), **info)


def _decide_mixed(
    bundle: Path,
    root: TrustRoot,
    ctx: LiveContext,
    policy: AdmissionPolicy,
    now: datetime,
    report: BundleReport,
) -> MixedAdmission:
    """The mixed evidence's decision, after decode scheduling was admitted (see the module docstring)."""
    if not policy.mixed:
        return _mixed_inactive(
            Finding(
                Reason.CONFIG_INVALID,
                "mixed evidence not asked for (policy.mixed off): mixed steps stay native",
                "mixed",
            )
        )
    try:
        mixed = _verify_mixed_evidence(bundle, root, ctx, policy, now, report)
        if not mixed.present:
            # Built without `build --mixed-sweep`: nothing is missing and nothing was refused.
            return _mixed_inactive(
                Finding(
                    Reason.MIXED_ABSENT,
                    f"{bundle}: built without mixed evidence (no mixed/ directory); mixed "
                    "prefill+decode steps run native, decode scheduling is unaffected",
                )
            )
        if not mixed.ok:
            return _mixed_inactive(mixed.findings[0], report=mixed)
        refused = _mixed_economics_refusal(mixed)
        if refused is not None:
            return _mixed_inactive(refused, report=mixed)
        table = _mixed_cost_table(mixed)
    except _MIXED_FAILURES as exc:
        return _mixed_inactive(
            Finding(
                Reason.CONTENT_INVALID,
                f"{bundle}: mixed evidence unusable ({exc}); mixed steps stay native",
                "mixed",
            )
        )
    return MixedAdmission(
        True,
        Reason.OK.value,
        f"{mixed.path}: admitted mixed evidence v{mixed.bundle.version if mixed.bundle else '?'} ({len(table.cells)} cells)",
        cells=len(table.cells),
        version=mixed.bundle.version if mixed.bundle is not None else None,
        allow_synthetic=policy.allow_synthetic,
        table=table,
        report=mixed,
    )


def _verify_mixed_evidence(
    bundle: Path,
    root: TrustRoot,
    ctx: LiveContext,
    policy: AdmissionPolicy,
    now: datetime,
    report: BundleReport,
) -> MixedReport:
    """The bundle's mixed evidence through the artifacts pipeline (versions recorded in the state)."""
    from dspark_calibrate.artifacts import Expectation, verify_mixed

    state = (
        RollbackState(policy.state_path, lock_timeout_s=policy.state_lock_timeout_s, snapshot=True)
        if policy.state_path is not None
        else None
    )
    return verify_mixed(
        bundle,
        root,
        now=now,
        decode=report,
        expected=Expectation(
            fingerprint=ctx.fingerprint,
            unbound_fields=policy.unbound_fields,
            allow_synthetic=policy.allow_synthetic,
            max_age=policy.max_artifact_age,
            mixed=policy.mixed_live or MixedLive(),
        ),
        state=state,
        record=state is not None and policy.record_state,
        limits=policy.limits,
    )


def _mixed_economics_refusal(mixed: MixedReport) -> Finding | None:
    """Why verified mixed evidence does not admit (a gate failed, or its economics), or None."""
    admission = mixed.artifact("mixed-admission")
    assert admission is not None
    econ = MixedEconomics.from_summary(admission.summary)
    failed = [g for g, ok in econ.gates.items() if not ok]
    if not failed and econ.admitted:
        return None
    why = f"gates {failed} not passed" if failed else f"economics do not admit (net {econ.net_ms():.6g} ms)"
    return Finding(Reason.GAIN_NOT_PROVEN, f"{mixed.path}: {why}; mixed steps stay native", field="mixed")


def _mixed_cost_table(mixed: MixedReport) -> MixedCostTable:
    """The verified mixed cost table, as the planner reads it."""
    costs = mixed.artifact("mixed-cost-table")
    assert costs is not None
    return MixedCostTable.from_rows(
        costs.table.to_pylist(),
        MixedRoute.from_dict(costs.summary["route"]),
        minimum_predicted_gain=float(costs.summary["minimum_predicted_gain"]),
    )


class _Refused(Exception):
    """Raised by a step of :func:`_decide` with the findings that make the decision static K.

    Never leaves :func:`_decide`; the step has stopped its timing before raising.
    """

    def __init__(self, findings: Sequence[Finding]) -> None:
        super().__init__()
        self.findings = findings


def _check_root(
    trust_root: Any, policy: AdmissionPolicy, state: RollbackState | None, now: datetime, run: _Run
) -> TrustRoot:
    """Step (1): the trust root, verified on its own, then never older than the newest one
    accepted here."""
    from dspark_calibrate.artifacts import check_trust_root_freshness

    run.enter("trust_root")
    root, finding = _load_root(trust_root, now)
    if root is not None:
        run.info.update(trust_root_version=root.version, trust_root_sha256=root.digest())
        if state is not None:
            chain, finding = _read_chain(policy.trust_root_chain)
            if finding is None:
                finding = check_trust_root_freshness(
                    root,
                    state,
                    now=now,
                    chain=chain,
                    record=policy.record_state,
                    where=trust_root if isinstance(trust_root, (str, Path)) else "trust root",
                )
    run.done()
    if finding is not None or root is None:
        assert finding is not None
        raise _Refused([finding])
    return root


def _check_live(live: LiveSpec, run: _Run) -> LiveContext:
    """Step (2): the live deployment."""
    run.enter("live")
    try:
        ctx = _resolve_live(live)
    except (ProbeError, ConfigError) as exc:
        run.done()
        raise _Refused(
            [
                Finding(
                    Reason.LIVE_PROBE_FAILED, f"live fingerprint: {exc}; pass the engine arguments explicitly"
                )
            ]
        ) from None
    run.done()
    run.info["live_fingerprint"] = ctx.fingerprint
    return ctx


def _check_bundle(
    bundle_path: Path,
    root: TrustRoot,
    ctx: LiveContext,
    policy: AdmissionPolicy,
    state: RollbackState | None,
    now: datetime,
    run: _Run,
) -> BundleReport:
    """Step (3): the bundle through the artifacts pipeline (accepted versions are recorded in the
    state), unchanged while it was read."""
    from dspark_calibrate.artifacts import Expectation, verify_bundle

    run.enter("bundle")
    special = _special_files(bundle_path)
    if special:
        run.done()
        raise _Refused(special)
    manifest = _manifest_bytes(bundle_path, policy.limits)
    run.info["bundle_sha256"] = sha256_hex(manifest) if manifest is not None else None
    expected = Expectation(
        fingerprint=ctx.fingerprint,
        unbound_fields=policy.unbound_fields,
        allow_synthetic=policy.allow_synthetic,
        max_age=policy.max_artifact_age,
    )
    report = verify_bundle(
        bundle_path,
        root,
        now=now,
        expected=expected,
        state=state,
        record=state is not None and policy.record_state,
        required=policy.required_members,
        limits=policy.limits,
    )
    run.done()
    for kind, member in sorted(report.members.items()):
        for step, seconds in member.timings:
            run.timings[f"bundle.{kind}.{step}"] = round(seconds * 1e3, 4)
    run.info.update(
        bundle_report=report,
        bundle_version=report.version,
        cost_table=report.artifact("cost-table"),
        calibration=report.artifact("calibration"),
        admission=report.artifact("admission"),
    )
    if not report.ok:
        raise _Refused(report.findings)
    if manifest is None or _manifest_bytes(bundle_path, policy.limits) != manifest:
        raise _Refused(
            [
                Finding(
                    Reason.BUNDLE_INVALID,
                    f"{bundle_path}: the bundle manifest changed while it was being admitted; retry once the "
                    "deployment is finished",
                    field="manifest",
                )
            ]
        )
    return report


def _check_economics(
    adm: VerifiedArtifact | None, policy: AdmissionPolicy, bundle_path: Path, run: _Run
) -> AdmissionEconomics | None:
    """Step (5): the signed summary's economics, then the gain test when the policy asks for one."""
    run.enter("economics")
    econ: AdmissionEconomics | None = None
    if adm is not None:
        try:
            econ = AdmissionEconomics.from_summary(adm.summary)
        except ModelError as exc:
            run.done()
            raise _Refused(
                [Finding(Reason.CONTENT_INVALID, f"{adm.path}: {exc}", field="admission.summary")]
            ) from None
        run.info["economics"] = econ
    if policy.min_gain_lower_bound is not None:
        verdict = gain_test(econ, policy.min_gain_lower_bound)
        if verdict.status is not Status.ACCEPT:
            run.done()
            raise _Refused(
                [
                    Finding(
                        Reason.GAIN_NOT_PROVEN,
                        f"{adm.path if adm is not None else bundle_path}: gain test {verdict.status.value}: "
                        f"{verdict.detail}",
                        field="predicted_gain_ci_low",
                        expected=f"> {policy.min_gain_lower_bound}",
                        actual=econ.predicted_gain_ci_low if econ is not None else None,
                    )
                ]
            )
    run.done()
    return econ


def _check_planner(
    cost_table: VerifiedArtifact,
    calibration: VerifiedArtifact,
    econ: AdmissionEconomics | None,
    bundle_path: Path,
    run: _Run,
) -> int:
    """Step (5b): the reference selector must accept these members, so that an active decision
    always yields a working DynamicVerifier (and the drain guard prices a measured native cell).
    Returns K."""
    run.enter("planner")
    k: int | None = cost_table.fingerprint.max_draft_len
    assert k is not None  # content rules refuse a cost table without K
    try:
        planner_inputs(cost_table.table, calibration.table, k, econ)
    except ConfigError as exc:
        run.done()
        raise _Refused(
            [
                Finding(
                    Reason.CONTENT_INVALID,
                    f"{bundle_path}: the selector refuses the members: {exc}",
                    field="planner",
                )
            ]
        ) from None
    run.done()
    return k


def _decide(
    bundle: Path | str, trust_root: Any, live: LiveSpec, policy: AdmissionPolicy, now: datetime, run: _Run
) -> AdmissionDecision:
    """Steps (1)–(6); returns the local decision (rank agreement comes after).

    Each step records what it learnt in ``run`` and raises :class:`_Refused` to make the
    decision static K.
    """
    if now.tzinfo is None:
        raise TypeError("now must be timezone-aware")
    bundle_path = Path(bundle)
    state = (
        RollbackState(policy.state_path, lock_timeout_s=policy.state_lock_timeout_s, snapshot=True)
        if policy.state_path is not None
        else None
    )
    try:
        root = _check_root(trust_root, policy, state, now, run)
        ctx = _check_live(live, run)
        report = _check_bundle(bundle_path, root, ctx, policy, state, now, run)
        cost_table, calibration, adm = (
            report.artifact(k) for k in ("cost-table", "calibration", "admission")
        )
        assert cost_table is not None and calibration is not None
        # (4) cross-member checks
        run.enter("members")
        cross = cross_member_findings(cost_table, calibration, adm)
        run.done()
        if cross:
            raise _Refused(cross)
        econ = _check_economics(adm, policy, bundle_path, run)
        k = _check_planner(cost_table, calibration, econ, bundle_path, run)
        # (6) sentinel: re-measure a few cells on this host
        if policy.sentinel is not None:
            run.enter("sentinel")
            sentinel = run_sentinel(cost_table.table, k, policy.sentinel)
            run.done()
            run.info["sentinel"] = sentinel
            if not sentinel.ok:
                raise _Refused(sentinel.findings)
    except _Refused as refused:
        return run.inactive(refused.findings)
    # (6b) the optional mixed evidence, decided apart from decode
    run.enter("mixed")
    mixed = _decide_mixed(bundle_path, root, ctx, policy, now, report)
    run.done()
    run.info["mixed"] = mixed
    return AdmissionDecision(
        active=True,
        reason=Reason.OK,
        reason_code=Reason.OK.value,
        message=f"{bundle_path}: admitted bundle v{report.version}; dynamic verification enabled",
        engine_config=_engine_config(cost_table, calibration, econ, run.info.get("bundle_sha256"), mixed),
        timings_ms=run.timings_ms(),
        **run.info,
    )


def _internal_error(exc: Exception, run: _Run) -> AdmissionDecision:
    detail = repr(exc)
    if len(detail) > 500:
        detail = detail[:497] + "..."
    finding = Finding(
        Reason.INTERNAL_ERROR,
        f"admission failed during {run.stage}: {detail}; running static K (please report this)",
        field=run.stage,
    )
    return run.inactive([finding])


def _log(decision: AdmissionDecision, exc: BaseException | None) -> None:
    record = decision.log_record()
    if exc is not None:
        level = logging.ERROR
    elif decision.active:
        level = logging.INFO
    else:
        level = logging.WARNING
    logger.log(
        level,
        "dspark admission %s",
        json.dumps(record, sort_keys=True, default=str),
        exc_info=exc,
        extra={"dspark_admission": record},
    )


def admit(
    bundle: Path | str,
    trust_root: Path | str | TrustRoot,
    *,
    live: LiveSpec = None,
    policy: AdmissionPolicy | None = None,
    now: datetime | None = None,
    metrics_callback: MetricsCallback | None = None,
) -> AdmissionDecision:
    """Decide whether this process may enable dynamic verification with ``bundle``. Never raises.

    Args:
        bundle: the bundle directory (or its ``bundle.dsse.json``).
        trust_root: the pinned ``root.json`` path, or an already loaded ``TrustRoot``.
        live: the live deployment: a ``LiveContext``, a ``Fingerprint``, keyword arguments for
            ``collect_live`` (engine arguments such as ``max_draft_len``,
            ``rank_local_graph_batch_sizes`` and ``topology`` win over probes), or ``None`` to probe.
        policy: what to demand (strict by default).
        now: the current time (timezone-aware); read from the clock when not given.
        metrics_callback: called once with the decision's log record, after rank agreement. If it
            raises, this rank falls back to static K (keep it non-raising on multi-rank engines).

    Returns:
        The decision. Inactive decisions carry the static engine configuration and the reason.
    """
    run = _Run(bundle, now)
    decision: AdmissionDecision | None = None
    failure: BaseException | None = None
    # Three phases behind one boundary: deciding, agreeing across ranks (every rank reaches the
    # collective even when its own decision failed) and reporting.
    for phase in ("decide", "agree", "report"):
        try:
            if phase == "decide":
                policy = policy if policy is not None else AdmissionPolicy()
                when = now if now is not None else datetime.now(UTC)
                run.info["decided_at"] = when
                decision = _decide(bundle, trust_root, live, policy, when, run)
            elif phase == "agree":
                assert decision is not None
                if policy is not None and policy.rank_agreement:
                    run.enter("rank_agreement")
                    started = time.perf_counter()
                    decision = agree(decision).with_timing("rank_agreement", time.perf_counter() - started)
            elif metrics_callback is not None:
                assert decision is not None
                run.stage = "metrics_callback"
                metrics_callback(MappingProxyType(decision.log_record()))
        except Exception as exc:  # the package's one fail-closed boundary (STYLE rule 13)
            failure = exc
            decision = _internal_error(exc, run)
    assert decision is not None
    decision = decision.with_timing("total", time.perf_counter() - run.started)
    _log(decision, failure)
    return decision
