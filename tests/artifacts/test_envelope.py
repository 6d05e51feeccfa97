"""Tests of DSSE envelopes: spec PAE vectors, strict parsing, signature threshold rules, statements."""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature
from hypothesis import given, settings
from hypothesis import strategies as st
from securesystemslib.dsse import Envelope
from securesystemslib.signer import CryptoSigner, Key, SSlibKey

from dspark_calibrate.artifacts._canonical import canonical_json
from dspark_calibrate.artifacts._envelope import (
    BUNDLE_PREDICATE_TYPE,
    MAX_ENVELOPE_BYTES,
    MAX_SIGNATURES,
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    STATEMENT_TYPE,
    EnvelopeError,
    ParsedEnvelope,
    b64decode_strict,
    make_statement,
    pae,
    parse_envelope,
    sign_envelope,
    verify_signatures,
)
from dspark_calibrate.artifacts._reasons import Reason
from dspark_calibrate.errors import ConfigError, DsparkError

VECTORS = Path(__file__).parent.parent / "vectors" / "dsse"
SHA = "ab" * 32

# Signers are created once per module: generating keys is cheap, but not free.
ED = [CryptoSigner.generate_ed25519() for _ in range(3)]
EC = CryptoSigner.generate_ecdsa()
OUTSIDER = CryptoSigner.generate_ed25519()


def _keys(*signers: CryptoSigner) -> dict[str, Key]:
    return {s.public_key.keyid: s.public_key for s in signers}


def _payload() -> bytes:
    return canonical_json(make_statement("cost-table", SHA, PREDICATE_TYPE, {"kind": "cost-table"}))


def _b64(data: bytes) -> str:
    return base64.standard_b64encode(data).decode()


# ---------------------------------------------------------------------------------------------
# PAE: spec vectors and properties
# ---------------------------------------------------------------------------------------------


def _pae_vectors() -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = json.loads((VECTORS / "pae.json").read_text())["vectors"]
    return vectors


@pytest.mark.parametrize("vector", _pae_vectors(), ids=lambda v: v["id"])
def test_pae_spec_vectors(vector: dict[str, Any]) -> None:
    expected = (
        vector["pae_text"].encode("utf-8") if "pae_text" in vector else bytes.fromhex(vector["pae_hex"])
    )
    body = bytes.fromhex(vector["body_hex"])
    assert pae(vector["payload_type"], body) == expected
    # securesystemslib signs its own PAE: it must agree with ours byte for byte.
    assert Envelope(body, vector["payload_type"], {}).pae() == expected


def test_spec_example_signature_verifies_over_our_pae() -> None:
    """The protocol's worked example: ECDSA P-256, deterministic, raw r||s signature."""
    spec = json.loads((VECTORS / "spec_example.json").read_text())
    message = pae(spec["payload_type"], spec["body_text"].encode())
    assert message == spec["pae_text"].encode()
    numbers = ec.EllipticCurvePublicNumbers(int(spec["key"]["x"]), int(spec["key"]["y"]), ec.SECP256R1())
    raw = b64decode_strict(spec["envelope"]["signatures"][0]["sig"])
    r, s = int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big")
    numbers.public_key().verify(encode_dss_signature(r, s), message, ec.ECDSA(hashes.SHA256()))
    # RFC 6979 signing with the spec's private key reproduces the spec's signature exactly.
    private = ec.derive_private_key(int(spec["key"]["d"]), ec.SECP256R1())
    der = private.sign(message, ec.ECDSA(hashes.SHA256(), deterministic_signing=True))
    r2, s2 = decode_dss_signature(der)
    assert r2.to_bytes(32, "big") + s2.to_bytes(32, "big") == raw
    assert b64decode_strict(spec["envelope"]["payload"]) == spec["body_text"].encode()


def test_spec_example_envelope_lacks_keyid_so_our_profile_refuses_it() -> None:
    spec = json.loads((VECTORS / "spec_example.json").read_text())
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(spec["envelope"])
    assert info.value.reason is Reason.ENVELOPE_INVALID
    assert "keyid" in str(info.value)


