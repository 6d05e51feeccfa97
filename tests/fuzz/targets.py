"""Fuzz targets: mutated untrusted input into each public entry point, outcomes classified.

Every target starts from one valid input (a signed cost table, a bundle, a trust root, a rollback
state, trace files in each format), applies a hypothesis-drawn mutation and calls the entry point
a serving host or ``fit`` would call. Each outcome is one of:

- ``rejected:<CODE>``: refused with a reason code (or, for trace readers, a ``DsparkError``);
- ``accepted-same``: accepted, and what was accepted means exactly what the original meant
  (e.g. a flipped bit in a page-header field nobody reads);
- ``accepted-resigned`` / ``accepted``: accepted input that was re-signed by the trusted key, or
  that is unsigned by design (traces); acceptance is legitimate there;
- a **crash** (any other exception, ``INTERNAL_ERROR`` from ``admit``), a **hang** (no answer
  within :data:`HANG_S`), or an **accepted mutant** (``accepted-changed``: a mutant without a
  valid signature accepted with a different meaning). These three must never happen.

``test_fuzz.py`` runs every target briefly with fixed seeds inside ``make test``;
``benchmarks/fuzz.py`` runs them for as long as asked (``make fuzz``) and records the counts.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import signal
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from cryptography.hazmat.primitives.asymmetric import ed25519
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from securesystemslib.signer import CryptoSigner, SSlibKey

from dspark_calibrate.artifacts import (
    BUNDLE_MANIFEST,
    Expectation,
    Reason,
    canonical_json,
    detached_envelope_path,
    init_root,
    load_trust_root,
    logical_sha256,
    read_artifact,
    verify_path,
)
from dspark_calibrate.artifacts._envelope import sign_envelope
from dspark_calibrate.errors import DsparkError
from dspark_calibrate.runtime_plugin.admission import AdmissionPolicy, admit
from dspark_calibrate.schemas import arrow_schema
from tests.factories import NOW, make_cost_table, make_fingerprint, nested, unchecked_digest
from tests.fuzz.mutations import (
    INTERESTING_JSON,
    apply_bytes,
    apply_json,
    byte_ops,
    json_ops,
)
from tests.runtime_plugin.bundles import make_bundle
from tests.signing import sign_table, statement_of

__all__ = ["HANG_S", "TARGETS", "Corpus", "Hang", "Stats", "Target", "fuzz"]

#: An execution that has not answered after this long is a hang (seconds). Every entry point
#: answers valid input in well under 100 ms on the CI machine.
HANG_S = 10.0
#: When verification runs in these tests (an hour after the corpus was signed).
LATER = NOW + timedelta(hours=1)


class Hang(BaseException):
    """Raised by the alarm when an execution runs past :data:`HANG_S`.

    A BaseException, so that no ``except Exception`` (such as admit's fail-closed boundary) can
    swallow it and report a hang as an ordinary outcome.
    """


class Finding(AssertionError):
    """A crash, hang or accepted mutant, raised in strict mode (pytest)."""


def _signer(seed: int) -> CryptoSigner:
    """A deterministic Ed25519 signer (reproducible corpora for seeded runs)."""
    private = ed25519.Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)
    return CryptoSigner(private, SSlibKey.from_crypto(private.public_key()))


def _write_parquet_with_footer(path: Path, table: pa.Table, raw_footer: bytes) -> None:
    """A Parquet file with ``raw_footer`` as its ``dspark`` value, written as the artifact writer does."""
    sink = pa.BufferOutputStream()
    writer = pq.ParquetWriter(
        sink,
        table.schema.remove_metadata(),
        compression="zstd",
        store_schema=False,
        write_statistics=False,
        write_page_checksum=True,
    )
    try:
        writer.write_table(table.replace_schema_metadata(None))
        writer.add_key_value_metadata({b"dspark": raw_footer})
    finally:
        writer.close()
    path.write_bytes(sink.getvalue().to_pybytes())


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _artifact_meaning(art: Any) -> tuple[Any, ...]:
    return (
        art.kind,
        art.schema_version,
        art.series,
        art.version,
        art.issued_at,
        art.expires_at,
        art.fingerprint,
        art.provenance,
        _plain(art.summary),
        art.logical_sha256,
        art.table.to_pylist(),
    )


def _decision_meaning(decision: Any) -> tuple[Any, ...]:
    return (
        decision.active,
        _plain(decision.engine_config),
        {k: (a.logical_sha256, a.version) for k, a in decision.members.items()},
        decision.bundle_version,
        decision.economics.to_dict() if decision.economics is not None else None,
    )


def _root_meaning(root: Any) -> tuple[Any, ...]:
    return (
        root.version,
        root.expires,
        sorted(k.keyval["public"] for k in root.root_keys.values()),
        root.root_threshold,
        sorted(k.keyval["public"] for k in root.artifact_keys.values()),
        root.artifact_threshold,
    )


# ---------------------------------------------------------------------------------------------
# The corpus: one valid input of each kind, built deterministically in a directory.
# ---------------------------------------------------------------------------------------------


@dataclass
class Corpus:
    """Valid seeds and what they mean, plus a scratch directory per target."""

    base: Path
    signers: tuple[CryptoSigner, ...] = field(init=False)
    root_bytes: bytes = field(init=False)
    artifact: Path = field(init=False)
    artifact_bytes: bytes = field(init=False)
    artifact_meaning: tuple[Any, ...] = field(init=False)
    footer: dict[str, Any] = field(init=False)
    envelope: dict[str, Any] = field(init=False)
    statement: dict[str, Any] = field(init=False)
    bundle: Path = field(init=False)
    decision_meaning: tuple[Any, ...] = field(init=False)
    root_meaning: tuple[Any, ...] = field(init=False)
    state_bytes: bytes = field(init=False)
    trace_records: list[dict[str, Any]] = field(init=False)
    trace_parquet_bytes: bytes = field(init=False)
    trace_pt_bytes: bytes = field(init=False)
    workload_pt_bytes: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.signers = (_signer(7),)
        root = init_root(
            root_signers=list(self.signers),
            root_keys=[s.public_key for s in self.signers],
            root_threshold=1,
            artifact_keys=[s.public_key for s in self.signers],
            artifact_threshold=1,
            expires=NOW + timedelta(days=365),
        )
        self.root_bytes = root.to_bytes()
        self.root_meaning = _root_meaning(root)
        seeds = self.base / "seeds"
        seeds.mkdir(exist_ok=True)
        (seeds / "root.json").write_bytes(self.root_bytes)
        self.artifact = sign_table(
            seeds / "cost-table.parquet", "cost-table", make_cost_table(), self.signers
        )
        self.artifact_bytes = self.artifact.read_bytes()
        report = verify_path(self.artifact, root, now=LATER, expected=self.expected())
        assert report.ok and report.artifact is not None, report.message
        self.artifact_meaning = _artifact_meaning(report.artifact)
        loaded = read_artifact(self.artifact)
        self.footer = json.loads(canonical_json(dict(loaded.metadata)))
        assert loaded.envelope is not None
        self.envelope = dict(loaded.envelope)
        self.statement = statement_of(self.artifact)
        self.bundle = make_bundle(seeds / "bundle", self.signers)
        state = seeds / "state.json"
        decision = self.admit(self.bundle, seeds / "root.json", state)
        assert decision.active, decision.message
        self.decision_meaning = _decision_meaning(decision)
        self.state_bytes = state.read_bytes()
        self.trace_records = [
            {
                "request_id": f"req-{r}",
                "round": i,
                "logits": [1.5 - 0.3 * j + 0.1 * i for j in range(5)],
                "accepted": (r + i) % 6,
                "verified": 5,
                "sampling": "greedy",
                "temperature": 0.0,
            }
            for r in range(3)
            for i in range(4)
        ]
        table = pa.Table.from_pylist(self.trace_records, schema=arrow_schema("trace"))
        sink = io.BytesIO()
        doc = {"kind": "trace", "schema_version": 1, "k": 5, "synthetic": False, "generator": None}
        pq.write_table(table.replace_schema_metadata({b"dspark.trace": canonical_json(doc)}), sink)
        self.trace_parquet_bytes = sink.getvalue()
        self.trace_pt_bytes = _save_pt(self.trace_shard())
        self.workload_pt_bytes = _save_pt(self.workload_shard())

    def expected(self) -> Expectation:
        """What a serving host expects of the cost table."""
        return Expectation(kind="cost-table", fingerprint=make_fingerprint())

    def trace_shard(self) -> dict[str, Any]:
        """A valid recorder shard (as a dict of tensors)."""
        import torch

        n, k = 6, 5
        accepted = [i % (k + 1) for i in range(n)]
        return {
            "logits": torch.linspace(-2, 2, n * k).reshape(n, k),
            "prefix_mask": torch.tensor([[1 if j < a else 0 for j in range(k)] for a in accepted]),
            "meta": {"pairing": "draft_seq_ring", "block_size": k},
            "request_ids": [f"r{i // 2}" for i in range(n)],
            "rounds": torch.tensor([i % 2 for i in range(n)]),
        }

    def workload_shard(self) -> dict[str, Any]:
        """A valid TensorRT-LLM confidence-trace shard (``workload import-trtllm``'s input)."""
        import torch

        n, k = 8, 5
        return {
            "logits": torch.linspace(-2, 2, n * k).reshape(n, k),
            "prefix_mask": torch.tensor([[1 if j < i % (k + 1) else 0 for j in range(k)] for i in range(n)]),
            "rank": 0,
            "max_draft_len": k,
            "graph_batch_size": torch.full((n,), 4),
            "step_id": torch.arange(n) // 4,
            "request_id": torch.arange(n) % 4,
        }

    def admit(self, bundle: Path, root: Path, state: Path) -> Any:
        """The serving host's admission of ``bundle`` (fresh rollback state at ``state``)."""
        return admit(
            bundle,
            root,
            live=make_fingerprint(),
            policy=AdmissionPolicy(state_path=state),
            now=LATER,
        )

    def scratch(self, name: str) -> Path:
        """An empty directory for one execution of target ``name``."""
        path = self.base / "scratch" / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path


def _save_pt(obj: Any) -> bytes:
    import torch

    sink = io.BytesIO()
    torch.save(obj, sink)
    return sink.getvalue()


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------

Run = Callable[[Corpus, Any], str]


@dataclass(frozen=True)
class Target:
    """A named entry point, how to mutate its input, and how to judge the outcome."""

    name: str
    strategy: st.SearchStrategy[Any]
    run: Run
    description: str


def _verify_outcome(corpus: Corpus, path: Path, *, resigned: bool = False) -> str:
    root = load_trust_root(corpus.root_bytes, now=LATER)
    report = verify_path(path, root, now=LATER, expected=corpus.expected())
    if not report.ok:
        if report.reason is Reason.INTERNAL_ERROR:
            raise Finding(f"crash: {report.message}")
        return f"rejected:{report.reason.value}"
    if resigned:
        return "accepted-resigned"
    assert report.artifact is not None
    if _artifact_meaning(report.artifact) != corpus.artifact_meaning:
        return "accepted-changed"
    return "accepted-same"


def _admit_outcome(corpus: Corpus, bundle: Path, root: Path, state: Path) -> str:
    decision = corpus.admit(bundle, root, state)
    if decision.reason is Reason.INTERNAL_ERROR:
        raise Finding(f"crash: {decision.message}")
    if not decision.active:
        return f"rejected:{decision.reason.value}"
    if _decision_meaning(decision) != corpus.decision_meaning:
        return "accepted-changed"
    return "accepted-same"


def _copy_seed_artifact(corpus: Corpus, into: Path) -> Path:
    path = into / corpus.artifact.name
    shutil.copy(corpus.artifact, path)
    shutil.copy(detached_envelope_path(corpus.artifact), detached_envelope_path(path))
    return path


def _artifact_bytes(corpus: Corpus, ops: Any) -> str:
    path = _copy_seed_artifact(corpus, corpus.scratch("artifact-bytes"))
    path.write_bytes(apply_bytes(corpus.artifact_bytes, ops))
    return _verify_outcome(corpus, path)


def _mutated_json(seed: Any, mutation: tuple[str, Any]) -> bytes:
    how, ops = mutation
    if how == "json":
        return apply_json(seed, ops)
    return apply_bytes(canonical_json(seed), ops)


def _json_mutation(keys: tuple[str, ...] = ()) -> st.SearchStrategy[tuple[str, Any]]:
    return st.tuples(st.just("json"), json_ops(keys)) | st.tuples(st.just("bytes"), byte_ops())


def _footer(corpus: Corpus, mutation: Any) -> str:
    path = _copy_seed_artifact(corpus, corpus.scratch("footer"))
    table = read_artifact(corpus.artifact).table
    _write_parquet_with_footer(path, table, _mutated_json(corpus.footer, mutation))
    return _verify_outcome(corpus, path)


def _envelope(corpus: Corpus, mutation: Any) -> str:
    path = _copy_seed_artifact(corpus, corpus.scratch("envelope"))
    footer = dict(corpus.footer, envelope=None)  # the detached envelope is the only one
    _write_parquet_with_footer(path, read_artifact(corpus.artifact).table, canonical_json(footer))
    detached_envelope_path(path).write_bytes(_mutated_json(corpus.envelope, mutation))
    return _verify_outcome(corpus, path)


def _sign_payload(corpus: Corpus, path: Path, payload: bytes, table: pa.Table) -> None:
    """Sign ``payload`` with the trusted key; keep the footer's copy in step when it parses."""
    env = sign_envelope(payload, list(corpus.signers))
    footer = dict(corpus.footer, envelope=None)
    with contextlib.suppress(ValueError, TypeError, KeyError, IndexError, AttributeError):
        predicate = json.loads(payload)["predicate"]
        for key in ("kind", "schema_version", "fingerprint", "provenance", "summary"):
            footer[key] = predicate[key]
        footer["logical_sha256"] = json.loads(payload)["subject"][0]["digest"]["sha256"]
    try:
        raw_footer = canonical_json(footer)
    except ValueError:  # a value canonical JSON refuses: keep the original footer
        raw_footer = canonical_json(dict(corpus.footer, envelope=None))
    _write_parquet_with_footer(path, table, raw_footer)
    detached_envelope_path(path).write_bytes(canonical_json(env))


def _payload(corpus: Corpus, ops: Any) -> str:
    path = _copy_seed_artifact(corpus, corpus.scratch("payload"))
    _sign_payload(corpus, path, apply_json(corpus.statement, ops), read_artifact(corpus.artifact).table)
    return _verify_outcome(corpus, path, resigned=True)


_i64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_small = st.sampled_from((0, 1, 8, 16, 32, 40, 64, 96, 192, -1))
_times = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from((0.0, -0.0, 5.0, 1e-300, 1e300))
_cost_changes = st.fixed_dictionaries(
    {},
    optional={
        "graph_batch_size": _small | _i64,
        "verifier_budget": _small | _i64,
        "step_time_ms": _times,
        "ci_low_ms": _times,
        "ci_high_ms": _times,
        "p10_ms": _times,
        "p90_ms": _times,
        "samples": _small | _i64,
        "stop_reason": st.sampled_from(("precision", "cap", "")) | st.text(max_size=8),
        "source_result_sha256": st.sampled_from(("0" * 64, "x")) | st.text(max_size=70),
    },
)
#: Rows as (index of a valid row to start from, the changes to it): every column of the current
#: cost-table schema stays filled, so each mutant is a table the signer can sign.
_cost_rows = st.lists(st.tuples(st.integers(0, 63), _cost_changes), max_size=12)


def _table(corpus: Corpus, rows: Any) -> str:
    path = _copy_seed_artifact(corpus, corpus.scratch("table"))
    base = read_artifact(corpus.artifact).table
    valid = base.to_pylist()
    try:
        table = pa.Table.from_pylist([{**valid[i % len(valid)], **c} for i, c in rows], schema=base.schema)
        digest = logical_sha256(table, "cost-table")
        statement = json.loads(json.dumps(corpus.statement))
        statement["subject"][0]["digest"]["sha256"] = digest
        _sign_payload(corpus, path, canonical_json(statement), table)
    except (pa.ArrowException, ValueError, OverflowError) as exc:  # the signer refuses it
        return f"unsignable:{type(exc).__name__}"
    return _verify_outcome(corpus, path, resigned=True)


def _bundle_copy(corpus: Corpus, name: str) -> tuple[Path, Path, Path]:
    work = corpus.scratch(name)
    bundle = work / "bundle"
    shutil.copytree(corpus.bundle, bundle)
    root = work / "root.json"
    root.write_bytes(corpus.root_bytes)
    return bundle, root, work / "state.json"


def _manifest(corpus: Corpus, mutation: Any) -> str:
    bundle, root, state = _bundle_copy(corpus, "manifest")
    seed = json.loads((corpus.bundle / BUNDLE_MANIFEST).read_bytes())
    (bundle / BUNDLE_MANIFEST).write_bytes(_mutated_json(seed, mutation))
    return _admit_outcome(corpus, bundle, root, state)


def _member(corpus: Corpus, ops: Any) -> str:
    bundle, root, state = _bundle_copy(corpus, "member")
    member = bundle / "calibration.parquet"
    member.write_bytes(apply_bytes(member.read_bytes(), ops))
    return _admit_outcome(corpus, bundle, root, state)


def _trust_root(corpus: Corpus, mutation: Any) -> str:
    bundle, root, state = _bundle_copy(corpus, "trust-root")
    root.write_bytes(_mutated_json(json.loads(corpus.root_bytes), mutation))
    outcome = _admit_outcome(corpus, bundle, root, state)
    if outcome.startswith("accepted"):
        loaded = load_trust_root(root.read_bytes(), now=LATER)
        if _root_meaning(loaded) != corpus.root_meaning:
            return "accepted-changed"
    return outcome


def _state(corpus: Corpus, mutation: Any) -> str:
    bundle, root, state = _bundle_copy(corpus, "state")
    state.write_bytes(_mutated_json(json.loads(corpus.state_bytes), mutation))
    outcome = _admit_outcome(corpus, bundle, root, state)
    # The state is the verifier's own memory: an edited one may admit or refuse, never crash.
    return "accepted" if outcome.startswith("accepted") else outcome


def _trace_outcome(path: Path) -> str:
    from dspark_calibrate.calibrate import read_traces

    try:
        traces = read_traces([path])
    except DsparkError as exc:
        return f"rejected:{type(exc).__name__}"
    assert traces.rounds > 0
    return "accepted"


def _trace_jsonl(corpus: Corpus, mutation: Any) -> str:
    path = corpus.scratch("trace-jsonl") / "traces.jsonl"
    where, how, ops = mutation
    lines = [json.dumps(r).encode() for r in corpus.trace_records]
    line = where % len(lines)
    if how == "json":
        lines[line] = apply_json(corpus.trace_records[line], ops)
        data = b"\n".join(lines) + b"\n"
    else:
        data = apply_bytes(b"\n".join(lines) + b"\n", ops)
    path.write_bytes(data)
    return _trace_outcome(path)


_arrow_types = st.sampled_from(
    (
        pa.string(),
        pa.binary(),
        pa.int64(),
        pa.int8(),
        pa.uint64(),
        pa.float32(),
        pa.float64(),
        pa.bool_(),
        pa.null(),
        pa.list_(pa.float32()),
        pa.list_(pa.string()),
        pa.list_(pa.int64()),
        pa.large_list(pa.float64()),
        pa.list_(pa.float32(), 5),
        pa.timestamp("s"),
        pa.struct([("x", pa.int64())]),
    )
)
_cell = st.none() | st.booleans() | _i64 | _times | st.text(max_size=6) | st.binary(max_size=6)
_cells = _cell | st.lists(_cell, max_size=7)


@st.composite
def _trace_table(draw: st.DrawFn) -> pa.Table:
    """A table with trace column names (mostly) and arbitrary types and values."""
    names = ("request_id", "round", "logits", "accepted", "verified", "sampling", "temperature")
    chosen = draw(st.lists(st.sampled_from(names) | st.text(max_size=4), min_size=1, max_size=8, unique=True))
    rows = draw(st.integers(0, 6))
    columns = {}
    for name in chosen:
        typ = draw(_arrow_types)
        values = draw(st.lists(_cells, min_size=rows, max_size=rows))
        try:
            columns[name] = pa.array(values, typ)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            columns[name] = pa.array([None] * rows, typ)
    return pa.table(columns)


def _trace_parquet(corpus: Corpus, mutation: Any) -> str:
    path = corpus.scratch("trace-parquet") / "traces.parquet"
    how, value = mutation
    if how == "bytes":
        path.write_bytes(apply_bytes(corpus.trace_parquet_bytes, value))
    else:
        try:
            pq.write_table(value, path)
        except (pa.ArrowException, ValueError, TypeError) as exc:  # the writer refuses it: no file
            return f"unwritable:{type(exc).__name__}"
    return _trace_outcome(path)


_tensor_like = st.one_of(
    st.lists(st.lists(_times | _i64 | st.text(max_size=3) | st.none(), max_size=6), max_size=6),
    st.lists(_i64 | st.text(max_size=4) | st.sampled_from(("\ud800", "")), max_size=8),
    st.sampled_from(("tensor-f32", "tensor-i64", "tensor-bool", "tensor-3d", "tensor-0d", "tensor-empty")),
    _cell,
)


def _materialize(value: Any, rows: int) -> Any:
    import torch

    if isinstance(value, str) and value.startswith("tensor-"):
        return {
            "tensor-f32": torch.randn(rows, 5),
            "tensor-i64": torch.arange(rows * 5).reshape(rows, 5),
            "tensor-bool": torch.ones(rows, 5, dtype=torch.bool),
            "tensor-3d": torch.zeros(rows, 5, 2),
            "tensor-0d": torch.tensor(3.0),
            "tensor-empty": torch.zeros(0, 5),
        }[value]
    return value


@st.composite
def _shard(draw: st.DrawFn) -> dict[str, Any]:
    """A recorder shard dict with each key valid-ish, missing, or replaced by anything."""
    keys = ("logits", "prefix_mask", "meta", "request_ids", "rounds", "verified")
    out: dict[str, Any] = {}
    meta = {"pairing": "draft_seq_ring", "block_size": 5}
    for name in draw(st.lists(st.sampled_from(keys), unique=True, max_size=len(keys))):
        out[name] = draw(_tensor_like)
    if draw(st.booleans()):
        meta[draw(st.sampled_from(("pairing", "block_size", "request_ids")))] = draw(
            _cells | st.sampled_from(INTERESTING_JSON)
        )
    out.setdefault("meta", meta)
    return out


def _trace_pt(corpus: Corpus, mutation: Any) -> str:
    path = corpus.scratch("trace-pt") / "shard.pt"
    how, value = mutation
    if how == "bytes":
        path.write_bytes(apply_bytes(corpus.trace_pt_bytes, value))
    else:
        valid = corpus.trace_shard()
        rows = valid["logits"].shape[0]
        shard = {**valid, **{k: _materialize(v, rows) for k, v in value.items()}}
        path.write_bytes(_save_pt(shard))
    return _trace_outcome(path)


def _workload_pt(corpus: Corpus, mutation: Any) -> str:
    from dspark_calibrate.calibrate.deployment import workload as workload_module

    path = corpus.scratch("workload-pt") / "trace.rank0.pt"
    how, value = mutation
    if how == "bytes":
        path.write_bytes(apply_bytes(corpus.workload_pt_bytes, value))
    else:
        valid = corpus.workload_shard()
        rows = valid["logits"].shape[0]
        path.write_bytes(_save_pt({**valid, **{k: _materialize(v, rows) for k, v in value.items()}}))
    try:
        workload_module.read_recorder_shards([path])
    except DsparkError as exc:
        return f"rejected:{type(exc).__name__}"
    return "accepted"


_workload_field = st.sampled_from(
    (
        "logits",
        "prefix_mask",
        "rank",
        "max_draft_len",
        "graph_batch_size",
        "step_id",
        "request_id",
        "real_mask",
    )
)
_workload_fields = st.dictionaries(
    _workload_field, _tensor_like | st.sampled_from(INTERESTING_JSON), max_size=4
)


#: (where, depth, container, recompute the digests that cover it, leaf): a nested value put where
#: the state keeps documents, digests made right half the time so the nesting itself is reached.
_state_nesting = st.tuples(
    st.sampled_from(("trust-root", "binding", "binding-value", "legacy", "top-level", "entry")),
    st.integers(1, 80),
    st.sampled_from(("list", "dict")),
    st.booleans(),
    st.sampled_from((1, "x", None, 1.5, [], {}, 10**30)),
)


def _state_nesting_target(corpus: Corpus, mutation: Any) -> str:
    where, depth, container, fix, leaf = mutation
    bundle, root, state = _bundle_copy(corpus, "state-nesting")
    doc = json.loads(corpus.state_bytes)
    deep = nested(depth, leaf, container)
    if where == "trust-root":
        doc["trust_root"]["root"] = {**doc["trust_root"]["root"], "extra": deep}
        if fix:
            doc["trust_root"]["sha256"] = unchecked_digest(doc["trust_root"]["root"])
    elif where in ("binding", "binding-value", "entry"):
        key, entry = next(iter(doc["series"].items()))
        del doc["series"][key]
        if where == "binding":
            entry["binding"] = {**entry["binding"], "extra": deep}
        elif where == "binding-value":
            entry["binding"] = {**entry["binding"], "gpu": deep}
        else:
            entry["extra"] = deep
        if fix:
            key = f"{entry['kind']}:{unchecked_digest(entry['binding'])}"
        doc["series"][key] = entry
    elif where == "legacy":
        doc["legacy_series"]["cost-table:" + "0" * 64] = deep
    else:
        doc["extra"] = deep
    state.write_bytes(json.dumps(doc).encode())
    outcome = _admit_outcome(corpus, bundle, root, state)
    return "accepted" if outcome.startswith("accepted") else outcome


#: A valid engine options file (``--base-options``) to mutate.
OPTIONS_SEED = (
    "max_batch_size: 64\nkv_cache_config:\n  free_gpu_memory_fraction: 0.85\n"
    "speculative_config:\n  decoding_type: DSpark\n  max_draft_len: 5\n"
    "  speculative_model_dir: /models/drafter\n"
)
#: YAML scalars (as text) that probe the loader's limits and constructors.
_YAML_SCALARS = (
    "1",
    "-1",
    "9" * 5000,
    "0x" + "f" * 200,
    "1_0" * 60,
    ":".join(["59"] * 300),
    "1e999",
    ".nan",
    "~",
    "true",
    "'x'",
    '"\\ud800"',
    "2024-13-45",
    "2024-01-01",
    "!!binary AAAA",
    "!!binary ###",
    "!!python/object:os.system x",
    "!!set {a, b}",
    "!!omap [a: 1, a: 2]",
    "*undefined",
    "[",
    "{a: 1, a: 2}",
    "DSpark",
    "Eagle",
)
_yaml_value: st.SearchStrategy[str] = st.recursive(
    st.sampled_from(_YAML_SCALARS) | st.text(alphabet="abc01:-[]{}&*!, ", max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]")
        | st.dictionaries(
            st.sampled_from(("a", "b", "decoding_type", "max_draft_len")), inner, max_size=3
        ).map(lambda d: "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}")
    ),
    max_leaves=12,
)
_options_mutation = st.one_of(
    st.tuples(
        st.just("value"),
        st.sampled_from(("speculative_config", "max_batch_size", "kv_cache_config", "new_key")),
        _yaml_value,
    ),
    st.tuples(st.just("deep"), st.integers(1, 3000), st.sampled_from(("[", "{a: "))),
    st.tuples(st.just("aliases"), st.integers(1, 12), st.integers(2, 16)),
    st.tuples(st.just("long-list"), st.integers(1, 120_000)),
    st.tuples(st.just("bytes"), byte_ops()),
)


def _options_text(mutation: Any) -> bytes:
    how = mutation[0]
    if how == "value":
        _, key, value = mutation
        if key == "new_key":
            return (OPTIONS_SEED + f"extra: {value}\n").encode()
        lines = [line for line in OPTIONS_SEED.splitlines() if not line.startswith(f"{key}:")]
        kept = [line for line in lines if not (key != "max_batch_size" and line.startswith("  "))]
        return ("\n".join(kept) + f"\n{key}: {value}\n").encode()
    if how == "deep":
        _, depth, opener = mutation
        closer = "]" if opener == "[" else "}"
        return (OPTIONS_SEED + "extra: " + opener * depth + "1" + closer * depth + "\n").encode()
    if how == "aliases":
        _, levels, width = mutation
        lines = ["a0: &a0 [1, 2]"]
        lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
        return (OPTIONS_SEED + "\n".join(lines) + "\n").encode()
    if how == "long-list":
        return (OPTIONS_SEED + "batch_sizes: [" + ", ".join(["1"] * mutation[1]) + "]\n").encode()
    return apply_bytes(OPTIONS_SEED.encode(), mutation[1])


def _options_yaml(corpus: Corpus, mutation: Any) -> str:
    """``--base-options`` through the bounded loader and the merge, then written and read back."""
    from dspark_calibrate.errors import ConfigError
    from dspark_calibrate.runtime_plugin.trtllm import (
        dump_options_yaml,
        llm_api_options,
        load_options_yaml,
        read_options_yaml,
        static_decoding_fields,
    )

    path = corpus.scratch("options-yaml") / "base.yaml"
    path.write_bytes(_options_text(mutation))
    try:
        base = read_options_yaml(path)
        merged = llm_api_options(static_decoding_fields(), base, max_draft_len=5)
    except ConfigError as exc:
        return f"rejected:{exc.code}"
    section = merged.get("speculative_config")
    if not isinstance(section, dict) or section.get("decoding_type") != "DSpark":
        return "accepted-changed"  # a merge that does not configure DSpark static K
    if section.get("enable_confidence_scheduling") is not False:
        return "accepted-changed"
    text = dump_options_yaml(merged)  # what the runtime form writes must read back the same
    if dump_options_yaml(load_options_yaml(text)) != text:
        raise Finding("the merged options do not read back as written")
    return "accepted"


_FOOTER_KEYS = ("format", "kind", "schema_version", "logical_sha256", "fingerprint", "envelope", "summary")
_ENVELOPE_KEYS = ("payload", "payloadType", "signatures", "keyid", "sig")
_STATEMENT_KEYS = ("_type", "subject", "predicateType", "predicate", "version", "series", "expires_at")
_ROOT_KEYS = ("signed", "signatures", "version", "expires", "threshold", "keyids", "consistent_snapshot")
_STATE_KEYS = ("schema_version", "series", "legacy_series", "trust_root", "version", "binding", "kind")

TARGETS: tuple[Target, ...] = (
    Target("artifact-bytes", byte_ops(), _artifact_bytes, "signed cost table, byte edits -> verify_path"),
    Target("footer", _json_mutation(_FOOTER_KEYS), _footer, "Parquet 'dspark' footer JSON -> verify_path"),
    Target("envelope", _json_mutation(_ENVELOPE_KEYS), _envelope, "detached DSSE envelope -> verify_path"),
    Target(
        "payload-resigned", json_ops(_STATEMENT_KEYS), _payload, "signed statement, re-signed -> verify_path"
    ),
    Target(
        "table-resigned",
        _cost_rows,
        _table,
        "cost-table rows, re-signed -> verify_path",
    ),
    Target("manifest", _json_mutation(_ENVELOPE_KEYS), _manifest, "bundle manifest -> admit"),
    Target("member-bytes", byte_ops(), _member, "bundle member, byte edits -> admit"),
    Target("trust-root", _json_mutation(_ROOT_KEYS), _trust_root, "root.json -> admit"),
    Target("state", _json_mutation(_STATE_KEYS), _state, "rollback state file -> admit"),
    Target(
        "state-nesting",
        _state_nesting,
        _state_nesting_target,
        "rollback state nested deep where it keeps documents (root, bindings), digests kept right -> admit",
    ),
    Target(
        "options-yaml",
        _options_mutation,
        _options_yaml,
        "--base-options YAML: values, nesting, aliases, long lists, bytes -> bounded loader and merge",
    ),
    Target(
        "trace-jsonl",
        st.tuples(st.integers(0, 64), st.just("json"), json_ops(("logits", "round", "request_id")))
        | st.tuples(st.integers(0, 64), st.just("bytes"), byte_ops()),
        _trace_jsonl,
        "JSONL traces -> read_traces",
    ),
    Target(
        "trace-parquet",
        st.tuples(st.just("bytes"), byte_ops()) | st.tuples(st.just("table"), _trace_table()),
        _trace_parquet,
        "Parquet traces -> read_traces",
    ),
    Target(
        "trace-pt",
        st.tuples(st.just("bytes"), byte_ops()) | st.tuples(st.just("shard"), _shard()),
        _trace_pt,
        "TensorRT-LLM recorder shard (.pt) -> read_traces",
    ),
    Target(
        "workload-pt",
        st.tuples(st.just("bytes"), byte_ops()) | st.tuples(st.just("fields"), _workload_fields),
        _workload_pt,
        "TensorRT-LLM confidence-trace shard (.pt) -> workload import",
    ),
)


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


@dataclass
class Stats:
    """Counts of one target's executions."""

    executions: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    hangs: list[dict[str, Any]] = field(default_factory=list)
    max_seconds: float = 0.0
    journal: Path | None = None

    @property
    def accepted_mutants(self) -> int:
        """Mutants without a valid signature accepted with a changed meaning."""
        return self.outcomes["accepted-changed"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "executions": self.executions,
            "crashes": len(self.crashes),
            "hangs": len(self.hangs),
            "accepted_mutants": self.accepted_mutants,
            "max_execution_s": round(self.max_seconds, 4),
            "outcomes": dict(sorted(self.outcomes.items())),
            "crash_examples": self.crashes[:5],
            "hang_examples": self.hangs[:5],
        }


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise Hang(f"no answer within {HANG_S} s")


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def execute(target: Target, corpus: Corpus, mutation: Any, stats: Stats, *, strict: bool) -> str:
    """Run one mutation, record its outcome; in strict mode a crash, hang or accepted mutant raises."""
    stats.executions += 1
    if stats.journal is not None:  # what ran last, for a process that dies in C code
        stats.journal.write_text(repr(mutation)[:4000], encoding="utf-8", errors="backslashreplace")
    started = time.perf_counter()
    problem: tuple[str, dict[str, Any]] | None = None
    outcome = "crash"
    try:
        with _alarm(HANG_S):
            outcome = target.run(corpus, mutation)
    except Hang:
        outcome = "hang"
        problem = ("hang", {"mutation": repr(mutation)[:2000]})
    except Exception as exc:  # a crash is exactly what the fuzzer looks for: record it
        problem = (
            "crash",
            {
                "mutation": repr(mutation)[:2000],
                "error": repr(exc)[:500],
                "where": traceback.format_exc(limit=-3)[-1500:],
            },
        )
    elapsed = time.perf_counter() - started
    stats.max_seconds = max(stats.max_seconds, elapsed)
    stats.outcomes[outcome] += 1
    if problem is not None:
        (stats.hangs if problem[0] == "hang" else stats.crashes).append(problem[1])
    if strict and (problem is not None or outcome == "accepted-changed"):
        detail = problem[1] if problem is not None else {"mutation": repr(mutation)[:2000]}
        raise Finding(f"{target.name}: {problem[0] if problem else 'accepted mutant'}: {json.dumps(detail)}")
    return outcome


def fuzz(target: Target, corpus: Corpus, stats: Stats, *, examples: int, seed: int, strict: bool) -> None:
    """Run ``examples`` hypothesis-drawn mutations of ``target`` from ``seed`` (reproducible)."""

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=False,
        report_multiple_bugs=False,
    )
    @hypothesis_seed(seed)
    @given(target.strategy)
    def once(mutation: Any) -> None:
        execute(target, corpus, mutation, stats, strict=strict)

    once()
