"""Arrow schemas, JSON Schemas, the logical-hash specification and the engine's cell limits.

Imports nothing of ours.

Example:
    >>> from dspark_calibrate.schemas import arrow_schema, key_columns
    >>> key_columns("cost-table")
    ('graph_batch_size', 'verifier_budget')
    >>> arrow_schema("cost-table").names[:3]
    ['graph_batch_size', 'verifier_budget', 'step_time_ms']
"""

from dspark_calibrate.schemas._arrow import (
    ARTIFACT_KINDS,
    BUNDLE_KINDS,
    KINDS,
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    SchemaMismatch,
    TableSpec,
    arrow_schema,
    conform_table,
    key_columns,
    table_spec,
)
from dspark_calibrate.schemas._json import (
    ADMISSION_PREDICTION_KEYS,
    ADMISSION_SUMMARY_KEYS,
    DRAIN_GUARD_SUMMARY_KEYS,
    JSON_SCHEMAS,
    MIXED_ADMISSION_SUMMARY_KEYS,
    MIXED_COST_SUMMARY_KEYS,
    MIXED_GATES,
    MIXED_RESULT_FILES,
    MIXED_RESULTS,
    PAYLOAD_TYPE,
    PER_BUCKET_KEYS,
    json_schema,
    logical_hash_spec,
)
from dspark_calibrate.schemas._limits import (
    MAX_COMPACT_CELLS_PER_G,
    MAX_COMPACT_CELLS_TOTAL,
    MAX_COST_TABLE_ROWS,
    MAX_MIXED_CELLS,
)

__all__ = [
    "ADMISSION_PREDICTION_KEYS",
    "ADMISSION_SUMMARY_KEYS",
    "ARTIFACT_KINDS",
    "BUNDLE_KINDS",
    "DRAIN_GUARD_SUMMARY_KEYS",
    "JSON_SCHEMAS",
    "KINDS",
    "MAX_COMPACT_CELLS_PER_G",
    "MAX_COMPACT_CELLS_TOTAL",
    "MAX_COST_TABLE_ROWS",
    "MAX_MIXED_CELLS",
    "MIXED_ADMISSION_SUMMARY_KEYS",
    "MIXED_COST_SUMMARY_KEYS",
    "MIXED_GATES",
    "MIXED_RESULTS",
    "MIXED_RESULT_FILES",
    "PAYLOAD_TYPE",
    "PER_BUCKET_KEYS",
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMA_VERSIONS",
    "SchemaMismatch",
    "TableSpec",
    "arrow_schema",
    "conform_table",
    "json_schema",
    "key_columns",
    "logical_hash_spec",
    "table_spec",
]
