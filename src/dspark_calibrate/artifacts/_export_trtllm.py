"""Export a verified bundle as TensorRT-LLM's DSpark deployment package (DESIGN §6).

Five files, byte-exact and canonical, because any mismatch makes TensorRT-LLM silently run
static K:

- ``sps_table.json``: schema_version 2 exact cost table (canonical G keys, JSON ints, the
  measurements mirroring the tables, the ten-field engine fingerprint and its canonical-JSON
  SHA-256, ``minimum_predicted_gain`` and, when compact cells are deployed, the
  ``iteration_drain_guard``);
- ``sts.json``: the STS temperatures (``sts_temperatures`` and its alias ``temperatures``);
- ``live_fingerprint.json``: the ten fields;
- ``admission_receipt.json``: ``{schema_version: 1, admission: <16 fields>, admission_sha256}``
  pinning the SPS, live-fingerprint and STS files by their file bytes;
- ``extra_llm_api_options.yaml``: the ``DSparkDecodingConfig`` fields, with the receipt file's
  SHA-256.

A bundle with verified mixed evidence (DESIGN §10) adds ``mixed_live_fingerprint.json``,
``mixed_costs.json`` and ``mixed_admission.json`` (:mod:`._trtllm_mixed`) and the seven fields of
``speculative_config.confidence_mixed_evidence``; only on TensorRT-LLM's mixed route (K = 3,
world size 8, the six BREAKABLE body buckets) and only when every gate of the mixed receipt is
backed by passing evidence and its economics admit.

:func:`render_trtllm` and :func:`validate_trtllm` are pure (values in, bytes or findings out);
:func:`export_trtllm` takes a verified :class:`BundleReport`, renders, validates every consumer
rule and only then writes the directory atomically (a temporary sibling renamed into place).
JSON documents are written as canonical JSON (sorted keys, ``,``/``:`` separators, ASCII), the
form TensorRT-LLM hashes.
"""

from __future__ import annotations

import itertools
import json
import math
import secrets
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_calibrate.artifacts._atomic import atomic_write_bytes, publish_directory
from dspark_calibrate.artifacts._bundle import BundleReport
from dspark_calibrate.artifacts._calibration import Calibration
from dspark_calibrate.artifacts._canonical import JsonError, canonical_json, loads_strict, sha256_hex
from dspark_calibrate.artifacts._cells import (
    DRAIN_GUARD_FIELDS,
    NATIVE_BUDGET,
    CellKind,
    CostTable,
    DrainGuard,
    cell_kind,
    is_deployable,
)
from dspark_calibrate.artifacts._mixed_bundle import MixedReport
from dspark_calibrate.artifacts._mixed_geometry import MixedIdentity, MixedRoute
from dspark_calibrate.artifacts._models import (
    TRTLLM_FINGERPRINT_FIELDS,
    Fingerprint,
    ModelError,
    is_printable_ascii,
    is_sha256_hex,
)
from dspark_calibrate.artifacts._reasons import Finding
from dspark_calibrate.artifacts._sts import (
    STS_FIELDS,
    STS_FILE,
    STS_MIN_NUM_SAMPLES,
    StsError,
    check_sts_object,
    sts_document,
)
from dspark_calibrate.artifacts._summary import RECEIPT_ECONOMICS_FIELDS, AdmissionSummary, ReceiptEconomics
from dspark_calibrate.artifacts._trtllm_mixed import (
    TRTLLM_MIXED_FILES,
    MixedExportInputs,
    MixedRefused,
    _has_null,
    _Rules,
    cells_of,
    config_block,
    observed_identity,
    render_mixed,
    validate_mixed,
)
from dspark_calibrate.artifacts._yaml import YamlError, load_yaml
from dspark_calibrate.errors import ArtifactRejected, ConfigError
from dspark_calibrate.schemas import MAX_COMPACT_CELLS_PER_G, MAX_COMPACT_CELLS_TOTAL, MIXED_RESULTS

__all__ = [
    "ADMISSION_BODY_FIELDS",
    "STS_FIELDS",
    "TRTLLM_FILES",
    "ExportRejected",
    "MixedSource",
    "TrtllmExport",
    "TrtllmInputs",
    "export_trtllm",
    "render_trtllm",
    "validate_trtllm",
]

SPS_FILE = "sps_table.json"
LIVE_FILE = "live_fingerprint.json"
RECEIPT_FILE = "admission_receipt.json"
YAML_FILE = "extra_llm_api_options.yaml"
#: The package's files, in the order they are written.
TRTLLM_FILES: tuple[str, ...] = (SPS_FILE, STS_FILE, LIVE_FILE, RECEIPT_FILE, YAML_FILE)

#: The 16 fields of the receipt's admission body.
ADMISSION_BODY_FIELDS: tuple[str, ...] = (
    "physical_k",
    "source_head",
    "source_diff_sha256",
    "runtime_snapshot",
    "sps_cost_table_sha256",
    "live_engine_fingerprint_sha256",
    "selector_identity_sha256",
    "workload_identity_sha256",
    "calibration_result_sha256",
    "selector_replay_sha256",
    "policy_steps",
    "compact_choices",
    "gross_compact_value_ms_lower_bound",
    "fixed_confidence_path_overhead_ms_upper_bound",
    "safety_margin_ms",
    "admitted",
)
_AMOUNTS = RECEIPT_ECONOMICS_FIELDS[2:]
_SPS_REQUIRED = frozenset(
    {
        "schema_version",
        "cost_tables",
        "measurements",
        "engine_fingerprint",
        "engine_fingerprint_sha256",
        "minimum_predicted_gain",
    }
)
_GUARD_FIELDS = frozenset(
    {
        "loss_multiplier",
        "mean_output_tokens_per_request_iteration",
        "minimum_group_value_ms",
        "tail_graph_batch_size",
        "source_result_sha256",
    }
)
_MEASUREMENT_FIELDS = frozenset(
    {"rank_local_graph_batch_size", "rank_local_verifier_budget", "step_time_ms", "source_result_sha256"}
)
_YAML_KEYS = (
    "decoding_type",
    "max_draft_len",
    "enable_confidence_scheduling",
    "confidence_sts_path",
    "confidence_sps_table_path",
    "confidence_sps_live_fingerprint_path",
    "confidence_admission_receipt_path",
    "confidence_admission_receipt_sha256",
)
_YAML_PATHS = {
    "confidence_sts_path": STS_FILE,
    "confidence_sps_table_path": SPS_FILE,
    "confidence_sps_live_fingerprint_path": LIVE_FILE,
    "confidence_admission_receipt_path": RECEIPT_FILE,
}
_DEFAULT_DEPLOY_DIR = "/etc/dspark/trtllm"


