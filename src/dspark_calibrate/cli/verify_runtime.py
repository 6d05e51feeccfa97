"""``dspark-verify`` runtime form: admit a bundle as the serving process would, emit engine options.

For launchers and init containers::

    dspark-verify BUNDLE --trust-root ROOT --live-k 5 --live-ladder 8,16,32 --live-topology TP1 \\
        --emit-trtllm-options OUT.yaml --selector-identity HEX [--fail-open-to-static]

runs :func:`dspark_calibrate.runtime_plugin.admission.admit` (the runtime hook, not the plain
artifact check) and writes ``extra_llm_api_options`` YAML with the ``DSparkDecodingConfig`` fields:
confidence scheduling with the exported deployment files when admitted, static K with every
confidence field cleared otherwise.

Exit codes: 0 admitted; 1 rejected (static options still written); 2 usage or I/O error (options
not written). With ``--fail-open-to-static`` every rejection, and any bad live option, exits 0 after
writing the static options, so a serving start is never blocked; only a failure to write OUT
itself exits 2.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from dspark_calibrate.cli._common import (
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_USAGE,
    LiveOptions,
    err_console,
    exit_with,
    fail_usage,
    out_console,
    print_json,
    split_fix,
)
from dspark_calibrate.errors import ConfigError

if TYPE_CHECKING:
    from dspark_calibrate.artifacts import TrustRoot
    from dspark_calibrate.runtime_plugin.admission import AdmissionDecision
    from dspark_calibrate.runtime_plugin.trtllm import TrtllmOptions

__all__ = [
    "BaseOptionsOption",
    "EmitTrtllmOption",
    "FailOpenOption",
    "SelectorIdentityOption",
    "TrtllmDirOption",
    "default_export_dir",
    "run_runtime",
    "runtime_requested",
]

EmitTrtllmOption = Annotated[
    Path | None,
    typer.Option(
        "--emit-trtllm-options",
        help="Run the runtime admission hook on one bundle and write TensorRT-LLM extra_llm_api_options "
        "YAML here (dynamic verification if admitted, static K otherwise).",
        metavar="OPTS.yaml",
        show_default=False,
    ),
]
FailOpenOption = Annotated[
    bool,
    typer.Option(
        "--fail-open-to-static",
        help="With the runtime form: exit 0 on rejection after writing the static-K options "
        "(the serving start is never blocked).",
    ),
]
SelectorIdentityOption = Annotated[
    str | None,
    typer.Option(
        "--selector-identity",
        help="The engine's selector identity SHA-256 (64 hex), pinned in the admission receipt: "
        "EXACT_SPS_SELECTOR_IDENTITY_SHA256 in tensorrt_llm/_torch/speculative/dspark_planner.py.",
        metavar="HEX",
        show_default=False,
    ),
]
TrtllmDirOption = Annotated[
    Path | None,
    typer.Option(
        "--trtllm-dir",
        help="Private (0700) directory for the exported deployment files "
        "(default: <OUT stem>-files beside OUT).",
        metavar="DIR",
        show_default=False,
    ),
]
BaseOptionsOption = Annotated[
    Path | None,
    typer.Option(
        "--base-options",
        help="extra_llm_api_options YAML to merge the decoding fields into.",
        metavar="BASE.yaml",
        show_default=False,
    ),
]


def runtime_requested(emit_trtllm_options: Path | None, fail_open_to_static: bool) -> bool:
    """True when the runtime form was asked for."""
    return emit_trtllm_options is not None or fail_open_to_static


def default_export_dir(out: Path) -> Path:
    """``OUT.yaml`` → ``OUT-files/`` beside it (visible wherever OUT is, e.g. a shared volume)."""
    return out.with_name(f"{out.stem}-files")


def _render(
    decision: AdmissionDecision,
    options: TrtllmOptions | None,
    out: Path | None,
    verbose: bool,
    json_out: bool,
) -> None:
    if decision.active and (options is None or options.active):
        if not json_out:  # stdout carries only the JSON report then
            out_console.print(f"[green]ADMITTED[/] {decision.message}")
        m = decision.mixed
        mixed_code = options.mixed_reason_code if options is not None else None
        if m is not None and m.active and mixed_code is None:
            if not json_out:
                out_console.print(f"[green]MIXED ADMITTED[/] {m.message}")
        elif m is not None:
            code = mixed_code or m.reason_code
            message = (options.mixed_message if options is not None and mixed_code else None) or m.message
            err_console.print(f"[yellow]MIXED NATIVE[/] {code}: {message}")
    elif decision.active and options is not None:
        err_console.print(f"[bold red]STATIC K[/] {options.reason_code}: {options.message}")
    else:
        err_console.print(f"[bold red]STATIC K[/] {decision.reason_code}: {decision.message}")
        if verbose:
            for f in decision.findings[1:]:
                err_console.print(f"  also {f.code}: {f.message}")
    if out is not None:
        err_console.print(f"wrote {out}")


def run_runtime(
    *,
    artifacts: list[Path],
    trust_root: TrustRoot,
    expect_fingerprint: Path | None,
    live_options: LiveOptions,
    unbind: list[str] | None,
    state: Path | None,
    record: bool,
    root_chain: list[Path] | None,
    allow_synthetic: bool,
    max_age_days: float | None,
    emit_trtllm_options: Path | None,
    fail_open_to_static: bool,
    selector_identity: str | None,
    trtllm_dir: Path | None,
    base_options: Path | None,
    verbose: bool,
    json_out: bool,
    mixed: bool = True,
) -> NoReturn:
    """The runtime form of ``dspark-verify`` (see the module docstring). Exits the command.

    Args:
        artifacts: exactly one bundle directory (or manifest).
        live_options: ``verify.LiveOptions`` with the ``--live-*`` values.
        Other arguments: the ``dspark-verify`` options of the same names.
    """
    from dspark_calibrate.artifacts import Reason, read_fingerprint
    from dspark_calibrate.runtime_plugin.admission import DEFAULT_MAX_ARTIFACT_AGE, AdmissionPolicy, admit
    from dspark_calibrate.runtime_plugin.trtllm import (
        decoding_fields,
        read_options_yaml,
        static_options,
        write_options_yaml,
    )

    if len(artifacts) != 1:
        fail_usage(
            f"the runtime form admits exactly one bundle, got {len(artifacts)} paths; pass one bundle directory"
        )
    if emit_trtllm_options is not None and selector_identity is None and not fail_open_to_static:
        fail_usage(
            "--emit-trtllm-options needs --selector-identity HEX (no receipt is written without it); copy "
            "EXACT_SPS_SELECTOR_IDENTITY_SHA256 from tensorrt_llm/_torch/speculative/dspark_planner.py"
        )
    if emit_trtllm_options is not None:
        # Written into the YAML as they are: relative paths would be relative to wherever the
        # engine starts, not to here.
        emit_trtllm_options = emit_trtllm_options.absolute()
        if trtllm_dir is not None:
            trtllm_dir = trtllm_dir.absolute()
    base: dict[str, Any] = {}
    if base_options is not None:
        try:
            base = read_options_yaml(base_options)
        except ConfigError as exc:
            fail_usage(str(exc))
    problem: str | None = None
    live: Any = None
    policy: AdmissionPolicy | None = None
    try:
        if expect_fingerprint is not None:
            live = read_fingerprint(expect_fingerprint)
        else:
            live = live_options.arguments()
        policy = AdmissionPolicy(
            allow_synthetic=allow_synthetic,
            state_path=state,
            record_state=record,
            trust_root_chain=tuple(root_chain or ()),
            unbound_fields=frozenset(unbind or ()),
            max_artifact_age=(
                timedelta(days=max_age_days) if max_age_days is not None else DEFAULT_MAX_ARTIFACT_AGE
            ),
            mixed=mixed,
            mixed_live=live_options.mixed_live(),
        )
    except ConfigError as exc:
        problem = str(exc)
    if problem is not None or policy is None:
        if not fail_open_to_static:
            fail_usage(problem or "invalid options")
        err_console.print(f"[bold red]error:[/] {problem}; falling back to static K")
        decision = None
        options = static_options(Reason.CONFIG_INVALID.value, problem or "invalid options")
    else:
        decision = admit(artifacts[0], trust_root, live=live, policy=policy)
        options = None
        if emit_trtllm_options is not None:
            options = decoding_fields(
                decision,
                selector_identity=selector_identity,
                out_dir=trtllm_dir if trtllm_dir is not None else default_export_dir(emit_trtllm_options),
            )
    if emit_trtllm_options is not None:
        assert options is not None
        try:
            merged = options.llm_api_options(base)
        except ConfigError as exc:
            fail_usage(f"{base_options}: {exc}")
        try:
            write_options_yaml(emit_trtllm_options, merged)
        except OSError as exc:
            fail_usage(f"{emit_trtllm_options}: cannot write the options ({exc.strerror or exc})")
    active = bool(decision is not None and decision.active and (options is None or options.active))
    if active or fail_open_to_static:
        code = EXIT_OK
    elif decision is not None and decision.reason is Reason.IO_ERROR:
        code = EXIT_USAGE
    else:
        code = EXIT_REJECTED
    if json_out:
        reason, message = None, None
        if not active:
            if decision is not None and decision.active and options is not None:
                reason, message = options.reason_code, options.message
            elif decision is not None:
                reason, message = decision.reason_code, decision.message
            elif options is not None:
                reason, message = options.reason_code, options.message
        print_json(
            {
                "ok": active,
                "error": reason,
                "message": message,
                "fix": split_fix(message)[1] if message else None,
                "active": active,
                "exit_code": code,
                "decision": decision.to_dict() if decision is not None else None,
                "trtllm": options.to_dict() if options is not None else None,
                "options_path": str(emit_trtllm_options) if emit_trtllm_options is not None else None,
            }
        )
    if decision is not None:
        _render(decision, options, emit_trtllm_options, verbose, json_out)
    exit_with(code)
