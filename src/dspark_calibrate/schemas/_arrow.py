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
    "BUNDLE_KINDS",
    "KINDS",
    "SCHEMA_VERSION",
    "SUPPORTED_SCHEMA_VERSIONS",
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
#: Earlier schema versions that are still read and verified (never written): (kind, version).
_LEGACY: dict[tuple[str, int], TableSpec] = {}


def _register(
    kind: str, version: int, keys: tuple[str, ...], fields: list[pa.Field], *, legacy: bool = False
) -> None:
    schema = pa.schema(fields)
    missing = [k for k in keys if k not in schema.names]
    if missing:  # pragma: no cover - a programming error in this module
        raise AssertionError(f"{kind}: key columns {missing} not in schema")
    spec = TableSpec(kind=kind, schema=schema, keys=keys, version=version)
    if legacy:
        _LEGACY[(kind, version)] = spec
    else:
        _SPECS[kind] = spec


# Per-cell summary of a sweep (unsigned output of `sweep`; `build`/`sign` turn it into a cost table).
# verifier_budget 0 is the native (static full-K) cell by convention (DESIGN §2); -1 is the forced-K
# arm (the engine's confidence path on, every window forced to K), measured to price the overhead.
_SWEEP_V1 = [
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
]
# What the paired design adds (DESIGN §7, §9): the saving 1 - T(G,V)/T(G,0) from the medians, its
# 95% interval from the rounds both cells were measured in (a prediction for a serving process),
# how many rounds were paired (0: unpaired, priced the pre-pairing way), the relative SD of the
# level shift common to every cell between processes, and this cell's own level SD beyond it.
_PAIRED = [
    _f("saving", _F64),
    _f("saving_ci_low", _F64),
    _f("saving_ci_high", _F64),
    _f("paired_rounds", _I64),
    _f("common_mode_rel", _F64),
    _f("level_rel", _F64),
]
# The sweep's own bias checks (DESIGN §7), per cell: the control saving of its G (the native step
# captured again: 0 is the truth; null without a control) and whether its saving interval was
# widened because that control's interval excludes 0; the between-run paired SD (REML estimate)
# and the upper value the saving intervals carry (null: fewer than two epochs, nothing estimated);
# the cell's median SM clock and power over its native cell's; the shift of its median by the
# carry-over of the visits before it (null: not estimable). Every column is nullable: a table
# assembled elsewhere may leave a check unstated, and a reader takes null as "not checked".
_CHECKS = [
    _f("control_bias", _F64, nullable=True),
    _f("control_bias_ci_low", _F64, nullable=True),
    _f("control_bias_ci_high", _F64, nullable=True),
    _f("control_widened", pa.bool_(), nullable=True),
    _f("paired_rel", _F64, nullable=True),
    _f("paired_rel_upper", _F64, nullable=True),
    _f("clock_rel", _F64, nullable=True),
    _f("power_rel", _F64, nullable=True),
    _f("carryover_rel", _F64, nullable=True),
]
_SWEEP_V2 = [
    *_SWEEP_V1,
    *_PAIRED,
    _f("epochs", _I64),  # capture epochs (re-captured, re-warmed blocks of rounds) the cell spans
    _f("power_capped", _I64),  # kept samples taken under the SW power cap (the serving condition)
]
_register("sweep", 1, ("graph_batch_size", "verifier_budget"), _SWEEP_V1, legacy=True)
# The step protocol's term (docs/sweep.md "Step protocol"): the cell's median step time and paired
# saving when every step waits for the one before (the first replay of each sample) and when steps
# are queued behind a running one (the replays after it). Null where the timer did not time the
# first replay apart, or a sample was one replay; the savings are null for a native cell. And the
# saving at the native cell's SM clock (compact cells only; null without telemetry). The saving
# and absolute intervals of a v4 table hold all three.
_PROTOCOL = [
    _f("pipelined_ms", _F64, nullable=True),
    _f("synchronous_ms", _F64, nullable=True),
    _f("saving_pipelined", _F64, nullable=True),
    _f("saving_synchronous", _F64, nullable=True),
    _f("saving_at_native_clock", _F64, nullable=True),
]
_register("sweep", 2, ("graph_batch_size", "verifier_budget"), _SWEEP_V2, legacy=True)
_register("sweep", 3, ("graph_batch_size", "verifier_budget"), [*_SWEEP_V2, *_CHECKS], legacy=True)
_register("sweep", 4, ("graph_batch_size", "verifier_budget"), [*_SWEEP_V2, *_CHECKS, *_PROTOCOL])

