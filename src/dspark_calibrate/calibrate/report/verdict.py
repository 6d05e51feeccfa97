"""The report's verdict: whether to deploy, the gates behind it, and the "what to check" list. Pure.

A release engineer reads one line first: *deploy* or *do not deploy*, with the blockers that
decide it. Signatures are one gate among several (real measurements, complete members, the
runtime's gain test, consistent receipt economics, an STS temperature per position); a bundle
whose signatures verify can still be a clear no-go. This module holds the check items the
sections produce (:class:`Check`), folds near-identical items into one line each
(:func:`group_checks`), and turns the items into the :class:`Verdict` shown on the first screen.
Building the items from the evidence is :mod:`.model`'s job.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "GATES",
    "Check",
    "CheckGroup",
    "Gate",
    "Severity",
    "Verdict",
    "group_checks",
    "make_verdict",
]


class Severity(enum.StrEnum):
    """How much a check item matters to the release decision."""

    BLOCKER = "blocker"  # do not ship this bundle as it is
    WARNING = "warning"  # look closely before approving
    INFO = "info"  # context for the reviewer


SEVERITY_ORDER = {Severity.BLOCKER: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True, slots=True)
class Check:
    """One item of the "what to check" list.

    Attributes:
        severity: blocker, warning or info.
        code: a stable short identifier (e.g. ``LOW_SAVING:G=8``) for tests and tooling; the part
            before the first ``:`` is the item's *family*.
        section: the report section the item points at.
        message: one line naming the cell, position or field, the numbers, and what it means.
        subject: the cell, position or member the item is about (``G=8 V=24``, ``j=3``,
            ``cost-table``); items of one family that name a subject fold into one line.
    """

    severity: Severity
    code: str
    section: str
    message: str
    subject: str = ""

    @property
    def family(self) -> str:
        """The code without its subject (``NOISY`` for ``NOISY:G=8:V=24``)."""
        return self.code.split(":", 1)[0]

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return {
            "severity": self.severity.value,
            "code": self.code,
            "section": self.section,
            "message": self.message,
        }


#: What a folded line says for a family, before the count and the subjects it names. A family not
#: listed here folds into its first message plus the other subjects.
FAMILY_SUMMARIES: dict[str, str] = {
    "SYNTHETIC": "made from synthetic measurements; accepted only because synthetic evidence was "
    "allowed; never ship it to a fleet",
    "EXPIRES_SOON": "expire within the warning window; re-measure or re-sign before rolling out",
    "MEMBER_ABSENT": "bundle members absent",
    "NOISY": "paired saving interval wider than the sweep's precision allows; measure longer "
    "before trusting these savings",
    "SAVING_UNRESOLVED": "saving within the measurement noise (its interval reaches 0); measure longer",
    "NON_MONOTONE": "slower than a cell of the same G verifying more tokens; re-measure or check for "
    "a mis-captured graph",
    "STOP_REASON": "stopped before reaching precision",
    "FEW_SAMPLES": "fewer samples than the report asks for",
    "NEVER_CHOSEN": "deployed but never picked in the workload replay",
    "UNDEPLOYED_FASTER": "measured but not deployed, saving more than the best deployed cell of "
    "their G; the selection maximises replayed value, confirm it did here",
    "LOW_SAVING": "best compact cell saves too little for dynamic verification to pay",
    "NATIVE_ONLY": "only the native cell: these concurrencies always run static K",
    "NO_NATIVE": "no native cell",
    "ECE_WORSE": "ECE worse after calibration than before",
    "ECE_HIGH": "held-out ECE above the limit",
    "NLL_WORSE": "NLL worse after calibration than before",
    "SMALL_RISK_SET": "held-out risk set too small for precise metrics",
    "SURVIVAL_GAP": "predicted survival off the observed rate by more than the tolerance",
    "IDENTITY_FALLBACK": "neutral (identity) map: risk set empty or too small to fit",
    "FALLBACK": "the fit fell back",
    "NO_STS_TEMPERATURE": "no STS temperature; TensorRT-LLM applies sequential temperature scaling",
    "BUCKET_UNDECIDED": "gain interval includes zero at these concurrencies",
    "BUCKET_LOSS": "dynamic verification loses goodput at these concurrencies",
    "NON_MONOTONE_G": "native step faster than at a smaller G",
}


@dataclass(frozen=True, slots=True)
class CheckGroup:
    """Near-identical check items folded into one line.

    Attributes:
        severity, section, family: shared by every item.
        message: the single item's message, or the family's summary with the count and subjects.
        codes: the codes of the items folded in, in order.
        subjects: the subjects they name (cells, positions, members).
    """

    severity: Severity
    section: str
    family: str
    message: str
    codes: tuple[str, ...]
    subjects: tuple[str, ...]

    @property
    def count(self) -> int:
        """Items folded into this line."""
        return len(self.codes)

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "severity": self.severity.value,
            "section": self.section,
            "family": self.family,
            "count": self.count,
            "message": self.message,
            "codes": list(self.codes),
            "subjects": list(self.subjects),
        }


_CELL = re.compile(r"^G=(\d+) V=(\d+)$")


def _runs(values: Sequence[int]) -> str:
    """``9–16, 20`` for 9, 10, …, 16, 20 (consecutive integers as one range)."""
    out: list[str] = []
    start = prev = values[0]
    for v in [*values[1:], None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        out.append(str(start) if start == prev else f"{start}–{prev}")
        if v is not None:
            start = prev = v
    return ", ".join(out)


def name_subjects(subjects: Sequence[str]) -> str:
    """The subjects of a folded line, compactly: cells as ``G=8: V=9–16; G=16: V=17–32``."""
    cells = [_CELL.match(s) for s in subjects]
    if subjects and all(cells):
        by_g: dict[int, list[int]] = {}
        for m in cells:
            assert m is not None
            by_g.setdefault(int(m.group(1)), []).append(int(m.group(2)))
        return "; ".join(f"G={g}: V={_runs(sorted(vs))}" for g, vs in sorted(by_g.items()))
    return ", ".join(subjects)


def group_checks(checks: Iterable[Check]) -> tuple[CheckGroup, ...]:
    """Fold the items of one severity and family that name a subject into one line each.

    The list keeps its order (the first item of a family places its line); an item without a
    subject, or alone in its family, keeps its own message.
    """
    keyed: dict[tuple[Severity, str, str], list[Check]] = {}
    for c in checks:
        # An item without a subject has nothing to name in a folded line: it stays on its own.
        key = (c.severity, c.family, "" if c.subject else f"{c.code}\n{c.message}")
        keyed.setdefault(key, []).append(c)
    out: list[CheckGroup] = []
    for (severity, family, _), items in keyed.items():
        codes = tuple(c.code for c in items)
        subjects = tuple(c.subject for c in items if c.subject)
        if len(items) == 1:
            message = items[0].message
        else:
            what = FAMILY_SUMMARIES.get(family)
            if what is None:
                what = f"{items[0].message} (and the same for the others)"
            message = f"{len(items)} × {what} — {name_subjects(subjects)}"
        out.append(CheckGroup(severity, items[0].section, family, message, codes, subjects))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Gate:
    """One deploy gate on the first screen: what it checks, whether it passed, and why.

    Attributes:
        name: what the gate checks, in a few words.
        section: the report section with the details.
        status: ``pass``, ``fail`` or ``not checked`` (an earlier gate failed, or no member to check).
        detail: one line: the numbers on a pass, the blockers on a failure.
    """

    name: str
    section: str
    status: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return {"name": self.name, "section": self.section, "status": self.status, "detail": self.detail}


#: The deploy gates in page order: (section whose blockers fail it, what it checks).
GATES: tuple[tuple[str, str], ...] = (
    ("verification", "signatures, content and the admission hook's checks"),
    ("identity", "real measurements of this deployment, every member present"),
    ("cost-table", "a native cell for every G"),
    ("calibration", "an STS temperature for every position"),
    ("admission", "the runtime's gain test and the receipt economics"),
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether to deploy, and why: the first thing on every form of the report.

    Attributes:
        deploy: True only when the input verified and no check is a blocker.
        headline: the one-line verdict (``DEPLOY — …`` or ``DO NOT DEPLOY — …``).
        gates: the deploy gates with their status.
        blockers: the blocker lines, folded.
        warnings, notes: how many warning and info items the "what to check" list holds.
    """

    deploy: bool
    headline: str
    gates: tuple[Gate, ...]
    blockers: tuple[CheckGroup, ...]
    warnings: int
    notes: int

    @property
    def status(self) -> str:
        """``GO`` or ``NO-GO`` (for ``--json`` and tooling)."""
        return "GO" if self.deploy else "NO-GO"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "deploy": self.deploy,
            "status": self.status,
            "headline": self.headline,
            "gates": [g.to_dict() for g in self.gates],
            "blockers": [b.to_dict() for b in self.blockers],
            "warnings": self.warnings,
            "notes": self.notes,
        }