class ExportRejected(ArtifactRejected):
    """The rendered package breaks a consumer rule; ``findings`` lists every violation."""

    def __init__(self, findings: Sequence[Finding]) -> None:
        self.findings = tuple(findings)
        lines = "; ".join(f"{f.code}: {f.message}" for f in self.findings[:5])
        super().__init__(
            self.findings, f"TensorRT-LLM export refused ({len(self.findings)} violation(s)): {lines}"
        )


# ---------------------------------------------------------------------------------------------
# Inputs and rendering (pure)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MixedSource:
    """The verified mixed evidence a package's mixed files are made of.

    Attributes:
        rows: the ``mixed-cost-table`` rows, in table order.
        route: K, world size, buckets, execution mode the cells were measured on.
        protocol_sha256: the measurement protocol's pin.
        minimum_predicted_gain: the cost file's margin.
        synthetic: measured by a synthetic backend.
        gates: the five gates, as build decided them.
        results: receipt hash field → the verified result file's SHA-256.
        economics: the receipt's counts and amounts.
    """

    rows: tuple[Mapping[str, Any], ...]
    route: MixedRoute
    protocol_sha256: str
    minimum_predicted_gain: float
    synthetic: bool
    gates: Mapping[str, bool]
    results: Mapping[str, str]
    economics: ReceiptEconomics

    @classmethod
    def from_report(cls, report: MixedReport) -> MixedSource:
        """From a passing :func:`~._mixed_bundle.verify_mixed` report.

        Raises:
            ConfigError: the mixed evidence did not verify.
        """
        costs, admission = report.artifact("mixed-cost-table"), report.artifact("mixed-admission")
        if not report.ok or costs is None or admission is None:
            raise ConfigError(
                f"{report.path}: the mixed evidence did not verify ({report.code}: {report.message})"
            )
        summary = json.loads(json.dumps(dict(admission.summary)))
        names = dict(summary["results"])
        return cls(
            rows=tuple(costs.table.to_pylist()),
            route=MixedRoute.from_dict(summary["route"]),
            protocol_sha256=str(summary["protocol_sha256"]),
            minimum_predicted_gain=float(summary["minimum_predicted_gain"]),
            synthetic=bool(costs.provenance.synthetic),
            gates=dict(summary["gates"]),
            results={field: names[name] for field, name in MIXED_RESULTS},
            economics=ReceiptEconomics.from_dict(summary),
        )


@dataclass(frozen=True, slots=True)
class TrtllmInputs:
    """The values the package is made of (taken from verified artifacts only).

    Attributes:
        fingerprint: the deployment (all ten TensorRT-LLM fields established).
        cost_table: the deployed cells (their signed rows kept) with the admission's gain threshold
            and drain guard.
        calibration: per position (position, method, temperature, risk_set_size, ece_before,
            ece_after).
        calibration_logical_sha256: names the calibration in ``sts.json``'s dataset field.
        summary: the admission artifact's signed summary, read and checked (receipt rule included).
        bundle_version: the manifest's version (named in the YAML comment).
        mixed: the verified mixed evidence to export too (None: decode only).
    """

    fingerprint: Fingerprint
    cost_table: CostTable
    calibration: tuple[Mapping[str, Any], ...]
    calibration_logical_sha256: str
    summary: AdmissionSummary
    bundle_version: int
    mixed: MixedSource | None = None

    @classmethod
    def from_bundle(cls, bundle: BundleReport, mixed: MixedReport | None = None) -> TrtllmInputs:
        """Take the inputs from a verified bundle.

        Raises:
            ConfigError: the bundle did not verify or lacks a member the export needs.
        """
        if not bundle.ok:
            raise ConfigError(
                f"{bundle.path}: refusing to export an unverified bundle ({bundle.code}: {bundle.message})"
            )
        ct, cal, adm = (
            bundle.artifact("cost-table"),
            bundle.artifact("calibration"),
            bundle.artifact("admission"),
        )
        if ct is None or cal is None or adm is None:
            raise ConfigError(
                f"{bundle.path}: the TensorRT-LLM export needs cost-table, calibration and admission "
                "members; "
                "rebuild the bundle with `dspark-calibrate build`"
            )
        if ct.fingerprint.max_draft_len is None:
            raise ConfigError(f"{bundle.path}: the cost table's fingerprint does not state K (max_draft_len)")
        summary = _admission_summary(bundle.path, adm.summary)
        guard = summary.drain_guard
        table = CostTable.from_arrow(
            ct.table,
            ct.fingerprint.max_draft_len,
            minimum_predicted_gain=summary.minimum_predicted_gain,
            drain_guard=_drain_guard(guard) if isinstance(guard, Mapping) else None,
        )
        keys = ("position", "method", "temperature", "risk_set_size", "ece_before", "ece_after")
        rows = tuple({k: r[k] for k in keys} for r in cal.table.to_pylist())
        assert bundle.version is not None
        return cls(
            fingerprint=ct.fingerprint,
            cost_table=table,
            calibration=tuple(sorted(rows, key=lambda r: int(r["position"]))),
            calibration_logical_sha256=cal.logical_sha256,
            summary=summary,
            bundle_version=bundle.version,
            mixed=MixedSource.from_report(mixed) if mixed is not None else None,
        )


def _admission_summary(where: Path, summary: Mapping[str, Any]) -> AdmissionSummary:
    """The admission member's summary as the model (ConfigError, naming the bundle, when it is not one)."""
    try:
        return AdmissionSummary.from_summary(summary)
    except ModelError as exc:
        raise ConfigError(f"{where}: the admission member's {exc}; rebuild the bundle") from exc