# Raw samples of a sweep: every timed sample is kept, throttled ones flagged (kept=False).
_SAMPLES_KEYS = ("graph_batch_size", "verifier_budget", "round", "rank", "sample_index")
_SAMPLES_V1 = [
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
]
_register("sweep-samples", 1, _SAMPLES_KEYS, _SAMPLES_V1, legacy=True)
# v2: the capture epoch of every sample (the block of rounds between two re-captures).
_register("sweep-samples", 2, _SAMPLES_KEYS, [*_SAMPLES_V1, _f("epoch", _I64)], legacy=True)
# v3: the cell the sample's visit followed in the same process (null: the process's first visit)
# and the replays discarded before the visit's samples, for the carry-over estimate.
_SAMPLES_V3 = [
    *_SAMPLES_V1,
    _f("epoch", _I64),
    _f("prev_graph_batch_size", _I64, nullable=True),
    _f("prev_verifier_budget", _I64, nullable=True),
    _f("warmup", _I64),
]
_register("sweep-samples", 3, _SAMPLES_KEYS, _SAMPLES_V3, legacy=True)
# v4: the sample's first replay timed on its own (null: not timed apart), for the step protocol's term.
_register("sweep-samples", 4, _SAMPLES_KEYS, [*_SAMPLES_V3, _f("first_replay_ms", _F64, nullable=True)])

# Deployed cells with their measured whole-step times (signed).
_COST_V1 = [
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
]
_register("cost-table", 1, ("graph_batch_size", "verifier_budget"), _COST_V1, legacy=True)
# v2: the paired savings and the level model behind build's joint uncertainty (DESIGN §9).
_register("cost-table", 2, ("graph_batch_size", "verifier_budget"), [*_COST_V1, *_PAIRED], legacy=True)
# v3: the sweep's bias checks, as the sweep states them (see _CHECKS).
_register("cost-table", 3, ("graph_batch_size", "verifier_budget"), [*_COST_V1, *_PAIRED, *_CHECKS])

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
_WORKLOAD_V1 = [
    _f("step", _I64),
    _f("rank", _I64),
    _f("request_id", _STR),
    _f("logits", pa.list_(pa.float32())),
    _f("accepted", _I64),  # accepted length under full verification
    _f("output_len", _I64),  # output tokens so far
]
_register("workload", 1, ("step", "rank", "request_id"), _WORKLOAD_V1, legacy=True)
# v2: what decides the load regime and prices steps the cost table cannot (DESIGN §9): per step
# (equal on every row of the step; null where the recorder did not know it) the step's recorded
# wall time and the requests waiting for a slot when the step started.
_register(
    "workload",
    2,
    ("step", "rank", "request_id"),
    [
        *_WORKLOAD_V1,
        _f("step_time_ms", _F64, nullable=True),
        _f("waiting", _I64, nullable=True),
    ],
)

# Mixed prefill+decode evidence (DESIGN §10). A mixed cell is one exact geometry: per rank, in rank
# order, twelve integer features (flattened rank by rank), the body capacity bucket and each
# rank's actual and native rows. Cells are measured paired with the native width of the same step
# (its "group": the rank features, run at the paid bucket with native rows, capacity 0 here).
_GEOMETRY = [
    _f("rank_features", pa.list_(_I64)),  # world_size x 12 features, rank by rank
    _f("actual_rank_rows", pa.list_(_I64)),
    _f("native_rank_rows", pa.list_(_I64)),
    _f("native_capacity", _I64),  # the paid bucket: the smallest holding every rank's native rows
]
_MIXED_SAMPLES_KEYS = ("mixed_group", "capacity", "round", "rank", "sample_index")
_register(
    "mixed-sweep",
    1,
    ("group_sha256", "capacity"),
    [
        _f("mixed_group", _I64),  # index of the step in the sweep (the samples table's key)
        _f("group_sha256", _STR),  # SHA-256 of the canonical JSON of the rank features
        _f("capacity", _I64),  # 0: the native arm of the group; else the cell's body bucket
        _f("geometry_sha256", _STR),  # SHA-256 of the consumer geometry's canonical JSON
        *_GEOMETRY,
        _f("workload_steps", _I64),  # recorded steps with this geometry (0 for a user grid)
        *_SWEEP_V1[3:],  # step_time_ms .. source_result_sha256, as a decode sweep states them
        *_PAIRED,
        _f("epochs", _I64),
        _f("power_capped", _I64),
        # The backend's output check: rows whose greedy tokens the candidate and the native
        # forward both produce, and how many of them disagree (0 rows: not checked).
        _f("accuracy_rows", _I64),
        _f("accuracy_mismatches", _I64),
    ],
)
_register(
    "mixed-sweep-samples",
    1,
    _MIXED_SAMPLES_KEYS,
    [_f("mixed_group", _I64), _f("capacity", _I64), *_SAMPLES_V1[2:], _f("epoch", _I64)],
)
# Deployed mixed cells (signed): the consumer's four cell fields plus what build priced them with.
_register(
    "mixed-cost-table",
    1,
    ("geometry_sha256",),
    [
        _f("geometry_sha256", _STR),
        _f("mixed_group", _I64),
        _f("group_sha256", _STR),
        _f("capacity", _I64),
        *_GEOMETRY,
        _f("native_lower_ms", _F64),  # 2.5% bound of the native arm's 95% reproduction interval
        _f("candidate_upper_ms", _F64),  # native_lower_ms x (1 - saving_ci_low), paired_bounds
        _f("measurement_result_sha256", _STR),  # logical hash of the cell's paired samples
        _f("native_ms", _F64),
        _f("native_ci_low_ms", _F64),
        _f("native_ci_high_ms", _F64),
        _f("candidate_ms", _F64),
        _f("candidate_ci_low_ms", _F64),
        _f("candidate_ci_high_ms", _F64),
        _f("saving", _F64),
        _f("saving_ci_low", _F64),
        _f("saving_ci_high", _F64),
        _f("paired_rounds", _I64),
        _f("common_mode_rel", _F64),
        _f("native_level_rel", _F64),
        _f("samples", _I64),
        _f("native_samples", _I64),
        _f("stop_reason", _STR),
        _f("accuracy_rows", _I64),
        _f("accuracy_mismatches", _I64),
    ],
)
# Per deployed mixed cell replay statistics; the mixed economics ride in the signed summary.
_register(
    "mixed-admission",
    1,
    ("geometry_sha256",),
    [
        _f("geometry_sha256", _STR),
        _f("chosen_steps", _I64),
        _f("value_ms", _F64),
        _f("value_ms_lower_bound", _F64),
    ],
)
# What a mixed step holds beyond its generation rows (companion of a ``workload``): one row per
# context chunk (role "context") and per generation request of a mixed step (role "generation").
_register(
    "workload-mixed",
    1,
    ("step", "rank", "request_id"),
    [
        _f("step", _I64),
        _f("rank", _I64),
        _f("request_id", _STR),
        _f("role", _STR),  # context | generation
        _f("chunk_size", _I64),  # context: tokens of the chunk (0 for a generation)
        _f("chunk_position", _I64),  # context: prompt tokens already cached before the chunk
        _f("compressed_tokens", _I64),  # context: compressed KV tokens the chunk attends to
        _f("real", pa.bool_()),  # context: a request's chunk (False: a dummy request)
        _f("history", _I64),  # generation: KV-cache tokens before the step
        _f("eligible", pa.bool_()),  # generation: the confidence path may shorten it
        _f("bootstrap", pa.bool_()),  # generation: its first generation step
    ],
)

