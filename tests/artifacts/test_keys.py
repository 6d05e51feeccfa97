"""Tests of key generation, loading, permission refusal, URIs, key identity and signature tallies."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from securesystemslib.exceptions import UnverifiedSignatureError
from securesystemslib.signer import CryptoSigner, Signature, SSlibKey

from dspark_calibrate.artifacts import _atomic, _keys
from dspark_calibrate.artifacts._keys import (
    KeyPair,
    check_supported_key,
    generate_keypair,
    key_identity,
    load_public_key,
    load_signer,
    public_key_of,
    signer_from_uri,
    tally_signatures,
)
from dspark_calibrate.errors import ConfigError, DsparkError

ALGORITHMS = ["ed25519", "ecdsa-p256"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _write_private(path: Path, key: object, mode: int = 0o600) -> Path:
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())  # type: ignore[attr-defined]  # any pyca private key
    path.write_bytes(pem)
    path.chmod(mode)
    return path


# ---------------------------------------------------------------------------------------------
# generation and loading
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_generate_writes_private_0600_and_public_0644(tmp_path: Path, algorithm: str) -> None:
    pair = generate_keypair(tmp_path, algorithm=algorithm)  # type: ignore[arg-type]  # parametrized literal
    assert isinstance(pair, KeyPair)
    assert pair.private_path == tmp_path / "signing-key.pem"
    assert pair.public_path == tmp_path / "signing-key.pub.pem"
    assert pair.algorithm == algorithm
    assert _mode(pair.private_path) == 0o600
    assert _mode(pair.public_path) == 0o644
    assert pair.private_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert pair.public_path.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_keyids_agree_and_signatures_verify(tmp_path: Path, algorithm: str) -> None:
    pair = generate_keypair(tmp_path, algorithm=algorithm)  # type: ignore[arg-type]  # parametrized literal
    signer = load_signer(pair.private_path)
    public = load_public_key(pair.public_path)
    assert signer.public_key.keyid == public.keyid == pair.keyid
    assert public_key_of(signer) == public
    assert len(pair.keyid) == 64
    expected_type = {"ed25519": ("ed25519", "ed25519"), "ecdsa-p256": ("ecdsa", "ecdsa-sha2-nistp256")}
    assert (public.keytype, public.scheme) == expected_type[algorithm]
    sig = signer.sign(b"message")
    public.verify_signature(sig, b"message")


def test_custom_name_and_directory_created_0700(tmp_path: Path) -> None:
    out = tmp_path / "new" / "keys"
    pair = generate_keypair(out, name="root-1")
    assert pair.private_path == out / "root-1.pem"
    assert _mode(out) == 0o700


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_passphrase_round_trip(tmp_path: Path, algorithm: str) -> None:
    pair = generate_keypair(tmp_path, algorithm=algorithm, passphrase=b"correct horse")  # type: ignore[arg-type]  # parametrized literal
    assert pair.private_path.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    signer = load_signer(pair.private_path, passphrase=b"correct horse")
    assert signer.public_key.keyid == pair.keyid


@pytest.mark.parametrize(
    ("encrypted", "given", "needle"),
    [
        (True, None, "is encrypted; pass its passphrase"),
        (True, b"wrong", "wrong passphrase"),
        (False, b"unneeded", "not encrypted"),
    ],
    ids=["missing-passphrase", "wrong-passphrase", "passphrase-for-plain-key"],
)
def test_passphrase_mismatch_is_config_error(
    tmp_path: Path, encrypted: bool, given: bytes | None, needle: str
) -> None:
    pair = generate_keypair(tmp_path, passphrase=b"right" if encrypted else None)
    with pytest.raises(ConfigError, match=needle) as info:
        load_signer(pair.private_path, passphrase=given)
    assert str(pair.private_path) in str(info.value)
    _assert_no_key_material(str(info.value), pair.private_path)


def _assert_no_key_material(message: str, *paths: Path) -> None:
    for path in paths:
        for line in path.read_text().splitlines():
            if not line.startswith("-----"):
                assert line[:24] not in message


@pytest.mark.parametrize("passphrase", [b"", "text"], ids=["empty", "str"])
def test_bad_passphrase_argument(tmp_path: Path, passphrase: object) -> None:
    with pytest.raises(ConfigError, match="passphrase"):
        generate_keypair(tmp_path, passphrase=passphrase)  # type: ignore[arg-type]  # wrong type is the test
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["", "../escape", "a/b", ".hidden", "sp ace", "x" * 200])
def test_bad_key_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match="file name"):
        generate_keypair(tmp_path, name=name)


def test_bad_algorithm(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not supported"):
        generate_keypair(tmp_path, algorithm="rsa")  # type: ignore[arg-type]  # wrong literal is the test


@pytest.mark.parametrize("existing", ["signing-key.pem", "signing-key.pub.pem"])
def test_refuses_to_overwrite(tmp_path: Path, existing: str) -> None:
    (tmp_path / existing).write_bytes(b"precious")
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        generate_keypair(tmp_path)
    assert (tmp_path / existing).read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]


def test_second_keygen_keeps_first_pair(tmp_path: Path) -> None:
    first = generate_keypair(tmp_path)
    before = first.private_path.read_bytes(), first.public_path.read_bytes()
    with pytest.raises(ConfigError):
        generate_keypair(tmp_path)
    assert (first.private_path.read_bytes(), first.public_path.read_bytes()) == before


def test_refuses_dangling_symlink(tmp_path: Path) -> None:
    (tmp_path / "signing-key.pem").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        generate_keypair(tmp_path)
    assert not (tmp_path / "nowhere").exists()


def test_race_on_public_file_removes_the_half_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another keygen wins the public file between our check and our write: no half pair remains."""
    real = _atomic.atomic_write_bytes

    def racing(path: Path, data: bytes, **kwargs: object) -> None:
        if str(path).endswith(".pub.pem"):
            raise FileExistsError(path)
        real(path, data, **kwargs)  # type: ignore[arg-type]  # forwarding keyword arguments

    monkeypatch.setattr(_keys, "atomic_write_bytes", racing)
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        generate_keypair(tmp_path)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# permission refusal
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o606, 0o666, 0o610, 0o601])
def test_group_or_world_readable_private_key_is_refused(tmp_path: Path, mode: int) -> None:
    pair = generate_keypair(tmp_path)
    pair.private_path.chmod(mode)
    with pytest.raises(ConfigError) as info:
        load_signer(pair.private_path)
    message = str(info.value)
    assert str(pair.private_path) in message
    assert f"chmod 600 {pair.private_path}" in message
    assert f"{mode:04o}" in message
    _assert_no_key_material(message, pair.private_path)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_owner_only_private_key_is_accepted(tmp_path: Path, mode: int) -> None:
    pair = generate_keypair(tmp_path)
    pair.private_path.chmod(mode)
    assert load_signer(pair.private_path).public_key.keyid == pair.keyid


