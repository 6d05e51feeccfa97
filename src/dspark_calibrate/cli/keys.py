"""``dspark-calibrate keygen``: create a signing key pair."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from dspark_calibrate.cli._common import (
    EXIT_OK,
    JsonFlag,
    err_console,
    example,
    exit_with,
    fail_error,
    fail_usage,
    out_console,
    print_json,
)
from dspark_calibrate.errors import ConfigError

__all__ = ["register"]


def keygen(
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Directory for signing-key.pem (0600) and signing-key.pub.pem; created 0700 if missing.",
            metavar="DIR",
        ),
    ],
    algorithm: Annotated[
        str, typer.Option("--algorithm", help="ed25519 (default) or ecdsa-p256.")
    ] = "ed25519",
    passphrase_env: Annotated[
        str | None,
        typer.Option(
            "--passphrase-env",
            help="Encrypt the private key with the passphrase in this environment variable.",
            metavar="VAR",
        ),
    ] = None,
    name: Annotated[str, typer.Option("--name", help="File name stem.")] = "signing-key",
    json_out: JsonFlag = False,
) -> None:
    """Create a signing key pair (private key written 0600; existing files are never overwritten)."""
    from dspark_calibrate.artifacts import generate_keypair

    if algorithm not in ("ed25519", "ecdsa-p256"):
        fail_usage(f"--algorithm {algorithm!r} is not supported; choose ed25519 or ecdsa-p256")
    passphrase = None
    if passphrase_env is not None:
        value = os.environ.get(passphrase_env)
        if not value:
            fail_usage(
                f"--passphrase-env {passphrase_env}: the variable is unset or empty; export it with the passphrase"
            )
        passphrase = value.encode()
    try:
        # The library creates a missing directory 0700 (umask ignored); creating it here first
        # would give it the umask's mode.
        pair = generate_keypair(out, algorithm=algorithm, passphrase=passphrase, name=name)
    except (ConfigError, OSError) as exc:
        fail_error(exc)
    if json_out:
        print_json(
            {
                "private_key": str(pair.private_path),
                "public_key": str(pair.public_path),
                "keyid": pair.keyid,
                "algorithm": pair.algorithm,
            }
        )
    else:
        out_console.print(f"private key  {pair.private_path} (0600)")
        out_console.print(f"public key   {pair.public_path}")
        out_console.print(f"keyid        {pair.keyid}  (a hint only; trust comes from the trust root)")
        err_console.print("Keep the private key off GPU nodes: only `build`/`sign` need it.")
    exit_with(EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add ``keygen`` to the app."""
    app.command(
        "keygen",
        epilog=example(
            "dspark-calibrate keygen --out keys/",
            "KEYPASS=... dspark-calibrate keygen --out keys/ --passphrase-env KEYPASS",
        ),
    )(keygen)
