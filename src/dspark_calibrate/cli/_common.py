"""Shared pieces of the command-line apps: exit codes, consoles, option aliases, parsers.

Everything here is presentation; decisions live in the library.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from dspark_calibrate.errors import ConfigError

__all__ = [
    "EXIT_OK",
    "EXIT_REJECTED",
    "EXIT_USAGE",
    "ArtifactPath",
    "JsonFlag",
    "TrustRootOption",
    "err_console",
    "exit_with",
    "fail_usage",
    "out_console",
    "parse_expiry",
    "parse_ladder",
    "print_json",
    "utcnow",
]

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2

out_console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

ArtifactPath = Annotated[
    Path, typer.Argument(help="A signed Parquet artifact, or a bundle directory.", show_default=False)
]
TrustRootOption = Annotated[
    Path, typer.Option("--trust-root", help="The pinned trust root (root.json) to verify against.")
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print a machine-readable JSON report on stdout.")]
AllowSyntheticFlag = Annotated[
    bool, typer.Option("--allow-synthetic", help="Accept synthetic evidence (demos and tests only).")
]


def utcnow() -> datetime:
    """The current time, timezone-aware (the CLI's only clock read)."""
    return datetime.now(UTC)


def print_json(obj: Any) -> None:
    """Print JSON to stdout (sorted keys, 2-space indent)."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def exit_with(code: int) -> NoReturn:
    """Leave the command with an exit code (0 valid, 1 rejected, 2 usage or I/O error)."""
    raise typer.Exit(code)


def fail_usage(message: str) -> NoReturn:
    """Print a usage/I-O error to stderr and exit 2."""
    err_console.print(f"[bold red]error:[/] {message}")
    exit_with(EXIT_USAGE)


_DURATION = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_expiry(text: str, *, now: datetime, option: str = "--expires") -> datetime:
    """Parse ``30d``/``12h``/``2w`` (relative to ``now``) or an ISO-8601 time (UTC if no zone).

    Raises:
        ConfigError: neither form, or not in the future.
    """
    m = _DURATION.match(text.strip())
    if m:
        when = now + timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
    else:
        try:
            when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"{option} {text!r} is neither a duration (e.g. 30d, 12h) nor an ISO-8601 time "
                "(e.g. 2027-01-31T00:00:00Z)"
            ) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
    if when <= now:
        raise ConfigError(f"{option} {text!r} is not in the future")
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
        raise ConfigError(f"{option} {text!r}: every entry must be an integer") from None
    if any(v < 1 for v in values):
        raise ConfigError(f"{option} {text!r}: graph batch sizes must be >= 1")
    if len(set(values)) != len(values):
        raise ConfigError(f"{option} {text!r}: duplicate graph batch size")
    return tuple(sorted(values))
