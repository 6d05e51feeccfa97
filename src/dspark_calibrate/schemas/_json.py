"""Loaders for the JSON Schemas and the logical-hash specification shipped in this package.

Imports nothing of ours; reads package data only.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from dspark_calibrate.errors import InvalidValueError

__all__ = [
    "ADMISSION_SUMMARY_KEYS",
    "DRAIN_GUARD_SUMMARY_KEYS",
    "JSON_SCHEMAS",
    "PER_BUCKET_KEYS",
    "json_schema",
    "logical_hash_spec",
]

#: The exact keys of the admission artifact's signed summary: ``build`` writes exactly these and
#: the runtime hook requires every one (a v1 summary has no optional or unknown keys).
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

#: Names of the JSON Schemas shipped (``<name>.schema.json``).
JSON_SCHEMAS: tuple[str, ...] = ("fingerprint", "predicate", "bundle")


@cache
def json_schema(name: str) -> dict[str, Any]:
    """Return a shipped JSON Schema (draft 2020-12) by name: fingerprint, predicate or bundle.

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
