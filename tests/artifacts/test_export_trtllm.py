"""TensorRT-LLM export: golden bytes, the full verified path, and one rejection per consumer rule."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dspark_calibrate.artifacts import (
    AdmissionSummary,
    CostCell,
    CostTable,
    DrainGuard,
    canonical_json,
    sha256_hex,
    verify_bundle,
)
from dspark_calibrate.artifacts._bundle import BundleReport
from dspark_calibrate.artifacts._export_trtllm import (
    ADMISSION_BODY_FIELDS,
    LIVE_FILE,
    RECEIPT_FILE,
    SPS_FILE,
    STS_FILE,
    TRTLLM_FILES,
    YAML_FILE,
    ExportRejected,
    TrtllmInputs,
    export_trtllm,
    render_trtllm,
    validate_trtllm,
)
from dspark_calibrate.artifacts._reasons import Finding, Reason
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.errors import ConfigError
from tests.factories import NOW, make_fingerprint

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "vectors" / "export_trtllm"
SELECTOR = "5" * 64
LATER = NOW + timedelta(hours=1)
K = 5


def golden_inputs(summary_changes: Mapping[str, Any] | None = None, **overrides: Any) -> TrtllmInputs:
    """Fixed inputs: three G, two compact cells each, an STS calibration, an admitting summary
    (``summary_changes`` replace its keys)."""
    cells = []
    for g in (8, 16, 32):
        for v, t in ((0, 5.0 + g / 8), (3 * g, 4.25 + g / 10), (4 * g, 4.5 + g / 10)):
            cells.append(CostCell(g, v, t, source_result_sha256=sha256_hex(f"{g}/{v}".encode())))
    calibration = tuple(
        {
            "position": j,
            "method": "sts",
            "temperature": 1.0 + j / 10,
            "risk_set_size": 40_000 // j,
            "ece_before": 0.04 + j / 100,
            "ece_after": 0.01,
        }
        for j in range(1, K + 1)
    )
    summary = {
        "predicted_gain": 0.08,
        "predicted_gain_ci_low": 0.06,
        "predicted_gain_ci_high": 0.1,
        "static_goodput_tok_per_ms": 8.0,
        "dynamic_goodput_tok_per_ms": 8.64,
        "compact_step_share": 0.5,
        "policy_steps": 1000,
        "compact_choices": 500,
        "gross_compact_value_ms_lower_bound": 900.0,
        "fixed_confidence_path_overhead_ms_upper_bound": 0.25,
        "safety_margin_ms": 50.0,
        "net_value_ms": 600.0,
        "admitted": True,
        "minimum_predicted_gain": 0.01,
        "drain_guard": {
            "loss_multiplier": 1.25,
            "mean_output_tokens_per_request_iteration": 3.5,
            "minimum_group_value_ms": 0.0,
            "tail_graph_batch_size": 16,
        },
        "workload_identity_sha256": "e" * 64,
        "selector_replay_sha256": "f" * 64,
        "workload_approximate": False,
        "per_bucket": [],
    }
    base: dict[str, Any] = {
        "fingerprint": make_fingerprint(),
        "cost_table": _cost_table(cells, summary),
        "calibration": calibration,
        "calibration_logical_sha256": "d" * 64,
        "summary": AdmissionSummary.from_summary({**summary, **(summary_changes or {})}),
        "bundle_version": 3,
    }
    base.update(overrides)
    return TrtllmInputs(**base)


def _cost_table(cells: list[CostCell], summary: dict[str, Any]) -> CostTable:
    """The deployed cells under the summary's gain threshold and drain guard (as from_bundle builds it)."""
    return CostTable.from_cost_cells(
        K,
        cells,
        minimum_predicted_gain=summary["minimum_predicted_gain"],
        drain_guard=DrainGuard.from_dict(summary["drain_guard"]),
    )


def golden_files() -> dict[str, bytes]:
    out = render_trtllm(golden_inputs(), selector_identity=SELECTOR, deploy_dir="/etc/dspark/trtllm")
    return dict(out.files)


def test_golden_files(update_goldens: bool) -> None:
    files = golden_files()
    assert validate_trtllm(files, selector_identity=SELECTOR) == []
    if update_goldens:
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (GOLDEN_DIR / name).write_bytes(data)
    for name in TRTLLM_FILES:
        assert (GOLDEN_DIR / name).read_bytes() == files[name], (
            f"{name} changed; run pytest --update-goldens if intended"
        )


