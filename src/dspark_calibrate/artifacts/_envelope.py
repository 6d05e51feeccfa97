"""DSSE envelopes around in-toto Statements: build, sign, parse strictly, verify signatures.

The signed bytes are DSSE v1's pre-authentication encoding (PAE) of the payload type and the
payload, built here from bytes and pinned by the spec's test vectors (``tests/vectors/dsse``).
Signing goes through securesystemslib's ``dsse.Envelope`` and ``Signer``; verification goes through
:func:`~dspark_calibrate.artifacts._keys.tally_signatures`, which counts unique public keys.

Our envelope profile is stricter than DSSE in two ways, both on the side of refusing: every
signature must carry a ``keyid`` (it selects the key to try; it is never trusted), and no field
other than DSSE's own may appear. Base64 must be canonical (one alphabet, correct padding, no
stray bits); DSSE's standard and URL-safe alphabets are both accepted, as the spec requires.

Performs no file I/O and reads no clock. Deciding what the payload means (payloadType, statement,
predicate) is the verification pipeline's job, after :func:`verify_signatures` has passed.
"""

from __future__ import annotations

import base64
import binascii
import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from securesystemslib.dsse import Envelope
from securesystemslib.signer import Key, Signer

from dspark_calibrate.artifacts._canonical import JsonError, canonical_json, loads_strict
from dspark_calibrate.artifacts._keys import tally_signatures
from dspark_calibrate.artifacts._models import is_sha256_hex
from dspark_calibrate.artifacts._reasons import Finding, Reason
from dspark_calibrate.errors import ConfigError, DsparkError, InvalidValueError
from dspark_calibrate.schemas import PAYLOAD_TYPE

__all__ = [
    "BUNDLE_PREDICATE_TYPE",
    "MAX_ENVELOPE_BYTES",
    "MAX_SIGNATURES",
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "STATEMENT_TYPE",
    "EnvelopeError",
    "ParsedEnvelope",
    "SignatureResult",
    "b64decode_strict",
    "make_statement",
    "pae",
    "parse_envelope",
    "sign_envelope",
    "verify_signatures",
]

#: in-toto Statement v1 ``_type``.
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
#: predicateType of a signed artifact.
PREDICATE_TYPE = "https://dspark-calibrate.dev/artifact/v1"
#: predicateType of a signed bundle manifest.
BUNDLE_PREDICATE_TYPE = "https://dspark-calibrate.dev/bundle/v1"

#: Largest envelope accepted, in bytes of JSON (1 MiB). A real envelope is a few KiB (statement +
#: a handful of signatures); the cap bounds parsing work on a hostile footer or detached file.
MAX_ENVELOPE_BYTES = 1 << 20
#: Most signatures accepted in one envelope. Every signature naming a trusted key is verified
#: (so the result is order-independent), and the cap bounds that work; real envelopes carry one
#: signature per signer, a handful at most.
MAX_SIGNATURES = 32

_ENVELOPE_FIELDS = frozenset({"payload", "payloadType", "signatures"})
_SIGNATURE_FIELDS = frozenset({"keyid", "sig"})
_STD_ALPHABET = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")
_URL_ALPHABET = re.compile(r"^[A-Za-z0-9_-]*={0,2}$")


