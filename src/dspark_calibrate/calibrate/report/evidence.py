"""The report's I/O edge: read the trust root and the inputs, verify them, list what was refused.

:func:`collect_evidence` verifies a bundle directory (``verify_bundle``) or loose signed artifacts
(``verify_path``, then one fingerprint and distinct kinds) with the artifacts pipeline. When
verification fails it also reads what it can of the inputs with ``read_artifact``, labelled
untrusted, so the page can say *which* files were refused. Nothing raises for bad evidence: every
problem becomes a finding. Building the page from the evidence is :mod:`.model`'s job.

Verification needs ``cryptography``; it is loaded on first use, not when this module is imported.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dspark_calibrate.artifacts import (
    DEFAULT_LIMITS,
    ArtifactReadError,
    Finding,
    Reason,
    loads_strict,
    read_artifact,
    read_regular_file,
)
from dspark_calibrate.errors import ConfigError, DsparkError
from dspark_calibrate.schemas import BUNDLE_KINDS

if TYPE_CHECKING:
    from dspark_calibrate.artifacts import BundleReport, Expectation, MixedReport, TrustRoot, VerifiedArtifact

__all__ = [
    "CLAIMED_FIELDS",
    "MEMBER_KINDS",
    "Evidence",
    "ReceiptEvidence",
    "TrustRootInfo",
    "UntrustedInput",
    "collect_evidence",
    "display",
]

#: Member kinds a report covers, in page order: a decode bundle's (``schemas.BUNDLE_KINDS``).
MEMBER_KINDS = BUNDLE_KINDS
#: Files read per input directory when listing untrusted inputs (a bundle has at most three members;
#: the cap keeps a mistaken directory argument from reading a whole data folder).
_MAX_UNTRUSTED_FILES = 8
#: Largest TensorRT-LLM package file read for the receipt check, in bytes (the receipt is ~1 KB).
_MAX_PACKAGE_FILE_BYTES = 1 << 20
#: The pin the options file carries (written by ``export trtllm`` and the runtime form).
_RECEIPT_PIN = re.compile(r'confidence_admission_receipt_sha256:\s*"?([0-9a-f]{64})"?')
#: Fingerprint fields shown for untrusted inputs and first on the page (enough to recognise a
#: deployment; never used for a decision).
CLAIMED_FIELDS: tuple[str, ...] = (
    "gpu",
    "gpu_count",
    "topology",
    "max_draft_len",
    "rank_local_graph_batch_sizes",
)


@dataclass(frozen=True, slots=True)
class TrustRootInfo:
    """The trust root the inputs were verified against."""

    path: str
    version: int
    digest: str
    expires: datetime
    artifact_threshold: int
    artifact_keyids: tuple[str, ...]
    key_schemes: tuple[tuple[str, str], ...] = ()  # (keyid, signature scheme) of every root key


@dataclass(frozen=True, slots=True)
class ReceiptEvidence:
    """The admission receipt this bundle exports to, and whether a package on disk is it.

    The receipt pins the engine's selector identity, so its SHA-256 (what
    ``extra_llm_api_options.yaml`` pins as ``confidence_admission_receipt_sha256``) is known once
    a selector identity is: given directly, or read from an exported package's receipt.

    Attributes:
        sha256: SHA-256 of the receipt this bundle exports to (None: it could not be rendered).
        selector_identity: the selector identity it was rendered for.
        source: where the selector identity came from (``--selector-identity`` or the package).
        package: the exported package directory that was checked, if any.
        file_sha256: SHA-256 of that package's ``admission_receipt.json`` bytes.
        pinned_sha256: the digest that package's ``extra_llm_api_options.yaml`` pins.
        problem: why the package is not this bundle's (or the receipt could not be rendered).
    """

    sha256: str | None
    selector_identity: str | None
    source: str
    package: str | None = None
    file_sha256: str | None = None
    pinned_sha256: str | None = None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class UntrustedInput:
    """A file as read without verification: facts about its bytes plus the footer's claims.

    Attributes:
        path: the file.
        file_bytes: its size, or ``None`` when it could not be read.
        file_sha256: SHA-256 of its bytes, or ``None``.
        claimed_kind: the unsigned footer's kind, or ``None``.
        claimed_rows: rows in the table, or ``None``.
        claims: selected unsigned footer fingerprint fields, as display strings.
        read_error: why it could not be read as an artifact, if so.
    """

    path: str
    file_bytes: int | None
    file_sha256: str | None
    claimed_kind: str | None = None
    claimed_rows: int | None = None
    claims: tuple[tuple[str, str], ...] = ()
    read_error: str | None = None


@dataclass(frozen=True)
class Evidence:
    """The outcome of reading and verifying the inputs.

    Attributes:
        inputs: the paths given, in order.
        trust_root: the trust root used, or ``None`` when it could not be loaded.
        findings: every reason the inputs were refused, in pipeline order (empty = verified).
        artifacts: the verified members by kind (empty unless ``findings`` is empty).
        bundle_version: the bundle manifest's version, when the input was a bundle.
        manifest_keyids: keys that signed the bundle manifest.
        untrusted: what could be read of the inputs when verification failed.
        trust_root_unreadable: the trust root file could not be read (a wrong path, not bad evidence).
        mixed: the bundle's optional mixed evidence, verified on its own after the decode members
            (None: not a bundle, or no mixed evidence); a refused one does not refuse the report.
    """

    inputs: tuple[Path, ...]
    trust_root: TrustRootInfo | None
    findings: tuple[Finding, ...]
    artifacts: Mapping[str, VerifiedArtifact] = field(default_factory=dict)
    bundle_version: int | None = None
    manifest_keyids: tuple[str, ...] = ()
    untrusted: tuple[UntrustedInput, ...] = ()
    trust_root_unreadable: bool = False
    mixed: MixedReport | None = None
    receipt: ReceiptEvidence | None = None

    @property
    def ok(self) -> bool:
        """True when every input verified."""
        return not self.findings and bool(self.artifacts)

    @property
    def is_bundle(self) -> bool:
        """True when the input was a bundle (a signed manifest binds the members)."""
        return self.bundle_version is not None


def _file_facts(path: Path) -> tuple[int | None, str | None]:
    """Size and SHA-256 of a file; the digest is skipped above the artifact size limit."""
    try:
        size = path.stat().st_size
        if not path.is_file() or size > DEFAULT_LIMITS.max_file_bytes:
            return size, None
        data = path.read_bytes()
    except OSError:
        return None, None
    return len(data), hashlib.sha256(data).hexdigest()


def display(value: Any) -> str:
    """How the page shows a raw footer or fingerprint value: ``—`` for none, lists comma-joined."""
    if value is None:
        return "—"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def _untrusted_file(path: Path) -> UntrustedInput:
    size, digest = _file_facts(path)
    try:
        loaded = read_artifact(path)
    except ArtifactReadError as exc:
        return UntrustedInput(str(path), size, digest, read_error=f"{exc.reason.value}: {exc}")
    fp = loaded.metadata.get("fingerprint")
    claims = tuple((k, display(fp.get(k))) for k in CLAIMED_FIELDS) if isinstance(fp, Mapping) else ()
    return UntrustedInput(
        str(path), size, digest, claimed_kind=loaded.kind, claimed_rows=loaded.table.num_rows, claims=claims
    )


def _untrusted_inputs(inputs: Sequence[Path]) -> tuple[UntrustedInput, ...]:
    out: list[UntrustedInput] = []
    for path in inputs:
        if path.is_dir():
            for member in sorted(path.glob("*.parquet"))[:_MAX_UNTRUSTED_FILES]:
                out.append(_untrusted_file(member))
            manifest = path / "bundle.dsse.json"
            size, digest = _file_facts(manifest)
            out.append(
                UntrustedInput(
                    str(manifest),
                    size,
                    digest,
                    claimed_kind="bundle manifest" if size is not None else None,
                    read_error=None if size is not None else "IO_ERROR: not found or unreadable",
                )
            )
        elif path.exists():
            out.append(_untrusted_file(path))
        else:
            out.append(UntrustedInput(str(path), None, None, read_error="IO_ERROR: not found"))
    return tuple(out)


def _load_root(
    trust_root: Path | str | TrustRoot, now: datetime
) -> tuple[TrustRoot | None, TrustRootInfo | None, Finding | None, bool]:
    """The trust root, what the page shows of it, or the finding; and whether the file was unreadable."""
    from dspark_calibrate.artifacts import TrustRootError, TrustRootUnreadable, read_trust_root

    if isinstance(trust_root, (str, Path)):
        try:
            root = read_trust_root(trust_root, now=now)
        except TrustRootError as exc:
            unreadable = isinstance(exc, TrustRootUnreadable)
            return None, None, Finding(exc.reason, str(exc), field="trust_root"), unreadable
        where = str(trust_root)
    else:
        root = trust_root
        where = "(given)"
        if root.is_expired(now):
            return (
                None,
                None,
                Finding(
                    Reason.TRUST_ROOT_EXPIRED,
                    f"trust root v{root.version} expired at {root.expires.isoformat()}; rotate it",
                    field="trust_root",
                ),
                False,
            )
    info = TrustRootInfo(
        path=where,
        version=root.version,
        digest=root.digest(),
        expires=root.expires,
        artifact_threshold=root.artifact_threshold,
        artifact_keyids=tuple(sorted(root.artifact_keys)),
        key_schemes=tuple(
            sorted({kid: key.scheme for kid, key in {**root.root_keys, **root.artifact_keys}.items()}.items())
        ),
    )
    return root, info, None, False


def _verify_bundle_dir(
    paths: tuple[Path, ...],
    root: TrustRoot,
    info: TrustRootInfo,
    now: datetime,
    expect: Expectation,
    package: _Package,
) -> Evidence:
    """A bundle directory: the manifest and every member, then its optional mixed evidence and
    the admission receipt it exports to."""
    from dspark_calibrate.artifacts import verify_bundle, verify_mixed

    bundle = verify_bundle(paths[0], root, now=now, expected=expect)
    if not bundle.ok:
        return Evidence(paths, info, bundle.findings, untrusted=_untrusted_inputs(paths))
    members = {k: a for k in MEMBER_KINDS if (a := bundle.artifact(k)) is not None}
    mixed = verify_mixed(paths[0], root, now=now, decode=bundle, expected=expect)
    return Evidence(
        paths,
        info,
        (),
        members,
        bundle_version=bundle.version,
        manifest_keyids=bundle.manifest_keyids,
        mixed=mixed if mixed.present else None,
        receipt=_receipt(bundle, package) if "admission" in members else None,
    )


@dataclass(frozen=True, slots=True)
class _Package:
    """What the caller gave to find the receipt: an exported package, a selector identity, or neither."""

    trtllm: Path | None = None
    selector_identity: str | None = None


def _read_small(path: Path) -> bytes:
    return read_regular_file(path, _MAX_PACKAGE_FILE_BYTES)


def _package_receipt(directory: Path) -> tuple[str, str, str | None]:
    """``(selector identity, receipt file sha256, pinned sha256)`` of an exported package.

    Raises:
        ConfigError: the package's receipt or options file cannot be read or parsed.
    """
    from dspark_calibrate.artifacts import RECEIPT_FILE, YAML_FILE

    receipt_path, options_path = directory / RECEIPT_FILE, directory / YAML_FILE
    try:
        data = _read_small(receipt_path)
        body = loads_strict(data, what=str(receipt_path))["admission"]
        selector = body["selector_identity_sha256"]
        options = _read_small(options_path).decode("utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"{exc.filename or directory}: cannot read ({exc.strerror or exc})") from exc
    except (ValueError, KeyError, TypeError) as exc:  # JsonError is a ValueError
        raise ConfigError(f"{receipt_path}: not an admission receipt ({exc})") from exc
    if not isinstance(selector, str):
        raise ConfigError(f"{receipt_path}: admission.selector_identity_sha256 is not a string")
    pin = _RECEIPT_PIN.search(options)
    return selector, hashlib.sha256(data).hexdigest(), pin.group(1) if pin else None


def _receipt(bundle: BundleReport, package: _Package) -> ReceiptEvidence | None:
    """The receipt the verified bundle exports to, checked against the package when one is given.

    The receipt's bytes depend only on the signed members and the selector identity (not on where
    the files will live), so rendering it again here gives the exact digest the options pin.
    """
    from dspark_calibrate.artifacts import TrtllmInputs, render_trtllm

    if package.trtllm is None and package.selector_identity is None:
        return None
    file_sha = pinned = None
    source = "--selector-identity"
    selector = package.selector_identity
    try:
        if package.trtllm is not None:
            found, file_sha, pinned = _package_receipt(package.trtllm)
            selector = selector or found
            source = f"the receipt in {package.trtllm}"
        assert selector is not None
        sha = render_trtllm(TrtllmInputs.from_bundle(bundle), selector_identity=selector).receipt_sha256
    except DsparkError as exc:
        where = str(package.trtllm) if package.trtllm is not None else None
        return ReceiptEvidence(None, selector, source, where, file_sha, pinned, problem=str(exc))
    problem = None
    if file_sha is not None and file_sha != sha:
        problem = (
            f"{package.trtllm}: its admission receipt (sha256 {file_sha}) is not the one this bundle exports "
            f"(sha256 {sha}); export the bundle again (dspark-calibrate export trtllm --force)"
        )
    elif package.trtllm is not None and pinned != file_sha:
        problem = (
            f"{package.trtllm}: extra_llm_api_options.yaml pins {pinned or 'no receipt'}, not its receipt "
            f"(sha256 {file_sha}); export the bundle again"
        )
    return ReceiptEvidence(
        sha, selector, source, str(package.trtllm) if package.trtllm else None, file_sha, pinned, problem
    )


def _loose_member(art: VerifiedArtifact, members: Mapping[str, VerifiedArtifact]) -> Finding | None:
    """Why a verified loose artifact cannot join the others (a second of its kind, a foreign kind)."""
    if art.kind in members:
        return Finding(
            Reason.BUNDLE_INVALID,
            f"{art.path}: a second {art.kind} artifact (first: {members[art.kind].path}); give one per kind",
            field=art.kind,
        )
    if art.kind not in MEMBER_KINDS:
        return Finding(
            Reason.KIND_MISMATCH,
            f"{art.path}: is a {art.kind} artifact; the report covers {', '.join(MEMBER_KINDS)}",
            field="kind",
            expected=list(MEMBER_KINDS),
            actual=art.kind,
        )
    return None


def _fingerprint_mismatches(members: Mapping[str, VerifiedArtifact]) -> list[Finding]:
    """Loose artifacts must describe one deployment: every fingerprint equals the first's."""
    first_kind = next(k for k in MEMBER_KINDS if k in members)
    first = members[first_kind].fingerprint
    out = []
    for art in members.values():
        diff = [name for name, _, _ in first.diff(art.fingerprint)]
        if diff:
            out.append(
                Finding(
                    Reason.CROSS_MEMBER_MISMATCH,
                    f"{art.path}: fingerprint differs from {members[first_kind].path.name} in {diff}; "
                    "these artifacts describe different deployments",
                    field=diff[0],
                )
            )
    return out


