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
    print_table,
    split_fix,
    utcnow,
)
from dspark_calibrate.cli._verify_options import (
    ArtifactsArgument,
    ExpectFingerprintOption,
    KeyOption,
    LiveFlag,
    LiveKOption,
    LiveLadderOption,
    MaxAgeDaysOption,
    NoMixedFlag,
    OptionalTrustRootOption,
    RecordFlag,
    StateOption,
    UnbindOption,
    VerboseFlag,
    VerifyOptions,
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
    from dspark_calibrate.artifacts import Expectation, Finding, RollbackState, TrustRoot

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
    artifacts: ArtifactsArgument,
    trust_root: OptionalTrustRootOption = None,
    key: KeyOption = None,
    expect_fingerprint: ExpectFingerprintOption = None,
    live: LiveFlag = False,
    live_k: LiveKOption = None,
    live_ladder: LiveLadderOption = None,
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
    no_mixed: NoMixedFlag = False,
    unbind: UnbindOption = None,
    state: StateOption = None,
    record: RecordFlag = True,
    root_chain: RootChainOption = None,
    allow_synthetic: AllowSyntheticFlag = False,
    max_age_days: MaxAgeDaysOption = None,
    verbose: VerboseFlag = False,
    json_out: JsonFlag = False,
    emit_trtllm_options: EmitTrtllmOption = None,
    fail_open_to_static: FailOpenOption = False,
    selector_identity: SelectorIdentityOption = None,
    trtllm_dir: TrtllmDirOption = None,
    base_options: BaseOptionsOption = None,
    version: VersionFlag = False,
) -> None:
    """Verify ARTIFACTS; exit 0 if all are valid, 1 if any is rejected, 2 on usage or I/O errors."""
    # Every parameter is one VerifyOptions field of the same name, and nothing else is local yet.
    run_verify(VerifyOptions(**locals()))


def run_verify(opts: VerifyOptions) -> None:
    """Run ``dspark-verify`` for parsed options: the runtime form when it was asked for, the
    artifact check otherwise. Exits the command."""
    from dspark_calibrate.artifacts import BINDING_FIELDS

    live_options = LiveOptions.from_options(opts)
    bad_unbind = sorted(set(opts.unbind or []) - set(BINDING_FIELDS))
    if bad_unbind:
        fail_usage(
            f"--unbind {', '.join(bad_unbind)}: not binding fields; choose from {', '.join(BINDING_FIELDS)}"
        )
    if runtime_requested(opts.emit_trtllm_options, opts.fail_open_to_static):
        # The runtime form reads the root itself, after it has written the fail-open options.
        run_runtime(opts, lambda: _trust(opts.trust_root, opts.key)[0], live_options)
    root, root_info = _trust(opts.trust_root, opts.key)
    _verify_offline(opts, root, root_info, live_options)


def _offline_inputs(
    opts: VerifyOptions, live_options: LiveOptions
) -> tuple[Expectation, RollbackState | None, list[bytes], dict[str, Any] | None]:
    """``(expected, rollback state, root chain, live context)`` of the artifact check; exits 2 on a
    bad option."""
    from dspark_calibrate.artifacts import Expectation, RollbackState, read_fingerprint

    if opts.expect_fingerprint is not None and opts.live:
        fail_usage("give either --expect-fingerprint or --live, not both")
    live_info: dict[str, Any] | None = None
    try:
        fingerprint = None
        if opts.expect_fingerprint is not None:
            fingerprint = read_fingerprint(opts.expect_fingerprint)
        elif opts.live:
            ctx = live_options.collect()
            fingerprint = ctx.fingerprint
            live_info = ctx.to_dict()
        rollback = RollbackState(opts.state) if opts.state is not None else None
        chain = read_root_chain(opts.root_chain)
        # The mixed route facts are bound under --live, and whenever they are given.
        given = live_options.body_buckets is not None or live_options.execution_mode is not None
        mixed_live = live_options.mixed_live() if opts.live or given else None
    except DsparkError as exc:
        fail_error(exc)
    expected = Expectation(
        fingerprint=fingerprint,
        unbound_fields=frozenset(opts.unbind or ()),
        allow_synthetic=opts.allow_synthetic,
        max_age=timedelta(days=opts.max_age_days) if opts.max_age_days is not None else None,
        mixed=mixed_live,
    )
    return expected, rollback, chain, live_info


def _offline_reports(
    opts: VerifyOptions,
    root: TrustRoot,
    root_info: dict[str, Any],
    *,
    expected: Expectation,
    rollback: RollbackState | None,
    chain: list[bytes],
) -> list[Any]:
    """One report per input (a bundle's verified mixed evidence as one more), or only the trust
    root's when the pinned root itself is rejected."""
    from dspark_calibrate.artifacts import (
        BundleReport,
        VerificationReport,
        check_trust_root_freshness,
        verify_inputs,
        verify_mixed,
    )

    now = utcnow()
    # The pinned trust root first: never older than the newest one this state accepted (TUF's
    # rule). A --key root is made on the spot from the pinned key, so it has no history to check.
    if "path" in root_info:
        root_finding = check_trust_root_freshness(
            root, rollback, now=now, chain=chain, record=opts.record, where=root_info["path"]
        )
        if root_finding is not None:
            return [VerificationReport(path=Path(root_info["path"]), findings=(root_finding,))]
    reports: list[Any] = []
    checked = verify_inputs(
        opts.artifacts, root, now=now, expected=expected, state=rollback, record=opts.record
    )
    for report in checked:
        reports.append(report)
        if not opts.no_mixed and isinstance(report, BundleReport) and report.ok:
            extra = verify_mixed(
                report.path,
                root,
                now=now,
                decode=report,
                expected=expected,
                state=rollback,
                record=opts.record,
            )
            if extra.present:
                reports.append(extra)
    return reports


def _offline_json(
    reports: list[Any], code: int, root_info: dict[str, Any], live_info: dict[str, Any] | None
) -> dict[str, Any]:
    """The ``--json`` report of the artifact check; its error is the first rejection's."""
    rejected = [r for r in reports if not r.ok]
    first = rejected[0] if rejected else None
    fix = split_fix(first.message)[1] if first is not None else ""
    return {
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


def _print_reports(reports: list[Any], *, verbose: bool, json_out: bool) -> None:
    """VALID lines (stdout, unless ``--json``) and REJECTED lines with their differences (stderr)."""
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
            print_table(diff, err_console)


def _verify_offline(
    opts: VerifyOptions, root: TrustRoot, root_info: dict[str, Any], live_options: LiveOptions
) -> None:
    """The artifact check of ``dspark-verify`` (not the runtime form). Exits the command.

    A bundle's optional mixed evidence is verified on its own, after its decode members, and
    reported as one more report (``--no-mixed`` leaves it out)."""
    from dspark_calibrate.artifacts import Reason

    expected, rollback, chain, live_info = _offline_inputs(opts, live_options)
    reports = _offline_reports(opts, root, root_info, expected=expected, rollback=rollback, chain=chain)
    io_error = any(r.reason is Reason.IO_ERROR for r in reports)
    rejected = any(not r.ok for r in reports)
    code = EXIT_USAGE if io_error else EXIT_REJECTED if rejected else EXIT_OK
    if opts.json_out:
        print_json(_offline_json(reports, code, root_info, live_info))
    _print_reports(reports, verbose=opts.verbose, json_out=opts.json_out)
    exit_with(code)


def run() -> None:
    """Console-script entry point for ``dspark-verify``."""
    verify_app()