def test_package_shape() -> None:
    files = golden_files()
    sps = json.loads(files[SPS_FILE])
    assert list(sps["cost_tables"]) == ["16", "32", "8"]  # canonical JSON sorts the decimal keys as strings
    assert sps["cost_tables"]["8"]["token_counts"] == [0, 24, 32]
    assert sps["iteration_drain_guard"]["source_result_sha256"] == "e" * 64
    receipt = json.loads(files[RECEIPT_FILE])
    assert list(receipt["admission"]) == sorted(ADMISSION_BODY_FIELDS) and len(ADMISSION_BODY_FIELDS) == 16
    assert receipt["admission"]["calibration_result_sha256"] == sha256_hex(files[STS_FILE])
    assert json.loads(files[LIVE_FILE]) == sps["engine_fingerprint"]
    assert (
        f'confidence_admission_receipt_sha256: "{sha256_hex(files[RECEIPT_FILE])}"'
        in files[YAML_FILE].decode()
    )


def test_non_sts_calibration_exports_its_sts_approximation() -> None:
    inputs = golden_inputs()
    platt = tuple({**r, "method": "platt"} for r in inputs.calibration)
    out = render_trtllm(golden_inputs(calibration=platt), selector_identity=SELECTOR)
    assert any("best STS approximation" in n for n in out.notes)
    assert json.loads(out.files[STS_FILE])["sts_temperatures"] == [1.1, 1.2, 1.3, 1.4, 1.5]
    missing = tuple({**r, "temperature": None} for r in platt)
    with pytest.raises(ConfigError, match="no STS temperature"):
        render_trtllm(golden_inputs(calibration=missing), selector_identity=SELECTOR)


def test_small_calibrations_omit_num_samples_and_without_compact_cells_there_is_no_guard() -> None:
    small = tuple({**r, "risk_set_size": 500} for r in golden_inputs().calibration)
    native_only = [c for c in golden_inputs().cost_table.rows if c.verifier_budget == 0]
    changes = {"compact_choices": 0, "compact_step_share": 0.0, "admitted": False, "net_value_ms": -10.0}
    summary = {**golden_inputs().summary.to_summary(), **changes}
    out = render_trtllm(
        golden_inputs(changes, calibration=small, cost_table=_cost_table(native_only, summary)),
        selector_identity=SELECTOR,
    )
    assert "num_samples" not in json.loads(out.files[STS_FILE])
    assert "iteration_drain_guard" not in json.loads(out.files[SPS_FILE])
    assert not out.admitted and validate_trtllm(out.files) == []


@pytest.mark.parametrize("bad", ["", "5" * 63, "A" * 64, "g" * 64])
def test_selector_identity_must_be_64_lowercase_hex(bad: str) -> None:
    with pytest.raises(ConfigError, match="EXACT_SPS_SELECTOR_IDENTITY_SHA256"):
        render_trtllm(golden_inputs(), selector_identity=bad)


def test_live_fingerprint_must_match_the_bundle() -> None:
    with pytest.raises(ConfigError, match=r"differs from the bundle's in \['gpu'\]"):
        render_trtllm(
            golden_inputs(), selector_identity=SELECTOR, live_fingerprint=make_fingerprint(gpu="H100")
        )


# --- the validator rejects each consumer rule ---------------------------------------------------

Docs = dict[str, Any]


def _docs() -> Docs:
    files = golden_files()
    docs: Docs = {name: json.loads(files[name]) for name in (SPS_FILE, STS_FILE, LIVE_FILE, RECEIPT_FILE)}
    docs[YAML_FILE] = files[YAML_FILE].decode()
    return docs


