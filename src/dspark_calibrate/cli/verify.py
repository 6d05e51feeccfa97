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
from rich.table import Table

from dspark_calibrate.cli._common import (
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_USAGE,
    AllowSyntheticFlag,
    JsonFlag,
    TrustRootOption,
    err_console,
    exit_with,
    fail_usage,
    out_console,
    parse_ladder,
    print_json,
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
from dspark_calibrate.errors import DsparkError

if TYPE_CHECKING:
    from dspark_calibrate.artifacts import Finding

__all__ = ["LiveOptions", "verify_app"]

verify_app = typer.Typer(
    name="dspark-verify",
    help="Verify dspark-calibrate artifacts: signature, integrity, freshness, binding, content.",
    add_completion=False,
    pretty_exceptions_show_locals=False,  # key material may be in scope
    no_args_is_help=True,
)


class LiveOptions:
    """Options that describe the live deployment (shared with the runtime CLI forms)."""

    def __init__(
        self,
        *,
        k: int | None,
        ladder: str | None,
        topology: str | None,
        gpu: str | None,
        gpu_count: int | None,
        source_dir: Path | None,
        source_head: str | None,
        source_diff: str | None,
        runtime_snapshot: str | None,
        model_config: Path | None,
    ) -> None:
        self.k, self.ladder, self.topology, self.gpu, self.gpu_count = k, ladder, topology, gpu, gpu_count
        self.source_dir, self.source_head, self.source_diff = source_dir, source_head, source_diff
        self.runtime_snapshot, self.model_config = runtime_snapshot, model_config

    def collect(self) -> Any:
        """Collect the live context (explicit options win over probes)."""
        from dspark_calibrate.runtime_plugin.live import collect_live

        return collect_live(
            max_draft_len=self.k,
            rank_local_graph_batch_sizes=parse_ladder(self.ladder, option="--live-ladder")
            if self.ladder
            else None,
            topology=self.topology,
            gpu=self.gpu,
            gpu_count=self.gpu_count,
            source_dir=self.source_dir,
            source_head=self.source_head,
            source_diff_sha256=self.source_diff,
            runtime_snapshot=self.runtime_snapshot,
            model_config=self.model_config,
        )


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


@verify_app.command()
def main(
    artifacts: Annotated[
        list[Path], typer.Argument(help="Signed Parquet artifacts and/or bundle directories.")
    ],
    trust_root: TrustRootOption,
    expect_fingerprint: Annotated[
        Path | None,
        typer.Option("--expect-fingerprint", help="Fingerprint JSON the artifact must be bound to."),
    ] = None,
    live: Annotated[
        bool, typer.Option("--live", help="Bind to this host's live deployment (see --live-*).")
    ] = False,
    live_k: Annotated[int | None, typer.Option("--live-k", help="The engine's K (max draft length).")] = None,
    live_ladder: Annotated[
        str | None, typer.Option("--live-ladder", help="The engine's rank-local graph ladder.")
    ] = None,
    live_topology: Annotated[str | None, typer.Option("--live-topology", help="e.g. DEP8, TP1.")] = None,
    live_gpu: Annotated[str | None, typer.Option("--live-gpu", help="GPU name, if not probed.")] = None,
    live_gpu_count: Annotated[
        int | None, typer.Option("--live-gpu-count", help="GPUs in the deployment.")
    ] = None,
    live_source_dir: Annotated[
        Path | None, typer.Option("--live-source-dir", help="Engine source checkout.")
    ] = None,
    live_source_head: Annotated[
        str | None, typer.Option("--live-source-head", help="Engine source commit.")
    ] = None,
    live_source_diff: Annotated[
        str | None,
        typer.Option("--live-source-diff-sha256", help="SHA-256 of the engine's uncommitted diff."),
    ] = None,
    live_runtime_snapshot: Annotated[
        str | None, typer.Option("--live-runtime-snapshot", help="Runtime snapshot string.")
    ] = None,
    live_model_config: Annotated[
        Path | None, typer.Option("--live-model-config", help="Model config.json.")
    ] = None,
    unbind: Annotated[
        list[str] | None, typer.Option("--unbind", help="Fingerprint field not to compare (repeatable).")
    ] = None,
    state: Annotated[
        Path | None, typer.Option("--state", help="Rollback state file (highest accepted versions).")
    ] = None,
    record: Annotated[
        bool, typer.Option("--record/--no-record", help="Record accepted versions in --state.")
    ] = True,
    allow_synthetic: AllowSyntheticFlag = False,
    max_age_days: Annotated[
        float | None, typer.Option("--max-age-days", help="Refuse artifacts older than this.")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print every finding.")] = False,
    json_out: JsonFlag = False,
    emit_trtllm_options: EmitTrtllmOption = None,
    fail_open_to_static: FailOpenOption = False,
    selector_identity: SelectorIdentityOption = None,
    trtllm_dir: TrtllmDirOption = None,
    base_options: BaseOptionsOption = None,
) -> None:
    """Verify ARTIFACTS; exit 0 if all are valid, 1 if any is rejected, 2 on usage or I/O errors."""
    live_options = LiveOptions(
        k=live_k,
        ladder=live_ladder,
        topology=live_topology,
        gpu=live_gpu,
        gpu_count=live_gpu_count,
        source_dir=live_source_dir,
        source_head=live_source_head,
        source_diff=live_source_diff,
        runtime_snapshot=live_runtime_snapshot,
        model_config=live_model_config,
    )
    if runtime_requested(emit_trtllm_options, fail_open_to_static):
        run_runtime(
            artifacts=artifacts,
            trust_root=trust_root,
            expect_fingerprint=expect_fingerprint,
            live_options=live_options,
            unbind=unbind,
            state=state,
            record=record,
            allow_synthetic=allow_synthetic,
            max_age_days=max_age_days,
            emit_trtllm_options=emit_trtllm_options,
            fail_open_to_static=fail_open_to_static,
            selector_identity=selector_identity,
            trtllm_dir=trtllm_dir,
            base_options=base_options,
            verbose=verbose,
            json_out=json_out,
        )
    from dspark_calibrate.artifacts import (
        BINDING_FIELDS,
        Expectation,
        Reason,
        RollbackState,
        read_fingerprint,
        verify_bundle,
        verify_path,
    )

    if expect_fingerprint is not None and live:
        fail_usage("give either --expect-fingerprint or --live, not both")
    bad_unbind = sorted(set(unbind or []) - set(BINDING_FIELDS))
    if bad_unbind:
        fail_usage(f"--unbind {bad_unbind}: not binding fields; choose from {', '.join(BINDING_FIELDS)}")
    root = load_root_or_exit(trust_root)
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
    except DsparkError as exc:
        fail_usage(str(exc))
    expected = Expectation(
        fingerprint=fingerprint,
        unbound_fields=frozenset(unbind or ()),
        allow_synthetic=allow_synthetic,
        max_age=timedelta(days=max_age_days) if max_age_days is not None else None,
    )
    now = utcnow()
    reports = []
    for path in artifacts:
        if path.is_dir():
            reports.append(
                verify_bundle(path, root, now=now, expected=expected, state=rollback, record=record)
            )
        else:
            reports.append(verify_path(path, root, now=now, expected=expected, state=rollback, record=record))
    io_error = any(r.reason is Reason.IO_ERROR for r in reports)
    rejected = any(not r.ok for r in reports)
    code = EXIT_USAGE if io_error else EXIT_REJECTED if rejected else EXIT_OK
    if json_out:
        print_json(
            {
                "valid": code == EXIT_OK,
                "exit_code": code,
                "trust_root": {"path": str(trust_root), "version": root.version, "digest": root.digest()},
                "live": live_info,
                "reports": [r.to_dict() for r in reports],
            }
        )
    for r in reports:
        if r.ok:
            if not json_out:
                out_console.print(f"[green]VALID[/] {r.message}")
                for n in r.notices:
                    err_console.print(f"[yellow]notice[/] {n.code}: {n.message}")
            continue
        err_console.print(f"[bold red]REJECTED[/] {r.code}: {r.message}")
        findings = list(r.findings)
        if verbose:
            for f in findings[1:]:
                err_console.print(f"  also {f.code}: {f.message}")
        diff = _diff_table(findings)
        if diff is not None:
            err_console.print(diff)
    exit_with(code)


def run() -> None:
    """Console-script entry point for ``dspark-verify``."""
    verify_app()