def _drain_guard(raw: Mapping[str, Any]) -> DrainGuard:
    """The selector's drain guard from the summary's (which may also carry its source digest)."""
    return DrainGuard.from_dict({f: raw[f] for f in DRAIN_GUARD_FIELDS if f in raw})


@dataclass(frozen=True, slots=True)
class TrtllmExport:
    """A rendered (and, once written, exported) package.

    Attributes:
        files: file name -> exact bytes, in :data:`TRTLLM_FILES` order.
        receipt_sha256: SHA-256 of the receipt file bytes (the operator's pin).
        admitted: the receipt's admitted flag.
        notes: human lines (approximations, omitted optional fields).
        out_dir: where the files were written (None when only rendered).
    """

    files: Mapping[str, bytes]
    receipt_sha256: str
    admitted: bool
    notes: tuple[str, ...] = ()
    out_dir: Path | None = None
    paths: tuple[Path, ...] = field(default=())
    mixed: bool = False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "out_dir": str(self.out_dir) if self.out_dir is not None else None,
            "files": {name: sha256_hex(data) for name, data in self.files.items()},
            "receipt_sha256": self.receipt_sha256,
            "admitted": self.admitted,
            "mixed": self.mixed,
            "notes": list(self.notes),
        }


def _yaml_str(text: str) -> str:
    # A JSON string literal is a valid YAML double-quoted scalar.
    return json.dumps(text)


def render_trtllm(
    inputs: TrtllmInputs,
    *,
    selector_identity: str,
    deploy_dir: str = _DEFAULT_DEPLOY_DIR,
    live_fingerprint: Fingerprint | None = None,
    mixed_identity: MixedIdentity | None = None,
) -> TrtllmExport:
    """Render the five files (eight with mixed evidence) from values. Pure; does not validate
    (see :func:`validate_trtllm`).

    Args:
        inputs: from :meth:`TrtllmInputs.from_bundle`.
        selector_identity: ``EXACT_SPS_SELECTOR_IDENTITY_SHA256`` of the deployed engine.
        deploy_dir: where the files will live on the serving nodes (paths in the YAML).
        live_fingerprint: an independently collected live fingerprint; its ten fields must equal
            the bundle's (default: the bundle's own).
        mixed_identity: the mixed live identity observed on the deployment (default: derived
            from the fingerprint, ``docs/mixed.md``); its route must be the evidence's.

    Raises:
        ConfigError: the selector identity or deploy dir is malformed, a field the package needs
            is missing, the live fingerprint differs from the bundle's, or the mixed evidence
            cannot back a receipt on TensorRT-LLM's mixed route.
    """
    _check_render_arguments(selector_identity, deploy_dir)
    fp10 = _engine_fields(inputs.fingerprint, live_fingerprint)
    k = int(fp10["max_draft_len"])
    notes: list[str] = []
    sps_bytes = canonical_json(_render_sps(inputs, fp10))
    sts_bytes = _render_sts(inputs, k, notes)
    live_bytes = canonical_json(fp10)
    body = _receipt_body(
        inputs.summary, fp10, selector_identity, sps=sps_bytes, sts=sts_bytes, live=live_bytes
    )
    receipt = {"schema_version": 1, "admission": body, "admission_sha256": sha256_hex(canonical_json(body))}
    receipt_bytes = canonical_json(receipt)
    receipt_sha = sha256_hex(receipt_bytes)
    if not inputs.summary.admitted:
        notes.append(
            "the receipt does not admit (net value <= 0 or no compact choice): TensorRT-LLM will run static K"
        )
    base = deploy_dir.rstrip("/") or "/"
    lines = _yaml_lines(inputs, k, base, receipt_sha)
    mixed_files: dict[str, bytes] = {}
    if inputs.mixed is not None:
        mixed_files = _render_mixed_files(inputs.fingerprint, inputs.mixed, selector_identity, mixed_identity)
        lines.append("  confidence_mixed_evidence:")
        for key, value in config_block(mixed_files, inputs.mixed.protocol_sha256, base).items():
            lines.append(f"    {key}: {_yaml_str(value)}")
        if inputs.mixed.synthetic:
            notes.append("the mixed evidence is synthetic (synthetic: true): TensorRT-LLM never serves it")
    yaml_bytes = ("\n".join(lines) + "\n").encode("ascii")
    files = {
        SPS_FILE: sps_bytes,
        STS_FILE: sts_bytes,
        LIVE_FILE: live_bytes,
        RECEIPT_FILE: receipt_bytes,
        YAML_FILE: yaml_bytes,
        **mixed_files,
    }
    return TrtllmExport(
        files=files,
        receipt_sha256=receipt_sha,
        admitted=inputs.summary.admitted,
        notes=tuple(notes),
        mixed=bool(mixed_files),
    )


def _check_render_arguments(selector_identity: str, deploy_dir: str) -> None:
    """Raise ConfigError unless the selector identity is 64 lowercase hex and the deploy dir an
    absolute, printable ASCII path."""
    if not is_sha256_hex(selector_identity):
        raise ConfigError(
            f"--selector-identity {selector_identity!r} is not 64 lowercase hex characters; copy "
            "EXACT_SPS_SELECTOR_IDENTITY_SHA256 from "
            "tensorrt_llm/_torch/speculative/dspark_planner.py of the "
            "engine you deploy"
        )
    if not is_printable_ascii(deploy_dir) or not deploy_dir.startswith("/"):
        raise ConfigError(f"--deploy-dir {deploy_dir!r} must be an absolute, printable ASCII path")


def _engine_fields(fp: Fingerprint, live_fingerprint: Fingerprint | None) -> dict[str, Any]:
    """The bundle fingerprint's ten TensorRT-LLM fields, once a given live fingerprint agrees."""
    try:
        fp10 = fp.trtllm_fields()
    except ModelError as exc:
        raise ConfigError(f"bundle fingerprint: {exc}") from exc
    if live_fingerprint is not None:
        diff = [n for n, _, _ in fp.diff(live_fingerprint, TRTLLM_FINGERPRINT_FIELDS)]
        if diff:
            raise ConfigError(
                f"live fingerprint differs from the bundle's in {diff}; this bundle is not for this engine"
            )
    return fp10


