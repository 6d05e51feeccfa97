"""Arrow schemas of every table the project writes or reads, versioned per kind.

Imports nothing of ours. A schema here is the contract between writers (sweep, fit, build) and
readers (verification, runtime, reports); change a column only together with its kind's
``SCHEMA_VERSION`` entry.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import pyarrow as pa

from dspark_calibrate.errors import InvalidValueError

__all__ = [
    "ARTIFACT_KINDS",
    "KINDS",
    "SCHEMA_VERSION",
    "SchemaMismatch",
    "TableSpec",
    "arrow_schema",
    "conform_table",
    "key_columns",
    "table_spec",
]


class SchemaMismatch(InvalidValueError):
    """A table does not match its kind's schema. The message names the column and the fix."""

    default_code = "SCHEMA_MISMATCH"


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One table kind: its Arrow schema, the columns that define canonical row order, its version."""

    kind: str
    schema: pa.Schema
    keys: tuple[str, ...]
    version: int


def _f(name: str, typ: pa.DataType, nullable: bool = False) -> pa.Field:
    return pa.field(name, typ, nullable=nullable)


_I64 = pa.int64()
_F64 = pa.float64()
_STR = pa.string()

_SPECS: dict[str, TableSpec] = {}


def _register(kind: str, version: int, keys: tuple[str, ...], fields: list[pa.Field]) -> None:
    schema = pa.schema(fields)
    missing = [k for k in keys if k not in schema.names]
    if missing:  # pragma: no cover - a programming error in this module
        raise AssertionError(f"{kind}: key columns {missing} not in schema")
    _SPECS[kind] = TableSpec(kind=kind, schema=schema, keys=keys, version=version)


# Per-cell summary of a sweep (unsigned output of `sweep`; `build`/`sign` turn it into a cost table).
# verifier_budget 0 is the native (static full-K) cell by convention (DESIGN §2).
_register(
    "sweep",
    1,
    ("graph_batch_size", "verifier_budget"),
    [
        _f("graph_batch_size", _I64),
        _f("verifier_budget", _I64),
        _f("tokens", _I64),  # tokens actually verified: G*(K+1) for the native cell, else V
        _f("step_time_ms", _F64),  # median whole-step time
        _f("ci_low_ms", _F64),
        _f("ci_high_ms", _F64),
        _f("p10_ms", _F64),
        _f("p90_ms", _F64),
        _f("iqr_ms", _F64),
        _f("samples", _I64),
        _f("rounds", _I64),
        _f("dropped_throttled", _I64),
        _f("warmup_steps", _I64),
        _f("replays_per_sample", _I64),
        _f("stop_reason", _STR),
        _f("sm_clock_mhz_median", _F64, nullable=True),
        _f("temperature_c_max", _F64, nullable=True),
        _f("power_w_median", _F64, nullable=True),
        _f("source_result_sha256", _STR),
    ],
)

# Raw samples of a sweep: every timed sample is kept, throttled ones flagged (kept=False).
_register(
    "sweep-samples",
    1,
    ("graph_batch_size", "verifier_budget", "round", "rank", "sample_index"),
    [
        _f("graph_batch_size", _I64),
        _f("verifier_budget", _I64),
        _f("round", _I64),
        _f("rank", _I64),  # the slowest rank of this sample (all-reduce MAX across ranks)
        _f("sample_index", _I64),
        _f("step_time_ms", _F64),  # mean of `replays` back-to-back replays
        _f("replays", _I64),
        _f("sm_clock_mhz", _F64, nullable=True),
        _f("temperature_c", _F64, nullable=True),
        _f("power_w", _F64, nullable=True),
        _f("throttle_reasons", _I64, nullable=True),
        _f("kept", pa.bool_()),
    ],
)

# Deployed cells with their measured whole-step times (signed).
_register(
    "cost-table",
    1,
    ("graph_batch_size", "verifier_budget"),
    [
        _f("graph_batch_size", _I64),
        _f("verifier_budget", _I64),
        _f("step_time_ms", _F64),
        _f("ci_low_ms", _F64),
        _f("ci_high_ms", _F64),
        _f("p10_ms", _F64),
        _f("p90_ms", _F64),
        _f("samples", _I64),
        _f("stop_reason", _STR),
        _f("source_result_sha256", _STR),
    ],
)

# Per-position confidence calibration (signed by build).
_register(
    "calibration",
    1,
    ("position",),
    [
        _f("position", _I64),  # 1..K
        _f("method", _STR),  # sts | platt | beta | isotonic | identity
        _f("temperature", _F64, nullable=True),  # STS temperature (or best STS approximation)
        _f("params", pa.list_(_F64)),
        _f("risk_set_size", _I64),
        _f("holdout_risk_set_size", _I64),
        _f("nll_before", _F64, nullable=True),
        _f("nll_after", _F64, nullable=True),
        _f("brier_before", _F64, nullable=True),
        _f("brier_after", _F64, nullable=True),
        _f("ece_before", _F64, nullable=True),
        _f("ece_after", _F64, nullable=True),
    ],
)

# Per-cell replay statistics; the workload economics ride in the signed predicate's summary.
_register(
    "admission",
    1,
    ("graph_batch_size", "verifier_budget"),
    [
        _f("graph_batch_size", _I64),
        _f("verifier_budget", _I64),
        _f("chosen_steps", _I64),
        _f("value_ms", _F64),  # replayed time saved versus the native cell (ms, summed)
        _f("value_ms_lower_bound", _F64),
    ],
)

# Draft rounds for calibration (project's own trace format, DESIGN §8).
_register(
    "trace",
    1,
    ("request_id", "round"),
    [
        _f("request_id", _STR),
        _f("round", _I64),
        _f("logits", pa.list_(pa.float32())),  # K raw confidence logits
        _f("accepted", _I64),  # 0..K accepted draft tokens
        _f("verified", _I64),  # positions the target checked (K when uncensored)
        _f("sampling", _STR, nullable=True),
        _f("temperature", _F64, nullable=True),
    ],
)

# Recorded serving steps for replay (build).
_register(
    "workload",
    1,
    ("step", "rank", "request_id"),
    [
        _f("step", _I64),
        _f("rank", _I64),
        _f("request_id", _STR),
        _f("logits", pa.list_(pa.float32())),
        _f("accepted", _I64),  # accepted length under full verification
        _f("output_len", _I64),  # output tokens so far
    ],
)

KINDS: tuple[str, ...] = tuple(sorted(_SPECS))
#: Kinds that can be signed and deployed (DESIGN §4).
ARTIFACT_KINDS: tuple[str, ...] = ("admission", "calibration", "cost-table", "sweep", "sweep-samples")
SCHEMA_VERSION: Mapping[str, int] = MappingProxyType({k: s.version for k, s in _SPECS.items()})


def table_spec(kind: str) -> TableSpec:
    """Return the spec of a table kind.

    Raises:
        SchemaMismatch: the kind is unknown.
    """
    try:
        return _SPECS[kind]
    except KeyError:
        raise SchemaMismatch(f"unknown table kind {kind!r}; known kinds: {', '.join(KINDS)}") from None


def arrow_schema(kind: str) -> pa.Schema:
    """Return the Arrow schema of a table kind."""
    return table_spec(kind).schema


def key_columns(kind: str) -> tuple[str, ...]:
    """Return the columns that define canonical row order (and uniqueness) for a kind."""
    return table_spec(kind).keys


def conform_table(kind: str, table: pa.Table) -> pa.Table:
    """Check that ``table`` has exactly the kind's columns, in order, with castable types.

    Safe casts only (int32 → int64, string → string); nothing is silently dropped or renamed.

    Returns:
        The table cast to the kind's schema.

    Raises:
        SchemaMismatch: a column is missing, extra, out of order, of the wrong type, or null where
            the schema forbids nulls.
    """
    spec = table_spec(kind)
    want = spec.schema.names
    have = table.schema.names
    if have != want:
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        detail = []
        if missing:
            detail.append(f"missing {missing}")
        if extra:
            detail.append(f"extra {extra}")
        if not missing and not extra:
            detail.append(f"order is {have}, expected {want}")
        raise SchemaMismatch(
            f"{kind} table columns do not match schema v{spec.version}: " + "; ".join(detail)
        )
    columns = []
    for field in spec.schema:
        col = table.column(field.name)
        if not col.type.equals(field.type):
            try:
                col = col.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise SchemaMismatch(
                    f"{kind}.{field.name} has type {col.type}, expected {field.type}"
                ) from exc
        if not field.nullable and col.null_count:
            raise SchemaMismatch(
                f"{kind}.{field.name} has {col.null_count} null value(s); nulls are not allowed"
            )
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=spec.schema)
