"""The release report's model: what one page shows, built from verified evidence. Pure.

:func:`build_report` turns :class:`~dspark_calibrate.calibrate.report.evidence.Evidence` into a
:class:`Report`: the verification result, identity, the cost-table analysis (savings versus the
native cell, noisy and non-monotone cells, stop reasons), the calibration (per-position metrics,
reliability bins, survival), the admission economics, and a data-driven "what to check" list.
Nothing from an unverified input reaches any of those sections: a report of unverifiable input
carries only the findings and the untrusted file list. The admission section reads the summary
with the runtime's own ``AdmissionEconomics`` and gain test, so the page says what the admission
hook will decide. No I/O, no clock; reading the inputs is :mod:`.evidence`'s job, rendering
:mod:`.render`'s.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import dspark_calibrate
from dspark_calibrate.artifacts import (
    NATIVE_BUDGET,
    TRTLLM_FINGERPRINT_FIELDS,
    Finding,
    Fingerprint,
    ModelError,
    Reason,
    ReceiptEconomics,
    full_width,
)
from dspark_calibrate.calibrate.report.evidence import (
    MEMBER_KINDS,
    Evidence,
    TrustRootInfo,
    UntrustedInput,
    display,
)
from dspark_calibrate.calibrate.report.facts import Fact, receipt_checks, release_facts
from dspark_calibrate.calibrate.report.sweep_checks import sweep_bias_checks
from dspark_calibrate.calibrate.report.verdict import (
    SEVERITY_ORDER,
    Check,
    CheckGroup,
    Severity,
    Verdict,
    group_checks,
    make_verdict,
)
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.admission import AdmissionEconomics, cross_member_findings, gain_test

if TYPE_CHECKING:
    import pyarrow as pa

    from dspark_calibrate.artifacts import VerifiedArtifact

__all__ = [
    "REPORT_SECTIONS",
    "SUMMARY_CANDIDATES",
    "AdmissionSection",
    "BucketGain",
    "CalibrationRow",
    "CalibrationSection",
    "CandidateCell",
    "Check",
    "CostGroup",
    "CostSection",
    "Identity",
    "MemberIdentity",
    "MetricInterval",
    "MixedCellRow",
    "MixedSection",
    "ReliabilityBin",
    "ReliabilityDiagram",
    "Report",
    "ReportThresholds",
    "ReportedCell",
    "Severity",
    "SurvivalPoint",
    "build_report",
]

#: Section ids of the HTML page (anchors) and headings of the Markdown page, in page order.
REPORT_SECTIONS: tuple[str, ...] = (
    "verification",
    "identity",
    "cost-table",
    "calibration",
    "admission",
    "mixed",
    "what-to-check",
)


# ---------------------------------------------------------------------------------------------
# Thresholds and checks
# ---------------------------------------------------------------------------------------------


#: The sweep's precision target (relative half-width of a compact cell's paired saving, in units
#: of the native step) assumed when a cost table's signed provenance does not record its own: the
#: default of ``measurement.stats.Thresholds.precision_rel`` (the report reads artifacts, never the
#: measurement modules, so the number is repeated here and a test keeps the two equal).
DEFAULT_SWEEP_PRECISION_REL = 0.005


@dataclass(frozen=True, slots=True)
class ReportThresholds:
    """Named thresholds behind the report's flags and its "what to check" list.

    None of these gate deployment (verification and the runtime's gain test do); they decide what a
    reviewer is asked to look at.

    Attributes:
        noisy_precision_multiple: a compact cell is *noisy* when the half-width of its paired
            saving's interval (in units of the native step, as the selector compares it) exceeds
            this multiple of the sweep's own precision target (``precision_rel`` of the cost
            table's signed stopping rule). 2: the stored interval adds the between-run terms the
            stopping rule does not judge, so a precise cell lands near 1x and one at 2x is
            visibly wider than the sweep promised. The absolute interval of a median is not
            judged: the level shift every cell of a process shares widens it without moving any
            saving (DESIGN §7).
        min_saving_rel: a G whose best compact cell saves less than this fraction of the native step
            time cannot pay for the confidence path at that concurrency (0.02 = 2 %).
        min_samples: cells with fewer kept samples are flagged (``stats.Thresholds.min_samples``).
        max_ece_after: per-position ECE after calibration above this is flagged (0.02: the held-out
            target of issue 4's recovery test).
        min_holdout_rounds: positions whose held-out risk set is smaller are flagged (1,000: the STS
            file's ``num_samples`` floor, DESIGN §6).
        survival_tolerance: predicted minus observed survival beyond this, in probability, is flagged.
        expiry_warning: artifacts expiring sooner than this are flagged.
    """

    noisy_precision_multiple: float = 2.0
    min_saving_rel: float = 0.02
    min_samples: int = 8
    max_ece_after: float = 0.02
    min_holdout_rounds: int = 1000
    survival_tolerance: float = 0.02
    expiry_warning: timedelta = timedelta(days=7)

    def __post_init__(self) -> None:
        multiple = self.noisy_precision_multiple
        if not (isinstance(multiple, float) and math.isfinite(multiple) and multiple >= 1.0):
            raise ConfigError(f"report threshold noisy_precision_multiple={multiple!r} must be a number >= 1")
        for name in ("min_saving_rel", "max_ece_after", "survival_tolerance"):
            value = getattr(self, name)
            if not (isinstance(value, float) and math.isfinite(value) and 0.0 <= value < 1.0):
                raise ConfigError(f"report threshold {name}={value!r} must be a number in [0, 1)")
        for name in ("min_samples", "min_holdout_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"report threshold {name}={value!r} must be an integer >= 0")
        if self.expiry_warning < timedelta(0):
            raise ConfigError("report threshold expiry_warning must not be negative")


# ---------------------------------------------------------------------------------------------
# Report model
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MemberIdentity:
    """Signed identity of one verified member."""

    kind: str
    file: str
    version: int
    schema_version: int
    series: str
    issued_at: datetime
    expires_at: datetime
    logical_sha256: str
    signer_keyids: tuple[str, ...]
    rows: int
    tool_version: str
    backend: str | None
    synthetic: bool
    command: str
    created_at: str | None


@dataclass(frozen=True, slots=True)
class Identity:
    """Who and what the evidence is about.

    Attributes:
        fingerprint: ``(field, value, bound, trtllm)`` rows; ``bound`` marks fields compared against
            the live deployment, ``trtllm`` the ten fields TensorRT-LLM reads.
        fingerprint_digest: SHA-256 of the fingerprint's canonical JSON (the series suffix).
        members: the verified members in page order.
        bundle_version: the manifest's version (``None`` for loose artifacts).
        manifest_keyids: keys that signed the manifest.
    """

    fingerprint: tuple[tuple[str, str, bool, bool], ...]
    fingerprint_digest: str
    members: tuple[MemberIdentity, ...]
    bundle_version: int | None
    manifest_keyids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReportedCell:
    """One cell of the cost table with what the report derives from it.

    Attributes:
        graph_batch_size, verifier_budget: the cell (V = 0 is the native full-K cell).
        tokens: tokens the step verifies: G·(K+1) for the native cell, else V.
        step_time_ms, ci_low_ms, ci_high_ms, p10_ms, p90_ms, samples, stop_reason: as signed.
        saving: 1 − T(G, V) / T(G, native); ``None`` for the native cell or when G has none.
        saving_low, saving_high: the saving's interval: the signed paired one (schema 2), or the
            range from the two CIs (schema 1: slow end of this cell against the fast end of the
            native cell, and the reverse).
        ci_half_width_rel: CI half-width over the median (shown; not judged, see ``noisy``).
        noisy: a compact cell whose saving interval is wider than the sweep's precision allows
            (:attr:`saving_half_width` above ``ReportThresholds.noisy_precision_multiple`` times the
            sweep's ``precision_rel``), or any cell that did not stop on precision.
        non_monotone: slower than a cell of the same G that verifies more tokens.
        chosen_steps: replayed steps that picked this cell (from the admission table), if known.
        value_ms: replayed time saved by this cell (admission table), if known.
    """

    graph_batch_size: int
    verifier_budget: int
    tokens: int
    step_time_ms: float
    ci_low_ms: float
    ci_high_ms: float
    p10_ms: float
    p90_ms: float
    samples: int
    stop_reason: str
    saving: float | None
    saving_low: float | None
    saving_high: float | None
    ci_half_width_rel: float
    noisy: bool
    non_monotone: bool
    chosen_steps: int | None = None
    value_ms: float | None = None

    @property
    def native(self) -> bool:
        """True for the static full-K cell (V = 0)."""
        return self.verifier_budget == 0

    @property
    def saving_half_width(self) -> float | None:
        """The larger half-width of the saving's interval, in units of the native step."""
        if self.saving is None or self.saving_low is None or self.saving_high is None:
            return None
        return max(self.saving - self.saving_low, self.saving_high - self.saving)

    @property
    def tokens_per_row(self) -> float:
        """Verified tokens per graph row (K + 1 for the native cell)."""
        return self.tokens / self.graph_batch_size

    @property
    def label(self) -> str:
        """``G=8 V=16`` or ``G=8 native``."""
        return f"G={self.graph_batch_size} " + ("native" if self.native else f"V={self.verifier_budget}")


@dataclass(frozen=True, slots=True)
class CostGroup:
    """The cells of one graph batch size G."""

    graph_batch_size: int
    native: ReportedCell | None
    compact: tuple[ReportedCell, ...]

    @property
    def cells(self) -> tuple[ReportedCell, ...]:
        """Native first, then compact cells by V."""
        return ((self.native,) if self.native is not None else ()) + self.compact

    @property
    def best(self) -> ReportedCell | None:
        """The compact cell with the largest saving."""
        scored = [c for c in self.compact if c.saving is not None]
        return max(scored, key=lambda c: (c.saving, -c.verifier_budget)) if scored else None


@dataclass(frozen=True, slots=True)
class CandidateCell:
    """A measured cell that was not deployed (from the cost table's signed summary, if recorded).

    Attributes:
        graph_batch_size, verifier_budget, step_time_ms, ci_low_ms, ci_high_ms: as measured.
        tokens: verified tokens (V).
        saving: 1 − T(G, V) / T(G, native), against the deployed native cell.
    """

    graph_batch_size: int
    verifier_budget: int
    tokens: int
    step_time_ms: float
    ci_low_ms: float
    ci_high_ms: float
    saving: float | None


@dataclass(frozen=True, slots=True)
class CostSection:
    """The cost table, grouped by G, with the stop-reason mix.

    Attributes:
        k: the draft length K.
        groups: the deployed cells per G.
        stop_reasons: ``(stop reason, cells)``, most frequent first.
        has_replay: the admission table's replay statistics are attached to the cells.
        candidates: measured cells that were not deployed, when the signed summary lists them.
        problems: malformed entries of the summary's candidate list.
        precision_rel: the sweep's precision target (its signed stopping rule's ``precision_rel``).
        precision_recorded: False when the provenance lacks it and the default was assumed.
        noisy_limit: the saving half-width above which a compact cell is noisy.
    """

    k: int
    groups: tuple[CostGroup, ...]
    stop_reasons: tuple[tuple[str, int], ...]
    has_replay: bool
    candidates: tuple[CandidateCell, ...] = ()
    problems: tuple[str, ...] = ()
    precision_rel: float = DEFAULT_SWEEP_PRECISION_REL
    precision_recorded: bool = False
    noisy_limit: float = 2.0 * DEFAULT_SWEEP_PRECISION_REL

    @property
    def faster_candidates(self) -> tuple[CandidateCell, ...]:
        """Undeployed cells that save more than the best deployed cell of their G."""
        best = {g.graph_batch_size: g.best for g in self.groups}
        out = []
        for cand in self.candidates:
            top = best.get(cand.graph_batch_size)
            if (
                cand.saving is not None
                and top is not None
                and top.saving is not None
                and cand.saving > top.saving
            ):
                out.append(cand)
        return tuple(out)

    @property
    def candidate_summary(self) -> str:
        """One line for the collapsed "measured, not deployed" table."""
        if not self.candidates:
            return "no undeployed measured cell is listed in the signed summary"
        per_g = Counter(c.graph_batch_size for c in self.candidates)
        spread = ", ".join(f"G={g}: {n}" for g, n in sorted(per_g.items()))
        faster = len(self.faster_candidates)
        tail = (
            f"; {faster} of them save more than the best deployed cell of their G"
            if faster
            else "; none saves more than the best deployed cell of its G"
        )
        return f"{len(self.candidates)} measured cells were not deployed ({spread}){tail}"

    @property
    def cells(self) -> tuple[ReportedCell, ...]:
        """Every cell, by G then V (native first)."""
        return tuple(c for g in self.groups for c in g.cells)

    def flags(self, cell: ReportedCell) -> tuple[str, ...]:
        """Display flags of a deployed cell: native / chosen / never chosen, noisy, non-monotone."""
        out: list[str] = []
        if cell.native:
            out.append("native")
        elif self.has_replay:
            out.append("chosen" if cell.chosen_steps else "never chosen")
        if cell.noisy:
            out.append("noisy")
        if cell.non_monotone:
            out.append("non-monotone")
        return tuple(out)

    def heatmap(self) -> tuple[tuple[float, ...], tuple[tuple[int, tuple[ReportedCell | None, ...]], ...]]:
        """The saving heat map: columns are verified tokens per row (V/G), rows are G.

        Returns:
            The column values (sorted) and, per G, one cell or ``None`` per column.
        """
        columns = sorted({round(c.tokens_per_row, 4) for c in self.cells if not c.native})
        rows = []
        for g in self.groups:
            by_col = {round(c.tokens_per_row, 4): c for c in g.compact}
            rows.append((g.graph_batch_size, tuple(by_col.get(x) for x in columns)))
        return tuple(columns), tuple(rows)


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """One position of the calibration table, as signed."""

    position: int
    method: str
    temperature: float | None
    params: tuple[float, ...]
    risk_set_size: int
    holdout_risk_set_size: int
    nll_before: float | None
    nll_after: float | None
    brier_before: float | None
    brier_after: float | None
    ece_before: float | None
    ece_after: float | None


@dataclass(frozen=True, slots=True)
class ReliabilityBin:
    """One bin of a reliability diagram: predicted survival against the observed rate."""

    lo: float
    hi: float
    count: int
    mean_predicted: float | None
    observed: float | None


@dataclass(frozen=True, slots=True)
class ReliabilityDiagram:
    """Reliability bins of one draft position: S_j against 1[A ≥ j] on held-out rounds.

    Attributes:
        position: the draft position j.
        bins: the calibrated map's bins.
        ece: the calibrated map's ECE over these bins, as recorded.
        before: the raw logits' bins on the same rounds (empty when not recorded).
    """

    position: int
    bins: tuple[ReliabilityBin, ...]
    ece: float | None = None
    before: tuple[ReliabilityBin, ...] = ()

    @property
    def total(self) -> int:
        """Rounds over all bins."""
        return sum(b.count for b in self.bins)

    @property
    def empty_bins(self) -> int:
        """Bins without a round."""
        return sum(1 for b in self.bins if b.count == 0)


@dataclass(frozen=True, slots=True)
class SurvivalPoint:
    """Mean predicted versus observed survival at one position (held-out rounds with v ≥ j)."""

    position: int
    predicted: float
    observed: float
    predicted_before: float | None = None
    labelled: int | None = None
    observed_ci_low: float | None = None
    observed_ci_high: float | None = None


@dataclass(frozen=True, slots=True)
class MetricInterval:
    """A held-out metric before and after calibration with its bootstrap CIs."""

    name: str
    before: float | None
    before_ci: tuple[float, float] | None
    after: float | None
    after_ci: tuple[float, float] | None


@dataclass(frozen=True, slots=True)
class CalibrationSection:
    """The calibration: per-position rows, and method-level evidence from the signed summary.

    Attributes:
        k: the number of positions (K).
        rows: one per position, as signed.
        reliability: per-position reliability diagrams (empty when the summary has none).
        binning: how the bins, ECE and intervals were formed, as the summary states it.
        survival: predicted versus observed survival (empty when the summary has none).
        metrics: method-level and per-position metrics with CIs (empty when the summary has none).
        holdout_rounds, holdout_requests: the held-out set the metrics were computed on.
        fallbacks: ``(position, note)`` where the fit fell back to a neutral or parametric map.
        notices: ``(code, message)`` warnings the fit recorded about its input.
        missing: summary fields the report looked for and did not find (or found malformed).
    """

    k: int
    rows: tuple[CalibrationRow, ...]
    reliability: tuple[ReliabilityDiagram, ...]
    binning: str | None
    survival: tuple[SurvivalPoint, ...]
    metrics: tuple[MetricInterval, ...]
    holdout_rounds: int | None
    holdout_requests: int | None
    fallbacks: tuple[tuple[int, str], ...]
    notices: tuple[tuple[str, str], ...]
    missing: tuple[str, ...]

    @property
    def methods(self) -> tuple[str, ...]:
        """The distinct methods, in position order."""
        return tuple(dict.fromkeys(r.method for r in self.rows))


@dataclass(frozen=True, slots=True)
class BucketGain:
    """Predicted gain for one concurrency bucket (graph batch size) of the workload."""

    graph_batch_size: int
    steps: int
    predicted_gain: float
    ci_low: float
    ci_high: float
    compact_share: float


@dataclass(frozen=True, slots=True)
class AdmissionSection:
    """Workload economics from the signed admission summary, and what the runtime would decide.

    Numbers are ``None`` when the summary lacks them (listed in ``problems``).
    """

    predicted_gain: float | None
    predicted_gain_ci_low: float | None
    predicted_gain_ci_high: float | None
    static_goodput_tok_per_ms: float | None
    dynamic_goodput_tok_per_ms: float | None
    compact_step_share: float | None
    policy_steps: int | None
    compact_choices: int | None
    gross_compact_value_ms_lower_bound: float | None
    fixed_confidence_path_overhead_ms_upper_bound: float | None
    safety_margin_ms: float | None
    net_value_ms: float | None
    recomputed_net_value_ms: float | None
    admitted: bool | None
    receipt_rule: bool | None
    minimum_predicted_gain: float | None
    drain_guard: tuple[tuple[str, str], ...] | None
    workload_identity_sha256: str | None
    selector_replay_sha256: str | None
    workload_approximate: bool | None
    buckets: tuple[BucketGain, ...]
    gain_status: str
    gain_reason: str
    problems: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MixedCellRow:
    """One deployed mixed cell as the page shows it."""

    geometry_sha256: str
    capacity: int
    native_capacity: int
    max_native_rows: int
    max_actual_rows: int
    native_lower_ms: float
    candidate_upper_ms: float
    saving: float
    saving_ci_low: float
    saving_ci_high: float
    chosen_steps: int | None
    value_ms: float | None


@dataclass(frozen=True, slots=True)
class MixedSection:
    """The bundle's mixed prefill+decode evidence (DESIGN §10), when it has any.

    Attributes:
        valid: it verified (False: refused; ``reason`` says why, and the decode members stand).
        reason: the first finding's code and message when refused.
        share: mixed steps / workload steps.
        workload_steps, mixed_steps, priced_steps, covered_steps, compact_choices: counts.
        predicted_gain, ci_low, ci_high: decode + mixed against static K.
        decode_part, mixed_part: (gain, ci_low, ci_high) over decode and mixed steps.
        net_value_ms, admitted, gates: the mixed receipt's economics and its five gates.
        route: K, world size, buckets, execution mode.
        cells: the deployed cells.
    """

    valid: bool
    reason: str
    share: float | None = None
    workload_steps: int | None = None
    mixed_steps: int | None = None
    priced_steps: int | None = None
    covered_steps: int | None = None
    compact_choices: int | None = None
    predicted_gain: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    decode_part: tuple[float, float, float] | None = None
    mixed_part: tuple[float, float, float] | None = None
    net_value_ms: float | None = None
    admitted: bool | None = None
    gates: tuple[tuple[str, bool], ...] = ()
    route: str = ""
    cells: tuple[MixedCellRow, ...] = ()


@dataclass(frozen=True)
class Report:
    """Everything the page shows; built by :func:`build_report`, rendered by the templates.

    Attributes:
        verified: True when every input verified against the trust root.
        headline: the page's first line, the verdict's (``DEPLOY — …`` or ``DO NOT DEPLOY — …``).
        verdict: whether to deploy, the gates behind it and the blockers (the first screen).
        generated_at: the report time (also the verification time).
        tool_version: this package's version.
        inputs: the input paths as given.
        trust_root: the trust root, when it loaded.
        findings: verification findings (empty when verified).
        identity, cost, calibration, admission: present only when verified.
        runtime_findings: what the runtime's cross-member checks say about verified members.
        checks: the "what to check" list, blockers first.
        untrusted: the inputs as read without verification (only when not verified).
        trust_root_unreadable: the trust root file could not be read.
        mixed: the bundle's mixed evidence, when it has any.
        facts: the first screen's release facts (expiry, deployment, signer, receipt, prediction);
            empty when the input did not verify.
    """

    verified: bool
    headline: str
    generated_at: datetime
    tool_version: str
    inputs: tuple[str, ...]
    trust_root: TrustRootInfo | None
    findings: tuple[Finding, ...]
    identity: Identity | None
    cost: CostSection | None
    calibration: CalibrationSection | None
    admission: AdmissionSection | None
    runtime_findings: tuple[Finding, ...]
    checks: tuple[Check, ...]
    untrusted: tuple[UntrustedInput, ...]
    thresholds: ReportThresholds
    verdict: Verdict
    trust_root_unreadable: bool = False
    mixed: MixedSection | None = None
    facts: tuple[Fact, ...] = ()

    @property
    def blockers(self) -> tuple[Check, ...]:
        """Checks of severity blocker."""
        return tuple(c for c in self.checks if c.severity is Severity.BLOCKER)

    @property
    def check_groups(self) -> tuple[CheckGroup, ...]:
        """The "what to check" list with near-identical items folded into one line each."""
        return group_checks(self.checks)

    @property
    def io_error(self) -> bool:
        """True when an input or the trust root could not be read (the CLI exits 2)."""
        return bool(self.findings) and (
            self.findings[0].reason is Reason.IO_ERROR or self.trust_root_unreadable
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (for ``--json``)."""
        return {
            "deploy": self.verdict.deploy,
            "verdict": self.verdict.to_dict(),
            "verified": self.verified,
            "headline": self.headline,
            "generated_at": self.generated_at.isoformat(),
            "tool_version": self.tool_version,
            "inputs": list(self.inputs),
            "facts": [f.to_dict() for f in self.facts],
            "findings": [f.to_dict() for f in self.findings],
            "runtime_findings": [f.to_dict() for f in self.runtime_findings],
            "what_to_check": [g.to_dict() for g in self.check_groups],
            "checks": [c.to_dict() for c in self.checks],
            "admission": None
            if self.admission is None
            else {
                "predicted_gain": self.admission.predicted_gain,
                "predicted_gain_ci": [
                    self.admission.predicted_gain_ci_low,
                    self.admission.predicted_gain_ci_high,
                ],
                "admitted": self.admission.admitted,
                "gain_status": self.admission.gain_status,
            },
            "mixed": None
            if self.mixed is None
            else {
                "valid": self.mixed.valid,
                "reason": self.mixed.reason,
                "share": self.mixed.share,
                "predicted_gain": self.mixed.predicted_gain,
                "predicted_gain_ci": [self.mixed.ci_low, self.mixed.ci_high],
                "admitted": self.mixed.admitted,
                "cells": len(self.mixed.cells),
            },
        }


# ---------------------------------------------------------------------------------------------
# Building the sections (pure)
# ---------------------------------------------------------------------------------------------


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return list(table.to_pylist())


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    out = float(value)
    return out if math.isfinite(out) else None


def _identity(evidence: Evidence) -> Identity:
    from dspark_calibrate.artifacts import BINDING_FIELDS

    arts = [evidence.artifacts[k] for k in MEMBER_KINDS if k in evidence.artifacts]
    fp = arts[0].fingerprint
    fp_dict = fp.to_dict()
    rows = tuple(
        (name, display(fp_dict[name]), name in BINDING_FIELDS, name in TRTLLM_FINGERPRINT_FIELDS)
        for name in Fingerprint.field_names()
    )
    members = tuple(
        MemberIdentity(
            kind=a.kind,
            file=a.path.name,
            version=a.version,
            schema_version=a.schema_version,
            series=a.series,
            issued_at=a.issued_at,
            expires_at=a.expires_at,
            logical_sha256=a.logical_sha256,
            signer_keyids=a.signer_keyids,
            rows=a.table.num_rows,
            tool_version=a.provenance.tool_version,
            backend=a.provenance.backend,
            synthetic=a.provenance.synthetic,
            command=" ".join(a.provenance.command),
            created_at=a.provenance.created_at,
        )
        for a in arts
    )
    return Identity(rows, fp.digest(), members, evidence.bundle_version, evidence.manifest_keyids)


def _replay_stats(admission: VerifiedArtifact | None) -> dict[tuple[int, int], tuple[int, float]]:
    """``(G, V) -> (chosen steps, value ms)`` from the admission table's replay statistics."""
    if admission is None:
        return {}
    return {
        (int(r["graph_batch_size"]), int(r["verifier_budget"])): (
            int(r["chosen_steps"]),
            float(r["value_ms"]),
        )
        for r in _rows(admission.table)
    }


def _sweep_precision(art: VerifiedArtifact) -> tuple[float, bool]:
    """The sweep's precision target from the cost table's signed stopping rule, or the default."""
    rule = art.provenance.stopping_rule or {}
    value = _finite(rule.get("precision_rel"))
    if value is None or not 0.0 < value < 1.0:
        return DEFAULT_SWEEP_PRECISION_REL, False
    return value, True


def _saving(
    row: Mapping[str, Any], native_row: Mapping[str, Any] | None
) -> tuple[float, float, float] | None:
    """A compact cell's saving and its interval (``None`` for the native cell or without one)."""
    if row["verifier_budget"] == 0:
        return None
    if row.get("saving_ci_low") is not None:
        # Schema 2: the signed paired saving and its interval.
        return float(row["saving"]), float(row["saving_ci_low"]), float(row["saving_ci_high"])
    if native_row is None:
        return None
    # Schema 1: no pairing; the saving's range from the two absolute intervals.
    t, tn = float(row["step_time_ms"]), float(native_row["step_time_ms"])
    return (
        1.0 - t / tn,
        1.0 - float(row["ci_high_ms"]) / float(native_row["ci_low_ms"]),
        1.0 - float(row["ci_low_ms"]) / float(native_row["ci_high_ms"]),
    )


def _cost_group(
    g: int,
    cells: Sequence[Mapping[str, Any]],
    k: int,
    replay: Mapping[tuple[int, int], tuple[int, float]],
    has_replay: bool,
    noisy_limit: float,
) -> CostGroup:
    native_row = next((r for r in cells if r["verifier_budget"] == NATIVE_BUDGET), None)
    tokens = {
        int(r["verifier_budget"]): full_width(g, k)
        if r["verifier_budget"] == NATIVE_BUDGET
        else int(r["verifier_budget"])
        for r in cells
    }
    # Cost must not fall as more tokens are verified: a cell slower than one verifying more
    # tokens (within the same G) breaks the staircase the selector assumes (DESIGN §1).
    slower_than_bigger = {
        int(r["verifier_budget"])
        for r in cells
        for o in cells
        if tokens[int(o["verifier_budget"])] > tokens[int(r["verifier_budget"])]
        and float(r["step_time_ms"]) > float(o["step_time_ms"])
    }
    built: list[ReportedCell] = []
    for r in cells:
        v = int(r["verifier_budget"])
        t, lo, hi = float(r["step_time_ms"]), float(r["ci_low_ms"]), float(r["ci_high_ms"])
        paired = _saving(r, native_row)
        saving, saving_low, saving_high = paired if paired is not None else (None, None, None)
        wide = paired is not None and max(paired[0] - paired[1], paired[2] - paired[0]) > noisy_limit
        chosen = replay.get((g, v), (0, 0.0) if has_replay and v != 0 else None)
        built.append(
            ReportedCell(
                graph_batch_size=g,
                verifier_budget=v,
                tokens=tokens[v],
                step_time_ms=t,
                ci_low_ms=lo,
                ci_high_ms=hi,
                p10_ms=float(r["p10_ms"]),
                p90_ms=float(r["p90_ms"]),
                samples=int(r["samples"]),
                stop_reason=str(r["stop_reason"]),
                saving=saving,
                saving_low=saving_low,
                saving_high=saving_high,
                ci_half_width_rel=(hi - lo) / 2.0 / t,
                noisy=wide or str(r["stop_reason"]) != "precision",
                non_monotone=v in slower_than_bigger,
                chosen_steps=chosen[0] if chosen else None,
                value_ms=chosen[1] if chosen else None,
            )
        )
    native = next((c for c in built if c.native), None)
    compact = tuple(sorted((c for c in built if not c.native), key=lambda c: c.verifier_budget))
    return CostGroup(g, native, compact)


def _cost_section(
    art: VerifiedArtifact, admission: VerifiedArtifact | None, th: ReportThresholds
) -> CostSection:
    k = art.fingerprint.max_draft_len
    assert k is not None  # content rules (step 8) require K for a cost table
    replay = _replay_stats(admission)
    precision, recorded = _sweep_precision(art)
    limit = th.noisy_precision_multiple * precision
    raw = sorted(_rows(art.table), key=lambda r: (r["graph_batch_size"], r["verifier_budget"]))
    groups = [
        _cost_group(
            g, [r for r in raw if r["graph_batch_size"] == g], k, replay, admission is not None, limit
        )
        for g in sorted({int(r["graph_batch_size"]) for r in raw})
    ]
    mix = Counter(str(r["stop_reason"]) for r in raw)
    candidates, problems = _candidates(art.summary.get(SUMMARY_CANDIDATES), groups)
    return CostSection(
        k=k,
        groups=tuple(groups),
        stop_reasons=tuple(sorted(mix.items(), key=lambda kv: (-kv[1], kv[0]))),
        has_replay=admission is not None,
        candidates=candidates,
        problems=problems,
        precision_rel=precision,
        precision_recorded=recorded,
        noisy_limit=limit,
    )


#: Optional key of the cost table's signed summary listing the measured cells that were not
#: deployed: ``[{graph_batch_size, verifier_budget, step_time_ms, ci_low_ms, ci_high_ms}, ...]``.
SUMMARY_CANDIDATES = "candidates"


def _candidates(raw: Any, groups: Sequence[CostGroup]) -> tuple[tuple[CandidateCell, ...], tuple[str, ...]]:
    if raw is None:
        return (), ()
    entries = _seq(raw)
    if entries is None:
        return (), (f"summary.{SUMMARY_CANDIDATES} is not a list",)
    natives = {g.graph_batch_size: g.native for g in groups}
    deployed = {(c.graph_batch_size, c.verifier_budget) for g in groups for c in g.cells}
    out: list[CandidateCell] = []
    problems: list[str] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            problems.append(f"summary.{SUMMARY_CANDIDATES} entry {entry!r} is not an object")
            continue
        g, v = _count(entry.get("graph_batch_size")), _count(entry.get("verifier_budget"))
        t, lo, hi = (_finite(entry.get(n)) for n in ("step_time_ms", "ci_low_ms", "ci_high_ms"))
        if not g or not v or t is None or lo is None or hi is None or t <= 0:
            problems.append(f"summary.{SUMMARY_CANDIDATES} entry {dict(entry)!r} is malformed")
            continue
        if (g, v) in deployed:
            continue
        native = natives.get(g)
        saving = 1.0 - t / native.step_time_ms if native is not None else None
        out.append(CandidateCell(g, v, v, t, lo, hi, saving))
    return tuple(sorted(out, key=lambda c: (c.graph_batch_size, c.verifier_budget))), tuple(problems)


def _opt_float(row: Mapping[str, Any], name: str) -> float | None:
    return _finite(row.get(name))


def _seq(value: Any) -> list[Any] | None:
    return list(value) if isinstance(value, (list, tuple)) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _estimate(value: Any) -> tuple[float | None, tuple[float, float] | None]:
    """An ``Estimate.to_dict()`` (``{value, low, high}``) or a bare number."""
    if isinstance(value, Mapping):
        point, lo, hi = _finite(value.get("value")), _finite(value.get("low")), _finite(value.get("high"))
        return point, (lo, hi) if lo is not None and hi is not None else None
    return _finite(value), None


def _bins(diagram: Any) -> tuple[ReliabilityBin, ...] | None:
    """Bins of a ``Reliability.to_dict()``; ``None`` when malformed."""
    if not isinstance(diagram, Mapping):
        return None
    edges, counts = _seq(diagram.get("edges")), _seq(diagram.get("counts"))
    conf, label = _seq(diagram.get("mean_confidence")), _seq(diagram.get("mean_label"))
    if edges is None or counts is None or conf is None or label is None:
        return None
    if not (len(edges) == len(counts) + 1 == len(conf) + 1 == len(label) + 1) or not counts:
        return None
    lows = [_finite(e) for e in edges]
    if any(e is None for e in lows) or any(_count(c) is None for c in counts):
        return None
    return tuple(
        ReliabilityBin(
            float(edges[i]), float(edges[i + 1]), int(counts[i]), _finite(conf[i]), _finite(label[i])
        )
        for i in range(len(counts))
    )


def _by_position(entries: Any) -> dict[int, Mapping[str, Any]]:
    out: dict[int, Mapping[str, Any]] = {}
    for entry in _seq(entries) or []:
        if isinstance(entry, Mapping) and _count(entry.get("position")):
            out[int(entry["position"])] = entry
    return out


def _before_after(value: Any) -> tuple[Any, Any]:
    return (value.get("before"), value.get("after")) if isinstance(value, Mapping) else (None, None)


#: Method-level metrics of the signed calibration summary shown with their CIs: (summary key,
#: label). Each value is ``{"before": Estimate, "after": Estimate}`` (``fit``'s ``FitResult.summary``).
_GLOBAL_METRICS: tuple[tuple[str, str], ...] = (
    ("nll_accepted_length", "NLL of accepted length (nats/round)"),
    ("brier_survival", "survival Brier (per round)"),
    ("ea_error", "E[A] error (tokens)"),
)


def _binning_text(binning: Any) -> str | None:
    if not isinstance(binning, Mapping):
        return None
    parts = [
        f"{binning.get('bins', '?')} {binning.get('primary', 'equal_width')} bins",
        f"{binning.get('norm', '?')} norm",
    ]
    if binning.get("weights"):
        parts.append(f"weighted by {binning['weights']}")
    if binning.get("target"):
        parts.append(str(binning["target"]))
    if binning.get("interval"):
        parts.append(str(binning["interval"]))
    return "; ".join(parts)


def _calibration_rows(art: VerifiedArtifact) -> tuple[CalibrationRow, ...]:
    return tuple(
        CalibrationRow(
            position=int(r["position"]),
            method=str(r["method"]),
            temperature=_opt_float(r, "temperature"),
            params=tuple(float(p) for p in (r["params"] or ())),
            risk_set_size=int(r["risk_set_size"]),
            holdout_risk_set_size=int(r["holdout_risk_set_size"]),
            nll_before=_opt_float(r, "nll_before"),
            nll_after=_opt_float(r, "nll_after"),
            brier_before=_opt_float(r, "brier_before"),
            brier_after=_opt_float(r, "brier_after"),
            ece_before=_opt_float(r, "ece_before"),
            ece_after=_opt_float(r, "ece_after"),
        )
        for r in sorted(_rows(art.table), key=lambda r: r["position"])
    )


def _global_metrics(summary: Mapping[str, Any], missing: list[str]) -> list[MetricInterval]:
    metrics: list[MetricInterval] = []
    for key, label in _GLOBAL_METRICS:
        if not isinstance(summary.get(key), Mapping):
            missing.append(key)
            continue
        b, a = _before_after(summary[key])
        (b_val, b_ci), (a_val, a_ci) = _estimate(b), _estimate(a)
        metrics.append(MetricInterval(label, b_val, b_ci, a_val, a_ci))
    return metrics


@dataclass
class _PerPosition:
    """What the summary's ``ece.per_position`` yields, position by position."""

    metrics: list[MetricInterval]
    reliability: list[ReliabilityDiagram]
    survival: list[SurvivalPoint]


def _per_position(k: int, ece: Mapping[str, Any], missing: list[str]) -> _PerPosition:
    per_position = _by_position(ece.get("per_position"))
    out = _PerPosition([], [], [])
    no_bins: list[int] = []
    no_survival: list[int] = []
    for j in range(1, k + 1):
        entry = per_position.get(j)
        if entry is None:
            if ece:
                missing.append(f"ece.per_position[{j}]")
            continue
        b_est, a_est = _before_after(entry.get("equal_width"))
        (b_val, b_ci), (a_val, a_ci) = _estimate(b_est), _estimate(a_est)
        out.metrics.append(MetricInterval(f"ECE position {j} (equal width)", b_val, b_ci, a_val, a_ci))
        raw, fitted = _before_after(entry.get("reliability"))
        bins = _bins(fitted)
        if bins is None:
            no_bins.append(j)
        else:
            out.reliability.append(ReliabilityDiagram(j, bins, _finite(fitted.get("ece")), _bins(raw) or ()))
        pred_b, pred_a = _before_after(entry.get("mean_survival"))
        predicted, observed = _finite(pred_a), _finite(entry.get("observed_survival"))
        if predicted is None or observed is None:
            no_survival.append(j)
        else:
            out.survival.append(
                SurvivalPoint(j, predicted, observed, _finite(pred_b), _count(entry.get("labelled")))
            )
    if no_bins:
        missing.append(f"ece.per_position[].reliability (positions {no_bins})")
    if no_survival:
        missing.append(f"ece.per_position[].mean_survival/observed_survival (positions {no_survival})")
    return out


def _calibration_section(art: VerifiedArtifact) -> CalibrationSection:
    """Rows from the signed table; method-level evidence from the signed summary.

    Summary fields read (``fit``'s ``FitResult.summary``): ``nll_accepted_length``,
    ``brier_survival``, ``ea_error`` (``{before, after}`` estimates), ``holdout_rounds``,
    ``holdout_requests``, ``ece.binning``, and per position in ``ece.per_position``:
    ``equal_width.{before,after}`` (ECE estimates), ``reliability.{before,after}`` (a
    ``metrics.Reliability`` document: edges, counts, mean_confidence, mean_label, ece),
    ``mean_survival.{before,after}``, ``observed_survival`` and ``labelled``.
    """
    k = art.fingerprint.max_draft_len
    assert k is not None  # content rules (step 8) require K for a calibration
    summary = art.summary
    missing: list[str] = []
    metrics = _global_metrics(summary, missing)
    ece = summary.get("ece")
    if not isinstance(ece, Mapping):
        missing.append("ece")
        ece = {}
    positions = _per_position(k, ece, missing)
    return CalibrationSection(
        k=k,
        rows=_calibration_rows(art),
        reliability=tuple(positions.reliability),
        binning=_binning_text(ece.get("binning")),
        survival=tuple(positions.survival),
        metrics=tuple(metrics + positions.metrics),
        holdout_rounds=_count(summary.get("holdout_rounds")),
        holdout_requests=_count(summary.get("holdout_requests")),
        fallbacks=tuple(
            (int(f["position"]), str(f.get("note", "")))
            for f in _seq(summary.get("fallbacks")) or []
            if isinstance(f, Mapping) and _count(f.get("position"))
        ),
        notices=tuple(
            (str(n.get("code", "")), str(n.get("message", "")))
            for n in _seq(summary.get("warnings")) or []
            if isinstance(n, Mapping)
        ),
        missing=tuple(missing),
    )


class _SummaryReader:
    """Typed reads of a signed summary; each missing or mistyped field becomes a problem line."""

    def __init__(self, summary: Mapping[str, Any]) -> None:
        self.s = summary
        self.problems: list[str] = []

    def num(self, name: str) -> float | None:
        value = _finite(self.s.get(name))
        if value is None:
            self.problems.append(f"summary.{name} is missing or not a finite number")
        return value

    def integer(self, name: str) -> int | None:
        value = self.s.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            self.problems.append(f"summary.{name} is missing or not an integer")
            return None
        return value

    def flag(self, name: str, *, required: bool = True) -> bool | None:
        value = self.s.get(name)
        if not isinstance(value, bool):
            if required:
                self.problems.append(f"summary.{name} is missing or not a boolean")
            return None
        return value

    def text(self, name: str) -> str | None:
        value = self.s.get(name)
        if not isinstance(value, str):
            self.problems.append(f"summary.{name} is missing")
            return None
        return value


def _buckets(read: _SummaryReader) -> tuple[BucketGain, ...]:
    buckets: list[BucketGain] = []
    per_bucket = read.s.get("per_bucket")
    if per_bucket is None:
        read.problems.append("summary.per_bucket is missing")
    for entry in _seq(per_bucket) or []:
        try:
            buckets.append(
                BucketGain(
                    graph_batch_size=int(entry["graph_batch_size"]),
                    steps=int(entry["steps"]),
                    predicted_gain=float(entry["predicted_gain"]),
                    ci_low=float(entry["ci_low"]),
                    ci_high=float(entry["ci_high"]),
                    compact_share=float(entry["compact_share"]),
                )
            )
        except (KeyError, TypeError, ValueError):
            read.problems.append(f"summary.per_bucket entry {entry!r} is malformed")
    return tuple(sorted(buckets, key=lambda b: b.graph_batch_size))


def _runtime_gain_test(summary: Mapping[str, Any]) -> tuple[str, str]:
    """The runtime's own reading of the summary and its gain test: the page says what the
    admission hook will decide, not a re-implementation of it."""
    try:
        econ = AdmissionEconomics.from_summary(summary)
        verdict = gain_test(econ, econ.minimum_predicted_gain)
    except ModelError as exc:
        return "UNKNOWN", f"the runtime cannot read this summary: {exc}"
    return verdict.status.value, verdict.detail


def _admission_section(art: VerifiedArtifact) -> AdmissionSection:
    read = _SummaryReader(art.summary)
    gross = read.num("gross_compact_value_ms_lower_bound")
    overhead = read.num("fixed_confidence_path_overhead_ms_upper_bound")
    margin = read.num("safety_margin_ms")
    steps = read.integer("policy_steps")
    choices = read.integer("compact_choices")
    recomputed: float | None = None
    rule: bool | None = None
    if (
        steps is not None
        and choices is not None
        and gross is not None
        and overhead is not None
        and margin is not None
    ):
        try:
            receipt = ReceiptEconomics(steps, choices, gross, overhead, margin)
        except ModelError:
            pass  # out of range: the runtime's reading below (the gain test) names the field
        else:
            recomputed, rule = receipt.net_value_ms, receipt.admitted
    guard_raw = art.summary.get("drain_guard")
    guard = (
        tuple((str(key), display(val)) for key, val in sorted(guard_raw.items()))
        if isinstance(guard_raw, Mapping)
        else None
    )
    buckets = _buckets(read)
    status, reason = _runtime_gain_test(art.summary)
    return AdmissionSection(
        predicted_gain=read.num("predicted_gain"),
        predicted_gain_ci_low=read.num("predicted_gain_ci_low"),
        predicted_gain_ci_high=read.num("predicted_gain_ci_high"),
        static_goodput_tok_per_ms=read.num("static_goodput_tok_per_ms"),
        dynamic_goodput_tok_per_ms=read.num("dynamic_goodput_tok_per_ms"),
        compact_step_share=read.num("compact_step_share"),
        policy_steps=steps,
        compact_choices=choices,
        gross_compact_value_ms_lower_bound=gross,
        fixed_confidence_path_overhead_ms_upper_bound=overhead,
        safety_margin_ms=margin,
        net_value_ms=read.num("net_value_ms"),
        recomputed_net_value_ms=recomputed,
        admitted=read.flag("admitted"),
        receipt_rule=rule,
        minimum_predicted_gain=read.num("minimum_predicted_gain"),
        drain_guard=guard,
        workload_identity_sha256=read.text("workload_identity_sha256"),
        selector_replay_sha256=read.text("selector_replay_sha256"),
        workload_approximate=read.flag("workload_approximate", required=False),
        buckets=buckets,
        gain_status=status,
        gain_reason=reason,
        problems=tuple(read.problems),
    )


def _runtime_findings(evidence: Evidence) -> tuple[Finding, ...]:
    ct, cal = evidence.artifacts.get("cost-table"), evidence.artifacts.get("calibration")
    if ct is None or cal is None:
        return ()
    return tuple(cross_member_findings(ct, cal, evidence.artifacts.get("admission")))


# ---------------------------------------------------------------------------------------------
# What to check (pure, data-driven)
# ---------------------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def _spct(x: float) -> str:
    return f"{100.0 * x:+.1f}%"


def _verification_checks(findings: Sequence[Finding]) -> list[Check]:
    return [Check(Severity.BLOCKER, f.code, "verification", f.message) for f in findings]


def _member_checks(identity: Identity, now: datetime, th: ReportThresholds) -> list[Check]:
    out: list[Check] = []
    kinds = {m.kind for m in identity.members}
    for kind in MEMBER_KINDS:
        if kind not in kinds:
            # Without an admission the runtime has no proven gain: it would run static K, so
            # there is nothing dynamic to deploy.
            gain = kind == "admission"
            out.append(
                Check(
                    Severity.BLOCKER,
                    f"MEMBER_ABSENT:{kind}",
                    "identity",
                    f"no {kind} artifact: "
                    + (
                        "the runtime has no proven gain to admit on (gain test UNKNOWN) and would run static K"
                        if gain
                        else "a deployment needs it"
                    ),
                    kind,
                )
            )
    for m in identity.members:
        if m.synthetic:
            out.append(
                Check(
                    Severity.BLOCKER,
                    f"SYNTHETIC:{m.kind}",
                    "identity",
                    f"{m.file} was made from synthetic measurements (backend {m.backend!r}); "
                    "accepted only because synthetic evidence was allowed; never ship it to a fleet",
                    m.kind,
                )
            )
        left = m.expires_at - now
        if left < th.expiry_warning:
            out.append(
                Check(
                    Severity.WARNING,
                    f"EXPIRES_SOON:{m.kind}",
                    "identity",
                    f"{m.file} expires {m.expires_at.isoformat()} ({left.days} days left); "
                    "re-measure or re-sign before rolling out",
                    m.kind,
                )
            )
    return out


def _identity_checks(
    evidence: Evidence, identity: Identity, now: datetime, th: ReportThresholds
) -> list[Check]:
    out: list[Check] = []
    if not evidence.is_bundle:
        out.append(
            Check(
                Severity.WARNING,
                "NOT_A_BUNDLE",
                "identity",
                "loose artifacts: no signed bundle manifest binds them together; deploy the bundle `build` wrote",
            )
        )
    out += _member_checks(identity, now, th)
    unbound = [name for name, value, bound, _ in identity.fingerprint if bound and value == "—"]
    if unbound:
        out.append(
            Check(
                Severity.WARNING,
                "FINGERPRINT_UNESTABLISHED",
                "identity",
                f"fingerprint fields {unbound} are not set, so admission cannot compare them with the live "
                "deployment; rebuild with them established",
            )
        )
    versions = sorted({m.version for m in identity.members})
    if len(versions) > 1:
        out.append(
            Check(
                Severity.INFO, "VERSIONS_DIFFER", "identity", f"members carry different versions {versions}"
            )
        )
    return out


def _cell_check(severity: Severity, family: str, cell: ReportedCell | CandidateCell, message: str) -> Check:
    """A check about one cell: code ``FAMILY:G=g:V=v`` (or ``…:native``), subject ``G=g V=v``."""
    label = f"G={cell.graph_batch_size} " + (
        f"V={cell.verifier_budget}" if cell.verifier_budget else "native"
    )
    return Check(severity, f"{family}:{label.replace(' ', ':')}", "cost-table", message, label)


def _group_checks(cost: CostSection, th: ReportThresholds) -> list[Check]:
    """Per G: a native cell, a compact cell, and a saving large enough to pay."""
    out: list[Check] = []
    for g in cost.groups:
        tag, subject = f"G={g.graph_batch_size}", f"G={g.graph_batch_size}"
        if g.native is None:
            out.append(
                Check(
                    Severity.BLOCKER, f"NO_NATIVE:{tag}", "cost-table", f"{tag} has no native cell", subject
                )
            )
            continue
        best = g.best
        if best is None:
            out.append(
                Check(
                    Severity.INFO,
                    f"NATIVE_ONLY:{tag}",
                    "cost-table",
                    f"{tag} has only its native cell: this concurrency always runs static K",
                    subject,
                )
            )
        elif best.saving is not None and best.saving < th.min_saving_rel:
            out.append(
                Check(
                    Severity.WARNING,
                    f"LOW_SAVING:{tag}",
                    "cost-table",
                    f"{tag} saves < {_pct(th.min_saving_rel)} (best {best.label}: {_pct(best.saving)} of "
                    f"{g.native.step_time_ms:.3f} ms): dynamic verification cannot pay at this concurrency",
                    subject,
                )
            )
    return out


def _saving_checks(cost: CostSection) -> list[Check]:
    """Compact cells whose saving is not resolved, or whose interval is wider than the sweep allows."""
    out: list[Check] = []
    precision = f"{_pct(cost.precision_rel)} precision target" + (
        "" if cost.precision_recorded else " (assumed)"
    )
    for c in (c for g in cost.groups for c in g.compact):
        half = c.saving_half_width
        if c.saving is None or c.saving_low is None or half is None:
            continue
        if c.saving > 0 and c.saving_low <= 0:
            out.append(
                _cell_check(
                    Severity.WARNING,
                    "SAVING_UNRESOLVED",
                    c,
                    f"{c.label}: saving {_pct(c.saving)} is within the measurement noise (CI lower bound "
                    f"{_pct(c.saving_low)}); measure longer before trusting it",
                )
            )
        if half > cost.noisy_limit:
            out.append(
                _cell_check(
                    Severity.WARNING,
                    "NOISY",
                    c,
                    f"{c.label}: paired saving {_pct(c.saving)} ± {_pct(half)} is wider than "
                    f"{_pct(cost.noisy_limit)} ({_multiple(cost)} × the sweep's {precision}); "
                    "measure longer before trusting it",
                )
            )
    return out


def _multiple(cost: CostSection) -> str:
    """The noisy limit as a multiple of the sweep's precision target, for messages."""
    return f"{cost.noisy_limit / cost.precision_rel:g}"


def _cell_checks(cost: CostSection, th: ReportThresholds) -> list[Check]:
    """Per deployed cell: staircase order, stop reason, sample count, use in the replay."""
    out: list[Check] = []
    for c in cost.cells:
        if c.non_monotone:
            out.append(
                _cell_check(
                    Severity.WARNING,
                    "NON_MONOTONE",
                    c,
                    f"{c.label} ({c.tokens} tokens, {c.step_time_ms:.3f} ms) is slower than a cell of the same "
                    "G verifying more tokens; re-measure it or check for a mis-captured graph",
                )
            )
        if c.stop_reason != "precision":
            capped = c.stop_reason in ("budget", "cell_cap_samples", "cell_cap_time")
            out.append(
                _cell_check(
                    Severity.WARNING if capped else Severity.INFO,
                    "STOP_REASON",
                    c,
                    f"{c.label} stopped on {c.stop_reason!r}, not on precision",
                )
            )
        if c.samples < th.min_samples:
            out.append(
                _cell_check(Severity.WARNING, "FEW_SAMPLES", c, f"{c.label} has only {c.samples} samples")
            )
        if cost.has_replay and not c.native and c.chosen_steps == 0:
            out.append(
                _cell_check(
                    Severity.INFO,
                    "NEVER_CHOSEN",
                    c,
                    f"{c.label} is deployed but the workload replay never picked it",
                )
            )
    return out


def _cost_checks(cost: CostSection, th: ReportThresholds) -> list[Check]:
    out = _group_checks(cost, th) + _saving_checks(cost) + _cell_checks(cost, th)
    best = {g.graph_batch_size: g.best for g in cost.groups}
    for cand in cost.faster_candidates:
        top = best[cand.graph_batch_size]
        assert top is not None and top.saving is not None and cand.saving is not None
        out.append(
            _cell_check(
                Severity.INFO,
                "UNDEPLOYED_FASTER",
                cand,
                f"G={cand.graph_batch_size} V={cand.verifier_budget} was measured but not deployed "
                f"and saves {_pct(cand.saving)}, more than the best deployed {top.label} ({_pct(top.saving)}); "
                "the selection maximises replayed value, confirm it did here",
            )
        )
    out += [Check(Severity.INFO, "COST_SUMMARY_FIELD", "cost-table", problem) for problem in cost.problems]
    natives = [(g.graph_batch_size, g.native.step_time_ms) for g in cost.groups if g.native is not None]
    for (g1, t1), (g2, t2) in itertools.pairwise(natives):
        if t2 < t1:
            out.append(
                Check(
                    Severity.WARNING,
                    f"NON_MONOTONE_G:G={g2}",
                    "cost-table",
                    f"native step at G={g2} ({t2:.3f} ms) is faster than at G={g1} ({t1:.3f} ms)",
                    f"G={g2}",
                )
            )
    return out


def _position_check(severity: Severity, family: str, j: int, message: str) -> Check:
    return Check(severity, f"{family}:j={j}", "calibration", message, f"j={j}")


def _metric_checks(r: CalibrationRow, th: ReportThresholds) -> list[Check]:
    """One position's held-out metrics against their before values and limits."""
    j = r.position
    out: list[Check] = []
    if r.ece_after is not None and r.ece_before is not None and r.ece_after > r.ece_before:
        out.append(
            _position_check(
                Severity.WARNING,
                "ECE_WORSE",
                j,
                f"position {j}: ECE after calibration {r.ece_after:.4f} is worse than before {r.ece_before:.4f}",
            )
        )
    if r.ece_after is not None and r.ece_after > th.max_ece_after:
        out.append(
            _position_check(
                Severity.WARNING,
                "ECE_HIGH",
                j,
                f"position {j}: held-out ECE {r.ece_after:.4f} exceeds {th.max_ece_after:.3f}",
            )
        )
    if r.nll_after is not None and r.nll_before is not None and r.nll_after > r.nll_before:
        out.append(
            _position_check(
                Severity.WARNING,
                "NLL_WORSE",
                j,
                f"position {j}: NLL after calibration {r.nll_after:.4f} is worse than before {r.nll_before:.4f}",
            )
        )
    if r.holdout_risk_set_size < th.min_holdout_rounds:
        out.append(
            _position_check(
                Severity.WARNING,
                "SMALL_RISK_SET",
                j,
                f"position {j}: only {r.holdout_risk_set_size} held-out rounds reach it "
                f"(< {th.min_holdout_rounds}); its metrics are imprecise",
            )
        )
    return out


def _map_checks(cal: CalibrationSection) -> list[Check]:
    """Each position's map: fitted, and usable by TensorRT-LLM (an STS temperature)."""
    out: list[Check] = []
    fell_back = {pos for pos, _ in cal.fallbacks}
    for r in cal.rows:
        j = r.position
        if r.method == "identity" and j not in fell_back:
            out.append(
                _position_check(
                    Severity.WARNING,
                    "IDENTITY_FALLBACK",
                    j,
                    f"position {j} uses the neutral (identity) map: its risk set was empty or too small to fit",
                )
            )
        if r.temperature is None:
            out.append(
                _position_check(
                    Severity.BLOCKER,
                    "NO_STS_TEMPERATURE",
                    j,
                    f"position {j} has no STS temperature; TensorRT-LLM applies sequential temperature scaling",
                )
            )
    out += [
        _position_check(Severity.WARNING, "FALLBACK", pos, f"position {pos}: the fit fell back ({note})")
        for pos, note in cal.fallbacks
    ]
    return out


def _calibration_checks(cal: CalibrationSection, th: ReportThresholds) -> list[Check]:
    out = [c for r in cal.rows for c in _metric_checks(r, th)] + _map_checks(cal)
    for p in cal.survival:
        gap = p.predicted - p.observed
        if abs(gap) > th.survival_tolerance:
            out.append(
                _position_check(
                    Severity.WARNING,
                    "SURVIVAL_GAP",
                    p.position,
                    f"position {p.position}: predicted survival {p.predicted:.3f} vs observed {p.observed:.3f} "
                    f"({'over' if gap > 0 else 'under'}-confident by {abs(gap):.3f})",
                )
            )
    out += [
        Check(Severity.WARNING, f"FIT_NOTICE:{code}", "calibration", f"fit warned: {message}")
        for code, message in cal.notices
    ]
    if cal.missing:
        out.append(
            Check(
                Severity.WARNING,
                "CALIBRATION_SUMMARY_INCOMPLETE",
                "calibration",
                f"the signed calibration summary lacks {', '.join(cal.missing)}; "
                "reliability diagrams, survival or metric CIs cannot be shown",
            )
        )
    return out


def _economics_checks(adm: AdmissionSection) -> list[Check]:
    """The gain test and the receipt: what TensorRT-LLM will do with this admission."""
    out: list[Check] = []
    if adm.gain_status != "ACCEPT":
        out.append(
            Check(
                Severity.BLOCKER,
                f"GAIN_{adm.gain_status}",
                "admission",
                f"the runtime's gain test says {adm.gain_status}: {adm.gain_reason}; it would run static K",
            )
        )
    out += [Check(Severity.WARNING, "SUMMARY_FIELD", "admission", problem) for problem in adm.problems]
    if (
        adm.recomputed_net_value_ms is not None
        and adm.net_value_ms is not None
        and not math.isclose(adm.recomputed_net_value_ms, adm.net_value_ms, rel_tol=1e-6, abs_tol=1e-6)
    ):
        out.append(
            Check(
                Severity.BLOCKER,
                "NET_VALUE_MISMATCH",
                "admission",
                f"signed net value {adm.net_value_ms:.6g} ms differs from gross − steps·overhead − margin = "
                f"{adm.recomputed_net_value_ms:.6g} ms",
            )
        )
    if adm.admitted is not None and adm.receipt_rule is not None and adm.admitted != adm.receipt_rule:
        out.append(
            Check(
                Severity.BLOCKER,
                "ADMITTED_MISMATCH",
                "admission",
                f"signed admitted={adm.admitted} but the receipt rule gives {adm.receipt_rule}",
            )
        )
    if adm.drain_guard is None:
        out.append(
            Check(
                Severity.BLOCKER,
                "NO_DRAIN_GUARD",
                "admission",
                "no drain guard: TensorRT-LLM never picks a compact cell without iteration_drain_guard",
            )
        )
    return out


def _bucket_checks(adm: AdmissionSection, cost: CostSection | None) -> list[Check]:
    """Per concurrency bucket of the workload: is the gain resolved, and is every G covered."""
    out: list[Check] = []
    for b in adm.buckets:
        tag = f"G={b.graph_batch_size}"
        ci = f"CI [{_pct(b.ci_low)}, {_pct(b.ci_high)}]"
        if b.ci_low <= 0 < b.ci_high:
            message = f"{tag}: gain {_pct(b.predicted_gain)} with {ci} over {b.steps} steps includes zero"
            out.append(Check(Severity.INFO, f"BUCKET_UNDECIDED:{tag}", "admission", message, tag))
        elif b.ci_high <= 0:
            message = f"{tag}: dynamic verification loses goodput ({ci} over {b.steps} steps)"
            out.append(Check(Severity.WARNING, f"BUCKET_LOSS:{tag}", "admission", message, tag))
    if cost is not None and adm.buckets:
        absent = sorted({g.graph_batch_size for g in cost.groups} - {b.graph_batch_size for b in adm.buckets})
        if absent:
            out.append(
                Check(
                    Severity.INFO,
                    "BUCKETS_ABSENT",
                    "admission",
                    f"the workload never ran at G={absent}: nothing here predicts the gain there",
                )
            )
    return out


def _admission_checks(adm: AdmissionSection, cost: CostSection | None) -> list[Check]:
    out = _economics_checks(adm)
    if adm.workload_approximate:
        out.append(
            Check(
                Severity.WARNING,
                "WORKLOAD_APPROXIMATE",
                "admission",
                "the workload's steps were reconstructed by sampling rows (no step ids in the traces); "
                "the predicted gain is an approximation",
            )
        )
    return out + _bucket_checks(adm, cost)


def _mixed_section(evidence: Evidence) -> MixedSection | None:
    """The mixed evidence's section (None when the bundle has none)."""
    m = evidence.mixed
    if m is None:
        return None
    if not m.ok:
        return MixedSection(False, f"{m.code}: {m.message}")
    costs, adm = m.artifact("mixed-cost-table"), m.artifact("mixed-admission")
    assert costs is not None and adm is not None
    s = adm.summary
    part, dec = s["mixed_part"], s["decode_part"]
    chosen = {r["geometry_sha256"]: r for r in _rows(adm.table)}
    cells = []
    for r in _rows(costs.table):
        c = chosen.get(r["geometry_sha256"], {})
        cells.append(
            MixedCellRow(
                r["geometry_sha256"],
                r["capacity"],
                r["native_capacity"],
                max(r["native_rank_rows"]),
                max(r["actual_rank_rows"]),
                r["native_lower_ms"],
                r["candidate_upper_ms"],
                r["saving"],
                r["saving_ci_low"],
                r["saving_ci_high"],
                c.get("chosen_steps"),
                c.get("value_ms"),
            )
        )
    route = s["route"]
    return MixedSection(
        True,
        "",
        share=part.get("share"),
        workload_steps=part.get("workload_steps"),
        mixed_steps=part.get("steps"),
        priced_steps=part.get("priced_steps"),
        covered_steps=part.get("covered_steps"),
        compact_choices=s["compact_choices"],
        predicted_gain=s["predicted_gain"],
        ci_low=s["predicted_gain_ci_low"],
        ci_high=s["predicted_gain_ci_high"],
        decode_part=(dec["predicted_gain"], dec["ci_low"], dec["ci_high"]),
        mixed_part=(part["predicted_gain"], part["ci_low"], part["ci_high"]),
        net_value_ms=s["net_value_ms"],
        admitted=s["admitted"],
        gates=tuple(sorted(s["gates"].items())),
        route=(
            f"K={route['physical_k']}, world size {route['world_size']}, buckets {route['body_buckets']}, "
            f"{route['execution_mode']}"
        ),
        cells=tuple(cells),
    )


def _mixed_checks(mixed: MixedSection) -> list[Check]:
    if not mixed.valid:
        return [
            Check(
                Severity.WARNING,
                "MIXED_REFUSED",
                "mixed",
                f"the mixed evidence is refused ({mixed.reason}); mixed steps would stay native, the decode "
                "members stand",
            )
        ]
    out = []
    failed = [g for g, ok in mixed.gates if not ok]
    if failed:
        out.append(
            Check(
                Severity.WARNING,
                "MIXED_GATES",
                "mixed",
                f"mixed receipt gates {failed} not passed: no mixed receipt can be exported",
            )
        )
    if mixed.mixed_steps and mixed.priced_steps is not None and mixed.priced_steps < mixed.mixed_steps:
        out.append(
            Check(
                Severity.INFO,
                "MIXED_UNPRICED",
                "mixed",
                f"{mixed.mixed_steps - mixed.priced_steps} of {mixed.mixed_steps} mixed steps had no measured "
                "native arm: the gains leave them out",
            )
        )
    return out


def _sorted_checks(checks: Iterable[Check]) -> tuple[Check, ...]:
    order = {s: i for i, s in enumerate(REPORT_SECTIONS)}
    return tuple(sorted(checks, key=lambda c: (SEVERITY_ORDER[c.severity], order.get(c.section, 99))))


def _refused_report(evidence: Evidence, now: datetime, th: ReportThresholds) -> Report:
    """The report of input that did not verify: findings and untrusted file facts only."""
    findings = evidence.findings or (
        Finding(Reason.BUNDLE_MEMBER_MISSING, "no artifact was given or verified", field="inputs"),
    )
    first = findings[0]
    checks = _sorted_checks(_verification_checks(findings))
    verdict = make_verdict(checks, verified=False, passed={}, refusal=f"{first.code}: {first.message}")
    return Report(
        verified=False,
        headline=verdict.headline,
        generated_at=now,
        tool_version=dspark_calibrate.__version__,
        inputs=tuple(str(p) for p in evidence.inputs),
        trust_root=evidence.trust_root,
        findings=tuple(findings),
        identity=None,
        cost=None,
        calibration=None,
        admission=None,
        runtime_findings=(),
        checks=checks,
        untrusted=evidence.untrusted,
        thresholds=th,
        verdict=verdict,
        trust_root_unreadable=evidence.trust_root_unreadable,
    )


def _passed(
    evidence: Evidence,
    cost: CostSection | None,
    calibration: CalibrationSection | None,
    admission: AdmissionSection | None,
) -> dict[str, str]:
    """What each deploy gate says when it passes (a gate absent here had nothing to check)."""
    arts = evidence.artifacts
    what = f"bundle v{evidence.bundle_version}" if evidence.is_bundle else "loose artifacts"
    signers = {kid for a in arts.values() for kid in a.signer_keyids} | set(evidence.manifest_keyids)
    root = evidence.trust_root
    out = {
        # The keyids themselves, whole, are on the "signed by" line below the gates.
        "verification": f"signatures verified: {what} ({', '.join(k for k in MEMBER_KINDS if k in arts)}) "
        f"signed by {len(signers)} key(s) of trust root v{root.version if root else '?'}",
        "identity": "measured on a real deployment, "
        + ("all three members present" if len(arts) == len(MEMBER_KINDS) else "required members present"),
    }
    if cost is not None:
        out["cost-table"] = f"native cell for each of G={[g.graph_batch_size for g in cost.groups]}"
    if calibration is not None:
        out["calibration"] = f"STS temperature for each of the {calibration.k} positions"
    if admission is not None:
        gain = (
            f" {_spct(admission.predicted_gain)} (95% CI {_spct(admission.predicted_gain_ci_low)} .. "
            f"{_spct(admission.predicted_gain_ci_high)})"
            if admission.predicted_gain is not None
            and admission.predicted_gain_ci_low is not None
            and admission.predicted_gain_ci_high is not None
            else ""
        )
        out["admission"] = f"gain test ACCEPT{gain}, receipt economics consistent, drain guard present"
    return out


def build_report(evidence: Evidence, *, now: datetime, thresholds: ReportThresholds | None = None) -> Report:
    """Turn verified (or refused) evidence into the report model. Pure: no I/O, no clock.

    Only verified members feed the identity, cost-table, calibration and admission sections; a
    refused input yields a report of findings and untrusted file facts only. The verdict is a
    no-go whenever any check is a blocker, whether or not the signatures verified.

    Args:
        evidence: from :func:`collect_evidence`.
        now: the report time (expiry warnings are relative to it).
        thresholds: what the "what to check" list flags.

    Returns:
        The report model.
    """
    th = thresholds if thresholds is not None else ReportThresholds()
    if not evidence.ok:
        return _refused_report(evidence, now, th)
    arts = evidence.artifacts
    identity = _identity(evidence)
    cost = _cost_section(arts["cost-table"], arts.get("admission"), th) if "cost-table" in arts else None
    calibration = _calibration_section(arts["calibration"]) if "calibration" in arts else None
    admission = _admission_section(arts["admission"]) if "admission" in arts else None
    runtime = _runtime_findings(evidence)
    checks: list[Check] = [
        Check(Severity.BLOCKER, f.code, "verification", f"the runtime would refuse this bundle: {f.message}")
        for f in runtime
    ]
    checks += _identity_checks(evidence, identity, now, th)
    checks += _cost_checks(cost, th) if cost is not None else []
    checks += sweep_bias_checks(arts["cost-table"].table) if cost is not None else []
    checks += _calibration_checks(calibration, th) if calibration is not None else []
    checks += _admission_checks(admission, cost) if admission is not None else []
    mixed = _mixed_section(evidence)
    checks += _mixed_checks(mixed) if mixed is not None else []
    checks += receipt_checks(evidence.receipt)
    ordered = _sorted_checks(checks)
    passed = _passed(evidence, cost, calibration, admission)
    root = evidence.trust_root
    what = f"bundle v{evidence.bundle_version}" if evidence.is_bundle else "loose artifacts"
    go = f"signatures verified ({what}, trust root v{root.version if root else '?'})"
    if "admission" in passed:
        go += "; " + passed["admission"].split(",", 1)[0]
    verdict = make_verdict(ordered, verified=True, passed=passed, go_summary=go)
    return Report(
        verified=True,
        headline=verdict.headline,
        generated_at=now,
        tool_version=dspark_calibrate.__version__,
        inputs=tuple(str(p) for p in evidence.inputs),
        trust_root=evidence.trust_root,
        findings=(),
        identity=identity,
        cost=cost,
        calibration=calibration,
        admission=admission,
        runtime_findings=runtime,
        checks=ordered,
        untrusted=(),
        thresholds=th,
        verdict=verdict,
        mixed=mixed,
        facts=release_facts(
            evidence,
            identity,
            arts["admission"].summary if "admission" in arts else None,
            now=now,
            expiry_warning=th.expiry_warning,
        ),
    )