def _render_sps(inputs: TrtllmInputs, fp10: Mapping[str, Any]) -> dict[str, Any]:
    """``sps_table.json``: the cost tables per G, their measurements and, with compact cells, the
    drain guard."""
    summary = inputs.summary
    table = inputs.cost_table
    tables: dict[str, dict[str, list[Any]]] = {}
    measurements = []
    for cell in table.rows:
        g, v, t = cell.graph_batch_size, cell.verifier_budget, cell.step_time_ms
        entry = tables.setdefault(str(g), {"token_counts": [], "step_time_ms": []})
        entry["token_counts"].append(v)
        entry["step_time_ms"].append(t)
        measurements.append(
            {
                "rank_local_graph_batch_size": g,
                "rank_local_verifier_budget": v,
                "step_time_ms": t,
                "source_result_sha256": str(cell.source_result_sha256),
            }
        )
    sps: dict[str, Any] = {
        "schema_version": 2,
        "cost_tables": tables,
        "measurements": measurements,
        "engine_fingerprint": fp10,
        "engine_fingerprint_sha256": sha256_hex(canonical_json(fp10)),
        "minimum_predicted_gain": table.minimum_predicted_gain,
    }
    has_compact = any(cell.verifier_budget != NATIVE_BUDGET for cell in table.rows)
    if has_compact and table.drain_guard is not None:
        sps["iteration_drain_guard"] = {
            **table.drain_guard.to_dict(),
            "source_result_sha256": summary.workload_identity_sha256,
        }
    return sps


def _render_sts(inputs: TrtllmInputs, k: int, notes: list[str]) -> bytes:
    """``sts.json``: the temperatures, and the sample count and mean ECEs where they qualify
    (appends a note for each approximation or omission).

    Raises:
        ConfigError: a position has no STS temperature (TensorRT-LLM applies STS only).
    """
    cal = inputs.calibration
    try:
        temps = Calibration.from_rows(cal, use="sts").sts_temperatures()
    except ConfigError as exc:
        raise ConfigError(f"{exc}; TensorRT-LLM applies STS only") from None
    assert temps is not None  # use="sts" makes every position STS
    methods = sorted({str(r["method"]) for r in cal} - {"sts"})
    if methods:
        notes.append(f"calibration methods {methods} exported as their best STS approximation temperatures")
    samples = int(cal[0]["risk_set_size"]) if cal else 0
    if samples < STS_MIN_NUM_SAMPLES:
        notes.append(
            f"num_samples omitted from {STS_FILE}: the fit used {samples} rounds (< {STS_MIN_NUM_SAMPLES})"
        )
    eces: dict[str, float | None] = {}
    for key in ("ece_before", "ece_after"):
        # One number: the mean over positions of the calibration's per-position ECE (the form the
        # project's STS parser reads; TensorRT-LLM reads only the temperatures).
        values: list[Any] = [r.get(key) for r in cal]
        ok = values and all(isinstance(x, int | float) and math.isfinite(x) and 0 <= x <= 1 for x in values)
        eces[key] = math.fsum(float(x) for x in values) / len(values) if ok else None
    return sts_document(
        temps,
        ece_before=eces["ece_before"],
        ece_after=eces["ece_after"],
        dataset=f"dspark-calibrate calibration {inputs.calibration_logical_sha256}",
        num_samples=samples if samples >= STS_MIN_NUM_SAMPLES else None,
        max_draft_len=k,
    ).to_bytes()


def _receipt_body(
    summary: AdmissionSummary,
    fp10: Mapping[str, Any],
    selector_identity: str,
    *,
    sps: bytes,
    sts: bytes,
    live: bytes,
) -> dict[str, Any]:
    """The receipt's ``admission`` object: the pins of the three files and the signed economics."""
    return {
        "physical_k": int(fp10["max_draft_len"]),
        "source_head": fp10["source_head"],
        "source_diff_sha256": fp10["source_diff_sha256"],
        "runtime_snapshot": fp10["runtime_snapshot"],
        "sps_cost_table_sha256": sha256_hex(sps),
        "live_engine_fingerprint_sha256": sha256_hex(live),
        "selector_identity_sha256": selector_identity,
        "workload_identity_sha256": summary.workload_identity_sha256,
        "calibration_result_sha256": sha256_hex(sts),
        "selector_replay_sha256": summary.selector_replay_sha256,
        **summary.receipt.to_dict(),
        "admitted": summary.admitted,
    }


def _yaml_lines(inputs: TrtllmInputs, k: int, base: str, receipt_sha: str) -> list[str]:
    """The decode part of ``extra_llm_api_options.yaml``, one line each (paths under ``base``)."""
    lines = [
        "# DSpark confidence-guided verification for TensorRT-LLM (generated by dspark-calibrate).",
        f"# Bundle version {inputs.bundle_version}, deployment {inputs.fingerprint.digest()[:16]}; merge speculative_config",
        "# into your extra LLM API options (speculative_model and other engine options stay yours).",
        "speculative_config:",
        "  decoding_type: DSpark",
        f"  max_draft_len: {k}",
        "  enable_confidence_scheduling: true",
    ]
    for key, name in _YAML_PATHS.items():
        lines.append(f"  {key}: {_yaml_str(base.rstrip('/') + '/' + name)}")
    lines.append(f"  confidence_admission_receipt_sha256: {_yaml_str(receipt_sha)}")
    return lines


def _render_mixed_files(
    fp: Fingerprint, m: MixedSource, selector_identity: str, mixed_identity: MixedIdentity | None
) -> dict[str, bytes]:
    """The three mixed files, bound to the observed mixed identity (derived from ``fp`` by default)."""
    derived = MixedIdentity.derive(
        fp,
        selector_identity=selector_identity,
        body_buckets=m.route.body_buckets,
        execution_mode=m.route.execution_mode,
        world_size=m.route.world_size,
    )
    return render_mixed(
        MixedExportInputs(
            identity=observed_identity(derived, mixed_identity),
            protocol_sha256=m.protocol_sha256,
            minimum_predicted_gain=m.minimum_predicted_gain,
            synthetic=m.synthetic,
            cells=cells_of(m.rows),
            gates=m.gates,
            results=m.results,
            economics=m.economics,
        )
    )