def test_public_key_may_be_world_readable(tmp_path: Path) -> None:
    pair = generate_keypair(tmp_path)
    pair.public_path.chmod(0o644)
    assert load_public_key(pair.public_path).keyid == pair.keyid


# ---------------------------------------------------------------------------------------------
# bad files
# ---------------------------------------------------------------------------------------------


def test_private_key_file_errors(tmp_path: Path) -> None:
    cases: dict[str, Path] = {}
    cases["missing"] = tmp_path / "missing.pem"
    cases["directory"] = tmp_path / "dir"
    cases["directory"].mkdir(mode=0o700)
    cases["not-pem"] = tmp_path / "junk.pem"
    cases["not-pem"].write_bytes(b"this is not a key\n")
    cases["not-pem"].chmod(0o600)
    cases["too-large"] = tmp_path / "big.pem"
    cases["too-large"].write_bytes(b"A" * (_keys.MAX_KEY_FILE_BYTES + 1))
    cases["too-large"].chmod(0o600)
    cases["rsa"] = _write_private(tmp_path / "rsa.pem", rsa.generate_private_key(65537, 2048))
    cases["p384"] = _write_private(tmp_path / "p384.pem", ec.generate_private_key(ec.SECP384R1()))
    for case, path in cases.items():
        with pytest.raises(ConfigError) as info:
            load_signer(path)
        assert str(path) in str(info.value), case


