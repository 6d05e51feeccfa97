"""``dspark-verify``: verify signed artifacts and bundles against a pinned trust root.

Exit codes: 0 every input valid, 1 any rejected (reason code and fix on stderr), 2 usage or I/O
error. A failed verification never exits 0.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from dspark_calibrate.cli._common import (
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_USAGE,
    AllowSyntheticFlag,
    CliCommand,
    JsonFlag,
    LiveAttention,
    LiveBodyBuckets,
    LiveCheckpoint,
    LiveExecutionMode,
    LiveGpu,
    LiveGpuCount,
    LiveGpuSnapshot,
    LiveKvDtype,
    LiveModelConfig,
    LiveMoe,
    LiveOptions,
    LiveRuntimeSnapshot,
    LiveSourceDiff,
    LiveSourceDir,
    LiveSourceHead,
    LiveTopology,
    VersionFlag,
    err_console,
    example,
    exit_with,
    fail_error,
    fail_usage,
    make_app,
    out_console,
    print_json,
    split_fix,
    utcnow,
)
from dspark_calibrate.cli.trust import load_root_or_exit
from dspark_calibrate.cli.verify_runtime import (
    BaseOptionsOption,
    EmitTrtllmOption,
    FailOpenOption,
    SelectorIdentityOption,
    TrtllmDirOption,
    run_runtime,
    runtime_requested,
)
from dspark_calibrate.errors import ConfigError, DsparkError

if TYPE_CHECKING:
    from dspark_calibrate.artifacts import Finding, TrustRoot

__all__ = ["LiveOptions", "RootChainOption", "read_root_chain", "verify_app"]

RootChainOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--root-chain",
        help="A root.json between the newest trust root recorded in --state and --trust-root "
        "(repeatable; needed when the pinned root skips versions).",
        metavar="ROOT.json",
        show_default=False,
    ),
]

verify_app = make_app(
    "dspark-verify",
    "Verify dspark-calibrate artifacts: signature, integrity, freshness, binding, content.",
    group=False,
)

_EXAMPLES = example(
    "dspark-verify bundle/ --trust-root root.json",
    "dspark-verify cost-table.parquet --key keys/signing-key.pub.pem",
    "dspark-verify bundle/ --trust-root root.json --live --live-k 5 --live-ladder 8,16,32 --live-topology TP1",
    "dspark-verify bundle/ --trust-root root.json --live-k 5 --live-ladder 8,16,32 --live-topology TP1 \\",
    "    --selector-identity HEX --emit-trtllm-options opts.yaml --fail-open-to-static",
)


def _trust(trust_root: Path | None, key: Path | None) -> tuple[TrustRoot, dict[str, Any]]:
    """The trust root to verify against: the pinned ``root.json``, or one public key (``--key``)."""
    from dspark_calibrate.artifacts import load_public_key, single_key_root

    if (trust_root is None) == (key is None):
        fail_usage(
            "give either --trust-root ROOT.json (a pinned trust root) or --key PUB.pem (one public key), "
            "not both and not neither; see README.md, step 1"
        )
    if trust_root is not None:
        root = load_root_or_exit(trust_root)
        return root, {"path": str(trust_root), "version": root.version, "digest": root.digest()}
    assert key is not None
    try:
        public = load_public_key(key)
        root = single_key_root(public, now=utcnow())
    except DsparkError as exc:
        fail_error(exc)
    return root, {"key": str(key), "keyid": public.keyid}


def read_root_chain(paths: list[Path] | None) -> list[bytes]:
    """The ``--root-chain`` files' bytes (bounded reads).

    Raises:
        ConfigError: a file cannot be read; the message names it.
    """
    from dspark_calibrate.artifacts import MAX_TRUST_ROOT_BYTES, read_regular_file

    out = []
    for path in paths or []:
        try:
            out.append(read_regular_file(path, MAX_TRUST_ROOT_BYTES))
        except OSError as exc:
            raise ConfigError(
                f"--root-chain {path}: cannot read ({exc.strerror or exc}); pass a root.json file"
            ) from exc
    return out


def _diff_table(findings: list[Finding]) -> Table | None:
    rows = [f for f in findings if f.reason.value.startswith("FINGERPRINT_")]
    if not rows:
        return None
    table = Table(title="fingerprint differences", title_justify="left")
    table.add_column("field")
    table.add_column("artifact")
    table.add_column("expected / live")
    for f in rows:
        table.add_row(f.field or "", json.dumps(f.actual), json.dumps(f.expected))
    return table


@verify_app.command(cls=CliCommand, epilog=_EXAMPLES)
def main(
    artifacts: Annotated[
        list[Path],
        typer.Argument(
            help="Signed Parquet artifacts and/or bundle directories.", metavar="PATH...", show_default=False
        ),
    ],
    trust_root: Annotated[
        Path | None,
        typer.Option(
            "--trust-root",
            help="The pinned trust root (root.json) to verify against.",
            metavar="ROOT.json",
            show_default=False,
        ),
    ] = None,
    key: Annotated[
        Path | None,
        typer.Option(
            "--key",
            help="Verify with this one public key instead of a trust root (one-key setups, like cosign "
            "verify --key): threshold 1, no rotation, no trust-root rollback.",
            metavar="PUB.pem",
            show_default=False,
        ),
    ] = None,
    expect_fingerprint: Annotated[
        Path | None,
        typer.Option(
            "--expect-fingerprint",
            help="Fingerprint JSON the artifact must be bound to (docs/fingerprint.md).",
            metavar="FP.json",
            show_default=False,
        ),
    ] = None,
    live: Annotated[
        bool, typer.Option("--live", help="Bind to this host's live deployment (probes plus --live-*).")
    ] = False,
    live_k: Annotated[
        int | None,
        typer.Option("--live-k", help="The engine's K (max draft length).", metavar="K", show_default=False),
    ] = None,
    live_ladder: Annotated[
        str | None,
        typer.Option(
            "--live-ladder",
            help="The engine's rank-local graph ladder.",
            metavar="G1,G2,...",
            show_default=False,
        ),
    ] = None,
    live_topology: LiveTopology = None,
    live_gpu: LiveGpu = None,
    live_gpu_count: LiveGpuCount = None,
    live_gpu_snapshot_sha256: LiveGpuSnapshot = None,
    live_source_dir: LiveSourceDir = None,
    live_source_head: LiveSourceHead = None,
    live_source_diff: LiveSourceDiff = None,
    live_runtime_snapshot: LiveRuntimeSnapshot = None,
    live_model_config: LiveModelConfig = None,
    live_checkpoint_sha256: LiveCheckpoint = None,
    live_attention_backend: LiveAttention = None,
    live_moe_backend: LiveMoe = None,
    live_kv_dtype: LiveKvDtype = None,
    live_body_buckets: LiveBodyBuckets = None,
    live_execution_mode: LiveExecutionMode = None,
    no_mixed: Annotated[
        bool,
        typer.Option("--no-mixed", help="Leave a bundle's mixed evidence out (mixed steps stay native)."),
    ] = False,
    unbind: Annotated[
        list[str] | None,
        typer.Option(
            "--unbind",
            help="Fingerprint field not to compare (repeatable).",
            metavar="FIELD",
            show_default=False,
        ),
    ] = None,
    state: Annotated[
        Path | None,
        typer.Option(
            "--state",
            help="Rollback state file (highest accepted versions, newest trust root).",
            metavar="STATE.json",
            show_default=False,
        ),
    ] = None,
    record: Annotated[
        bool, typer.Option("--record/--no-record", help="Record accepted versions in --state.")
    ] = True,
    root_chain: RootChainOption = None,
    allow_synthetic: AllowSyntheticFlag = False,
    max_age_days: Annotated[
        float | None,
        typer.Option(
            "--max-age-days",
            help="Refuse artifacts issued longer ago than this (default: no limit; the runtime form: 30).",
            metavar="DAYS",
            show_default=False,
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print every finding.")] = False,
    json_out: JsonFlag = False,
    emit_trtllm_options: EmitTrtllmOption = None,
    fail_open_to_static: FailOpenOption = False,
    selector_identity: SelectorIdentityOption = None,
    trtllm_dir: TrtllmDirOption = None,
    base_options: BaseOptionsOption = None,
    version: VersionFlag = False,
) -> None:
    """Verify ARTIFACTS; exit 0 if all are valid, 1 if any is rejected, 2 on usage or I/O errors."""
    live_options = LiveOptions(
        k=live_k,
        ladder=live_ladder,
        topology=live_topology,
        gpu=live_gpu,
        gpu_count=live_gpu_count,
        gpu_snapshot_sha256=live_gpu_snapshot_sha256,
        source_dir=live_source_dir,
        source_head=live_source_head,
        source_diff=live_source_diff,
        runtime_snapshot=live_runtime_snapshot,
        model_config=live_model_config,
        checkpoint_sha256=live_checkpoint_sha256,
        attention_backend=live_attention_backend,
        moe_backend=live_moe_backend,
        kv_dtype=live_kv_dtype,
        body_buckets=live_body_buckets,
        execution_mode=live_execution_mode,
    )
    from dspark_calibrate.artifacts import BINDING_FIELDS

    bad_unbind = sorted(set(unbind or []) - set(BINDING_FIELDS))
    if bad_unbind:
        fail_usage(
            f"--unbind {', '.join(bad_unbind)}: not binding fields; choose from {', '.join(BINDING_FIELDS)}"
        )
    if max_age_days is not None and max_age_days <= 0:
        fail_usage(
            f"--max-age-days {max_age_days:g} must be positive; give the largest acceptable age in days"
        )
    root, root_info = _trust(trust_root, key)
    if runtime_requested(emit_trtllm_options, fail_open_to_static):
        run_runtime(
            artifacts=artifacts,
            trust_root=root,
            expect_fingerprint=expect_fingerprint,
            live_options=live_options,
            unbind=unbind,
            state=state,
            record=record,
            root_chain=root_chain,
            allow_synthetic=allow_synthetic,
            max_age_days=max_age_days,
            emit_trtllm_options=emit_trtllm_options,
            fail_open_to_static=fail_open_to_static,
            selector_identity=selector_identity,
            trtllm_dir=trtllm_dir,
            base_options=base_options,
            verbose=verbose,
            json_out=json_out,
            mixed=not no_mixed,
        )
    _verify_offline(
        artifacts,
        root,
        root_info,
        expect_fingerprint=expect_fingerprint,
        live=live,
        live_options=live_options,
        unbind=unbind,
        state=state,
        record=record,
        root_chain=root_chain,
        allow_synthetic=allow_synthetic,
        max_age_days=max_age_days,
        verbose=verbose,
        json_out=json_out,
        mixed=not no_mixed,
    )


def _verify_offline(
    artifacts: list[Path],
    root: TrustRoot,
    root_info: dict[str, Any],
    *,
    expect_fingerprint: Path | None,
    live: bool,
    live_options: LiveOptions,
    unbind: list[str] | None,
    state: Path | None,
    record: bool,
    root_chain: list[Path] | None,
    allow_synthetic: bool,
    max_age_days: float | None,
    verbose: bool,
    json_out: bool,
    mixed: bool = True,
) -> None:
    """The artifact check of ``dspark-verify`` (not the runtime form). Exits the command.

    A bundle's optional mixed evidence is verified on its own, after its decode members, and
    reported as one more report (``--no-mixed`` leaves it out)."""
    from dspark_calibrate.artifacts import (
        BundleReport,
        Expectation,
        Reason,
        RollbackState,
        VerificationReport,
        check_trust_root_freshness,
        read_fingerprint,
        verify_inputs,
        verify_mixed,
    )

    if expect_fingerprint is not None and live:
        fail_usage("give either --expect-fingerprint or --live, not both")
    live_info: dict[str, Any] | None = None
    try:
        fingerprint = None
        if expect_fingerprint is not None:
            fingerprint = read_fingerprint(expect_fingerprint)
        elif live:
            ctx = live_options.collect()
            fingerprint = ctx.fingerprint
            live_info = ctx.to_dict()
        rollback = RollbackState(state) if state is not None else None
        chain = read_root_chain(root_chain)
        # The mixed route facts are bound under --live, and whenever they are given.
        given = live_options.body_buckets is not None or live_options.execution_mode is not None
        mixed_live = live_options.mixed_live() if live or given else None
    except DsparkError as exc:
        fail_error(exc)
    expected = Expectation(
        fingerprint=fingerprint,
        unbound_fields=frozenset(unbind or ()),
        allow_synthetic=allow_synthetic,
        max_age=timedelta(days=max_age_days) if max_age_days is not None else None,
        mixed=mixed_live,
    )
    now = utcnow()
    # The pinned trust root first: never older than the newest one this state accepted (TUF's
    # rule). A --key root is made on the spot from the pinned key, so it has no history to check.
    root_finding = (
        check_trust_root_freshness(
            root, rollback, now=now, chain=chain, record=record, where=root_info["path"]
        )
        if "path" in root_info
        else None
    )
    reports: list[Any] = []
    if root_finding is not None:
        reports.append(VerificationReport(path=Path(root_info["path"]), findings=(root_finding,)))
    else:
        for report in verify_inputs(artifacts, root, now=now, expected=expected, state=rollback, record=record):
            reports.append(report)
            if mixed and isinstance(report, BundleReport) and report.ok:
                extra = verify_mixed(
                    report.path, root, now=now, decode=report, expected=expected, state=rollback, record=record
                )
                if extra.present:
                    reports.append(extra)
    io_error = any(r.reason is Reason.IO_ERROR for r in reports)
    rejected = [r for r in reports if not r.ok]
    code = EXIT_USAGE if io_error else EXIT_REJECTED if rejected else EXIT_OK
    if json_out:
        first = rejected[0] if rejected else None
        fix = split_fix(first.message)[1] if first is not None else ""
        print_json(
            {
                "ok": code == EXIT_OK,
                "valid": code == EXIT_OK,
                "error": first.code if first is not None else None,
                "message": first.message if first is not None else None,
                "fix": fix if first is not None else None,
                "exit_code": code,
                "trust_root": root_info,
                "live": live_info,
                "reports": [r.to_dict() for r in reports],
            }
        )
    for r in reports:
        if r.ok:
            if not json_out:
                out_console.print(f"[green]VALID[/] {escape(r.message)}")
                for n in getattr(r, "notices", ()):
                    err_console.print(f"[yellow]notice[/] {n.code}: {escape(n.message)}")
            continue
        err_console.print(f"[bold red]REJECTED[/] {r.code}: {escape(r.message)}")
        findings = list(r.findings)
        if verbose:
            for f in findings[1:]:
                err_console.print(f"  also {f.code}: {escape(f.message)}")
        diff = _diff_table(findings)
        if diff is not None:
            err_console.print(diff)
    exit_with(code)


def run() -> None:
    """Console-script entry point for ``dspark-verify``."""
    verify_app()
