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

import enum
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import dspark_calibrate
from dspark_calibrate.artifacts import (
    TRTLLM_FINGERPRINT_FIELDS,
    Finding,
    Fingerprint,
    ModelError,
    Reason,
)
from dspark_calibrate.calibrate.report.evidence import (
    MEMBER_KINDS,
    Evidence,
    TrustRootInfo,
    UntrustedInput,
    display,
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
    "CostCell",
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


@dataclass(frozen=True, slots=True)
class ReportThresholds:
    """Named thresholds behind the report's flags and its "what to check" list.

    None of these gate deployment (verification and the runtime's gain test do); they decide what a
    reviewer is asked to look at.

    Attributes:
        noisy_ci_rel: a cell is *noisy* when its CI half-width exceeds this fraction of its median
            (0.01 = 1 %: twice the sweep's default precision target, ``stats.Thresholds.precision_rel``).
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

    noisy_ci_rel: float = 0.01
    min_saving_rel: float = 0.02
    min_samples: int = 8
    max_ece_after: float = 0.02
    min_holdout_rounds: int = 1000
    survival_tolerance: float = 0.02
    expiry_warning: timedelta = timedelta(days=7)

    def __post_init__(self) -> None:
        for name in ("noisy_ci_rel", "min_saving_rel", "max_ece_after", "survival_tolerance"):
            value = getattr(self, name)
            if not (isinstance(value, float) and math.isfinite(value) and 0.0 <= value < 1.0):
                raise ConfigError(f"report threshold {name}={value!r} must be a number in [0, 1)")
        for name in ("min_samples", "min_holdout_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"report threshold {name}={value!r} must be an integer >= 0")
        if self.expiry_warning < timedelta(0):
            raise ConfigError("report threshold expiry_warning must not be negative")


class Severity(enum.StrEnum):
    """How much a check item matters to the release decision."""

    BLOCKER = "blocker"  # do not ship this bundle as it is
    WARNING = "warning"  # look closely before approving
    INFO = "info"  # context for the reviewer


_SEVERITY_ORDER = {Severity.BLOCKER: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True, slots=True)
class Check:
    """One item of the "what to check" list.

    Attributes:
        severity: blocker, warning or info.
        code: a stable short identifier (e.g. ``LOW_SAVING:G=8``) for tests and tooling.
        section: the report section the item points at.
        message: one line naming the cell, position or field, the numbers, and what it means.
    """

    severity: Severity
    code: str
    section: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return {
            "severity": self.severity.value,
            "code": self.code,
            "section": self.section,
            "message": self.message,
        }


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
class CostCell:
    """One cell of the cost table with what the report derives from it.

    Attributes:
        graph_batch_size, verifier_budget: the cell (V = 0 is the native full-K cell).
        tokens: tokens the step verifies: G·(K+1) for the native cell, else V.
        step_time_ms, ci_low_ms, ci_high_ms, p10_ms, p90_ms, samples, stop_reason: as signed.
        saving: 1 − T(G, V) / T(G, native); ``None`` for the native cell or when G has none.
        saving_low, saving_high: the saving's range from the two CIs (slow end of this cell against
            the fast end of the native cell, and the reverse).
        ci_half_width_rel: CI half-width over the median.
        noisy: ``ci_half_width_rel`` above the threshold, or the stop reason is not ``precision``.
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
    native: CostCell | None
    compact: tuple[CostCell, ...]

    @property
    def cells(self) -> tuple[CostCell, ...]:
        """Native first, then compact cells by V."""
        return ((self.native,) if self.native is not None else ()) + self.compact

    @property
    def best(self) -> CostCell | None:
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
    """

    k: int
    groups: tuple[CostGroup, ...]
    stop_reasons: tuple[tuple[str, int], ...]
    has_replay: bool
    candidates: tuple[CandidateCell, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def cells(self) -> tuple[CostCell, ...]:
        """Every cell, by G then V (native first)."""
        return tuple(c for g in self.groups for c in g.cells)

    def flags(self, cell: CostCell) -> tuple[str, ...]:
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

    def heatmap(self) -> tuple[tuple[float, ...], tuple[tuple[int, tuple[CostCell | None, ...]], ...]]:
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
        headline: the page's first line (``VERIFIED …`` or ``NOT VERIFIED …``).
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
    trust_root_unreadable: bool = False
    mixed: MixedSection | None = None

    @property
    def blockers(self) -> tuple[Check, ...]:
        """Checks of severity blocker."""
        return tuple(c for c in self.checks if c.severity is Severity.BLOCKER)

    @property
    def io_error(self) -> bool:
        """True when an input or the trust root could not be read (the CLI exits 2)."""
        return bool(self.findings) and (
            self.findings[0].reason is Reason.IO_ERROR or self.trust_root_unreadable
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary (for ``--json``)."""
        return {
            "verified": self.verified,
            "headline": self.headline,
            "generated_at": self.generated_at.isoformat(),
            "tool_version": self.tool_version,
            "inputs": list(self.inputs),
            "findings": [f.to_dict() for f in self.findings],
            "runtime_findings": [f.to_dict() for f in self.runtime_findings],
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


def _cost_section(
    art: VerifiedArtifact, admission: VerifiedArtifact | None, th: ReportThresholds
) -> CostSection:
    k = art.fingerprint.max_draft_len
    assert k is not None  # content rules (step 8) require K for a cost table
    replay: dict[tuple[int, int], tuple[int, float]] = {}
    if admission is not None:
        for r in _rows(admission.table):
            replay[(int(r["graph_batch_size"]), int(r["verifier_budget"]))] = (
                int(r["chosen_steps"]),
                float(r["value_ms"]),
            )
    raw = sorted(_rows(art.table), key=lambda r: (r["graph_batch_size"], r["verifier_budget"]))
    groups: list[CostGroup] = []
    for g in sorted({int(r["graph_batch_size"]) for r in raw}):
        cells = [r for r in raw if r["graph_batch_size"] == g]
        native_row = next((r for r in cells if r["verifier_budget"] == 0), None)
        tokens = {
            int(r["verifier_budget"]): (
                g * (k + 1) if r["verifier_budget"] == 0 else int(r["verifier_budget"])
            )
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
        built: list[CostCell] = []
        for r in cells:
            v = int(r["verifier_budget"])
            t, lo, hi = float(r["step_time_ms"]), float(r["ci_low_ms"]), float(r["ci_high_ms"])
            saving = saving_low = saving_high = None
            if v != 0 and r.get("saving_ci_low") is not None:
                # Schema 2: the signed paired saving and its interval.
                saving = float(r["saving"])
                saving_low, saving_high = float(r["saving_ci_low"]), float(r["saving_ci_high"])
            elif v != 0 and native_row is not None:
                # Schema 1: no pairing; the saving's range from the two absolute intervals.
                tn = float(native_row["step_time_ms"])
                saving = 1.0 - t / tn
                saving_low = 1.0 - hi / float(native_row["ci_low_ms"])
                saving_high = 1.0 - lo / float(native_row["ci_high_ms"])
            half_rel = (hi - lo) / 2.0 / t
            chosen = replay.get((g, v))
            built.append(
                CostCell(
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
                    ci_half_width_rel=half_rel,
                    noisy=half_rel > th.noisy_ci_rel or str(r["stop_reason"]) != "precision",
                    non_monotone=v in slower_than_bigger,
                    chosen_steps=chosen[0] if chosen else (0 if admission is not None and v != 0 else None),
                    value_ms=chosen[1] if chosen else (0.0 if admission is not None and v != 0 else None),
                )
            )
        native = next((c for c in built if c.native), None)
        compact = tuple(sorted((c for c in built if not c.native), key=lambda c: c.verifier_budget))
        groups.append(CostGroup(g, native, compact))
    mix = Counter(str(r["stop_reason"]) for r in raw)
    candidates, problems = _candidates(art.summary.get(SUMMARY_CANDIDATES), groups)
    return CostSection(
        k=k,
        groups=tuple(groups),
        stop_reasons=tuple(sorted(mix.items(), key=lambda kv: (-kv[1], kv[0]))),
        has_replay=admission is not None,
        candidates=candidates,
        problems=problems,
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
    rows = tuple(
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
    summary = art.summary
    missing: list[str] = []
    metrics: list[MetricInterval] = []
    for key, label in _GLOBAL_METRICS:
        if not isinstance(summary.get(key), Mapping):
            missing.append(key)
            continue
        b, a = _before_after(summary[key])
        (b_val, b_ci), (a_val, a_ci) = _estimate(b), _estimate(a)
        metrics.append(MetricInterval(label, b_val, b_ci, a_val, a_ci))
    ece = summary.get("ece")
    if not isinstance(ece, Mapping):
        missing.append("ece")
        ece = {}
    per_position = _by_position(ece.get("per_position"))
    reliability: list[ReliabilityDiagram] = []
    survival: list[SurvivalPoint] = []
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
        metrics.append(MetricInterval(f"ECE position {j} (equal width)", b_val, b_ci, a_val, a_ci))
        raw, fitted = _before_after(entry.get("reliability"))
        bins = _bins(fitted)
        if bins is None:
            no_bins.append(j)
        else:
            reliability.append(ReliabilityDiagram(j, bins, _finite(fitted.get("ece")), _bins(raw) or ()))
        pred_b, pred_a = _before_after(entry.get("mean_survival"))
        predicted, observed = _finite(pred_a), _finite(entry.get("observed_survival"))
        if predicted is None or observed is None:
            no_survival.append(j)
        else:
            survival.append(
                SurvivalPoint(j, predicted, observed, _finite(pred_b), _count(entry.get("labelled")))
            )
    if no_bins:
        missing.append(f"ece.per_position[].reliability (positions {no_bins})")
    if no_survival:
        missing.append(f"ece.per_position[].mean_survival/observed_survival (positions {no_survival})")
    holdout_rounds, holdout_requests = (
        _count(summary.get("holdout_rounds")),
        _count(summary.get("holdout_requests")),
    )
    return CalibrationSection(
        k=k,
        rows=rows,
        reliability=tuple(reliability),
        binning=_binning_text(ece.get("binning")),
        survival=tuple(survival),
        metrics=tuple(metrics),
        holdout_rounds=holdout_rounds,
        holdout_requests=holdout_requests,
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


def _admission_section(art: VerifiedArtifact) -> AdmissionSection:
    s = art.summary
    problems: list[str] = []

    def num(name: str) -> float | None:
        value = _finite(s.get(name))
        if value is None:
            problems.append(f"summary.{name} is missing or not a finite number")
        return value

    def integer(name: str) -> int | None:
        value = s.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            problems.append(f"summary.{name} is missing or not an integer")
            return None
        return value

    def flag(name: str, *, required: bool = True) -> bool | None:
        value = s.get(name)
        if not isinstance(value, bool):
            if required:
                problems.append(f"summary.{name} is missing or not a boolean")
            return None
        return value

    def text(name: str) -> str | None:
        value = s.get(name)
        if not isinstance(value, str):
            problems.append(f"summary.{name} is missing")
            return None
        return value

    gross = num("gross_compact_value_ms_lower_bound")
    overhead = num("fixed_confidence_path_overhead_ms_upper_bound")
    margin = num("safety_margin_ms")
    steps = integer("policy_steps")
    choices = integer("compact_choices")
    recomputed = None
    rule = None
    if gross is not None and overhead is not None and margin is not None and steps is not None:
        recomputed = gross - steps * overhead - margin
        if choices is not None:
            rule = choices > 0 and recomputed > 0
    guard_raw = s.get("drain_guard")
    guard = (
        tuple((str(key), display(val)) for key, val in sorted(guard_raw.items()))
        if isinstance(guard_raw, Mapping)
        else None
    )
    buckets: list[BucketGain] = []
    per_bucket = s.get("per_bucket")
    if per_bucket is None:
        problems.append("summary.per_bucket is missing")
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
            problems.append(f"summary.per_bucket entry {entry!r} is malformed")
    # The runtime's own reading of the summary and its gain test: the page says what the admission
    # hook will decide, not a re-implementation of it.
    try:
        econ = AdmissionEconomics.from_summary(s)
        minimum = econ.minimum_predicted_gain
        verdict = gain_test(econ, minimum)
        status, reason = verdict.status.value, verdict.detail
    except ModelError as exc:
        status, reason = "UNKNOWN", f"the runtime cannot read this summary: {exc}"
    return AdmissionSection(
        predicted_gain=num("predicted_gain"),
        predicted_gain_ci_low=num("predicted_gain_ci_low"),
        predicted_gain_ci_high=num("predicted_gain_ci_high"),
        static_goodput_tok_per_ms=num("static_goodput_tok_per_ms"),
        dynamic_goodput_tok_per_ms=num("dynamic_goodput_tok_per_ms"),
        compact_step_share=num("compact_step_share"),
        policy_steps=steps,
        compact_choices=choices,
        gross_compact_value_ms_lower_bound=gross,
        fixed_confidence_path_overhead_ms_upper_bound=overhead,
        safety_margin_ms=margin,
        net_value_ms=num("net_value_ms"),
        recomputed_net_value_ms=recomputed,
        admitted=flag("admitted"),
        receipt_rule=rule,
        minimum_predicted_gain=num("minimum_predicted_gain"),
        drain_guard=guard,
        workload_identity_sha256=text("workload_identity_sha256"),
        selector_replay_sha256=text("selector_replay_sha256"),
        workload_approximate=flag("workload_approximate", required=False),
        buckets=tuple(sorted(buckets, key=lambda b: b.graph_batch_size)),
        gain_status=status,
        gain_reason=reason,
        problems=tuple(problems),
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


def _verification_checks(findings: Sequence[Finding]) -> list[Check]:
    return [Check(Severity.BLOCKER, f.code, "verification", f.message) for f in findings]


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
                "loose artifacts: no signed bundle manifest binds them together; "
                "deploy the bundle `build` wrote",
            )
        )
    kinds = {m.kind for m in identity.members}
    for kind in ("cost-table", "calibration", "admission"):
        if kind not in kinds:
            out.append(
                Check(
                    Severity.BLOCKER if kind != "admission" else Severity.WARNING,
                    f"MEMBER_ABSENT:{kind}",
                    "identity",
                    f"no {kind} artifact: "
                    + (
                        "the runtime has no proven gain to admit on (gain test UNKNOWN)"
                        if kind == "admission"
                        else "a deployment needs it"
                    ),
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
                )
            )
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


def _cost_checks(cost: CostSection, th: ReportThresholds) -> list[Check]:
    out: list[Check] = []
    for g in cost.groups:
        if g.native is None:
            out.append(
                Check(
                    Severity.BLOCKER,
                    f"NO_NATIVE:G={g.graph_batch_size}",
                    "cost-table",
                    f"G={g.graph_batch_size} has no native cell",
                )
            )
            continue
        best = g.best
        if best is None:
            out.append(
                Check(
                    Severity.INFO,
                    f"NATIVE_ONLY:G={g.graph_batch_size}",
                    "cost-table",
                    f"G={g.graph_batch_size} has only its native cell: this concurrency always runs static K",
                )
            )
        elif best.saving is not None and best.saving < th.min_saving_rel:
            out.append(
                Check(
                    Severity.WARNING,
                    f"LOW_SAVING:G={g.graph_batch_size}",
                    "cost-table",
                    f"G={g.graph_batch_size} saves < {_pct(th.min_saving_rel)} (best {best.label}: "
                    f"{_pct(best.saving)} of {g.native.step_time_ms:.3f} ms): "
                    "dynamic verification cannot pay "
                    "at this concurrency",
                )
            )
        for c in g.compact:
            if c.saving_low is not None and c.saving is not None and c.saving > 0 and c.saving_low <= 0:
                out.append(
                    Check(
                        Severity.WARNING,
                        f"SAVING_UNRESOLVED:{c.label.replace(' ', ':')}",
                        "cost-table",
                        f"{c.label}: saving {_pct(c.saving)} is within the measurement noise (CI lower bound "
                        f"{_pct(c.saving_low)}); measure longer before trusting it",
                    )
                )
    for c in cost.cells:
        tag = c.label.replace(" ", ":")
        if c.non_monotone:
            out.append(
                Check(
                    Severity.WARNING,
                    f"NON_MONOTONE:{tag}",
                    "cost-table",
                    f"{c.label} ({c.tokens} tokens, {c.step_time_ms:.3f} ms) is slower than a cell "
                    "of the same G "
                    "verifying more tokens; re-measure it or check for a mis-captured graph",
                )
            )
        if c.ci_half_width_rel > th.noisy_ci_rel:
            out.append(
                Check(
                    Severity.WARNING,
                    f"NOISY:{tag}",
                    "cost-table",
                    f"{c.label}: CI half-width {_pct(c.ci_half_width_rel)} of the median exceeds "
                    f"{_pct(th.noisy_ci_rel)}",
                )
            )
        if c.stop_reason != "precision":
            out.append(
                Check(
                    Severity.WARNING
                    if c.stop_reason in ("budget", "cell_cap_samples", "cell_cap_time")
                    else Severity.INFO,
                    f"STOP_REASON:{tag}",
                    "cost-table",
                    f"{c.label} stopped on {c.stop_reason!r}, not on precision",
                )
            )
        if c.samples < th.min_samples:
            out.append(
                Check(
                    Severity.WARNING,
                    f"FEW_SAMPLES:{tag}",
                    "cost-table",
                    f"{c.label} has only {c.samples} samples",
                )
            )
        if cost.has_replay and not c.native and c.chosen_steps == 0:
            out.append(
                Check(
                    Severity.INFO,
                    f"NEVER_CHOSEN:{tag}",
                    "cost-table",
                    f"{c.label} is deployed but the workload replay never picked it",
                )
            )
    for cand in cost.candidates:
        group = next((g for g in cost.groups if g.graph_batch_size == cand.graph_batch_size), None)
        best = group.best if group is not None else None
        if (
            cand.saving is not None
            and best is not None
            and best.saving is not None
            and cand.saving > best.saving
        ):
            out.append(
                Check(
                    Severity.INFO,
                    f"UNDEPLOYED_FASTER:G={cand.graph_batch_size}:V={cand.verifier_budget}",
                    "cost-table",
                    f"G={cand.graph_batch_size} V={cand.verifier_budget} was measured but not deployed "
                    f"and saves {_pct(cand.saving)}, more than the best deployed {best.label} "
                    f"({_pct(best.saving)}); "
                    "the selection maximises replayed value, confirm it did here",
                )
            )
    for problem in cost.problems:
        out.append(Check(Severity.INFO, "COST_SUMMARY_FIELD", "cost-table", problem))
    natives = [(g.graph_batch_size, g.native.step_time_ms) for g in cost.groups if g.native is not None]
    for (g1, t1), (g2, t2) in itertools.pairwise(natives):
        if t2 < t1:
            out.append(
                Check(
                    Severity.WARNING,
                    f"NON_MONOTONE_G:G={g2}",
                    "cost-table",
                    f"native step at G={g2} ({t2:.3f} ms) is faster than at G={g1} ({t1:.3f} ms)",
                )
            )
    return out


def _calibration_checks(cal: CalibrationSection, th: ReportThresholds) -> list[Check]:
    out: list[Check] = []
    for r in cal.rows:
        j = r.position
        if r.ece_after is not None and r.ece_before is not None and r.ece_after > r.ece_before:
            out.append(
                Check(
                    Severity.WARNING,
                    f"ECE_WORSE:j={j}",
                    "calibration",
                    f"position {j}: ECE after calibration {r.ece_after:.4f} is worse than "
                    f"before {r.ece_before:.4f}",
                )
            )
        if r.ece_after is not None and r.ece_after > th.max_ece_after:
            out.append(
                Check(
                    Severity.WARNING,
                    f"ECE_HIGH:j={j}",
                    "calibration",
                    f"position {j}: held-out ECE {r.ece_after:.4f} exceeds {th.max_ece_after:.3f}",
                )
            )
        if r.nll_after is not None and r.nll_before is not None and r.nll_after > r.nll_before:
            out.append(
                Check(
                    Severity.WARNING,
                    f"NLL_WORSE:j={j}",
                    "calibration",
                    f"position {j}: NLL after calibration {r.nll_after:.4f} is worse than "
                    f"before {r.nll_before:.4f}",
                )
            )
        if r.holdout_risk_set_size < th.min_holdout_rounds:
            out.append(
                Check(
                    Severity.WARNING,
                    f"SMALL_RISK_SET:j={j}",
                    "calibration",
                    f"position {j}: only {r.holdout_risk_set_size} held-out rounds reach it "
                    f"(< {th.min_holdout_rounds}); its metrics are imprecise",
                )
            )
        if r.method == "identity" and j not in {pos for pos, _ in cal.fallbacks}:
            out.append(
                Check(
                    Severity.WARNING,
                    f"IDENTITY_FALLBACK:j={j}",
                    "calibration",
                    f"position {j} uses the neutral (identity) map: its risk set was empty "
                    "or too small to fit",
                )
            )
        if r.temperature is None:
            out.append(
                Check(
                    Severity.BLOCKER,
                    f"NO_STS_TEMPERATURE:j={j}",
                    "calibration",
                    f"position {j} has no STS temperature; TensorRT-LLM applies sequential "
                    "temperature scaling",
                )
            )
    for p in cal.survival:
        gap = p.predicted - p.observed
        if abs(gap) > th.survival_tolerance:
            out.append(
                Check(
                    Severity.WARNING,
                    f"SURVIVAL_GAP:j={p.position}",
                    "calibration",
                    f"position {p.position}: predicted survival {p.predicted:.3f} "
                    f"vs observed {p.observed:.3f} "
                    f"({'over' if gap > 0 else 'under'}-confident by {abs(gap):.3f})",
                )
            )
    for pos, note in cal.fallbacks:
        out.append(
            Check(
                Severity.WARNING,
                f"FALLBACK:j={pos}",
                "calibration",
                f"position {pos}: the fit fell back ({note})",
            )
        )
    for code, message in cal.notices:
        out.append(Check(Severity.WARNING, f"FIT_NOTICE:{code}", "calibration", f"fit warned: {message}"))
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


def _admission_checks(adm: AdmissionSection, cost: CostSection | None, th: ReportThresholds) -> list[Check]:
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
    for problem in adm.problems:
        out.append(Check(Severity.WARNING, "SUMMARY_FIELD", "admission", problem))
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
    for b in adm.buckets:
        if b.ci_low <= 0 < b.ci_high:
            out.append(
                Check(
                    Severity.INFO,
                    f"BUCKET_UNDECIDED:G={b.graph_batch_size}",
                    "admission",
                    f"G={b.graph_batch_size}: gain {_pct(b.predicted_gain)} "
                    f"with CI [{_pct(b.ci_low)}, {_pct(b.ci_high)}] "
                    f"over {b.steps} steps includes zero",
                )
            )
        elif b.ci_high <= 0:
            out.append(
                Check(
                    Severity.WARNING,
                    f"BUCKET_LOSS:G={b.graph_batch_size}",
                    "admission",
                    f"G={b.graph_batch_size}: dynamic verification loses goodput (CI [{_pct(b.ci_low)}, "
                    f"{_pct(b.ci_high)}] over {b.steps} steps)",
                )
            )
    if cost is not None and adm.buckets:
        ladder = {g.graph_batch_size for g in cost.groups}
        seen = {b.graph_batch_size for b in adm.buckets}
        absent = sorted(ladder - seen)
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
    return tuple(sorted(checks, key=lambda c: (_SEVERITY_ORDER[c.severity], order.get(c.section, 99))))


def build_report(evidence: Evidence, *, now: datetime, thresholds: ReportThresholds | None = None) -> Report:
    """Turn verified (or refused) evidence into the report model. Pure: no I/O, no clock.

    Only verified members feed the identity, cost-table, calibration and admission sections; a
    refused input yields a report of findings and untrusted file facts only.

    Args:
        evidence: from :func:`collect_evidence`.
        now: the report time (expiry warnings are relative to it).
        thresholds: what the "what to check" list flags.

    Returns:
        The report model.
    """
    th = thresholds if thresholds is not None else ReportThresholds()
    version = dspark_calibrate.__version__
    inputs = tuple(str(p) for p in evidence.inputs)
    if not evidence.ok:
        findings = evidence.findings or (
            Finding(Reason.BUNDLE_MEMBER_MISSING, "no artifact was given or verified", field="inputs"),
        )
        first = findings[0]
        headline = (
            f"NOT VERIFIED — {first.code}: {first.message}. Nothing in this report is trusted; do not deploy."
        )
        return Report(
            verified=False,
            headline=headline,
            generated_at=now,
            tool_version=version,
            inputs=inputs,
            trust_root=evidence.trust_root,
            findings=tuple(findings),
            identity=None,
            cost=None,
            calibration=None,
            admission=None,
            runtime_findings=(),
            checks=_sorted_checks(_verification_checks(findings)),
            untrusted=evidence.untrusted,
            thresholds=th,
            trust_root_unreadable=evidence.trust_root_unreadable,
        )
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
    if cost is not None:
        checks += _cost_checks(cost, th)
    if calibration is not None:
        checks += _calibration_checks(calibration, th)
    if admission is not None:
        checks += _admission_checks(admission, cost, th)
    mixed = _mixed_section(evidence)
    if mixed is not None:
        checks += _mixed_checks(mixed)
    ordered = _sorted_checks(checks)
    what = f"bundle v{evidence.bundle_version}" if evidence.is_bundle else "artifacts"
    kinds = ", ".join(k for k in MEMBER_KINDS if k in arts)
    signers = sorted({kid for a in arts.values() for kid in a.signer_keyids} | set(evidence.manifest_keyids))
    root = evidence.trust_root
    n_block = sum(1 for c in ordered if c.severity is Severity.BLOCKER)
    n_warn = sum(1 for c in ordered if c.severity is Severity.WARNING)
    headline = (
        f"VERIFIED — {what} ({kinds}) signed by {', '.join(k[:16] for k in signers)} against trust root "
        f"v{root.version if root else '?'}; {n_block} blocker(s), {n_warn} warning(s) to check."
    )
    return Report(
        verified=True,
        headline=headline,
        generated_at=now,
        tool_version=version,
        inputs=inputs,
        trust_root=root,
        findings=(),
        identity=identity,
        cost=cost,
        calibration=calibration,
        admission=admission,
        runtime_findings=runtime,
        checks=ordered,
        untrusted=(),
        thresholds=th,
        mixed=mixed,
    )
