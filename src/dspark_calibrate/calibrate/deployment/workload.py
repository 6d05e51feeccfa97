"""Workload traces: recorded serving steps for replay (the ``workload`` table, DESIGN §4).

One row per (step, rank, request): the K raw confidence logits of the request's draft block, the
accepted length under full verification (0..K) and the output length so far. This module reads and
writes that table, turns TensorRT-LLM confidence-trace shards (``<stem>.rank<r>.pt``) into it, and
generates a synthetic workload for demos.

TensorRT-LLM's recorder pairs each draft block's logits with the accepted length of the next step
and records, per row, the step's graph batch size and (in newer builds) a per-rank step counter.
When the counter is absent, rows are grouped into steps by taking, in recording order, as many rows
as the recorded graph batch size (a sample of G rows per step); pad rows were dropped by the
recorder, so such steps can mix neighbouring iterations. The result is marked ``approximate`` and
the approximation is stated in its notes and, by ``build``, in the signed admission summary.

**Mixed steps** (DESIGN §10): a step that also runs context (prefill) chunks carries a companion
``workload-mixed`` table (``<stem>.mixed.parquet``, named with its logical hash in the workload's
provenance): one row per context chunk (size, prompt position, compressed tokens, real or dummy)
and one per generation request of a mixed step (KV history, eligible, bootstrap). The workload's
identity then covers both tables. Recorder shards that record context chunks become the same.

Performs file I/O only in :func:`read_workload`, :func:`write_workload` and
:func:`read_recorder_shards`; everything else is pure. torch is imported only to read ``.pt``
shards.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_calibrate import __version__
from dspark_calibrate.artifacts import (
    ArtifactReadError,
    ContextChunk,
    Fingerprint,
    GenerationRequest,
    MixedStep,
    Provenance,
    RankStep,
    canonical_json,
    logical_sha256,
    read_artifact,
    sha256_hex,
    write_unsigned_artifact,
)
from dspark_calibrate.calibrate.confidence.traces import load_shard
from dspark_calibrate.errors import ConfigError, InvalidValueError
from dspark_calibrate.schemas import SchemaMismatch, conform_table

__all__ = [
    "MIXED_KIND",
    "STEP_COLUMNS",
    "WORKLOAD_KIND",
    "MixedStepRows",
    "StepValues",
    "Workload",
    "WorkloadArrays",
    "mixed_path",
    "read_recorder_shards",
    "read_workload",
    "synthesize_mixed_workload",
    "synthesize_workload",
    "with_step_values",
    "workload_from_arrays",
    "workload_from_recorder_payloads",
    "write_workload",
]

WORKLOAD_KIND = "workload"
#: The companion table of a workload's mixed steps.
MIXED_KIND = "workload-mixed"
#: Default STS temperatures of the synthetic confidence head (raw logits are overconfident).
SYNTHETIC_TEMPERATURES: tuple[float, ...] = (1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0)


@dataclass(frozen=True, eq=False)
class WorkloadArrays:
    """The workload as numpy arrays, rows sorted by (step, rank, request_id).

    Attributes:
        step, rank: (n,) int64.
        request: (n,) int64 codes; code order is request_id string order.
        logits: (n, K) float32 raw confidence logits.
        accepted: (n,) int64 accepted draft tokens under full verification.
        output_len: (n,) int64 output tokens before this step.
    """

    step: np.ndarray
    rank: np.ndarray
    request: np.ndarray
    logits: np.ndarray
    accepted: np.ndarray
    output_len: np.ndarray


@dataclass(frozen=True, eq=False)
class StepValues:
    """Per-step recorded values (workload schema v2), one entry per distinct step, increasing.

    Attributes:
        step: (S,) step ids.
        step_time_ms: (S,) the step's recorded wall time, NaN where not recorded.
        waiting: (S,) requests waiting for a slot when the step started, NaN where not recorded.
        drain: (S,) the step comes after the last request's first step (nothing is still to arrive).
    """

    step: np.ndarray
    step_time_ms: np.ndarray
    waiting: np.ndarray
    drain: np.ndarray

    @property
    def has_times(self) -> bool:
        """Every step has a recorded wall time."""
        return bool(self.step.size) and bool(np.isfinite(self.step_time_ms).all())

    @property
    def has_waiting(self) -> bool:
        """Every step has a recorded queue depth."""
        return bool(self.step.size) and bool(np.isfinite(self.waiting).all())


def _step_values(table: pa.Table) -> StepValues:
    step = table.column("step").to_numpy()
    first = np.flatnonzero(np.r_[True, step[1:] != step[:-1]]) if step.size else np.zeros(0, dtype=np.int64)

    def column(name: str) -> np.ndarray:
        col = table.column(name).combine_chunks()
        values = col.cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False)
        out: np.ndarray = np.asarray(values, dtype=np.float64)[first]
        return out

    ids = step[first].astype(np.int64)
    request = table.column("request_id").combine_chunks()
    firsts = pa.table({"r": request, "s": table.column("step")}).group_by("r").aggregate([("s", "min")])
    arrived = firsts.column("s_min").to_numpy()
    drain = ids > int(arrived.max()) if arrived.size else np.zeros(ids.size, dtype=bool)
    return StepValues(ids, column("step_time_ms"), column("waiting"), drain)


@dataclass(frozen=True, eq=False)
class MixedStepRows:
    """One recorded mixed step: its description and where its generation rows are.

    Attributes:
        step: the step id.
        description: per rank, the context chunks and generation requests (request order on each
            rank is the workload's row order).
        start, stop: the step's generation rows in :meth:`Workload.arrays` order.
    """

    step: int
    description: MixedStep
    start: int
    stop: int


@dataclass(frozen=True, eq=False)
class Workload:
    """A validated workload table and what is known about it.

    Attributes:
        table: the ``workload`` table, sorted by (step, rank, request_id).
        k: the draft length K of every row.
        num_ranks: ranks of the deployment (max rank + 1 unless stated otherwise).
        approximate: steps were reconstructed, not recorded (see the notes).
        synthetic: generated, not recorded on a deployment.
        notes: human lines on how the workload was made and its approximations.
        source: where it came from.
        fingerprint: the (untrusted) fingerprint recorded with it, if any.
        mixed: the ``workload-mixed`` table of the mixed steps (None: every step is decode only).
    """

    table: pa.Table
    k: int
    num_ranks: int
    approximate: bool = False
    synthetic: bool = False
    notes: tuple[str, ...] = ()
    source: str = ""
    fingerprint: Fingerprint | None = None
    mixed: pa.Table | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def identity_sha256(self) -> str:
        """The receipt's ``workload_identity_sha256``: the table's logical SHA-256, or with mixed
        steps the SHA-256 of ``{"workload": <logical>, "workload-mixed": <logical>}`` (canonical JSON)."""
        if "identity" not in self._cache:
            own = logical_sha256(self.table, WORKLOAD_KIND)
            if self.mixed is not None:
                own = sha256_hex(
                    canonical_json({"workload": own, MIXED_KIND: logical_sha256(self.mixed, MIXED_KIND)})
                )
            self._cache["identity"] = own
        return str(self._cache["identity"])

    def mixed_step_rows(self) -> tuple[MixedStepRows, ...]:
        """Every mixed step in step order (computed once; empty without mixed steps)."""
        if "mixed" not in self._cache:
            self._cache["mixed"] = _mixed_steps(self) if self.mixed is not None else ()
        out: tuple[MixedStepRows, ...] = self._cache["mixed"]
        return out

    def mixed_steps(self) -> Iterator[MixedStep]:
        """The description of every mixed step, in step order."""
        return (m.description for m in self.mixed_step_rows())

    def mixed_step_ids(self) -> np.ndarray:
        """Ids of the mixed steps, increasing."""
        return np.array([m.step for m in self.mixed_step_rows()], dtype=np.int64)

    def step_values(self) -> StepValues:
        """The recorded per-step values, one entry per distinct step (computed once)."""
        if "step_values" not in self._cache:
            self._cache["step_values"] = _step_values(self.table)
        out: StepValues = self._cache["step_values"]
        return out

    @property
    def rows(self) -> int:
        """Number of rows (request-steps)."""
        return int(self.table.num_rows)

    @property
    def steps(self) -> int:
        """Number of distinct steps."""
        return int(np.unique(self.arrays().step).shape[0]) if self.rows else 0

    def arrays(self) -> WorkloadArrays:
        """The table as numpy arrays (computed once)."""
        if "arrays" not in self._cache:
            self._cache["arrays"] = _to_arrays(self.table, self.k)
        out: WorkloadArrays = self._cache["arrays"]
        return out

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description."""
        return {
            "rows": self.rows,
            "steps": self.steps,
            "mixed_steps": len(self.mixed_step_rows()),
            "k": self.k,
            "num_ranks": self.num_ranks,
            "approximate": self.approximate,
            "synthetic": self.synthetic,
            "notes": list(self.notes),
            "source": self.source,
            "workload_identity_sha256": self.identity_sha256,
        }


def _to_arrays(table: pa.Table, k: int) -> WorkloadArrays:
    ids = table.column("request_id").combine_chunks()
    uniq = pc.unique(ids)
    uniq_sorted = uniq.take(pc.array_sort_indices(uniq))
    codes = pc.index_in(ids, value_set=uniq_sorted).to_numpy(zero_copy_only=False).astype(np.int64)
    lg = table.column("logits").combine_chunks()
    flat = pc.list_flatten(lg).to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return WorkloadArrays(
        step=table.column("step").to_numpy().astype(np.int64, copy=False),
        rank=table.column("rank").to_numpy().astype(np.int64, copy=False),
        request=codes,
        logits=flat.reshape(table.num_rows, k),
        accepted=table.column("accepted").to_numpy().astype(np.int64, copy=False),
        output_len=table.column("output_len").to_numpy().astype(np.int64, copy=False),
    )


#: Per-step columns added in workload schema v2 (null where the recorder did not know them).
STEP_COLUMNS: tuple[str, ...] = ("step_time_ms", "waiting")


def _with_step_columns(table: pa.Table) -> pa.Table:
    """A v1 table (or plain Parquet with v1's columns) with v2's per-step columns, all null."""
    if any(name in table.column_names for name in STEP_COLUMNS):
        return table
    n = table.num_rows
    return table.append_column("step_time_ms", pa.nulls(n, pa.float64())).append_column(
        "waiting", pa.nulls(n, pa.int64())
    )


def _validate_step_columns(table: pa.Table, where: str) -> None:
    """Per-step values: equal on every row of a step (or null on all of them), in range."""
    step = table.column("step").to_numpy()
    first = np.r_[True, step[1:] != step[:-1]] if step.size else np.zeros(0, dtype=bool)
    for name, low, unit in (("step_time_ms", 0.0, "a recorded wall time in ms"), ("waiting", 0, "a count")):
        col = table.column(name).combine_chunks()
        if col.null_count == len(col):
            continue
        valid = ~col.is_null().to_numpy(zero_copy_only=False)
        values = col.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.float64)
        start = np.cumsum(first) - 1
        starts = np.flatnonzero(first)
        same_valid = valid == valid[starts][start]
        same_value = (values == values[starts][start]) | ~valid
        bad = ~(same_valid & same_value)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ConfigError(
                f"{where}: {name} differs between rows of step {step[i]}; it is a per-step value, the same "
                "on every row of the step (or null on all of them)"
            )
        out_of_range = valid & ~(np.isfinite(values) & (values > low if name == "step_time_ms" else values >= low))
        if out_of_range.any():
            i = int(np.flatnonzero(out_of_range)[0])
            raise ConfigError(
                f"{where}: {name} of step {step[i]} is {values[i]!r}; it must be {unit} "
                f"{'> 0' if name == 'step_time_ms' else '>= 0'}"
            )


