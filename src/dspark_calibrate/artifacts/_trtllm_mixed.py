"""TensorRT-LLM's optional mixed evidence: render the three files, and check a package against
the consumer's contract (``TRTLLM_MIXED.md``; DESIGN §10).

Three canonical-JSON files and one YAML block:

- ``mixed_live_fingerprint.json``: ``{"schema": "dspark-mixed-live-fingerprint-v1", "identity": {...}}``;
- ``mixed_costs.json``: the schema, the identity, the protocol pin, the two semantics strings,
  ``synthetic``, the provenance tag, ``minimum_predicted_gain`` and 1 to 256 cells
  (``geometry``, ``native_lower_ms``, ``candidate_upper_ms``, ``measurement_result_sha256``);
- ``mixed_admission.json``: the receipt's 17 fields (five gates, five result hashes, economics);
- ``speculative_config.confidence_mixed_evidence``: the seven fields, the three file pins being
  SHA-256 of the exact file bytes.

:func:`render_mixed` is pure (verified values in, bytes out). :func:`validate_mixed` is the
consumer's contract as a checker, one rule id per rule (``<file>:<rule>`` findings); it reads
only the bytes it is given and re-checks the geometry invariants (two derived ones included)
through :func:`~._mixed_geometry.geometry_violations`, after checking every JSON type itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dspark_calibrate.artifacts._canonical import JsonError, canonical_json, loads_strict, sha256_hex
from dspark_calibrate.artifacts._mixed_geometry import (
    GEOMETRY_FEATURES,
    IDENTITY_HASHES,
    MIXED_EXECUTION_MODE,
    TRTLLM_BODY_BUCKETS,
    TRTLLM_MIXED_K,
    TRTLLM_MIXED_WORLD_SIZE,
    MixedGeometry,
    MixedIdentity,
    RankFeatures,
    geometry_violations,
)
from dspark_calibrate.artifacts._models import is_sha256_hex
from dspark_calibrate.artifacts._reasons import Finding, Reason
from dspark_calibrate.artifacts._summary import RECEIPT_ECONOMICS_FIELDS, ReceiptEconomics
from dspark_calibrate.artifacts._yaml import YamlError, load_yaml
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.schemas import MAX_MIXED_CELLS, MIXED_GATES, MIXED_RESULTS

__all__ = [
    "ACTION_SEMANTICS",
    "ADMISSION_FILE",
    "ADMISSION_SCHEMA",
    "CONFIG_FIELDS",
    "COSTS_FILE",
    "COSTS_SCHEMA",
    "LIVE_SCHEMA",
    "MIXED_LIVE_FILE",
    "PRICING_SEMANTICS",
    "PROVENANCE_TAG",
    "TRTLLM_MIXED_FILES",
    "MixedExportInputs",
    "MixedRefused",
    "render_mixed",
    "validate_mixed",
]

COSTS_FILE = "mixed_costs.json"
ADMISSION_FILE = "mixed_admission.json"
MIXED_LIVE_FILE = "mixed_live_fingerprint.json"
#: The mixed files of a package, in the order they are written.
TRTLLM_MIXED_FILES: tuple[str, ...] = (MIXED_LIVE_FILE, COSTS_FILE, ADMISSION_FILE)
COSTS_SCHEMA = "dspark-mixed-breakable-costs-v1"
ADMISSION_SCHEMA = "dspark-mixed-breakable-admission-v1"
LIVE_SCHEMA = "dspark-mixed-live-fingerprint-v1"
ACTION_SEMANTICS = "current-host-confidence-prefix-allocation-under-shared-body-capacity-v1"
#: What a mixed cell's time is (the sweep records it, the cost file states it): a rank-0 forward
#: (one process) or the slowest rank's (several).
PRICING_SEMANTICS = "rank0_forward_pricing_proxy"
PROVENANCE_TAG = "closed_measured_breakable_mixed"
#: The seven fields of ``speculative_config.confidence_mixed_evidence``.
CONFIG_FIELDS: tuple[str, ...] = (
    "costs_path",
    "costs_sha256",
    "admission_path",
    "admission_sha256",
    "protocol_sha256",
    "live_fingerprint_path",
    "live_fingerprint_sha256",
)
_CONFIG_PATHS = {
    "costs_path": COSTS_FILE,
    "admission_path": ADMISSION_FILE,
    "live_fingerprint_path": MIXED_LIVE_FILE,
}
_FILE_PINS = {
    "costs_sha256": COSTS_FILE,
    "admission_sha256": ADMISSION_FILE,
    "live_fingerprint_sha256": MIXED_LIVE_FILE,
}
_MAX_FILE = 16 << 20  # the consumer's per-file bound (bytes)
_WIRE = 1 << 63
_COSTS_KEYS = frozenset(
    {
        "schema",
        "identity",
        "protocol_sha256",
        "action_semantics",
        "pricing_semantics",
        "synthetic",
        "provenance",
        "minimum_predicted_gain",
        "cells",
    }
)
_RECEIPT_KEYS = frozenset(
    {"schema", "identity", "costs_sha256", "protocol_sha256", "action_semantics", "pricing_semantics"}
    | set(MIXED_GATES)
    | {h for h, _ in MIXED_RESULTS}
    | {"economics"}
)
_ECONOMICS_KEYS = RECEIPT_ECONOMICS_FIELDS
_IDENTITY_KEYS = frozenset({*IDENTITY_HASHES, "physical_k", "world_size", "body_buckets", "execution_mode"})


class MixedRefused(ConfigError):
    """The mixed evidence cannot back a receipt TensorRT-LLM would accept; ``findings`` say why."""

    default_code = "MIXED_EXPORT_REFUSED"

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = tuple(findings)
        super().__init__("; ".join(f.message for f in self.findings))


def _refuse(rule: str, message: str) -> MixedRefused:
    return MixedRefused(
        [Finding(Reason.CONTENT_INVALID, f"{message}; export without it (--no-mixed)", field=f"mixed:{rule}")]
    )


@dataclass(frozen=True, slots=True)
class MixedExportInputs:
    """The verified values the three files are made of.

    Attributes:
        identity: the live identity (derived from the fingerprint or observed on the deployment).
        protocol_sha256: the measurement protocol's pin.
        minimum_predicted_gain: the cost file's margin (>= 0.01).
        synthetic: the evidence was measured by a synthetic backend.
        cells: per cell, in table order: (geometry, native_lower_ms, candidate_upper_ms,
            measurement_result_sha256).
        gates: the five gates.
        results: receipt hash field → the result file's SHA-256.
        economics: the receipt's five amounts and counts.
    """

    identity: MixedIdentity
    protocol_sha256: str
    minimum_predicted_gain: float
    synthetic: bool
    cells: tuple[tuple[MixedGeometry, float, float, str], ...]
    gates: Mapping[str, bool]
    results: Mapping[str, str]
    economics: ReceiptEconomics


def route_problems(identity: MixedIdentity) -> list[str]:
    """Why TensorRT-LLM's mixed route cannot take evidence of this identity (empty: it can)."""
    out = []
    if identity.physical_k != TRTLLM_MIXED_K:
        out.append(f"physical K is {identity.physical_k}, the consumer supports K={TRTLLM_MIXED_K} only")
    if identity.world_size != TRTLLM_MIXED_WORLD_SIZE:
        out.append(
            f"world size is {identity.world_size}, the consumer supports TP{TRTLLM_MIXED_WORLD_SIZE} attention-DP "
            f"(world size {TRTLLM_MIXED_WORLD_SIZE}) only"
        )
    if identity.body_buckets != TRTLLM_BODY_BUCKETS:
        out.append(
            f"body buckets are {list(identity.body_buckets)}, the consumer captures {list(TRTLLM_BODY_BUCKETS)}"
        )
    if identity.execution_mode != MIXED_EXECUTION_MODE:
        out.append(
            f"execution mode is {identity.execution_mode!r}, the consumer runs {MIXED_EXECUTION_MODE!r}"
        )
    return out


