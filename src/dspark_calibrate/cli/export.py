"""``dspark-calibrate export trtllm``: write TensorRT-LLM's DSpark deployment package.

The bundle is verified first (the one verification pipeline); unverified input is refused. The
package is validated against every consumer rule before anything is written.

Exit codes: 0 written, 1 the bundle or the package is rejected, 2 usage or I/O errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from dspark_calibrate.cli._common import (
    EXIT_OK,
    EXIT_REJECTED,
    AllowSyntheticFlag,
    ArtifactPath,
    JsonFlag,
    TrustRootOption,
    err_console,
    exit_with,
    fail_usage,
    out_console,
    print_json,
    utcnow,
)
from dspark_calibrate.cli.trust import load_root_or_exit
from dspark_calibrate.errors import DsparkError

__all__ = ["export_app", "register"]

export_app = typer.Typer(help="Export a verified bundle for a serving engine.", no_args_is_help=True)

_SELECTOR_HELP = (
    "The engine's selector identity: EXACT_SPS_SELECTOR_IDENTITY_SHA256 in "
    "tensorrt_llm/_torch/speculative/dspark_planner.py of the TensorRT-LLM you deploy (64 lowercase hex)."
)


@export_app.command("trtllm")
def trtllm(
    bundle: ArtifactPath,
    out: Annotated[Path, typer.Option("--out", help="Directory to write the package into.")],
    trust_root: TrustRootOption,
    selector_identity: Annotated[str | None, typer.Option("--selector-identity", help=_SELECTOR_HELP)] = None,
    deploy_dir: Annotated[
        str | None,
        typer.Option("--deploy-dir", help="Where the files live on serving nodes (default: --out)."),
    ] = None,
    live_fingerprint: Annotated[
        Path | None,
        typer.Option("--live-fingerprint", help="Independently collected live fingerprint JSON to bind."),
    ] = None,
    allow_synthetic: AllowSyntheticFlag = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out directory.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Verify BUNDLE, then write sps_table.json, sts.json, live_fingerprint.json, admission_receipt.json and
    extra_llm_api_options.yaml into --out."""
    from dspark_calibrate.artifacts import (
        Expectation,
        ExportRejected,
        export_trtllm,
        is_sha256_hex,
        read_fingerprint,
        verify_bundle,
    )

    if selector_identity is None or not is_sha256_hex(selector_identity):
        shown = "missing" if selector_identity is None else repr(selector_identity)
        fail_usage(f"--selector-identity is {shown}; a receipt is never written without it. {_SELECTOR_HELP}")
    root = load_root_or_exit(trust_root)
    try:
        live = read_fingerprint(live_fingerprint) if live_fingerprint is not None else None
    except DsparkError as exc:
        fail_usage(str(exc))
    report = verify_bundle(
        bundle, root, now=utcnow(), expected=Expectation(fingerprint=live, allow_synthetic=allow_synthetic)
    )
    if not report.ok:
        if json_out:
            print_json(
                {"valid": False, "code": report.code, "message": report.message, "bundle": report.to_dict()}
            )
        err_console.print(f"[bold red]{report.code}[/] {report.message}")
        err_console.print("refusing to export an unverified bundle")
        exit_with(EXIT_REJECTED)
    try:
        exported = export_trtllm(
            report,
            out,
            selector_identity=selector_identity,
            deploy_dir=deploy_dir,
            live_fingerprint=live,
            overwrite=force,
        )
    except ExportRejected as exc:
        if json_out:
            print_json(
                {"valid": False, "code": "EXPORT_REJECTED", "findings": [f.to_dict() for f in exc.findings]}
            )
        for f in exc.findings:
            err_console.print(f"[bold red]{f.code}[/] {f.message}")
        exit_with(EXIT_REJECTED)
    except (DsparkError, OSError) as exc:
        fail_usage(str(exc))
    if json_out:
        print_json({"valid": True, **exported.to_dict()})
    else:
        table = Table(title=f"TensorRT-LLM package {out}", title_justify="left")
        table.add_column("file")
        table.add_column("sha256")
        for name, digest in exported.to_dict()["files"].items():
            table.add_row(name, digest)
        out_console.print(table)
        out_console.print(f"confidence_admission_receipt_sha256: {exported.receipt_sha256}")
        out_console.print(
            f"admitted: {'yes' if exported.admitted else 'no (TensorRT-LLM will run static K)'}"
        )
        for note in exported.notes:
            out_console.print(f"note: {note}")
    exit_with(EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add the ``export`` group (``export trtllm``) to the app."""
    app.add_typer(export_app, name="export")