def _validate(table: pa.Table, where: str, k: int | None) -> tuple[pa.Table, int]:
    try:
        table = conform_table(WORKLOAD_KIND, _with_step_columns(table))
    except SchemaMismatch as exc:
        raise ConfigError(f"{where}: {exc}; write workloads with `dspark-calibrate workload`") from exc
    if table.num_rows == 0:
        raise ConfigError(f"{where}: the workload has no rows")
    lengths = pc.list_value_length(table.column("logits"))
    lo, hi = pc.min(lengths).as_py(), pc.max(lengths).as_py()
    if lo != hi or lo is None or lo < 1:
        raise ConfigError(f"{where}: logits must all hold K values; found lengths {lo}..{hi}")
    if k is not None and lo != k:
        raise ConfigError(
            f"{where}: workload has K={lo} logits per row, the deployment has K={k}; record the workload "
            "with the same draft length"
        )
    k = int(lo)
    flat = pc.list_flatten(table.column("logits"))
    if flat.null_count or not np.all(np.isfinite(flat.to_numpy(zero_copy_only=False))):
        raise ConfigError(f"{where}: logits must be finite numbers")
    acc = table.column("accepted")
    if pc.min(acc).as_py() < 0 or pc.max(acc).as_py() > k:
        raise ConfigError(f"{where}: accepted must lie in [0, K={k}]")
    for name in ("step", "rank", "output_len"):
        if pc.min(table.column(name)).as_py() < 0:
            raise ConfigError(f"{where}: {name} must be >= 0")
    table = table.sort_by([("step", "ascending"), ("rank", "ascending"), ("request_id", "ascending")])
    s = table.column("step").to_numpy()
    r = table.column("rank").to_numpy()
    q = table.column("request_id").combine_chunks()
    same = pc.and_(
        pc.equal(q.slice(1), q.slice(0, len(q) - 1)),
        pa.array((s[1:] == s[:-1]) & (r[1:] == r[:-1])),
    )
    if table.num_rows > 1 and pc.any(same).as_py():
        i = int(np.flatnonzero(same.to_numpy(zero_copy_only=False))[0])
        raise ConfigError(
            f"{where}: request {q[i].as_py()!r} appears twice on rank {r[i]} in step {s[i]}; "
            "each (step, rank, request_id) must be unique"
        )
    _validate_step_columns(table, where)
    return table, k


