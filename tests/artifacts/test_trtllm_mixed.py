"""TensorRT-LLM's mixed evidence: golden bytes, and the validator rejecting each consumer rule.

The validator is written from the consumer's contract (``TRTLLM_MIXED.md``); every row of
``RULE_CASES`` breaks one rule of it in an otherwise valid package (re-pinned, so the row fails
at its own check and not at a stale hash).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dspark_calibrate.artifacts import (
    GEOMETRY_RULES,
    MIXED_EXECUTION_MODE,
    TRTLLM_BODY_BUCKETS,
    TRTLLM_MIXED_FILES,
    ContextChunk,
    GenerationRequest,
    MixedGeometry,
    MixedIdentity,
    MixedStep,
    RankStep,
    ReceiptEconomics,
    canonical_json,
    sha256_hex,
    step_candidates,
    validate_mixed,
)
from dspark_calibrate.artifacts._reasons import Reason
from dspark_calibrate.artifacts._trtllm_mixed import (
    ADMISSION_FILE,
    COSTS_FILE,
    MIXED_LIVE_FILE,
    MixedExportInputs,
    MixedRefused,
    config_block,
    render_mixed,
)
from dspark_calibrate.schemas import MIXED_GATES, MIXED_RESULTS
from tests.calibrate.build_factories import mixed_fingerprint

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "vectors" / "export_trtllm_mixed"
SELECTOR = "5" * 64
PROTOCOL = "7" * 64
DEPLOY = "/etc/dspark/trtllm"
YAML_FILE = "extra_llm_api_options.yaml"
K = 3


def _steps() -> list[MixedStep]:
    """Two recurring mixed steps of an eight-rank attention-DP deployment."""
    a = MixedStep(
        (
            RankStep((ContextChunk(64, 128),), tuple(GenerationRequest(100) for _ in range(10))),
            RankStep((), tuple(GenerationRequest(128) for _ in range(8))),
            *([RankStep()] * 6),
        )
    )
    b = MixedStep(
        (
            RankStep((), tuple(GenerationRequest(64) for _ in range(14))),
            RankStep((ContextChunk(48, 256),), tuple(GenerationRequest(300) for _ in range(16))),
            *([RankStep((), tuple(GenerationRequest(50) for _ in range(6)))] * 6),
        )
    )
    return [a, b]


def golden_cells() -> tuple[tuple[MixedGeometry, float, float, str], ...]:
    """Every compact candidate of the two steps (one each, at capacity 96), with times that win."""
    out = []
    for i, step in enumerate(_steps()):
        _, cells = step_candidates(step.features(K), K, TRTLLM_BODY_BUCKETS)
        for j, geo in enumerate(cells):
            out.append((geo, 10.0 + i, 8.0 + i / 2 + j / 4, sha256_hex(f"cell {i}/{j}".encode())))
    assert len(out) == 2
    return tuple(out)


def golden_identity() -> MixedIdentity:
    fp = mixed_fingerprint(ranks=8, k=K)
    return MixedIdentity.derive(
        fp, selector_identity=SELECTOR, body_buckets=TRTLLM_BODY_BUCKETS, execution_mode=MIXED_EXECUTION_MODE
    )


def golden_inputs(**overrides: Any) -> MixedExportInputs:
    cells = golden_cells()
    results = {field: sha256_hex(field.encode()) for field, _ in MIXED_RESULTS}
    results["measurement_results_sha256"] = sha256_hex(canonical_json([c[3] for c in cells]))
    base: dict[str, Any] = {
        "identity": golden_identity(),
        "protocol_sha256": PROTOCOL,
        "minimum_predicted_gain": 0.01,
        "synthetic": False,
        "cells": cells,
        "gates": {g: True for g in MIXED_GATES},
        "results": results,
        "economics": ReceiptEconomics(1000, 200, 500.0, 0.1, 20.0),
    }
    base.update(overrides)
    return MixedExportInputs(**base)


def _options(files: dict[str, bytes], block: dict[str, Any] | None = None, **spec: Any) -> bytes:
    """An options file as the export writes it: the decode fields plus the mixed block."""
    body: dict[str, Any] = {
        "decoding_type": "DSpark",
        "max_draft_len": K,
        "enable_confidence_scheduling": True,
        "confidence_mixed_evidence": block if block is not None else config_block(files, PROTOCOL, DEPLOY),
    }
    body.update(spec)
    return yaml.safe_dump({"speculative_config": body}, sort_keys=False).encode()


def golden_files() -> dict[str, bytes]:
    files = render_mixed(golden_inputs())
    return {**files, YAML_FILE: _options(files)}


def test_golden_files(update_goldens: bool) -> None:
    files = golden_files()
    mixed = {n: files[n] for n in TRTLLM_MIXED_FILES}
    assert validate_mixed(mixed, options_yaml=files[YAML_FILE]) == []
    if update_goldens:
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (GOLDEN_DIR / name).write_bytes(data)
    for name in (*TRTLLM_MIXED_FILES, YAML_FILE):
        assert (GOLDEN_DIR / name).read_bytes() == files[name], (
            f"{name} changed; run pytest --update-goldens if intended"
        )


def test_package_shape() -> None:
    files = golden_files()
    live, costs, receipt = (json.loads(files[n]) for n in (MIXED_LIVE_FILE, COSTS_FILE, ADMISSION_FILE))
    assert (
        set(live) == {"schema", "identity"} and live["identity"] == costs["identity"] == receipt["identity"]
    )
    assert live["identity"]["body_buckets"] == [96, 128, 192, 256, 384, 512]
    assert len(receipt) == 17 and "admission_sha256" not in receipt  # no self-hash
    assert receipt["costs_sha256"] == sha256_hex(files[COSTS_FILE])
    assert receipt["measurement_results_sha256"] == sha256_hex(
        canonical_json([c["measurement_result_sha256"] for c in costs["cells"]])
    )
    block = yaml.safe_load(files[YAML_FILE])["speculative_config"]["confidence_mixed_evidence"]
    assert len(block) == 7
    for key, name in (
        ("costs_sha256", COSTS_FILE),
        ("admission_sha256", ADMISSION_FILE),
        ("live_fingerprint_sha256", MIXED_LIVE_FILE),
    ):
        assert block[key] == sha256_hex(files[name])
    assert block["costs_path"] == f"{DEPLOY}/{COSTS_FILE}"


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"gates": {**{g: True for g in MIXED_GATES}, "accuracy_pass": False}}, "mixed:gates"),
        (
            {"economics": ReceiptEconomics(1000, 200, 50.0, 0.1, 20.0)},
            "mixed:economics",
        ),
        ({"cells": ()}, "mixed:cells"),
        (
            {"identity": dataclasses.replace(golden_identity(), world_size=1)},
            "mixed:route",
        ),
    ],
    ids=["a gate not backed", "economics do not admit", "no cell", "another world size"],
)
def test_render_refuses_a_receipt_it_cannot_back(change: dict[str, Any], rule: str) -> None:
    with pytest.raises(MixedRefused) as exc:
        render_mixed(golden_inputs(**change))
    assert [f.field for f in exc.value.findings] == [rule]


# --- the validator rejects each consumer rule ---------------------------------------------------

Docs = dict[str, Any]


def _docs() -> Docs:
    files = golden_files()
    docs: Docs = {name: json.loads(files[name]) for name in TRTLLM_MIXED_FILES}
    docs[YAML_FILE] = yaml.safe_load(files[YAML_FILE])
    return docs


def _pack(docs: Docs, *, repin: bool = True) -> dict[str, bytes]:
    """Serialise; re-pin the receipt and the options so only the intended defect remains."""
    files = {name: canonical_json(docs[name]) for name in (MIXED_LIVE_FILE, COSTS_FILE)}
    receipt, costs = docs[ADMISSION_FILE], docs[COSTS_FILE]
    if repin and isinstance(receipt, dict):
        receipt["costs_sha256"] = sha256_hex(files[COSTS_FILE])
        cells = costs.get("cells") if isinstance(costs, dict) else None
        if isinstance(cells, list) and all(isinstance(c, dict) for c in cells):
            receipt["measurement_results_sha256"] = sha256_hex(
                canonical_json([c.get("measurement_result_sha256") for c in cells])
            )
    files[ADMISSION_FILE] = canonical_json(receipt)
    options = docs[YAML_FILE]
    block = options["speculative_config"].get("confidence_mixed_evidence")
    if repin and isinstance(block, dict):
        for key, name in (
            ("costs_sha256", COSTS_FILE),
            ("admission_sha256", ADMISSION_FILE),
            ("live_fingerprint_sha256", MIXED_LIVE_FILE),
        ):
            if key in block:
                block[key] = sha256_hex(files[name])
    files[YAML_FILE] = yaml.safe_dump(options, sort_keys=False).encode()
    return files


def _validate(files: dict[str, bytes], **kw: Any) -> list[Any]:
    return validate_mixed(
        {n: files[n] for n in TRTLLM_MIXED_FILES if n in files}, options_yaml=files.get(YAML_FILE), **kw
    )


def _set(path: tuple[Any, ...], value: Any) -> Callable[[Docs], None]:
    def mutate(d: Docs) -> None:
        obj = d
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value

    return mutate


def _delete(path: tuple[Any, ...]) -> Callable[[Docs], None]:
    def mutate(d: Docs) -> None:
        obj = d
        for key in path[:-1]:
            obj = obj[key]
        del obj[path[-1]]

    return mutate


def _all_identities(key: str, value: Any) -> Callable[[Docs], None]:
    """The same identity change in all three files (the live file's own rule fires, not equality)."""

    def mutate(d: Docs) -> None:
        for name in TRTLLM_MIXED_FILES:
            d[name]["identity"][key] = value

    return mutate


GEO = (COSTS_FILE, "cells", 0, "geometry")
RANK0 = (*GEO, "rank_features", 0)
RANK1 = (*GEO, "rank_features", 1)
SPEC = (YAML_FILE, "speculative_config")
BLOCK = (*SPEC, "confidence_mixed_evidence")


def _duplicate_cell(d: Docs) -> None:
    cells = d[COSTS_FILE]["cells"]
    cells.append({**copy.deepcopy(cells[0]), "measurement_result_sha256": "9" * 64})


def _too_many_cells(d: Docs) -> None:
    d[COSTS_FILE]["cells"] = [copy.deepcopy(d[COSTS_FILE]["cells"][0]) for _ in range(257)]


def _native_rows_beyond_512(d: Docs) -> None:
    geo = d[COSTS_FILE]["cells"][0]["geometry"]
    geo["rank_features"][0]["context_rows"] = 600
    geo["native_rank_rows"][0] += 600 - 64


def _all_native(d: Docs) -> None:
    geo = d[COSTS_FILE]["cells"][0]["geometry"]
    geo["actual_rank_rows"] = list(geo["native_rank_rows"])


def _fixture_like_unreachable(d: Docs) -> None:
    """Rank 1 keeps 8 eligible generations at capacity 96: the runtime builds 32 rows, not 16."""
    d[COSTS_FILE]["cells"][0]["geometry"]["actual_rank_rows"][1] = 16


RuleCase = tuple[str, Callable[[Docs], None], str, dict[str, Any]]
RULE_CASES: list[RuleCase] = [
    # mixed_live_fingerprint.json
    ("live extra key", _set((MIXED_LIVE_FILE, "note"), "x"), "mixed_live_fingerprint.json:keys", {}),
    ("live schema", _set((MIXED_LIVE_FILE, "schema"), "v2"), "mixed_live_fingerprint.json:schema", {}),
    (
        "live identity lacks a field",
        _delete((MIXED_LIVE_FILE, "identity", "topology_sha256")),
        "mixed_live_fingerprint.json:identity_keys",
        {},
    ),
    (
        "identity hash upper-case",
        _all_identities("gpu_class_sha256", "A" * 64),
        "mixed_live_fingerprint.json:identity_hashes",
        {},
    ),
    ("physical_k 5", _all_identities("physical_k", 5), "mixed_live_fingerprint.json:physical_k", {}),
    ("physical_k true", _all_identities("physical_k", True), "mixed_live_fingerprint.json:physical_k", {}),
    ("physical_k 3.0", _all_identities("physical_k", 3.0), "mixed_live_fingerprint.json:physical_k", {}),
    ("world size 4", _all_identities("world_size", 4), "mixed_live_fingerprint.json:world_size", {}),
    (
        "five body buckets",
        _all_identities("body_buckets", [96, 128, 192, 256, 384]),
        "mixed_live_fingerprint.json:body_buckets",
        {},
    ),
    (
        "body buckets out of order",
        _all_identities("body_buckets", [128, 96, 192, 256, 384, 512]),
        "mixed_live_fingerprint.json:body_buckets",
        {},
    ),
    (
        "piecewise graphs",
        _all_identities("execution_mode", "PIECEWISE"),
        "mixed_live_fingerprint.json:execution_mode",
        {},
    ),
    # mixed_costs.json
    ("costs extra key", _set((COSTS_FILE, "note"), "x"), "mixed_costs.json:keys", {}),
    ("costs schema", _set((COSTS_FILE, "schema"), "v0"), "mixed_costs.json:schema", {}),
    (
        "costs identity differs",
        _set((COSTS_FILE, "identity", "selector_identity_sha256"), "6" * 64),
        "mixed_costs.json:identity",
        {},
    ),
    (
        "costs identity 3.0 for 3",
        _set((COSTS_FILE, "identity", "physical_k"), 3.0),
        "mixed_costs.json:identity",
        {},
    ),
    ("costs protocol", _set((COSTS_FILE, "protocol_sha256"), "8" * 64), "mixed_costs.json:protocol", {}),
    (
        "action semantics",
        _set((COSTS_FILE, "action_semantics"), "v0"),
        "mixed_costs.json:action_semantics",
        {},
    ),
    (
        "pricing semantics",
        _set((COSTS_FILE, "pricing_semantics"), "whole_step"),
        "mixed_costs.json:pricing_semantics",
        {},
    ),
    ("synthetic true", _set((COSTS_FILE, "synthetic"), True), "mixed_costs.json:synthetic", {}),
    ("synthetic 0", _set((COSTS_FILE, "synthetic"), 0), "mixed_costs.json:synthetic", {}),
    ("provenance", _set((COSTS_FILE, "provenance"), "estimated"), "mixed_costs.json:provenance", {}),
    (
        "gain below 1%",
        _set((COSTS_FILE, "minimum_predicted_gain"), 0.005),
        "mixed_costs.json:minimum_predicted_gain",
        {},
    ),
    (
        "gain a boolean",
        _set((COSTS_FILE, "minimum_predicted_gain"), True),
        "mixed_costs.json:minimum_predicted_gain",
        {},
    ),
    ("no cell", _set((COSTS_FILE, "cells"), []), "mixed_costs.json:cells", {}),
    ("257 cells", _too_many_cells, "mixed_costs.json:cells", {}),
    ("cell extra key", _set((COSTS_FILE, "cells", 0, "p50_ms"), 1.0), "mixed_costs.json:cell_keys", {}),
    ("time zero", _set((COSTS_FILE, "cells", 0, "native_lower_ms"), 0), "mixed_costs.json:cell_times", {}),
    (
        "time a string",
        _set((COSTS_FILE, "cells", 0, "candidate_upper_ms"), "8"),
        "mixed_costs.json:cell_times",
        {},
    ),
    (
        "time a boolean",
        _set((COSTS_FILE, "cells", 0, "candidate_upper_ms"), True),
        "mixed_costs.json:cell_times",
        {},
    ),
    (
        "measurement hash not hex",
        _set((COSTS_FILE, "cells", 0, "measurement_result_sha256"), "xyz"),
        "mixed_costs.json:cell_measurement",
        {},
    ),
    ("geometry extra key", _set((*GEO, "rows"), 1), "mixed_costs.json:geometry_keys", {}),
    (
        "seven ranks",
        lambda d: d[COSTS_FILE]["cells"][0]["geometry"]["actual_rank_rows"].pop(),
        "mixed_costs.json:geometry_ranks",
        {},
    ),
    ("capacity not a bucket", _set((*GEO, "capacity"), 100), "mixed_costs.json:geometry_capacity", {}),
    ("rank lacks a feature", _delete((*RANK0, "context_rows")), "mixed_costs.json:rank_keys", {}),
    ("feature a float", _set((*RANK0, "context_rows"), 64.0), "mixed_costs.json:rank_integers", {}),
    ("feature negative", _set((*RANK0, "generation_history_sum"), -1), "mixed_costs.json:rank_integers", {}),
    ("feature 2^63", _set((*RANK0, "generation_history_sum"), 1 << 63), "mixed_costs.json:rank_integers", {}),
    ("row count a float", _set((*GEO, "actual_rank_rows", 0), 96.0), "mixed_costs.json:row_integers", {}),
    # geometry invariants (the per-rank ones, the whole-geometry ones, the two derived ones)
    (
        "real > context requests",
        _set((*RANK0, "real_context_requests"), 2),
        "mixed_costs.json:geometry_real_context",
        {},
    ),
    (
        "eligible > generations",
        _set((*RANK1, "eligible_generations"), 9),
        "mixed_costs.json:geometry_eligible",
        {},
    ),
    (
        "bootstrap of eligible",
        _set((*RANK1, "bootstrap_generations"), 1),
        "mixed_costs.json:geometry_bootstrap",
        {},
    ),
    (
        "history max > sum",
        _set((*RANK1, "generation_history_max"), 2000),
        "mixed_costs.json:geometry_history",
        {},
    ),
    ("fixed rows", _set((*RANK0, "fixed_generation_rows"), 4), "mixed_costs.json:geometry_fixed_rows", {}),
    ("native rows", _set((*GEO, "native_rank_rows", 1), 33), "mixed_costs.json:geometry_native_rows", {}),
    (
        "full-K rows discounted",
        _set((*GEO, "actual_rank_rows", 1), 7),
        "mixed_costs.json:geometry_reserved_rows",
        {},
    ),
    (
        "rows above native",
        _set((*GEO, "actual_rank_rows", 1), 33),
        "mixed_costs.json:geometry_capacity_rows",
        {},
    ),
    ("all decode", _set((*RANK0, "real_context_requests"), 0), "mixed_costs.json:geometry_all_decode", {}),
    ("not compact", _all_native, "mixed_costs.json:geometry_not_compact", {}),
    ("native rows above 512", _native_rows_beyond_512, "mixed_costs.json:geometry_native_grid", {}),
    (
        "unreachable (upstream's fixture)",
        _fixture_like_unreachable,
        "mixed_costs.json:geometry_unreachable",
        {},
    ),
    (
        "dead cell",
        _set((COSTS_FILE, "cells", 0, "candidate_upper_ms"), 10.0),
        "mixed_costs.json:geometry_dead",
        {},
    ),
    ("duplicate geometry", _duplicate_cell, "mixed_costs.json:duplicate", {}),
    # mixed_admission.json
    (
        "receipt extra key",
        _set((ADMISSION_FILE, "admission_sha256"), "0" * 64),
        "mixed_admission.json:keys",
        {},
    ),
    ("receipt lacks a gate", _delete((ADMISSION_FILE, "accuracy_pass")), "mixed_admission.json:keys", {}),
    ("receipt schema", _set((ADMISSION_FILE, "schema"), "v0"), "mixed_admission.json:schema", {}),
    (
        "receipt identity differs",
        _set((ADMISSION_FILE, "identity", "world_size"), 16),
        "mixed_admission.json:identity",
        {},
    ),
    (
        "costs pin stale",
        _set((COSTS_FILE, "minimum_predicted_gain"), 0.02),
        "mixed_admission.json:costs_pin",
        {"repin": False},
    ),
    (
        "receipt protocol",
        _set((ADMISSION_FILE, "protocol_sha256"), "8" * 64),
        "mixed_admission.json:protocol",
        {},
    ),
    (
        "receipt semantics",
        _set((ADMISSION_FILE, "pricing_semantics"), "x"),
        "mixed_admission.json:semantics",
        {},
    ),
    ("gate false", _set((ADMISSION_FILE, "matched_workload_pass"), False), "mixed_admission.json:gates", {}),
    ("gate 1", _set((ADMISSION_FILE, "production_admission"), 1), "mixed_admission.json:gates", {}),
    (
        "result hash not hex",
        _set((ADMISSION_FILE, "accuracy_result_sha256"), "A" * 64),
        "mixed_admission.json:result_hashes",
        {},
    ),
    (
        "measurement results not the cells' hashes",
        _set((COSTS_FILE, "cells", 0, "measurement_result_sha256"), "9" * 64),
        "mixed_admission.json:measurement_results",
        {"repin": False},
    ),
    (
        "economics extra key",
        _set((ADMISSION_FILE, "economics", "net_value_ms"), 1.0),
        "mixed_admission.json:economics_keys",
        {},
    ),
    (
        "policy steps 0",
        _set((ADMISSION_FILE, "economics", "policy_steps"), 0),
        "mixed_admission.json:economics_counts",
        {},
    ),
    (
        "policy steps boolean",
        _set((ADMISSION_FILE, "economics", "policy_steps"), True),
        "mixed_admission.json:economics_counts",
        {},
    ),
    (
        "choices above steps",
        _set((ADMISSION_FILE, "economics", "compact_choices"), 1001),
        "mixed_admission.json:economics_counts",
        {},
    ),
    (
        "negative margin",
        _set((ADMISSION_FILE, "economics", "safety_margin_ms"), -1.0),
        "mixed_admission.json:economics_amounts",
        {},
    ),
    (
        "no compact choice",
        _set((ADMISSION_FILE, "economics", "compact_choices"), 0),
        "mixed_admission.json:economics_admitted",
        {},
    ),
    (
        "overhead on all policy steps eats the value",
        _set((ADMISSION_FILE, "economics", "fixed_confidence_path_overhead_ms_upper_bound"), 0.49),
        "mixed_admission.json:economics_admitted",
        {},
    ),
    # extra_llm_api_options.yaml
    ("config eighth field", _set((*BLOCK, "note"), "x"), "extra_llm_api_options.yaml:config_keys", {}),
    (
        "config lacks a pin",
        _delete((*BLOCK, "protocol_sha256")),
        "extra_llm_api_options.yaml:config_keys",
        {},
    ),
    (
        "config pin upper-case",
        _set((*BLOCK, "protocol_sha256"), "A" * 64),
        "extra_llm_api_options.yaml:config_pins",
        {},
    ),
    (
        "config file pin stale",
        _set((ADMISSION_FILE, "economics", "policy_steps"), 999),
        "extra_llm_api_options.yaml:config_file_pins",
        {"repin": False},
    ),
    (
        "config protocol pin differs from the files'",
        _set((*BLOCK, "protocol_sha256"), "8" * 64),
        "mixed_costs.json:protocol",
        {},
    ),
    (
        "config relative path",
        _set((*BLOCK, "costs_path"), COSTS_FILE),
        "extra_llm_api_options.yaml:config_paths",
        {},
    ),
    (
        "config path to another file",
        _set((*BLOCK, "admission_path"), f"{DEPLOY}/other.json"),
        "extra_llm_api_options.yaml:config_paths",
        {},
    ),
    (
        "config without confidence scheduling",
        _set((*SPEC, "enable_confidence_scheduling"), False),
        "extra_llm_api_options.yaml:config_scheduling",
        {},
    ),
    ("config with K=1", _set((*SPEC, "max_draft_len"), 1), "extra_llm_api_options.yaml:config_k", {}),
]


@pytest.mark.parametrize(
    ("mutate", "field", "pack"), [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES]
)
def test_validator_rejects_each_consumer_rule(
    mutate: Callable[[Docs], None], field: str, pack: dict[str, Any]
) -> None:
    docs = _docs()
    mutate(docs)
    findings = _validate(_pack(docs, **pack))
    assert field in {f.field for f in findings}, [f.code for f in findings]
    assert all(f.reason is Reason.CONTENT_INVALID for f in findings)


def test_every_geometry_rule_has_a_row() -> None:
    """The structural rules (ranks, capacity, integers) have their own JSON-level rows."""
    covered = {c[2].removeprefix("mixed_costs.json:geometry_") for c in RULE_CASES}
    assert set(GEOMETRY_RULES) - {"ranks", "capacity", "integers"} <= covered


def test_valid_package_passes_and_repacking_is_lossless() -> None:
    files = golden_files()
    repacked = _pack(_docs())
    assert {n: repacked[n] for n in TRTLLM_MIXED_FILES} == {n: files[n] for n in TRTLLM_MIXED_FILES}
    assert _validate(repacked) == []


def test_synthetic_evidence_passes_only_when_allowed() -> None:
    files = render_mixed(golden_inputs(synthetic=True))
    files = {**files, YAML_FILE: _options(files)}
    assert [f.field for f in _validate(files)] == ["mixed_costs.json:synthetic"]
    assert _validate(files, allow_synthetic=True) == []


def _raw(name: str, data: bytes) -> Callable[[dict[str, bytes]], None]:
    return lambda f: f.update({name: data})


def _bytes(name: str, edit: Callable[[bytes], bytes]) -> Callable[[dict[str, bytes]], None]:
    return lambda f: f.update({name: edit(f[name])})


RAW_CASES = [
    ("missing file", lambda f: f.pop(ADMISSION_FILE), "mixed_admission.json:missing"),
    ("empty file", _raw(MIXED_LIVE_FILE, b""), "mixed_live_fingerprint.json:size"),
    ("file above 16 MiB", _raw(COSTS_FILE, b" " * ((16 << 20) + 1)), "mixed_costs.json:size"),
    (
        "byte-order mark",
        _bytes(MIXED_LIVE_FILE, lambda b: b"\xef\xbb\xbf" + b),
        "mixed_live_fingerprint.json:encoding",
    ),
    (
        "duplicate key",
        _bytes(MIXED_LIVE_FILE, lambda b: b[:-1] + b',"schema":"x"}'),
        "mixed_live_fingerprint.json:json",
    ),
    (
        "NaN literal",
        _bytes(COSTS_FILE, lambda b: b.replace(b'"native_lower_ms":10.0', b'"native_lower_ms":NaN')),
        "mixed_costs.json:json",
    ),
    (
        "Infinity literal",
        _bytes(
            COSTS_FILE, lambda b: b.replace(b'"candidate_upper_ms":8.0', b'"candidate_upper_ms":Infinity')
        ),
        "mixed_costs.json:json",
    ),
    ("top level an array", _raw(ADMISSION_FILE, b"[]"), "mixed_admission.json:object"),
    (
        "trailing newline",
        _bytes(MIXED_LIVE_FILE, lambda b: b + b"\n"),
        "mixed_live_fingerprint.json:canonical",
    ),
    (
        "indented",
        _bytes(COSTS_FILE, lambda b: json.dumps(json.loads(b), indent=1).encode()),
        "mixed_costs.json:canonical",
    ),
    (
        "null value",
        _bytes(
            COSTS_FILE,
            lambda b: b.replace(b'"provenance":"closed_measured_breakable_mixed"', b'"provenance":null'),
        ),
        "mixed_costs.json:nulls",
    ),
    ("options not YAML", _raw(YAML_FILE, b"speculative_config: ["), "extra_llm_api_options.yaml:yaml"),
    (
        "options repeat a key",
        _bytes(YAML_FILE, lambda b: b + b"speculative_config: {}\n"),
        "extra_llm_api_options.yaml:yaml",
    ),
    (
        "options without speculative_config",
        _raw(YAML_FILE, b"backend: pytorch\n"),
        "extra_llm_api_options.yaml:speculative_config",
    ),
]


@pytest.mark.parametrize(("mutate", "field"), [c[1:] for c in RAW_CASES], ids=[c[0] for c in RAW_CASES])
def test_validator_rejects_malformed_files(mutate: Callable[[dict[str, bytes]], None], field: str) -> None:
    files = golden_files()
    mutate(files)
    assert field in {f.field for f in _validate(files)}


def test_two_defects_are_both_reported() -> None:
    docs = _docs()
    docs[COSTS_FILE]["provenance"] = "estimated"
    docs[ADMISSION_FILE]["accuracy_pass"] = False
    fields = {f.field for f in _validate(_pack(docs))}
    assert {"mixed_costs.json:provenance", "mixed_admission.json:gates"} <= fields