# ---------------------------------------------------------------------------------------------
# Validation (pure): every consumer rule, one finding per violation
# ---------------------------------------------------------------------------------------------


def _is_int(x: Any, minimum: int | None = None) -> bool:
    return type(x) is int and (minimum is None or x >= minimum)


def _is_num(x: Any, *, positive: bool = False, nonneg: bool = False) -> bool:
    if type(x) not in (int, float) or not math.isfinite(x):
        return False
    return (x > 0 if positive else True) and (x >= 0 if nonneg else True)


def _parse(c: _Rules, files: Mapping[str, bytes], name: str) -> Any:
    data = files.get(name)
    if data is None:
        c.fail(name, "missing", "file is missing from the package")
        return None
    try:
        data.decode("ascii")
    except UnicodeDecodeError:
        c.fail(name, "ascii", "must be ASCII (identity strings are printable ASCII)")
        return None
    if name == YAML_FILE:
        return data
    try:
        obj = loads_strict(data, what=name)
    except JsonError as exc:
        c.fail(name, "json", str(exc))
        return None
    try:
        canonical = canonical_json(obj)
    except JsonError:
        canonical = b""
    if canonical != data:
        c.fail(
            name, "canonical", "bytes are not canonical JSON (sorted keys, ',' ':' separators, no whitespace)"
        )
    return obj


def _check_fingerprint(c: _Rules, file: str, fp: Any, rule: str) -> bool:
    if not isinstance(fp, dict) or set(fp) != set(TRTLLM_FINGERPRINT_FIELDS):
        have = sorted(fp) if isinstance(fp, dict) else type(fp).__name__
        c.fail(file, rule, f"engine fingerprint must have exactly the ten fields, got {have}")
        return False
    ok = True
    for key in ("gpu", "runtime_snapshot", "source_head", "topology"):
        if not fp[key] or not is_printable_ascii(fp[key]):
            c.fail(
                file, rule, f"fingerprint.{key} must be a non-empty printable ASCII string", actual=fp[key]
            )
            ok = False
    for key in ("gpu_snapshot_sha256", "source_diff_sha256"):
        if not is_sha256_hex(fp[key]):
            c.fail(file, rule, f"fingerprint.{key} must be lowercase SHA-256 hex", actual=fp[key])
            ok = False
    for key in ("gpu_count", "max_draft_len"):
        if not _is_int(fp[key], 1):
            c.fail(file, rule, f"fingerprint.{key} must be a JSON integer >= 1", actual=fp[key])
            ok = False
    for key in ("rank_local_graph_batch_sizes", "global_graph_batch_sizes"):
        v = fp[key]
        if not isinstance(v, list) or not v or not all(_is_int(x, 1) for x in v) or len(set(v)) != len(v):
            c.fail(
                file,
                rule,
                f"fingerprint.{key} must be a non-empty list of distinct JSON integers >= 1",
                actual=v,
            )
            ok = False
    if ok and sorted(fp["global_graph_batch_sizes"]) != sorted(
        g * fp["gpu_count"] for g in fp["rank_local_graph_batch_sizes"]
    ):
        c.fail(file, rule, "global_graph_batch_sizes must be rank-local sizes x gpu_count")
        ok = False
    return ok


def _check_sps(c: _Rules, sps: Any) -> tuple[int | None, dict[int, list[int]], dict[str, Any] | None]:
    f = SPS_FILE
    if not isinstance(sps, dict):
        c.fail(f, "keys", "must be a JSON object")
        return None, {}, None
    fp_ok = _check_sps_header(c, sps)
    fp: Any = sps.get("engine_fingerprint")
    k = fp["max_draft_len"] if fp_ok else None
    cells, times = _check_cost_tables(c, sps.get("cost_tables"), k)
    if k is not None:
        total = sum(1 for g, vs in cells.items() for v in vs[1:] if cell_kind(g, v, k) is CellKind.COMPACT)
        if total > MAX_COMPACT_CELLS_TOTAL:
            c.fail(f, "cell_limits", f"{total} compact cells (engine limit {MAX_COMPACT_CELLS_TOTAL})")
    if fp_ok and set(cells) != set(fp["rank_local_graph_batch_sizes"]):
        c.fail(
            f,
            "ladder",
            "cost_tables G must equal the fingerprint's rank_local_graph_batch_sizes",
            sorted(fp["rank_local_graph_batch_sizes"]),
            sorted(cells),
        )
    _check_measurements(c, sps.get("measurements"), times)
    _check_drain_guard(c, sps.get("iteration_drain_guard"), cells)
    return k, cells, (fp if fp_ok else None)


def _check_sps_header(c: _Rules, sps: dict[str, Any]) -> bool:
    """The keys, nulls, schema version, fingerprint (and its digest) and margin of
    ``sps_table.json``; True when the fingerprint is well-formed."""
    f = SPS_FILE
    extra = sorted(set(sps) - _SPS_REQUIRED - {"iteration_drain_guard"})
    missing = sorted(_SPS_REQUIRED - set(sps))
    if extra or missing:
        c.fail(f, "keys", f"top-level keys: unknown {extra}, missing {missing}")
    if _has_null(sps):
        c.fail(f, "nulls", "no value may be null")
    if sps.get("schema_version") != 2 or not _is_int(sps.get("schema_version")):
        c.fail(f, "schema_version", "schema_version must be the JSON integer 2", 2, sps.get("schema_version"))
    fp: Any = sps.get("engine_fingerprint")
    fp_ok = _check_fingerprint(c, f, fp, "fingerprint")
    if fp_ok and sps.get("engine_fingerprint_sha256") != sha256_hex(canonical_json(fp)):
        c.fail(
            f,
            "fingerprint_sha256",
            "engine_fingerprint_sha256 is not the SHA-256 of the fingerprint's canonical JSON",
        )
    if not _is_num(sps.get("minimum_predicted_gain"), nonneg=True):
        c.fail(f, "minimum_predicted_gain", "minimum_predicted_gain must be a finite number >= 0")
    return fp_ok