def _validate_mixed(mixed: pa.Table, table: pa.Table, where: str) -> pa.Table:
    """The companion table: schema, values, and one generation entry per row of a mixed step."""
    try:
        mixed = conform_table(MIXED_KIND, mixed)
    except SchemaMismatch as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    mixed = mixed.sort_by([("step", "ascending"), ("rank", "ascending"), ("request_id", "ascending")])
    col = {name: mixed.column(name).to_numpy(zero_copy_only=False) for name in mixed.column_names}

    def refuse(mask: np.ndarray, what: str) -> None:
        if np.any(mask):
            i = int(np.flatnonzero(mask)[0])
            entry = f"(step {col['step'][i]}, rank {col['rank'][i]}, request {col['request_id'][i]!r})"
            raise ConfigError(f"{where}: mixed entry {entry}: {what}")

    n = mixed.num_rows
    same = np.zeros(n, dtype=bool)
    if n > 1:
        same[1:] = (
            (col["step"][1:] == col["step"][:-1])
            & (col["rank"][1:] == col["rank"][:-1])
            & (col["request_id"][1:] == col["request_id"][:-1])
        )
    refuse(same, "appears twice; each (step, rank, request_id) is one entry")
    refuse((col["step"] < 0) | (col["rank"] < 0), "step and rank must be >= 0")
    context = col["role"] == "context"
    generation = col["role"] == "generation"
    refuse(~(context | generation), "role must be context or generation")
    refuse(
        context & ((col["chunk_size"] < 1) | (col["chunk_position"] < 0) | (col["compressed_tokens"] < 0)),
        "a context chunk needs chunk_size >= 1, chunk_position and compressed_tokens >= 0",
    )
    refuse(generation & (col["history"] < 0), "history must be >= 0")
    refuse(generation & col["bootstrap"] & col["eligible"], "a bootstrap generation is never eligible")
    # Every generation row of a mixed step has exactly one generation entry, and every entry a row.
    steps = np.unique(col["step"][context])
    rows = table.filter(pa.array(np.isin(table.column("step").to_numpy(), steps))).select(
        ["step", "rank", "request_id"]
    )
    entries = mixed.filter(pa.array(generation)).select(["step", "rank", "request_id"])
    keys = ["step", "rank", "request_id"]
    missing = rows.join(entries, keys, join_type="left anti")
    stray = entries.join(rows, keys, join_type="left anti")
    if missing.num_rows or stray.num_rows:
        raise ConfigError(
            f"{where}: every generation row of a mixed step needs its mixed entry (history, eligible, bootstrap) "
            f"and every entry its row; missing entries {missing.slice(0, 3).to_pylist()}, entries without rows "
            f"{stray.slice(0, 3).to_pylist()}"
        )
    return mixed


def _mixed_steps(workload: Workload) -> tuple[MixedStepRows, ...]:
    """Build every mixed step's description from the two tables (workload order within a rank)."""
    assert workload.mixed is not None
    a = workload.arrays()
    mixed = workload.mixed
    role = mixed.column("role").to_numpy(zero_copy_only=False)
    ctx = mixed.filter(pa.array(role == "context")).to_pylist()
    chunks: dict[tuple[int, int], list[ContextChunk]] = {}
    for r in ctx:
        chunk = ContextChunk(r["chunk_size"], r["chunk_position"], r["compressed_tokens"], r["real"])
        chunks.setdefault((r["step"], r["rank"]), []).append(chunk)
    # Each generation row's entry, aligned with the workload rows by a join on (step, rank, request).
    keys = workload.table.select(["step", "rank", "request_id"]).append_column(
        "row", pa.array(np.arange(workload.rows, dtype=np.int64))
    )
    gens = mixed.filter(pa.array(role == "generation")).select(
        ["step", "rank", "request_id", "history", "eligible", "bootstrap"]
    )
    joined = keys.join(gens, ["step", "rank", "request_id"], join_type="inner")
    row = joined.column("row").to_numpy()
    # Requests with equal attributes share one (frozen) object: a workload repeats few of them.
    made: dict[tuple[int, bool, bool], GenerationRequest] = {}
    requests: dict[int, GenerationRequest] = {}
    for i, h, e, b in zip(
        row.tolist(),
        joined.column("history").to_pylist(),
        joined.column("eligible").to_pylist(),
        joined.column("bootstrap").to_pylist(),
        strict=True,
    ):
        key = (int(h), bool(e), bool(b))
        req = made.get(key)
        if req is None:
            req = made[key] = GenerationRequest(*key)
        requests[int(i)] = req
    steps = sorted({s for s, _ in chunks})
    starts = np.searchsorted(a.step, np.asarray(steps, dtype=np.int64), side="left").tolist()
    stops = np.searchsorted(a.step, np.asarray(steps, dtype=np.int64), side="right").tolist()
    out = []
    for step, start, stop in zip(steps, starts, stops, strict=True):
        cuts = (
            start + np.searchsorted(a.rank[start:stop], np.arange(workload.num_ranks + 1), side="left")
        ).tolist()
        ranks = tuple(
            RankStep(
                tuple(chunks.get((step, rank), ())),
                tuple(requests[i] for i in range(cuts[rank], cuts[rank + 1])),
            )
            for rank in range(workload.num_ranks)
        )
        out.append(MixedStepRows(int(step), MixedStep(ranks), int(start), int(stop)))
    return tuple(out)


def _nullable(values: np.ndarray | None, n: int, typ: pa.DataType) -> pa.Array:
    """A per-row column from an array with NaN for unknown (all null when ``values`` is None)."""
    if values is None:
        return pa.nulls(n, typ)
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (n,):
        raise ConfigError(f"per-step columns must hold one value per row ({n}), got shape {list(arr.shape)}")
    known = ~np.isnan(arr)
    if pa.types.is_integer(typ):
        whole = np.where(known, arr, 0)
        if np.any(whole != np.round(whole)) or np.any(np.abs(whole) >= 2.0**62):
            raise ConfigError("waiting must hold whole numbers of requests")
        return pa.array(whole.astype(np.int64), type=typ, mask=~known)
    return pa.array(np.where(known, arr, 0.0), type=typ, mask=~known)


def workload_from_arrays(
    *,
    step: np.ndarray,
    rank: np.ndarray,
    request_id: Sequence[str] | np.ndarray | pa.Array,
    logits: np.ndarray,
    accepted: np.ndarray,
    output_len: np.ndarray,
    num_ranks: int | None = None,
    approximate: bool = False,
    synthetic: bool = False,
    notes: Sequence[str] = (),
    source: str = "",
    fingerprint: Fingerprint | None = None,
    mixed: pa.Table | None = None,
    step_time_ms: np.ndarray | None = None,
    waiting: np.ndarray | None = None,
) -> Workload:
    """Build and validate a workload from columns (``mixed``: its ``workload-mixed`` table).

    ``step_time_ms`` and ``waiting`` are per-row copies of per-step values (the step's recorded
    wall time; the requests waiting for a slot when it started), NaN where unknown.

    Raises:
        ConfigError: wrong shapes, K not uniform, out-of-range values, duplicate rows, or mixed
            entries that do not match the rows of their steps.
    """
    lg = np.asarray(logits, dtype=np.float32)
    if lg.ndim != 2:
        raise ConfigError(f"logits must be (rows, K), got shape {lg.shape}")
    n, k = lg.shape
    ids = request_id if isinstance(request_id, pa.Array) else pa.array(np.asarray(request_id).astype(str))
    table = pa.table(
        {
            "step": pa.array(np.asarray(step, dtype=np.int64)),
            "rank": pa.array(np.asarray(rank, dtype=np.int64)),
            "request_id": ids.cast(pa.string()),
            "logits": pa.FixedSizeListArray.from_arrays(pa.array(lg.reshape(-1)), k).cast(
                pa.list_(pa.float32())
            ),
            "accepted": pa.array(np.asarray(accepted, dtype=np.int64)),
            "output_len": pa.array(np.asarray(output_len, dtype=np.int64)),
            "step_time_ms": _nullable(step_time_ms, n, pa.float64()),
            "waiting": _nullable(waiting, n, pa.int64()),
        }
    )
    if any(len(table.column(c)) != n for c in table.column_names):
        raise ConfigError("workload columns must all have one entry per row")
    table, k = _validate(table, source or "workload", None)
    ranks = int(pc.max(table.column("rank")).as_py()) + 1
    if mixed is not None:
        mixed = _validate_mixed(mixed, table, source or "workload")
        if mixed.num_rows:
            ranks = max(ranks, int(pc.max(mixed.column("rank")).as_py()) + 1)
    return Workload(
        table=table,
        k=k,
        num_ranks=max(ranks, int(num_ranks or 0)),
        approximate=approximate,
        synthetic=synthetic,
        notes=tuple(notes),
        source=source,
        fingerprint=fingerprint,
        mixed=mixed,
    )


