"""``dspark-verify`` runtime form: admit a bundle as the serving process would, emit engine options.

For launchers and init containers::

    dspark-verify BUNDLE --trust-root ROOT --live-k 5 --live-ladder 8,16,32 --live-topology TP1 \\
        --emit-trtllm-options OUT.yaml --selector-identity HEX [--fail-open-to-static]

runs :func:`dspark_calibrate.runtime_plugin.admission.admit` (the runtime hook, not the plain
artifact check) and writes ``extra_llm_api_options`` YAML with the ``DSparkDecodingConfig`` fields:
confidence scheduling with the exported deployment files when admitted, static K with every
confidence field cleared otherwise.

Exit codes: 0 admitted; 1 rejected (static options still written); 2 usage or I/O error (options
not written). With ``--fail-open-to-static`` every rejection, and any bad live option, base options
file or trust root, exits 0 after writing the static options, so a serving start is never blocked;
only an OUT that cannot be written (or is not a regular file) exits 2. Under
``--fail-open-to-static`` the static options are written *first*, before the trust root is read
and anything is admitted, and replaced atomically by the final ones: whatever fails or stops the
command later, OUT never holds a previous run's options (which may enable scheduling with older
files) or nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.markup import escape

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
from dspark_calibrate.cli._verify_options import VerifyOptions
from dspark_calibrate.errors import ConfigError

if TYPE_CHECKING:
    from dspark_calibrate.artifacts import TrustRoot
    from dspark_calibrate.runtime_plugin.admission import AdmissionDecision, AdmissionPolicy
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
    files_dir: Path | None = None,
) -> None:
    from dspark_calibrate.artifacts import Reason

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
            if code == Reason.MIXED_ABSENT.value:
                # Not a warning: a bundle built without mixed evidence keeps mixed steps native.
                err_console.print(f"mixed: {escape(message)}")
            else:
                err_console.print(f"[yellow]MIXED NATIVE[/] {code}: {message}")
    elif decision.active and options is not None:
        err_console.print(f"[bold red]STATIC K[/] {options.reason_code}: {options.message}")
    else:
        err_console.print(f"[bold red]STATIC K[/] {decision.reason_code}: {decision.message}")
        if verbose:
            for f in decision.findings[1:]:
                err_console.print(f"  also {f.code}: {f.message}")
    if out is not None:
        files = files_dir if files_dir is not None and files_dir.is_dir() else None
        err_console.print(f"wrote {out}" + (f" and the files it names in {files}/" if files else ""))


def run_runtime(
    opts: VerifyOptions, load_root: Callable[[], TrustRoot], live_options: LiveOptions
) -> NoReturn:
    """The runtime form of ``dspark-verify`` (see the module docstring). Exits the command.

    Args:
        opts: the ``dspark-verify`` options; ``opts.artifacts`` must be one bundle directory (or
            manifest).
        load_root: reads the trust root to admit against (exits the command when it cannot).
        live_options: the ``--live-*`` values.
    """
    from dspark_calibrate.artifacts import Reason
    from dspark_calibrate.runtime_plugin.trtllm import static_options

    _check_runtime_invocation(opts)
    out, trtllm_dir = _absolute_paths(opts.emit_trtllm_options, opts.trtllm_dir)
    base, base_problem = _read_base_options(opts.base_options, fail_open=opts.fail_open_to_static)
    if out is not None and opts.fail_open_to_static:
        # Static first: OUT holds static K from here on, whatever happens to this command later.
        reason = base_problem or "the admission has not finished"
        _write_runtime_options(out, static_options(Reason.CONFIG_INVALID.value, reason), base)
    trust_root = _load_root(load_root, opts.fail_open_to_static)
    decision: AdmissionDecision | None
    options: TrtllmOptions | None
    if base_problem is not None:
        decision, options = None, static_options(f"{Reason.CONFIG_INVALID.value}:base_options", base_problem)
    else:
        decision, options = _admit_or_static(opts, trust_root, live_options, out, trtllm_dir)
    if out is not None:
        assert options is not None
        options = _write_runtime_options(out, options, base, fail_open=opts.fail_open_to_static)
    active = bool(decision is not None and decision.active and (options is None or options.active))
    code = _runtime_exit_code(decision, active, opts.fail_open_to_static)
    if opts.json_out:
        print_json(_runtime_json(decision, options, out, active=active, code=code))
    if decision is not None:
        files_dir = None
        if out is not None:
            # Where the engine reads the files the options name (the TensorRT-LLM package).
            files_dir = trtllm_dir if trtllm_dir is not None else default_export_dir(out)
        _render(decision, options, out, opts.verbose, opts.json_out, files_dir)
    elif options is not None and out is not None:
        err_console.print(f"wrote {out}")
    exit_with(code)


def _load_root(load_root: Callable[[], TrustRoot], fail_open: bool) -> TrustRoot:
    """The trust root; a root that cannot be used exits (0 under ``--fail-open-to-static``, whose
    static options are already written, else the loader's 1 or 2)."""
    try:
        return load_root()
    except typer.Exit as stop:
        if fail_open and stop.exit_code != EXIT_OK:
            err_console.print("falling back to static K (the static options are written)")
            exit_with(EXIT_OK)
        raise


def _check_runtime_invocation(opts: VerifyOptions) -> None:
    """Exit 2 unless the runtime form was given one bundle and, to emit options, a selector identity."""
    if len(opts.artifacts) != 1:
        fail_usage(
            f"the runtime form admits exactly one bundle, got {len(opts.artifacts)} paths; pass one bundle directory"
        )
    if (
        opts.emit_trtllm_options is not None
        and opts.selector_identity is None
        and not opts.fail_open_to_static
    ):
        fail_usage(
            "--emit-trtllm-options needs --selector-identity HEX (no receipt is written without it); copy "
            "EXACT_SPS_SELECTOR_IDENTITY_SHA256 from tensorrt_llm/_torch/speculative/dspark_planner.py"
        )


def _absolute_paths(out: Path | None, trtllm_dir: Path | None) -> tuple[Path | None, Path | None]:
    """``(OUT, --trtllm-dir)`` made absolute when options are emitted; exits 2 when OUT names
    something other than a regular file (a device, a FIFO, a directory, a symlink out of its
    directory), before anything is written or admitted.

    Written into the YAML as they are: relative paths would be relative to wherever the engine
    starts, not to here.
    """
    from dspark_calibrate.artifacts import check_output_path

    if out is None:
        return None, trtllm_dir
    try:
        check_output_path(out)
    except OSError as exc:
        fail_usage(f"--emit-trtllm-options {out}: {exc.strerror or exc}")
    return out.absolute(), trtllm_dir.absolute() if trtllm_dir is not None else None


def _read_base_options(path: Path | None, *, fail_open: bool) -> tuple[dict[str, Any], str | None]:
    """``(base options, problem)``: the ``--base-options`` YAML (empty when not given).

    One that cannot be read or is not an options mapping exits 2, or under ``--fail-open-to-static``
    gives empty options and the problem (the static options are then written without it).
    """
    from dspark_calibrate.runtime_plugin.trtllm import read_options_yaml

    if path is None:
        return {}, None
    try:
        return read_options_yaml(path), None
    except ConfigError as exc:
        if not fail_open:
            fail_usage(str(exc))
        err_console.print(
            f"[bold red]error:[/] {escape(str(exc))}; falling back to static K without the base options",
            highlight=False,
        )
        return {}, str(exc)


def _runtime_policy(opts: VerifyOptions, live_options: LiveOptions) -> tuple[Any, AdmissionPolicy]:
    """``(live, policy)``: what ``admit`` binds to and the admission policy of the options.

    Raises:
        ConfigError: a malformed option value.
    """
    from dspark_calibrate.artifacts import read_fingerprint
    from dspark_calibrate.runtime_plugin.admission import DEFAULT_MAX_ARTIFACT_AGE, AdmissionPolicy

    live: Any = (
        read_fingerprint(opts.expect_fingerprint)
        if opts.expect_fingerprint is not None
        else live_options.arguments()
    )
    max_age = opts.max_age_days
    policy = AdmissionPolicy(
        allow_synthetic=opts.allow_synthetic,
        state_path=opts.state,
        record_state=opts.record,
        trust_root_chain=tuple(opts.root_chain or ()),
        unbound_fields=frozenset(opts.unbind or ()),
        max_artifact_age=timedelta(days=max_age) if max_age is not None else DEFAULT_MAX_ARTIFACT_AGE,
        mixed=not opts.no_mixed,
        mixed_live=live_options.mixed_live(),
    )
    return live, policy


def _admit_or_static(
    opts: VerifyOptions,
    trust_root: TrustRoot,
    live_options: LiveOptions,
    out: Path | None,
    trtllm_dir: Path | None,
) -> tuple[AdmissionDecision | None, TrtllmOptions | None]:
    """``(decision, options)``: the admission decision and, when emitting, the engine options.

    A bad option exits 2, or under ``--fail-open-to-static`` gives no decision and static options.
    """
    from dspark_calibrate.artifacts import Reason
    from dspark_calibrate.runtime_plugin.admission import admit
    from dspark_calibrate.runtime_plugin.trtllm import decoding_fields, static_options

    try:
        live, policy = _runtime_policy(opts, live_options)
    except ConfigError as exc:
        problem = str(exc)
        if not opts.fail_open_to_static:
            fail_usage(problem or "invalid options")
        err_console.print(f"[bold red]error:[/] {problem}; falling back to static K")
        return None, static_options(Reason.CONFIG_INVALID.value, problem or "invalid options")
    decision = admit(opts.artifacts[0], trust_root, live=live, policy=policy)
    if out is None:
        return decision, None
    options = decoding_fields(
        decision,
        selector_identity=opts.selector_identity,
        out_dir=trtllm_dir if trtllm_dir is not None else default_export_dir(out),
    )
    return decision, options


def _write_runtime_options(
    out: Path, options: TrtllmOptions, base: dict[str, Any], *, fail_open: bool = False
) -> TrtllmOptions:
    """Write the engine options merged into the base options; returns what was written.

    Exits 2 when OUT cannot be written. Options that cannot be merged exit 2, or under
    ``--fail-open-to-static`` leave the static options written before in place.
    """
    from dspark_calibrate.artifacts import Reason
    from dspark_calibrate.runtime_plugin.trtllm import static_options, write_options_yaml

    try:
        merged = options.llm_api_options(base)
    except ConfigError as exc:
        if not fail_open:
            fail_usage(str(exc))
        return static_options(f"{Reason.CONFIG_INVALID.value}:base_options", str(exc), options.max_draft_len)
    try:
        write_options_yaml(out, merged)
    except OSError as exc:
        fail_usage(f"{out}: cannot write the options ({exc.strerror or exc})")
    return options


def _runtime_exit_code(decision: AdmissionDecision | None, active: bool, fail_open: bool) -> int:
    """0 active (or failing open), 2 an I/O error, 1 any other rejection."""
    from dspark_calibrate.artifacts import Reason

    if active or fail_open:
        return EXIT_OK
    if decision is not None and decision.reason is Reason.IO_ERROR:
        return EXIT_USAGE
    return EXIT_REJECTED


def _runtime_json(
    decision: AdmissionDecision | None,
    options: TrtllmOptions | None,
    out: Path | None,
    *,
    active: bool,
    code: int,
) -> dict[str, Any]:
    """The ``--json`` report of the runtime form; its error is the first reason static K was chosen."""
    reason, message = None, None
    if not active:
        if decision is not None and decision.active and options is not None:
            reason, message = options.reason_code, options.message
        elif decision is not None:
            reason, message = decision.reason_code, decision.message
        elif options is not None:
            reason, message = options.reason_code, options.message
    return {
        "ok": active,
        "error": reason,
        "message": message,
        "fix": split_fix(message)[1] if message else None,
        "active": active,
        "exit_code": code,
        "decision": decision.to_dict() if decision is not None else None,
        "trtllm": options.to_dict() if options is not None else None,
        "options_path": str(out) if out is not None else None,
    }