def render_mixed(inputs: MixedExportInputs) -> dict[str, bytes]:
    """The three files' bytes (canonical JSON). Pure; validation is :func:`validate_mixed`'s.

    Raises:
        MixedRefused: the evidence cannot back a receipt (a gate is not passed, the economics do
            not admit, no cell), or the route is not one the consumer supports.
    """
    problems = route_problems(inputs.identity)
    if problems:
        raise _refuse("route", "TensorRT-LLM's mixed route cannot take this evidence: " + "; ".join(problems))
    failed = [g for g in MIXED_GATES if inputs.gates.get(g) is not True]
    if failed:
        raise _refuse(
            "gates",
            f"the mixed receipt's gates {failed} are not backed by passing evidence (see the bundle's "
            "mixed/results/); refusing to write a receipt it cannot back",
        )
    e = inputs.economics
    if not e.admitted:
        raise _refuse(
            "economics",
            f"the mixed economics do not admit (compact_choices {e.compact_choices}, net {e.net_value_ms:.6g} ms); "
            "TensorRT-LLM would refuse the receipt",
        )
    if not inputs.cells:
        raise _refuse("cells", "no mixed cell to export")
    identity = inputs.identity.to_dict()
    live = {"schema": LIVE_SCHEMA, "identity": identity}
    costs = {
        "schema": COSTS_SCHEMA,
        "identity": identity,
        "protocol_sha256": inputs.protocol_sha256,
        "action_semantics": ACTION_SEMANTICS,
        "pricing_semantics": PRICING_SEMANTICS,
        "synthetic": bool(inputs.synthetic),
        "provenance": PROVENANCE_TAG,
        "minimum_predicted_gain": float(inputs.minimum_predicted_gain),
        "cells": [
            {
                "geometry": geo.to_dict(),
                "native_lower_ms": float(lower),
                "candidate_upper_ms": float(upper),
                "measurement_result_sha256": digest,
            }
            for geo, lower, upper, digest in inputs.cells
        ],
    }
    costs_bytes = canonical_json(costs)
    receipt: dict[str, Any] = {
        "schema": ADMISSION_SCHEMA,
        "identity": identity,
        "costs_sha256": sha256_hex(costs_bytes),
        "protocol_sha256": inputs.protocol_sha256,
        "action_semantics": ACTION_SEMANTICS,
        "pricing_semantics": PRICING_SEMANTICS,
        **{g: True for g in MIXED_GATES},
        **{field: inputs.results[field] for field, _ in MIXED_RESULTS},
        "economics": e.to_dict(),
    }
    return {
        MIXED_LIVE_FILE: canonical_json(live),
        COSTS_FILE: costs_bytes,
        ADMISSION_FILE: canonical_json(receipt),
    }


