"""Shared pieces of the command-line apps: exit codes, consoles, option aliases, parsers, and
the one error path every command leaves through.

Everything here is presentation; decisions live in the library.

Conventions every command follows (both apps are built with :func:`make_app`):

- ``-h``/``--help`` show plain, unboxed help with each option's default and an example
  (``epilog``); ``--version`` prints the tool's version; ``--install-completion`` and
  ``--show-completion`` set up shell completion.
- Every failure leaves through :func:`fail`: one line on stderr, ``error: <what>; <fix>``, no
  traceback, and with ``--json`` one object ``{"ok": false, "error": CODE, "message": ..., "fix":
  ...}`` on stdout. Usage errors the parser finds (a missing option, a bad integer) take the same
  path (:class:`CliGroup`, :class:`CliCommand`). Exit codes: 0 ok, 1 the evidence was rejected,
  2 usage or I/O error, 130 interrupted.
"""

from __future__ import annotations

import contextvars
import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from typer import _click as click  # typer's own copy of click
from typer.core import TyperCommand, TyperGroup

import dspark_calibrate
from dspark_calibrate.errors import ConfigError, DsparkError

__all__ = [
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_REJECTED",
    "EXIT_USAGE",
    "AllowSyntheticFlag",
    "ArtifactPath",
    "CliCommand",
    "CliGroup",
    "JsonFlag",
    "LiveOptions",
    "StageDisplay",
    "TrustRootOption",
    "check_output_dir",
    "check_output_file",
    "command",
    "err_console",
    "error_document",
    "exit_with",
    "fail",
    "fail_error",
    "fail_usage",
    "json_mode",
    "make_app",
    "out_console",
    "parse_expiry",
    "parse_ladder",
    "print_json",
    "print_table",
    "split_fix",
    "stage_line",
    "utcnow",
]

_F = TypeVar("_F", bound=Callable[..., Any])

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

out_console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

#: Set while a command runs with ``--json`` (found in its arguments before parsing, so that a
#: usage error the parser raises is reported as JSON too).
_JSON_MODE: contextvars.ContextVar[bool] = contextvars.ContextVar("dspark_json_mode", default=False)

ArtifactPath = Annotated[
    Path,
    typer.Argument(
        help="A signed Parquet artifact, or a bundle directory.", show_default=False, metavar="PATH"
    ),
]
TrustRootOption = Annotated[
    Path,
    typer.Option(
        "--trust-root", help="The pinned trust root (root.json) to verify against.", metavar="ROOT.json"
    ),
]
JsonFlag = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print a machine-readable JSON report on stdout (errors as {ok, error, message, fix}).",
    ),
]
AllowSyntheticFlag = Annotated[
    bool, typer.Option("--allow-synthetic", help="Accept synthetic evidence (demos and tests only).")
]


def utcnow() -> datetime:
    """The current time, timezone-aware (the CLI's only clock read)."""
    return datetime.now(UTC)


def json_mode() -> bool:
    """True while the running command was given ``--json``."""
    return _JSON_MODE.get()


