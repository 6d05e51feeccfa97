"""``dspark-calibrate trust init|rotate|show``: manage the TUF-style trust root."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dspark_calibrate.cli._common import (
    EXIT_OK,
    EXIT_REJECTED,
    EXIT_USAGE,
    JsonFlag,
    example,
    exit_with,
    fail,
    fail_error,
    fail_usage,
    make_app,
    out_console,
    parse_expiry,
    print_json,
    utcnow,
)
from dspark_calibrate.cli._numeric import check_expires
from dspark_calibrate.errors import ConfigError, DsparkError

if TYPE_CHECKING:
    from dspark_calibrate.artifacts import TrustRoot

__all__ = [
    "KeyOption",
    "PassEnv",
    "SignerPublicKeyOption",
    "SignerUriOption",
    "load_root_or_exit",
    "register",
    "signers_from_keys",
]

trust_app = make_app(None, "Create, rotate and inspect the trust root.")

KeyOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--key",
        help="Private key file of a signer (repeat for several; see --signer-uri for KMS/HSM keys).",
        metavar="KEY.pem",
        show_default=False,
    ),
]
PassEnv = Annotated[
    list[str] | None,
    typer.Option(
        "--passphrase-env",
        help="Environment variable holding a key's passphrase: VAR for every encrypted key, or "
        "KEY.pem=VAR for one key (repeatable); plain keys need none.",
        metavar="[KEY.pem=]VAR",
        show_default=False,
    ),
]
SignerUriOption = Annotated[
    list[str] | None,
    typer.Option(
        "--signer-uri",
        help="An external signer as a securesystemslib private-key URI (gcpkms:..., awskms:..., "
        "azurekms:..., hsm:, file:PATH); repeatable, each paired in order with a --signer-public-key.",
        metavar="URI",
        show_default=False,
    ),
]
SignerPublicKeyOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--signer-public-key",
        help="The public key (PEM) of the --signer-uri at the same position.",
        metavar="PUB.pem",
        show_default=False,
    ),
]


def _passphrases(specs: list[str] | None) -> tuple[str | None, dict[Path, str]]:
    """``--passphrase-env`` values as (the variable for every key, per-key variables)."""
    common: str | None = None
    per_key: dict[Path, str] = {}
    for spec in specs or []:
        key, sep, var = spec.rpartition("=")
        if not sep:
            if common is not None:
                raise ConfigError(
                    f"--passphrase-env {spec}: a variable for every key is given twice "
                    f"({common}, {spec}); name one key each as KEY.pem=VAR"
                )
            common = spec
        elif not key or not var:
            raise ConfigError(f"--passphrase-env {spec!r} must look like VAR or KEY.pem=VAR")
        else:
            per_key[Path(key).resolve()] = var
    return common, per_key


def _refuse_empty_key(path: Path) -> None:
    """An empty key file holds no secret: say so, before the key reader complains of its mode."""
    try:
        empty = path.is_file() and path.stat().st_size == 0
    except OSError:
        return  # the key reader names what is wrong with the path
    if empty:
        raise ConfigError(
            f"--key {path}: the file is empty; pass the private key that `dspark-calibrate keygen` "
            "wrote (signing-key.pem)"
        )


def _env_secret(var: str, what: str) -> str:
    value = os.environ.get(var)
    if not value:
        raise ConfigError(f"--passphrase-env {var}: the variable is unset or empty; export it for {what}")
    return value


def signers_from_keys(
    paths: list[Path] | None,
    passphrase_env: list[str] | None = None,
    *,
    signer_uris: list[str] | None = None,
    signer_public_keys: list[Path] | None = None,
) -> list[Any]:
    """Load signers from private key files and external signer URIs (KMS, HSM, ...).

    A passphrase is read only for an encrypted key file, from its own ``KEY.pem=VAR`` or else the
    common ``VAR``, so keys with and without passphrases can sign together (``trust rotate`` from
    a plain to an encrypted key).

    Raises:
        ConfigError: no key, a key file missing or too permissive, a passphrase missing or wrong,
            URIs and public keys not paired, or a signer URI that cannot be used.
    """
    from dspark_calibrate.artifacts import load_public_key, load_signer, signer_from_uri

    uris, pubs = list(signer_uris or []), list(signer_public_keys or [])
    if len(uris) != len(pubs):
        raise ConfigError(
            f"{len(uris)} --signer-uri but {len(pubs)} --signer-public-key; give one public key per URI, "
            "in the same order"
        )
    if not paths and not uris:
        raise ConfigError(
            "no signing key given; pass --key KEY.pem (or --signer-uri URI --signer-public-key PUB.pem)"
        )
    common, per_key = _passphrases(passphrase_env)
    signers = []
    for path in paths or []:
        _refuse_empty_key(path)
        var = per_key.pop(path.resolve(), common)

        def ask(_secret: str, var: str | None = var, path: Path = path) -> str:
            if var is None:
                raise ConfigError(
                    f"{path}: the private key is encrypted; pass --passphrase-env VAR "
                    f"(or --passphrase-env {path}=VAR for this key only)"
                )
            return _env_secret(var, str(path))

        signers.append(load_signer(path, ask=ask))
    if per_key:
        stray = ", ".join(sorted(str(p) for p in per_key))
        raise ConfigError(f"--passphrase-env names {stray}, which is not a --key; check the paths")
    for uri, pub in zip(uris, pubs, strict=True):

        def ask_uri(secret: str, uri: str = uri) -> str:
            if common is None:
                raise ConfigError(f"{uri}: the signer needs a {secret}; pass --passphrase-env VAR")
            return _env_secret(common, uri)

        signers.append(signer_from_uri(uri, load_public_key(pub), secrets_handler=ask_uri))
    return signers


#: Bytes read from the start of a file to tell a key or a Parquet file from a trust root.
_HEAD_BYTES = 64


def _file_head(path: Path) -> bytes:
    """The first bytes of a regular file (empty for anything else: a FIFO is never opened)."""
    try:
        if not path.is_file():
            return b""
        with path.open("rb") as handle:
            return handle.read(_HEAD_BYTES)
    except OSError:
        return b""


def not_a_trust_root(path: Path) -> str | None:
    """Why ``path`` is recognisably something other than a trust root (a PEM key, a Parquet
    file), with the option to use instead; None when it may be one."""
    head = _file_head(path)
    if head.startswith(b"-----BEGIN PUBLIC KEY"):
        return (
            f"--trust-root {path}: a PEM public key, not a trust root (root.json); give the root.json "
            f"that `dspark-calibrate trust init` wrote, or verify against this one key with "
            f"`dspark-verify --key {path}`"
        )
    if head.startswith(b"-----BEGIN") and b"PRIVATE KEY" in head:
        return (
            f"--trust-root {path}: a private key, not a trust root (root.json); give the root.json "
            "that `dspark-calibrate trust init` wrote (a private key belongs only to build and sign)"
        )
    if head.startswith(b"PAR1"):
        return (
            f"--trust-root {path}: a Parquet file, not a trust root (root.json); give the artifact as "
            "the PATH argument and the root.json that `dspark-calibrate trust init` wrote as --trust-root"
        )
    return None


def load_root_or_exit(path: Path) -> TrustRoot:
    """Read and verify a trust root; exit 2 if unreadable or not a trust root at all (a key, a
    Parquet file), 1 if invalid or expired."""
    from dspark_calibrate.artifacts import TrustRootError, TrustRootUnreadable, read_trust_root

    wrong = not_a_trust_root(path)
    if wrong is not None:
        fail(wrong, code="NOT_A_TRUST_ROOT")
    try:
        return read_trust_root(path, now=utcnow())
    except TrustRootUnreadable as exc:
        fail_usage(str(exc))
    except TrustRootError as exc:
        fail(str(exc), code=exc.reason.value, label=exc.reason.value, exit_code=EXIT_REJECTED)


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
    # Plain lines, not a table: digests and keyids stay whole and copyable at any width.
    out_console.print(f"trust root {path}")
    for key, value in info.items():
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            out_console.print(f"  {key if i == 0 else '':<19}{item}")


@trust_app.command(
    "init",
    epilog=example(
        "dspark-calibrate trust init --key keys/signing-key.pem --out root.json",
        "dspark-calibrate trust init --key a.pem --key b.pem --threshold 2 --out root.json",
        "dspark-calibrate trust init --signer-uri gcpkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/"
        "cryptoKeyVersions/1 --signer-public-key kms.pub.pem --out root.json",
    ),
)
def init(
    out: Annotated[Path, typer.Option("--out", help="Where to write root.json.", metavar="ROOT.json")],
    key: KeyOption = None,
    expires: Annotated[
        str,
        typer.Option("--expires", help="Root expiry: a duration (365d) or ISO time.", callback=check_expires),
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
    signer_uri: SignerUriOption = None,
    signer_public_key: SignerPublicKeyOption = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing root file.")] = False,
    json_out: JsonFlag = False,
) -> None:
    """Create a version-1 trust root signed by the given root keys."""
    from dspark_calibrate.artifacts import init_root, public_key_of

    if out.exists() and not force:
        fail_usage(f"{out} exists; pass --force to replace it (rotation is `trust rotate`)")
    try:
        now = utcnow()
        signers = signers_from_keys(
            key, passphrase_env, signer_uris=signer_uri, signer_public_keys=signer_public_key
        )
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
        fail_error(exc)
    _describe(root, out, json_out)
    exit_with(EXIT_OK)


@trust_app.command(
    "rotate",
    epilog=example(
        "dspark-calibrate trust rotate --root root.json --key old.pem --key new.pem \\",
        "    --passphrase-env new.pem=NEW_PASS --add-root-key new.pub.pem --remove-root-key OLD_KEYID \\",
        "    --add-artifact-key new.pub.pem --out root.v2.json",
    ),
)
def rotate(
    root_path: Annotated[Path, typer.Option("--root", help="The current root.json.", metavar="ROOT.json")],
    out: Annotated[
        Path, typer.Option("--out", help="Where to write the new root (version + 1).", metavar="ROOT.json")
    ],
    key: KeyOption = None,
    expires: Annotated[
        str, typer.Option("--expires", help="New expiry: duration or ISO time.", callback=check_expires)
    ] = "365d",
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
    signer_uri: SignerUriOption = None,
    signer_public_key: SignerPublicKeyOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite an existing --out file (the current root included).")
    ] = False,
    json_out: JsonFlag = False,
) -> None:
    """Rotate the root: version + 1, signed by the thresholds of both the old and the new root.

    Give every signing key of both thresholds with --key (or --signer-uri); each encrypted key
    takes its own passphrase (--passphrase-env KEY.pem=VAR).
    """
    from dspark_calibrate.artifacts import rotate_root

    if out.exists() and not force:
        same = out.resolve() == root_path.resolve()
        fail_usage(
            f"--out {out} exists"
            + (" and is the current root (--root): rotating would replace it" if same else "")
            + "; write the new root to another file (e.g. root.v2.json) or pass --force to replace it"
        )
    old = load_root_or_exit(root_path)
    try:
        now = utcnow()
        new = rotate_root(
            old,
            signers=signers_from_keys(
                key, passphrase_env, signer_uris=signer_uri, signer_public_keys=signer_public_key
            ),
            add_root_keys=_public_keys(add_root_key or []),
            remove_root_keyids=remove_root_key or [],
            root_threshold=root_threshold,
            add_artifact_keys=_public_keys(add_artifact_key or []),
            remove_artifact_keyids=remove_artifact_key or [],
            artifact_threshold=artifact_threshold,
            expires=parse_expiry(expires, now=now),
        )
        _write_root(new, out)
    except DsparkError as exc:
        # The current root verified above: what fails now is the rotation asked for (a threshold
        # above the keys, too few signing keys), a usage error.
        fail(str(exc), code=exc.code, label="error" if getattr(exc, "reason", None) is None else exc.code)
    except OSError as exc:
        fail_error(exc, exit_code=EXIT_USAGE)
    _describe(new, out, json_out)
    exit_with(EXIT_OK)


@trust_app.command("show", epilog=example("dspark-calibrate trust show root.json --json"))
def show(
    root_path: Annotated[
        Path,
        typer.Argument(help="root.json to show (verified first).", metavar="ROOT.json", show_default=False),
    ],
    json_out: JsonFlag = False,
) -> None:
    """Verify and describe a trust root."""
    root = load_root_or_exit(root_path)
    _describe(root, root_path, json_out)
    exit_with(EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add the ``trust`` group to the app."""
    app.add_typer(trust_app, name="trust")
