"""``dspark-calibrate sign``: sign an unsigned table of a known kind."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dspark_calibrate.cli._common import (
    EXIT_OK,
    JsonFlag,
    example,
    exit_with,
    fail_error,
    out_console,
    parse_expiry,
    print_json,
    utcnow,
)
from dspark_calibrate.cli._numeric import check_expires
from dspark_calibrate.cli.trust import (
    KeyOption,
    PassEnv,
    SignerPublicKeyOption,
    SignerUriOption,
    signers_from_keys,
)
from dspark_calibrate.errors import DsparkError

__all__ = ["register"]


def sign(
    table: Annotated[
        Path,
        typer.Argument(
            help="An unsigned (or previously signed) Parquet table of a known kind.",
            metavar="TABLE.parquet",
            show_default=False,
        ),
    ],
    version: Annotated[
        int, typer.Option("--version", help="Version in the artifact's series (monotonic).", metavar="N")
    ],
    key: KeyOption = None,
    expires: Annotated[
        str, typer.Option("--expires", help="Expiry: a duration (30d) or ISO time.", callback=check_expires)
    ] = "30d",
    kind: Annotated[
        str | None, typer.Option("--kind", help="Sign as this kind (default: the footer's).")
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write here instead of in place.")] = None,
    passphrase_env: PassEnv = None,
    signer_uri: SignerUriOption = None,
    signer_public_key: SignerPublicKeyOption = None,
    json_out: JsonFlag = False,
) -> None:
    """Sign TABLE: embed a DSSE envelope in the footer and write TABLE.dsse.json beside it."""
    from dspark_calibrate.artifacts import ArtifactReadError, read_artifact, sign_artifact

    try:
        # The keys first: a wrong key is the cheaper mistake to report, and the table may be large.
        signers = signers_from_keys(
            key, passphrase_env, signer_uris=signer_uri, signer_public_keys=signer_public_key
        )
        loaded = read_artifact(table)
        now = utcnow()
        signed = sign_artifact(
            loaded,
            signers,
            version=version,
            expires_at=parse_expiry(expires, now=now),
            issued_at=now,
            out=out,
            kind=kind,
        )
    except (ArtifactReadError, DsparkError, OSError) as exc:
        fail_error(exc)
    result = {
        "path": str(signed.path),
        "detached": str(signed.detached_path),
        "kind": signed.kind,
        "logical_sha256": signed.logical_sha256,
        "series": signed.series,
        "version": signed.version,
        "keyids": list(signed.keyids),
    }
    if json_out:
        print_json(result)
    else:
        out_console.print(
            f"signed {signed.kind} v{signed.version} → {signed.path} (+ {signed.detached_path.name})"
        )
        out_console.print(f"logical sha256 {signed.logical_sha256}")
    exit_with(EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add ``sign`` to the app."""
    app.command(
        "sign",
        epilog=example(
            "dspark-calibrate sign fit/calibration.parquet --key keys/signing-key.pem --version 1"
        ),
    )(sign)