def test_ed25519_golden_envelope(update_goldens: bool) -> None:
    """An envelope in our profile with the RFC 8032 TEST 1 key; Ed25519 signing is deterministic."""
    path = VECTORS / "ed25519_envelope.json"
    golden = json.loads(path.read_text())
    private = ed25519.Ed25519PrivateKey.from_private_bytes(bytes.fromhex(golden["private_key_hex"]))
    signer = CryptoSigner(private, SSlibKey.from_crypto(private.public_key()))
    assert signer.public_key.keyval["public"] == golden["public_key_hex"]
    payload = golden["payload_text"].encode()
    fresh = sign_envelope(payload, [signer])
    if update_goldens:
        golden.update(keyid=signer.public_key.keyid, pae_hex=pae(PAYLOAD_TYPE, payload).hex(), envelope=fresh)
        path.write_text(json.dumps(golden, indent=2, sort_keys=True) + "\n")
    assert fresh == golden["envelope"]
    assert signer.public_key.keyid == golden["keyid"]
    env = parse_envelope(json.dumps(golden["envelope"]).encode())
    assert env.pae().hex() == golden["pae_hex"]
    assert env.payload == payload
    result = verify_signatures(env, {golden["keyid"]: signer.public_key}, 1)
    assert result.ok and result.accepted_keyids == (golden["keyid"],)


def _parse_pae(data: bytes) -> tuple[bytes, bytes]:
    """An independent PAE reader: proves the encoding is unambiguous (it can be split back)."""
    assert data.startswith(b"DSSEv1 ")
    rest = data[len(b"DSSEv1 ") :]
    fields = []
    for _ in range(2):
        digits, _, rest = rest.partition(b" ")
        assert digits.isdigit() and (digits == b"0" or not digits.startswith(b"0"))
        n = int(digits)
        fields.append(rest[:n])
        rest = rest[n:]
        if len(fields) == 1:
            assert rest[:1] == b" "
            rest = rest[1:]
    assert rest == b""
    return fields[0], fields[1]


@settings(max_examples=200, deadline=None)
@given(st.text(), st.binary())
def test_pae_round_trips(payload_type: str, body: bytes) -> None:
    encoded = pae(payload_type, body)
    assert _parse_pae(encoded) == (payload_type.encode("utf-8"), body)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=8), st.binary(max_size=8), st.text(max_size=8), st.binary(max_size=8))
def test_pae_is_injective(t1: str, b1: bytes, t2: str, b2: bytes) -> None:
    if (t1, b1) != (t2, b2):
        assert pae(t1, b1) != pae(t2, b2)


def test_pae_type_errors() -> None:
    with pytest.raises(TypeError):
        pae(b"type", b"x")  # type: ignore[arg-type]  # wrong type is the test
    with pytest.raises(TypeError):
        pae("type", "x")  # type: ignore[arg-type]  # wrong type is the test


# ---------------------------------------------------------------------------------------------
# strict base64
# ---------------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=96))
def test_base64_round_trips_in_every_accepted_spelling(data: bytes) -> None:
    std = base64.standard_b64encode(data).decode()
    url = base64.urlsafe_b64encode(data).decode()
    for spelling in {std, url, std.rstrip("="), url.rstrip("=")}:
        assert b64decode_strict(spelling) == data


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=64).filter(lambda b: len(b) % 3 != 0))
def test_base64_with_stray_trailing_bits_is_refused(data: bytes) -> None:
    canonical = base64.standard_b64encode(data).decode()
    stripped = canonical.rstrip("=")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = alphabet.index(stripped[-1])
    # One or two padding chars leave 4 or 2 unused low bits in the last symbol; set one of them.
    unused = 0b1111 if len(data) % 3 == 1 else 0b11
    assert last & unused == 0
    tampered = stripped[:-1] + alphabet[last | 1] + canonical[len(stripped) :]
    with pytest.raises(ValueError, match="canonical"):
        b64decode_strict(tampered)