def with_step_values(
    workload: Workload,
    *,
    step: np.ndarray,
    step_time_ms: np.ndarray | None = None,
    waiting: np.ndarray | None = None,
) -> Workload:
    """The workload with per-step values set (NaN: unknown) for the steps listed in ``step``.

    Steps not listed keep no value (null). Returns a new, validated workload.

    Raises:
        ConfigError: shapes differ, a step is listed twice, or a value is out of range.
    """
    ids = np.asarray(step, dtype=np.int64)
    if np.unique(ids).size != ids.size:
        raise ConfigError("with_step_values: a step is listed twice")
    a = workload.arrays()
    order = np.argsort(ids)
    pos = np.searchsorted(ids[order], a.step)
    pos = np.minimum(pos, max(ids.size - 1, 0))
    listed = ids.size > 0 and np.asarray(ids[order][pos] == a.step)

    def per_row(values: np.ndarray | None) -> np.ndarray | None:
        if values is None:
            return None
        v = np.asarray(values, dtype=np.float64)
        if v.shape != ids.shape:
            raise ConfigError(f"with_step_values: {v.shape[0] if v.ndim else 0} values for {ids.size} steps")
        out: np.ndarray = np.where(listed, v[order][pos] if ids.size else np.nan, np.nan)
        return out

    table = workload.table
    old = {name: table.column(name).cast(pa.float64()).fill_null(np.nan).to_numpy() for name in STEP_COLUMNS}
    times = per_row(step_time_ms)
    queue = per_row(waiting)
    return workload_from_arrays(
        step=a.step,
        rank=a.rank,
        request_id=table.column("request_id").combine_chunks(),
        logits=a.logits,
        accepted=a.accepted,
        output_len=a.output_len,
        num_ranks=workload.num_ranks,
        approximate=workload.approximate,
        synthetic=workload.synthetic,
        notes=workload.notes,
        source=workload.source,
        fingerprint=workload.fingerprint,
        mixed=workload.mixed,
        step_time_ms=old["step_time_ms"] if times is None else times,
        waiting=old["waiting"] if queue is None else queue,
    )


def write_workload(
    path: Path | str,
    workload: Workload,
    *,
    fingerprint: Fingerprint | None = None,
    provenance: Provenance | None = None,
) -> str:
    """Write a workload as an unsigned ``workload`` Parquet artifact (atomically).

    A workload with mixed steps also writes ``<stem>.mixed.parquet`` (:func:`mixed_path`), named
    with its logical hash in the workload's provenance.

    Returns:
        The workload table's logical SHA-256.

    Raises:
        ConfigError: the table cannot be written.
    """
    fp = (
        fingerprint
        or workload.fingerprint
        or Fingerprint(max_draft_len=workload.k, gpu_count=workload.num_ranks)
    )
    prov = provenance or Provenance(tool_version=__version__, synthetic=workload.synthetic)
    extra = dict(prov.extra)
    extra.update({"workload_notes": list(workload.notes), "workload_source": workload.source})
    prov = replace(prov, synthetic=prov.synthetic or workload.synthetic, extra=extra)
    summary = {
        "k": workload.k,
        "num_ranks": workload.num_ranks,
        "rows": workload.rows,
        "steps": workload.steps,
        "approximate": workload.approximate,
        "synthetic": workload.synthetic,
    }
    path = Path(path)
    try:
        if workload.mixed is not None:
            # The companion first: the workload names it with its logical hash.
            companion = mixed_path(path)
            digest = write_unsigned_artifact(
                companion, workload.mixed, kind=MIXED_KIND, fingerprint=fp, provenance=prov
            )
            summary["mixed_steps"] = len(workload.mixed_step_rows())
            prov = replace(
                prov, extra={**extra, "mixed_file": companion.name, "mixed_logical_sha256": digest}
            )
        return write_unsigned_artifact(
            path, workload.table, kind=WORKLOAD_KIND, fingerprint=fp, provenance=prov, summary=summary
        )
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write workload ({exc.strerror or exc})") from exc


def mixed_path(path: Path) -> Path:
    """``<stem>.mixed.parquet`` beside a workload file."""
    return path.with_name(path.stem + ".mixed.parquet")


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def read_workload(path: Path | str, *, k: int | None = None) -> Workload:
    """Read a ``workload`` artifact (footer optional: a plain Parquet file with the columns works).

    Args:
        path: the Parquet file.
        k: the deployment's K; a workload recorded with another K is refused.

    Raises:
        ConfigError: unreadable, another kind, wrong schema, K mismatch, bad values.
    """
    path = Path(path)
    meta: Mapping[str, Any] = {}
    try:
        loaded = read_artifact(path)
        table, meta = loaded.table, loaded.metadata
        if loaded.kind != WORKLOAD_KIND:
            raise ConfigError(f"{path}: is a {loaded.kind!r} artifact, expected a workload")
    except ArtifactReadError as exc:
        if "no 'dspark' footer key" not in str(exc):
            raise ConfigError(str(exc)) from exc
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as exc2:
            raise ConfigError(f"{path}: cannot read Parquet ({exc2})") from exc2
        table = table.replace_schema_metadata(None)
    table, kk = _validate(table, str(path), k)
    summary = _mapping(meta.get("summary"))
    prov = _mapping(meta.get("provenance"))
    extra = _mapping(prov.get("extra"))
    fp = None
    if isinstance(meta.get("fingerprint"), Mapping):
        try:
            fp = Fingerprint.from_dict(meta["fingerprint"])
        except ValueError:
            fp = None
    ranks = int(pc.max(table.column("rank")).as_py()) + 1
    mixed = None
    if extra.get("mixed_file") is not None:
        mixed = _read_mixed(path, str(extra["mixed_file"]), extra.get("mixed_logical_sha256"), table)
        if mixed.num_rows:
            ranks = max(ranks, int(pc.max(mixed.column("rank")).as_py()) + 1)
    return Workload(
        table=table,
        k=kk,
        num_ranks=max(ranks, int(summary.get("num_ranks") or 0)),
        approximate=bool(summary.get("approximate", False)),
        synthetic=bool(prov.get("synthetic", False)) or bool(summary.get("synthetic", False)),
        notes=tuple(str(x) for x in extra.get("workload_notes", ()) or ()),
        source=str(extra.get("workload_source") or path),
        fingerprint=fp,
        mixed=mixed,
    )