def _verify_files(
    paths: tuple[Path, ...], root: TrustRoot, info: TrustRootInfo, now: datetime, expect: Expectation
) -> Evidence:
    """Loose artifacts: each verified on its own, then distinct kinds with one fingerprint."""
    from dspark_calibrate.artifacts import verify_path

    findings: list[Finding] = []
    members: dict[str, VerifiedArtifact] = {}
    for path in paths:
        report = verify_path(path, root, now=now, expected=expect)
        if not report.ok or report.artifact is None:
            findings.extend(report.findings)
            continue
        problem = _loose_member(report.artifact, members)
        if problem is not None:
            findings.append(problem)
        else:
            members[report.artifact.kind] = report.artifact
    if not findings and members:
        findings = _fingerprint_mismatches(members)
    if findings:
        return Evidence(paths, info, tuple(findings), untrusted=_untrusted_inputs(paths))
    return Evidence(paths, info, (), members)


def collect_evidence(
    inputs: Sequence[Path | str],
    trust_root: Path | str | TrustRoot,
    *,
    now: datetime,
    expected: Expectation | None = None,
    trtllm: Path | str | None = None,
    selector_identity: str | None = None,
) -> Evidence:
    """Read and verify the inputs; the I/O edge of the report.

    A directory is verified as a bundle (``verify_bundle``: manifest and every member). Files are
    verified one by one (``verify_path``) and must then be distinct kinds with one fingerprint.
    Nothing raises for bad evidence: every problem becomes a finding.

    Args:
        inputs: one bundle directory, or one to three signed artifact files.
        trust_root: the pinned ``root.json`` path, or an already-loaded trust root.
        now: the verification time (timezone-aware).
        expected: kind-independent expectations (fingerprint binding, synthetic policy, maximum age).
        trtllm: the package ``export trtllm`` wrote for this bundle: its receipt's digest is shown,
            and a receipt (or options pin) that is not this bundle's is a finding of the page.
        selector_identity: the engine's selector identity, to show the receipt digest without a
            package (a package's own receipt names it otherwise).

    Returns:
        The evidence; ``evidence.ok`` only when the trust root loaded and every input verified.

    Raises:
        ConfigError: no input, or a bundle directory mixed with other inputs.
    """
    from dspark_calibrate.artifacts import Expectation as _Expectation

    paths = tuple(Path(p) for p in inputs)
    if not paths:
        raise ConfigError("give a bundle directory or signed artifact files to report on")
    if len(paths) > 1 and any(p.is_dir() for p in paths):
        raise ConfigError("give either one bundle directory or artifact files, not both")
    expect = expected if expected is not None else _Expectation()
    root, info, problem, unreadable = _load_root(trust_root, now)
    if root is None or info is None:
        assert problem is not None
        return Evidence(
            paths, None, (problem,), untrusted=_untrusted_inputs(paths), trust_root_unreadable=unreadable
        )
    if paths[0].is_dir():
        package = _Package(Path(trtllm) if trtllm is not None else None, selector_identity)
        return _verify_bundle_dir(paths, root, info, now, expect, package)
    return _verify_files(paths, root, info, now, expect)