def test_public_key_file_errors(tmp_path: Path) -> None:
    pair = generate_keypair(tmp_path)
    rsa_pub = tmp_path / "rsa.pub.pem"
    rsa_pub.write_bytes(
        rsa.generate_private_key(65537, 2048)
        .public_key()
        .public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    for path in (pair.private_path, rsa_pub, tmp_path / "missing.pub.pem"):
        with pytest.raises(ConfigError) as info:
            load_public_key(path)
        assert str(path) in str(info.value)


def test_errors_are_dspark_errors() -> None:
    assert issubclass(ConfigError, DsparkError)


# ---------------------------------------------------------------------------------------------
# URIs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["file", "file2"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_local_uri(tmp_path: Path, scheme: str, algorithm: str) -> None:
    pair = generate_keypair(tmp_path, algorithm=algorithm)  # type: ignore[arg-type]  # parametrized literal
    public = load_public_key(pair.public_path)
    signer = signer_from_uri(f"{scheme}:{pair.private_path}", public)
    sig = signer.sign(b"m")
    assert sig.keyid == public.keyid
    public.verify_signature(sig, b"m")


def test_file2_uri_honours_path_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pair = generate_keypair(tmp_path)
    monkeypatch.setenv("CRYPTO_SIGNER_PATH_PREFIX", str(tmp_path))
    signer = signer_from_uri("file2:signing-key.pem", load_public_key(pair.public_path))
    assert signer.public_key.keyid == pair.keyid


def test_local_uri_checks_permissions(tmp_path: Path) -> None:
    pair = generate_keypair(tmp_path)
    pair.private_path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        signer_from_uri(f"file:{pair.private_path}", load_public_key(pair.public_path))


def test_local_uri_with_encrypted_key_asks_the_secrets_handler(tmp_path: Path) -> None:
    pair = generate_keypair(tmp_path, passphrase=b"pin-1234")
    asked: list[str] = []

    def handler(name: str) -> str:
        asked.append(name)
        return "pin-1234"

    signer = signer_from_uri(
        f"file:{pair.private_path}", load_public_key(pair.public_path), secrets_handler=handler
    )
    assert asked == ["passphrase"]
    assert signer.public_key.keyid == pair.keyid


def test_local_uri_keeps_callers_keyid(tmp_path: Path) -> None:
    """The keyid is a label chosen by whoever configured the key; the value is what must match."""
    pair = generate_keypair(tmp_path)
    public = load_public_key(pair.public_path)
    relabelled = SSlibKey("my-label", public.keytype, public.scheme, dict(public.keyval))
    signer = signer_from_uri(f"file:{pair.private_path}", relabelled)
    assert signer.sign(b"x").keyid == "my-label"


def test_local_uri_refuses_mismatched_public_key(tmp_path: Path) -> None:
    a = generate_keypair(tmp_path, name="a")
    b = generate_keypair(tmp_path, name="b")
    with pytest.raises(ConfigError, match="does not match"):
        signer_from_uri(f"file:{a.private_path}", load_public_key(b.public_path))


@pytest.mark.parametrize(
    "uri",
    [
        "nope:whatever",
        "gcpkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1",
        "awskms:alias/signing",
        "hsm:",
    ],
    ids=["unknown-scheme", "gcp-kms-without-client", "aws-kms-without-client", "hsm-without-pin"],
)
def test_external_uri_failures_are_config_errors(uri: str) -> None:
    with pytest.raises(ConfigError):
        signer_from_uri(uri, CryptoSigner.generate_ed25519().public_key)


def test_uri_with_unsupported_public_key_type() -> None:
    rsa_key = SSlibKey.from_crypto(rsa.generate_private_key(65537, 2048).public_key())
    with pytest.raises(ConfigError, match="not supported"):
        signer_from_uri("file:/nonexistent", rsa_key)


# ---------------------------------------------------------------------------------------------
# identity, support, tallies (pure)
# ---------------------------------------------------------------------------------------------


def test_identity_ignores_keyid_and_spelling() -> None:
    ed = CryptoSigner.generate_ed25519().public_key
    upper = SSlibKey("other-id", ed.keytype, ed.scheme, {"public": ed.keyval["public"].upper()})
    assert key_identity(ed) == key_identity(upper)
    p256 = CryptoSigner.generate_ecdsa().public_key
    pem = p256.keyval["public"]
    rewrapped = SSlibKey("x", p256.keytype, p256.scheme, {"public": pem.replace("\n", "\r\n")})
    assert key_identity(p256) == key_identity(rewrapped)
    assert key_identity(ed) != key_identity(p256)


@pytest.mark.parametrize(
    ("keytype", "scheme", "public"),
    [
        ("rsa", "rsassa-pss-sha256", "pem"),
        ("ecdsa-sha2-nistp256", "ecdsa-sha2-nistp256", "pem"),
        ("ecdsa", "ecdsa-sha2-nistp384", "pem"),
        ("ed25519", "ed25519", "zz"),
        ("ed25519", "ed25519", "00" * 31),
        ("ecdsa", "ecdsa-sha2-nistp256", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"),
    ],
    ids=["rsa", "deprecated-ecdsa-keytype", "p384", "ed25519-not-hex", "ed25519-short", "ecdsa-bad-pem"],
)
def test_unsupported_or_malformed_keys(keytype: str, scheme: str, public: str) -> None:
    key = SSlibKey("k", keytype, scheme, {"public": public})
    with pytest.raises(ValueError, match="key k"):
        check_supported_key(key)


def test_p384_key_value_under_p256_scheme_is_refused() -> None:
    p384 = ec.generate_private_key(ec.SECP384R1()).public_key()
    pem = p384.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
    with pytest.raises(ValueError, match="P-256"):
        check_supported_key(SSlibKey("k", "ecdsa", "ecdsa-sha2-nistp256", {"public": pem}))


def _signed(signer: CryptoSigner, message: bytes) -> tuple[str, bytes]:
    sig = signer.sign(message)
    return sig.keyid, bytes.fromhex(sig.signature)


def test_tally_counts_each_key_value_once() -> None:
    a, b = CryptoSigner.generate_ed25519(), CryptoSigner.generate_ecdsa()
    alias = SSlibKey("alias-of-a", a.public_key.keytype, a.public_key.scheme, dict(a.public_key.keyval))
    keys = {a.public_key.keyid: a.public_key, b.public_key.keyid: b.public_key, "alias-of-a": alias}
    m = b"msg"
    ka, sa = _signed(a, m)
    kb, sb = _signed(b, m)
    alias_sig = bytes.fromhex(Signature("alias-of-a", sa.hex()).signature)
    tally = tally_signatures(
        m, [(ka, sa), (ka, sa), ("alias-of-a", alias_sig), (kb, sb), ("ghost", b"x")], keys
    )
    assert tally.accepted_keyids == tuple(sorted([min(ka, "alias-of-a"), kb]))
    assert tally.invalid_keyids == ()
    assert tally.unknown_keyids == ("ghost",)


def test_tally_reports_invalid_and_never_raises() -> None:
    a = CryptoSigner.generate_ecdsa()
    broken = SSlibKey("broken", "ed25519", "ed25519", {"public": "not-hex"})
    keys = {a.public_key.keyid: a.public_key, "broken": broken}
    tally = tally_signatures(b"m", [(a.public_key.keyid, b"\x30\x00garbage"), ("broken", b"\x00" * 64)], keys)
    assert tally.accepted_keyids == ()
    assert tally.invalid_keyids == tuple(sorted([a.public_key.keyid, "broken"]))


def test_tally_ed25519_public_key_from_raw_bytes_matches() -> None:
    """An SSlibKey built from raw bytes verifies what the signer signed (sanity of identity use)."""
    priv = ed25519.Ed25519PrivateKey.generate()
    raw = priv.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    key = SSlibKey("raw", "ed25519", "ed25519", {"public": raw.hex()})
    sig = priv.sign(b"m")
    assert tally_signatures(b"m", [("raw", sig)], {"raw": key}).accepted_keyids == ("raw",)


def test_generated_files_do_not_depend_on_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        pair = generate_keypair(tmp_path)
    finally:
        os.umask(old)
    assert _mode(pair.private_path) == 0o600
    assert _mode(pair.public_path) == 0o644


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077], ids=["000", "022", "077"])
def test_created_key_directories_are_0700_whatever_the_umask(tmp_path: Path, umask: int) -> None:
    old = os.umask(umask)
    try:
        pair = generate_keypair(tmp_path / "a" / "b" / "keys")
    finally:
        os.umask(old)
    for directory in (tmp_path / "a", tmp_path / "a" / "b", pair.private_path.parent):
        assert _mode(directory) == 0o700, directory


