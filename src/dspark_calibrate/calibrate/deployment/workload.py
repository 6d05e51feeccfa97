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

Performs file I/O only in :func:`read_workload`, :func:`write_workload` and
:func:`read_recorder_shards`; everything else is pure. torch is imported only to read ``.pt``
shards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dspark_calibrate import __version__
from dspark_calibrate.artifacts import (
    ArtifactReadError,
    Fingerprint,
    Provenance,
    logical_sha256,
    read_artifact,
    write_unsigned_artifact,
)
from dspark_calibrate.calibrate.confidence.traces import load_shard
from dspark_calibrate.errors import ConfigError, InvalidValueError
from dspark_calibrate.schemas import SchemaMismatch, conform_table

__all__ = [
    "WORKLOAD_KIND",
    "Workload",
    "WorkloadArrays",
    "read_recorder_shards",
    "read_workload",
    "synthesize_workload",
    "workload_from_arrays",
    "workload_from_recorder_payloads",
    "write_workload",
]

WORKLOAD_KIND = "workload"
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
    """

    table: pa.Table
    k: int
    num_ranks: int
    approximate: bool = False
    synthetic: bool = False
    notes: tuple[str, ...] = ()
    source: str = ""
    fingerprint: Fingerprint | None = None
    _cache: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def identity_sha256(self) -> str:
        """The logical SHA-256 of the table (the receipt's ``workload_identity_sha256``)."""
        if "identity" not in self._cache:
            self._cache["identity"] = logical_sha256(self.table, WORKLOAD_KIND)
        return str(self._cache["identity"])

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


def _validate(table: pa.Table, where: str, k: int | None) -> tuple[pa.Table, int]:
    try:
        table = conform_table(WORKLOAD_KIND, table)
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
    return table, k


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
) -> Workload:
    """Build and validate a workload from columns.

    Raises:
        ConfigError: wrong shapes, K not uniform, out-of-range values or duplicate rows.
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
        }
    )
    if any(len(table.column(c)) != n for c in table.column_names):
        raise ConfigError("workload columns must all have one entry per row")
    table, k = _validate(table, source or "workload", None)
    ranks = int(pc.max(table.column("rank")).as_py()) + 1
    return Workload(
        table=table,
        k=k,
        num_ranks=max(ranks, int(num_ranks or 0)),
        approximate=approximate,
        synthetic=synthetic,
        notes=tuple(notes),
        source=source,
        fingerprint=fingerprint,
    )


def write_workload(
    path: Path | str,
    workload: Workload,
    *,
    fingerprint: Fingerprint | None = None,
    provenance: Provenance | None = None,
) -> str:
    """Write a workload as an unsigned ``workload`` Parquet artifact (atomically).

    Returns:
        The workload's logical SHA-256.

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
    try:
        return write_unsigned_artifact(
            path, workload.table, kind=WORKLOAD_KIND, fingerprint=fp, provenance=prov, summary=summary
        )
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write workload ({exc.strerror or exc})") from exc


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
    return Workload(
        table=table,
        k=kk,
        num_ranks=max(ranks, int(summary.get("num_ranks") or 0)),
        approximate=bool(summary.get("approximate", False)),
        synthetic=bool(prov.get("synthetic", False)) or bool(summary.get("synthetic", False)),
        notes=tuple(str(x) for x in extra.get("workload_notes", ()) or ()),
        source=str(extra.get("workload_source") or path),
        fingerprint=fp,
    )


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
    notes: list[str] = []
    approximate = False
    cols: dict[str, list[np.ndarray]] = {
        "step": [],
        "rank": [],
        "req": [],
        "logits": [],
        "acc": [],
        "out": [],
    }
    have_ids = all("request_id" in p for p in payloads)
    for p, where in zip(payloads, wheres, strict=True):
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
        if "step_id" in p:
            step = _np(p["step_id"], where, "step_id", length=n).astype(np.int64)
        else:
            step = _group_by_graph_size(
                _np(p["graph_batch_size"], where, "graph_batch_size", length=n).astype(np.int64)
            )
            approximate = True
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
        cols["step"].append(step[keep])
        cols["rank"].append(np.full(int(keep.sum()), rank, dtype=np.int64))
        cols["req"].append(req_s[keep])
        cols["logits"].append(logits[keep])
        cols["acc"].append(acc[keep])
        cols["out"].append(np.maximum(out[keep], 0) if out is not None else np.full(int(keep.sum()), -1))
    step = np.concatenate(cols["step"])
    if step.size == 0:
        raise ConfigError("recorder shards hold no valid rows")
    rank_a = np.concatenate(cols["rank"])
    req = np.concatenate(cols["req"])
    logits = np.concatenate(cols["logits"])
    acc = np.concatenate(cols["acc"])
    out = np.concatenate(cols["out"])
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
    # Duplicate (step, rank, request) can only come from approximate grouping: keep the first.
    order = np.lexsort((req, rank_a, step))
    s2, r2, q2 = step[order], rank_a[order], req[order]
    dup = np.zeros(order.shape[0], dtype=bool)
    dup[1:] = (s2[1:] == s2[:-1]) & (r2[1:] == r2[:-1]) & (q2[1:] == q2[:-1])
    if dup.any():
        notes.append(f"{int(dup.sum())} duplicate request rows inside reconstructed steps dropped")
        order = order[~dup]
    step, rank_a, req, acc, out = (a[order] for a in (step, rank_a, req, acc, out))
    logits = logits[order]
    if np.any(out < 0):
        out = _output_so_far(step, req, acc) if have_ids else np.zeros_like(acc)
        notes.append(
            "output_len estimated from the recorded accepted lengths"
            if have_ids
            else "output_len unknown (0)"
        )
    return workload_from_arrays(
        step=step,
        rank=rank_a,
        request_id=req,
        logits=logits,
        accepted=acc,
        output_len=out,
        num_ranks=max(_int(p, "rank", w) for p, w in zip(payloads, wheres, strict=True)) + 1,
        approximate=approximate,
        synthetic=False,
        notes=notes,
        source=source or "tensorrt-llm confidence trace",
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
    rng = np.random.default_rng(seed)
    s_idx = np.arange(steps)
    phase = rng.uniform(0, 2 * np.pi, size=ranks)
    period = max(50.0, steps / 6.0)
    load = 0.55 + 0.35 * np.sin(2 * np.pi * s_idx[:, None] / period + phase[None, :])
    load = load + rng.normal(0.0, 0.08, size=(steps, ranks))
    counts = np.clip(np.rint(load * max_rows), 1, max_rows).astype(np.int64)  # (steps, ranks)
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
    request_ids = pa.array(code).cast(pa.string())
    out = _output_so_far(step, code, accepted)
    notes = (
        f"synthetic workload: {steps} steps, {ranks} rank(s), 1..{max_rows} rows per rank, seed {seed}",
        f"confidence logits are T_j * logit(q_j) with STS temperatures {list(temps)} (exactly calibrated)",
    )
    return workload_from_arrays(
        step=step,
        rank=rank,
        request_id=request_ids,
        logits=logits,
        accepted=accepted,
        output_len=out,
        num_ranks=ranks,
        synthetic=True,
        notes=notes,
        source="dspark-calibrate workload synth",
    )