def _read_mixed(path: Path, name: str, digest: Any, table: pa.Table) -> pa.Table:
    """The companion table a workload names, checked against the logical hash it records."""
    companion = path.with_name(Path(name).name)
    try:
        loaded = read_artifact(companion)
    except ArtifactReadError as exc:
        raise ConfigError(
            f"{path}: names mixed steps in {companion.name}, which cannot be read: {exc}"
        ) from exc
    if loaded.kind != MIXED_KIND:
        raise ConfigError(f"{companion}: is a {loaded.kind!r} artifact, expected {MIXED_KIND!r}")
    mixed = _validate_mixed(loaded.table, table, str(companion))
    if digest != logical_sha256(mixed, MIXED_KIND):
        raise ConfigError(
            f"{companion}: its content does not match the logical hash {digest!s} the workload {path.name} "
            "records; keep the two files together, as written"
        )
    return mixed


# ---------------------------------------------------------------------------------------------
# TensorRT-LLM recorder shards
# ---------------------------------------------------------------------------------------------


def _np(
    value: Any, where: str = "recorder shard", name: str = "value", *, length: int | None = None
) -> np.ndarray:
    """A payload field as a numeric numpy array (a dense tensor, or a rectangular list of numbers).

    Raises:
        ConfigError: anything else (sparse tensor, ragged or non-numeric list, wrong length),
            naming the shard and the field.
    """
    try:
        if hasattr(value, "detach"):  # a torch tensor
            if getattr(value, "layout", None) is not None and str(value.layout) != "torch.strided":
                raise ConfigError(f"{where}: {name!r} is a {value.layout} tensor; save a dense one")
            tensor = value.detach().cpu()
            if tensor.is_floating_point():
                tensor = tensor.double()
            value = tensor.numpy()
        arr = np.asarray(value)
    except (ValueError, TypeError, RuntimeError, OverflowError) as exc:
        raise ConfigError(
            f"{where}: {name!r} is not a rectangular numeric array ({str(exc).splitlines()[0][:120]}); save a tensor"
        ) from None
    if arr.dtype.kind not in "biuf":
        raise ConfigError(f"{where}: {name!r} must hold numbers, found {arr.dtype} values")
    if length is not None and (arr.ndim != 1 or arr.shape[0] != length):
        raise ConfigError(
            f"{where}: {name!r} must be a vector of {length} values (one per row), got shape {list(arr.shape)}"
        )
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise ConfigError(f"{where}: {name!r} holds NaN or infinite values; every value must be finite")
    return arr


def _int(payload: Mapping[str, Any], name: str, where: str) -> int:
    """A scalar integer field of a payload (a Python int, a numpy integer or a one-element tensor)."""
    value: Any = payload.get(name)
    if hasattr(value, "numel") and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or abs(int(value)) >= 1 << 62:
        shown = "missing" if value is None else f"{type(value).__name__} {str(value)[:40]}"
        raise ConfigError(
            f"{where}: {name!r} must be an integer, found {shown}; is this a TensorRT-LLM confidence-trace "
            "shard? (fit's recorder shards are read by `fit --traces`)"
        )
    return int(value)


def _group_by_graph_size(gbs: np.ndarray) -> np.ndarray:
    """Step index per row: consecutive runs of ``G`` rows (a smaller run where G changes)."""
    out = np.empty(gbs.shape[0], dtype=np.int64)
    i, step = 0, 0
    n = gbs.shape[0]
    while i < n:
        g = max(int(gbs[i]), 1)
        j = i + 1
        while j < n and j - i < g and gbs[j] == gbs[i]:
            j += 1
        out[i:j] = step
        step += 1
        i = j
    return out


def workload_from_recorder_payloads(
    payloads: Sequence[Mapping[str, Any]], *, source: str = "", names: Sequence[str] | None = None
) -> Workload:
    """Turn TensorRT-LLM confidence-trace payloads (one per rank) into a workload. Pure.

    Each payload holds ``logits`` (N, K), ``prefix_mask`` (N, K: accepted positions), ``rank``,
    ``max_draft_len``, ``graph_batch_size`` (N,) and optionally ``step_id`` (N,), ``request_id``
    (N,), ``real_mask`` (N,) and ``generation_progress`` (N,). ``names`` (one per payload, e.g.
    the shard files) name the payload in messages.

    A recorder that records context chunks adds, per chunk, ``context_step_id``,
    ``context_request_id``, ``context_chunk_size`` and ``context_position`` (M,), optionally
    ``context_compressed_tokens`` and ``context_real_mask``, and per generation row ``history``
    (N,: cached tokens), optionally ``eligible_mask`` and ``bootstrap_mask``; the steps with a
    chunk become the workload's mixed steps. Chunks need ``step_id``, ``request_id`` and ``history``.

    Raises:
        ConfigError: payloads disagree on K, miss a field, hold a field of the wrong type or shape,
            or hold no usable row; the message names the shard and the field.
    """
    if not payloads:
        raise ConfigError("no recorder shard given")
    wheres = list(names) if names is not None else [f"recorder shard {i}" for i in range(len(payloads))]
    if len(wheres) != len(payloads):
        raise InvalidValueError(f"names has {len(wheres)} entries for {len(payloads)} payloads")
    ks = {_int(p, "max_draft_len", w) for p, w in zip(payloads, wheres, strict=True)}
    if len(ks) != 1 or min(ks) < 1:
        raise ConfigError(
            f"recorder shards disagree on max_draft_len (found {sorted(ks)}); one deployment at a time"
        )
    k = ks.pop()
    have_ids = all("request_id" in p for p in payloads)
    shards = [_shard_rows(p, where, k, have_ids) for p, where in zip(payloads, wheres, strict=True)]
    approximate = any(s.approximate for s in shards)
    notes = _recorder_notes(approximate=approximate, have_ids=have_ids)
    rows = _merge_shards(shards, notes)
    mixed = None
    context = [s.chunks for s in shards if s.chunks is not None]
    if context:
        mixed = _recorded_mixed(
            context, rows.step, rows.rank, rows.req, rows.history, rows.eligible, rows.bootstrap
        )
        notes.append(
            f"context chunks recorded: {int(np.unique(mixed.column('step').to_numpy()).size)} mixed steps"
        )
    out = rows.out
    if np.any(out < 0):
        out = _output_so_far(rows.step, rows.req, rows.acc) if have_ids else np.zeros_like(rows.acc)
        notes.append(
            "output_len estimated from the recorded accepted lengths"
            if have_ids
            else "output_len unknown (0)"
        )
    return workload_from_arrays(
        step=rows.step,
        rank=rows.rank,
        request_id=rows.req,
        logits=rows.logits,
        accepted=rows.acc,
        output_len=out,
        num_ranks=max(_int(p, "rank", w) for p, w in zip(payloads, wheres, strict=True)) + 1,
        approximate=approximate,
        synthetic=False,
        notes=notes,
        source=source or "tensorrt-llm confidence trace",
        mixed=mixed,
    )


