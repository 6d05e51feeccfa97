"""TensorRT-LLM adapter: ``DSparkDecodingConfig`` field values from an admission decision (DESIGN §6).

An active decision becomes ``enable_confidence_scheduling: true`` plus the paths of the exported
deployment files (STS, SPS table, live fingerprint, admission receipt) and the receipt's file-byte
SHA-256. The files are exported from the *verified* bundle report (never re-read from the bundle)
by ``artifacts.export_trtllm`` into ``<private dir>/trtllm/``, where the private directory is 0700
so nobody else can swap the files between export and the engine reading them. An inactive
decision, or an export that fails, becomes the static-K configuration with every confidence field
cleared; a failure here never blocks serving.

An active mixed decision (DESIGN §10) adds ``confidence_mixed_evidence`` (the seven fields, its
three file pins taken from the bytes on disk). A mixed export that fails (for instance evidence
measured off TensorRT-LLM's mixed route) is retried without it: the decode fields stand, the
mixed failure is recorded (``mixed_reason_code``), and mixed steps stay native.

Everything is plain dicts and YAML; ``tensorrt_llm`` classes are used only by
:func:`to_decoding_config`, and only when the package is importable. This module creates the
export directory and writes the options file; the export itself is ``artifacts.export_trtllm``.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import yaml

from dspark_calibrate.artifacts import (
    MAX_OPTIONS_YAML_BYTES,
    TRTLLM_FINGERPRINT_FIELDS,
    Finding,
    JsonError,
    Reason,
    YamlError,
    atomic_write_bytes,
    is_sha256_hex,
    load_yaml,
    loads_strict,
    read_regular_file,
    sha256_hex,
)
from dspark_calibrate.errors import ConfigError, DsparkError

if TYPE_CHECKING:
    from dspark_calibrate.runtime_plugin.admission_decision import AdmissionDecision

__all__ = [
    "CONFIDENCE_FIELDS",
    "DECODING_TYPE",
    "EXPORTED_FILES",
    "MAX_OPTIONS_YAML_BYTES",
    "PACKAGE_DIR",
    "Exporter",
    "TrtllmOptions",
    "check_options",
    "decoding_fields",
    "dump_options_yaml",
    "llm_api_options",
    "load_options_yaml",
    "merge_into_base_options",
    "read_options_yaml",
    "static_decoding_fields",
    "static_options",
    "to_decoding_config",
    "write_options_yaml",
]

#: ``DSparkDecodingConfig`` fields that carry confidence scheduling (cleared for static K).
CONFIDENCE_FIELDS: tuple[str, ...] = (
    "confidence_sts_path",
    "confidence_sps_table_path",
    "confidence_sps_live_fingerprint_path",
    "confidence_admission_receipt_path",
    "confidence_admission_receipt_sha256",
    "confidence_mixed_evidence",
)
#: The mixed evidence's files, by the ``confidence_mixed_evidence`` path field naming each.
MIXED_EXPORTED_FILES: Mapping[str, str] = MappingProxyType(
    {
        "costs_path": "mixed_costs.json",
        "admission_path": "mixed_admission.json",
        "live_fingerprint_path": "mixed_live_fingerprint.json",
    }
)
#: Path fields and the file ``export_trtllm`` writes for each.
EXPORTED_FILES: Mapping[str, str] = MappingProxyType(
    {
        "confidence_sts_path": "sts.json",
        "confidence_sps_table_path": "sps_table.json",
        "confidence_sps_live_fingerprint_path": "live_fingerprint.json",
        "confidence_admission_receipt_path": "admission_receipt.json",
    }
)
#: The key of the speculative-decoding section in ``extra_llm_api_options.yaml``.
SPECULATIVE_CONFIG_KEY = "speculative_config"
#: ``decoding_type`` of DSpark's speculative config (static K is DSpark with full verification).
DECODING_TYPE = "DSpark"
#: The package directory created inside the private export directory.
PACKAGE_DIR = "trtllm"
#: Largest exported file read back for pinning, in bytes (an SPS table of 32 cells is ~10 KiB).
MAX_EXPORTED_FILE_BYTES = 1 << 20

#: ``export(bundle_report, out_dir, *, selector_identity, live_fingerprint, overwrite)``: creates
#: ``out_dir`` holding the deployment files (``artifacts.export_trtllm``'s signature).
Exporter = Callable[..., Any]


def static_decoding_fields() -> dict[str, Any]:
    """The static-K ``DSparkDecodingConfig`` field values: scheduling off, every confidence field None."""
    return {"enable_confidence_scheduling": False, **dict.fromkeys(CONFIDENCE_FIELDS)}


@dataclass(frozen=True, slots=True)
class TrtllmOptions:
    """The ``DSparkDecodingConfig`` field values for one decision.

    Attributes:
        active: confidence scheduling is enabled.
        reason_code: ``OK``, the decision's reason, or ``EXPORT_FAILED:...``.
        message: one human line.
        fields: ``enable_confidence_scheduling`` and the five confidence fields (None when cleared).
        max_draft_len: K of the deployment when known (the bundle's when active, else the live one).
        export_dir: the package directory the files were written to (active only).
        files: the exported files by field name (active only).
        mixed_active: ``confidence_mixed_evidence`` is set (mixed steps may run compact).
        mixed_reason_code, mixed_message: why not, when the decision's mixed evidence is inactive
            or its export failed.
    """

    active: bool
    reason_code: str
    message: str
    fields: Mapping[str, Any]
    max_draft_len: int | None = None
    export_dir: Path | None = None
    files: Mapping[str, Path] = field(default_factory=lambda: MappingProxyType({}))
    mixed_active: bool = False
    mixed_reason_code: str | None = None
    mixed_message: str | None = None

    def llm_api_options(self, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """These fields merged into an ``extra_llm_api_options`` mapping (see :func:`llm_api_options`).

        Raises:
            ConfigError: ``base`` configures another speculative decoding type.
        """
        return llm_api_options(self.fields, base, max_draft_len=self.max_draft_len)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "active": self.active,
            "reason_code": self.reason_code,
            "message": self.message,
            "fields": dict(self.fields),
            "max_draft_len": self.max_draft_len,
            "export_dir": str(self.export_dir) if self.export_dir is not None else None,
            "files": {k: str(v) for k, v in self.files.items()},
            "mixed": {
                "active": self.mixed_active,
                "reason_code": self.mixed_reason_code,
                "message": self.mixed_message,
            },
        }


def static_options(reason_code: str, message: str, max_draft_len: int | None = None) -> TrtllmOptions:
    """Static-K options carrying why."""
    return TrtllmOptions(
        active=False,
        reason_code=reason_code,
        message=message,
        fields=MappingProxyType(static_decoding_fields()),
        max_draft_len=max_draft_len,
    )


def _export_failed(message: str, field_name: str, max_draft_len: int | None) -> TrtllmOptions:
    finding = Finding(Reason.EXPORT_FAILED, message, field=field_name)
    return static_options(finding.code, message, max_draft_len)


def _decision_k(decision: AdmissionDecision) -> int | None:
    """K of the decision: the verified cost table's, else the live deployment's."""
    k: int | None = None
    if decision.cost_table is not None:
        k = decision.cost_table.fingerprint.max_draft_len
    if k is None and decision.live_fingerprint is not None:
        k = decision.live_fingerprint.max_draft_len
    return k


def _private_dir(out_dir: Path | None) -> Path:
    """A directory only this user can read, write or enter.

    ``None``: a fresh ``mkdtemp`` directory (0700). A missing path is created 0700; an existing one
    must be a real directory (not a symlink) owned by this user with no group or other access.

    Raises:
        ConfigError: an existing path that is not a private directory.
        OSError: it cannot be created.
    """
    if out_dir is None:
        return Path(tempfile.mkdtemp(prefix="dspark-trtllm-"))
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(mode=0o700, parents=True)
        os.chmod(out_dir, 0o700)  # mkdir's mode is narrowed by the umask, never widened; make it exact
    except FileExistsError:
        pass
    info = os.lstat(out_dir)
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(
            f"{out_dir}: the export directory is not a directory (or is a symlink); give a new path"
        )
    if info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ConfigError(
            f"{out_dir}: export directory is not private (mode {stat.S_IMODE(info.st_mode):o}, owner "
            f"{info.st_uid}); use a new path or chmod 700 it"
        )
    return out_dir


def _default_exporter() -> Exporter:
    from dspark_calibrate.artifacts import export_trtllm

    exporter: Exporter = export_trtllm
    return exporter


def _read_pinned(path: Path) -> bytes:
    """An exported file's bytes (a bounded read: a FIFO or an oversized file is refused).

    Raises:
        OSError: unreadable, not a regular file, or larger than ``MAX_EXPORTED_FILE_BYTES``.
    """
    return read_regular_file(path, MAX_EXPORTED_FILE_BYTES)


def _check_receipt(receipt: bytes, digests: Mapping[str, str], where: Path) -> None:
    """The receipt on disk must pin exactly the files on disk beside it (DESIGN §6 file-byte pins)."""
    try:
        doc = loads_strict(receipt, what=str(where))
    except JsonError as exc:
        raise ConfigError(str(exc)) from exc
    body = doc.get("admission") if isinstance(doc, dict) else None
    if not isinstance(body, dict):
        raise ConfigError(f"{where}: no admission body")
    pins = {
        "sps_cost_table_sha256": digests["confidence_sps_table_path"],
        "live_engine_fingerprint_sha256": digests["confidence_sps_live_fingerprint_path"],
        "calibration_result_sha256": digests["confidence_sts_path"],
    }
    wrong = sorted(k for k, v in pins.items() if body.get(k) != v)
    if wrong:
        raise ConfigError(f"{where}: receipt fields {wrong} do not pin the files exported beside it")
    if body.get("admitted") is not True:
        raise ConfigError(f"{where}: the receipt says admitted={body.get('admitted')!r}")


def _export_package(
    report: Any, package: Path, export: Exporter, **options: Any
) -> tuple[Path, dict[str, Path], dict[str, str]]:
    """Export ``report`` into ``package`` and pin what was written: ``(package, files, digests)``.

    Raises:
        DsparkError, OSError, ImportError: the export failed, or the receipt on disk does not pin
            the files beside it.
    """
    export(report, package, overwrite=True, **options)
    files = {name: package / filename for name, filename in EXPORTED_FILES.items()}
    # Pin what is on disk: that is what the engine will read.
    digests = {name: sha256_hex(_read_pinned(path)) for name, path in files.items()}
    receipt_path = files["confidence_admission_receipt_path"]
    _check_receipt(_read_pinned(receipt_path), digests, receipt_path)
    return package, files, digests


def _not_exportable(
    decision: AdmissionDecision, selector_identity: str | None, k: int | None
) -> TrtllmOptions | None:
    """Static options when there is nothing to export (an inactive decision, no verified bundle
    report, a malformed selector identity), else None."""
    if not decision.active:
        return static_options(decision.reason_code, decision.message, k)
    if decision.bundle_report is None:
        return _export_failed(
            "the decision carries no verified bundle report to export from", "bundle_report", k
        )
    if not is_sha256_hex(selector_identity):
        return _export_failed(
            f"selector identity {selector_identity!r} is not 64 lowercase hex; pass the engine's selector "
            "constant (the receipt pins it, TensorRT-LLM refuses a receipt without it)",
            "selector_identity",
            k,
        )
    return None


def decoding_fields(
    decision: AdmissionDecision,
    *,
    selector_identity: str | None = None,
    out_dir: Path | None = None,
    exporter: Exporter | None = None,
) -> TrtllmOptions:
    """The ``DSparkDecodingConfig`` field values for a decision, exporting the deployment if active.

    Args:
        decision: the admission decision.
        selector_identity: the engine's selector constant (64 lowercase hex), pinned in the receipt;
            read it from the engine's source (``export trtllm --selector-identity`` documents where).
        out_dir: the private directory to export into (created 0700 if missing; an existing one
            must already be private); the package goes to ``out_dir/trtllm/``, replaced atomically
            on every export. A fresh private temporary directory when None.
        exporter: see :data:`Exporter` (default ``artifacts.export_trtllm``), injectable for tests.

    Returns:
        Active options with the exported paths and the receipt's SHA-256, or static options (with
        ``EXPORT_FAILED`` when an active decision could not be exported). Failures of the export
        (bad input, I/O) never raise.
    """
    k = _decision_k(decision)
    refused = _not_exportable(decision, selector_identity, k)
    if refused is not None:
        return refused
    live = decision.live_fingerprint
    # The exporter binds the ten engine fields once more when all of them were established live.
    bind = live if live is not None and not live.missing(TRTLLM_FINGERPRINT_FIELDS) else None
    mixed = decision.mixed
    mixed_code = mixed.reason_code if mixed is not None and not mixed.active else None
    mixed_message = mixed.message if mixed is not None and not mixed.active else None
    attempts = [True, False] if mixed is not None and mixed.active else [False]
    block: dict[str, str] | None = None
    for with_mixed in attempts:
        try:
            extra: dict[str, Any] = {}
            if with_mixed:
                assert mixed is not None
                extra = {"mixed": mixed.report, "allow_synthetic": mixed.allow_synthetic}
            package, files, digests = _export_package(
                decision.bundle_report,
                _private_dir(out_dir) / PACKAGE_DIR,
                exporter if exporter is not None else _default_exporter(),
                selector_identity=selector_identity,
                live_fingerprint=bind,
                **extra,
            )
            block = _mixed_block(package) if with_mixed else None
        except (DsparkError, OSError, ImportError) as exc:
            if with_mixed:
                finding = Finding(Reason.EXPORT_FAILED, f"mixed evidence export failed: {exc}", field="mixed")
                mixed_code, mixed_message = finding.code, finding.message
                continue
            return _export_failed(f"TensorRT-LLM export failed: {exc}", "export", k)
        break
    fields: dict[str, Any] = {
        "enable_confidence_scheduling": True,
        **{name: str(path) for name, path in files.items()},
        "confidence_admission_receipt_sha256": digests["confidence_admission_receipt_path"],
    }
    if block is not None:
        fields["confidence_mixed_evidence"] = block
    return TrtllmOptions(
        active=True,
        reason_code=Reason.OK.value,
        message=f"confidence scheduling enabled with the deployment files in {package}"
        + ("; mixed evidence enabled" if block is not None else ""),
        fields=MappingProxyType(fields),
        max_draft_len=k,
        export_dir=package,
        files=MappingProxyType(files),
        mixed_active=block is not None,
        mixed_reason_code=mixed_code,
        mixed_message=mixed_message,
    )


def _mixed_block(package: Path) -> dict[str, str]:
    """``confidence_mixed_evidence`` for the mixed files on disk (pins of their exact bytes).

    Raises:
        ConfigError: the receipt on disk does not pin the costs file beside it.
        OSError: a file is missing or unreadable.
    """
    paths = {key: package / name for key, name in MIXED_EXPORTED_FILES.items()}
    data = {key: _read_pinned(path) for key, path in paths.items()}
    try:
        receipt = loads_strict(data["admission_path"], what=str(paths["admission_path"]))
        costs = loads_strict(data["costs_path"], what=str(paths["costs_path"]))
    except JsonError as exc:
        raise ConfigError(str(exc)) from exc
    if not isinstance(receipt, dict) or receipt.get("costs_sha256") != sha256_hex(data["costs_path"]):
        raise ConfigError(
            f"{paths['admission_path']}: the mixed receipt does not pin the costs file beside it"
        )
    protocol = costs.get("protocol_sha256") if isinstance(costs, dict) else None
    if not is_sha256_hex(protocol):
        raise ConfigError(f"{paths['costs_path']}: no protocol pin")
    return {
        "costs_path": str(paths["costs_path"]),
        "costs_sha256": sha256_hex(data["costs_path"]),
        "admission_path": str(paths["admission_path"]),
        "admission_sha256": sha256_hex(data["admission_path"]),
        "protocol_sha256": str(protocol),
        "live_fingerprint_path": str(paths["live_fingerprint_path"]),
        "live_fingerprint_sha256": sha256_hex(data["live_fingerprint_path"]),
    }


def llm_api_options(
    fields: Mapping[str, Any], base: Mapping[str, Any] | None = None, *, max_draft_len: int | None = None
) -> dict[str, Any]:
    """Merge decoding fields into an ``extra_llm_api_options`` mapping.

    The fields go into ``speculative_config`` (created if absent; other keys of ``base`` are kept),
    with ``decoding_type: DSpark`` when absent: static K is still DSpark, verifying all K tokens.
    ``max_draft_len`` is set when known: the verified K when scheduling is enabled (the receipt
    pins it), otherwise only where ``base`` has none. Confidence fields that are None are
    *removed*, so the engine's defaults (off) apply and a stale path from ``base`` never survives a
    fallback.

    Raises:
        ConfigError: ``base`` is not an options mapping (see :func:`check_options`) or configures
            another speculative decoding type.
    """
    options = copy.deepcopy(check_options(base if base is not None else {}, "base options"))
    section = dict(options.get(SPECULATIVE_CONFIG_KEY) or {})
    section.setdefault("decoding_type", DECODING_TYPE)
    enabled = bool(fields.get("enable_confidence_scheduling", False))
    if max_draft_len is not None:
        if enabled:
            section["max_draft_len"] = max_draft_len
        else:
            section.setdefault("max_draft_len", max_draft_len)
    for name in CONFIDENCE_FIELDS:
        section.pop(name, None)
    section["enable_confidence_scheduling"] = enabled
    for name in CONFIDENCE_FIELDS:
        value = fields.get(name)
        if value is not None:
            section[name] = value
    options[SPECULATIVE_CONFIG_KEY] = section
    return options


def dump_options_yaml(options: Mapping[str, Any]) -> str:
    """YAML text of an options mapping (safe dumper, sorted keys, block style)."""
    text: str = yaml.safe_dump(dict(options), sort_keys=True, default_flow_style=False, allow_unicode=False)
    return text


def check_options(options: Any, what: str) -> dict[str, Any]:
    """``options`` if it is an ``extra_llm_api_options`` mapping DSpark fields can be merged into.

    A mapping with string keys at the top; ``speculative_config`` absent, null or a mapping with
    string keys; its ``decoding_type``, if given, ``DSpark``.

    Args:
        options: the parsed document.
        what: how to name it in errors (usually its path).

    Raises:
        ConfigError: the first rule broken, naming ``what``, the key and the fix.
    """
    if not isinstance(options, Mapping):
        raise ConfigError(
            f"{what}: options YAML must be a mapping at the top, got {type(options).__name__}; "
            "write `key: value` lines"
        )
    checked: dict[str, Any] = dict(options)
    odd = sorted(repr(k) for k in checked if not isinstance(k, str))
    if odd:
        raise ConfigError(f"{what}: option names must be strings, got {', '.join(odd)}; quote them")
    section = checked.get(SPECULATIVE_CONFIG_KEY)
    if section is None:
        return checked
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"{what}: {SPECULATIVE_CONFIG_KEY} must be a mapping, got {type(section).__name__}; write it as "
            f"`{SPECULATIVE_CONFIG_KEY}:` followed by indented `key: value` lines, or remove it"
        )
    odd = sorted(repr(k) for k in section if not isinstance(k, str))
    if odd:
        raise ConfigError(f"{what}: {SPECULATIVE_CONFIG_KEY} keys must be strings, got {', '.join(odd)}")
    kind = section.get("decoding_type", DECODING_TYPE)
    if kind != DECODING_TYPE:
        raise ConfigError(
            f"{what}: {SPECULATIVE_CONFIG_KEY}.decoding_type is {kind!r}; DSpark options cannot be merged "
            f"into another speculative decoding type: set it to {DECODING_TYPE} or remove it"
        )
    return checked


def load_options_yaml(text: str | bytes, *, what: str = "options") -> dict[str, Any]:
    """Parse options YAML with the bounded safe loader (``artifacts.load_yaml``) and check its shape.

    Raises:
        ConfigError: not UTF-8 YAML, beyond a document limit, or not an options mapping
            (:func:`check_options`); the message names ``what``.
    """
    try:
        data = load_yaml(text, what=what)
    except YamlError as exc:
        raise ConfigError(str(exc)) from exc
    if data is None:
        return {}
    return check_options(data, what)


def write_options_yaml(path: Path, options: Mapping[str, Any]) -> Path:
    """Write options YAML atomically (0644: the engine may run as another user)."""
    atomic_write_bytes(path, dump_options_yaml(options).encode("utf-8"), mode=0o644)
    return path


def to_decoding_config(fields: Mapping[str, Any], **extra: Any) -> Any | None:
    """A ``tensorrt_llm`` ``DSparkDecodingConfig`` from the fields, or None when not importable.

    Args:
        fields: from :func:`decoding_fields` (None-valued confidence fields are left unset).
        extra: other constructor arguments (e.g. ``max_draft_len``).
    """
    if importlib.util.find_spec("tensorrt_llm") is None:
        return None
    module = importlib.import_module("tensorrt_llm.llmapi")
    config_class = getattr(module, "DSparkDecodingConfig", None)
    if config_class is None:
        return None
    kwargs = {k: v for k, v in fields.items() if v is not None}
    return config_class(**kwargs, **extra)


def read_options_yaml(path: Path) -> dict[str, Any]:
    """An ``extra_llm_api_options`` YAML file (a bounded read: a FIFO is refused, never waited on;
    at most ``MAX_OPTIONS_YAML_BYTES``).

    Raises:
        ConfigError: the file cannot be read, is not UTF-8 YAML within the document limits, or is
            not an options mapping; the message names the file (and the key).
    """
    try:
        data = read_regular_file(path, MAX_OPTIONS_YAML_BYTES)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc}); pass a regular YAML file") from exc
    return load_options_yaml(data, what=str(path))


def merge_into_base_options(exported_yaml: Path, base_path: Path) -> dict[str, Any]:
    """The exporter's ``extra_llm_api_options.yaml`` merged into the deployment's own options file.

    The export alone is a fragment (``speculative_config`` without ``speculative_model_dir`` and
    the rest of the engine's options); this keeps everything of ``base_path`` and sets the
    DSpark fields from the export (see :func:`llm_api_options`).

    Raises:
        ConfigError: either file cannot be read or parsed, or ``base_path`` configures another
            speculative decoding type; the message names the file.
    """
    exported, base = (read_options_yaml(path) for path in (exported_yaml, base_path))
    section = dict(exported.get(SPECULATIVE_CONFIG_KEY) or {})
    k = section.pop("max_draft_len", None)
    section.pop("decoding_type", None)
    return llm_api_options(section, base, max_draft_len=k if isinstance(k, int) else None)