def _gate(section: str, name: str, checks: Sequence[Check], passed: dict[str, str]) -> Gate:
    failing = [c for c in checks if c.severity is Severity.BLOCKER and c.section == section]
    if failing:
        groups = group_checks(failing)
        return Gate(name, section, "fail", "; ".join(g.message for g in groups))
    if section not in passed:
        return Gate(name, section, "not checked", "no member of this kind to check")
    return Gate(name, section, "pass", passed[section])


def make_verdict(
    checks: Sequence[Check],
    *,
    verified: bool,
    passed: dict[str, str],
    refusal: str | None = None,
    go_summary: str = "",
) -> Verdict:
    """The verdict from the check items.

    Args:
        checks: the whole "what to check" list (blockers decide; the rest are counted).
        verified: the input verified against the trust root.
        passed: per gate section, the line shown when it passes (a section absent here was not
            checked: no member of its kind, or the input did not verify).
        refusal: for an input that did not verify, ``CODE: message`` of its first finding.
        go_summary: what the headline says of a deployable bundle after ``DEPLOY — no blockers``.

    Returns:
        The verdict; ``deploy`` only when verified without a blocker.
    """
    blockers = group_checks(c for c in checks if c.severity is Severity.BLOCKER)
    warnings = sum(1 for c in checks if c.severity is Severity.WARNING)
    notes = sum(1 for c in checks if c.severity is Severity.INFO)
    if not verified:
        gates = tuple(
            Gate(name, section, "fail", refusal or "not verified")
            if section == "verification"
            else Gate(name, section, "not checked", "the input did not verify")
            for section, name in GATES
        )
        headline = f"DO NOT DEPLOY — NOT VERIFIED: {refusal}. Nothing in this report is trusted."
        return Verdict(False, headline, gates, blockers, warnings, notes)
    gates = tuple(_gate(section, name, checks, passed) for section, name in GATES)
    to_review = f"{warnings} warning(s) and {notes} note(s) to review"
    if blockers:
        # One blocker per line of the list below the verdict (items of one family fold into one).
        n = len(blockers)
        headline = f"DO NOT DEPLOY — {n} blocker(s): " + "; ".join(
            f"{b.family} ({', '.join(b.subjects)})" if b.count > 1 else b.codes[0] for b in blockers
        )
        headline += f". Signatures verified; {to_review}."
    else:
        headline = f"DEPLOY — no blockers{': ' + go_summary if go_summary else ''}. "
        headline += f"{to_review[0].upper()}{to_review[1:]}."
    return Verdict(not blockers, headline, gates, blockers, warnings, notes)