@dataclass(frozen=True, eq=False)
class _ShardRows:
    """One shard's (or, merged, every shard's) kept generation rows, column by column.

    ``out`` is -1 where the shard records no generation progress; ``approximate``: steps were
    reconstructed from the recording order; ``chunks``: the shard's context chunks, if any.
    """

    step: np.ndarray
    rank: np.ndarray
    req: np.ndarray
    logits: np.ndarray
    acc: np.ndarray
    out: np.ndarray
    history: np.ndarray
    eligible: np.ndarray
    bootstrap: np.ndarray
    approximate: bool = False
    chunks: dict[str, Any] | None = None


def _shard_rows(p: Mapping[str, Any], where: str, k: int, have_ids: bool) -> _ShardRows:
    """Check one payload's fields (in a fixed order, so the first defect is the one reported) and
    keep its real rows.

    Raises:
        ConfigError: a field is missing, of the wrong type or shape; the message names ``where``.
    """
    missing = [f for f in ("logits", "prefix_mask", "graph_batch_size", "rank") if f not in p]
    if missing:
        raise ConfigError(
            f"{where}: recorder shard lacks {missing}; is it a TensorRT-LLM confidence trace (.pt)? "
            "(fit's recorder shards are read by `fit --traces`)"
        )
    rank = _int(p, "rank", where)
    logits = _np(p["logits"], where, "logits")
    mask = _np(p["prefix_mask"], where, "prefix_mask")
    if logits.ndim != 2 or logits.shape[1] != k or mask.shape != logits.shape:
        raise ConfigError(
            f"{where}: logits and prefix_mask must both be (N, {k}), got {list(logits.shape)} and "
            f"{list(mask.shape)}"
        )
    if np.abs(logits).max(initial=0.0) > np.finfo(np.float32).max:
        raise ConfigError(
            f"{where}: 'logits' holds values beyond float32's range; save finite float32 logits"
        )
    logits = logits.astype(np.float32)
    n = logits.shape[0]
    keep = np.ones(n, dtype=bool)
    if "real_mask" in p:
        keep &= _np(p["real_mask"], where, "real_mask", length=n).astype(bool)
    approximate = "step_id" not in p
    if not approximate:
        step = _np(p["step_id"], where, "step_id", length=n).astype(np.int64)
    else:
        step = _group_by_graph_size(
            _np(p["graph_batch_size"], where, "graph_batch_size", length=n).astype(np.int64)
        )
    if have_ids:
        req = _np(p["request_id"], where, "request_id", length=n).astype(np.int64)
        keep &= req >= 0
        req_s = req.astype(str)
    else:
        req_s = np.char.add(f"r{rank}-", np.arange(n).astype(str))
    acc = np.clip(np.rint(mask.astype(np.float64).sum(axis=1)), 0, k).astype(np.int64)
    out = (
        _np(p["generation_progress"], where, "generation_progress", length=n).astype(np.int64)
        if "generation_progress" in p
        else None
    )
    chunks = _recorded_chunks(p, rank, n)
    hist = _np(p["history"]).astype(np.int64) if "history" in p else np.full(n, -1, dtype=np.int64)
    elig = _np(p["eligible_mask"]).astype(bool) if "eligible_mask" in p else np.ones(n, dtype=bool)
    boot = _np(p["bootstrap_mask"]).astype(bool) if "bootstrap_mask" in p else np.zeros(n, dtype=bool)
    return _ShardRows(
        step=step[keep],
        rank=np.full(int(keep.sum()), rank, dtype=np.int64),
        req=req_s[keep],
        logits=logits[keep],
        acc=acc[keep],
        out=np.maximum(out[keep], 0) if out is not None else np.full(int(keep.sum()), -1),
        history=hist[keep],
        eligible=elig[keep] & ~boot[keep],
        bootstrap=boot[keep],
        approximate=approximate,
        chunks=chunks,
    )


def _recorder_notes(*, approximate: bool, have_ids: bool) -> list[str]:
    """How the steps and the requests were identified."""
    notes = []
    if approximate:
        notes.append(
            "steps reconstructed from recording order: each step takes the next G rows (G = the recorded "
            "graph batch size) per rank, and ranks are aligned by that step index; pad rows were dropped "
            "by the recorder, so a step can mix neighbouring iterations (approximate)"
        )
    else:
        notes.append("steps from the recorder's per-rank step counter; ranks aligned by counter value")
    if not have_ids:
        notes.append(
            "request ids absent: every row is its own request (the request bootstrap becomes a row bootstrap)"
        )
    return notes


def _merge_shards(shards: Sequence[_ShardRows], notes: list[str]) -> _ShardRows:
    """Every shard's rows in (step, rank, request) order, without duplicates (noted in ``notes``).

    Raises:
        ConfigError: no shard holds a valid row.
    """
    step = np.concatenate([s.step for s in shards])
    if step.size == 0:
        raise ConfigError("recorder shards hold no valid rows")
    rank = np.concatenate([s.rank for s in shards])
    req = np.concatenate([s.req for s in shards])
    # Duplicate (step, rank, request) can only come from approximate grouping: keep the first.
    order = np.lexsort((req, rank, step))
    s2, r2, q2 = step[order], rank[order], req[order]
    dup = np.zeros(order.shape[0], dtype=bool)
    dup[1:] = (s2[1:] == s2[:-1]) & (r2[1:] == r2[:-1]) & (q2[1:] == q2[:-1])
    if dup.any():
        notes.append(f"{int(dup.sum())} duplicate request rows inside reconstructed steps dropped")
        order = order[~dup]

    def merged(column: str) -> np.ndarray:
        out: np.ndarray = np.concatenate([getattr(s, column) for s in shards])[order]
        return out

    return _ShardRows(
        step=step[order],
        rank=rank[order],
        req=req[order],
        logits=merged("logits"),
        acc=merged("acc"),
        out=merged("out"),
        history=merged("history"),
        eligible=merged("eligible"),
        bootstrap=merged("bootstrap"),
    )


_CONTEXT_FIELDS = ("context_step_id", "context_request_id", "context_chunk_size", "context_position")


def _recorded_chunks(p: Mapping[str, Any], rank: int, n: int) -> dict[str, Any] | None:
    """A shard's context chunks (None when it records none)."""
    present = [f for f in _CONTEXT_FIELDS if f in p]
    if not present:
        return None
    missing = [f for f in (*_CONTEXT_FIELDS, "step_id", "request_id", "history") if f not in p]
    if missing:
        raise ConfigError(
            f"rank {rank} shard records context chunks but lacks {missing}; a mixed step needs the step "
            "counter, request ids and every generation's history"
        )
    m = _np(p["context_step_id"]).shape[0]
    if _np(p["history"]).shape[0] != n:
        raise ConfigError(f"rank {rank} shard: history must have one entry per row ({n})")
    out: dict[str, Any] = {f: _np(p[f]).astype(np.int64).reshape(-1) for f in _CONTEXT_FIELDS}
    out["compressed"] = (
        _np(p["context_compressed_tokens"]).astype(np.int64).reshape(-1)
        if "context_compressed_tokens" in p
        else np.zeros(m, dtype=np.int64)
    )
    out["real"] = (
        _np(p["context_real_mask"]).astype(bool).reshape(-1) if "context_real_mask" in p else np.ones(m, bool)
    )
    if any(np.asarray(v).shape[0] != m for v in out.values()):
        raise ConfigError(f"rank {rank} shard: the context fields need one entry per chunk ({m})")
    out["rank"] = rank
    return out