def config_block(files: Mapping[str, bytes], protocol_sha256: str, base: str) -> dict[str, str]:
    """The seven fields of ``confidence_mixed_evidence`` for files that will live under ``base``."""
    root = base.rstrip("/")
    return {
        "costs_path": f"{root}/{COSTS_FILE}",
        "costs_sha256": sha256_hex(files[COSTS_FILE]),
        "admission_path": f"{root}/{ADMISSION_FILE}",
        "admission_sha256": sha256_hex(files[ADMISSION_FILE]),
        "protocol_sha256": protocol_sha256,
        "live_fingerprint_path": f"{root}/{MIXED_LIVE_FILE}",
        "live_fingerprint_sha256": sha256_hex(files[MIXED_LIVE_FILE]),
    }


# ---------------------------------------------------------------------------------------------
# The consumer's contract as a checker (pure)
# ---------------------------------------------------------------------------------------------


class _Rules:
    """Findings of one validator run (the decode and the mixed TensorRT-LLM files), one per violation."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []

    def fail(self, file: str, rule: str, message: str, expected: Any = None, actual: Any = None) -> None:
        self.findings.append(
            Finding(
                Reason.CONTENT_INVALID,
                f"{file}: {message}",
                field=f"{file}:{rule}",
                expected=expected,
                actual=actual,
            )
        )


def _int(x: Any, lo: int = 0, hi: int = _WIRE) -> bool:
    return type(x) is int and lo <= x < hi


def _num(x: Any) -> bool:
    return type(x) in (int, float) and math.isfinite(x)


def _has_null(obj: Any) -> bool:
    """Whether a parsed JSON value holds a null anywhere (both TensorRT-LLM validators refuse one)."""
    if obj is None:
        return True
    if isinstance(obj, dict):
        return any(_has_null(v) for v in obj.values())
    if isinstance(obj, list):
        return any(_has_null(v) for v in obj)
    return False


def _read(r: _Rules, files: Mapping[str, bytes], name: str) -> Any:
    data = files.get(name)
    if data is None:
        r.fail(name, "missing", "file is missing from the package")
        return None
    if not 1 <= len(data) <= _MAX_FILE:
        r.fail(name, "size", f"{len(data)} bytes; each file must be 1 byte to 16 MiB")
        return None
    if data.startswith(b"\xef\xbb\xbf") or data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        r.fail(name, "encoding", "must be plain UTF-8 without a byte-order mark")
        return None
    try:
        obj = loads_strict(data, what=name)
    except JsonError as exc:
        r.fail(name, "json", f"{exc} (a duplicate key, NaN or Infinity rejects the file)")
        return None
    if not isinstance(obj, dict):
        r.fail(name, "object", "the top level must be an object")
        return None
    try:
        canonical = canonical_json(obj)
    except JsonError:
        canonical = b""
    if canonical != data:
        r.fail(name, "canonical", "bytes are not canonical JSON (sorted keys, ',' ':' separators, ASCII)")
    if _has_null(obj):
        r.fail(name, "nulls", "no value may be null")
    return obj


def _identity(r: _Rules, file: str, ident: Any) -> bool:
    if not isinstance(ident, dict) or set(ident) != _IDENTITY_KEYS:
        have = sorted(ident) if isinstance(ident, dict) else type(ident).__name__
        r.fail(file, "identity_keys", f"identity must hold exactly {sorted(_IDENTITY_KEYS)}", actual=have)
        return False
    ok = True
    for key in IDENTITY_HASHES:
        if not is_sha256_hex(ident[key]):
            r.fail(file, "identity_hashes", f"identity.{key} must be 64 lowercase hex", actual=ident[key])
            ok = False
    if not (type(ident["physical_k"]) is int and ident["physical_k"] == TRTLLM_MIXED_K):
        r.fail(
            file,
            "physical_k",
            f"identity.physical_k must be the integer {TRTLLM_MIXED_K}",
            actual=ident["physical_k"],
        )
        ok = False
    if not (type(ident["world_size"]) is int and ident["world_size"] == TRTLLM_MIXED_WORLD_SIZE):
        r.fail(
            file,
            "world_size",
            f"identity.world_size must be the integer {TRTLLM_MIXED_WORLD_SIZE}",
            actual=ident["world_size"],
        )
        ok = False
    b = ident["body_buckets"]
    if not (isinstance(b, list) and all(type(x) is int for x in b) and tuple(b) == TRTLLM_BODY_BUCKETS):
        r.fail(
            file,
            "body_buckets",
            f"identity.body_buckets must be the list {list(TRTLLM_BODY_BUCKETS)}",
            actual=b,
        )
        ok = False
    if ident["execution_mode"] != MIXED_EXECUTION_MODE:
        r.fail(
            file,
            "execution_mode",
            f"identity.execution_mode must be {MIXED_EXECUTION_MODE!r}",
            actual=ident["execution_mode"],
        )
        ok = False
    return ok


def _same(a: Any, b: Any) -> bool:
    """Equal with identical JSON types (3.0 is not 3, true is not 1)."""
    return canonical_json(a) == canonical_json(b)


def _geometry(r: _Rules, where: str, geo: Any, i: int) -> MixedGeometry | None:
    f = COSTS_FILE
    keys = {"rank_features", "capacity", "actual_rank_rows", "native_rank_rows"}
    if not isinstance(geo, dict) or set(geo) != keys:
        r.fail(f, "geometry_keys", f"{where}.geometry must hold exactly {sorted(keys)}")
        return None
    feats, actual, native = geo["rank_features"], geo["actual_rank_rows"], geo["native_rank_rows"]
    if not all(isinstance(x, list) and len(x) == TRTLLM_MIXED_WORLD_SIZE for x in (feats, actual, native)):
        r.fail(
            f,
            "geometry_ranks",
            f"{where}: rank_features, actual_rank_rows and native_rank_rows must be lists of exactly 8",
        )
        return None
    if not _int(geo["capacity"]) or geo["capacity"] not in TRTLLM_BODY_BUCKETS:
        r.fail(
            f,
            "geometry_capacity",
            f"{where}.capacity must be one of {list(TRTLLM_BODY_BUCKETS)}",
            actual=geo["capacity"],
        )
        return None
    ranks = []
    for rank, obj in enumerate(feats):
        if not isinstance(obj, dict) or set(obj) != set(GEOMETRY_FEATURES):
            r.fail(f, "rank_keys", f"{where}.rank_features[{rank}] must hold exactly the 12 features")
            return None
        values = [obj[n] for n in GEOMETRY_FEATURES]
        if not all(_int(v) for v in values):
            r.fail(
                f,
                "rank_integers",
                f"{where}.rank_features[{rank}]: every feature must be a JSON integer in [0, 2^63)",
            )
            return None
        ranks.append(RankFeatures(*values))
    if not all(_int(v) for v in (*actual, *native)):
        r.fail(f, "row_integers", f"{where}: row counts must be JSON integers in [0, 2^63)")
        return None
    return MixedGeometry(tuple(ranks), geo["capacity"], tuple(actual), tuple(native))


def _costs(r: _Rules, costs: Any, identity: Any, pin: str | None, allow_synthetic: bool) -> list[str] | None:
    """Check the cost file; returns its cells' measurement hashes in order (None when unreadable)."""
    f = COSTS_FILE
    if set(costs) != _COSTS_KEYS:
        r.fail(f, "keys", f"top-level keys must be exactly {sorted(_COSTS_KEYS)}", actual=sorted(costs))
        return None
    if costs["schema"] != COSTS_SCHEMA:
        r.fail(f, "schema", f"schema must be {COSTS_SCHEMA!r}", actual=costs["schema"])
    if identity is not None and not _same(costs["identity"], identity):
        r.fail(f, "identity", "identity must equal the live identity (same values, same JSON types)")
    if pin is not None and costs["protocol_sha256"] != pin:
        r.fail(f, "protocol", "protocol_sha256 must equal the configured protocol pin")
    if costs["action_semantics"] != ACTION_SEMANTICS:
        r.fail(f, "action_semantics", f"action_semantics must be {ACTION_SEMANTICS!r}")
    if costs["pricing_semantics"] != PRICING_SEMANTICS:
        r.fail(f, "pricing_semantics", f"pricing_semantics must be {PRICING_SEMANTICS!r}")
    if costs["synthetic"] is not False and not (allow_synthetic and costs["synthetic"] is True):
        r.fail(f, "synthetic", "synthetic must be exactly false (synthetic evidence is never served)")
    if costs["provenance"] != PROVENANCE_TAG:
        r.fail(f, "provenance", f"provenance must be {PROVENANCE_TAG!r}")
    gain = costs["minimum_predicted_gain"]
    if not _num(gain) or gain < 0.01:
        r.fail(
            f,
            "minimum_predicted_gain",
            "minimum_predicted_gain must be a finite number (not a boolean) >= 0.01",
            actual=gain,
        )
        gain = None
    cells = costs["cells"]
    if not isinstance(cells, list) or not 1 <= len(cells) <= MAX_MIXED_CELLS:
        r.fail(
            f,
            "cells",
            f"cells must be a list of 1 to {MAX_MIXED_CELLS}",
            actual=len(cells) if isinstance(cells, list) else None,
        )
        return None
    hashes: list[str] = []
    seen: set[MixedGeometry] = set()
    for i, cell in enumerate(cells):
        where = f"cells[{i}]"
        keys = {"geometry", "native_lower_ms", "candidate_upper_ms", "measurement_result_sha256"}
        if not isinstance(cell, dict) or set(cell) != keys:
            r.fail(f, "cell_keys", f"{where} must hold exactly {sorted(keys)}")
            continue
        lower, upper = cell["native_lower_ms"], cell["candidate_upper_ms"]
        times_ok = all(_num(x) and x > 0 for x in (lower, upper))
        if not times_ok:
            r.fail(
                f, "cell_times", f"{where}: native_lower_ms and candidate_upper_ms must be finite numbers > 0"
            )
        if not is_sha256_hex(cell["measurement_result_sha256"]):
            r.fail(f, "cell_measurement", f"{where}.measurement_result_sha256 must be SHA-256 hex")
        hashes.append(cell["measurement_result_sha256"])
        geo = _geometry(r, where, cell["geometry"], i)
        if geo is None:
            continue
        costs_triple = (float(lower), float(upper), float(gain)) if times_ok and gain is not None else None
        for v in geometry_violations(
            geo,
            k=TRTLLM_MIXED_K,
            buckets=TRTLLM_BODY_BUCKETS,
            world_size=TRTLLM_MIXED_WORLD_SIZE,
            costs=costs_triple,
        ):
            r.fail(f, f"geometry_{v.rule}", f"{where}: {v.describe()}")
        if geo in seen:
            r.fail(
                f, "duplicate", f"{where} repeats an earlier cell's geometry (rank order is part of the key)"
            )
        seen.add(geo)
    return hashes


