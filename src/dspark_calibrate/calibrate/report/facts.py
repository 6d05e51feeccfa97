"""The release facts on the report's first screen, beside the verdict and its gates. Pure.

A release engineer approving a deployment must not hunt for: when the evidence expires, which
deployment it is bound to (and which of its fields were never established), who signed it, the
SHA-256 of the admission receipt that ``extra_llm_api_options.yaml`` pins, and what the
prediction assumes (its objective and the serving regime). :func:`release_facts` states each in
one line, digests and keyids whole; a fact the evidence does not state says "not stated" rather
than guessing. :func:`receipt_checks` turns an exported package that is not this bundle's into a
blocker. No I/O, no clock: the evidence is read and verified by :mod:`.evidence`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from dspark_calibrate.calibrate.report.evidence import (
    CLAIMED_FIELDS,
    Evidence,
    ReceiptEvidence,
    TrustRootInfo,
)
from dspark_calibrate.calibrate.report.verdict import Check, Severity

__all__ = ["FACT_KEYS", "NOT_STATED", "Fact", "IdentityView", "receipt_checks", "release_facts"]

#: The facts in first-screen order.
FACT_KEYS: tuple[str, ...] = ("expiry", "deployment", "signer", "receipt", "prediction")
#: What the page says of a fact the signed evidence does not state.
NOT_STATED = "not stated"


@dataclass(frozen=True, slots=True)
class Fact:
    """One line of the first screen's release facts.

    Attributes:
        key: which fact (one of :data:`FACT_KEYS`).
        label: the row heading.
        text: the fact in one line; digests and keyids whole.
        status: ``ok``, ``warn`` (look before approving) or ``missing`` (not stated by the evidence).
        value: the machine-readable value (an expiry time, keyids, a digest, the objective), or None.
    """

    key: str
    label: str
    text: str
    status: str
    value: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        """JSON-ready form."""
        return {"key": self.key, "label": self.label, "text": self.text, "status": self.status, "value": self.value}


class _Member(Protocol):
    """What the facts read of a verified member (``model.MemberIdentity``)."""

    @property
    def kind(self) -> str: ...
    @property
    def expires_at(self) -> datetime: ...
    @property
    def signer_keyids(self) -> tuple[str, ...]: ...


class IdentityView(Protocol):
    """What the facts read of the report's identity section (``model.Identity``)."""

    @property
    def fingerprint(self) -> tuple[tuple[str, str, bool, bool], ...]: ...
    @property
    def fingerprint_digest(self) -> str: ...
    @property
    def members(self) -> Sequence[_Member]: ...
    @property
    def manifest_keyids(self) -> tuple[str, ...]: ...


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}{'s' if n != 1 else ''}"