@pytest.mark.parametrize(
    "text",
    [
        "QQ",
        "QQ=",
        "QQ===",
        "Q===",
        "Q",
        "QUJD\n",
        " QUJD",
        "QU JD",
        "QUJD+-",
        "QUJ*",
        "QUJDé",
        "=QUJD",
        "QU=JD",
    ],
    ids=[
        "unpadded-ok",
        "short-padding",
        "extra-padding",
        "one-char-padded",
        "one-char",
        "newline",
        "leading-space",
        "inner-space",
        "mixed-alphabets",
        "bad-char",
        "non-ascii",
        "leading-padding",
        "inner-padding",
    ],
)
def test_base64_spellings(text: str) -> None:
    if text == "QQ":
        assert b64decode_strict(text) == b"A"
        return
    with pytest.raises(ValueError):
        b64decode_strict(text)


# ---------------------------------------------------------------------------------------------
# signing
# ---------------------------------------------------------------------------------------------


def test_sign_envelope_form() -> None:
    env = sign_envelope(_payload(), [ED[0], EC])
    assert set(env) == {"payload", "payloadType", "signatures"}
    assert env["payloadType"] == PAYLOAD_TYPE
    assert base64.standard_b64decode(env["payload"]) == _payload()
    assert [s["keyid"] for s in env["signatures"]] == [ED[0].public_key.keyid, EC.public_key.keyid]
    for sig in env["signatures"]:
        assert set(sig) == {"keyid", "sig"}
    result = verify_signatures(parse_envelope(env), _keys(ED[0], EC), 2)
    assert result.ok, result.findings


def test_sign_envelope_custom_payload_type() -> None:
    env = sign_envelope(b"{}", [ED[0]], payload_type="application/x-test")
    assert parse_envelope(env).payload_type == "application/x-test"


def test_sign_envelope_refuses_no_signers() -> None:
    with pytest.raises(ConfigError, match="no signing key"):
        sign_envelope(b"{}", [])


def test_sign_envelope_refuses_an_envelope_no_verifier_would_accept() -> None:
    with pytest.raises(ConfigError, match="limit"):
        sign_envelope(b"x" * MAX_ENVELOPE_BYTES, [ED[0]])


# ---------------------------------------------------------------------------------------------
# parsing: one row per way to be wrong
# ---------------------------------------------------------------------------------------------


def _valid() -> dict[str, Any]:
    return sign_envelope(_payload(), [ED[0]])


def _set(**changes: Any) -> Callable[[dict[str, Any]], Any]:
    def mutate(env: dict[str, Any]) -> Any:
        env.update(changes)
        return env

    return mutate


def _drop(field: str) -> Callable[[dict[str, Any]], Any]:
    def mutate(env: dict[str, Any]) -> Any:
        del env[field]
        return env

    return mutate


def _sig(**changes: Any) -> Callable[[dict[str, Any]], Any]:
    def mutate(env: dict[str, Any]) -> Any:
        env["signatures"][0].update(changes)
        return env

    return mutate


def _sig_drop(field: str) -> Callable[[dict[str, Any]], Any]:
    def mutate(env: dict[str, Any]) -> Any:
        del env["signatures"][0][field]
        return env

    return mutate


def _raw(text: bytes) -> Callable[[dict[str, Any]], Any]:
    return lambda env: text


def _many_signatures(env: dict[str, Any]) -> dict[str, Any]:
    env["signatures"] = env["signatures"] * (MAX_SIGNATURES + 1)
    return env