def _receipt(
    r: _Rules,
    receipt: Any,
    identity: Any,
    pins: Mapping[str, str | None],
    costs_bytes: bytes | None,
    hashes: list[str] | None,
) -> None:
    f = ADMISSION_FILE
    if set(receipt) != _RECEIPT_KEYS:
        r.fail(
            f,
            "keys",
            f"the receipt must hold exactly its {len(_RECEIPT_KEYS)} fields",
            actual=sorted(receipt),
        )
        return
    if receipt["schema"] != ADMISSION_SCHEMA:
        r.fail(f, "schema", f"schema must be {ADMISSION_SCHEMA!r}", actual=receipt["schema"])
    if identity is not None and not _same(receipt["identity"], identity):
        r.fail(f, "identity", "identity must equal the live identity (same values, same JSON types)")
    if costs_bytes is not None and receipt["costs_sha256"] != sha256_hex(costs_bytes):
        r.fail(f, "costs_pin", "costs_sha256 must be the SHA-256 of the cost file's bytes")
    if pins.get("costs_sha256") is not None and receipt["costs_sha256"] != pins["costs_sha256"]:
        r.fail(f, "costs_pin", "costs_sha256 must equal the configured costs pin")
    if pins.get("protocol_sha256") is not None and receipt["protocol_sha256"] != pins["protocol_sha256"]:
        r.fail(f, "protocol", "protocol_sha256 must equal the configured protocol pin")
    if receipt["action_semantics"] != ACTION_SEMANTICS or receipt["pricing_semantics"] != PRICING_SEMANTICS:
        r.fail(f, "semantics", "action_semantics and pricing_semantics must be the consumer's two strings")
    for gate in MIXED_GATES:
        if receipt[gate] is not True:
            r.fail(f, "gates", f"{gate} must be exactly true (1 does not count)", actual=receipt[gate])
    for field, _ in MIXED_RESULTS:
        if not is_sha256_hex(receipt[field]):
            r.fail(f, "result_hashes", f"{field} must be SHA-256 hex", actual=receipt[field])
    if hashes is not None and receipt["measurement_results_sha256"] != sha256_hex(canonical_json(hashes)):
        r.fail(
            f,
            "measurement_results",
            "measurement_results_sha256 must be the canonical hash of the cells' measurement hashes, in cell order",
        )
    e = receipt["economics"]
    if not isinstance(e, dict) or set(e) != set(_ECONOMICS_KEYS):
        r.fail(f, "economics_keys", f"economics must hold exactly {list(_ECONOMICS_KEYS)}")
        return
    steps, choices = e["policy_steps"], e["compact_choices"]
    counts_ok = _int(steps, 1) and _int(choices, 0) and choices <= steps
    if not counts_ok:
        r.fail(
            f,
            "economics_counts",
            "policy_steps must be an integer >= 1 and compact_choices an integer in [0, it]",
        )
    names = _ECONOMICS_KEYS[2:]
    amounts_ok = all(_num(e[n]) and e[n] >= 0 for n in names)
    if not amounts_ok:
        r.fail(f, "economics_amounts", f"{list(names)} must be finite numbers >= 0")
    if counts_ok and amounts_ok:
        receipt = ReceiptEconomics.from_dict(e)
        if not receipt.admitted:
            r.fail(
                f,
                "economics_admitted",
                "the consumer admits only when compact_choices > 0 and net > 0 "
                f"(net {receipt.net_value_ms:.6g}, choices {choices})",
            )


