"""Artifacts: canonical JSON, logical table hash, Parquet I/O, signing and the verification pipeline.

Everything that needs ``cryptography`` (keys, envelopes, trust root, signing, verification) loads
lazily on first use, so ``dspark_calibrate.calibrate`` can write unsigned artifacts on GPU images
without it (DESIGN §3). The file readers of small trusted inputs live here too:
``read_trust_root`` (the one way to read a ``root.json``) and ``read_fingerprint``.

May import: ``schemas`` and ``errors``; nothing of ``runtime_plugin``, ``calibrate`` or ``cli``.

Example:
    >>> import pyarrow as pa
    >>> from dspark_calibrate.artifacts import logical_sha256
    >>> t = pa.table({"position": pa.array([1], pa.int64())})
    >>> len(logical_sha256(t, "calibration"))  # any table with the kind's key columns hashes
    64
"""

from __future__ import annotations

import importlib
from typing import Any

from dspark_calibrate.artifacts._atomic import atomic_write_bytes, check_output_path, publish_directory
from dspark_calibrate.artifacts._calibration import CALIBRATION_METHODS, Calibration, PositionMap
from dspark_calibrate.artifacts._canonical import JsonError, canonical_json, loads_strict, sha256_hex
from dspark_calibrate.artifacts._cells import (
    DEFAULT_MINIMUM_PREDICTED_GAIN,
    DRAIN_GUARD_FIELDS,
    FORCED_K_BUDGET,
    NATIVE_BUDGET,
    CellKind,
    CostCell,
    CostTable,
    DrainGuard,
    cell_kind,
    full_width,
    is_deployable,
)
from dspark_calibrate.artifacts._content import LEGACY_UNPAIRED_COSTS, ArtifactNotice
from dspark_calibrate.artifacts._files import FileTooLarge, read_regular_file
from dspark_calibrate.artifacts._inputs import MAX_FINGERPRINT_FILE_BYTES, read_fingerprint
from dspark_calibrate.artifacts._limits import (
    MAX_DOCUMENT_DEPTH,
    MAX_INT_DIGITS,
    MAX_JSON_NODES,
    MAX_OPTIONS_YAML_BYTES,
    MAX_STATE_BYTES,
    MAX_YAML_NODES,
)
from dspark_calibrate.artifacts._logical_hash import (
    LogicalHashError,
    canonical_table_bytes,
    logical_sha256,
    logical_sha256_keys,
)
from dspark_calibrate.artifacts._mixed_geometry import (
    GEOMETRY_FEATURES,
    GEOMETRY_RULES,
    MIXED_EXECUTION_MODE,
    TRTLLM_BODY_BUCKETS,
    TRTLLM_MIXED_K,
    TRTLLM_MIXED_WORLD_SIZE,
    ContextChunk,
    GenerationRequest,
    GeometryViolation,
    MixedGeometry,
    MixedGeometryError,
    MixedIdentity,
    MixedLive,
    MixedRoute,
    MixedStep,
    RankFeatures,
    RankStep,
    candidate_rows,
    dead_cell,
    distinct,
    geometry_violations,
    native_rows,
    paid_bucket,
    require_geometry,
    step_candidates,
)
from dspark_calibrate.artifacts._models import (
    FINGERPRINT_FLAGS,
    NON_PRINTABLE_ASCII,
    TRTLLM_FINGERPRINT_FIELDS,
    Fingerprint,
    ModelError,
    Provenance,
    fingerprint_flag,
    is_printable_ascii,
    is_sha256_hex,
)
from dspark_calibrate.artifacts._parquet import (
    DEFAULT_LIMITS,
    FOOTER_KEY,
    TRACE_FOOTER_KEY,
    ArtifactReadError,
    LoadedArtifact,
    ReadLimits,
    detached_envelope_path,
    read_artifact,
    write_unsigned_artifact,
)
from dspark_calibrate.artifacts._reasons import Finding, Reason
from dspark_calibrate.artifacts._schema_check import (
    DOCUMENT_SCHEMAS,
    SchemaProblem,
    SchemaReport,
    recognise,
    schema_registry,
    validate_bytes,
    validate_document,
)
from dspark_calibrate.artifacts._state import (
    DEFAULT_STATE_LOCK_TIMEOUT_S,
    RollbackState,
    SeriesIdentity,
    StateError,
    StoredRoot,
)
from dspark_calibrate.artifacts._sts import (
    STS_FIELDS,
    STS_FILE,
    STS_MIN_NUM_SAMPLES,
    StsDocument,
    StsError,
    check_sts_object,
    parse_sts_document,
    sts_document,
)
from dspark_calibrate.artifacts._summary import (
    ADMISSION_SUMMARY_FIELDS,
    RECEIPT_ECONOMICS_FIELDS,
    AdmissionSummary,
    ReceiptEconomics,
)
from dspark_calibrate.artifacts._trtllm_mixed import PRICING_SEMANTICS, TRTLLM_MIXED_FILES, validate_mixed
from dspark_calibrate.artifacts._yaml import YamlError, load_yaml