PARSE_CASES: list[tuple[str, Callable[[dict[str, Any]], Any], Reason]] = [
    ("not-json", _raw(b"{not json"), Reason.ENVELOPE_INVALID),
    ("not-utf8", _raw(b'{"payload":"\xff"}'), Reason.ENVELOPE_INVALID),
    (
        "duplicate-key",
        _raw(b'{"payload":"","payload":"","payloadType":"t","signatures":[]}'),
        Reason.ENVELOPE_INVALID,
    ),
    ("nan-literal", _raw(b'{"payload":NaN}'), Reason.ENVELOPE_INVALID),
    ("top-level-list", _raw(b"[]"), Reason.ENVELOPE_INVALID),
    ("top-level-string", _raw(b'"envelope"'), Reason.ENVELOPE_INVALID),
    ("missing-payload", _drop("payload"), Reason.ENVELOPE_INVALID),
    ("missing-payloadType", _drop("payloadType"), Reason.ENVELOPE_INVALID),
    ("missing-signatures", _drop("signatures"), Reason.ENVELOPE_INVALID),
    ("unknown-field", _set(extra=1), Reason.ENVELOPE_INVALID),
    ("payload-not-string", _set(payload=123), Reason.ENVELOPE_INVALID),
    ("payload-bad-characters", _set(payload="not*base64"), Reason.ENVELOPE_INVALID),
    ("payload-wrong-padding", _set(payload="QUI=="), Reason.ENVELOPE_INVALID),
    ("payload-stray-bits", _set(payload="QR=="), Reason.ENVELOPE_INVALID),
    ("payload-mixed-alphabets", _set(payload="ab+-"), Reason.ENVELOPE_INVALID),
    ("payload-with-newline", _set(payload="QUJD\nQUJD"), Reason.ENVELOPE_INVALID),
    ("payloadType-not-string", _set(payloadType=["x"]), Reason.ENVELOPE_INVALID),
    ("payloadType-lone-surrogate", _set(payloadType="\ud800"), Reason.ENVELOPE_INVALID),
    ("signatures-not-list", _set(signatures={"keyid": "k", "sig": ""}), Reason.ENVELOPE_INVALID),
    ("signatures-empty", _set(signatures=[]), Reason.SIGNATURE_MISSING),
    ("signature-not-object", _set(signatures=["sig"]), Reason.ENVELOPE_INVALID),
    ("signature-missing-keyid", _sig_drop("keyid"), Reason.ENVELOPE_INVALID),
    ("signature-missing-sig", _sig_drop("sig"), Reason.ENVELOPE_INVALID),
    ("signature-unknown-field", _sig(cert="x"), Reason.ENVELOPE_INVALID),
    ("keyid-not-string", _sig(keyid=7), Reason.ENVELOPE_INVALID),
    ("keyid-null", _sig(keyid=None), Reason.ENVELOPE_INVALID),
    ("sig-bad-base64", _sig(sig="%%%"), Reason.ENVELOPE_INVALID),
    ("sig-not-string", _sig(sig=b"raw"), Reason.ENVELOPE_INVALID),
    ("too-many-signatures", _many_signatures, Reason.ENVELOPE_TOO_LARGE),
    ("too-large-bytes", _raw(b" " * (MAX_ENVELOPE_BYTES + 1)), Reason.ENVELOPE_TOO_LARGE),
    ("too-large-mapping", _set(payload=_b64(b"x" * MAX_ENVELOPE_BYTES)), Reason.ENVELOPE_TOO_LARGE),
]


