"""``dspark-calibrate trust init|rotate|show``: manage the TUF-style trust root."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from dspark_calibrate.cli._common import (
    EXIT_OK,
    EXIT_REJECTED,
    JsonFlag,
    err_console,
    exit_with,
    fail_usage,
    out_console,
    parse_expiry,
    print_json,
    utcnow,
)
from dspark_calibrate.errors import ConfigError, DsparkError

if TYPE_CHECKING:
    from dspark_calibrate.artifacts import TrustRoot

__all__ = ["load_root_or_exit", "register", "signers_from_keys"]

trust_app = typer.Typer(help="Create, rotate and inspect the trust root.", no_args_is_help=True)

KeyOption = Annotated[
    list[Path],
    typer.Option("--key", help="Private key file of a signer (repeat for several)."),
]
PassEnv = Annotated[
    str | None, typer.Option("--passphrase-env", help="Environment variable holding the keys' passphrase.")
]


def signers_from_keys(paths: list[Path], passphrase_env: str | None) -> list[Any]:
    """Load signers from private key files (or ``uri:`` external signer references).

    Raises:
        ConfigError: a key file is missing, too permissive, or its passphrase is wrong.
    """
    from dspark_calibrate.artifacts import load_signer

    passphrase = None
    if passphrase_env:
        value = os.environ.get(passphrase_env)
        if not value:
            raise ConfigError(f"--passphrase-env {passphrase_env}: the variable is unset or empty")
        passphrase = value.encode()
    return [load_signer(p, passphrase=passphrase) for p in paths]


def load_root_or_exit(path: Path) -> TrustRoot:
    """Read and verify a trust root; exit 2 if unreadable, 1 if invalid or expired."""
    from dspark_calibrate.artifacts import TrustRootError, TrustRootUnreadable, read_trust_root

    try:
        return read_trust_root(path, now=utcnow())
    except TrustRootUnreadable as exc:
        fail_usage(str(exc))
    except TrustRootError as exc:
        err_console.print(f"[bold red]{exc.reason.value}[/] {exc}")
        exit_with(EXIT_REJECTED)


def _public_keys(paths: list[Path]) -> list[Any]:
    from dspark_calibrate.artifacts import load_public_key

    return [load_public_key(p) for p in paths]


def _write_root(root: TrustRoot, out: Path) -> None:
    from dspark_calibrate.artifacts import atomic_write_bytes

    atomic_write_bytes(out, root.to_bytes())


def _describe(root: TrustRoot, path: Path, json_out: bool) -> None:
    info = {
        "path": str(path),
        "version": root.version,
        "expires": root.expires.isoformat(),
        "digest": root.digest(),
        "root_threshold": root.root_threshold,
        "root_keyids": sorted(root.root_keys),
        "artifact_threshold": root.artifact_threshold,
        "artifact_keyids": sorted(root.artifact_keys),
    }
    if json_out:
        print_json(info)
        return
    table = Table(title=f"trust root {path}", show_header=False)
    for key, value in info.items():
        table.add_row(key, "\n".join(value) if isinstance(value, list) else str(value))
    out_console.print(table)


@trust_app.command("init")
def init(
    key: KeyOption,
    out: Annotated[Path, typer.Option("--out", help="Where to write root.json.")],
    expires: Annotated[
        str, typer.Option("--expires", help="Root expiry: a duration (365d) or ISO time.")
    ] = "365d",
    threshold: Annotated[int, typer.Option("--threshold", help="Root signatures needed for rotation.")] = 1,
    artifact_key: Annotated[
        list[Path] | None,
        typer.Option("--artifact-key", help="Public key allowed to sign artifacts (default: the root keys)."),
    ] = None,
    artifact_threshold: Annotated[
        int, typer.Option("--artifact-threshold", help="Signatures needed on artifacts.")
    ] = 1,
    passphrase_env: PassEnv = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing root file.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Create a version-1 trust root signed by the given root keys."""
    from dspark_calibrate.artifacts import init_root, public_key_of

    if out.exists() and not force:
        fail_usage(f"{out} exists; pass --force to replace it (rotation is `trust rotate`)")
    try:
        now = utcnow()
        signers = signers_from_keys(key, passphrase_env)
        root_keys = [public_key_of(s) for s in signers]
        art_keys = _public_keys(artifact_key) if artifact_key else root_keys
        root = init_root(
            root_signers=signers,
            root_keys=root_keys,
            root_threshold=threshold,
            artifact_keys=art_keys,
            artifact_threshold=artifact_threshold,
            expires=parse_expiry(expires, now=now),
        )
        _write_root(root, out)
    except (DsparkError, OSError) as exc:
        fail_usage(str(exc))
    _describe(root, out, json_out)
    exit_with(EXIT_OK)


@trust_app.command("rotate")
def rotate(
    root_path: Annotated[Path, typer.Option("--root", help="The current root.json.")],
    key: KeyOption,
    out: Annotated[Path, typer.Option("--out", help="Where to write the new root (version + 1).")],
    expires: Annotated[str, typer.Option("--expires", help="New expiry: duration or ISO time.")] = "365d",
    add_root_key: Annotated[
        list[Path] | None, typer.Option("--add-root-key", help="Public key to add to root.")
    ] = None,
    remove_root_key: Annotated[
        list[str] | None, typer.Option("--remove-root-key", help="Keyid to remove from root.")
    ] = None,
    root_threshold: Annotated[
        int | None, typer.Option("--root-threshold", help="New root threshold.")
    ] = None,
    add_artifact_key: Annotated[
        list[Path] | None, typer.Option("--add-artifact-key", help="Public key to add to artifact signers.")
    ] = None,
    remove_artifact_key: Annotated[
        list[str] | None, typer.Option("--remove-artifact-key", help="Keyid to remove from artifact signers.")
    ] = None,
    artifact_threshold: Annotated[
        int | None, typer.Option("--artifact-threshold", help="New artifact threshold.")
    ] = None,
    passphrase_env: PassEnv = None,
    json_out: JsonFlag = False,
) -> None:
    """Rotate the root: version + 1, signed by the thresholds of both the old and the new root."""
    from dspark_calibrate.artifacts import rotate_root

    old = load_root_or_exit(root_path)
    try:
        now = utcnow()
        new = rotate_root(
            old,
            signers=signers_from_keys(key, passphrase_env),
            add_root_keys=_public_keys(add_root_key or []),
            remove_root_keyids=remove_root_key or [],
            root_threshold=root_threshold,
            add_artifact_keys=_public_keys(add_artifact_key or []),
            remove_artifact_keyids=remove_artifact_key or [],
            artifact_threshold=artifact_threshold,
            expires=parse_expiry(expires, now=now),
        )
        _write_root(new, out)
    except (DsparkError, OSError) as exc:
        code = getattr(exc, "reason", None)
        err_console.print(f"[bold red]{code.value if code else 'error'}[/] {exc}")
        exit_with(EXIT_REJECTED if code else 2)
    _describe(new, out, json_out)
    exit_with(EXIT_OK)


@trust_app.command("show")
def show(
    root_path: Annotated[Path, typer.Argument(help="root.json to show (verified first).")],
    json_out: JsonFlag = False,
) -> None:
    """Verify and describe a trust root."""
    root = load_root_or_exit(root_path)
    _describe(root, root_path, json_out)
    exit_with(EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add the ``trust`` group to the app."""
    app.add_typer(trust_app, name="trust")