# Names served lazily from modules that import cryptography / securesystemslib / tuf.
_LAZY: dict[str, str] = {
    # keys
    "KeyPair": "_keys",
    "generate_keypair": "_keys",
    "load_signer": "_keys",
    "load_public_key": "_keys",
    "signer_from_uri": "_keys",
    "public_key_of": "_keys",
    # envelopes
    "PAYLOAD_TYPE": "_envelope",
    "PREDICATE_TYPE": "_envelope",
    "BUNDLE_PREDICATE_TYPE": "_envelope",
    "STATEMENT_TYPE": "_envelope",
    "EnvelopeError": "_envelope",
    "pae": "_envelope",
    # trust root
    "TrustRoot": "_trust",
    "TrustRootError": "_trust",
    "TrustRootUnreadable": "_trust",
    "init_root": "_trust",
    "rotate_root": "_trust",
    "single_key_root": "_trust",
    "load_trust_root": "_trust",
    "read_trust_root": "_trust",
    "verify_root_chain": "_trust",
    "MAX_TRUST_ROOT_BYTES": "_trust",
    "check_root_rollback": "_trust",
    # signing, bundles, verification
    "sign_artifact": "_sign",
    "sign_table": "_sign",
    "write_signed": "_sign",
    "SignedTable": "_sign",
    "SignedArtifact": "_sign",
    "Expectation": "_verify",
    "VerificationReport": "_verify",
    "VerifiedArtifact": "_verify",
    "verify_artifact": "_verify",
    "verify_path": "_verify",
    "check_mixed_binding": "_verify",
    "require_valid": "_verify",
    "BINDING_FIELDS": "_verify",
    "series_identity": "_verify",
    "check_trust_root_freshness": "_verify",
    "BundleReport": "_bundle",
    "write_bundle": "_bundle",
    "verify_bundle": "_bundle",
    "verify_inputs": "_bundle",
    "BUNDLE_MANIFEST": "_bundle",
    "BundleLayout": "_bundle",
    "DECODE_LAYOUT": "_bundle",
    "MIXED_LAYOUT": "_bundle",
    # the optional mixed evidence of a bundle (DESIGN §10)
    "MIXED_DIR": "_mixed_bundle",
    "MIXED_FILES": "_mixed_bundle",
    "MixedReport": "_mixed_bundle",
    "measurement_result": "_mixed_bundle",
    "measurement_results_bytes": "_mixed_bundle",
    "verify_mixed": "_mixed_bundle",
    # TensorRT-LLM deployment package (DESIGN §6)
    "export_trtllm": "_export_trtllm",
    "render_trtllm": "_export_trtllm",
    "validate_trtllm": "_export_trtllm",
    "TrtllmInputs": "_export_trtllm",
    "TrtllmExport": "_export_trtllm",
    "ExportRejected": "_export_trtllm",
    "TRTLLM_FILES": "_export_trtllm",
    "RECEIPT_FILE": "_export_trtllm",
    "YAML_FILE": "_export_trtllm",
    "ADMISSION_BODY_FIELDS": "_export_trtllm",
    "MixedSource": "_export_trtllm",
}

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_STATE_LOCK_TIMEOUT_S",
    "DOCUMENT_SCHEMAS",
    "FINGERPRINT_FLAGS",
    "GEOMETRY_FEATURES",
    "GEOMETRY_RULES",
    "MAX_DOCUMENT_DEPTH",
    "MAX_FINGERPRINT_FILE_BYTES",
    "MAX_INT_DIGITS",
    "MAX_JSON_NODES",
    "MAX_OPTIONS_YAML_BYTES",
    "MAX_STATE_BYTES",
    "MAX_YAML_NODES",
    "MIXED_EXECUTION_MODE",
    "FOOTER_KEY",
    "TRACE_FOOTER_KEY",
    "TRTLLM_BODY_BUCKETS",
    "TRTLLM_MIXED_FILES",
    "TRTLLM_MIXED_K",
    "TRTLLM_MIXED_WORLD_SIZE",
    "ContextChunk",
    "GenerationRequest",
    "GeometryViolation",
    "MixedGeometry",
    "MixedGeometryError",
    "MixedIdentity",
    "MixedLive",
    "MixedRoute",
    "MixedStep",
    "RankFeatures",
    "RankStep",
    "candidate_rows",
    "dead_cell",
    "distinct",
    "geometry_violations",
    "native_rows",
    "paid_bucket",
    "require_geometry",
    "step_candidates",
    "validate_mixed",
    "PRICING_SEMANTICS",
    "ADMISSION_SUMMARY_FIELDS",
    "RECEIPT_ECONOMICS_FIELDS",
    "AdmissionSummary",
    "ReceiptEconomics",
    "LEGACY_UNPAIRED_COSTS",
    "TRTLLM_FINGERPRINT_FIELDS",
    "ArtifactReadError",
    "FileTooLarge",
    "Finding",
    "Fingerprint",
    "JsonError",
    "LoadedArtifact",
    "LogicalHashError",
    "ModelError",
    "ArtifactNotice",
    "Provenance",
    "ReadLimits",
    "Reason",
    "RollbackState",
    "SchemaProblem",
    "SchemaReport",
    "SeriesIdentity",
    "StateError",
    "StoredRoot",
    "YamlError",
    "atomic_write_bytes",
    "canonical_json",
    "canonical_table_bytes",
    "check_output_path",
    "detached_envelope_path",
    "fingerprint_flag",
    "NON_PRINTABLE_ASCII",
    "is_printable_ascii",
    "is_sha256_hex",
    "load_yaml",
    "loads_strict",
    "logical_sha256",
    "logical_sha256_keys",
    "read_artifact",
    "read_fingerprint",
    "read_regular_file",
    "recognise",
    "schema_registry",
    "sha256_hex",
    "publish_directory",
    "validate_bytes",
    "validate_document",
    "write_unsigned_artifact",
    # the signed documents as frozen, self-validating models, and the cell rules (one home each)
    "CALIBRATION_METHODS",
    "DEFAULT_MINIMUM_PREDICTED_GAIN",
    "DRAIN_GUARD_FIELDS",
    "FORCED_K_BUDGET",
    "NATIVE_BUDGET",
    "STS_FIELDS",
    "STS_FILE",
    "STS_MIN_NUM_SAMPLES",
    "Calibration",
    "CellKind",
    "CostCell",
    "CostTable",
    "DrainGuard",
    "PositionMap",
    "StsDocument",
    "StsError",
    "cell_kind",
    "full_width",
    "is_deployable",
    "check_sts_object",
    "parse_sts_document",
    "sts_document",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