def _span(left: timedelta) -> str:
    """``12 days``, ``6 days 23 hours``, ``5 hours``: how long until an expiry (hours shown while
    they still matter, under ten days)."""
    days, hours = left.days, max(0, int(left.seconds // 3600))
    if days >= 10:
        return _plural(days, "day")
    if days >= 1:
        return _plural(days, "day") + (f" {_plural(hours, 'hour')}" if hours else "")
    return _plural(max(0, int(left.total_seconds() // 3600)), "hour")


def _when(t: datetime) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC")


def _expiry(identity: IdentityView, root: TrustRootInfo | None, now: datetime, warning: timedelta) -> Fact:
    first = min(identity.members, key=lambda m: m.expires_at)
    left = first.expires_at - now
    alone = len({m.expires_at for m in identity.members}) > 1
    text = f"{_when(first.expires_at)}, in {_span(left)} ({first.kind}"
    text += ", the first to expire)" if alone else ", with every member)"
    if root is not None:
        text += f"; trust root v{root.version} until {_when(root.expires)}"
    status = "warn" if left < warning else "ok"
    if status == "warn":
        text += "; re-measure or re-sign before rolling out"
    return Fact("expiry", "expires", text, status, first.expires_at.isoformat())


def _deployment(identity: IdentityView) -> Fact:
    fields = {name: value for name, value, _, _ in identity.fingerprint}
    # The fingerprint fields shown first (the rest are in the Identity section) are the ones an
    # untrusted input's claims show: enough to recognise a deployment.
    shown = {name: fields.get(name, "—") for name in CLAIMED_FIELDS}
    missing = [name for name, value in fields.items() if value == "—"]
    text = (
        f"GPU {shown['gpu']} ×{shown['gpu_count']}, topology {shown['topology']}, K={shown['max_draft_len']}, "
        f"graph ladder {shown['rank_local_graph_batch_sizes']}; engine source {fields.get('source_head', '—')}, "
        f"runtime {fields.get('runtime_snapshot', '—')}"
    )
    text += f"; not established: {', '.join(missing)}" if missing else "; every field established"
    return Fact("deployment", "deployment", text, "warn" if missing else "ok", identity.fingerprint_digest)


def _signer(evidence: Evidence, identity: IdentityView) -> Fact:
    keyids = sorted({k for m in identity.members for k in m.signer_keyids} | set(identity.manifest_keyids))
    root = evidence.trust_root
    schemes = dict(root.key_schemes) if root is not None else {}
    parts = [f"{kid} ({schemes.get(kid, 'unknown scheme')})" for kid in keyids]
    text = ", ".join(parts)
    if root is not None:
        trusted = sum(1 for k in keyids if k in root.artifact_keyids)
        text += (
            f": {trusted} of the {len(root.artifact_keyids)} artifact key(s) of trust root v{root.version}, "
            f"{root.artifact_threshold} needed"
        )
    return Fact("signer", "signed by", text, "ok", ",".join(keyids))


def _receipt(receipt: ReceiptEvidence | None, has_admission: bool) -> Fact:
    if not has_admission:
        return Fact("receipt", "admission receipt", f"{NOT_STATED}: no admission member, so no receipt", "missing")
    if receipt is None:
        return Fact(
            "receipt",
            "admission receipt",
            f"{NOT_STATED}: give the package `export trtllm` wrote (--trtllm DIR), or the engine's "
            "--selector-identity, to show the sha256 that extra_llm_api_options.yaml pins",
            "missing",
        )
    if receipt.sha256 is None:
        return Fact("receipt", "admission receipt", f"not rendered: {receipt.problem}", "warn")
    if receipt.problem is not None:
        text = f"sha256 {receipt.sha256} is what this bundle exports; {receipt.problem}"
        return Fact("receipt", "admission receipt", text, "warn", receipt.sha256)
    if receipt.package is not None:
        where = f"of {receipt.package}/admission_receipt.json, which its extra_llm_api_options.yaml pins"
    else:
        where = f"the options pin for selector identity {receipt.selector_identity}"
    return Fact("receipt", "admission receipt", f"sha256 {receipt.sha256}, {where}", "ok", receipt.sha256)


def _stated(summary: Mapping[str, Any], key: str) -> str | None:
    value = summary.get(key)
    return str(value) if isinstance(value, str) and value else None


def _prediction(summary: Mapping[str, Any] | None) -> Fact:
    if summary is None:
        return Fact("prediction", "prediction", f"{NOT_STATED}: no admission member", "missing")
    objective, regime = _stated(summary, "objective"), _stated(summary, "regime")
    source, planner = _stated(summary, "regime_source"), _stated(summary, "planner")
    share = summary.get("mixed_share")
    mixed = (
        f"{100 * share:.1f}%"
        if isinstance(share, (int, float)) and not isinstance(share, bool)
        else NOT_STATED
    )
    text = f"objective {objective or NOT_STATED}; regime {regime or NOT_STATED}"
    # The first screen says how the regime was established in a word; the sentence is in build.json.
    if source:
        how = source.split(":", 1)[0].split(" (", 1)[0].split(";", 1)[0]
        text += f" ({how}{': no queue depth recorded' if how.startswith('assumed') else ''})"
    text += f"; planner overhead charged: {planner or NOT_STATED}; share of mixed steps: {mixed}"
    status = "ok" if objective and regime else "missing"
    return Fact("prediction", "prediction", text, status, objective)


def release_facts(
    evidence: Evidence,
    identity: IdentityView,
    admission_summary: Mapping[str, Any] | None,
    *,
    now: datetime,
    expiry_warning: timedelta,
) -> tuple[Fact, ...]:
    """The first screen's facts of verified evidence, in :data:`FACT_KEYS` order.

    Args:
        evidence: the verified evidence (its trust root and receipt).
        identity: the report's identity section (members, fingerprint, signers).
        admission_summary: the admission member's signed summary, or None without one.
        now: the report time.
        expiry_warning: an expiry sooner than this is a warning.
    """
    return (
        _expiry(identity, evidence.trust_root, now, expiry_warning),
        _deployment(identity),
        _signer(evidence, identity),
        _receipt(evidence.receipt, admission_summary is not None),
        _prediction(admission_summary),
    )


def receipt_checks(receipt: ReceiptEvidence | None) -> Sequence[Check]:
    """A blocker when the package given is not this bundle's (its receipt, or the pin of its options)."""
    if receipt is None or receipt.problem is None:
        return []
    # Without a receipt, or with one the options do not pin, TensorRT-LLM runs static K.
    code = "RECEIPT_UNAVAILABLE" if receipt.sha256 is None else "RECEIPT_MISMATCH"
    return [Check(Severity.BLOCKER, code, "admission", receipt.problem)]