def _pack(docs: Docs, *, repin: bool = True, rehash_body: bool = True) -> dict[str, bytes]:
    """Serialise the documents; re-pin the receipt and the YAML so only the intended defect remains."""
    files = {name: canonical_json(docs[name]) for name in (SPS_FILE, STS_FILE, LIVE_FILE)}
    receipt = docs[RECEIPT_FILE]
    body = receipt.get("admission")
    if repin and isinstance(body, dict):
        body["sps_cost_table_sha256"] = sha256_hex(files[SPS_FILE])
        body["live_engine_fingerprint_sha256"] = sha256_hex(files[LIVE_FILE])
        body["calibration_result_sha256"] = sha256_hex(files[STS_FILE])
    if rehash_body and isinstance(body, dict):
        receipt["admission_sha256"] = sha256_hex(canonical_json(body))
    files[RECEIPT_FILE] = canonical_json(receipt)
    text = docs[YAML_FILE]
    old = [line for line in text.splitlines() if "receipt_sha256" in line]
    if repin and old:
        text = text.replace(
            old[0], f'  confidence_admission_receipt_sha256: "{sha256_hex(files[RECEIPT_FILE])}"'
        )
    files[YAML_FILE] = text.encode()
    return files


def _table(d: Docs, g: str = "8") -> dict[str, list[Any]]:
    t: dict[str, list[Any]] = d[SPS_FILE]["cost_tables"][g]
    return t


def _add_cell(d: Docs, g: int, v: int, t: float = 4.0) -> None:
    tab = _table(d, str(g))
    pairs = sorted([*zip(tab["token_counts"], tab["step_time_ms"], strict=True), (v, t)])
    tab["token_counts"], tab["step_time_ms"] = [p[0] for p in pairs], [p[1] for p in pairs]
    d[SPS_FILE]["measurements"].append(
        {
            "rank_local_graph_batch_size": g,
            "rank_local_verifier_budget": v,
            "step_time_ms": t,
            "source_result_sha256": "a" * 64,
        }
    )


def _set(path: tuple[str, ...], value: Any) -> Callable[[Docs], None]:
    def mutate(d: Docs) -> None:
        obj = d
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value

    return mutate


def _delete(path: tuple[str, ...]) -> Callable[[Docs], None]:
    def mutate(d: Docs) -> None:
        obj = d
        for key in path[:-1]:
            obj = obj[key]
        del obj[path[-1]]

    return mutate


def _yaml(old: str, new: str) -> Callable[[Docs], None]:
    def mutate(d: Docs) -> None:
        assert old in d[YAML_FILE]
        d[YAML_FILE] = d[YAML_FILE].replace(old, new)

    return mutate


def _swap_first_budgets(d: Docs) -> None:
    t = _table(d)
    t["token_counts"][1], t["token_counts"][2] = t["token_counts"][2], t["token_counts"][1]


def _rename_g(d: Docs) -> None:
    d[SPS_FILE]["cost_tables"]["08"] = d[SPS_FILE]["cost_tables"].pop("8")


def _drop_g(d: Docs) -> None:
    del d[SPS_FILE]["cost_tables"]["32"]
    d[SPS_FILE]["measurements"] = [
        m for m in d[SPS_FILE]["measurements"] if m["rank_local_graph_batch_size"] != 32
    ]


def _drop_native(d: Docs) -> None:
    t = _table(d)
    t["token_counts"], t["step_time_ms"] = t["token_counts"][1:], t["step_time_ms"][1:]
    d[SPS_FILE]["measurements"] = [
        m
        for m in d[SPS_FILE]["measurements"]
        if (m["rank_local_graph_batch_size"], m["rank_local_verifier_budget"]) != (8, 0)
    ]


def _five_cells(d: Docs) -> None:
    for v in (9, 10, 11):
        _add_cell(d, 8, v)


def _measurement_time(d: Docs) -> None:
    d[SPS_FILE]["measurements"][0]["step_time_ms"] += 0.5


def _ladder_global(d: Docs) -> None:
    for name in (SPS_FILE,):
        d[name]["engine_fingerprint"]["global_graph_batch_sizes"] = [8, 16, 64]
    d[SPS_FILE]["engine_fingerprint_sha256"] = sha256_hex(canonical_json(d[SPS_FILE]["engine_fingerprint"]))


def _flip_admitted(d: Docs) -> None:
    d[RECEIPT_FILE]["admission"]["admitted"] = False


def _stale_receipt_body(d: Docs) -> None:
    d[RECEIPT_FILE]["admission"]["policy_steps"] = 999


