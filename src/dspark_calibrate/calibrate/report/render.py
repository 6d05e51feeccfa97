"""Rendering the release report: a self-contained HTML page or Markdown, and writing it.

:func:`render_html` / :func:`render_markdown` fill the Jinja2 templates in ``templates/``; plots
come from :mod:`.plots` as embedded PNGs. The HTML has inline CSS only, no JavaScript and no
external URL. :func:`write_report` runs the three stages (collect the evidence, build the model,
render) and writes the page atomically; the CLI and ``make demo`` call it.

jinja2 is imported only when rendering, matplotlib only when plotting.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from dspark_calibrate.artifacts import atomic_write_bytes
from dspark_calibrate.calibrate.report.evidence import collect_evidence
from dspark_calibrate.calibrate.report.model import (
    REPORT_SECTIONS,
    Report,
    ReportedCell,
    ReportThresholds,
    Severity,
    build_report,
)
from dspark_calibrate.calibrate.report.plots import render_plots
from dspark_calibrate.errors import ConfigError

if TYPE_CHECKING:
    from dspark_calibrate.artifacts import Expectation, TrustRoot

__all__ = ["ReportFormat", "render_html", "render_markdown", "write_report"]

ReportFormat = Literal["html", "md"]


def _fmt(value: Any, spec: str = ".4g") -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "—" if not math.isfinite(value) else format(value, spec)
    return str(value)


def _fmt_pct(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{100.0 * value:.{digits}f}%"


def _exact(value: Any) -> str:
    """The exact value for ``data-value`` attributes (floats round-trip through ``repr``)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def _heat(saving: float | None) -> str:
    """Background of a heat-map cell: white at 0, green for savings, red for losses (±30 % saturates)."""
    if saving is None:
        return "#f4f4f4"
    x = max(-1.0, min(1.0, saving / 0.30))
    target = (0x63, 0xBE, 0x7B) if x >= 0 else (0xF8, 0x69, 0x6B)
    a = abs(x)
    r, g, b = (round(255 + (t - 255) * a) for t in target)
    return f"#{r:02x}{g:02x}{b:02x}"


def _mdcell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _environment(kind: ReportFormat) -> Any:
    try:
        import jinja2
    except ImportError as exc:
        raise ConfigError(
            "the report needs jinja2; install the 'plots' extra (pip install 'dspark-calibrate[plots]')"
        ) from exc
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("dspark_calibrate.calibrate.report", "templates"),
        autoescape=kind == "html",
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(fmt=_fmt, pct=_fmt_pct, exact=_exact, mdcell=_mdcell, heat=_heat)
    env.globals.update(Severity=Severity, sections=REPORT_SECTIONS)
    return env


def _template_context(report: Report) -> dict[str, Any]:
    heat_columns: tuple[float, ...] = ()
    heat_rows: tuple[tuple[int, tuple[ReportedCell | None, ...]], ...] = ()
    if report.cost is not None:
        heat_columns, heat_rows = report.cost.heatmap()
    present = {"verification", "what-to-check"}
    if report.verified:
        present.add("identity")
        present.update(
            name
            for name, part in (
                ("cost-table", report.cost),
                ("calibration", report.calibration),
                ("admission", report.admission),
                ("mixed", report.mixed),
            )
            if part is not None
        )
    return {
        "r": report,
        "present": present,
        "heat_columns": heat_columns,
        "heat_rows": heat_rows,
        "generated": report.generated_at.replace(microsecond=0).isoformat(),
    }


def render_html(report: Report, *, plots: bool = True) -> str:
    """Render the self-contained HTML page (inline CSS, embedded PNGs, no script, no external URL).

    Args:
        report: from :func:`build_report`.
        plots: embed matplotlib plots (needs matplotlib); without them the tables carry every number.

    Raises:
        ConfigError: jinja2 (or, with ``plots``, matplotlib) is not installed.
    """
    images: Mapping[str, str] = {}
    if plots and report.verified:
        images = render_plots(report)
    env = _environment("html")
    text: str = env.get_template("report.html.j2").render(**_template_context(report), images=images)
    return text


def render_markdown(report: Report) -> str:
    """Render the Markdown page (tables only; the plots are in the HTML form).

    Raises:
        ConfigError: jinja2 is not installed.
    """
    env = _environment("md")
    text: str = env.get_template("report.md.j2").render(**_template_context(report), images={})
    return text


def write_report(
    inputs: Sequence[Path | str],
    trust_root: Path | str | TrustRoot,
    out: Path | str,
    *,
    now: datetime,
    fmt: ReportFormat = "html",
    expected: Expectation | None = None,
    thresholds: ReportThresholds | None = None,
    plots: bool = True,
    trtllm: Path | str | None = None,
    selector_identity: str | None = None,
) -> Report:
    """Verify the inputs, build the report and write it atomically to ``out``.

    The page is written whether or not the inputs verified; its first line says which.

    Args:
        inputs: a bundle directory, or signed artifact files.
        trust_root: the pinned ``root.json`` path (or a loaded trust root).
        out: the page to write.
        now: verification and report time (timezone-aware).
        fmt: ``html`` or ``md``.
        expected: fingerprint binding and synthetic policy for verification.
        thresholds: what the "what to check" list flags.
        plots: embed plots in the HTML form.
        trtllm: the package ``export trtllm`` wrote: its receipt digest goes on the first screen,
            and a package that is not this bundle's is a blocker.
        selector_identity: the engine's selector identity, to state the receipt digest without a
            package.

    Returns:
        The report model (``report.verified`` says whether the inputs verified).

    Raises:
        ConfigError: bad arguments, a missing renderer dependency, or ``out`` cannot be written.
    """
    if fmt not in ("html", "md"):
        raise ConfigError(f"--format {fmt!r}: choose html or md")
    evidence = collect_evidence(
        inputs, trust_root, now=now, expected=expected, trtllm=trtllm, selector_identity=selector_identity
    )
    report = build_report(evidence, now=now, thresholds=thresholds)
    text = render_html(report, plots=plots) if fmt == "html" else render_markdown(report)
    try:
        atomic_write_bytes(Path(out), text.encode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"{out}: cannot write the report ({exc.strerror or exc})") from exc
    return report