def config_from_yaml(r: _Rules, data: bytes, file: str) -> tuple[dict[str, Any] | None, Any]:
    """``(speculative_config, confidence_mixed_evidence)`` of an options file (None where absent)."""
    try:
        doc = load_yaml(data, what="options")
    except YamlError as exc:
        r.fail(file, "yaml", str(exc))
        return None, None
    spec = doc.get("speculative_config") if isinstance(doc, dict) else None
    if not isinstance(spec, dict):
        r.fail(file, "speculative_config", "must hold a speculative_config mapping")
        return None, None
    return spec, spec.get("confidence_mixed_evidence")


def _config(
    r: _Rules, spec: Mapping[str, Any], block: Any, files: Mapping[str, bytes], file: str
) -> dict[str, str | None]:
    pins: dict[str, str | None] = {"costs_sha256": None, "protocol_sha256": None}
    if not isinstance(block, dict) or set(block) != set(CONFIG_FIELDS):
        have = sorted(block) if isinstance(block, dict) else type(block).__name__
        r.fail(
            file,
            "config_keys",
            f"confidence_mixed_evidence must hold exactly {list(CONFIG_FIELDS)}",
            actual=have,
        )
        return pins
    for key in ("costs_sha256", "admission_sha256", "protocol_sha256", "live_fingerprint_sha256"):
        if not is_sha256_hex(block[key]):
            r.fail(file, "config_pins", f"{key} must be 64 lowercase hex characters", actual=block[key])
    for key, name in _FILE_PINS.items():
        if name in files and block[key] != sha256_hex(files[name]):
            r.fail(file, "config_file_pins", f"{key} must be the SHA-256 of {name}'s exact bytes")
    for key, name in _CONFIG_PATHS.items():
        p = block[key]
        if not isinstance(p, str) or not p.startswith("/") or not p.endswith("/" + name):
            r.fail(file, "config_paths", f"{key} must be an absolute path to {name}", actual=p)
    if spec.get("enable_confidence_scheduling") is not True:
        r.fail(
            file, "config_scheduling", "confidence_mixed_evidence needs enable_confidence_scheduling: true"
        )
    if spec.get("max_draft_len") != TRTLLM_MIXED_K or type(spec.get("max_draft_len")) is not int:
        r.fail(
            file,
            "config_k",
            f"mixed evidence needs max_draft_len {TRTLLM_MIXED_K} (with K=1 the object is cleared)",
        )
    pins["costs_sha256"] = block["costs_sha256"]
    pins["protocol_sha256"] = block["protocol_sha256"]
    return pins