RuleCase = tuple[str, Callable[[Docs], None], str, dict[str, Any]]
RULE_CASES: list[RuleCase] = [
    # sps_table.json
    ("sps unknown key", _set((SPS_FILE, "source"), "x"), "sps_table.json:keys", {}),
    ("sps null", _set((SPS_FILE, "minimum_predicted_gain"), None), "sps_table.json:nulls", {}),
    ("schema_version 1", _set((SPS_FILE, "schema_version"), 1), "sps_table.json:schema_version", {}),
    ("schema_version as float", _set((SPS_FILE, "schema_version"), 2.0), "sps_table.json:schema_version", {}),
    ("G key with a leading zero", _rename_g, "sps_table.json:g_keys", {}),
    (
        "table with an unknown key",
        _set((SPS_FILE, "cost_tables", "8", "p50"), [1.0]),
        "sps_table.json:table_keys",
        {},
    ),
    ("token counts not increasing", _swap_first_budgets, "sps_table.json:token_counts", {}),
    ("no native cell first", _drop_native, "sps_table.json:token_counts", {}),
    (
        "token count is a float",
        _set((SPS_FILE, "cost_tables", "8", "token_counts", 1), 24.0),
        "sps_table.json:token_counts",
        {},
    ),
    (
        "step time not positive",
        _set((SPS_FILE, "cost_tables", "8", "step_time_ms", 1), 0.0),
        "sps_table.json:step_times",
        {},
    ),
    ("budget above full width", lambda d: _add_cell(d, 8, 49), "sps_table.json:budget_range", {}),
    ("V=G deployed", lambda d: _add_cell(d, 8, 8), "sps_table.json:v_equals_g", {}),
    ("five compact cells for one G", _five_cells, "sps_table.json:cell_limits", {}),
    ("G set differs from the ladder", _drop_g, "sps_table.json:ladder", {}),
    ("measurement missing", lambda d: d[SPS_FILE]["measurements"].pop(), "sps_table.json:measurements", {}),
    ("measurement time differs", _measurement_time, "sps_table.json:measurements", {}),
    (
        "measurement hash not hex",
        _set((SPS_FILE, "measurements", 0, "source_result_sha256"), "xyz"),
        "sps_table.json:measurements",
        {},
    ),
    (
        "fingerprint extra field",
        _set((SPS_FILE, "engine_fingerprint", "kv_dtype"), "bf16"),
        "sps_table.json:fingerprint",
        {},
    ),
    (
        "fingerprint digest stale",
        _set((SPS_FILE, "engine_fingerprint_sha256"), "0" * 64),
        "sps_table.json:fingerprint_sha256",
        {},
    ),
    ("global ladder inconsistent", _ladder_global, "sps_table.json:fingerprint", {}),
    (
        "negative minimum gain",
        _set((SPS_FILE, "minimum_predicted_gain"), -0.01),
        "sps_table.json:minimum_predicted_gain",
        {},
    ),
    (
        "drain guard unknown field",
        _set((SPS_FILE, "iteration_drain_guard", "extra"), 1),
        "sps_table.json:drain_guard",
        {},
    ),
    (
        "drain guard zero multiplier",
        _set((SPS_FILE, "iteration_drain_guard", "loss_multiplier"), 0.0),
        "sps_table.json:drain_guard",
        {},
    ),
    (
        "drain guard tail not measured",
        _set((SPS_FILE, "iteration_drain_guard", "tail_graph_batch_size"), 12),
        "sps_table.json:drain_guard",
        {},
    ),
    # sts.json
    ("sts wrong count", _set((STS_FILE, "sts_temperatures"), [1.0, 1.0]), "sts.json:temperatures", {}),
    ("sts non-positive", _set((STS_FILE, "sts_temperatures", 0), 0.0), "sts.json:temperatures", {}),
    ("sts alias differs", _set((STS_FILE, "temperatures"), [1.0] * K), "sts.json:temperatures_alias", {}),
    ("sts unknown key", _set((STS_FILE, "method"), "sts"), "sts.json:keys", {}),
    ("sts too few samples", _set((STS_FILE, "num_samples"), 999), "sts.json:num_samples", {}),
    ("sts other K", _set((STS_FILE, "max_draft_len"), 4), "sts.json:max_draft_len", {}),
    ("sts ece as a list", _set((STS_FILE, "ece_before"), [0.1] * K), "sts.json:ece", {}),
    ("sts ece above 1", _set((STS_FILE, "ece_after"), 1.5), "sts.json:ece", {}),
    ("sts dataset not ASCII-printable", _set((STS_FILE, "dataset"), "a\tb"), "sts.json:dataset", {}),
    # live_fingerprint.json
    (
        "live differs from the table",
        _set((LIVE_FILE, "gpu"), "H100"),
        "live_fingerprint.json:matches_table",
        {},
    ),
    ("live lacks a field", _delete((LIVE_FILE, "topology")), "live_fingerprint.json:fingerprint", {}),
    # admission_receipt.json
    ("receipt extra top-level key", _set((RECEIPT_FILE, "note"), "x"), "admission_receipt.json:keys", {}),
    (
        "receipt schema_version 2",
        _set((RECEIPT_FILE, "schema_version"), 2),
        "admission_receipt.json:schema_version",
        {},
    ),
    (
        "body with 15 fields",
        _delete((RECEIPT_FILE, "admission", "safety_margin_ms")),
        "admission_receipt.json:body_keys",
        {},
    ),
    (
        "body with 17 fields",
        _set((RECEIPT_FILE, "admission", "net_value_ms"), 1.0),
        "admission_receipt.json:body_keys",
        {},
    ),
    (
        "admission_sha256 stale",
        _stale_receipt_body,
        "admission_receipt.json:admission_sha256",
        {"rehash_body": False},
    ),
    (
        "sps pin stale",
        _set((SPS_FILE, "minimum_predicted_gain"), 0.02),
        "admission_receipt.json:pins",
        {"repin": False},
    ),
    (
        "physical_k differs",
        _set((RECEIPT_FILE, "admission", "physical_k"), 4),
        "admission_receipt.json:deployment",
        {},
    ),
    (
        "source_head stale",
        _set((RECEIPT_FILE, "admission", "source_head"), "stale"),
        "admission_receipt.json:deployment",
        {},
    ),
    (
        "workload identity not hex",
        _set((RECEIPT_FILE, "admission", "workload_identity_sha256"), "E" * 64),
        "admission_receipt.json:hashes",
        {},
    ),
    (
        "policy_steps zero",
        _set((RECEIPT_FILE, "admission", "policy_steps"), 0),
        "admission_receipt.json:counts",
        {},
    ),
    (
        "policy_steps boolean",
        _set((RECEIPT_FILE, "admission", "policy_steps"), True),
        "admission_receipt.json:counts",
        {},
    ),
    (
        "compact_choices above policy_steps",
        _set((RECEIPT_FILE, "admission", "compact_choices"), 1001),
        "admission_receipt.json:counts",
        {},
    ),
    (
        "negative amount",
        _set((RECEIPT_FILE, "admission", "safety_margin_ms"), -1.0),
        "admission_receipt.json:amounts",
        {},
    ),
    ("admitted disagrees with the rule", _flip_admitted, "admission_receipt.json:admitted", {}),
    (
        "admitted not a boolean",
        _set((RECEIPT_FILE, "admission", "admitted"), 1),
        "admission_receipt.json:admitted",
        {},
    ),
    (
        "compact choices without a drain guard",
        _delete((SPS_FILE, "iteration_drain_guard")),
        "admission_receipt.json:compact_needs_guard",
        {},
    ),
    # extra_llm_api_options.yaml
    ("yaml receipt pin stale", _flip_admitted, "extra_llm_api_options.yaml:receipt_sha256", {"repin": False}),
    ("yaml other K", _yaml("max_draft_len: 5", "max_draft_len: 4"), "extra_llm_api_options.yaml:values", {}),
    (
        "yaml feature off",
        _yaml("enable_confidence_scheduling: true", "enable_confidence_scheduling: false"),
        "extra_llm_api_options.yaml:values",
        {},
    ),
    (
        "yaml unknown key",
        _yaml("  decoding_type: DSpark", "  decoding_type: DSpark\n  confidence_verify_len_tiers: [1]"),
        "extra_llm_api_options.yaml:keys",
        {},
    ),
    (
        "yaml relative path",
        _yaml('"/etc/dspark/trtllm/sts.json"', '"sts.json"'),
        "extra_llm_api_options.yaml:paths",
        {},
    ),
    (
        "yaml path to another file",
        _yaml('"/etc/dspark/trtllm/sts.json"', '"/etc/dspark/trtllm/other.json"'),
        "extra_llm_api_options.yaml:paths",
        {},
    ),
    (
        "yaml syntax",
        _yaml("speculative_config:", "speculative_config: ["),
        "extra_llm_api_options.yaml:parse",
        {},
    ),
]