@pytest.mark.parametrize(("case", "mutate", "reason"), PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_parse_rejects(case: str, mutate: Callable[[dict[str, Any]], Any], reason: Reason) -> None:
    data = mutate(_valid())
    # Bytes rows are fed as bytes; mapping rows both as a mapping and as JSON bytes (when encodable).
    forms: list[bytes | dict[str, Any]] = [data]
    if isinstance(data, dict):
        with contextlib.suppress(TypeError):  # a bytes value cannot be JSON: only the mapping form exists
            forms.append(json.dumps(data).encode())
    for form in forms:
        with pytest.raises(EnvelopeError) as info:
            parse_envelope(form)
        assert info.value.reason is reason, (case, str(info.value))
        assert isinstance(info.value, DsparkError)
        assert "\n" not in str(info.value)


def test_parse_respects_a_smaller_limit() -> None:
    raw = json.dumps(_valid()).encode()
    with pytest.raises(EnvelopeError) as info:
        parse_envelope(raw, max_bytes=len(raw) - 1)
    assert info.value.reason is Reason.ENVELOPE_TOO_LARGE
    assert parse_envelope(raw, max_bytes=len(raw)).payload == _payload()


def test_parse_accepts_url_safe_unpadded_base64() -> None:
    """DSSE: verifiers MUST accept standard and URL-safe base64."""
    env = _valid()
    env["payload"] = base64.urlsafe_b64encode(_payload()).decode().rstrip("=")
    env["signatures"][0]["sig"] = base64.urlsafe_b64encode(
        b64decode_strict(env["signatures"][0]["sig"])
    ).decode()
    parsed = parse_envelope(env)
    assert parsed.payload == _payload()
    assert verify_signatures(parsed, _keys(ED[0]), 1).ok


def test_parsed_envelope_is_frozen_and_keeps_duplicates() -> None:
    env = _valid()
    env["signatures"] = env["signatures"] * 2
    parsed = parse_envelope(env)
    assert len(parsed.signatures) == 2
    with pytest.raises(AttributeError):
        parsed.payload = b""  # type: ignore[misc]  # frozen dataclass: assignment is the test


# ---------------------------------------------------------------------------------------------
# verification: one row per way to be (in)sufficient
# ---------------------------------------------------------------------------------------------


def _env(*signers: CryptoSigner, payload: bytes | None = None) -> ParsedEnvelope:
    return parse_envelope(sign_envelope(payload if payload is not None else _payload(), list(signers)))


def _with(env: ParsedEnvelope, **changes: Any) -> ParsedEnvelope:
    return dataclasses.replace(env, **changes)


def _flip(sig: bytes) -> bytes:
    return bytes([sig[0] ^ 1]) + sig[1:]


def _alias(signer: CryptoSigner, keyid: str) -> SSlibKey:
    k = signer.public_key
    return SSlibKey(keyid, k.keytype, k.scheme, copy.deepcopy(k.keyval))


def _case_duplicate_keyid() -> tuple[ParsedEnvelope, dict[str, Key], int]:
    env = _env(ED[0])
    return _with(env, signatures=env.signatures * 3), _keys(*ED), 2


def _case_alias_keyids() -> tuple[ParsedEnvelope, dict[str, Key], int]:
    """One key trusted under two keyids, signed under both: one vote."""
    env = _env(ED[0])
    keyid, sig = env.signatures[0]
    keys: dict[str, Key] = {keyid: ED[0].public_key, "alias": _alias(ED[0], "alias")}
    return _with(env, signatures=((keyid, sig), ("alias", sig))), keys, 2


def _case_wrong_key_under_trusted_keyid() -> tuple[ParsedEnvelope, dict[str, Key], int]:
    env = _env(OUTSIDER)
    sig = env.signatures[0][1]
    return _with(env, signatures=((ED[0].public_key.keyid, sig),)), _keys(ED[0]), 1


def _case_one_of_two_corrupted() -> tuple[ParsedEnvelope, dict[str, Key], int]:
    env = _env(ED[0], ED[1])
    (k0, s0), (k1, s1) = env.signatures
    return _with(env, signatures=((k0, s0), (k1, _flip(s1)))), _keys(ED[0], ED[1]), 2


def _case_met_but_extra_invalid() -> tuple[ParsedEnvelope, dict[str, Key], int]:
    env = _env(ED[0], ED[1])
    (k0, s0), (k1, s1) = env.signatures
    return _with(env, signatures=((k0, s0), (k1, _flip(s1)))), _keys(ED[0], ED[1]), 1


def _case_bad_then_good_same_key() -> tuple[ParsedEnvelope, dict[str, Key], int]:
    env = _env(ED[0])
    k, s = env.signatures[0]
    return _with(env, signatures=((k, _flip(s)), (k, s))), _keys(ED[0]), 1


def _case_malformed_trusted_key() -> tuple[ParsedEnvelope, dict[str, Key], int]:
    env = _env(ED[0])
    broken = SSlibKey(ED[0].public_key.keyid, "ed25519", "ed25519", {"public": "zz"})
    return env, {ED[0].public_key.keyid: broken}, 1


VERIFY_CASES: list[
    tuple[str, Callable[[], tuple[ParsedEnvelope, dict[str, Key], int]], tuple[Reason, ...], int]
] = [
    ("valid-1-of-1", lambda: (_env(ED[0]), _keys(ED[0]), 1), (), 1),
    ("valid-2-of-3", lambda: (_env(ED[0], ED[2]), _keys(*ED), 2), (), 2),
    ("valid-3-of-3-mixed-algorithms", lambda: (_env(ED[0], EC, ED[1]), _keys(ED[0], ED[1], EC), 3), (), 3),
    ("valid-ecdsa", lambda: (_env(EC), _keys(EC), 1), (), 1),
    ("extra-unknown-signature-ignored", lambda: (_env(ED[0], OUTSIDER), _keys(ED[0]), 1), (), 1),
    ("below-threshold", lambda: (_env(ED[0]), _keys(*ED), 2), (Reason.SIGNATURE_THRESHOLD,), 1),
    ("duplicated-keyid-counts-once", _case_duplicate_keyid, (Reason.SIGNATURE_THRESHOLD,), 1),
    ("two-keyids-one-key-counts-once", _case_alias_keyids, (Reason.SIGNATURE_THRESHOLD,), 1),
    ("only-unknown-keyids", lambda: (_env(OUTSIDER), _keys(ED[0]), 1), (Reason.SIGNATURE_THRESHOLD,), 0),
    (
        "payload-altered",
        lambda: (_with(_env(ED[0]), payload=b"{}"), _keys(ED[0]), 1),
        (Reason.SIGNATURE_INVALID,),
        0,
    ),
    (
        "payloadType-altered",
        lambda: (_with(_env(ED[0]), payload_type="application/json"), _keys(ED[0]), 1),
        (Reason.SIGNATURE_INVALID,),
        0,
    ),
    (
        "signature-bytes-flipped",
        lambda: (
            _with(_env(ED[0]), signatures=((ED[0].public_key.keyid, _flip(_env(ED[0]).signatures[0][1])),)),
            _keys(ED[0]),
            1,
        ),
        (Reason.SIGNATURE_INVALID,),
        0,
    ),
    (
        "ecdsa-signature-truncated",
        lambda: (
            _with(_env(EC), signatures=((EC.public_key.keyid, _env(EC).signatures[0][1][:-3]),)),
            _keys(EC),
            1,
        ),
        (Reason.SIGNATURE_INVALID,),
        0,
    ),
    (
        "empty-signature",
        lambda: (_with(_env(ED[0]), signatures=((ED[0].public_key.keyid, b""),)), _keys(ED[0]), 1),
        (Reason.SIGNATURE_INVALID,),
        0,
    ),
    ("wrong-key-under-trusted-keyid", _case_wrong_key_under_trusted_keyid, (Reason.SIGNATURE_INVALID,), 0),
    (
        "one-of-two-corrupted",
        _case_one_of_two_corrupted,
        (Reason.SIGNATURE_THRESHOLD, Reason.SIGNATURE_INVALID),
        1,
    ),
    (
        "threshold-met-but-a-trusted-signature-is-bad",
        _case_met_but_extra_invalid,
        (Reason.SIGNATURE_INVALID,),
        1,
    ),
    ("bad-then-good-by-one-key", _case_bad_then_good_same_key, (Reason.SIGNATURE_INVALID,), 1),
    ("malformed-trusted-key", _case_malformed_trusted_key, (Reason.SIGNATURE_INVALID,), 0),
]


@pytest.mark.parametrize(
    ("case", "build", "reasons", "n_accepted"), VERIFY_CASES, ids=[c[0] for c in VERIFY_CASES]
)
def test_verify_signatures(
    case: str,
    build: Callable[[], tuple[ParsedEnvelope, dict[str, Key], int]],
    reasons: tuple[Reason, ...],
    n_accepted: int,
) -> None:
    env, keys, threshold = build()
    result = verify_signatures(env, keys, threshold)
    assert tuple(f.reason for f in result.findings) == reasons, [f.message for f in result.findings]
    assert len(result.accepted_keyids) == n_accepted
    assert list(result.accepted_keyids) == sorted(result.accepted_keyids)
    assert result.ok is (not reasons)
    assert bool(result) is (not reasons)
    for finding in result.findings:
        assert "\n" not in finding.message


def test_verify_outcome_does_not_depend_on_signature_order() -> None:
    env = _env(ED[0], ED[1], EC)
    (a, sa), (b, sb), (c, sc) = env.signatures
    orders = [
        ((a, sa), (b, _flip(sb)), (c, sc)),
        ((c, sc), (b, _flip(sb)), (a, sa)),
        ((b, _flip(sb)), (a, sa), (c, sc)),
    ]
    results = {
        (
            verify_signatures(_with(env, signatures=o), _keys(ED[0], ED[1], EC), 2).accepted_keyids,
            tuple(
                f.reason
                for f in verify_signatures(_with(env, signatures=o), _keys(ED[0], ED[1], EC), 2).findings
            ),
        )
        for o in orders
    }
    assert len(results) == 1


@pytest.mark.parametrize("threshold", [0, -1, True, 1.5])
def test_verify_rejects_a_nonsense_threshold(threshold: Any) -> None:
    with pytest.raises(ValueError):
        verify_signatures(_env(ED[0]), _keys(ED[0]), threshold)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=140), st.sampled_from(["ed", "ec"]))
