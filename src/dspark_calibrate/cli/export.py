"""``dspark-calibrate export trtllm``: write TensorRT-LLM's DSpark deployment package.

The bundle is verified first (the one verification pipeline); unverified input is refused. The
package is validated against every consumer rule before anything is written.

Exit codes: 0 written, 1 the bundle or the package is rejected, 2 usage or I/O errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dspark_calibrate.cli._common import (
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_USAGE,
    AllowSyntheticFlag,
    JsonFlag,
    TrustRootOption,
    check_output_dir,
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


BundleDirArgument = Annotated[
    Path,
    typer.Argument(
        help="The bundle directory written by `build` (it holds bundle.dsse.json).",
        metavar="BUNDLE_DIR",
        show_default=False,
    ),
]
PackageDirOption = Annotated[
    Path, typer.Option("--out", help="Directory to write the package into.", metavar="DIR")
]
SelectorIdentityOption = Annotated[
    str | None,
    typer.Option("--selector-identity", help=_SELECTOR_HELP, metavar="HEX", show_default=False),
]
DeployDirOption = Annotated[
    str | None,
    typer.Option(
        "--deploy-dir",
        help="Where the files live on serving nodes (default: --out, absolute).",
        metavar="DIR",
        show_default=False,
    ),
]
BaseOptionsOption = Annotated[
    Path | None,
    typer.Option(
        "--base-options",
        help="Your extra_llm_api_options.yaml (speculative_model_dir and the rest): the DSpark fields are "
        "merged into it and the result written as --out/extra_llm_api_options.yaml.",
        metavar="BASE.yaml",
        show_default=False,
    ),
]
LiveFingerprintOption = Annotated[
    Path | None,
    typer.Option(
        "--live-fingerprint",
        help="Independently collected live fingerprint JSON to bind.",
        metavar="FP.json",
        show_default=False,
    ),
]
ForceFlag = Annotated[bool, typer.Option("--force", help="Replace an existing --out directory.")]
NoMixedFlag = Annotated[
    bool,
    typer.Option("--no-mixed", help="Export the decode package only, even if the bundle has mixed evidence."),
]
MixedLiveIdentityOption = Annotated[
    Path | None,
    typer.Option(
        "--mixed-live-identity",
        help="The mixed live identity observed on the deployment (JSON, its ten fields); default: derived "
        "from the bundle's fingerprint (docs/mixed.md).",
    ),
]


@command(
    export_app,
    "trtllm",
    "dspark-calibrate export trtllm bundle/ --trust-root root.json --selector-identity HEX --out trtllm/",
    "dspark-calibrate export trtllm bundle/ --trust-root root.json --selector-identity HEX --out trtllm/ "
    "--base-options extra_llm_api_options.yaml --deploy-dir /deploy/trtllm",
)
def trtllm(
    bundle: BundleDirArgument,
    out: PackageDirOption,
    trust_root: TrustRootOption,
    selector_identity: SelectorIdentityOption = None,
    deploy_dir: DeployDirOption = None,
    base_options: BaseOptionsOption = None,
    live_fingerprint: LiveFingerprintOption = None,
    allow_synthetic: AllowSyntheticFlag = False,
    force: ForceFlag = False,
    no_mixed: NoMixedFlag = False,
    mixed_live_identity: MixedLiveIdentityOption = None,
    json_out: JsonFlag = False,
) -> None:
    """Verify BUNDLE_DIR, then write sps_table.json, sts.json, live_fingerprint.json,
    admission_receipt.json and extra_llm_api_options.yaml into --out (and the three mixed files when
    the bundle has verified mixed evidence)."""
    from dspark_calibrate.artifacts import read_fingerprint

    identity_hex = _check_invocation(bundle, selector_identity)
    root = load_root_or_exit(trust_root)
    try:
        check_output_dir(out, force=force)
        live = read_fingerprint(live_fingerprint) if live_fingerprint is not None else None
    except DsparkError as exc:
        fail_error(exc)
    report = _verified_bundle(bundle, root, live, allow_synthetic)
    mixed, identity = (None, None)
    if not no_mixed:
        mixed, identity = _verified_mixed(bundle, root, report, live, allow_synthetic, mixed_live_identity)
    exported = _write_package(
        report,
        out,
        selector_identity=identity_hex,
        deploy_dir=deploy_dir,
        live_fingerprint=live,
        overwrite=force,
        mixed=mixed,
        mixed_identity=identity,
        allow_synthetic=allow_synthetic,
    )
    merged_note = _merge_base_options(out, base_options) if base_options is not None else None
    if json_out:
        print_json({"ok": True, "valid": True, "merged_base_options": merged_note, **exported.to_dict()})
    else:
        _print_package(exported, out, merged_note)
    exit_with(EXIT_OK)


def _check_invocation(bundle: Path, selector_identity: str | None) -> str:
    """The selector identity, once it and BUNDLE_DIR are well-formed; exits 2 otherwise."""
    from dspark_calibrate.artifacts import is_sha256_hex

    if selector_identity is None or not is_sha256_hex(selector_identity):
        shown = "missing" if selector_identity is None else f"{selector_identity!r}, not 64 lowercase hex"
        fail_usage(
            f"--selector-identity is {shown} (a receipt is never written without it); copy "
            "EXACT_SPS_SELECTOR_IDENTITY_SHA256 from tensorrt_llm/_torch/speculative/dspark_planner.py"
        )
    if not bundle.exists():
        fail_usage(f"{bundle}: no such file or directory; pass the bundle directory written by `build --out`")
    if bundle.suffix.lower() in (".parquet", ".pq"):
        fail_usage(
            f"{bundle}: a single artifact, not a bundle; pass the bundle directory that holds it and "
            "bundle.dsse.json (dspark-verify checks a single artifact)"
        )
    return selector_identity


def _verified_bundle(bundle: Path, root: Any, live: Any, allow_synthetic: bool) -> Any:
    """The bundle's verification report; exits 1 (2 on an I/O error) unless it verifies."""
    from dspark_calibrate.artifacts import Expectation, Reason, verify_bundle

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
    return report


