"""``dspark-calibrate report``: one page a release engineer can approve a deployment from.

Verifies the bundle (or loose artifacts) against the pinned trust root, then writes a
self-contained HTML page (or Markdown with ``--format md``) through
``dspark_calibrate.calibrate.report.write_report``. The page is written whether or not the input
verified; its first line says which.

Exit codes: 0 verified; 1 the input did not verify (page still written), or ``--strict`` and the
page lists blockers; 2 usage or I/O error (an unreadable input or trust root still gets a page).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.markup import escape

from dspark_calibrate.cli._common import (
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_USAGE,
    AllowSyntheticFlag,
    JsonFlag,
    TrustRootOption,
    check_output_file,
    command,
    err_console,
    exit_with,
    fail,
    fail_error,
    fail_usage,
    out_console,
    print_json,
    split_fix,
    stage_line,
    utcnow,
)
from dspark_calibrate.cli._numeric import check_max_age_days
from dspark_calibrate.cli.trust import not_a_trust_root
from dspark_calibrate.errors import DsparkError

if TYPE_CHECKING:
    from dspark_calibrate.calibrate.report import Report

__all__ = ["ReportFormatOption", "register", "report"]


class ReportFormatOption(enum.StrEnum):
    """Page formats of ``--format``."""

    HTML = "html"
    MD = "md"


TrtllmPackageOption = Annotated[
    Path | None,
    typer.Option(
        "--trtllm",
        help="The package `export trtllm` wrote for this bundle: the first screen shows its receipt's "
        "sha256 (what extra_llm_api_options.yaml pins), and a package of another bundle is a blocker.",
        metavar="DIR",
        show_default=False,
    ),
]
SelectorIdentityOption = Annotated[
    str | None,
    typer.Option(
        "--selector-identity",
        help="The engine's EXACT_SPS_SELECTOR_IDENTITY_SHA256: states the receipt's sha256 without a package.",
        metavar="HEX",
        show_default=False,
    ),
]
ForceFlag = Annotated[bool, typer.Option("--force", help="Replace an existing --out page.")]


def report(
    inputs: Annotated[
        list[Path],
        typer.Argument(
            help="A bundle directory, or signed artifact files (cost-table, calibration, admission).",
            show_default=False,
        ),
    ],
    trust_root: TrustRootOption,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Page to write (default: report.html or report.md).")
    ] = None,
    fmt: Annotated[ReportFormatOption, typer.Option("--format", help="html (plots embedded) or md.")] = (
        ReportFormatOption.HTML
    ),
    expect_fingerprint: Annotated[
        Path | None,
        typer.Option("--expect-fingerprint", help="Fingerprint JSON the evidence must be bound to."),
    ] = None,
    allow_synthetic: AllowSyntheticFlag = False,
    max_age_days: Annotated[
        float | None,
        typer.Option(
            "--max-age-days",
            help="Refuse artifacts issued longer ago than this (default: no limit).",
            metavar="DAYS",
            show_default=False,
            callback=check_max_age_days,
        ),
    ] = None,
    plots: Annotated[bool, typer.Option("--plots/--no-plots", help="Embed plots in the HTML page.")] = True,
    strict: Annotated[
        bool,
        typer.Option("--strict", help="Exit 1 when the page lists a blocker, even if the input verified."),
    ] = False,
    trtllm: TrtllmPackageOption = None,
    selector_identity: SelectorIdentityOption = None,
    force: ForceFlag = False,
    json_out: JsonFlag = False,
) -> None:
    """Verify INPUTS and write the release report; its first line is the deploy verdict.

    Exit 0 verified, 1 rejected (or ``--strict`` with a blocker), 2 usage or I/O error.
    """
    if max_age_days is not None and max_age_days <= 0:
        fail_usage(
            f"--max-age-days {max_age_days:g} is not positive; give the largest acceptable age in days"
        )
    target = out if out is not None else Path(f"report.{fmt.value}")
    _check_arguments(target, fmt, trust_root, force=force)
    _check_package(trtllm, selector_identity)
    stage_line("report", "verifying and rendering", str(target))
    result = _write(
        inputs,
        trust_root,
        target,
        fmt,
        _Expect(expect_fingerprint, allow_synthetic, max_age_days),
        plots,
        package=(trtllm, selector_identity),
    )
    _finish(result, target, strict=strict, json_out=json_out)


def _finish(result: Report, target: Path, *, strict: bool, json_out: bool) -> NoReturn:
    """Print the first screen (or ``--json``) and exit: 0 verified, 1 rejected or ``--strict`` with
    a blocker, 2 an unreadable input or trust root."""
    if result.io_error:
        code = EXIT_USAGE
    elif not result.verified or (strict and result.blockers):
        code = EXIT_REJECTED
    else:
        code = EXIT_OK
    if not result.verified:
        first = result.findings[0]
        err_console.print(f"[bold red]REJECTED[/] {escape(first.code)}: {escape(first.message)}")
    if json_out:
        _print_json(result, target, code)
    else:
        _print_verdict(result)
        out_console.print(f"report written to {escape(str(target))}")
    exit_with(code)


def _check_arguments(target: Path, fmt: ReportFormatOption, trust_root: Path, *, force: bool) -> None:
    """Exit 2 before any verification when the page cannot be written where asked (a directory,
    another format's suffix, an existing page without ``--force``) or the trust root is
    recognisably something else (a key, a Parquet file)."""
    suffixes = (".html", ".htm") if fmt is ReportFormatOption.HTML else (".md", ".markdown")
    try:
        check_output_file(target, suffixes=suffixes, what=f"the {fmt.value} page", force=force)
    except DsparkError as exc:
        fail_error(exc)
    wrong = not_a_trust_root(trust_root)
    if wrong is not None:
        fail(wrong, code="NOT_A_TRUST_ROOT")


def _check_package(trtllm: Path | None, selector_identity: str | None) -> None:
    """Exit 2 before any verification on a --trtllm that is no package or a malformed selector identity."""
    from dspark_calibrate.artifacts import RECEIPT_FILE, is_sha256_hex

    if trtllm is not None and not (trtllm / RECEIPT_FILE).is_file():
        fail_usage(
            f"--trtllm {trtllm}: no {RECEIPT_FILE} in it; give the directory `dspark-calibrate export trtllm` wrote"
        )
    if selector_identity is not None and not is_sha256_hex(selector_identity):
        fail_usage(
            f"--selector-identity {selector_identity!r} is not 64 lowercase hex characters; copy "
            "EXACT_SPS_SELECTOR_IDENTITY_SHA256 from tensorrt_llm/_torch/speculative/dspark_planner.py"
        )


@dataclass(frozen=True, slots=True)
class _Expect:
    """What the evidence must be: bound to a fingerprint file, synthetic allowed, not too old."""

    fingerprint: Path | None
    allow_synthetic: bool
    max_age_days: float | None


def _write(
    inputs: list[Path],
    trust_root: Path,
    target: Path,
    fmt: ReportFormatOption,
    expect: _Expect,
    plots: bool,
    *,
    package: tuple[Path | None, str | None],
) -> Report:
    from dspark_calibrate.artifacts import Expectation, read_fingerprint
    from dspark_calibrate.calibrate.report import write_report

    try:
        fingerprint = read_fingerprint(expect.fingerprint) if expect.fingerprint is not None else None
        expected = Expectation(
            fingerprint=fingerprint,
            allow_synthetic=expect.allow_synthetic,
            max_age=timedelta(days=expect.max_age_days) if expect.max_age_days is not None else None,
        )
        trtllm, selector_identity = package
        return write_report(
            inputs,
            trust_root,
            target,
            now=utcnow(),
            fmt=fmt.value,
            expected=expected,
            plots=plots,
            trtllm=trtllm,
            selector_identity=selector_identity,
        )
    except DsparkError as exc:
        fail_error(exc)


def _print_verdict(result: Report) -> None:
    """The report's first screen on the terminal: the verdict, its gates, the blockers."""
    verdict = result.verdict
    out_console.print(escape(result.headline), style="bold green" if verdict.deploy else "bold red")
    for gate in verdict.gates:
        style = {"pass": "green", "fail": "red"}.get(gate.status, "dim")
        out_console.print(f"  [{style}]{gate.status:>11}[/]  {escape(gate.name)}: {escape(gate.detail)}")
    for fact in result.facts:
        style = {"warn": "yellow", "missing": "dim"}.get(fact.status, "")
        label = f"[{style}]{fact.label:>17}[/]" if style else f"{fact.label:>17}"
        out_console.print(f"  {label}  {escape(fact.text)}")
    for n, blocker in enumerate(verdict.blockers, 1):
        out_console.print(f"  [red]blocker {n}[/] ({escape(blocker.section)}) {escape(blocker.message)}")
    if verdict.warnings or verdict.notes:
        out_console.print(
            f"  {verdict.warnings} warning(s) and {verdict.notes} note(s) in the page's What to check list"
        )


def _print_json(result: Report, target: Path, code: int) -> None:
    top = result.findings[0] if result.findings and code != EXIT_OK else None
    blocker = result.verdict.blockers[0] if result.verdict.blockers else None
    error: str | None = None
    message: str | None = None
    fix: str | None = None
    if top is not None:
        error, message, fix = top.code, top.message, split_fix(top.message)[1]
    elif code and blocker is not None:
        error, message, fix = "BLOCKERS", blocker.message, "fix the blockers the report lists, then rebuild"
    print_json(
        {
            "ok": code == EXIT_OK,
            "error": error,
            "message": message,
            "fix": fix,
            "out": str(target),
            "exit_code": code,
            **result.to_dict(),
        }
    )


def register(app: typer.Typer) -> None:
    """Add ``report`` to the app."""
    command(
        app,
        "report",
        "dspark-calibrate report bundle/ --trust-root root.json --out report.html",
        "dspark-calibrate report bundle/ --trust-root root.json --format md --out report.md",
    )(report)