def _recorded_mixed(
    context: Sequence[Mapping[str, Any]],
    step: np.ndarray,
    rank: np.ndarray,
    request: np.ndarray,
    history: np.ndarray,
    eligible: np.ndarray,
    bootstrap: np.ndarray,
) -> pa.Table:
    """The ``workload-mixed`` table of recorded context chunks and their steps' generation rows."""
    c_step = np.concatenate([c["context_step_id"] for c in context])
    c_rank = np.concatenate([np.full(c["context_step_id"].shape[0], c["rank"], np.int64) for c in context])
    c_req = np.concatenate([c["context_request_id"].astype(str) for c in context])
    size = np.concatenate([c["context_chunk_size"] for c in context])
    pos = np.concatenate([c["context_position"] for c in context])
    comp = np.concatenate([c["compressed"] for c in context])
    real = np.concatenate([c["real"] for c in context])
    gen = np.isin(step, c_step)
    if np.any(history[gen] < 0):
        raise ConfigError("generation rows of a mixed step need their recorded history")
    n_c, n_g = c_step.shape[0], int(gen.sum())
    zeros_c, zeros_g = np.zeros(n_c, np.int64), np.zeros(n_g, np.int64)
    return pa.table(
        {
            "step": pa.array(np.r_[c_step, step[gen]], pa.int64()),
            "rank": pa.array(np.r_[c_rank, rank[gen]], pa.int64()),
            "request_id": pa.array(np.r_[c_req, request[gen]].astype(str), pa.string()),
            "role": pa.array(["context"] * n_c + ["generation"] * n_g, pa.string()),
            "chunk_size": pa.array(np.r_[size, zeros_g], pa.int64()),
            "chunk_position": pa.array(np.r_[pos, zeros_g], pa.int64()),
            "compressed_tokens": pa.array(np.r_[comp, zeros_g], pa.int64()),
            "real": pa.array(np.r_[real, np.zeros(n_g, bool)], pa.bool_()),
            "history": pa.array(np.r_[zeros_c, history[gen]], pa.int64()),
            "eligible": pa.array(np.r_[np.zeros(n_c, bool), eligible[gen]], pa.bool_()),
            "bootstrap": pa.array(np.r_[np.zeros(n_c, bool), bootstrap[gen]], pa.bool_()),
        }
    )