def _read_mixed_identity(path: Path | None) -> Any:
    """The ``--mixed-live-identity`` file's identity (None when not given); exits 2 when unreadable."""
    from dspark_calibrate.artifacts import (
        MAX_FINGERPRINT_FILE_BYTES,
        MixedIdentity,
        loads_strict,
        read_regular_file,
    )

    try:
        if path is not None:  # bounded: a FIFO or a huge file is refused, never waited on or read
            data = read_regular_file(path, MAX_FINGERPRINT_FILE_BYTES)
            return MixedIdentity.from_dict(loads_strict(data, what=str(path)), where=str(path))
    except (DsparkError, OSError) as exc:
        fail(f"--mixed-live-identity: {exc}", code="USAGE_ERROR")
    return None


def _verified_mixed(
    bundle: Path, root: Any, report: Any, live: Any, allow_synthetic: bool, identity_path: Path | None
) -> tuple[Any, Any]:
    """``(mixed report, mixed identity)``: the bundle's verified mixed evidence, or ``(None, identity)``
    when it has none; exits 1 when it has some that does not verify."""
    from dspark_calibrate.artifacts import Expectation, MixedLive, verify_mixed

    identity = _read_mixed_identity(identity_path)
    mixed_live = MixedLive(identity.body_buckets, identity.execution_mode) if identity is not None else None
    mixed = verify_mixed(
        bundle,
        root,
        now=utcnow(),
        decode=report,
        expected=Expectation(fingerprint=live, allow_synthetic=allow_synthetic, mixed=mixed_live),
    )
    if not mixed.present:
        return None, identity
    if not mixed.ok:
        fail(
            f"{mixed.message}; refusing to export unverified mixed evidence; pass --no-mixed to export the "
            "decode package only",
            code=mixed.code,
            label=mixed.code,
            exit_code=EXIT_REJECTED,
            extra={"valid": False, "mixed": mixed.to_dict()},
        )
    return mixed, identity


def _write_package(report: Any, out: Path, **options: Any) -> Any:
    """``export_trtllm(report, out, **options)``; exits 1 on the package's findings, 2 on I/O errors."""
    from dspark_calibrate.artifacts import ExportRejected, export_trtllm

    try:
        return export_trtllm(report, out, **options)
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


def _merge_base_options(out: Path, base_options: Path) -> str:
    """Merge the written DSpark options into ``--base-options``; the note saying so."""
    from dspark_calibrate.runtime_plugin.trtllm import merge_into_base_options, write_options_yaml

    target = out / "extra_llm_api_options.yaml"
    try:
        write_options_yaml(target, merge_into_base_options(target, base_options))
    except (DsparkError, OSError) as exc:
        fail_error(exc)
    return f"merged into {base_options}: {target}"


def _print_package(exported: Any, out: Path, merged_note: str | None) -> None:
    """The human summary: the files and their digests, the receipt, admission and notes.

    The digests are printed whole, one file a line in ``sha256sum`` format (``sha256sum -c``
    checks the copied package with them)."""
    out_console.print(f"TensorRT-LLM package {out}/ (sha256sum format):")
    for name, digest in exported.to_dict()["files"].items():
        out_console.print(f"{digest}  {out / name}")
    out_console.print(f"confidence_admission_receipt_sha256: {exported.receipt_sha256}")
    out_console.print(f"admitted: {'yes' if exported.admitted else 'no (TensorRT-LLM will run static K)'}")
    for note in exported.notes:
        out_console.print(f"note: {note}")
    if merged_note:
        out_console.print(merged_note)


def register(app: typer.Typer) -> None:
    """Add the ``export`` group (``export trtllm``) to the app."""
    app.add_typer(export_app, name="export")