def test_fifo_key_path_is_refused_without_blocking(tmp_path: Path) -> None:
    import time

    from tests.hangs import HANG_S, fifo_watchdog

    fifo = tmp_path / "signing-key.pem"
    os.mkfifo(fifo, 0o600)
    with fifo_watchdog(tmp_path):
        started = time.monotonic()
        with pytest.raises(ConfigError, match="not a regular file"):
            load_signer(fifo)
        with pytest.raises(ConfigError, match="not a regular file"):
            load_public_key(fifo)
        assert time.monotonic() - started < HANG_S, "the key read blocked on the FIFO"


def test_tally_tolerates_a_mapping_key_that_differs_from_the_key_objects_keyid() -> None:
    signer = CryptoSigner.generate_ed25519()
    _, sig = _signed(signer, b"m")
    # The caller indexed the key under another name; the signature names that index.
    assert tally_signatures(
        b"m", [("index-name", sig)], {"index-name": signer.public_key}
    ).accepted_keyids == ("index-name",)


# -- Ed25519 verified directly: the same verdicts as securesystemslib's SSlibKey -----------------


def _ed25519_case(name: str) -> tuple[SSlibKey, bytes, bytes]:
    """``(trusted key, signature, message)`` for one row of the table below."""
    signer, other = ed25519.Ed25519PrivateKey.generate(), ed25519.Ed25519PrivateKey.generate()
    key = SSlibKey.from_crypto(signer.public_key())
    payload = b'{"a":1,"b":[1,2]}'
    sig = signer.sign(payload)
    if name == "valid":
        return key, sig, payload
    if name == "wrong_key":  # signed by a key the root does not hold, under the trusted keyid
        return key, other.sign(payload), payload
    if name == "wrong_signature":
        return key, sig[:10] + bytes([sig[10] ^ 1]) + sig[11:], payload
    if name == "non_canonical_payload":  # the same JSON value, other bytes: not what was signed
        return key, sig, b'{"b": [1, 2], "a": 1}'
    if name == "truncated_signature":
        return key, sig[:63], payload
    if name == "empty_signature":
        return key, b"", payload
    if name == "key_not_hex":
        return SSlibKey(key.keyid, "ed25519", "ed25519", {"public": "zz" * 32}), sig, payload
    if name == "key_33_bytes":
        return (
            SSlibKey(key.keyid, "ed25519", "ed25519", {"public": key.keyval["public"] + "00"}),
            sig,
            payload,
        )
    if name == "key_upper_hex":  # the same key value in upper case: decodes to the same key
        return (
            SSlibKey(key.keyid, "ed25519", "ed25519", {"public": key.keyval["public"].upper()}),
            sig,
            payload,
        )
    raise AssertionError(name)


