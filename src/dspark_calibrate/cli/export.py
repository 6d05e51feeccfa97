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
    EXIT_USAGE,
    AllowSyntheticFlag,
    JsonFlag,
    TrustRootOption,
    command,
    err_console,
    exit_with,
    fail,
    fail_error,
    fail_usage,
    make_app,
    out_console,
    print_json,
    utcnow,
)
from dspark_calibrate.cli.trust import load_root_or_exit
from dspark_calibrate.errors import DsparkError

__all__ = ["export_app", "register"]

export_app = make_app(None, "Export a verified bundle for a serving engine.")

_SELECTOR_HELP = (
    "The engine's selector identity: EXACT_SPS_SELECTOR_IDENTITY_SHA256 in "
    "tensorrt_llm/_torch/speculative/dspark_planner.py of the TensorRT-LLM you deploy (64 lowercase hex)."
)


@command(
    export_app,
    "trtllm",
    "dspark-calibrate export trtllm bundle/ --trust-root root.json --selector-identity HEX --out trtllm/",
    "dspark-calibrate export trtllm bundle/ --trust-root root.json --selector-identity HEX --out trtllm/ "
    "--base-options extra_llm_api_options.yaml --deploy-dir /deploy/trtllm",
)
def trtllm(
    bundle: Annotated[
        Path,
        typer.Argument(
            help="The bundle directory written by `build` (it holds bundle.dsse.json).",
            metavar="BUNDLE_DIR",
            show_default=False,
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="Directory to write the package into.", metavar="DIR")],
    trust_root: TrustRootOption,
    selector_identity: Annotated[
        str | None,
        typer.Option("--selector-identity", help=_SELECTOR_HELP, metavar="HEX", show_default=False),
    ] = None,
    deploy_dir: Annotated[
        str | None,
        typer.Option(
            "--deploy-dir",
            help="Where the files live on serving nodes (default: --out, absolute).",
            metavar="DIR",
            show_default=False,
        ),
    ] = None,
    base_options: Annotated[
        Path | None,
        typer.Option(
            "--base-options",
            help="Your extra_llm_api_options.yaml (speculative_model_dir and the rest): the DSpark fields are "
            "merged into it and the result written as --out/extra_llm_api_options.yaml.",
            metavar="BASE.yaml",
            show_default=False,
        ),
    ] = None,
    live_fingerprint: Annotated[
        Path | None,
        typer.Option(
            "--live-fingerprint",
            help="Independently collected live fingerprint JSON to bind.",
            metavar="FP.json",
            show_default=False,
        ),
    ] = None,
    allow_synthetic: AllowSyntheticFlag = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing --out directory.")] = False,
    no_mixed: Annotated[
        bool,
        typer.Option(
            "--no-mixed", help="Export the decode package only, even if the bundle has mixed evidence."
        ),
    ] = False,
    mixed_live_identity: Annotated[
        Path | None,
        typer.Option(
            "--mixed-live-identity",
            help="The mixed live identity observed on the deployment (JSON, its ten fields); default: derived "
            "from the bundle's fingerprint (docs/mixed.md).",
        ),
    ] = None,
    json_out: JsonFlag = False,
) -> None:
    """Verify BUNDLE_DIR, then write sps_table.json, sts.json, live_fingerprint.json,
    admission_receipt.json and extra_llm_api_options.yaml into --out (and the three mixed files when
    the bundle has verified mixed evidence)."""
    from dspark_calibrate.artifacts import (
        Expectation,
        ExportRejected,
        MixedIdentity,
        MixedLive,
        export_trtllm,
        is_sha256_hex,
        loads_strict,
        read_fingerprint,
        verify_bundle,
        verify_mixed,
    )

    if selector_identity is None or not is_sha256_hex(selector_identity):
        shown = "missing" if selector_identity is None else f"{selector_identity!r}, not 64 lowercase hex"
        fail_usage(
            f"--selector-identity is {shown} (a receipt is never written without it); copy "
            "EXACT_SPS_SELECTOR_IDENTITY_SHA256 from tensorrt_llm/_torch/speculative/dspark_planner.py"
        )
    from dspark_calibrate.artifacts import Reason
    from dspark_calibrate.runtime_plugin.trtllm import merge_into_base_options, write_options_yaml

    if not bundle.exists():
        fail_usage(f"{bundle}: no such file or directory; pass the bundle directory written by `build --out`")
    if bundle.suffix.lower() in (".parquet", ".pq"):
        fail_usage(
            f"{bundle}: a single artifact, not a bundle; pass the bundle directory that holds it and "
            "bundle.dsse.json (dspark-verify checks a single artifact)"
        )
    root = load_root_or_exit(trust_root)
    try:
        live = read_fingerprint(live_fingerprint) if live_fingerprint is not None else None
    except DsparkError as exc:
        fail_error(exc)
    report = verify_bundle(
        bundle, root, now=utcnow(), expected=Expectation(fingerprint=live, allow_synthetic=allow_synthetic)
    )
    if not report.ok:
        fail(
            f"{report.message}; refusing to export an unverified bundle",
            code=report.code,
            label=report.code,
            exit_code=EXIT_USAGE if report.reason is Reason.IO_ERROR else EXIT_REJECTED,
            extra={"valid": False, "bundle": report.to_dict()},
        )
    mixed = None
    identity = None
    if not no_mixed:
        try:
            if mixed_live_identity is not None:
                identity = MixedIdentity.from_dict(
                    loads_strict(mixed_live_identity.read_bytes(), what=str(mixed_live_identity)),
                    where=str(mixed_live_identity),
                )
        except (DsparkError, OSError) as exc:
            fail(f"--mixed-live-identity: {exc}", code="USAGE_ERROR")
        mixed_live = (
            MixedLive(identity.body_buckets, identity.execution_mode) if identity is not None else None
        )
        mixed = verify_mixed(
            bundle,
            root,
            now=utcnow(),
            decode=report,
            expected=Expectation(fingerprint=live, allow_synthetic=allow_synthetic, mixed=mixed_live),
        )
        if not mixed.present:
            mixed = None
        elif not mixed.ok:
            fail(
                f"{mixed.message}; refusing to export unverified mixed evidence; pass --no-mixed to export the "
                "decode package only",
                code=mixed.code,
                label=mixed.code,
                exit_code=EXIT_REJECTED,
                extra={"valid": False, "mixed": mixed.to_dict()},
            )
    try:
        exported = export_trtllm(
            report,
            out,
            selector_identity=selector_identity,
            deploy_dir=deploy_dir,
            live_fingerprint=live,
            overwrite=force,
            mixed=mixed,
            mixed_identity=identity,
            allow_synthetic=allow_synthetic,
        )
    except ExportRejected as exc:
        for f in exc.findings[1:]:
            err_console.print(f"[bold red]{f.code}[/] {f.message}", markup=False)
        first = exc.findings[0]
        fail(
            first.message,
            code=first.code,
            label=first.code,
            exit_code=EXIT_REJECTED,
            extra={"valid": False, "findings": [f.to_dict() for f in exc.findings]},
        )
    except (DsparkError, OSError) as exc:
        fail_error(exc)
    merged_note = None
    if base_options is not None:
        target = out / "extra_llm_api_options.yaml"
        try:
            write_options_yaml(target, merge_into_base_options(target, base_options))
        except DsparkError as exc:
            fail_error(exc)
        except OSError as exc:
            fail_error(exc)
        merged_note = f"merged into {base_options}: {target}"
    if json_out:
        print_json({"ok": True, "valid": True, "merged_base_options": merged_note, **exported.to_dict()})
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
        if merged_note:
            out_console.print(merged_note)
    exit_with(EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add the ``export`` group (``export trtllm``) to the app."""
    app.add_typer(export_app, name="export")