def print_json(obj: Any) -> None:
    """Print JSON to stdout (sorted keys, 2-space indent)."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def exit_with(code: int) -> NoReturn:
    """Leave the command with an exit code (0 valid, 1 rejected, 2 usage or I/O error)."""
    raise typer.Exit(code)


#: The fix when a message carries none of its own.
DEFAULT_FIX = "run the command with -h for its options and an example"


def split_fix(message: str) -> tuple[str, str]:
    """Split ``"what; fix"`` (the package's message convention) into its two parts.

    The fix is the text after the last ``"; "`` when that text reads as an instruction; otherwise
    the whole message is the what and :data:`DEFAULT_FIX` the fix.
    """
    head, sep, tail = message.rpartition("; ")
    if sep and head and tail and not tail[:1].isdigit():
        return head, tail.rstrip(".")
    return message, DEFAULT_FIX


def error_document(code: str, message: str, fix: str | None = None, **extra: Any) -> dict[str, Any]:
    """The one JSON shape of a failure: ``{ok: false, error, message, fix}`` plus ``extra``."""
    return {"ok": False, "error": code, "message": message, "fix": fix or split_fix(message)[1], **extra}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def fail(
    message: str,
    *,
    code: str = "USAGE_ERROR",
    fix: str | None = None,
    exit_code: int = EXIT_USAGE,
    label: str = "error",
    extra: dict[str, Any] | None = None,
) -> NoReturn:
    """Report a failure the one way every command does, then exit.

    Prints ``<label>: <message>`` as one line on stderr (the message carries its fix, or ``fix``
    is appended) and, with ``--json``, :func:`error_document` on stdout.

    Args:
        message: what is wrong: the file, the field, expected vs actual (STYLE rule 8).
        code: a stable code (a ``Reason`` value or an error's ``code``).
        fix: what to do; default: the message's own ``"; fix"`` tail.
        exit_code: 2 for usage or I/O errors (default), 1 when the evidence was rejected.
        label: the stderr prefix (``error``, or a reason code for rejections).
        extra: more keys for the JSON document.
    """
    message = _one_line(message)
    line = message if fix is None else f"{message}; {fix}"
    err_console.print(f"[bold red]{escape(label)}:[/] {escape(line)}", highlight=False)
    if json_mode():
        print_json(error_document(code, message, fix, **(extra or {})))
    exit_with(exit_code)


def fail_usage(message: str) -> NoReturn:
    """Print a usage/I-O error (one line, its fix included) and exit 2."""
    fail(message)


def fail_error(exc: DsparkError | OSError, *, exit_code: int = EXIT_USAGE) -> NoReturn:
    """Report a library error (its code and message) and exit (2 by default)."""
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        fail(f"{where}{exc.strerror or exc}; check the path and its permissions", code="IO_ERROR")
    fail(str(exc), code=exc.code, exit_code=exit_code)


def print_table(table: Any, console: Console | None = None) -> None:
    """Print a Rich table whose cells wrap rather than end in "…": a digest, a keyid or a path is
    never cut short (a narrow terminal folds it onto the next line instead)."""
    for column in table.columns:
        column.overflow = "fold"
        column.no_wrap = False
    (console or out_console).print(table)


def stage_line(command: str, stage: str, detail: str = "") -> None:
    """One progress line per stage on stderr when stderr is not a terminal (logs, CI, pipes).

    On a terminal the commands show a live status instead; with ``--json`` nothing is printed.
    """
    if json_mode() or err_console.is_terminal:
        return
    err_console.print(escape(f"{command}: {stage}" + (f" ({detail})" if detail else "")), highlight=False)


class StageDisplay:
    """What a long command is doing: a spinner with the stage and the time it has taken on a
    terminal, one line per stage otherwise (:func:`stage_line`), nothing with ``--json``.

    Use as a context manager; call it with each stage's name as the stage starts.
    """

    def __init__(self, command: str, *, quiet: bool = False) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.command = command
        self.quiet = quiet or json_mode()
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
            disable=self.quiet or not err_console.is_terminal,
        )
        self.task = self.progress.add_task(command, total=None)

    def __call__(self, stage: str) -> None:
        """Show that ``stage`` has started."""
        if self.quiet:
            return
        self.progress.update(self.task, description=escape(f"{self.command}: {stage}"))
        stage_line(self.command, stage)

    def __enter__(self) -> StageDisplay:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


def _version_callback(ctx: typer.Context, value: bool) -> None:
    if value:
        # The program's own name: `dspark-verify --version` names dspark-verify.
        program = ctx.find_root().info_name or "dspark-calibrate"
        out_console.print(f"{program} {dspark_calibrate.__version__}")
        raise typer.Exit(EXIT_OK)


VersionFlag = Annotated[
    bool,
    typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version and exit."),
]


class _OneLineErrors:
    """``main`` for both apps: usage errors as one line (or JSON), Ctrl-C as exit 130."""

    name: str | None

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        token = _JSON_MODE.set("--json" in argv)
        try:
            result = super().main(  # type: ignore[misc]  # cooperative mixin over TyperGroup/TyperCommand
                argv, prog_name, complete_var, False, windows_expand_args, **extra
            )
            code = result if isinstance(result, int) else EXIT_OK
        except click.exceptions.NoArgsIsHelpError as exc:
            click.echo(exc.ctx.get_help() if exc.ctx else "", err=False)
            code = EXIT_OK if not argv else EXIT_USAGE
        except click.exceptions.UsageError as exc:
            code = _report_usage(exc, prog_name or self.name or "dspark-calibrate")
        except click.exceptions.ClickException as exc:
            code = _report_click(exc)
        except typer.Abort:
            err_console.print("interrupted", highlight=False)
            code = EXIT_INTERRUPTED
        except typer.Exit as exc:
            code = exc.exit_code
        finally:
            _JSON_MODE.reset(token)
        if not standalone_mode:
            return code
        sys.exit(code)


def _report_usage(exc: click.exceptions.UsageError, prog: str) -> int:
    where = exc.ctx.command_path if exc.ctx is not None else prog
    # click ends its sentences with a period; the fix follows after "; ".
    message = _one_line(exc.format_message()).rstrip(".")
    fix = f"run `{where} -h` for its options and an example"
    err_console.print(f"[bold red]error:[/] {escape(f'{where}: {message}; {fix}')}", highlight=False)
    if _JSON_MODE.get():
        print_json(error_document("USAGE_ERROR", f"{where}: {message}", fix))
    return EXIT_USAGE


def _report_click(exc: click.exceptions.ClickException) -> int:
    message = _one_line(exc.format_message())
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    if _JSON_MODE.get():
        print_json(error_document("USAGE_ERROR", message))
    return exc.exit_code if exc.exit_code else EXIT_USAGE


class CliGroup(_OneLineErrors, TyperGroup):
    """The command group class of ``dspark-calibrate`` and its sub-groups."""


class CliCommand(_OneLineErrors, TyperCommand):
    """The command class of every command: arguments listed by their metavar, without the Python
    type Typer would print (``<list[Path]>``)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Arguments, then options, as plain definition lists."""
        args, opts = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                name = param.metavar or (param.name or "").upper()
                args.append((name, record[1]))
            else:
                opts.append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        if opts:
            with formatter.section("Options"):
                formatter.write_dl(opts)


def command(app: typer.Typer, name: str, *examples: str, **kwargs: Any) -> Callable[[_F], _F]:
    """``app.command(name)`` with the project's command class and an example epilog."""
    if examples:
        kwargs.setdefault("epilog", example(*examples))
    decorator: Callable[[_F], _F] = app.command(name, cls=CliCommand, **kwargs)
    return decorator


#: Help layout shared by every command: ``-h``, defaults shown, wide enough for option names.
CONTEXT_SETTINGS: dict[str, Any] = {
    "help_option_names": ["-h", "--help"],
    "show_default": True,
    "max_content_width": 110,
}


def make_app(name: str | None, help: str, *, group: bool = True, **kwargs: Any) -> typer.Typer:
    """A Typer app with the project's conventions (see the module docstring).

    Args:
        name: the app's name (``None`` for sub-groups named by ``add_typer``).
        help: one-line description.
        group: a command group (default) or a single-command app.
        kwargs: more ``typer.Typer`` arguments.
    """
    kwargs.setdefault("no_args_is_help", True)
    kwargs.setdefault("add_completion", name is not None)
    return typer.Typer(
        name=name,
        help=help,
        cls=CliGroup if group else None,
        context_settings=CONTEXT_SETTINGS,
        rich_markup_mode=None,  # plain help: option names are never cut, no boxes
        pretty_exceptions_show_locals=False,  # key material may be in scope
        **kwargs,
    )


def example(*lines: str) -> str:
    """An ``epilog`` that shows example invocations under a command's help."""
    body = "\n".join(f"  {line}" for line in lines)
    return f"\b\nExamples:\n{body}"


_DURATION = re.compile(r"^(\d+)\s*([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
#: The furthest expiry accepted, from now: a century. Far beyond any signing policy, and far below
#: where the clock arithmetic of verifiers overflows (year 9999).
MAX_EXPIRY = timedelta(days=36_500)


def parse_expiry(text: str, *, now: datetime, option: str = "--expires") -> datetime:
    """Parse ``30d``/``12h``/``2w`` (relative to ``now``) or an ISO-8601 time (UTC if no zone).

    Raises:
        ConfigError: neither form, not in the future, or more than :data:`MAX_EXPIRY` ahead.
    """
    m = _DURATION.match(text.strip())
    too_far = f"{option} {text!r} is more than {MAX_EXPIRY.days} days ahead; give a nearer expiry, e.g. 365d"
    if m:
        # Compared as an integer first: a timedelta of a huge count overflows (a bare error).
        digits, unit = m.groups()
        if len(digits) > 12 or int(digits) * _UNIT_SECONDS[unit] > MAX_EXPIRY.total_seconds():
            raise ConfigError(too_far)
        when = now + timedelta(seconds=int(digits) * _UNIT_SECONDS[unit])
    else:
        try:
            when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"{option} {text!r} is neither a duration nor an ISO-8601 time; give e.g. 30d, 12h or "
                "2027-01-31T00:00:00Z"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        try:
            ahead = when - now
        except OverflowError:  # a time at the end of the calendar in a far zone
            raise ConfigError(too_far) from None
        if ahead > MAX_EXPIRY:
            raise ConfigError(too_far)
    if when <= now:
        raise ConfigError(f"{option} {text!r} is not in the future; give a later time or a duration like 30d")
    return when


def parse_ladder(text: str, *, option: str = "--ladder") -> tuple[int, ...]:
    """Parse a comma-separated graph ladder ``8,16,32`` (strictly increasing positive ints).

    Raises:
        ConfigError: empty, non-integer, non-positive, duplicated or unsorted values.
    """
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ConfigError(f"{option} is empty; give graph batch sizes like 8,16,32")
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise ConfigError(f"{option} {text!r} holds a non-integer; give integers like 8,16,32") from None
    if any(v < 1 for v in values):
        raise ConfigError(f"{option} {text!r} holds a size below 1; graph batch sizes are >= 1")
    if len(set(values)) != len(values):
        raise ConfigError(f"{option} {text!r} repeats a graph batch size; list each once")
    return tuple(sorted(values))


# -- outputs, checked before any work ------------------------------------------------------------
# A command that measures, fits or signs for minutes must not learn only at the end that it
# cannot write its result: every output path is checked first.


def check_output_file(
    path: Path,
    *,
    option: str = "--out",
    suffixes: tuple[str, ...] = (".parquet",),
    what: str = "a Parquet file",
    force: bool | None = None,
) -> None:
    """Refuse an output file path that cannot take the result; create its missing parent directories.

    Args:
        path: the file the command will write.
        option: the option that named it (for the message).
        suffixes: the accepted suffixes (lower case; empty accepts any).
        what: what the command writes there, for the message (``a Parquet file``).
        force: ``None`` when the command replaces an existing file anyway; otherwise an existing
            file is refused unless ``force`` is True.

    Raises:
        ConfigError: the path is a directory, has another suffix, exists without ``force``, or its
            parent cannot be created.
    """
    if path.is_dir():
        example = f"{path}/<name>{suffixes[0] if suffixes else ''}"
        raise ConfigError(
            f"{option} {path} is a directory, but the command writes {what} there; give a file path such "
            f"as {example}"
        )
    if suffixes and path.suffix.lower() not in suffixes:
        raise ConfigError(
            f"{option} {path}: the command writes {what}, and the name ends in "
            f"{path.suffix or 'no suffix'}; give a name ending in {' or '.join(suffixes)}"
        )
    if force is False and path.exists():
        raise ConfigError(f"{option} {path} exists; choose another name or pass --force to replace it")
    _make_parent(path, option)


def check_output_dir(path: Path, *, option: str = "--out", force: bool | None = None) -> None:
    """Refuse an output directory path that is a file (or, when ``force`` is False, that exists).

    Args:
        path: the directory the command will create or fill.
        option: the option that named it.
        force: ``None`` when the command writes into an existing directory; otherwise an existing
            one is refused unless ``force`` is True.

    Raises:
        ConfigError: the path is a file (or exists without ``force``), or its parent cannot be created.
    """
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"{option} {path} is a file, but the command writes a directory of files there; give a "
            "directory path (a new one is created)"
        )
    if force is False and path.exists():
        raise ConfigError(f"{option} {path} exists; choose another directory or pass --force to replace it")
    _make_parent(path, option)


def _make_parent(path: Path, option: str) -> None:
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise ConfigError(f"{option} {path}: {parent} is a file, not a directory; choose another path")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"{option} {path}: cannot create the directory {parent} ({exc.strerror or exc}); "
            "choose a writable path"
        ) from exc


# -- the deployment fingerprint on the command line (docs/fingerprint.md) ------------------------
# One option per fingerprint field, named after artifacts.FINGERPRINT_FLAGS and shared by `sweep`
# (the deployment being measured) and `dspark-verify` (the deployment about to serve), so the same
# flags describe the same deployment on both sides.

_FP_PANEL = "Deployment fingerprint (docs/fingerprint.md)"


def _fp_option(flag: str, help: str, metavar: str) -> Any:
    return typer.Option(flag, help=help, metavar=metavar, show_default=False, rich_help_panel=_FP_PANEL)


LiveGpu = Annotated[
    str | None,
    _fp_option("--live-gpu", "GPU name, e.g. H200 (probed by NVML); cpu for a CPU deployment.", "NAME"),
]
LiveGpuCount = Annotated[
    int | None,
    _fp_option("--live-gpu-count", "GPUs in the deployment (probed; a DEP8 rank measured alone: 8).", "N"),
]
LiveGpuSnapshot = Annotated[
    str | None,
    _fp_option("--live-gpu-snapshot-sha256", "GPU model/driver/VBIOS digest (probed by NVML).", "HEX"),
]
LiveTopology = Annotated[
    str | None, _fp_option("--live-topology", "Parallel layout, e.g. TP1, DEP8 (or DSPARK_TOPOLOGY).", "NAME")
]
LiveSourceDir = Annotated[
    Path | None,
    _fp_option("--live-source-dir", "Engine source checkout: its git HEAD and diff digest are read.", "DIR"),
]
LiveSourceHead = Annotated[
    str | None, _fp_option("--live-source-head", "Engine source commit (or DSPARK_SOURCE_HEAD).", "COMMIT")
]
LiveSourceDiff = Annotated[
    str | None,
    _fp_option(
        "--live-source-diff-sha256",
        "SHA-256 of the engine's uncommitted diff, sha256 of empty input for a clean tree "
        "(or DSPARK_SOURCE_DIFF_SHA256).",
        "HEX",
    ),
]
LiveRuntimeSnapshot = Annotated[
    str | None,
    _fp_option(
        "--live-runtime-snapshot", "Runtime snapshot string (probed: installed package versions).", "TEXT"
    ),
]
LiveModelConfig = Annotated[
    str | None,
    _fp_option(
        "--live-model-config",
        "The model's config.json (digested), or a bundled reference config name (tiny, deepseek-v3, ...).",
        "CONFIG.json",
    ),
]
LiveCheckpoint = Annotated[
    str | None, _fp_option("--live-checkpoint-sha256", "Digest of the model checkpoint.", "HEX")
]
LiveAttention = Annotated[
    str | None,
    _fp_option("--live-attention-backend", "Resolved attention kernel backend, e.g. TRTLLM.", "NAME"),
]
LiveMoe = Annotated[
    str | None, _fp_option("--live-moe-backend", "Resolved MoE kernel backend, e.g. CUTLASS.", "NAME")
]
LiveKvDtype = Annotated[
    str | None, _fp_option("--live-kv-dtype", "KV-cache dtype, e.g. fp8, bfloat16.", "DTYPE")
]
LiveBodyBuckets = Annotated[
    str | None,
    _fp_option(
        "--live-body-buckets", "The engine's captured prefill body buckets (mixed evidence only).", "B1,B2,..."
    ),
]
LiveExecutionMode = Annotated[
    str | None,
    _fp_option(
        "--live-execution-mode", "The engine's prefill graph mode, e.g. BREAKABLE (mixed evidence only).", "MODE"
    ),
]


@dataclass(frozen=True, slots=True)
class LiveOptions:
    """The ``--live-*`` values given on the command line (``None``: not given, probe it)."""

    k: int | None = None
    ladder: str | None = None
    topology: str | None = None
    gpu: str | None = None
    gpu_count: int | None = None
    gpu_snapshot_sha256: str | None = None
    source_dir: Path | None = None
    source_head: str | None = None
    source_diff: str | None = None
    runtime_snapshot: str | None = None
    model_config: str | None = None
    checkpoint_sha256: str | None = None
    attention_backend: str | None = None
    moe_backend: str | None = None
    kv_dtype: str | None = None
    body_buckets: str | None = None
    execution_mode: str | None = None

    @classmethod
    def from_options(cls, options: Any) -> LiveOptions:
        """From a command's parsed options: each field is the ``live_``-prefixed attribute of the
        same name (``gpu`` is ``--live-gpu``'s ``live_gpu``; None where the command has no such option)."""
        return cls(**{f.name: getattr(options, f"live_{f.name}", None) for f in fields(cls)})

    def mixed_live(self) -> Any:
        """The live route facts mixed evidence is bound to (``MixedLive``; unset ones are None).

        Raises:
            ConfigError: a malformed ``--live-body-buckets``.
        """
        from dspark_calibrate.artifacts import MixedLive

        buckets = parse_ladder(self.body_buckets, option="--live-body-buckets") if self.body_buckets else None
        return MixedLive(buckets, self.execution_mode)

    def arguments(self) -> dict[str, Any]:
        """``runtime_plugin.live.collect_live`` keyword arguments (explicit values win over probes).

        Raises:
            ConfigError: a malformed ``--live-ladder`` or an unknown bundled config name.
        """
        overrides = {
            name: value
            for name, value in (
                ("gpu_snapshot_sha256", self.gpu_snapshot_sha256),
                ("checkpoint_sha256", self.checkpoint_sha256),
                ("attention_backend", self.attention_backend),
                ("moe_backend", self.moe_backend),
                ("kv_dtype", self.kv_dtype),
            )
            if value is not None
        }
        model_config: Path | None = None
        if self.model_config is not None:
            path = Path(self.model_config)
            if path.exists() or "/" in self.model_config or self.model_config.endswith(".json"):
                model_config = path
            else:
                overrides["model_config_sha256"] = _bundled_config_digest(self.model_config)
        return {
            "max_draft_len": self.k,
            "rank_local_graph_batch_sizes": parse_ladder(self.ladder, option="--live-ladder")
            if self.ladder
            else None,
            "topology": self.topology,
            "gpu": self.gpu,
            "gpu_count": self.gpu_count,
            "source_dir": self.source_dir,
            "source_head": self.source_head,
            "source_diff_sha256": self.source_diff,
            "runtime_snapshot": self.runtime_snapshot,
            "model_config": model_config,
            "overrides": overrides,
        }

    def collect(self) -> Any:
        """Collect the live context (explicit options win over probes).

        Raises:
            ConfigError: a malformed option value.
            ProbeError: the values do not form a valid fingerprint.
        """
        from dspark_calibrate.runtime_plugin.live import collect_live

        return collect_live(**self.arguments())


def _bundled_config_digest(name: str) -> str:
    """The digest the reference backend records for a bundled config (CPU deployments)."""
    from dspark_calibrate.calibrate.measurement.backends.reference import BUNDLED_CONFIGS, load_model_config

    if name not in BUNDLED_CONFIGS:
        raise ConfigError(
            f"--live-model-config {name}: no such file and not a bundled config; pass the model's "
            f"config.json or one of {', '.join(sorted(BUNDLED_CONFIGS))}"
        )
    return load_model_config(name)[1]