def _check_cost_tables(
    c: _Rules, tables: Any, k: int | None
) -> tuple[dict[int, list[int]], dict[tuple[int, int], Any]]:
    """``(budgets per G, step time per (G, V))`` of the well-formed ``cost_tables`` entries."""
    cells: dict[int, list[int]] = {}
    times: dict[tuple[int, int], Any] = {}
    if not isinstance(tables, dict) or not tables:
        c.fail(SPS_FILE, "cost_tables", "cost_tables must be a non-empty object keyed by G")
        tables = {}
    for key, entry in tables.items():
        table = _check_cost_table(c, key, entry)
        if table is None:
            continue
        g, vs, ts = table
        cells[g] = vs
        times.update({(g, v): t for v, t in zip(vs, ts, strict=True)})
        if k is not None:
            _check_budgets(c, g, vs, k)
    return cells, times


def _check_cost_table(c: _Rules, key: str, entry: Any) -> tuple[int, list[int], list[Any]] | None:
    """``(G, budgets, step times)`` of one ``cost_tables`` entry; None when its shape is wrong."""
    f = SPS_FILE
    if not (key.isascii() and key.isdecimal() and not key.startswith("0")):
        c.fail(f, "g_keys", f"cost_tables key {key!r} is not a canonical positive decimal integer")
        return None
    if not isinstance(entry, dict) or set(entry) != {"token_counts", "step_time_ms"}:
        c.fail(f, "table_keys", f"cost_tables[{key}] must have exactly token_counts and step_time_ms")
        return None
    vs, ts = entry["token_counts"], entry["step_time_ms"]
    if not isinstance(vs, list) or not isinstance(ts, list) or not vs or len(vs) != len(ts):
        c.fail(
            f,
            "token_counts",
            f"cost_tables[{key}]: token_counts and step_time_ms need equal, non-zero lengths",
        )
        return None
    if not all(_is_int(v, 0) for v in vs) or any(b <= a for a, b in itertools.pairwise(vs)) or vs[0] != 0:
        c.fail(
            f,
            "token_counts",
            f"cost_tables[{key}].token_counts must be JSON ints, strictly increasing, first 0",
            actual=vs,
        )
        return None
    if not all(_is_num(t, positive=True) for t in ts):
        c.fail(f, "step_times", f"cost_tables[{key}].step_time_ms must be finite positive numbers")
    return int(key), vs, ts


def _check_budgets(c: _Rules, g: int, vs: list[int], k: int) -> None:
    """One G's budgets: inside G <= V <= G*(K+1), never V=G, at most the engine's compact cells."""
    f = SPS_FILE
    bad = [v for v in vs[1:] if cell_kind(g, v, k) is None]
    if bad:
        c.fail(f, "budget_range", f"G={g}: budgets {bad} outside G <= V <= G*(K+1)")
    if any(cell_kind(g, v, k) is CellKind.COMPACT and not is_deployable(g, v, k) for v in vs[1:]):
        c.fail(f, "v_equals_g", f"G={g}: V=G can never carry a real row; do not deploy it")
    compact = [v for v in vs[1:] if cell_kind(g, v, k) is CellKind.COMPACT]
    if len(compact) > MAX_COMPACT_CELLS_PER_G:
        c.fail(
            f,
            "cell_limits",
            f"G={g} has {len(compact)} compact cells (engine limit {MAX_COMPACT_CELLS_PER_G})",
        )


def _check_measurements(c: _Rules, ms: Any, times: Mapping[tuple[int, int], Any]) -> None:
    """``measurements``: well-formed, no cell twice, and exactly the cost tables' cells and times."""
    f = SPS_FILE
    if not isinstance(ms, list) or not ms:
        c.fail(f, "measurements", "measurements must be a non-empty list")
        ms = []
    seen: dict[tuple[int, int], Any] = {}
    for i, m in enumerate(ms):
        if (
            not isinstance(m, dict)
            or set(m) != _MEASUREMENT_FIELDS
            or not _is_int(m["rank_local_graph_batch_size"], 1)
            or not _is_int(m["rank_local_verifier_budget"], 0)
            or not _is_num(m["step_time_ms"], positive=True)
            or not is_sha256_hex(m["source_result_sha256"])
        ):
            c.fail(
                f,
                "measurements",
                f"measurements[{i}] must have exactly {sorted(_MEASUREMENT_FIELDS)} with valid values",
            )
            continue
        pair = (m["rank_local_graph_batch_size"], m["rank_local_verifier_budget"])
        if pair in seen:
            c.fail(f, "measurements", f"measurement for {pair} appears twice")
        seen[pair] = m["step_time_ms"]
    if seen and (set(seen) != set(times) or any(seen[p] != times[p] for p in seen if p in times)):
        c.fail(
            f,
            "measurements",
            "measurements must mirror cost_tables exactly (same cells, same times)",
            sorted(times),
            sorted(seen),
        )


def _check_drain_guard(c: _Rules, guard: Any, cells: Mapping[int, list[int]]) -> None:
    """``iteration_drain_guard`` when present: its exact fields, valid, on a measured native table."""
    f = SPS_FILE
    if guard is None:
        return
    if (
        not isinstance(guard, dict)
        or set(guard) != _GUARD_FIELDS
        or not _is_num(guard["loss_multiplier"], positive=True)
        or not _is_num(guard["mean_output_tokens_per_request_iteration"], positive=True)
        or not _is_num(guard["minimum_group_value_ms"], nonneg=True)
        or not _is_int(guard["tail_graph_batch_size"], 1)
        or not is_sha256_hex(guard["source_result_sha256"])
    ):
        c.fail(
            f,
            "drain_guard",
            f"iteration_drain_guard must have exactly {sorted(_GUARD_FIELDS)} with valid values",
        )
    elif guard["tail_graph_batch_size"] not in cells:
        c.fail(
            f,
            "drain_guard",
            f"drain guard tail G={guard['tail_graph_batch_size']} has no measured native table",
        )