ED25519_CASES = [
    ("valid", True),
    ("wrong_key", False),
    ("wrong_signature", False),
    ("non_canonical_payload", False),
    ("truncated_signature", False),
    ("empty_signature", False),
    ("key_not_hex", False),
    ("key_33_bytes", False),
    ("key_upper_hex", True),
]


@pytest.mark.parametrize(("name", "valid"), ED25519_CASES, ids=[c[0] for c in ED25519_CASES])
def test_direct_ed25519_verification_agrees_with_securesystemslib(name: str, valid: bool) -> None:
    key, sig, message = _ed25519_case(name)
    direct = _keys._signature_valid(key, sig, message)
    try:
        key.verify_signature(Signature(key.keyid, sig.hex()), message)
        library = True
    except UnverifiedSignatureError:
        library = False
    assert direct is library is valid
    tally = tally_signatures(message, [(key.keyid, sig)], {key.keyid: key})
    assert tally.accepted_keyids == ((key.keyid,) if valid else ())
    assert tally.invalid_keyids == (() if valid else (key.keyid,))


def test_direct_ed25519_reuses_a_key_object_only_for_the_same_value() -> None:
    key, sig, message = _ed25519_case("valid")
    other, other_sig, _ = _ed25519_case("valid")
    assert _keys._signature_valid(key, sig, message)
    assert _keys._ed25519_public(key.keyval["public"]) is _keys._ed25519_public(key.keyval["public"])
    # Another key's value is another cache entry: its signature never passes for the first key.
    assert _keys._signature_valid(other, other_sig, message)
    assert not _keys._signature_valid(key, other_sig, message)
    assert not _keys._signature_valid(other, sig, message)


def test_other_key_types_still_go_through_securesystemslib(monkeypatch: pytest.MonkeyPatch) -> None:
    private = ec.generate_private_key(ec.SECP256R1())
    key = SSlibKey.from_crypto(private.public_key())
    from cryptography.hazmat.primitives import hashes

    sig = private.sign(b"m", ec.ECDSA(hashes.SHA256()))
    calls: list[str] = []
    real = SSlibKey.verify_signature

    def spy(self: SSlibKey, signature: Signature, data: bytes) -> None:
        calls.append(self.keytype)
        real(self, signature, data)

    monkeypatch.setattr(SSlibKey, "verify_signature", spy)
    assert _keys._signature_valid(key, sig, b"m")
    assert not _keys._signature_valid(key, sig, b"n")
    assert calls == ["ecdsa", "ecdsa"]