@pytest.mark.parametrize(
    ("mutate", "field", "pack"), [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES]
)
def test_validator_rejects_each_consumer_rule(
    mutate: Callable[[Docs], None], field: str, pack: dict[str, Any]
) -> None:
    docs = _docs()
    mutate(docs)
    findings = validate_trtllm(_pack(docs, **pack), selector_identity=SELECTOR)
    fields = {f.field for f in findings}
    assert field in fields, [f.code for f in findings]
    assert all(f.reason is Reason.CONTENT_INVALID for f in findings)


def test_valid_package_passes_and_repacking_is_lossless() -> None:
    files = golden_files()
    assert _pack(_docs()) == files
    assert validate_trtllm(files, selector_identity=SELECTOR) == []


RAW_CASES = [
    ("missing file", lambda f: f.pop(STS_FILE), "sts.json:missing"),
    (
        "non-canonical JSON bytes",
        lambda f: f.update({SPS_FILE: json.dumps(json.loads(f[SPS_FILE]), indent=1).encode()}),
        "sps_table.json:canonical",
    ),
    (
        "non-ASCII bytes",
        lambda f: f.update({STS_FILE: f[STS_FILE].replace(b'"dataset":"', 'dataset":"\u00e9'.encode())}),
        "sts.json:ascii",
    ),
    (
        "duplicate JSON key",
        lambda f: f.update({LIVE_FILE: f[LIVE_FILE][:-1] + b',"gpu":"H200"}'}),
        "live_fingerprint.json:json",
    ),
    ("unexpected extra file", lambda f: f.update({"notes.txt": b"x"}), "package:files"),
]


