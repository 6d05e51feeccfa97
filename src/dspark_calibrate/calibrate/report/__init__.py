"""Stage 4, the release report: one page a release engineer can approve a deployment from.

Three modules, split by what they touch:

- :mod:`.evidence` (the I/O edge): reads the trust root and the inputs (a bundle directory or
  loose signed artifacts), verifies them with the artifacts pipeline and, when that fails, lists
  what it could read of them, labelled untrusted.
- :mod:`.model` (pure): :func:`build_report` turns the evidence into a :class:`Report` — identity,
  cost-table analysis, calibration, admission economics and a "what to check" list. Only
  verified members reach those sections. :mod:`.facts` (pure) states the first screen's release
  facts: expiry, deployment, signer, the admission receipt's digest, the prediction's objective.
- :mod:`.render` (presentation): fills the Jinja2 templates in ``templates/`` with the model and
  the PNGs of :mod:`.plots`; :func:`write_report` runs the three stages and writes the page.

May import: ``artifacts`` (verification, lazily loading ``cryptography``), ``runtime_plugin``
(the admission hook's own economics, gain test and cross-member checks, so the page says what
the runtime will decide), ``schemas``, ``errors`` and ``calibrate._png``. It reads the signed
artifacts the other stages wrote, never their modules, so it imports nothing of
``measurement``, ``confidence`` or ``deployment``.

Example:
    >>> from datetime import UTC, datetime
    >>> from pathlib import Path
    >>> from dspark_calibrate.calibrate.report import build_report, collect_evidence
    >>> now = datetime(2026, 1, 1, tzinfo=UTC)
    >>> ev = collect_evidence([Path("/nonexistent")], Path("/nonexistent/root.json"), now=now)
    >>> build_report(ev, now=now).headline.startswith("DO NOT DEPLOY — NOT VERIFIED")
    True
"""

from dspark_calibrate.calibrate.report.evidence import (
    Evidence,
    ReceiptEvidence,
    TrustRootInfo,
    UntrustedInput,
    collect_evidence,
)
from dspark_calibrate.calibrate.report.facts import Fact
from dspark_calibrate.calibrate.report.model import (
    REPORT_SECTIONS,
    Check,
    Report,
    ReportThresholds,
    Severity,
    build_report,
)
from dspark_calibrate.calibrate.report.render import (
    ReportFormat,
    render_html,
    render_markdown,
    write_report,
)

__all__ = [
    "REPORT_SECTIONS",
    "Check",
    "Evidence",
    "Fact",
    "ReceiptEvidence",
    "Report",
    "ReportFormat",
    "ReportThresholds",
    "Severity",
    "TrustRootInfo",
    "UntrustedInput",
    "build_report",
    "collect_evidence",
    "render_html",
    "render_markdown",
    "write_report",
]
