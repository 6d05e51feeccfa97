"""Tests of the TUF trust root: creation, strict loading, python-tuf-style rotation, chains."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from securesystemslib.formats import encode_canonical
from securesystemslib.signer import CryptoSigner, Key, SSlibKey
from tuf.api.metadata import Metadata, Role, Root

from dspark_calibrate.artifacts._canonical import canonical_json
from dspark_calibrate.artifacts._envelope import parse_envelope, sign_envelope, verify_signatures
from dspark_calibrate.artifacts._reasons import Reason
from dspark_calibrate.artifacts._trust import (
    MAX_ROOT_CHAIN,
    MAX_TRUST_ROOT_BYTES,
    TrustRoot,
    TrustRootError,
    TrustRootUnreadable,
    check_root_rollback,
    init_root,
    load_trust_root,
    read_trust_root,
    rotate_root,
    verify_root_chain,
)
from dspark_calibrate.errors import DsparkError

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(days=365)

# Six Ed25519 keys and one ECDSA key, made once: K[5] is the artifact signer of the base root.
K = [CryptoSigner.generate_ed25519() for _ in range(6)]
P = [s.public_key for s in K]
EC = CryptoSigner.generate_ecdsa()
ART = 5

INVALID = Reason.TRUST_ROOT_INVALID
EXPIRED = Reason.TRUST_ROOT_EXPIRED
ROTATION = Reason.TRUST_ROOT_ROTATION_INVALID


def make_root(
    root_idx: Sequence[int] = (0,),
    threshold: int = 1,
    *,
    signers: Sequence[int] | None = None,
    art_idx: Sequence[int] = (ART,),
    art_threshold: int = 1,
    expires: datetime = LATER,
    version: int = 1,
) -> TrustRoot:
    return init_root(
        root_signers=[K[i] for i in (signers if signers is not None else root_idx)],
        root_keys=[P[i] for i in root_idx],
        root_threshold=threshold,
        artifact_keys=[P[i] for i in art_idx],
        artifact_threshold=art_threshold,
        expires=expires,
        version=version,
    )


def manual_root(
    root_idx: Sequence[int],
    threshold: int,
    sign_with: Sequence[int],
    *,
    version: int,
    expires: datetime = LATER,
) -> bytes:
    """A root built with python-tuf directly, bypassing init/rotate checks: the loader must judge."""
    root = Root(version=version, expires=expires)
    for i in root_idx:
        root.add_key(P[i], "root")
    root.add_key(P[ART], "targets")
    root.roles["root"].threshold = threshold
    for name in ("snapshot", "timestamp"):
        root.roles[name] = Role([P[ART].keyid], 1)
    md = Metadata(root)
    for i in sign_with:
        md.sign(K[i], append=True)
    return canonical_json(md.to_dict())


def _reason(fn: Callable[[], object]) -> Reason:
    with pytest.raises(TrustRootError) as info:
        fn()
    assert isinstance(info.value, DsparkError)
    assert "\n" not in str(info.value)
    return info.value.reason


# ---------------------------------------------------------------------------------------------
# creation and round trip
# ---------------------------------------------------------------------------------------------


def test_init_and_load_round_trip() -> None:
    root = make_root((0, 1, 2), 2, signers=(0, 1))
    assert root.version == 1
    assert root.expires == LATER
    assert root.root_threshold == 2 and set(root.root_keys) == {P[0].keyid, P[1].keyid, P[2].keyid}
    assert root.artifact_threshold == 1 and set(root.artifact_keys) == {P[ART].keyid}
    assert root.keyids() == tuple(sorted({P[i].keyid for i in (0, 1, 2, ART)}))
    loaded = load_trust_root(root.to_bytes(), now=NOW)
    assert loaded == root
    assert loaded.digest() == root.digest() == hashlib.sha256(root.to_bytes()).hexdigest()


def test_to_bytes_is_canonical_and_formatting_does_not_change_the_digest() -> None:
    root = make_root()
    assert root.to_bytes() == canonical_json(json.loads(root.to_bytes()))
    pretty = json.dumps(json.loads(root.to_bytes()), indent=4).encode()
    assert load_trust_root(pretty, now=NOW).digest() == root.digest()


def test_root_is_a_real_tuf_root() -> None:
    md = make_root().metadata()
    assert isinstance(md.signed, Root)
    # The artifact-signing role is TUF's targets role; snapshot and timestamp mirror it.
    for name in ("targets", "snapshot", "timestamp"):
        assert md.signed.roles[name].keyids == [P[ART].keyid]
    md.signed.verify_delegate("root", md.signed_bytes, md.signatures)


def test_metadata_is_a_copy_and_key_maps_are_read_only() -> None:
    root = make_root()
    md = root.metadata()
    md.signed.version = 99
    assert root.version == 1 and root.metadata().signed.version == 1
    with pytest.raises(TypeError):
        root.artifact_keys["x"] = P[0]  # type: ignore[index]  # read-only mapping: assignment is the test


def test_summary_names_keys_without_their_values() -> None:
    root = make_root((0, 1), 1)
    summary = root.summary()
    assert summary["version"] == 1 and summary["sha256"] == root.digest()
    assert summary["root"]["threshold"] == 1
    text = json.dumps(summary)
    for key in (P[0], P[1], P[ART]):
        assert key.keyid in text
        assert key.keyval["public"] not in text


def test_mixed_algorithms_and_ecdsa_root_signer() -> None:
    root = init_root(
        root_signers=[EC, K[0]],
        root_keys=[EC.public_key, P[0]],
        root_threshold=2,
        artifact_keys=[EC.public_key, P[ART]],
        artifact_threshold=2,
        expires=LATER,
    )
    assert load_trust_root(root.to_bytes(), now=NOW) == root


def test_non_utc_expiry_is_stored_in_utc() -> None:
    plus_two = timezone(timedelta(hours=2))
    root = make_root(expires=datetime(2031, 1, 1, 14, 0, 0, 123, tzinfo=plus_two))
    assert root.expires == datetime(2031, 1, 1, 12, 0, tzinfo=UTC)


def _alias(key: Key, keyid: str) -> SSlibKey:
    return SSlibKey(keyid, key.keytype, key.scheme, copy.deepcopy(key.keyval))


RSA_KEY = SSlibKey.from_crypto(rsa.generate_private_key(65537, 2048).public_key())

INIT_CASES: list[tuple[str, dict[str, Any]]] = [
    ("root-threshold-zero", {"root_threshold": 0}),
    ("root-threshold-above-keys", {"root_threshold": 2}),
    ("root-threshold-bool", {"root_threshold": True}),
    ("artifact-threshold-above-keys", {"artifact_threshold": 2}),
    ("no-root-keys", {"root_keys": [], "root_signers": [K[0]]}),
    ("no-artifact-keys", {"artifact_keys": []}),
    ("duplicate-root-key-value", {"root_keys": [P[0], _alias(P[0], "alias")], "root_threshold": 2}),
    ("duplicate-artifact-key", {"artifact_keys": [P[ART], P[ART]]}),
    ("one-key-two-keyids-across-roles", {"artifact_keys": [_alias(P[0], "alias")]}),
    ("unsupported-rsa-key", {"artifact_keys": [RSA_KEY]}),
    ("signer-not-a-root-key", {"root_signers": [K[ART]]}),
    ("too-few-root-signers", {"root_keys": [P[0], P[1]], "root_threshold": 2, "root_signers": [K[0]]}),
    ("no-root-signers", {"root_signers": []}),
    ("version-zero", {"version": 0}),
]


@pytest.mark.parametrize(("case", "changes"), INIT_CASES, ids=[c[0] for c in INIT_CASES])
def test_init_root_rejects(case: str, changes: dict[str, Any]) -> None:
    args: dict[str, Any] = {
        "root_signers": [K[0]],
        "root_keys": [P[0]],
        "root_threshold": 1,
        "artifact_keys": [P[ART]],
        "artifact_threshold": 1,
        "expires": LATER,
    }
    args.update(changes)
    assert _reason(lambda: init_root(**args)) is INVALID


def test_naive_datetimes_are_caller_bugs() -> None:
    naive = datetime(2031, 1, 1)
    with pytest.raises(TypeError):
        make_root(expires=naive)
    with pytest.raises(TypeError):
        load_trust_root(make_root().to_bytes(), now=naive)
    with pytest.raises(TypeError):
        rotate_root(make_root(), signers=[K[0]], expires=naive)


# ---------------------------------------------------------------------------------------------
# loading: one row per way to be wrong (mutate, then re-sign so the row reaches its check)
# ---------------------------------------------------------------------------------------------


def _resign(doc: dict[str, Any], signers: Sequence[CryptoSigner]) -> dict[str, Any]:
    payload = encode_canonical(doc["signed"]).encode()  # type: ignore[union-attr]  # returns str without an output function
    doc["signatures"] = [{"keyid": s.public_key.keyid, "sig": s.sign(payload).signature} for s in signers]
    return doc


Mutation = Callable[[dict[str, Any]], "dict[str, Any] | bytes"]


def _signed(edit: Callable[[dict[str, Any]], None], signers: Sequence[int] = (0,)) -> Mutation:
    def mutate(doc: dict[str, Any]) -> dict[str, Any]:
        edit(doc["signed"])
        return _resign(doc, [K[i] for i in signers])

    return mutate


def _unsigned(edit: Callable[[dict[str, Any]], None]) -> Mutation:
    def mutate(doc: dict[str, Any]) -> dict[str, Any]:
        edit(doc)
        return doc

    return mutate


def _raw(data: bytes) -> Mutation:
    return lambda doc: data


def _set_in(path: Sequence[str], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(obj: dict[str, Any]) -> None:
        for part in path[:-1]:
            obj = obj[part]
        obj[path[-1]] = value

    return edit


def _del_in(path: Sequence[str]) -> Callable[[dict[str, Any]], None]:
    def edit(obj: dict[str, Any]) -> None:
        for part in path[:-1]:
            obj = obj[part]
        del obj[path[-1]]

    return edit


def _add_key(key: Key, role: str, keyid: str | None = None) -> Callable[[dict[str, Any]], None]:
    def edit(signed: dict[str, Any]) -> None:
        kid = keyid or key.keyid
        signed["keys"][kid] = key.to_dict()
        signed["roles"][role]["keyids"].append(kid)

    return edit


def _alias_root_key(signed: dict[str, Any]) -> None:
    _add_key(P[0], "root", "alias-of-k0")(signed)
    signed["roles"]["root"]["threshold"] = 2


def _alias_signed(doc: dict[str, Any]) -> dict[str, Any]:
    _alias_root_key(doc["signed"])
    _resign(doc, [K[0]])
    doc["signatures"].append({"keyid": "alias-of-k0", "sig": doc["signatures"][0]["sig"]})
    return doc


def _deprecated_ecdsa(signed: dict[str, Any]) -> None:
    d = EC.public_key.to_dict()
    d["keytype"] = "ecdsa-sha2-nistp256"
    signed["keys"]["old-style"] = d
    signed["roles"]["targets"]["keyids"].append("old-style")


def _extra_in_signature(doc: dict[str, Any]) -> dict[str, Any]:
    _resign(doc, [K[0]])
    doc["signatures"][0]["extra"] = 1
    return doc


def _duplicate_signature(doc: dict[str, Any]) -> dict[str, Any]:
    _resign(doc, [K[0]])
    doc["signatures"].append(dict(doc["signatures"][0]))
    return doc


def _tamper_after_signing(doc: dict[str, Any]) -> dict[str, Any]:
    doc["signed"]["expires"] = "2099-01-01T00:00:00Z"
    return doc


def _expired_and_tampered(doc: dict[str, Any]) -> dict[str, Any]:
    _resign(doc, [K[0]])
    doc["signed"]["expires"] = "2020-01-01T00:00:00Z"
    return doc


def _base_key(signed: dict[str, Any]) -> dict[str, Any]:
    key: dict[str, Any] = signed["keys"][P[ART].keyid]
    return key


def _huge_version(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc).encode().replace(b'"version": 1', b'"version": ' + b"9" * 5000, 1)


def _surrogate_keyid(doc: dict[str, Any]) -> dict[str, Any]:
    # A keyid that JSON can carry but UTF-8 cannot: TUF's canonical form of it cannot be built.
    signed = doc["signed"]
    signed["keys"]["\ud800"] = signed["keys"].pop(P[0].keyid)
    signed["roles"]["root"]["keyids"] = ["\ud800"]
    return doc


LOAD_CASES: list[tuple[str, Mutation, Reason]] = [
    ("not-json", _raw(b"{"), INVALID),
    ("duplicate-json-key", _raw(b'{"signed":{},"signed":{},"signatures":[]}'), INVALID),
    ("nan-literal", _raw(b'{"signed":NaN}'), INVALID),
    ("top-level-list", _raw(b"[]"), INVALID),
    ("not-utf8", _raw(b"\xff\xfe"), INVALID),
    ("too-large", _raw(b" " * ((1 << 20) + 1)), INVALID),
    ("targets-metadata-not-root", _signed(_set_in(["_type"], "targets")), INVALID),
    ("missing-roles", _signed(_del_in(["roles"])), INVALID),
    ("missing-snapshot-role", _signed(_del_in(["roles", "snapshot"])), INVALID),
    ("missing-keys", _signed(_del_in(["keys"])), INVALID),
    ("keys-is-a-list", _signed(_set_in(["keys"], [])), INVALID),
    ("unknown-top-level-field", _unsigned(_set_in(["extra"], 1)), INVALID),
    ("unknown-signed-field", _signed(_set_in(["extra"], 1)), INVALID),
    ("unknown-role-field", _signed(_set_in(["roles", "root", "extra"], 1)), INVALID),
    ("unknown-key-field", _signed(lambda s: _base_key(s).update(extra=1)), INVALID),
    ("unknown-signature-field", _extra_in_signature, INVALID),
    ("unsupported-rsa-key", _signed(_add_key(RSA_KEY, "targets")), INVALID),
    ("deprecated-ecdsa-keytype", _signed(_deprecated_ecdsa), INVALID),
    ("ed25519-value-not-hex", _signed(lambda s: _base_key(s)["keyval"].update(public="zz")), INVALID),
    ("one-key-under-two-keyids", _alias_signed, INVALID),
    ("root-threshold-above-keys", _signed(_set_in(["roles", "root", "threshold"], 2)), INVALID),
    ("targets-threshold-above-keys", _signed(_set_in(["roles", "targets", "threshold"], 2)), INVALID),
    ("threshold-zero", _signed(_set_in(["roles", "root", "threshold"], 0)), INVALID),
    ("threshold-bool", _signed(_set_in(["roles", "root", "threshold"], True)), INVALID),
    ("threshold-string", _signed(_set_in(["roles", "root", "threshold"], "1")), INVALID),
    ("version-bool", _signed(_set_in(["version"], True)), INVALID),
    ("version-zero", _signed(_set_in(["version"], 0)), INVALID),
    ("role-names-unknown-keyid", _signed(lambda s: s["roles"]["targets"]["keyids"].append("ghost")), INVALID),
    ("duplicate-keyid-in-role", _signed(lambda s: s["roles"]["root"]["keyids"].append(P[0].keyid)), INVALID),
    ("targets-role-empty", _signed(_set_in(["roles", "targets", "keyids"], [])), INVALID),
    ("root-role-empty", _signed(_set_in(["roles", "root", "keyids"], [])), INVALID),
    ("expires-not-a-timestamp", _signed(_set_in(["expires"], "2031-01-01")), INVALID),
    ("spec-version-2", _signed(_set_in(["spec_version"], "2.0.0")), INVALID),
    ("no-signatures", _signed(lambda s: None, signers=()), INVALID),
    ("signed-by-artifact-key-only", _signed(lambda s: None, signers=(ART,)), INVALID),
    ("tampered-after-signing", _tamper_after_signing, INVALID),
    ("signature-not-hex", _unsigned(lambda d: d["signatures"][0].update(sig="zz")), INVALID),
    ("duplicate-signature-entries", _duplicate_signature, INVALID),
    # numbers and strings that TUF's canonical JSON cannot carry: the file's own code, no crash
    ("float-in-signed", _unsigned(_set_in(["signed", "consistent_snapshot"], 1.5)), INVALID),
    ("float-threshold", _unsigned(_set_in(["signed", "roles", "root", "threshold"], 1.0)), INVALID),
    (
        "float-deep-in-a-key",
        _unsigned(lambda d: _base_key(d["signed"])["keyval"].update(x=[{"y": 2e-3}])),
        INVALID,
    ),
    ("integer-of-5000-digits", _huge_version, INVALID),
    ("lone-surrogate-keyid", _surrogate_keyid, INVALID),
    ("expired", _signed(_set_in(["expires"], "2029-12-31T00:00:00Z")), EXPIRED),
    ("expires-exactly-now", _signed(_set_in(["expires"], "2030-01-01T12:00:00Z")), EXPIRED),
    # Two defects: a bad signature is reported before expiry.
    ("expired-and-tampered", _expired_and_tampered, INVALID),
]


@pytest.mark.parametrize(("case", "mutate", "reason"), LOAD_CASES, ids=[c[0] for c in LOAD_CASES])
def test_load_rejects(case: str, mutate: Mutation, reason: Reason) -> None:
    doc = json.loads(make_root().to_bytes())
    out = mutate(doc)
    data = out if isinstance(out, bytes) else json.dumps(out).encode()
    assert _reason(lambda: load_trust_root(data, now=NOW)) is reason


def test_load_accepts_the_unmutated_base() -> None:
    doc = json.loads(make_root().to_bytes())
    assert load_trust_root(json.dumps(_resign(doc, [K[0]])).encode(), now=NOW).version == 1


def test_a_root_verified_before_is_reused_only_for_the_same_bytes() -> None:
    good = make_root(art_idx=(4,)).to_bytes()
    first = load_trust_root(good, now=NOW)
    assert load_trust_root(bytearray(good), now=NOW) is first  # verified once per process
    # After the good root: a copy with one signature byte changed, the same root re-signed
    # after an edit, and the good bytes past their expiry are each refused, not served.
    doc = json.loads(good)
    sig = doc["signatures"][0]["sig"]
    doc["signatures"][0]["sig"] = ("0" if sig[0] != "0" else "1") + sig[1:]
    assert _reason(lambda: load_trust_root(canonical_json(doc), now=NOW)) is INVALID
    tampered = canonical_json(_tamper_after_signing(json.loads(good)))
    assert _reason(lambda: load_trust_root(tampered, now=NOW)) is INVALID
    assert _reason(lambda: load_trust_root(good, now=LATER)) is EXPIRED
    # Another valid root is its own root, with its own artifact keys.
    other = load_trust_root(make_root(art_idx=(3,)).to_bytes(), now=NOW)
    assert set(other.artifact_keys) == {P[3].keyid}
    assert set(load_trust_root(good, now=NOW).artifact_keys) == {P[4].keyid}


# ---------------------------------------------------------------------------------------------
# rotation, python-tuf style: (old root keys, threshold) -> (new root keys, threshold), signers
# ---------------------------------------------------------------------------------------------

ROTATION_CASES: list[
    tuple[str, tuple[tuple[int, ...], int], tuple[tuple[int, ...], int], tuple[int, ...], bool]
] = [
    ("1-of-1-same-key", ((0,), 1), ((0,), 1), (0,), True),
    ("1-of-1-key-replaced-both-sign", ((0,), 1), ((1,), 1), (0, 1), True),
    ("1-of-1-key-replaced-old-only", ((0,), 1), ((1,), 1), (0,), False),
    ("1-of-1-key-replaced-new-only", ((0,), 1), ((1,), 1), (1,), False),
    ("2-of-3-one-key-replaced", ((0, 1, 2), 2), ((0, 1, 3), 2), (0, 1), True),
    ("2-of-3-departing-and-arriving-sign", ((0, 1, 2), 2), ((0, 1, 3), 2), (2, 3), False),
    ("2-of-3-one-old-one-new", ((0, 1, 2), 2), ((0, 1, 3), 2), (2, 0), False),
    ("2-of-3-two-old-only-one-new", ((0, 1, 2), 2), ((0, 3, 4), 2), (1, 2, 0), False),
    ("threshold-up-one-signer", ((0, 1, 2), 1), ((0, 1, 2), 2), (0,), False),
    ("threshold-up-two-signers", ((0, 1, 2), 1), ((0, 1, 2), 2), (0, 1), True),
    ("threshold-down-one-signer", ((0, 1, 2), 2), ((0, 1, 2), 1), (0,), False),
    ("threshold-down-two-signers", ((0, 1, 2), 2), ((0, 1, 2), 1), (0, 1), True),
    ("full-replacement-old-only", ((0, 1), 2), ((3, 4), 2), (0, 1), False),
    ("full-replacement-new-only", ((0, 1), 2), ((3, 4), 2), (3, 4), False),
    ("full-replacement-all-sign", ((0, 1), 2), ((3, 4), 2), (0, 1, 3, 4), True),
    ("full-replacement-one-old-two-new", ((0, 1), 2), ((3, 4), 2), (0, 3, 4), False),
]


@pytest.mark.parametrize(
    ("case", "old", "new", "signers", "ok"), ROTATION_CASES, ids=[c[0] for c in ROTATION_CASES]
)
def test_rotation_rule_at_the_verifier(
    case: str,
    old: tuple[tuple[int, ...], int],
    new: tuple[tuple[int, ...], int],
    signers: tuple[int, ...],
    ok: bool,
) -> None:
    """The loader enforces TUF's rule on a root built without our producer's checks."""
    previous = make_root(old[0], old[1])
    data = manual_root(new[0], new[1], signers, version=2)
    if ok:
        rotated = load_trust_root(data, now=NOW, previous=previous)
        assert rotated.version == 2 and set(rotated.root_keys) == {P[i].keyid for i in new[0]}
    else:
        assert _reason(lambda: load_trust_root(data, now=NOW, previous=previous)) is ROTATION
    # Without the previous root only the self-signature counts.
    self_ok = len(set(signers) & set(new[0])) >= new[1]
    if self_ok:
        assert load_trust_root(data, now=NOW).version == 2
    else:
        assert _reason(lambda: load_trust_root(data, now=NOW)) is INVALID


@pytest.mark.parametrize(
    ("case", "old", "new", "signers", "ok"), ROTATION_CASES, ids=[c[0] for c in ROTATION_CASES]
)
def test_rotation_rule_at_the_producer(
    case: str,
    old: tuple[tuple[int, ...], int],
    new: tuple[tuple[int, ...], int],
    signers: tuple[int, ...],
    ok: bool,
) -> None:
    previous = make_root(old[0], old[1])
    add = [P[i] for i in new[0] if i not in old[0]]
    remove = [P[i].keyid for i in old[0] if i not in new[0]]

    def rotate() -> TrustRoot:
        return rotate_root(
            previous,
            signers=[K[i] for i in signers],
            add_root_keys=add,
            remove_root_keyids=remove,
            root_threshold=new[1],
            expires=LATER,
        )

    if ok:
        rotated = rotate()
        assert rotated.version == 2
        assert rotated.root_threshold == new[1]
        assert set(rotated.root_keys) == {P[i].keyid for i in new[0]}
        assert load_trust_root(rotated.to_bytes(), now=NOW, previous=previous) == rotated
    else:
        assert _reason(rotate) is ROTATION


@pytest.mark.parametrize(
    ("case", "version"),
    [("version-skipped", 3), ("version-repeated", 1), ("version-lower", 1)],
)
def test_rotation_version_must_be_next(case: str, version: int) -> None:
    previous = make_root(version=2 if case == "version-lower" else 1)
    data = manual_root((0,), 1, (0,), version=version if case != "version-lower" else 1)
    assert _reason(lambda: load_trust_root(data, now=NOW, previous=previous)) is ROTATION


def test_rotation_of_the_artifact_role() -> None:
    old = make_root(art_idx=(ART,))
    new = rotate_root(
        old,
        signers=[K[0]],
        remove_artifact_keyids=[P[ART].keyid],
        add_artifact_keys=[P[3], P[4]],
        artifact_threshold=2,
        expires=LATER,
    )
    assert set(new.artifact_keys) == {P[3].keyid, P[4].keyid} and new.artifact_threshold == 2
    md = new.metadata()
    assert P[ART].keyid not in md.signed.keys  # no dangling key left behind
    for name in ("snapshot", "timestamp"):
        assert md.signed.roles[name].keyids == md.signed.roles["targets"].keyids
        assert md.signed.roles[name].threshold == 2
    # The new artifact keys sign artifacts; the removed one no longer does.
    good = parse_envelope(sign_envelope(b"{}", [K[3], K[4]]))
    assert verify_signatures(good, new.artifact_keys, new.artifact_threshold).ok
    stale = parse_envelope(sign_envelope(b"{}", [K[ART]]))
    assert not verify_signatures(stale, new.artifact_keys, new.artifact_threshold).ok


def test_rotation_keeps_unchanged_fields_and_bumps_version() -> None:
    old = make_root((0, 1), 1, signers=(0,))
    new = rotate_root(old, signers=[K[0]], expires=LATER + timedelta(days=1))
    assert new.version == 2 and new.expires == LATER + timedelta(days=1)
    assert new.root_keys == old.root_keys and new.artifact_keys == old.artifact_keys


@pytest.mark.parametrize(
    ("case", "kwargs", "reason"),
    [
        ("remove-unknown-root-keyid", {"remove_root_keyids": ["ghost"]}, ROTATION),
        ("remove-unknown-artifact-keyid", {"remove_artifact_keyids": [P[0].keyid]}, ROTATION),
        ("removal-leaves-threshold-above-keys", {"remove_root_keyids": [P[1].keyid]}, INVALID),
        ("new-threshold-above-keys", {"root_threshold": 3}, INVALID),
        ("remove-every-artifact-key", {"remove_artifact_keyids": [P[ART].keyid]}, INVALID),
        ("add-duplicate-key-value", {"add_root_keys": [_alias(P[0], "alias")]}, INVALID),
        ("signer-not-a-root-key", {"signers": [K[0], K[1], K[ART]]}, INVALID),
    ],
)
def test_rotate_root_rejects(case: str, kwargs: dict[str, Any], reason: Reason) -> None:
    old = make_root((0, 1), 2)
    args: dict[str, Any] = {"signers": [K[0], K[1]], "expires": LATER}
    args.update(kwargs)
    assert _reason(lambda: rotate_root(old, **args)) is reason


# ---------------------------------------------------------------------------------------------
# chains
# ---------------------------------------------------------------------------------------------


def _chain(length: int, *, first_expires: datetime = LATER) -> list[TrustRoot]:
    roots = [make_root((0,), 1, expires=first_expires)]
    for i in range(1, length):
        # Each step hands the root role to the next key: both sign.
        roots.append(
            rotate_root(
                roots[-1],
                signers=[K[i - 1], K[i]],
                add_root_keys=[P[i]],
                remove_root_keyids=[P[i - 1].keyid],
                expires=LATER,
            )
        )
    return roots


def test_chain_walks_to_the_newest_root() -> None:
    roots = _chain(4)
    newest = verify_root_chain(roots[0], [r.to_bytes() for r in roots[1:]], NOW)
    assert newest == roots[-1] and newest.version == 4


def test_chain_may_start_with_the_pinned_root() -> None:
    roots = _chain(3)
    assert verify_root_chain(roots[0], [r.to_bytes() for r in roots], NOW) == roots[-1]


def test_empty_chain_returns_the_pinned_root() -> None:
    root = make_root()
    assert verify_root_chain(root, [], NOW) == root


def test_chain_with_a_gap_is_refused() -> None:
    roots = _chain(3)
    assert _reason(lambda: verify_root_chain(roots[0], [roots[2].to_bytes()], NOW)) is ROTATION


def test_chain_out_of_order_is_refused() -> None:
    roots = _chain(3)
    data = [roots[2].to_bytes(), roots[1].to_bytes()]
    assert _reason(lambda: verify_root_chain(roots[0], data, NOW)) is ROTATION


def test_chain_skipping_the_old_key_cannot_jump_ahead() -> None:
    """v3 is signed by K1 and K2 only; from the pinned v1 (key K0) it is unreachable without v2."""
    roots = _chain(3)
    assert _reason(lambda: verify_root_chain(roots[0], [roots[2].to_bytes()], NOW)) is ROTATION
    assert verify_root_chain(roots[1], [roots[2].to_bytes()], NOW) == roots[2]


def test_expired_intermediate_root_is_fine_but_expired_final_is_not() -> None:
    roots = _chain(2, first_expires=NOW - timedelta(days=1))
    assert verify_root_chain(roots[0], [roots[1].to_bytes()], NOW) == roots[1]
    assert _reason(lambda: verify_root_chain(roots[0], [], NOW)) is EXPIRED
    assert _reason(lambda: verify_root_chain(roots[1], [], LATER)) is EXPIRED


def test_malformed_chain_element_is_invalid() -> None:
    assert _reason(lambda: verify_root_chain(make_root(), [b"{}"], NOW)) is INVALID


def test_chain_length_is_bounded() -> None:
    root = make_root()
    too_long = [root.to_bytes()] * (MAX_ROOT_CHAIN + 1)
    assert _reason(lambda: verify_root_chain(root, too_long, NOW)) is ROTATION


# ---------------------------------------------------------------------------------------------
# the trust root decides which signatures count
# ---------------------------------------------------------------------------------------------


def test_root_keys_do_not_sign_artifacts() -> None:
    root = make_root((0,), 1, art_idx=(ART,))
    by_root_key = parse_envelope(sign_envelope(b"{}", [K[0]]))
    result = verify_signatures(by_root_key, root.artifact_keys, root.artifact_threshold)
    assert [f.reason for f in result.findings] == [Reason.SIGNATURE_THRESHOLD]
    by_artifact_key = parse_envelope(sign_envelope(b"{}", [K[ART]]))
    assert verify_signatures(by_artifact_key, root.artifact_keys, root.artifact_threshold).ok


def test_is_expired_follows_tuf() -> None:
    root = make_root(expires=LATER)
    assert not root.is_expired(LATER - timedelta(seconds=1))
    assert root.is_expired(LATER)


# -- reading a trust root from a path (the one reader every caller uses) ---------------------------


def test_read_trust_root_reads_and_verifies(tmp_path: Path) -> None:
    root = make_root()
    path = tmp_path / "root.json"
    path.write_bytes(root.to_bytes())
    assert read_trust_root(path, now=NOW).digest() == root.digest()
    assert read_trust_root(str(path), now=NOW).version == root.version


def _fifo(p: Path) -> None:
    os.mkfifo(p)


READ_FAULTS: list[tuple[str, Callable[[Path], object], Reason, bool]] = [
    ("missing", lambda p: None, Reason.TRUST_ROOT_INVALID, True),
    ("directory", lambda p: p.mkdir(), Reason.TRUST_ROOT_INVALID, True),
    ("fifo", _fifo, Reason.TRUST_ROOT_INVALID, True),
    (
        "too-large",
        lambda p: p.write_bytes(b" " * (MAX_TRUST_ROOT_BYTES + 1)),
        Reason.TRUST_ROOT_INVALID,
        False,
    ),
    ("not-json", lambda p: p.write_bytes(b"{root"), Reason.TRUST_ROOT_INVALID, False),
    (
        "expired",
        lambda p: p.write_bytes(make_root(expires=NOW + timedelta(hours=1)).to_bytes()),
        Reason.TRUST_ROOT_EXPIRED,
        False,
    ),
]


@pytest.mark.parametrize(
    ("make", "reason", "unreadable"), [r[1:] for r in READ_FAULTS], ids=[r[0] for r in READ_FAULTS]
)
def test_read_trust_root_refuses(
    tmp_path: Path, make: Callable[[Path], object], reason: Reason, unreadable: bool
) -> None:
    path = tmp_path / "root.json"
    make(path)
    with pytest.raises(TrustRootError) as info:
        read_trust_root(path, now=NOW + timedelta(days=1))
    assert info.value.reason is reason
    assert isinstance(info.value, TrustRootUnreadable) is unreadable
    assert str(info.value).startswith(str(path))


# ---------------------------------------------------------------------------------------------
# root rollback: the newest root seen is never replaced by an older one (TUF client rule)
# ---------------------------------------------------------------------------------------------


def _forked_v2(roots: list[TrustRoot]) -> TrustRoot:
    """Another v2 than ``roots[1]``, validly rotated from v1 (e.g. by whoever held the v1 key)."""
    return rotate_root(roots[0], signers=[K[0]], expires=LATER - timedelta(days=1))


def _self_signed_v2(roots: list[TrustRoot]) -> TrustRoot:
    """A v2 whose keys never held the root role: signed only by itself."""
    return load_trust_root(manual_root((4,), 1, (4,), version=2), now=NOW)


ROOT_ROLLBACK_CASES: list[
    tuple[str, int | None, Callable[[list[TrustRoot]], TrustRoot], Sequence[int], Reason | None]
] = [
    # (case, index of the root seen before or None, the pinned root, chain indices, outcome)
    ("first-use-trusts-the-pinned-root", None, lambda r: r[0], (), None),
    ("same-root-again", 1, lambda r: r[1], (), None),
    ("next-version-rotated", 0, lambda r: r[1], (), None),
    ("two-versions-ahead-with-the-chain", 0, lambda r: r[2], (1,), None),
    ("chain-in-any-order-and-with-extras", 0, lambda r: r[3], (3, 2, 0, 1), None),
    ("older-root-is-a-rollback", 2, lambda r: r[0], (), Reason.TRUST_ROOT_ROLLBACK),
    ("one-version-back", 1, lambda r: r[0], (), Reason.TRUST_ROOT_ROLLBACK),
    ("same-version-other-root-is-a-fork", 1, _forked_v2, (), ROTATION),
    ("newer-root-not-chained-to-the-seen-one", 0, _self_signed_v2, (), ROTATION),
    ("two-versions-ahead-without-the-chain", 0, lambda r: r[2], (), ROTATION),
    ("chain-with-a-foreign-intermediate", 0, lambda r: r[2], (-1,), ROTATION),
]


@pytest.mark.parametrize(
    ("case", "seen", "pinned", "chain", "reason"),
    ROOT_ROLLBACK_CASES,
    ids=[c[0] for c in ROOT_ROLLBACK_CASES],
)
def test_root_rollback(
    case: str,
    seen: int | None,
    pinned: Callable[[list[TrustRoot]], TrustRoot],
    chain: Sequence[int],
    reason: Reason | None,
) -> None:
    roots = _chain(4)
    foreign = rotate_root(make_root((4,), 1), signers=[K[4]], expires=LATER)  # a v2 of another lineage
    presented = pinned(roots)
    newest_seen = roots[seen].to_bytes() if seen is not None else None
    data = [(foreign if i == -1 else roots[i]).to_bytes() for i in chain]
    if reason is None:
        assert check_root_rollback(presented, newest_seen, data, NOW) == presented
    else:
        assert _reason(lambda: check_root_rollback(presented, newest_seen, data, NOW)) is reason


def test_root_rollback_message_names_both_versions() -> None:
    roots = _chain(2)
    with pytest.raises(TrustRootError, match=r"v1 is older than v2"):
        check_root_rollback(roots[0], roots[1].to_bytes(), [], NOW)