def _check_sts(c: _Rules, sts: Any, k: int | None) -> None:
    """``sts.json`` by the one STS reader's rules (:func:`check_sts_object`), its first broken rule
    a finding."""
    try:
        check_sts_object(sts, where=STS_FILE, k=k)
    except StsError as exc:
        c.fail(STS_FILE, exc.rule, str(exc))


def _check_receipt(
    c: _Rules,
    receipt: Any,
    files: Mapping[str, bytes],
    fp: dict[str, Any] | None,
    cells: Mapping[int, list[int]],
    has_guard: bool,
    k: int | None,
    selector_identity: str | None,
) -> None:
    f = RECEIPT_FILE
    if not isinstance(receipt, dict) or set(receipt) != {"schema_version", "admission", "admission_sha256"}:
        c.fail(f, "keys", "receipt must have exactly schema_version, admission, admission_sha256")
        return
    if not _is_int(receipt["schema_version"]) or receipt["schema_version"] != 1:
        c.fail(f, "schema_version", "schema_version must be the JSON integer 1")
    body = receipt["admission"]
    if not isinstance(body, dict) or set(body) != set(ADMISSION_BODY_FIELDS):
        have = sorted(body) if isinstance(body, dict) else type(body).__name__
        c.fail(f, "body_keys", f"admission must have exactly the 16 fields; got {have}")
        return
    if receipt["admission_sha256"] != sha256_hex(canonical_json(body)):
        c.fail(f, "admission_sha256", "admission_sha256 is not the SHA-256 of the body's canonical JSON")
    for key, name in (
        ("sps_cost_table_sha256", SPS_FILE),
        ("live_engine_fingerprint_sha256", LIVE_FILE),
        ("calibration_result_sha256", STS_FILE),
    ):
        if name in files and body[key] != sha256_hex(files[name]):
            c.fail(f, "pins", f"{key} does not pin the bytes of {name}", sha256_hex(files[name]), body[key])
    for key in (
        "selector_identity_sha256",
        "workload_identity_sha256",
        "selector_replay_sha256",
        "source_diff_sha256",
    ):
        if not is_sha256_hex(body[key]):
            c.fail(f, "hashes", f"{key} must be lowercase SHA-256 hex", actual=body[key])
    if selector_identity is not None and body["selector_identity_sha256"] != selector_identity:
        c.fail(
            f,
            "selector_identity",
            "selector_identity_sha256 is not the engine's selector identity",
            selector_identity,
            body["selector_identity_sha256"],
        )
    if fp is not None:
        want = {
            "physical_k": fp["max_draft_len"],
            "source_head": fp["source_head"],
            "source_diff_sha256": fp["source_diff_sha256"],
            "runtime_snapshot": fp["runtime_snapshot"],
        }
        for key, value in want.items():
            if body[key] != value or (key == "physical_k" and not _is_int(body[key])):
                c.fail(f, "deployment", f"{key} must repeat the engine fingerprint", value, body[key])
    _check_receipt_economics(c, body, cells, has_guard, k)


def _check_receipt_economics(
    c: _Rules, body: dict[str, Any], cells: Mapping[int, list[int]], has_guard: bool, k: int | None
) -> None:
    """The receipt's counts and amounts, its admitted flag against them, and the guard compact
    choices need."""
    f = RECEIPT_FILE
    steps, choices = body["policy_steps"], body["compact_choices"]
    counts_ok = _is_int(steps, 1) and _is_int(choices, 0) and choices <= steps
    if not counts_ok:
        c.fail(
            f,
            "counts",
            "policy_steps must be a JSON int >= 1 and compact_choices a JSON int in [0, policy_steps]",
        )
    amounts_ok = all(_is_num(body[a], nonneg=True) for a in _AMOUNTS)
    if not amounts_ok:
        c.fail(f, "amounts", f"{list(_AMOUNTS)} must be finite numbers >= 0")
    if not isinstance(body["admitted"], bool):
        c.fail(f, "admitted", "admitted must be a JSON boolean")
    elif counts_ok and amounts_ok:
        receipt = ReceiptEconomics.from_dict(body)
        if body["admitted"] != receipt.admitted:
            c.fail(
                f,
                "admitted",
                f"admitted must equal (compact_choices > 0 and net value {receipt.net_value_ms:.6g} > 0)",
                receipt.admitted,
                body["admitted"],
            )
    if counts_ok and choices > 0:
        compact = k is not None and any(
            cell_kind(g, v, k) is CellKind.COMPACT for g, vs in cells.items() for v in vs[1:]
        )
        if not has_guard or not compact:
            c.fail(
                f,
                "compact_needs_guard",
                "compact_choices > 0 needs an iteration_drain_guard and a compact cell",
            )


def _check_yaml(
    c: _Rules, data: bytes | None, files: Mapping[str, bytes], k: int | None, *, mixed: bool = False
) -> None:
    f = YAML_FILE
    if data is None:
        return
    try:
        doc = load_yaml(data, what="options")
    except YamlError as exc:
        c.fail(f, "parse", str(exc))
        return
    spec = doc.get("speculative_config") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or set(doc) != {"speculative_config"} or not isinstance(spec, dict):
        c.fail(f, "keys", "must hold exactly one mapping, speculative_config")
        return
    want = set(_YAML_KEYS) | ({"confidence_mixed_evidence"} if mixed else set())
    if set(spec) != want:
        c.fail(f, "keys", f"speculative_config keys must be {sorted(want)}", actual=sorted(spec))
        return
    if spec["decoding_type"] != "DSpark" or spec["enable_confidence_scheduling"] is not True:
        c.fail(f, "values", "decoding_type must be DSpark and enable_confidence_scheduling true")
    if type(spec["max_draft_len"]) is not int or (k is not None and spec["max_draft_len"] != k):
        c.fail(f, "values", f"max_draft_len must be K={k}", k, spec["max_draft_len"])
    for key, name in _YAML_PATHS.items():
        p = spec[key]
        if not isinstance(p, str) or not p.startswith("/") or Path(p).name != name:
            c.fail(f, "paths", f"{key} must be an absolute path to {name}", actual=p)
    if RECEIPT_FILE in files and spec["confidence_admission_receipt_sha256"] != sha256_hex(
        files[RECEIPT_FILE]
    ):
        c.fail(
            f,
            "receipt_sha256",
            "confidence_admission_receipt_sha256 must be the SHA-256 of the receipt file bytes",
        )