@pytest.mark.parametrize(("mutate", "field"), [c[1:] for c in RAW_CASES], ids=[c[0] for c in RAW_CASES])
def test_validator_rejects_malformed_files(mutate: Callable[[dict[str, bytes]], None], field: str) -> None:
    files = golden_files()
    mutate(files)
    assert field in {f.field for f in validate_trtllm(files)}


def test_selector_identity_must_be_the_engines() -> None:
    findings = validate_trtllm(golden_files(), selector_identity="6" * 64)
    assert [f.field for f in findings] == ["admission_receipt.json:selector_identity"]


def test_two_defects_are_both_reported() -> None:
    docs = _docs()
    docs[SPS_FILE]["schema_version"] = 1
    docs[STS_FILE]["max_draft_len"] = 4
    fields = {f.field for f in validate_trtllm(_pack(docs))}
    assert {"sps_table.json:schema_version", "sts.json:max_draft_len"} <= fields


# --- from a real bundle ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, Path]:
    from dspark_calibrate.calibrate.deployment.build import build_bundle, load_build_inputs
    from tests.calibrate.build_factories import build_files, build_options
    from tests.signing import make_root, make_signers

    tmp = tmp_path_factory.mktemp("export")
    files = build_files(tmp / "in")
    signers = make_signers(tmp / "keys", 1)
    root = make_root(signers)
    (tmp / "root.json").write_bytes(root.to_bytes())
    inputs = load_build_inputs([files.sweep], files.calibration, files.workload)
    build_bundle(inputs, tmp / "bundle", signers=signers, trust_root=root, options=build_options())
    return tmp / "bundle", root, tmp / "root.json"


def test_export_from_a_verified_bundle(bundle: tuple[Path, Any, Path], tmp_path: Path) -> None:
    path, root, _ = bundle
    report = verify_bundle(path, root, now=LATER)
    out = export_trtllm(report, tmp_path / "trt", selector_identity=SELECTOR)
    assert out.admitted and [p.name for p in out.paths] == list(TRTLLM_FILES)
    written = {p.name: p.read_bytes() for p in out.paths}
    assert written == dict(out.files) and validate_trtllm(written, selector_identity=SELECTOR) == []
    yaml_text = written[YAML_FILE].decode()
    assert f'"{(tmp_path / "trt").resolve()}/sps_table.json"' in yaml_text
    receipt = json.loads(written[RECEIPT_FILE])["admission"]
    adm = report.artifact("admission")
    assert adm is not None
    assert receipt["selector_replay_sha256"] == adm.summary["selector_replay_sha256"]
    assert receipt["policy_steps"] == adm.summary["policy_steps"]
    with pytest.raises(ConfigError, match="exists"):
        export_trtllm(report, tmp_path / "trt", selector_identity=SELECTOR)
    again = export_trtllm(report, tmp_path / "trt", selector_identity=SELECTOR, overwrite=True)
    assert again.receipt_sha256 == out.receipt_sha256