def _output_so_far(step: np.ndarray, request: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """Tokens each request emitted before each of its rows (exclusive cumulative sum)."""
    order = np.lexsort((step, request))
    tokens = (accepted + 1)[order]
    req_sorted = request[order]
    csum = np.cumsum(tokens) - tokens
    starts = np.r_[True, req_sorted[1:] != req_sorted[:-1]]
    first = np.maximum.accumulate(np.where(starts, np.arange(order.shape[0]), 0))
    out = np.empty_like(accepted)
    out[order] = csum - csum[first]
    return out


def read_recorder_shards(paths: Sequence[Path | str]) -> Workload:
    """Read TensorRT-LLM confidence-trace shards (``torch.save`` payloads) into a workload.

    Raises:
        ConfigError: torch is missing, a shard cannot be read, or the payloads are unusable.
    """
    payloads = []
    for p in paths:
        payload = load_shard(p)
        if not isinstance(payload, Mapping):
            raise ConfigError(
                f"{p}: not a recorder payload: a {type(payload).__name__}, expected the dict a TensorRT-LLM "
                "confidence-trace shard holds (logits, prefix_mask, rank, max_draft_len, graph_batch_size)"
            )
        payloads.append(payload)
    return workload_from_recorder_payloads(
        payloads, source=", ".join(str(p) for p in paths), names=[str(p) for p in paths]
    )


# ---------------------------------------------------------------------------------------------
# Synthetic workloads
# ---------------------------------------------------------------------------------------------

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = (x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
    z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
    z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def _uniform(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = ((_splitmix64(x) >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)
    return out


def _synthetic_temperatures(k: int, temperatures: Sequence[float] | None) -> tuple[float, ...]:
    if temperatures is not None and len(temperatures) != k:
        raise ConfigError(
            f"--temperatures has {len(temperatures)} values but --k is {k}; give one temperature per "
            "draft position"
        )
    temps = tuple(temperatures) if temperatures is not None else SYNTHETIC_TEMPERATURES[:k]
    if len(temps) < k:  # the defaults cover K <= 5; longer blocks repeat the last one
        temps = temps + (temps[-1],) * (k - len(temps))
    if not all(math.isfinite(t) and t > 0 for t in temps):
        raise ConfigError(f"--temperatures {list(temps)} must be finite positive numbers")
    return temps


def _synthetic_rows(
    counts: np.ndarray,
    *,
    k: int,
    max_rows: int,
    seed: int,
    temps: Sequence[float],
    mean_request_steps: int,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Generation rows for ``counts`` (steps, ranks) rows per rank: requests served back to back
    per slot, a latent quality per request, logits ``T_j · logit(q_j)``, accepted lengths."""
    steps, ranks = counts.shape
    s_idx = np.arange(steps)
    total = int(counts.sum())
    step = np.repeat(np.repeat(s_idx, ranks), counts.reshape(-1))
    rank = np.repeat(np.tile(np.arange(ranks), steps), counts.reshape(-1))
    starts = np.cumsum(counts.reshape(-1)) - counts.reshape(-1)
    slot = np.arange(total) - np.repeat(starts, counts.reshape(-1))
    slot_key = (rank * max_rows + slot).astype(np.int64)
    slot_hash = _splitmix64(slot_key + np.int64(seed) * 1_000_003)
    length = (mean_request_steps // 2 + (slot_hash % np.uint64(mean_request_steps)).astype(np.int64)).clip(1)
    offset = ((slot_hash >> np.uint64(20)) % np.uint64(10_000)).astype(np.int64)
    epoch = (step + offset) // length
    code = (slot_key << 32) + epoch
    u1 = _uniform(code * 2 + np.int64(seed))
    u2 = _uniform(code * 2 + 1 + np.int64(seed))
    quality = np.sqrt(-2.0 * np.log(u1)) * np.cos(2 * np.pi * u2)
    j = np.arange(k)[None, :]
    z = 1.6 + 0.9 * quality[:, None] - 0.55 * j + rng.normal(0.0, 0.6, size=(total, k))
    q = 1.0 / (1.0 + np.exp(-z))
    logits = (np.asarray(temps)[None, :] * z).astype(np.float32)
    success = rng.random((total, k)) < q
    accepted = np.cumprod(success, axis=1).sum(axis=1).astype(np.int64)
    return {"step": step, "rank": rank, "code": code, "logits": logits, "accepted": accepted}


def synthesize_workload(
    *,
    k: int = 5,
    steps: int = 4000,
    ranks: int = 1,
    max_rows: int = 32,
    seed: int = 0,
    temperatures: Sequence[float] | None = None,
    mean_request_steps: int = 120,
) -> Workload:
    """Generate a synthetic workload (marked synthetic) from a simple serving model.

    Each rank serves between 1 and ``max_rows`` rows; the load follows a slow sinusoid with noise,
    so several graph sizes occur. Each row slot serves requests back to back, a request lasting
    about ``mean_request_steps`` steps. A request has a latent quality; at draft position j the
    true acceptance probability is ``q_j = sigmoid(1.6 + 0.9*u - 0.55*(j-1) + noise)`` and the
    recorded raw logit is ``T_j * logit(q_j)``, so STS with ``temperatures`` is exactly calibrated.
    The accepted length is the number of leading successes of Bernoulli(q_j) draws.

    Raises:
        ConfigError: a size or the temperatures are out of range.
    """
    if k < 1 or steps < 1 or ranks < 1 or max_rows < 1 or mean_request_steps < 1:
        raise ConfigError("synthetic workload needs k, steps, ranks, max_rows and mean_request_steps >= 1")
    temps = _synthetic_temperatures(k, temperatures)
    rng = np.random.default_rng(seed)
    s_idx = np.arange(steps)
    phase = rng.uniform(0, 2 * np.pi, size=ranks)
    period = max(50.0, steps / 6.0)
    load = 0.55 + 0.35 * np.sin(2 * np.pi * s_idx[:, None] / period + phase[None, :])
    load = load + rng.normal(0.0, 0.08, size=(steps, ranks))
    counts = np.clip(np.rint(load * max_rows), 1, max_rows).astype(np.int64)  # (steps, ranks)
    r = _synthetic_rows(
        counts, k=k, max_rows=max_rows, seed=seed, temps=temps, mean_request_steps=mean_request_steps, rng=rng
    )
    notes = (
        f"synthetic workload: {steps} steps, {ranks} rank(s), 1..{max_rows} rows per rank, seed {seed}",
        f"confidence logits are T_j * logit(q_j) with STS temperatures {list(temps)} (exactly calibrated)",
    )
    return workload_from_arrays(
        step=r["step"],
        rank=r["rank"],
        request_id=pa.array(r["code"]).cast(pa.string()),
        logits=r["logits"],
        accepted=r["accepted"],
        output_len=_output_so_far(r["step"], r["code"], r["accepted"]),
        num_ranks=ranks,
        synthetic=True,
        notes=notes,
        source="dspark-calibrate workload synth",
    )


def _synthetic_mixed_table(
    r: Mapping[str, np.ndarray],
    request_ids: pa.Array,
    mixed_step: np.ndarray,
    ctx_rank: np.ndarray,
    ctx_size: np.ndarray,
    ctx_pos: np.ndarray,
    *,
    history: int,
) -> pa.Table:
    """The ``workload-mixed`` table of the synthetic context chunks and their steps' generation rows."""
    gen_rows = np.isin(r["step"], mixed_step)
    n_ctx, n_gen = int(mixed_step.size), int(gen_rows.sum())
    return pa.table(
        {
            "step": pa.array(np.r_[mixed_step, r["step"][gen_rows]], pa.int64()),
            "rank": pa.array(np.r_[ctx_rank, r["rank"][gen_rows]], pa.int64()),
            "request_id": pa.concat_arrays(
                [
                    pa.array([f"prefill-{s}" for s in mixed_step.tolist()], pa.string()),
                    request_ids.filter(pa.array(gen_rows)),
                ]
            ),
            "role": pa.array(["context"] * n_ctx + ["generation"] * n_gen, pa.string()),
            "chunk_size": pa.array(np.r_[ctx_size, np.zeros(n_gen, np.int64)], pa.int64()),
            "chunk_position": pa.array(np.r_[ctx_pos, np.zeros(n_gen, np.int64)], pa.int64()),
            "compressed_tokens": pa.array(np.zeros(n_ctx + n_gen, np.int64), pa.int64()),
            "real": pa.array([True] * n_ctx + [False] * n_gen, pa.bool_()),
            "history": pa.array(
                np.r_[np.zeros(n_ctx, np.int64), np.full(n_gen, history, np.int64)], pa.int64()
            ),
            "eligible": pa.array([False] * n_ctx + [True] * n_gen, pa.bool_()),
            "bootstrap": pa.array([False] * (n_ctx + n_gen), pa.bool_()),
        }
    )


def synthesize_mixed_workload(
    *,
    k: int = 3,
    steps: int = 3000,
    ranks: int = 8,
    levels: Sequence[int] = (6, 10, 14),
    prefill_share: float = 0.5,
    chunk_sizes: Sequence[int] = (48, 96),
    positions: Sequence[int] = (128, 256),
    history: int = 1024,
    seed: int = 0,
    temperatures: Sequence[float] | None = None,
    mean_request_steps: int = 120,
) -> Workload:
    """A synthetic workload with prefill traffic (marked synthetic): about ``prefill_share`` of its
    steps are mixed.

    The load is one of ``levels`` generation rows on every rank, changing every 50 steps or so;
    in a mixed step one rank (drawn uniformly) also runs a context chunk of one of
    ``chunk_sizes`` tokens at one of ``positions``. Every generation has ``history`` cached
    tokens and is eligible (as a serving engine with a fixed KV length would key it), so mixed
    geometries recur, as exact-geometry lookup needs. The drafts follow
    :func:`synthesize_workload`'s model.

    Raises:
        ConfigError: sizes out of range.
    """
    if k < 1 or steps < 1 or ranks < 1 or not levels or min(levels) < 1 or not 0 <= prefill_share <= 1:
        raise ConfigError(
            "a synthetic mixed workload needs k, steps, ranks, levels >= 1 and prefill_share in [0, 1]"
        )
    if not chunk_sizes or min(chunk_sizes) < 1 or not positions or min(positions) < 0 or history < 0:
        raise ConfigError("chunk sizes must be >= 1, positions and history >= 0")
    temps = _synthetic_temperatures(k, temperatures)
    rng = np.random.default_rng(seed)
    phase = np.repeat(rng.integers(0, len(levels), size=steps // 50 + 1), 50)[:steps]
    counts = np.repeat(np.asarray(levels, dtype=np.int64)[phase][:, None], ranks, axis=1)
    r = _synthetic_rows(
        counts,
        k=k,
        max_rows=max(levels),
        seed=seed,
        temps=temps,
        mean_request_steps=mean_request_steps,
        rng=rng,
    )
    mixed_step = np.flatnonzero(rng.random(steps) < prefill_share)
    ctx_rank = rng.integers(0, ranks, size=mixed_step.size)
    ctx_size = np.asarray(chunk_sizes, dtype=np.int64)[
        rng.integers(0, len(chunk_sizes), size=mixed_step.size)
    ]
    ctx_pos = np.asarray(positions, dtype=np.int64)[rng.integers(0, len(positions), size=mixed_step.size)]
    request_ids = pa.array(r["code"]).cast(pa.string())
    mixed = _synthetic_mixed_table(r, request_ids, mixed_step, ctx_rank, ctx_size, ctx_pos, history=history)
    n_ctx = int(mixed_step.size)
    notes = (
        f"synthetic mixed workload: {steps} steps ({n_ctx} mixed), {ranks} rank(s), rows per rank {list(levels)}, "
        f"chunks {list(chunk_sizes)} at positions {list(positions)}, history {history}, seed {seed}",
        f"confidence logits are T_j * logit(q_j) with STS temperatures {list(temps)} (exactly calibrated)",
    )
    return workload_from_arrays(
        step=r["step"],
        rank=r["rank"],
        request_id=request_ids,
        logits=r["logits"],
        accepted=r["accepted"],
        output_len=_output_so_far(r["step"], r["code"], r["accepted"]),
        num_ranks=ranks,
        synthetic=True,
        notes=notes,
        source="dspark-calibrate workload synth --prefill-share",
        mixed=mixed,
    )
