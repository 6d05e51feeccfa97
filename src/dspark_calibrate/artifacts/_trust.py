"""The trust root: a real TUF ``root.json`` saying which keys may sign evidence (DESIGN §4).

Built on python-tuf's metadata API (``Metadata[Root]``). Two roles matter:

- ``root``: the keys and threshold that sign the trust root itself, and so control rotation;
- ``targets``: the *artifact-signing* role, the keys and threshold that must sign every artifact
  and bundle manifest. ``snapshot`` and ``timestamp`` mirror ``targets`` so the document is a
  well-formed TUF root; nothing here uses them.

Rules enforced, each with its reason code:

- ``TRUST_ROOT_INVALID``: not strict JSON, not a TUF root, unknown fields, an unsupported key
  type, one key value under two keyids, a threshold outside 1..number of keys, or fewer than the
  root threshold of distinct root keys signing it (or a root key's signature that is invalid);
- ``TRUST_ROOT_EXPIRED``: ``now`` is at or past ``expires``;
- ``TRUST_ROOT_ROTATION_INVALID``: against a previous root, the version is not previous + 1, or
  the signatures do not meet *both* the previous root threshold and the new one (TUF's rule);
- ``TRUST_ROOT_ROLLBACK``: the pinned root is older than the newest root this verifier already
  accepted (:func:`check_root_rollback`; the newest root is kept in the rollback state).

Thresholds count distinct public key values, never keyids. Performs no file I/O and reads no
clock: callers pass the bytes and ``now``. Writing ``root.json`` (atomically) is the caller's job.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

from securesystemslib.signer import Key, Signer
from tuf.api.exceptions import UnsignedMetadataError
from tuf.api.metadata import Metadata, Role, Root
from tuf.api.serialization import SerializationError

from dspark_calibrate.artifacts._canonical import JsonError, canonical_json, loads_strict
from dspark_calibrate.artifacts._files import FileTooLarge, read_regular_file
from dspark_calibrate.artifacts._keys import check_supported_key, key_identity, tally_signatures
from dspark_calibrate.artifacts._reasons import Reason
from dspark_calibrate.errors import ConfigError, DsparkError

__all__ = [
    "ARTIFACT_ROLE",
    "MAX_ROOT_CHAIN",
    "MAX_TRUST_ROOT_BYTES",
    "ROOT_ROLE",
    "TrustRoot",
    "TrustRootError",
    "TrustRootUnreadable",
    "check_root_rollback",
    "init_root",
    "load_seen_root",
    "load_trust_root",
    "read_trust_root",
    "rotate_root",
    "single_key_root",
    "verify_root_chain",
]

#: TUF role whose keys sign the trust root (and so control rotation).
ROOT_ROLE = "root"
#: TUF role whose keys sign artifacts and bundle manifests.
ARTIFACT_ROLE = "targets"
# Roles a TUF root must define; here they only mirror the artifact role.
_MIRROR_ROLES = ("snapshot", "timestamp")

#: Largest root.json accepted, in bytes. A root with a dozen keys is a few KiB.
MAX_TRUST_ROOT_BYTES = 1 << 20
#: Most rotations walked by :func:`verify_root_chain` (python-tuf's client uses the same bound by
#: default), so a hostile chain cannot make a verifier loop for long.
MAX_ROOT_CHAIN = 256


class TrustRootError(DsparkError):
    """A trust root that cannot be trusted, or a root operation that would produce one.

    Attributes:
        reason: ``TRUST_ROOT_INVALID``, ``TRUST_ROOT_EXPIRED`` or ``TRUST_ROOT_ROTATION_INVALID``.
    """

    def __init__(self, reason: Reason, message: str) -> None:
        self.reason = reason
        super().__init__(message)


class TrustRootUnreadable(TrustRootError):
    """The trust root file could not be read: missing, not a regular file, or an I/O error.

    Its reason is ``TRUST_ROOT_INVALID``, like every root that cannot be used; the class lets a
    command line tell a wrong path (exit 2) from a bad root (exit 1).
    """


def _invalid(message: str) -> TrustRootError:
    return TrustRootError(Reason.TRUST_ROOT_INVALID, message)


def _rotation(message: str) -> TrustRootError:
    return TrustRootError(Reason.TRUST_ROOT_ROTATION_INVALID, message)


@dataclass(frozen=True, slots=True)
class TrustRoot:
    """A verified trust root. Made only by :func:`init_root`, :func:`rotate_root`,
    :func:`load_trust_root` and :func:`verify_root_chain`.

    Two roots are equal when their canonical bytes are equal.

    Attributes:
        raw: canonical JSON bytes of the whole root (signatures included).
        version: the root version (rotation increments it by one).
        expires: when the root stops being acceptable (UTC).
        root_keys: keyid -> key of the ``root`` role.
        root_threshold: distinct root keys needed to sign the root (and a rotation).
        artifact_keys: keyid -> key of the ``targets`` role (the artifact signers).
        artifact_threshold: distinct artifact keys needed to sign an artifact or bundle.
    """

    raw: bytes = field(repr=False)
    version: int = field(compare=False)
    expires: datetime = field(compare=False)
    root_keys: Mapping[str, Key] = field(compare=False, repr=False)
    root_threshold: int = field(compare=False)
    artifact_keys: Mapping[str, Key] = field(compare=False, repr=False)
    artifact_threshold: int = field(compare=False)

    def to_bytes(self) -> bytes:
        """The canonical ``root.json`` bytes (sorted keys, no whitespace), ready to write."""
        return self.raw

    def digest(self) -> str:
        """SHA-256 (lowercase hex) of :meth:`to_bytes`: what an operator pins."""
        return hashlib.sha256(self.raw).hexdigest()

    def keyids(self) -> tuple[str, ...]:
        """Every keyid of the root and artifact roles, sorted, unique."""
        return tuple(sorted(set(self.root_keys) | set(self.artifact_keys)))

    def metadata(self) -> Metadata[Root]:
        """A fresh, mutable python-tuf copy of this root (edits do not affect ``self``)."""
        parsed: Metadata[Root] = Metadata.from_dict(loads_strict(self.raw, what="trust root"))
        return parsed

    def is_expired(self, now: datetime) -> bool:
        """True when ``now`` is at or past :attr:`expires` (TUF's rule)."""
        return _aware(now, "now") >= self.expires

    def summary(self) -> dict[str, Any]:
        """A JSON-ready description for ``trust show`` (keyids, types, thresholds; no key values)."""

        def role(keys: Mapping[str, Key], threshold: int) -> dict[str, Any]:
            return {
                "threshold": threshold,
                "keys": [
                    {"keyid": keyid, "keytype": key.keytype, "scheme": key.scheme}
                    for keyid, key in sorted(keys.items())
                ],
            }

        return {
            "version": self.version,
            "expires": _fmt(self.expires),
            "sha256": self.digest(),
            "root": role(self.root_keys, self.root_threshold),
            "artifact_signing": role(self.artifact_keys, self.artifact_threshold),
        }


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _fmt(t: datetime) -> str:
    """TUF's timestamp form, e.g. ``2030-01-01T00:00:00Z``."""
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _aware(value: datetime, name: str) -> datetime:
    """``value`` in UTC; a naive datetime is a caller bug (ambiguous time zone)."""
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise TypeError(f"{name} must be a timezone-aware datetime, got {value!r}")
    return value.astimezone(UTC)


def _role_keys(root: Root, role_name: str) -> dict[str, Key]:
    role = root.roles[role_name]
    return {keyid: root.keys[keyid] for keyid in role.keyids}


def _check_structure(md: Metadata[Root]) -> Root:
    """Everything about a root that does not involve signatures or time.

    Raises:
        TrustRootError: TRUST_ROOT_INVALID, naming the field.
    """
    root = md.signed
    if not isinstance(root, Root):
        raise _invalid(f"trust root: signed._type is {root.type!r}, expected 'root'")
    # Unknown fields are refused at every level: a root is a security policy, and a field the
    # verifier ignores could be one its author meant to restrict something.
    if md.unrecognized_fields:
        raise _invalid(f"trust root: unknown top-level field(s) {sorted(md.unrecognized_fields)}")
    if root.unrecognized_fields:
        raise _invalid(f"trust root: unknown field(s) in signed: {sorted(root.unrecognized_fields)}")
    if isinstance(root.version, bool) or not isinstance(root.version, int):
        raise _invalid(f"trust root: signed.version must be an integer, got {root.version!r}")
    for keyid, sig in md.signatures.items():
        if sig.unrecognized_fields:
            raise _invalid(f"trust root: unknown field(s) in the signature by {keyid}")
    identities: dict[bytes, str] = {}
    for keyid, key in root.keys.items():
        if key.unrecognized_fields:
            raise _invalid(f"trust root: unknown field(s) in signed.keys[{keyid}]")
        try:
            check_supported_key(key)
        except ValueError as exc:
            raise _invalid(f"trust root: signed.keys: {exc}") from exc
        identity = key_identity(key)
        if identity in identities:
            # Two keyids for one key would let one key holder count twice toward a threshold.
            raise _invalid(
                f"trust root: keyids {identities[identity]} and {keyid} name the same public key; "
                "list each key once"
            )
        identities[identity] = keyid
    for role_name, role in root.roles.items():
        if role.unrecognized_fields:
            raise _invalid(f"trust root: unknown field(s) in signed.roles.{role_name}")
        if isinstance(role.threshold, bool) or not isinstance(role.threshold, int):
            raise _invalid(f"trust root: signed.roles.{role_name}.threshold must be an integer")
        missing = sorted(k for k in role.keyids if k not in root.keys)
        if missing:
            raise _invalid(f"trust root: signed.roles.{role_name} names unknown keyid(s) {missing}")
    for role_name in (ROOT_ROLE, ARTIFACT_ROLE):
        role = root.roles[role_name]
        if not role.keyids:
            raise _invalid(f"trust root: signed.roles.{role_name} has no keys")
        if role.threshold > len(role.keyids):
            raise _invalid(
                f"trust root: signed.roles.{role_name}.threshold is {role.threshold} but the role has only "
                f"{len(role.keyids)} key(s); lower the threshold or add keys"
            )
    return root


def _signature_pairs(md: Metadata[Root]) -> list[tuple[str, bytes]]:
    pairs = []
    for keyid, sig in md.signatures.items():
        try:
            pairs.append((keyid, bytes.fromhex(sig.signature)))
        except (ValueError, TypeError) as exc:
            raise _invalid(f"trust root: the signature by {keyid} is not hex") from exc
    return pairs


def _check_threshold(
    md: Metadata[Root],
    signatures: list[tuple[str, bytes]],
    keys: Mapping[str, Key],
    threshold: int,
    *,
    who: str,
    error: Callable[[str], TrustRootError],
) -> None:
    """Require ``threshold`` distinct ``keys`` to have signed ``md``, and none to have signed badly."""
    try:
        signed_bytes = md.signed_bytes
    except SerializationError as exc:
        # TUF's canonical JSON cannot encode what was parsed (e.g. a string with a lone
        # surrogate): nothing can have signed it.
        raise _invalid(
            f"trust root: the signed part cannot be encoded as TUF canonical JSON ({exc.__cause__ or exc}); "
            "restore root.json from its signer"
        ) from exc
    tally = tally_signatures(signed_bytes, signatures, keys)
    if tally.invalid_keyids:
        raise error(
            f"trust root v{md.signed.version}: the signature by {who} key(s) "
            f"{', '.join(tally.invalid_keyids)} does not verify; the file was altered: "
            "restore it from the signer"
        )
    if len(tally.accepted_keyids) < threshold:
        raise error(
            f"trust root v{md.signed.version}: signed by {len(tally.accepted_keyids)} distinct {who} key(s), "
            f"{threshold} required; collect signatures from more {who} keys"
        )


def _first_float(obj: Any) -> str | None:
    """The JSON path of the first non-integer number in ``obj``, or None (iterative: any depth)."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, float):
            return where or "the document"
        if isinstance(value, dict):
            stack.extend((f"{where}.{k}" if where else str(k), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None


def _parse(data: bytes) -> Metadata[Root]:
    """Strict JSON, then python-tuf's parser, then our structural rules."""
    if not isinstance(data, bytes | bytearray):
        raise TypeError(f"trust root data must be bytes, got {type(data).__name__}")
    if len(data) > MAX_TRUST_ROOT_BYTES:
        raise _invalid(f"trust root: {len(data)} bytes, above the {MAX_TRUST_ROOT_BYTES}-byte limit")
    try:
        obj = loads_strict(bytes(data), what="trust root")
    except JsonError as exc:
        raise _invalid(f"{exc}; restore root.json from its signer") from exc
    if not isinstance(obj, dict):
        raise _invalid("trust root: not a JSON object")
    # TUF's canonical JSON has integers only: a root holding a fraction or an exponent cannot have
    # been signed (python-tuf would fail to re-encode it while checking signatures).
    at = _first_float(obj)
    if at is not None:
        raise _invalid(
            f"trust root: {at} is a number with a fraction or an exponent; TUF metadata holds integers "
            "only: restore root.json from its signer"
        )
    signed = obj.get("signed")
    if isinstance(signed, dict) and signed.get("_type") != ROOT_ROLE:
        raise _invalid(
            f"trust root: signed._type is {signed.get('_type')!r}, expected 'root'; pass root.json"
        )
    try:
        # python-tuf's parser reports malformed input with these built-in exceptions.
        md: Metadata[Root] = Metadata.from_dict(obj)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise _invalid(f"trust root: not a valid TUF root ({type(exc).__name__}: {exc})") from exc
    _check_structure(md)
    return md


def _to_trust_root(md: Metadata[Root]) -> TrustRoot:
    root = md.signed
    return TrustRoot(
        raw=canonical_json(md.to_dict()),
        version=root.version,
        expires=root.expires,
        root_keys=MappingProxyType(_role_keys(root, ROOT_ROLE)),
        root_threshold=root.roles[ROOT_ROLE].threshold,
        artifact_keys=MappingProxyType(_role_keys(root, ARTIFACT_ROLE)),
        artifact_threshold=root.roles[ARTIFACT_ROLE].threshold,
    )


def _verify(md: Metadata[Root], previous: TrustRoot | None) -> TrustRoot:
    """Signature and rotation checks on a structurally valid root (no expiry check)."""
    root = md.signed
    signatures = _signature_pairs(md)
    if previous is None:
        _check_threshold(
            md,
            signatures,
            _role_keys(root, ROOT_ROLE),
            root.roles[ROOT_ROLE].threshold,
            who="root",
            error=_invalid,
        )
        return _to_trust_root(md)
    # (rotation) TUF: version exactly previous + 1, signed by the previous root's threshold of its
    # root keys AND by the new root's own threshold. The old threshold stops a thief of new keys;
    # the new threshold proves the new key holders accepted the role.
    if root.version != previous.version + 1:
        raise _rotation(
            f"trust root: version {root.version} does not follow the trusted version {previous.version} "
            f"(expected {previous.version + 1}); apply rotations in order"
        )
    _check_threshold(
        md,
        signatures,
        previous.root_keys,
        previous.root_threshold,
        who=f"previous (v{previous.version}) root",
        error=_rotation,
    )
    _check_threshold(
        md,
        signatures,
        _role_keys(root, ROOT_ROLE),
        root.roles[ROOT_ROLE].threshold,
        who="new root",
        error=_rotation,
    )
    return _to_trust_root(md)


#: Distinct roots kept verified, by their bytes (a process sees one pinned root, a few during a
#: rotation); the least recently used goes first.
_VERIFIED_ROOTS_MAX = 8
#: Largest root kept verified, in bytes (a root with a dozen keys is a few KiB), so the cache
#: holds at most 8 x 64 KiB; a larger root is verified every time.
_VERIFIED_ROOT_MAX_BYTES = 64 << 10


def _verified_root(data: bytes) -> TrustRoot:
    """``data`` parsed and verified on its own (structure and its root role's signatures), or the
    root verified earlier in this process from exactly these bytes.

    A serving process loads the same pinned root on every admission; parsing it and checking its
    signatures again cost ~0.7 ms each time. Only success is kept (a refused root is checked
    afresh every time), only for a root verified on its own (a rotation's check depends on the
    previous root too), and never expiry, which depends on ``now``. Any other bytes, even one
    changed byte, miss the cache and are verified in full.

    Raises:
        TrustRootError: ``TRUST_ROOT_INVALID``.
        TypeError: ``data`` is not bytes.
    """
    if isinstance(data, bytes | bytearray) and len(data) <= _VERIFIED_ROOT_MAX_BYTES:
        return _verified_root_of(bytes(data))
    return _verify(_parse(data), None)


@functools.lru_cache(maxsize=_VERIFIED_ROOTS_MAX)
def _verified_root_of(data: bytes) -> TrustRoot:
    # lru_cache keeps returned roots only: an exception (a refused root) is never cached.
    return _verify(_parse(data), None)


def _check_expiry(trust_root: TrustRoot, now: datetime) -> None:
    if trust_root.is_expired(now):
        raise TrustRootError(
            Reason.TRUST_ROOT_EXPIRED,
            f"trust root v{trust_root.version} expired at {_fmt(trust_root.expires)}; "
            "rotate it with `dspark-calibrate trust rotate --expires ...`",
        )


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def load_trust_root(data: bytes, *, now: datetime, previous: TrustRoot | None = None) -> TrustRoot:
    """Parse and verify ``root.json`` bytes.

    Checks, in order: strict JSON (no duplicate keys), TUF root structure and our rules, then
    signatures (by the root's own threshold, or with ``previous`` the rotation rule), then expiry.

    Args:
        data: the file's bytes.
        now: the current time (timezone-aware).
        previous: the currently trusted root, when ``data`` is meant to rotate it.

    Raises:
        TrustRootError: ``TRUST_ROOT_INVALID``, ``TRUST_ROOT_ROTATION_INVALID`` or
            ``TRUST_ROOT_EXPIRED``.
        TypeError: ``now`` is naive or ``data`` is not bytes.
    """
    _aware(now, "now")
    trust_root = _verify(_parse(data), previous) if previous is not None else _verified_root(data)
    _check_expiry(trust_root, now)
    return trust_root


def read_trust_root(path: Path | str, *, now: datetime, previous: TrustRoot | None = None) -> TrustRoot:
    """Read ``root.json`` from ``path`` and verify it: the one way every caller reads a trust root.

    The file is opened non-blocking and checked on the open descriptor, so a FIFO or device put
    where the root should be is refused instead of hanging a serving start; at most
    :data:`MAX_TRUST_ROOT_BYTES` are read. Then :func:`load_trust_root`.

    Args:
        path: the pinned ``root.json``.
        now: the current time (timezone-aware).
        previous: the currently trusted root, when the file is meant to rotate it.

    Raises:
        TrustRootUnreadable: missing, unreadable or not a regular file (``TRUST_ROOT_INVALID``).
        TrustRootError: larger than the cap (``TRUST_ROOT_INVALID``), or what
            :func:`load_trust_root` raises; every message starts with the path.
    """
    p = Path(path)
    try:
        data = read_regular_file(p, MAX_TRUST_ROOT_BYTES)
    except FileTooLarge:
        raise _invalid(f"{p}: larger than {MAX_TRUST_ROOT_BYTES} bytes; not a trust root") from None
    except OSError as exc:
        raise TrustRootUnreadable(
            Reason.TRUST_ROOT_INVALID,
            f"{p}: cannot read the trust root ({exc.strerror or exc}); pass the pinned root.json",
        ) from exc
    try:
        return load_trust_root(data, now=now, previous=previous)
    except TrustRootError as exc:
        raise TrustRootError(exc.reason, f"{p}: {exc}") from exc


def verify_root_chain(pinned: TrustRoot, chain: Sequence[bytes], now: datetime) -> TrustRoot:
    """Walk rotations from a pinned root to the newest one, TUF-style.

    Each element must be the next version, signed by the thresholds of the root before it and of
    itself. An element identical (same canonical bytes) to the current root is skipped, so the
    chain may start with the pinned root. Intermediate roots may have expired (they were trusted
    in their time); only the final root must be unexpired.

    Args:
        pinned: the root the verifier was configured with.
        chain: ``root.json`` bytes of later versions, in version order.
        now: the current time (timezone-aware).

    Returns:
        The newest verified root.

    Raises:
        TrustRootError: a broken link (``TRUST_ROOT_ROTATION_INVALID``), a malformed element
            (``TRUST_ROOT_INVALID``), or an expired final root (``TRUST_ROOT_EXPIRED``).
    """
    _aware(now, "now")
    if len(chain) > MAX_ROOT_CHAIN:
        raise _rotation(f"trust root chain has {len(chain)} elements, above the limit of {MAX_ROOT_CHAIN}")
    current = pinned
    for data in chain:
        md = _parse(data)
        if canonical_json(md.to_dict()) == current.raw:
            continue
        current = _verify(md, current)
    _check_expiry(current, now)
    return current


def load_seen_root(data: bytes) -> TrustRoot:
    """A root accepted before (the one the rollback state keeps): parsed and its own signatures
    checked; expiry does not matter, it was trusted in its time.

    Raises:
        TrustRootError: ``TRUST_ROOT_INVALID`` (the stored bytes are not a valid root).
    """
    return _verified_root(data)


def check_root_rollback(
    presented: TrustRoot, newest_seen: bytes | TrustRoot | None, chain: Sequence[bytes], now: datetime
) -> TrustRoot:
    """Refuse a pinned root older than the newest one accepted before, TUF-client style.

    A root newer than ``newest_seen`` is accepted only through a valid rotation chain from it:
    every version in between (taken from ``chain``, in any order) and then ``presented``, each
    signed by the thresholds of the root before it and of itself. The same version must be the
    same root (two different roots of one version are a fork, not a rotation).

    Args:
        presented: the pinned root, already verified on its own (signatures, expiry).
        newest_seen: the newest root accepted before (its canonical bytes, or as loaded by
            :func:`load_seen_root`), or None (first use: ``presented`` is trusted as pinned).
        chain: ``root.json`` bytes of intermediate versions; elements outside
            (newest_seen.version, presented.version) are ignored.
        now: the current time (timezone-aware).

    Returns:
        ``presented``, when acceptable.

    Raises:
        TrustRootError: ``TRUST_ROOT_ROLLBACK`` (older than the newest seen),
            ``TRUST_ROOT_ROTATION_INVALID`` (same version but another root, or no valid chain),
            ``TRUST_ROOT_INVALID`` (a malformed chain element).
    """
    _aware(now, "now")
    raw = newest_seen.raw if isinstance(newest_seen, TrustRoot) else newest_seen
    if raw is None or raw == presented.raw:
        return presented  # first use, or the root accepted before (every start but a rotation)
    seen = newest_seen if isinstance(newest_seen, TrustRoot) else load_seen_root(raw)
    if presented.version < seen.version:
        raise TrustRootError(
            Reason.TRUST_ROOT_ROLLBACK,
            f"trust root v{presented.version} is older than v{seen.version} already accepted here; an older "
            f"root may trust keys that v{seen.version} revoked: pin root.json v{seen.version} or later",
        )
    if presented.version == seen.version:
        if presented.raw != seen.raw:
            raise _rotation(
                f"trust root v{presented.version} (sha256 {presented.digest()}) is not the v{seen.version} "
                f"accepted here (sha256 {seen.digest()}); two roots of one version are a fork: pin "
                "the accepted root, or start a new state file if you replaced the trust root on purpose"
            )
        return presented
    between: dict[int, bytes] = {}
    for data in chain:
        version = _parse(data).signed.version
        if seen.version < version < presented.version:
            between.setdefault(version, data)
    missing = [v for v in range(seen.version + 1, presented.version) if v not in between]
    if missing:
        raise _rotation(
            f"trust root v{presented.version} cannot be reached from v{seen.version} accepted here: "
            f"intermediate root(s) {missing} not given; pass every root.json in between as a rotation chain"
        )
    newest = verify_root_chain(seen, [*(between[v] for v in sorted(between)), presented.raw], now)
    if newest != presented:  # pragma: no cover - verify_root_chain ends at its last element
        raise _rotation(f"trust root v{presented.version}: the rotation chain ends elsewhere")
    return presented


def _unique_keys(keys: Iterable[Key], what: str) -> list[Key]:
    """Validate keys given to init/rotate: supported, and no key value listed twice."""
    seen: dict[bytes, str] = {}
    out = []
    for key in keys:
        try:
            check_supported_key(key)
        except ValueError as exc:
            raise _invalid(f"{what}: {exc}") from exc
        identity = key_identity(key)
        if identity in seen:
            raise _invalid(f"{what}: the same public key is given twice ({seen[identity]}, {key.keyid})")
        seen[identity] = key.keyid
        out.append(key)
    return out


def _check_threshold_arg(threshold: int, n_keys: int, what: str) -> None:
    if n_keys == 0:
        raise _invalid(f"no {what} keys given; the {what} role needs at least one key")
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise _invalid(f"{what} threshold must be an integer >= 1, got {threshold!r}")
    if threshold > n_keys:
        raise _invalid(f"{what} threshold {threshold} exceeds its {n_keys} key(s); add keys or lower it")


def _mirror_artifact_role(root: Root) -> None:
    targets = root.roles[ARTIFACT_ROLE]
    for name in _MIRROR_ROLES:
        root.roles[name] = Role(list(targets.keyids), targets.threshold)


def _sign_all(md: Metadata[Root], signers: Sequence[Signer], allowed: Iterable[Mapping[str, Key]]) -> None:
    """Sign with every signer, refusing a signer whose key is in none of the ``allowed`` roles.

    A stray signature (say, by an artifact key) would be ignored by verifiers, but it almost
    always means the wrong key file was passed, so it is refused here instead.
    """
    allowed_ids = {key_identity(k) for keys in allowed for k in keys.values()}
    if not signers:
        raise _invalid("no root signer given; pass the root private key(s)")
    for signer in signers:
        public = signer.public_key
        try:
            identity = key_identity(public)
        except ValueError as exc:
            raise _invalid(f"root signer {public.keyid}: {exc}") from exc
        if identity not in allowed_ids:
            raise _invalid(
                f"signer {public.keyid} is not a root key of this trust root; pass the root key(s), "
                "not an artifact-signing key"
            )
        try:
            md.sign(signer, append=True)
        except UnsignedMetadataError as exc:
            raise ConfigError(f"root signer {public.keyid}: signing failed ({exc})") from exc


def init_root(
    *,
    root_signers: Sequence[Signer],
    root_keys: Sequence[Key],
    root_threshold: int,
    artifact_keys: Sequence[Key],
    artifact_threshold: int,
    expires: datetime,
    version: int = 1,
) -> TrustRoot:
    """Create and sign a new trust root.

    Args:
        root_signers: signers for at least ``root_threshold`` of ``root_keys``.
        root_keys: keys of the ``root`` role.
        root_threshold: distinct root keys needed to sign the root and its rotations.
        artifact_keys: keys of the artifact-signing (``targets``) role.
        artifact_threshold: distinct artifact keys needed to sign an artifact.
        expires: expiry of the root (timezone-aware; stored in UTC, whole seconds).
        version: the root version (1 for a new deployment).

    Returns:
        The verified root; write ``to_bytes()`` to ``root.json``.

    Raises:
        TrustRootError: ``TRUST_ROOT_INVALID`` for a bad threshold, duplicate or unsupported keys,
            a signer that is not a root key, or too few root signers.
        ConfigError: a signer failed to sign.
        TypeError: ``expires`` is naive.
    """
    expires_utc = _aware(expires, "expires").replace(microsecond=0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _invalid(f"trust root version must be an integer >= 1, got {version!r}")
    roots = _unique_keys(root_keys, "root keys")
    artifacts = _unique_keys(artifact_keys, "artifact keys")
    _check_threshold_arg(root_threshold, len(roots), "root")
    _check_threshold_arg(artifact_threshold, len(artifacts), "artifact")
    root = Root(version=version, expires=expires_utc)
    for key in roots:
        root.add_key(key, ROOT_ROLE)
    for key in artifacts:
        root.add_key(key, ARTIFACT_ROLE)
    root.roles[ROOT_ROLE].threshold = root_threshold
    root.roles[ARTIFACT_ROLE].threshold = artifact_threshold
    _mirror_artifact_role(root)
    md = Metadata(root)
    _check_structure(md)  # e.g. one key value under two keyids across the two roles
    _sign_all(md, root_signers, [_role_keys(root, ROOT_ROLE)])
    # Round-trip through the loader so that whatever we create, a verifier accepts.
    return _verify(_parse(canonical_json(md.to_dict())), None)


def single_key_root(key: Key, *, now: datetime) -> TrustRoot:
    """An in-memory trust root whose only artifact (and root) key is ``key``, threshold 1.

    For one-key setups (``dspark-verify --key pub.pem``, as ``cosign verify --key``): every
    artifact check runs exactly as with a pinned ``root.json``, but there is no rotation, no
    trust-root rollback and nothing to pin beyond the public key itself. It is never signed and
    never written; it expires a day after ``now``.

    Raises:
        TrustRootError: ``TRUST_ROOT_INVALID`` for an unsupported key.
        TypeError: ``now`` is naive.
    """
    start = _aware(now, "now").replace(microsecond=0)
    keys = _unique_keys([key], "artifact keys")
    root = Root(version=1, expires=start + timedelta(days=1))
    root.add_key(keys[0], ROOT_ROLE)
    root.add_key(keys[0], ARTIFACT_ROLE)
    _mirror_artifact_role(root)
    md = Metadata(root)
    _check_structure(md)
    return _to_trust_root(md)


def rotate_root(
    old: TrustRoot,
    *,
    signers: Sequence[Signer],
    add_root_keys: Sequence[Key] = (),
    remove_root_keyids: Sequence[str] = (),
    root_threshold: int | None = None,
    add_artifact_keys: Sequence[Key] = (),
    remove_artifact_keyids: Sequence[str] = (),
    artifact_threshold: int | None = None,
    expires: datetime,
) -> TrustRoot:
    """Create the next root version from ``old``, signed for a valid TUF rotation.

    Removals are applied before additions; a threshold left as ``None`` keeps its old value.

    Args:
        old: the currently trusted root.
        signers: root signers; together they must meet ``old``'s root threshold *and* the new
            root threshold (a signer may count for both when its key is in both).
        add_root_keys / remove_root_keyids: changes to the ``root`` role.
        root_threshold: the new root threshold.
        add_artifact_keys / remove_artifact_keyids: changes to the artifact-signing role.
        artifact_threshold: the new artifact threshold.
        expires: expiry of the new root (timezone-aware).

    Returns:
        The new root (version ``old.version + 1``).

    Raises:
        TrustRootError: ``TRUST_ROOT_ROTATION_INVALID`` when a keyid to remove is not in its role
            or the signers do not meet both thresholds; ``TRUST_ROOT_INVALID`` when the new root
            itself would be invalid (threshold above its keys, duplicate or unsupported keys).
        ConfigError: a signer failed to sign.
        TypeError: ``expires`` is naive.
    """
    expires_utc = _aware(expires, "expires").replace(microsecond=0)
    md = old.metadata()
    md.signatures.clear()
    root = md.signed
    root.version = old.version + 1
    root.expires = expires_utc
    for role_name, removals in ((ROOT_ROLE, remove_root_keyids), (ARTIFACT_ROLE, remove_artifact_keyids)):
        for keyid in removals:
            if keyid not in root.roles[role_name].keyids:
                raise _rotation(
                    f"keyid {keyid} is not in the {role_name} role of v{old.version}; nothing to remove"
                )
            root.revoke_key(keyid, role_name)
    # Mirror roles may still reference removed keys until re-mirrored; do it before adding keys
    # so that revoke_key's "key still used elsewhere" bookkeeping stays right.
    _mirror_artifact_role(root)
    for unused in [k for k in root.keys if not any(k in role.keyids for role in root.roles.values())]:
        del root.keys[unused]
    for role_name, additions in ((ROOT_ROLE, add_root_keys), (ARTIFACT_ROLE, add_artifact_keys)):
        for key in _unique_keys(additions, f"added {role_name} keys"):
            root.add_key(key, role_name)
    if root_threshold is not None:
        _check_threshold_arg(root_threshold, len(root.roles[ROOT_ROLE].keyids), "root")
        root.roles[ROOT_ROLE].threshold = root_threshold
    if artifact_threshold is not None:
        _check_threshold_arg(artifact_threshold, len(root.roles[ARTIFACT_ROLE].keyids), "artifact")
        root.roles[ARTIFACT_ROLE].threshold = artifact_threshold
    _mirror_artifact_role(root)
    _check_structure(md)
    _sign_all(md, signers, [old.root_keys, _role_keys(root, ROOT_ROLE)])
    return _verify(_parse(canonical_json(md.to_dict())), old)