def test_verify_never_raises_on_garbage_signatures(sig: bytes, which: str) -> None:
    signer = ED[0] if which == "ed" else EC
    env = _with(_env(signer), signatures=((signer.public_key.keyid, sig),))
    result = verify_signatures(env, _keys(signer), 1)
    assert not result.ok
    assert result.findings[0].reason is Reason.SIGNATURE_INVALID


def test_threshold_message_names_ignored_keyids() -> None:
    result = verify_signatures(_env(OUTSIDER), _keys(ED[0]), 1)
    assert OUTSIDER.public_key.keyid in result.findings[0].message


# ---------------------------------------------------------------------------------------------
# statements
# ---------------------------------------------------------------------------------------------


def test_make_statement() -> None:
    predicate: dict[str, Any] = {"kind": "cost-table", "nested": {"a": [1]}}
    statement = make_statement("cost-table", SHA, PREDICATE_TYPE, predicate)
    assert statement == {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": "cost-table", "digest": {"sha256": SHA}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }
    predicate["nested"]["a"].append(2)  # a later edit of the caller's dict changes nothing signed
    assert statement["predicate"]["nested"]["a"] == [1]
    assert make_statement("bundle", SHA, BUNDLE_PREDICATE_TYPE, {})["predicateType"] == BUNDLE_PREDICATE_TYPE


@pytest.mark.parametrize(
    ("name", "digest", "ptype"),
    [
        ("", SHA, PREDICATE_TYPE),
        ("k", SHA.upper(), PREDICATE_TYPE),
        ("k", SHA[:-1], PREDICATE_TYPE),
        ("k", SHA, ""),
    ],
    ids=["empty-name", "uppercase-digest", "short-digest", "empty-predicate-type"],
)
def test_make_statement_rejects(name: str, digest: str, ptype: str) -> None:
    with pytest.raises(ValueError):
        make_statement(name, digest, ptype, {})


def test_constants() -> None:
    assert PAYLOAD_TYPE == "application/vnd.dspark-calibrate.artifact+json"
    assert STATEMENT_TYPE == "https://in-toto.io/Statement/v1"
    assert PREDICATE_TYPE == "https://dspark-calibrate.dev/artifact/v1"
    assert BUNDLE_PREDICATE_TYPE == "https://dspark-calibrate.dev/bundle/v1"
    assert MAX_ENVELOPE_BYTES == 1 << 20


def test_parsed_mapping_keeps_the_canonical_bytes_it_was_measured_on() -> None:
    """The verifier compares a detached envelope with these bytes instead of encoding the
    embedded one again; bytes input has none (its size is its own length)."""
    env = sign_envelope(_payload(), [ED[0]])
    parsed = parse_envelope(env)
    assert parsed.encoded == canonical_json(env)
    assert parse_envelope(canonical_json(env)).encoded is None
    assert parse_envelope(canonical_json(env)) == parsed  # not part of equality