def validate_mixed(
    files: Mapping[str, bytes],
    *,
    options_yaml: bytes | None = None,
    options_file: str = "extra_llm_api_options.yaml",
    allow_synthetic: bool = False,
) -> list[Finding]:
    """Check a package's mixed evidence against every rule of the consumer's contract.

    Args:
        files: file name → exact bytes (the three mixed files).
        options_yaml: the options file holding ``speculative_config.confidence_mixed_evidence``
            (its pins, paths and the scheduling flag are checked; None checks the files only).
        options_file: its name in findings.
        allow_synthetic: accept ``synthetic: true`` (demos and tests; the consumer never does).

    Returns:
        One ``CONTENT_INVALID`` finding per violation, field ``<file>:<rule>`` (empty: valid).
    """
    r = _Rules()
    live = _read(r, files, MIXED_LIVE_FILE)
    costs = _read(r, files, COSTS_FILE)
    receipt = _read(r, files, ADMISSION_FILE)
    identity = None
    if live is not None:
        if set(live) != {"schema", "identity"}:
            r.fail(MIXED_LIVE_FILE, "keys", "must hold exactly schema and identity", actual=sorted(live))
        else:
            if live["schema"] != LIVE_SCHEMA:
                r.fail(MIXED_LIVE_FILE, "schema", f"schema must be {LIVE_SCHEMA!r}", actual=live["schema"])
            if _identity(r, MIXED_LIVE_FILE, live["identity"]):
                identity = live["identity"]
    pins: Mapping[str, str | None] = {"costs_sha256": None, "protocol_sha256": None}
    if options_yaml is not None:
        spec, block = config_from_yaml(r, options_yaml, options_file)
        if spec is not None:
            pins = _config(r, spec, block, files, options_file)
    hashes = (
        _costs(r, costs, identity, pins.get("protocol_sha256"), allow_synthetic)
        if costs is not None
        else None
    )
    if receipt is not None:
        _receipt(r, receipt, identity, pins, files.get(COSTS_FILE), hashes)
    if (
        isinstance(costs, dict)
        and isinstance(receipt, dict)
        and pins.get("protocol_sha256") is None
        and costs.get("protocol_sha256") != receipt.get("protocol_sha256")
    ):
        r.fail(ADMISSION_FILE, "protocol", "the cost file and the receipt must carry the same protocol pin")
    return r.findings


def observed_identity(derived: MixedIdentity, observed: MixedIdentity | None) -> MixedIdentity:
    """The identity to write: the one observed on the deployment when given (its route must be the
    evidence's), else the one derived from the fingerprint.

    Raises:
        ConfigError: the observed identity states another route (K, world size, buckets, mode).
    """
    if observed is None:
        return derived
    route = ("physical_k", "world_size", "body_buckets", "execution_mode")
    wrong = [n for n in derived.diff(observed) if n in route]
    if wrong:
        raise ConfigError(
            f"the observed mixed identity differs from the evidence's route in {wrong}; this evidence was measured "
            "for another route"
        )
    return observed


def cells_of(rows: Sequence[Mapping[str, Any]]) -> tuple[tuple[MixedGeometry, float, float, str], ...]:
    """The cost file's cells from ``mixed-cost-table`` rows, in table order."""
    return tuple(
        (
            MixedGeometry.from_flat(
                r["rank_features"], r["capacity"], r["actual_rank_rows"], r["native_rank_rows"]
            ),
            float(r["native_lower_ms"]),
            float(r["candidate_upper_ms"]),
            str(r["measurement_result_sha256"]),
        )
        for r in rows
    )
