"""Signing keys: generate, load and identify them, on securesystemslib's Signer/Key API.

Local keys are PKCS#8 PEM files (Ed25519 by default, ECDSA P-256 accepted, DESIGN §4); a private
key file is written 0600 and refused when group or world can read it. External signers (cloud KMS,
PKCS#11 HSM, ...) come in through securesystemslib's private-key URIs, so the rest of the package
only ever sees a ``Signer`` and a ``Key``.

Key ids are securesystemslib's TUF-style ids (SHA-256 of the canonical public key). They are
*hints* for finding a key, never a reason to trust one: trust comes from the key being listed in
the trust root, and uniqueness is judged on the public key value (:func:`key_identity`).

File I/O happens only in :func:`generate_keypair`, :func:`load_signer`, :func:`load_public_key`
and :func:`signer_from_uri`; the helpers below them are pure. Messages never contain key material.
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args
from urllib.parse import urlparse

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    KeySerializationEncryption,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)
from securesystemslib.exceptions import UnsupportedLibraryError, UnverifiedSignatureError
from securesystemslib.signer import (
    CryptoSigner,
    Key,
    SecretsHandler,
    Signature,
    Signer,
    SSlibKey,
)

from dspark_calibrate.artifacts._atomic import atomic_write_bytes, make_private_dirs
from dspark_calibrate.errors import ConfigError, InvalidValueError

__all__ = [
    "MAX_KEY_FILE_BYTES",
    "SUPPORTED_SCHEMES",
    "KeyAlgorithm",
    "KeyPair",
    "SignatureTally",
    "check_supported_key",
    "generate_keypair",
    "key_identity",
    "load_public_key",
    "load_signer",
    "public_key_of",
    "signer_from_uri",
    "tally_signatures",
]

KeyAlgorithm = Literal["ed25519", "ecdsa-p256"]

#: (keytype, scheme) pairs accepted in a trust root and for signing (DESIGN §4: Ed25519 default,
#: ECDSA P-256 accepted). Anything else (RSA, other curves, the deprecated ECDSA keytype spelling)
#: is refused, so a verifier never meets an algorithm nobody reviewed for this project.
SUPPORTED_SCHEMES: frozenset[tuple[str, str]] = frozenset(
    {("ed25519", "ed25519"), ("ecdsa", "ecdsa-sha2-nistp256")}
)

#: Largest key file read, in bytes. A PEM key of a supported type is under 1 KiB; the cap keeps a
#: wrong path (a dataset, a device) from being read into memory.
MAX_KEY_FILE_BYTES = 64 * 1024

# Base names accepted for generated key files: no separators, no leading dot, no surprises in a
# shell. The private key is "<name>.pem" and the public key "<name>.pub.pem".
_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

# Private-key URI schemes served here rather than by securesystemslib, so that local key files get
# the permission check and passphrase support of load_signer(). "file2" is securesystemslib's own
# scheme for PKCS#8 files; "file" is accepted as its plain spelling.
_LOCAL_URI_SCHEMES = frozenset({"file", "file2"})
_CRYPTO_SIGNER_PREFIX_ENV = "CRYPTO_SIGNER_PATH_PREFIX"


@dataclass(frozen=True, slots=True)
class KeyPair:
    """What :func:`generate_keypair` wrote.

    Attributes:
        private_path: the PKCS#8 PEM private key (mode 0600).
        public_path: the SubjectPublicKeyInfo PEM public key (mode 0644).
        keyid: securesystemslib's key id of the public key (a hint, never trust).
        algorithm: the key algorithm.
    """

    private_path: Path
    public_path: Path
    keyid: str
    algorithm: KeyAlgorithm


@dataclass(frozen=True, slots=True)
class SignatureTally:
    """Outcome of checking signatures against a set of trusted keys (see :func:`tally_signatures`).

    Attributes:
        accepted_keyids: one keyid per distinct trusted public key with a valid signature, sorted.
        invalid_keyids: keyids of trusted keys whose signature did not verify, sorted, unique.
        unknown_keyids: keyids not among the trusted keys (ignored), sorted, unique.
    """

    accepted_keyids: tuple[str, ...]
    invalid_keyids: tuple[str, ...]
    unknown_keyids: tuple[str, ...]


# --------------------------------------------------------------------------------------------
# pure helpers
# --------------------------------------------------------------------------------------------


def check_supported_key(key: Key) -> None:
    """Refuse a public key whose type or scheme this project does not accept.

    Raises:
        InvalidValueError: the key is not an :class:`SSlibKey` of a supported (keytype, scheme), or its
            value cannot be decoded. The message names the keyid and the scheme, never the value.
    """
    if not isinstance(key, SSlibKey):
        raise InvalidValueError(
            f"key {key.keyid}: type {type(key).__name__} is not supported (need a plain public key)"
        )
    if (key.keytype, key.scheme) not in SUPPORTED_SCHEMES:
        allowed = ", ".join(f"{t}/{s}" for t, s in sorted(SUPPORTED_SCHEMES))
        raise InvalidValueError(
            f"key {key.keyid}: {key.keytype}/{key.scheme} is not supported; use one of {allowed}"
        )
    key_identity(key)


def _crypto_public_key(key: Key) -> PublicKeyTypes:
    """Decode the public key value of an SSlibKey of a supported scheme with pyca/cryptography."""
    public = key.keyval.get("public") if isinstance(key.keyval, Mapping) else None
    if not isinstance(public, str):
        raise InvalidValueError(f"key {key.keyid}: keyval.public must be a string")
    if key.keytype not in ("ed25519", "ecdsa"):
        raise InvalidValueError(f"key {key.keyid}: keytype {key.keytype!r} is not supported")
    loaded: PublicKeyTypes
    try:
        if key.keytype == "ed25519":
            loaded = ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(public))
        else:
            loaded = load_pem_public_key(public.encode("ascii"))
    except (ValueError, UnicodeEncodeError, UnsupportedAlgorithm) as exc:
        raise InvalidValueError(
            f"key {key.keyid}: keyval.public does not decode as an {key.keytype} key"
        ) from exc
    if key.keytype == "ecdsa" and not (
        isinstance(loaded, ec.EllipticCurvePublicKey) and isinstance(loaded.curve, ec.SECP256R1)
    ):
        # The scheme fixes the curve; a key of another curve or type under it is refused.
        raise InvalidValueError(f"key {key.keyid}: keyval.public is not a P-256 public key")
    return loaded


def key_identity(key: Key) -> bytes:
    """The public key value itself, normalised: DER SubjectPublicKeyInfo bytes.

    Two keyids that name the same key material (hex in upper or lower case, PEM with different line
    breaks, a forged keyid) have the same identity, so a threshold counts them once. The scheme is
    deliberately not part of the identity: one key holder is one vote.

    Raises:
        InvalidValueError: the key is not of a supported type or its value does not decode.
    """
    public = key.keyval.get("public") if isinstance(key.keyval, Mapping) else None
    if isinstance(public, str):
        # Decoding and re-encoding a key costs tens of microseconds per verification; the result
        # depends only on (keytype, value), so it is memoised on exactly that.
        return _identity_of(key.keytype, public, key.keyid)
    return _crypto_public_key(key).public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)


@functools.lru_cache(maxsize=256)
def _identity_of(keytype: str, public: str, keyid: str) -> bytes:
    probe = SSlibKey(
        keyid, keytype, "ed25519" if keytype == "ed25519" else "ecdsa-sha2-nistp256", {"public": public}
    )
    return _crypto_public_key(probe).public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)


def tally_signatures(
    message: bytes, signatures: Iterable[tuple[str, bytes]], keys: Mapping[str, Key]
) -> SignatureTally:
    """Verify ``(keyid, signature)`` pairs over ``message`` against trusted ``keys``.

    Keyids only select which trusted key to try (a hint, as DSSE and TUF both say). Every
    signature whose keyid names a trusted key is verified, so the outcome does not depend on the
    order of the signatures. Valid signatures are counted per distinct public key value: a keyid
    repeated, or two keyids for the same key, count once. Never raises on a bad signature or a
    malformed trusted key (that key simply never verifies).

    Args:
        message: the exact signed bytes (e.g. the DSSE PAE).
        signatures: ``(keyid, raw signature bytes)`` pairs, as found.
        keys: keyid -> trusted public key.

    Returns:
        The accepted, invalid and unknown keyids.
    """
    accepted: dict[bytes, str] = {}  # identity -> the smallest keyid that proved it
    invalid: set[str] = set()
    unknown: set[str] = set()
    for keyid, sig in signatures:
        key = keys.get(keyid)
        if key is None:
            unknown.add(keyid)
            continue
        try:
            identity = key_identity(key)
        except ValueError:
            # A trusted entry that does not decode can never verify anything.
            invalid.add(keyid)
            continue
        if not _signature_valid(key, sig, message):
            invalid.add(keyid)
            continue
        previous = accepted.get(identity)
        accepted[identity] = keyid if previous is None else min(previous, keyid)
    return SignatureTally(
        accepted_keyids=tuple(sorted(accepted.values())),
        invalid_keyids=tuple(sorted(invalid)),
        unknown_keyids=tuple(sorted(unknown)),
    )


def _signature_valid(key: Key, sig: bytes, message: bytes) -> bool:
    """Whether ``sig`` is ``key``'s signature over ``message``; never raises.

    An Ed25519 key (``ed25519``/``ed25519``, the default) is verified here with pyca/cryptography,
    exactly as securesystemslib's ``SSlibKey`` verifies it (``Ed25519PublicKey`` from
    ``bytes.fromhex(keyval.public)``, then ``verify(sig, message)``; any failure is a bad
    signature), reusing the decoded public key object, which is memoised on the exact key value
    string: every admission verifies four envelopes with the same root keys. Any other key goes
    through securesystemslib.
    """
    public = key.keyval.get("public") if isinstance(key.keyval, Mapping) else None
    if (
        type(key) is SSlibKey
        and key.keytype == "ed25519"
        and key.scheme == "ed25519"
        and isinstance(public, str)
    ):
        try:
            _ed25519_public(public).verify(sig, message)
        except (InvalidSignature, ValueError, TypeError, UnsupportedAlgorithm):  # bad signature or key
            return False
        return True
    try:
        # securesystemslib wraps every failure of the underlying library (bad encoding, wrong
        # curve, InvalidSignature) in UnverifiedSignatureError or its subclass
        # VerificationError, so nothing from pyca/cryptography escapes here.
        # The keyid already did its only job (choosing the key); label the signature with the
        # key's own keyid, which securesystemslib requires to match.
        key.verify_signature(Signature(key.keyid, sig.hex()), message)
    except UnverifiedSignatureError:
        return False
    return True


@functools.lru_cache(maxsize=256)
def _ed25519_public(public: str) -> ed25519.Ed25519PublicKey:
    """The Ed25519 public key whose ``keyval.public`` (hex) is exactly ``public``.

    Raises:
        ValueError: not hex, or not 32 bytes (not cached: it is raised again on every call).
    """
    return ed25519.Ed25519PublicKey.from_public_bytes(bytes.fromhex(public))


def public_key_of(signer: Signer) -> Key:
    """The public key a signer signs for (its ``keyid`` is what lands in envelopes).

    Raises:
        ConfigError: the signer's key type or scheme is not supported here.
    """
    key = signer.public_key
    try:
        check_supported_key(key)
    except ValueError as exc:
        raise ConfigError(f"signer: {exc}") from exc
    return key


# --------------------------------------------------------------------------------------------
# files
# --------------------------------------------------------------------------------------------


def _generate_private(algorithm: KeyAlgorithm) -> ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey:
    if algorithm == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    if algorithm == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    raise ConfigError(
        f"--algorithm {algorithm!r} is not supported; use one of {', '.join(get_args(KeyAlgorithm))}"
    )


def generate_keypair(
    out_dir: Path,
    *,
    algorithm: KeyAlgorithm = "ed25519",
    passphrase: bytes | None = None,
    name: str = "signing-key",
) -> KeyPair:
    """Generate a key pair and write ``out_dir/{name}.pem`` (0600) and ``out_dir/{name}.pub.pem``.

    The private key is PKCS#8 PEM, encrypted with ``passphrase`` when one is given (the library's
    best available encryption). Neither file may exist: an existing key is never overwritten,
    not even by a concurrent ``keygen`` (the files are published with a no-clobber link). The
    directory is created 0700 when missing.

    Args:
        out_dir: directory for the two files.
        algorithm: ``"ed25519"`` (default) or ``"ecdsa-p256"``.
        passphrase: optional non-empty passphrase for the private key file.
        name: base name of the files.

    Returns:
        The paths, the keyid and the algorithm.

    Raises:
        ConfigError: bad name, algorithm or passphrase; a file already exists; the directory
            cannot be created or written.
    """
    out_dir = Path(out_dir)
    if not _KEY_NAME.match(name):
        raise ConfigError(
            f"key name {name!r} is not usable as a file name; use letters, digits, '.', '_' or '-'"
        )
    if passphrase is not None and (not isinstance(passphrase, bytes) or not passphrase):
        raise ConfigError("the key passphrase must be non-empty bytes; omit it for an unencrypted key")
    private_path = out_dir / f"{name}.pem"
    public_path = out_dir / f"{name}.pub.pem"
    for existing in (private_path, public_path):
        if existing.exists() or existing.is_symlink():
            raise ConfigError(
                f"{existing}: already exists; refusing to overwrite a key (choose another --out or --name)"
            )

    private_key = _generate_private(algorithm)
    encryption: KeySerializationEncryption = (
        BestAvailableEncryption(passphrase) if passphrase is not None else NoEncryption()
    )
    private_pem = private_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, encryption)
    public_pem = private_key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    # The library computes the keyid; the signer constructor cross-checks the pair.
    signer = CryptoSigner(private_key, SSlibKey.from_crypto(private_key.public_key()))

    try:
        make_private_dirs(out_dir)
    except OSError as exc:
        raise ConfigError(
            f"{out_dir}: cannot create the key directory ({exc.strerror}); check the path"
        ) from exc
    written: list[Path] = []
    try:
        for path, data, mode in ((private_path, private_pem, 0o600), (public_path, public_pem, 0o644)):
            try:
                atomic_write_bytes(path, data, mode=mode, overwrite=False)
            except FileExistsError as exc:
                raise ConfigError(
                    f"{path}: already exists; refusing to overwrite a key (choose another --out or --name)"
                ) from exc
            except OSError as exc:
                raise ConfigError(f"{path}: cannot write ({exc.strerror}); check the directory") from exc
            written.append(path)
    finally:
        if len(written) != 2:
            # Never leave half a pair behind: a private key without its public half invites a
            # second keygen into a confusing state. We only remove files this call created.
            for path in written:
                path.unlink(missing_ok=True)
    return KeyPair(
        private_path=private_path, public_path=public_path, keyid=signer.public_key.keyid, algorithm=algorithm
    )


def _read_key_file(path: Path, *, private: bool) -> bytes:
    """Read a key file, refusing a group/world-readable private key before reading any byte.

    The mode is taken with fstat on the opened descriptor, so the file checked is the file read
    (no window for swapping it between a stat and an open). Opened non-blocking, so a FIFO at the
    path is refused rather than waited on (as ``read_regular_file`` does for every other file).
    """
    what = "private key" if private else "public key"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: {what} file not found; check the path") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot open the {what} file ({exc.strerror})") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: the {what} is not a regular file")
        if private and st.st_mode & 0o077:
            # Already readable by others, so looking at its first line reveals nothing new: a
            # public key given where a private one belongs deserves that answer, not a chmod.
            with os.fdopen(os.dup(fd), "rb") as handle:
                head = handle.read(64)
            if head.lstrip().startswith(b"-----BEGIN PUBLIC KEY-----"):
                raise ConfigError(
                    f"{path}: is a public key, but a private signing key is needed here; pass the "
                    "private key (signing-key.pem, not .pub.pem); public keys go to --artifact-key, "
                    "--add-root-key or dspark-verify --key"
                )
            raise ConfigError(
                f"{path}: private key is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); "
                f"restrict it with `chmod 600 {path}`"
            )
        if st.st_size > MAX_KEY_FILE_BYTES:
            raise ConfigError(
                f"{path}: {st.st_size} bytes is too large for a {what} "
                f"(limit {MAX_KEY_FILE_BYTES}); check the path"
            )
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what} file ({exc.strerror})") from exc
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise ConfigError(
            f"{path}: too large for a {what} (limit {MAX_KEY_FILE_BYTES} bytes); check the path"
        )
    return data


def _check_private_type(path: Path, key: PrivateKeyTypes) -> None:
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return
    if isinstance(key, ec.EllipticCurvePrivateKey) and isinstance(key.curve, ec.SECP256R1):
        return
    raise ConfigError(
        f"{path}: {type(key).__name__} keys are not supported; generate an Ed25519 or ECDSA P-256 key with "
        "`dspark-calibrate keygen`"
    )


_ENCRYPTED_PEM_HEADER = b"-----BEGIN ENCRYPTED PRIVATE KEY-----"


def _load_private_key(
    path: Path, passphrase: bytes | None, *, ask: SecretsHandler | None = None
) -> PrivateKeyTypes:
    """Read and decode a private key file (permission check first).

    ``ask`` is consulted for the passphrase only when none was given and the file is encrypted.
    """
    data = _read_key_file(path, private=True)
    if passphrase is None and ask is not None and data.lstrip().startswith(_ENCRYPTED_PEM_HEADER):
        passphrase = ask("passphrase").encode("utf-8")
    try:
        key = load_pem_private_key(data, password=passphrase)
    except TypeError as exc:
        # pyca/cryptography raises TypeError for a passphrase mismatch in either direction.
        if passphrase is None:
            raise ConfigError(f"{path}: the private key is encrypted; pass its passphrase") from exc
        raise ConfigError(f"{path}: the private key is not encrypted; do not pass a passphrase") from exc
    except ValueError as exc:
        # Wrong passphrase and malformed PEM are both ValueError; the message stays generic so
        # that nothing about the key's bytes is echoed.
        hint = (
            "wrong passphrase or not a PKCS#8 PEM private key"
            if passphrase
            else "not a PKCS#8 PEM private key"
        )
        raise ConfigError(f"{path}: cannot load the private key ({hint})") from exc
    except UnsupportedAlgorithm as exc:
        raise ConfigError(f"{path}: the private key uses an unsupported algorithm or encryption") from exc
    _check_private_type(path, key)
    return key


def load_signer(path: Path, *, passphrase: bytes | None = None, ask: SecretsHandler | None = None) -> Signer:
    """Load a local private key file as a securesystemslib ``Signer``.

    Args:
        path: a PKCS#8 PEM private key written by :func:`generate_keypair` (or compatible).
        passphrase: the passphrase, when the file is encrypted.
        ask: without ``passphrase``, called as ``ask("passphrase")`` only when the file is
            encrypted (so one handler serves plain and encrypted keys alike).

    Returns:
        A ``CryptoSigner`` whose ``public_key.keyid`` is securesystemslib's default keyid.

    Raises:
        ConfigError: the file is missing, unreadable, group/world readable (the message gives the
            ``chmod`` fix), not a supported key, encrypted without a passphrase, or the passphrase
            is wrong.
    """
    path = Path(path)
    private_key = _load_private_key(path, passphrase, ask=ask)
    return CryptoSigner(private_key, SSlibKey.from_crypto(private_key.public_key()))


def load_public_key(path: Path) -> Key:
    """Load a PEM public key (SubjectPublicKeyInfo) as an ``SSlibKey`` with the library's keyid.

    Raises:
        ConfigError: the file is missing, unreadable, not a PEM public key, or of an unsupported
            type.
    """
    path = Path(path)
    data = _read_key_file(path, private=False)
    try:
        public = load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise ConfigError(f"{path}: not a PEM public key; pass the .pub.pem file written by keygen") from exc
    try:
        key = SSlibKey.from_crypto(public)
        check_supported_key(key)
    except ValueError as exc:
        raise ConfigError(
            f"{path}: unsupported public key ({exc}); use an Ed25519 or ECDSA P-256 key"
        ) from exc
    return key


def signer_from_uri(uri: str, public_key: Key, *, secrets_handler: SecretsHandler | None = None) -> Signer:
    """A signer for a private-key URI: a local file, a cloud KMS key, an HSM, ...

    ``file:<path>`` and ``file2:<path>`` load a local PKCS#8 file through the same checks as
    :func:`load_signer` (mode 0600 required; ``CRYPTO_SIGNER_PATH_PREFIX`` is honoured for
    ``file2:`` like securesystemslib does); a passphrase, if the file is encrypted, is asked from
    ``secrets_handler("passphrase")``. Every other scheme (``gcpkms:``, ``awskms:``, ``azurekms:``,
    ``hsm:``, ``hv:``, ...) goes to ``Signer.from_priv_key_uri``; those need their optional client
    libraries installed.

    Args:
        uri: the private key URI.
        public_key: the public key the signer must sign for (its keyid is used in signatures).
        secrets_handler: called with a secret's name (``"passphrase"``, ``"pin"``) when needed.

    Raises:
        ConfigError: unsupported scheme or key type, unreadable key, missing client library, or a
            private key that does not match ``public_key``.
    """
    try:
        check_supported_key(public_key)
    except ValueError as exc:
        raise ConfigError(f"{uri}: {exc}") from exc
    scheme = uri.partition(":")[0]
    if scheme in _LOCAL_URI_SCHEMES:
        if not isinstance(public_key, SSlibKey):  # guaranteed by check_supported_key; narrows the type
            raise ConfigError(f"{uri}: a local key needs a plain public key")
        raw_path = urlparse(uri).path
        prefix = os.environ.get(_CRYPTO_SIGNER_PREFIX_ENV) if scheme == "file2" else None
        path = Path(prefix, raw_path) if prefix else Path(raw_path)
        private_key = _load_private_key(path, None, ask=secrets_handler)
        # Compare key values, not keyids: the caller's keyid may be any label.
        actual = private_key.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
        if actual != key_identity(public_key):
            raise ConfigError(
                f"{path}: the private key does not match the given public key {public_key.keyid}"
            )
        return CryptoSigner(private_key, public_key)
    try:
        return Signer.from_priv_key_uri(uri, public_key, secrets_handler)
    except UnsupportedLibraryError as exc:
        raise ConfigError(f"{uri}: this signer needs an optional client library ({exc})") from exc
    except (ValueError, OSError) as exc:
        # ValueError covers an unknown scheme and securesystemslib's KeyMismatchError.
        raise ConfigError(f"{uri}: cannot create a signer ({type(exc).__name__}: {exc})") from exc