class EnvelopeError(DsparkError):
    """An envelope that cannot be read: too large, malformed, or without signatures.

    Attributes:
        reason: ``ENVELOPE_TOO_LARGE``, ``ENVELOPE_INVALID`` or ``SIGNATURE_MISSING``.
    """

    def __init__(self, reason: Reason, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class ParsedEnvelope:
    """A syntactically valid DSSE envelope; nothing in it is trusted yet.

    Attributes:
        payload_type: the ``payloadType`` string.
        payload: the decoded payload bytes (parse them only after the signatures verify).
        signatures: ``(keyid, raw signature bytes)`` pairs, in envelope order, duplicates kept.
        encoded: the envelope's canonical JSON when it was given as a mapping (its size was
            measured on these bytes), else None.
    """

    payload_type: str
    payload: bytes
    signatures: tuple[tuple[str, bytes], ...]
    encoded: bytes | None = field(default=None, repr=False, compare=False)

    def pae(self) -> bytes:
        """The bytes every signature must cover."""
        return pae(self.payload_type, self.payload)


@dataclass(frozen=True, slots=True)
class SignatureResult:
    """The outcome of :func:`verify_signatures`.

    Attributes:
        accepted_keyids: one keyid per distinct trusted key with a valid signature, sorted.
        findings: empty when the threshold is met and no trusted key's signature is invalid.
        threshold: the number of distinct trusted keys that had to sign.
    """

    accepted_keyids: tuple[str, ...]
    findings: tuple[Finding, ...]
    threshold: int

    @property
    def ok(self) -> bool:
        """True when the signatures are acceptable."""
        return not self.findings

    def __bool__(self) -> bool:
        return self.ok


# --------------------------------------------------------------------------------------------
# encoding
# --------------------------------------------------------------------------------------------


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding of ``payload_type`` and ``payload``.

    ``"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body``, where type is the UTF-8 encoding of
    ``payload_type`` and LEN is the byte length in ASCII decimal without leading zeros. Lengths are
    of bytes, not characters, so a non-ASCII type cannot shift the boundaries.

    Raises:
        TypeError: ``payload_type`` is not a str or ``payload`` is not bytes-like.
        UnicodeEncodeError: ``payload_type`` holds a lone surrogate (``parse_envelope`` refuses
            such envelopes, so verification never gets here with one).
    """
    if not isinstance(payload_type, str):
        raise TypeError(f"payload_type must be str, got {type(payload_type).__name__}")
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise TypeError(f"payload must be bytes, got {type(payload).__name__}")
    type_bytes = payload_type.encode("utf-8")
    body = bytes(payload)
    return b"".join(
        (
            b"DSSEv1 ",
            str(len(type_bytes)).encode("ascii"),
            b" ",
            type_bytes,
            b" ",
            str(len(body)).encode("ascii"),
            b" ",
            body,
        )
    )


def b64decode_strict(text: str) -> bytes:
    """Decode canonical base64 in DSSE's standard or URL-safe alphabet.

    Accepted: one alphabet only; padding either correct or (URL-safe habit) absent; no whitespace;
    no non-zero bits after the last byte. Every accepted string is the exact encoding of the bytes
    it yields, so a signature or payload has exactly one spelling.

    Raises:
        InvalidValueError: anything else.
    """
    if not isinstance(text, str):
        raise InvalidValueError(f"expected a base64 string, got {type(text).__name__}")
    if _STD_ALPHABET.match(text):
        encode = base64.standard_b64encode
        normalised = text
    elif _URL_ALPHABET.match(text):
        encode = base64.urlsafe_b64encode
        normalised = text.replace("-", "+").replace("_", "/")
    else:
        raise InvalidValueError("not base64 (characters outside one base64 alphabet)")
    unpadded = normalised.rstrip("=")
    if len(unpadded) % 4 == 1:
        raise InvalidValueError("not base64 (impossible length)")
    padded = unpadded + "=" * (-len(unpadded) % 4)
    if normalised != unpadded and normalised != padded:
        raise InvalidValueError("not base64 (wrong padding)")
    try:
        data = base64.b64decode(padded, validate=True)
    except binascii.Error as exc:
        raise InvalidValueError(f"not base64 ({exc})") from exc
    canonical = encode(data).decode("ascii")
    if text not in (canonical, canonical.rstrip("=")):
        # Same bytes, other spelling: non-zero trailing bits.
        raise InvalidValueError("not canonical base64 (non-zero trailing bits)")
    return data


# --------------------------------------------------------------------------------------------
# building and signing
# --------------------------------------------------------------------------------------------


def make_statement(
    subject_name: str, sha256: str, predicate_type: str, predicate: Mapping[str, Any]
) -> dict[str, Any]:
    """An in-toto Statement v1 with one subject.

    Args:
        subject_name: the subject's name (the artifact kind, or ``bundle``).
        sha256: the subject digest, 64 lowercase hex characters (the logical table hash).
        predicate_type: :data:`PREDICATE_TYPE` or :data:`BUNDLE_PREDICATE_TYPE`.
        predicate: the predicate body (deep-copied, so later edits of the caller's dict do not
            change what gets signed).

    Raises:
        InvalidValueError: an empty name or predicate type, or a digest that is not lowercase hex.
    """
    if not isinstance(subject_name, str) or not subject_name:
        raise InvalidValueError(f"subject name must be a non-empty string, got {subject_name!r}")
    if not is_sha256_hex(sha256):
        raise InvalidValueError(f"subject digest must be 64 lowercase hex characters, got {sha256!r}")
    if not isinstance(predicate_type, str) or not predicate_type:
        raise InvalidValueError(f"predicateType must be a non-empty string, got {predicate_type!r}")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {"sha256": sha256}}],
        "predicateType": predicate_type,
        "predicate": copy.deepcopy(dict(predicate)),
    }


def sign_envelope(
    payload: bytes, signers: Sequence[Signer], payload_type: str = PAYLOAD_TYPE
) -> dict[str, Any]:
    """Sign ``payload`` with every signer and return the DSSE JSON envelope.

    Args:
        payload: the serialized statement (canonical JSON bytes).
        signers: one or more signers; each adds one signature (a repeated keyid keeps the last).
        payload_type: the DSSE payloadType.

    Returns:
        ``{"payload": b64, "payloadType": ..., "signatures": [{"keyid": ..., "sig": b64}, ...]}``
        with standard, padded base64.

    Raises:
        ConfigError: no signers, or the envelope would exceed :data:`MAX_ENVELOPE_BYTES` (it could
            never be verified).
        TypeError: ``payload`` is not bytes or ``payload_type`` not str.

    Errors raised by an external signer (network, KMS permission) are not wrapped: their types
    belong to optional client libraries this module does not know.
    """
    if not signers:
        raise ConfigError("no signing key given: pass --key (or an external signer URI)")
    if not isinstance(payload, bytes | bytearray) or not isinstance(payload_type, str):
        raise TypeError("sign_envelope needs payload bytes and a payload_type str")
    envelope = Envelope(bytes(payload), payload_type, {})
    # securesystemslib signs its own PAE; it must equal ours byte for byte (a test pins that).
    for signer in signers:
        envelope.sign(signer)
    result: dict[str, Any] = envelope.to_dict()
    size = len(canonical_json(result))
    if size > MAX_ENVELOPE_BYTES:
        raise ConfigError(
            f"signed envelope is {size} bytes, above the {MAX_ENVELOPE_BYTES}-byte limit verifiers accept; "
            "shrink the summary or provenance"
        )
    return result


# --------------------------------------------------------------------------------------------
# parsing
# --------------------------------------------------------------------------------------------


def _invalid(message: str) -> EnvelopeError:
    return EnvelopeError(Reason.ENVELOPE_INVALID, message)


def _check_fields(obj: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    missing = sorted(allowed - set(obj))
    extra = sorted(set(obj) - allowed)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"unknown {', '.join(repr(e) for e in extra)}")
        raise _invalid(f"{where}: {'; '.join(parts)}; re-sign the artifact")


def _envelope_object(data: Any, max_bytes: int) -> tuple[Mapping[str, Any], bytes | None]:
    """The envelope as a JSON object, measured before it is parsed (bytes) or by its canonical
    size (a mapping, returned with its canonical bytes)."""
    # Size first, before any parsing work is spent on the input.
    encoded: bytes | None = None
    if isinstance(data, bytes | bytearray):
        if len(data) > max_bytes:
            raise EnvelopeError(
                Reason.ENVELOPE_TOO_LARGE,
                f"envelope is {len(data)} bytes, above the {max_bytes}-byte limit; "
                "it was not written by this tool",
            )
        try:
            obj: Any = loads_strict(bytes(data), what="envelope")
        except JsonError as exc:
            raise _invalid(f"{exc}; re-sign the artifact") from exc
    elif isinstance(data, Mapping):
        try:
            encoded = canonical_json(dict(data))
        except JsonError as exc:
            raise _invalid(f"envelope: {exc}; re-sign the artifact") from exc
        size = len(encoded)
        if size > max_bytes:
            raise EnvelopeError(
                Reason.ENVELOPE_TOO_LARGE,
                f"envelope is {size} bytes, above the {max_bytes}-byte limit; "
                "it was not written by this tool",
            )
        obj = data
    else:
        raise _invalid(f"envelope must be a JSON object, got {type(data).__name__}")
    if not isinstance(obj, Mapping):
        raise _invalid("envelope: not a JSON object; re-sign the artifact")
    return obj, encoded


def _signatures(raw_signatures: Any) -> list[tuple[str, bytes]]:
    """``(keyid, signature bytes)`` of each ``signatures`` entry: a non-empty list within
    :data:`MAX_SIGNATURES`, each exactly ``{keyid, sig}`` with canonical base64."""
    if not isinstance(raw_signatures, list):
        raise _invalid("envelope.signatures: must be a list; re-sign the artifact")
    if not raw_signatures:
        raise EnvelopeError(
            Reason.SIGNATURE_MISSING, "envelope.signatures: empty; sign the artifact with a trusted key"
        )
    if len(raw_signatures) > MAX_SIGNATURES:
        raise EnvelopeError(
            Reason.ENVELOPE_TOO_LARGE,
            f"envelope.signatures: {len(raw_signatures)} signatures, above the limit of {MAX_SIGNATURES}",
        )
    signatures: list[tuple[str, bytes]] = []
    for i, entry in enumerate(raw_signatures):
        where = f"envelope.signatures[{i}]"
        if not isinstance(entry, Mapping):
            raise _invalid(f"{where}: must be an object; re-sign the artifact")
        _check_fields(entry, _SIGNATURE_FIELDS, where)
        keyid = entry["keyid"]
        if not isinstance(keyid, str):
            raise _invalid(f"{where}.keyid: must be a string; re-sign the artifact")
        try:
            sig = b64decode_strict(entry["sig"])
        except ValueError as exc:
            raise _invalid(f"{where}.sig: {exc}; re-sign the artifact") from exc
        signatures.append((keyid, sig))
    return signatures


def parse_envelope(data: bytes | Mapping[str, Any], *, max_bytes: int = MAX_ENVELOPE_BYTES) -> ParsedEnvelope:
    """Parse a DSSE JSON envelope strictly, without verifying anything.

    Args:
        data: the envelope's JSON bytes (detached file) or an already-parsed mapping (the footer's
            ``envelope`` value, parsed with ``loads_strict``). A mapping is measured by its
            canonical JSON size.
        max_bytes: size limit.

    Returns:
        The decoded envelope.

    Raises:
        EnvelopeError: ``ENVELOPE_TOO_LARGE`` (bytes or signature count over the limits),
            ``ENVELOPE_INVALID`` (not JSON, duplicate keys, missing/unknown fields, wrong types,
            non-canonical base64), ``SIGNATURE_MISSING`` (an empty ``signatures`` list).
    """
    obj, encoded = _envelope_object(data, max_bytes)
    _check_fields(obj, _ENVELOPE_FIELDS, "envelope")

    payload_type = obj["payloadType"]
    if not isinstance(payload_type, str):
        raise _invalid("envelope.payloadType: must be a string; re-sign the artifact")
    try:
        # JSON can spell lone surrogates ("\ud800"), which have no UTF-8 form and so no PAE.
        payload_type.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _invalid("envelope.payloadType: not encodable as UTF-8; re-sign the artifact") from exc
    try:
        payload = b64decode_strict(obj["payload"])
    except ValueError as exc:
        raise _invalid(f"envelope.payload: {exc}; re-sign the artifact") from exc
    signatures = _signatures(obj["signatures"])
    return ParsedEnvelope(
        payload_type=payload_type, payload=payload, signatures=tuple(signatures), encoded=encoded
    )


# --------------------------------------------------------------------------------------------
# verification
# --------------------------------------------------------------------------------------------


def verify_signatures(env: ParsedEnvelope, keys: Mapping[str, Key], threshold: int) -> SignatureResult:
    """Check that at least ``threshold`` distinct trusted keys signed the envelope's PAE.

    Rules (DSSE multi-signature verification, with TUF's unique-key counting):

    - a signature is tried only with the trusted key its keyid names; unknown keyids are ignored;
    - valid signatures count once per distinct public key value (a repeated keyid, or two keyids
      of one key, is one vote);
    - a signature by a trusted key that does not verify is a ``SIGNATURE_INVALID`` finding even
      when the threshold is met: such an envelope has been tampered with, so it fails closed;
    - fewer than ``threshold`` distinct valid keys is ``SIGNATURE_THRESHOLD``, except that when no
      signature verified and some trusted key's signature was invalid, the one finding is
      ``SIGNATURE_INVALID`` (the clearer cause).

    Never raises on bad signatures or malformed trusted keys.

    Args:
        env: the parsed envelope.
        keys: keyid -> trusted key (the trust root's artifact-signing keys).
        threshold: distinct keys required (>= 1).

    Returns:
        The accepted keyids and the findings (empty when acceptable).

    Raises:
        InvalidValueError: ``threshold`` < 1 (a caller bug; a trust root never has one).
    """
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise InvalidValueError(f"signature threshold must be an integer >= 1, got {threshold!r}")
    tally = tally_signatures(env.pae(), env.signatures, keys)
    accepted, invalid = tally.accepted_keyids, tally.invalid_keyids
    findings: list[Finding] = []
    threshold_met = len(accepted) >= threshold
    invalid_finding = Finding(
        Reason.SIGNATURE_INVALID,
        f"signature by trusted key(s) {', '.join(invalid)} does not verify over the payload; "
        "the envelope or its payload was altered: re-sign the artifact",
        actual=list(invalid),
    )
    if not threshold_met:
        if not accepted and invalid:
            findings.append(invalid_finding)
        else:
            ignored = (
                f"; signatures by unknown keyids ignored: {', '.join(tally.unknown_keyids)}"
                if (tally.unknown_keyids)
                else ""
            )
            findings.append(
                Finding(
                    Reason.SIGNATURE_THRESHOLD,
                    f"signed by {len(accepted)} distinct trusted key(s), {threshold} required{ignored}; "
                    "sign with more keys listed in the trust root's targets role",
                    expected=threshold,
                    actual=len(accepted),
                )
            )
            if invalid:
                findings.append(invalid_finding)
    elif invalid:
        findings.append(invalid_finding)
    return SignatureResult(accepted_keyids=accepted, findings=tuple(findings), threshold=threshold)
