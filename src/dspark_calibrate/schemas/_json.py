"""Loaders for the JSON Schemas and the logical-hash specification shipped in this package.

Imports nothing of ours; reads package data only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

from dspark_calibrate.errors import InvalidValueError

__all__ = [
    "ADMISSION_PREDICTION_KEYS",
    "ADMISSION_SUMMARY_KEYS",
    "DRAIN_GUARD_SUMMARY_KEYS",
    "JSON_SCHEMAS",
    "MIXED_ADMISSION_SUMMARY_KEYS",
    "MIXED_COST_SUMMARY_KEYS",
    "MIXED_GATES",
    "MIXED_RESULTS",
    "MIXED_RESULT_FILES",
    "PAYLOAD_TYPE",
    "PER_BUCKET_KEYS",
    "json_schema",
    "logical_hash_spec",
]

#: DSSE payloadType of every artifact and bundle envelope this tool signs (DESIGN §4).
PAYLOAD_TYPE = "application/vnd.dspark-calibrate.artifact+json"

#: The keys of the admission artifact's signed summary that the runtime hook requires: ``build``
#: writes exactly these, then :data:`ADMISSION_PREDICTION_KEYS`.
ADMISSION_SUMMARY_KEYS: tuple[str, ...] = (
    "predicted_gain",
    "predicted_gain_ci_low",
    "predicted_gain_ci_high",
    "static_goodput_tok_per_ms",
    "dynamic_goodput_tok_per_ms",
    "compact_step_share",
    "policy_steps",
    "compact_choices",
    "gross_compact_value_ms_lower_bound",
    "fixed_confidence_path_overhead_ms_upper_bound",
    "safety_margin_ms",
    "net_value_ms",
    "admitted",
    "minimum_predicted_gain",
    "drain_guard",
    "workload_identity_sha256",
    "selector_replay_sha256",
    "workload_approximate",
    "per_bucket",
)
#: What the prediction assumes, written after :data:`ADMISSION_SUMMARY_KEYS` in the admission
#: summary (DESIGN §9): the objective the gain is stated for, the load regime and why, the serving
#: planner whose confidence path was charged, the share of mixed steps, both objectives' gains with
#: their intervals, and the time per output token at the recorded arrivals. Bundles built before
#: these keys existed lack them; readers say "not stated".
ADMISSION_PREDICTION_KEYS: tuple[str, ...] = (
    "objective",
    "regime",
    "regime_source",
    "planner",
    "mixed_share",
    "predictions",
    "tpot_gain",
)
#: Keys of ``summary["drain_guard"]``.
DRAIN_GUARD_SUMMARY_KEYS: tuple[str, ...] = (
    "loss_multiplier",
    "mean_output_tokens_per_request_iteration",
    "minimum_group_value_ms",
    "tail_graph_batch_size",
)
#: Keys of every ``summary["per_bucket"]`` entry.
PER_BUCKET_KEYS: tuple[str, ...] = (
    "graph_batch_size",
    "steps",
    "predicted_gain",
    "ci_low",
    "ci_high",
    "compact_share",
)

#: The exact keys of a ``mixed-cost-table``'s signed summary.
MIXED_COST_SUMMARY_KEYS: tuple[str, ...] = ("cells", "route", "minimum_predicted_gain", "protocol_sha256")
#: The five release gates of a mixed receipt, and the result each rests on (``None``: the gate is
#: the conjunction of the others and the economics).
MIXED_GATES: tuple[str, ...] = (
    "accuracy_pass",
    "runtime_invariants_pass",
    "matched_workload_pass",
    "source_and_measurements_verified",
    "production_admission",
)
#: The result files of a mixed bundle (``mixed/results/<name>.json``), by the receipt hash naming each.
MIXED_RESULTS: tuple[tuple[str, str], ...] = (
    ("accuracy_result_sha256", "accuracy"),
    ("runtime_invariants_result_sha256", "runtime_invariants"),
    ("matched_workload_result_sha256", "matched_workload"),
    ("selector_replay_sha256", "selector_replay"),
    ("measurement_results_sha256", "measurement_results"),
)
#: Every result file of a mixed bundle, by name, as a path inside ``<bundle>/mixed/``; the signed
#: mixed-admission summary pins each by the SHA-256 of its bytes (``summary["results"][name]``).
MIXED_RESULT_FILES: Mapping[str, str] = MappingProxyType(
    {
        "accuracy": "results/accuracy.json",
        "runtime_invariants": "results/runtime_invariants.json",
        "matched_workload": "results/matched_workload.json",
        "selector_replay": "results/selector_replay.bin",
        "measurement_results": "results/measurement_results.json",
        "source_and_measurements": "results/source_and_measurements.json",
    }
)
#: The exact keys of a ``mixed-admission``'s signed summary.
MIXED_ADMISSION_SUMMARY_KEYS: tuple[str, ...] = (
    "route",
    "protocol_sha256",
    "minimum_predicted_gain",
    "policy_steps",
    "compact_choices",
    "gross_compact_value_ms_lower_bound",
    "fixed_confidence_path_overhead_ms_upper_bound",
    "safety_margin_ms",
    "net_value_ms",
    "admitted",
    "gates",
    "results",
    "predicted_gain",
    "predicted_gain_ci_low",
    "predicted_gain_ci_high",
    "decode_part",
    "mixed_part",
    "decode_members",
    "workload_identity_sha256",
)

#: Names of the JSON Schemas shipped (``<name>.schema.json``, draft 2020-12). Each has the ``$id``
#: ``https://dspark-calibrate.dev/schemas/<name>/v1``: a name the schemas refer to each other by,
#: resolved from the package (``schemas.schema_registry``), never fetched.
JSON_SCHEMAS: tuple[str, ...] = (
    "common",
    "fingerprint",
    "predicate",
    "admission-summary",
    "calibration-summary",
    "mixed-summaries",
    "bundle",
    "statement",
    "dsse-envelope",
    "trust-root",
    "rollback-state",
    "sts",
    "trtllm-live-fingerprint",
    "trtllm-sps-table",
    "admission-receipt",
    "trtllm-mixed-live-fingerprint",
    "trtllm-mixed-costs",
    "trtllm-mixed-admission",
    "mixed-result-accuracy",
    "mixed-result-runtime-invariants",
    "mixed-result-matched-workload",
    "mixed-result-source-and-measurements",
    "mixed-result-measurement-results",
    "fit-report",
    "build",
    "admission-decision",
)


@cache
def json_schema(name: str) -> dict[str, Any]:
    """Return a shipped JSON Schema (draft 2020-12) by name (one of :data:`JSON_SCHEMAS`).

    Raises:
        InvalidValueError: unknown name.
    """
    if name not in JSON_SCHEMAS:
        raise InvalidValueError(f"unknown JSON Schema {name!r}; known: {', '.join(JSON_SCHEMAS)}")
    text = resources.files(__package__).joinpath(f"{name}.schema.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def logical_hash_spec() -> str:
    """The logical-hash specification (Markdown)."""
    return resources.files(__package__).joinpath("logical_hash.md").read_text("utf-8")