def test_unverified_bundle_is_refused(bundle: tuple[Path, Any, Path], tmp_path: Path) -> None:
    path, _, _ = bundle
    rejected = BundleReport(path=path, findings=(Finding(Reason.SIGNATURE_INVALID, "bad"),))
    with pytest.raises(ConfigError, match="refusing to export an unverified bundle"):
        export_trtllm(rejected, tmp_path / "x", selector_identity=SELECTOR)
    assert not (tmp_path / "x").exists()


def test_a_package_breaking_a_rule_is_never_written(
    bundle: tuple[Path, Any, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dspark_calibrate.artifacts._export_trtllm as mod

    path, root, _ = bundle
    report = verify_bundle(path, root, now=LATER)
    original = mod.render_trtllm

    def broken(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        files = dict(out.files)
        files[STS_FILE] = canonical_json({"sts_temperatures": [1.0]})
        return mod.TrtllmExport(files=files, receipt_sha256=out.receipt_sha256, admitted=out.admitted)

    monkeypatch.setattr(mod, "render_trtllm", broken)
    with pytest.raises(ExportRejected) as exc:
        export_trtllm(report, tmp_path / "x", selector_identity=SELECTOR)
    assert "sts.json:temperatures" in {f.field for f in exc.value.findings}
    assert list(tmp_path.iterdir()) == []


def test_cli_export(bundle: tuple[Path, Any, Path], tmp_path: Path) -> None:
    path, _, root_file = bundle
    runner = CliRunner()
    args = ["export", "trtllm", str(path), "--trust-root", str(root_file), "--out", str(tmp_path / "t")]
    ok = runner.invoke(build_calibrate_app(), [*args, "--selector-identity", SELECTOR, "--json"])
    assert ok.exit_code == 0, ok.output
    doc = json.loads(ok.stdout)
    assert doc["valid"] is True and set(doc["files"]) == set(TRTLLM_FILES)
    missing = runner.invoke(build_calibrate_app(), [*args[:-1], str(tmp_path / "u")])
    assert missing.exit_code == 2 and "EXACT_SPS_SELECTOR_IDENTITY_SHA256" in missing.stderr
    assert not (tmp_path / "u").exists()
    upper = runner.invoke(
        build_calibrate_app(), [*args[:-1], str(tmp_path / "v"), "--selector-identity", "A" * 64]
    )
    assert upper.exit_code == 2
    tampered = tmp_path / "tampered"
    import shutil

    shutil.copytree(path, tampered)
    (tampered / "cost-table.parquet.dsse.json").unlink()
    blob = (tampered / "bundle.dsse.json").read_bytes()
    (tampered / "bundle.dsse.json").write_bytes(blob.replace(b'"payload":"', b'"payload":"A', 1))
    bad = runner.invoke(
        build_calibrate_app(),
        [
            "export",
            "trtllm",
            str(tampered),
            "--trust-root",
            str(root_file),
            "--out",
            str(tmp_path / "w"),
            "--selector-identity",
            SELECTOR,
        ],
    )
    assert bad.exit_code == 1 and "refusing to export an unverified bundle" in bad.stderr
    assert not (tmp_path / "w").exists()


def test_sts_file_reads_with_the_projects_strict_parser() -> None:
    from dspark_calibrate.calibrate.confidence.maps import parse_sts_document

    doc = parse_sts_document(golden_files()[STS_FILE], k=K)
    assert doc.temperatures == (1.1, 1.2, 1.3, 1.4, 1.5) and doc.num_samples == 40_000
    assert doc.ece_before == pytest.approx(0.07) and doc.ece_after == pytest.approx(0.01)


def test_copy_of_inputs_is_independent() -> None:
    inputs = golden_inputs()
    summary = copy.deepcopy(inputs.summary.to_summary())
    render_trtllm(inputs, selector_identity=SELECTOR)
    assert inputs.summary.to_summary() == summary