KINDS: tuple[str, ...] = tuple(sorted(_SPECS))
#: Kinds that can be signed and deployed (DESIGN §4).
ARTIFACT_KINDS: tuple[str, ...] = (
    "admission",
    "calibration",
    "cost-table",
    "mixed-admission",
    "mixed-cost-table",
    "mixed-sweep",
    "mixed-sweep-samples",
    "sweep",
    "sweep-samples",
)
#: The member kinds of a decode bundle, in the order they are listed (DESIGN §4 "Bundle").
BUNDLE_KINDS: tuple[str, ...] = ("cost-table", "calibration", "admission")
#: The version every writer writes, per kind.
SCHEMA_VERSION: Mapping[str, int] = MappingProxyType({k: s.version for k, s in _SPECS.items()})
#: Every version that is still read and verified, per kind (ascending; the last one is written).
SUPPORTED_SCHEMA_VERSIONS: Mapping[str, tuple[int, ...]] = MappingProxyType(
    {k: tuple(sorted({s.version, *(v for (lk, v) in _LEGACY if lk == k)})) for k, s in _SPECS.items()}
)


def table_spec(kind: str, version: int | None = None) -> TableSpec:
    """Return the spec of a table kind, the current version unless ``version`` names another.

    Raises:
        SchemaMismatch: the kind is unknown, or the version is not supported.
    """
    try:
        spec = _SPECS[kind]
    except KeyError:
        raise SchemaMismatch(f"unknown table kind {kind!r}; known kinds: {', '.join(KINDS)}") from None
    if version is None or version == spec.version:
        return spec
    legacy = _LEGACY.get((kind, version))
    if legacy is None:
        raise SchemaMismatch(
            f"{kind} schema version {version!r} is not supported; this version reads "
            f"{list(SUPPORTED_SCHEMA_VERSIONS[kind])}"
        )
    return legacy


def arrow_schema(kind: str, version: int | None = None) -> pa.Schema:
    """Return the Arrow schema of a table kind (the current version unless ``version`` is given)."""
    return table_spec(kind, version).schema


def key_columns(kind: str) -> tuple[str, ...]:
    """Return the columns that define canonical row order (and uniqueness) for a kind."""
    return table_spec(kind).keys


def conform_table(kind: str, table: pa.Table, version: int | None = None) -> pa.Table:
    """Check that ``table`` has exactly the kind's columns, in order, with castable types.

    Safe casts only (int32 → int64, string → string); nothing is silently dropped or renamed.
    ``version`` conforms to an earlier, still-read schema version instead of the current one.

    Returns:
        The table cast to the kind's schema.

    Raises:
        SchemaMismatch: a column is missing, extra, out of order, of the wrong type, or null where
            the schema forbids nulls.
    """
    spec = table_spec(kind, version)
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