def validate_trtllm(
    files: Mapping[str, bytes], *, selector_identity: str | None = None, allow_synthetic: bool = False
) -> list[Finding]:
    """Check a package against every consumer rule of DESIGN §6 (empty list: valid), and its mixed
    files, when present, against ``TRTLLM_MIXED.md`` (:func:`~._trtllm_mixed.validate_mixed`).

    Each violation is a ``CONTENT_INVALID`` finding whose field is ``<file>:<rule>``, e.g.
    ``sps_table.json:token_counts`` or ``admission_receipt.json:pins``.
    """
    c = _Rules()
    mixed = any(name in files for name in TRTLLM_MIXED_FILES)
    unknown = sorted(set(files) - set(TRTLLM_FILES) - set(TRTLLM_MIXED_FILES))
    if unknown:
        c.fail("package", "files", f"unexpected files {unknown}")
    sps = _parse(c, files, SPS_FILE)
    sts = _parse(c, files, STS_FILE)
    live = _parse(c, files, LIVE_FILE)
    receipt = _parse(c, files, RECEIPT_FILE)
    yaml_bytes = _parse(c, files, YAML_FILE)
    k, cells, fp = _check_sps(c, sps) if sps is not None else (None, {}, None)
    if sts is not None:
        _check_sts(c, sts, k)
    if (
        live is not None
        and _check_fingerprint(c, LIVE_FILE, live, "fingerprint")
        and fp is not None
        and live != fp
    ):
        diff = sorted(key for key in fp if fp[key] != live[key])
        c.fail(LIVE_FILE, "matches_table", f"live fingerprint differs from the table's in {diff}")
    if receipt is not None:
        has_guard = isinstance(sps, dict) and isinstance(sps.get("iteration_drain_guard"), dict)
        _check_receipt(c, receipt, files, fp, cells, has_guard, k, selector_identity)
    _check_yaml(c, yaml_bytes if isinstance(yaml_bytes, bytes) else None, files, k, mixed=mixed)
    if mixed:
        c.findings += validate_mixed(
            {n: files[n] for n in TRTLLM_MIXED_FILES if n in files},
            options_yaml=files.get(YAML_FILE),
            options_file=YAML_FILE,
            allow_synthetic=allow_synthetic,
        )
    return c.findings


# ---------------------------------------------------------------------------------------------
# The edge: verified bundle in, files out
# ---------------------------------------------------------------------------------------------


def export_trtllm(
    bundle_report: BundleReport,
    out_dir: Path | str,
    *,
    selector_identity: str,
    deploy_dir: str | None = None,
    live_fingerprint: Fingerprint | None = None,
    overwrite: bool = False,
    writer: Callable[[Path, bytes], None] | None = None,
    mixed: MixedReport | None = None,
    mixed_identity: MixedIdentity | None = None,
    allow_synthetic: bool = False,
) -> TrtllmExport:
    """Export a verified bundle into ``out_dir`` (validated first, written atomically).

    Args:
        bundle_report: a passing :func:`verify_bundle` report (unverified input is refused).
        out_dir: the directory to create (or replace with ``overwrite``).
        selector_identity: the engine's ``EXACT_SPS_SELECTOR_IDENTITY_SHA256``.
        deploy_dir: where the files will live on serving nodes (default: ``out_dir``, absolute).
        live_fingerprint: an independently collected live fingerprint to bind (optional).
        overwrite: replace an existing ``out_dir``.
        writer: file writer (injected for tests; default atomic writes).
        mixed: the bundle's passing :func:`~._mixed_bundle.verify_mixed` report, to export its
            mixed evidence too (None: decode only).
        mixed_identity: the mixed live identity observed on the deployment (default: derived).
        allow_synthetic: accept synthetic mixed evidence (demos and tests).

    Raises:
        ConfigError: unverified bundle, bad selector identity, existing directory, I/O failure.
        ExportRejected: the rendered package breaks a consumer rule, or the mixed evidence cannot
            back a receipt on TensorRT-LLM's mixed route (nothing is written).
    """
    out = Path(out_dir)
    inputs = TrtllmInputs.from_bundle(bundle_report, mixed)
    try:
        rendered = render_trtllm(
            inputs,
            selector_identity=selector_identity,
            deploy_dir=deploy_dir if deploy_dir is not None else str(out.resolve()),
            live_fingerprint=live_fingerprint,
            mixed_identity=mixed_identity,
        )
    except MixedRefused as exc:
        raise ExportRejected(exc.findings) from exc
    findings = validate_trtllm(
        rendered.files, selector_identity=selector_identity, allow_synthetic=allow_synthetic
    )
    if findings:
        raise ExportRejected(findings)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; choose another --out or pass --force to replace it")
    write = writer or (lambda p, d: atomic_write_bytes(p, d))
    tmp = out.parent / f".{out.name}.export-{secrets.token_hex(6)}"
    published = False
    try:
        tmp.mkdir(parents=True)
        for name in rendered.files:
            write(tmp / name, rendered.files[name])
        publish_directory(tmp, out)
        published = True
    except OSError as exc:
        raise ConfigError(f"{out}: cannot write the TensorRT-LLM package ({exc.strerror or exc})") from exc
    finally:
        if not published:
            shutil.rmtree(tmp, ignore_errors=True)
    return TrtllmExport(
        files=rendered.files,
        receipt_sha256=rendered.receipt_sha256,
        admitted=rendered.admitted,
        notes=rendered.notes,
        out_dir=out,
        paths=tuple(out / name for name in rendered.files),
        mixed=rendered.mixed,
    )
