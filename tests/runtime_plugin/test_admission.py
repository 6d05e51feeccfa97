"""The admission hook: every bad input or fault ends inactive, with its reason code, never raising.

The fault table has one row per case of issue 6's "Bad input and faults" list (plus rows for the
checks admission adds); each row spoils a copy of one valid, signed bundle (or the trust root, the
live fingerprint, the state, the policy) and asserts: inactive, the reason code, nothing raised,
the static engine configuration, and a time far inside the target.
"""

from __future__ import annotations

import errno
import io
import json
import logging
import os
import shutil
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from filelock import FileLock

from dspark_calibrate.artifacts import (
    BUNDLE_MANIFEST,
    Calibration,
    Reason,
    canonical_json,
    load_trust_root,
    public_key_of,
    read_artifact,
    rotate_root,
)
from dspark_calibrate.artifacts._parquet import encode_artifact
from dspark_calibrate.calibrate.measurement.sentinel_backend import load_sentinel_backend
from dspark_calibrate.errors import ProbeError
from dspark_calibrate.runtime_plugin.admission import (
    STATIC_ENGINE_CONFIG,
    AdmissionDecision,
    AdmissionEconomics,
    AdmissionPolicy,
    GainStatus,
    admit,
    gain_test,
)
from dspark_calibrate.runtime_plugin.live import GpuInfo, collect_live
from dspark_calibrate.runtime_plugin.sentinel import SentinelPolicy
from dspark_calibrate.runtime_plugin.trtllm import decoding_fields, static_decoding_fields
from tests.factories import (
    NOW,
    calibration_rows,
    cost_rows,
    make_fingerprint,
    make_provenance,
    nested,
    unchecked_digest,
)
from tests.hangs import fifo_watchdog
from tests.runtime_plugin.bundles import LATER, admission_rows, admission_summary, make_bundle
from tests.signing import make_root, make_signers

FAKE = "tests.runtime_plugin.fake_backends"
#: Far above the 100 ms median target, far below a hang: catches a fault that blocks.
FAULT_TIME_LIMIT_MS = 2_000


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    return make_signers(tmp_path_factory.mktemp("keys"), 1)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory, keys: tuple[Any, ...]) -> Path:
    return make_bundle(tmp_path_factory.mktemp("pristine") / "bundle", keys)


@dataclass
class Ctx:
    """One row's sandbox: a private copy of the valid bundle, its root, a state path."""

    tmp: Path
    bundle: Path
    root_path: Path
    keys: tuple[Any, ...]
    monkeypatch: pytest.MonkeyPatch
    keep: list[Any]

    @property
    def state(self) -> Path:
        return self.tmp / "state" / "rollback.json"

    def policy(self, **overrides: Any) -> AdmissionPolicy:
        return AdmissionPolicy(state_path=self.state, **overrides)

    def other_bundle(self, name: str, **kwargs: Any) -> Path:
        return make_bundle(self.tmp / name, self.keys, **kwargs)


@pytest.fixture
def ctx(tmp_path: Path, pristine: Path, keys: tuple[Any, ...], monkeypatch: pytest.MonkeyPatch) -> Ctx:
    bundle = tmp_path / "bundle"
    shutil.copytree(pristine, bundle)
    root_path = tmp_path / "root.json"
    root_path.write_bytes(make_root(keys).to_bytes())
    return Ctx(tmp_path, bundle, root_path, keys, monkeypatch, [])


def run_admit(c: Ctx, **overrides: Any) -> AdmissionDecision:
    kwargs: dict[str, Any] = {
        "bundle": c.bundle,
        "trust_root": c.root_path,
        "live": make_fingerprint(),
        "policy": c.policy(),
        "now": LATER,
    }
    kwargs.update(overrides)
    bundle, root = kwargs.pop("bundle"), kwargs.pop("trust_root")
    return admit(bundle, root, **kwargs)


# ---------------------------------------------------------------------------------------------
# Fault injections: each returns admit() overrides after spoiling the sandbox.
# ---------------------------------------------------------------------------------------------


def _copy_member(src: Path, dst: Path, name: str) -> None:
    shutil.copy(src / name, dst / name)
    shutil.copy(src / f"{name}.dsse.json", dst / f"{name}.dsse.json")


def bundle_missing(c: Ctx) -> dict[str, Any]:
    return {"bundle": c.tmp / "no-such-bundle"}


def member_missing(c: Ctx) -> dict[str, Any]:
    (c.bundle / "cost-table.parquet").unlink()
    return {}


def member_unreadable(c: Ctx) -> dict[str, Any]:
    # A directory where the file should be: unreadable for every user, root included.
    path = c.bundle / "calibration.parquet"
    path.unlink()
    path.mkdir()
    return {}


def member_corrupt(c: Ctx) -> dict[str, Any]:
    (c.bundle / "cost-table.parquet").write_bytes(os.urandom(4096))
    return {}


def member_truncated(c: Ctx) -> dict[str, Any]:
    path = c.bundle / "cost-table.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return {}


def fifo_in_bundle(name: str) -> Callable[[Ctx], dict[str, Any]]:
    def inject(c: Ctx) -> dict[str, Any]:
        (c.bundle / name).unlink()
        os.mkfifo(c.bundle / name)  # reading it must not block admission
        return {}

    return inject


def manifest_truncated(c: Ctx) -> dict[str, Any]:
    path = c.bundle / BUNDLE_MANIFEST
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return {}


def root_missing(c: Ctx) -> dict[str, Any]:
    return {"trust_root": c.tmp / "no-root.json"}


def root_is_a_fifo(c: Ctx) -> dict[str, Any]:
    c.root_path.unlink()
    os.mkfifo(c.root_path)  # reading it must not block admission
    return {}


def root_corrupt(c: Ctx) -> dict[str, Any]:
    c.root_path.write_bytes(b'{"signed": ')
    return {}


def wrong_root(c: Ctx) -> dict[str, Any]:
    other = make_signers(c.tmp / "other-keys", 1, prefix="other")
    c.root_path.write_bytes(make_root(other).to_bytes())
    return {}


def root_expired_file(c: Ctx) -> dict[str, Any]:
    c.root_path.write_bytes(make_root(c.keys, expires=NOW + timedelta(minutes=30)).to_bytes())
    return {}


def root_expired_loaded(c: Ctx) -> dict[str, Any]:
    root = load_trust_root(make_root(c.keys, expires=NOW + timedelta(minutes=30)).to_bytes(), now=NOW)
    return {"trust_root": root}


def artifact_expired(c: Ctx) -> dict[str, Any]:
    return {"now": NOW + timedelta(days=31)}


def artifact_too_old(c: Ctx) -> dict[str, Any]:
    return {"policy": c.policy(max_artifact_age=timedelta(minutes=30))}


def rollback(c: Ctx) -> dict[str, Any]:
    newer = c.other_bundle("v2", version=2)
    assert run_admit(c, bundle=newer).active
    return {}


def state_locked(c: Ctx) -> dict[str, Any]:
    c.state.parent.mkdir(parents=True)
    lock = FileLock(f"{c.state}.lock")
    lock.acquire()
    c.keep.append(lock)  # held until the row ends
    return {"policy": c.policy(state_lock_timeout_s=0.05)}


def state_unwritable(c: Ctx) -> dict[str, Any]:
    # The lock file's name is taken by a directory: the state cannot be updated.
    c.state.parent.mkdir(parents=True)
    Path(f"{c.state}.lock").mkdir()
    return {}


def disk_full(c: Ctx) -> dict[str, Any]:
    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    # Delayed allocation reports ENOSPC at fsync; the state write must fail closed there.
    c.monkeypatch.setattr(os, "fsync", no_space)
    return {}


def state_corrupt(c: Ctx) -> dict[str, Any]:
    c.state.parent.mkdir(parents=True)
    c.state.write_bytes(b"\x00not json")
    return {}


class _ProbeFailing:
    def gpus(self) -> tuple[tuple[GpuInfo, ...] | None, str]:
        raise ProbeError("NVML: driver/library version mismatch")

    def getenv(self, name: str) -> str | None:
        return None

    def git(self, source_dir: Path) -> tuple[str | None, str | None, str]:
        return None, None, "no git"

    def package_version(self, name: str) -> str | None:
        return None


class _Crashing(_ProbeFailing):
    def gpus(self) -> tuple[tuple[GpuInfo, ...] | None, str]:
        raise RuntimeError("segfault in the vendor library")


def live_probe_raises(c: Ctx) -> dict[str, Any]:
    return {"live": {"max_draft_len": 5, "env": _ProbeFailing()}}


def live_probe_crashes(c: Ctx) -> dict[str, Any]:
    return {"live": {"max_draft_len": 5, "env": _Crashing()}}


def live(**changes: Any) -> Callable[[Ctx], dict[str, Any]]:
    def inject(c: Ctx) -> dict[str, Any]:
        return {"live": make_fingerprint(**changes)}

    return inject


def member_swapped(c: Ctx) -> dict[str, Any]:
    other = c.other_bundle("other", scale=1.1)  # same deployment, other measurements
    _copy_member(other, c.bundle, "cost-table.parquet")
    return {}


def member_from(**changes: Any) -> Callable[[Ctx], dict[str, Any]]:
    def inject(c: Ctx) -> dict[str, Any]:
        other = c.other_bundle("other", fingerprint=make_fingerprint(**changes))
        _copy_member(other, c.bundle, "calibration.parquet")
        return {}

    return inject


def rebuilt(**kwargs: Any) -> Callable[[Ctx], dict[str, Any]]:
    def inject(c: Ctx) -> dict[str, Any]:
        shutil.rmtree(c.bundle)
        make_bundle(c.bundle, c.keys, **kwargs)
        return {}

    return inject


def summary(**changes: Any) -> Callable[[Ctx], dict[str, Any]]:
    return rebuilt(summary=admission_summary(**changes))


def without_summary_key(key: str) -> Callable[[Ctx], dict[str, Any]]:
    body = admission_summary()
    del body[key]
    return rebuilt(summary=body)


def sentinel(backend: str, **options: Any) -> Callable[[Ctx], dict[str, Any]]:
    def inject(c: Ctx) -> dict[str, Any]:
        return {
            "policy": c.policy(
                sentinel=SentinelPolicy(
                    backend=backend, backend_options=options, loader=load_sentinel_backend
                )
            )
        }

    return inject


def callback_raises(c: Ctx) -> dict[str, Any]:
    def broken(record: Mapping[str, Any]) -> None:
        raise ValueError("metrics sink is down")

    return {"metrics_callback": broken}


def collective_fails(c: Ctx) -> dict[str, Any]:
    # A process group whose all-gather times out (the real gloo path is in test_ranks.py).
    dist = types.ModuleType("torch.distributed")
    dist.is_available = lambda: True  # type: ignore[attr-defined]
    dist.is_initialized = lambda: True  # type: ignore[attr-defined]
    dist.get_rank = lambda group=None: 0  # type: ignore[attr-defined]
    dist.get_world_size = lambda group=None: 2  # type: ignore[attr-defined]

    def all_gather_object(out: list[Any], obj: Any, group: Any = None) -> None:
        raise RuntimeError("gloo: connection to rank 1 timed out")

    dist.all_gather_object = all_gather_object  # type: ignore[attr-defined]
    torch = types.ModuleType("torch")
    torch.distributed = dist  # type: ignore[attr-defined]
    c.monkeypatch.setitem(sys.modules, "torch", torch)
    c.monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    return {}


def not_a_path(c: Ctx) -> dict[str, Any]:
    return {"bundle": 12345}


# --- hardening: hangs, resource exhaustion, malformed numbers, rollback bypasses ---

HUGE = b"9" * 5000  # an integer literal beyond Python's 4,300-digit conversion limit


def state_is_a_fifo(c: Ctx) -> dict[str, Any]:
    c.state.parent.mkdir(parents=True)
    os.mkfifo(c.state)  # reading it must not block admission
    return {}


def state_locked_default_wait(c: Ctx) -> dict[str, Any]:
    state_locked(c)
    return {}  # the default policy's wait: inside the serving budget


def state_huge_integer(c: Ctx) -> dict[str, Any]:
    c.state.parent.mkdir(parents=True)
    c.state.write_bytes(b'{"schema_version":1,"series":{"s":' + HUGE + b"}}")
    return {}


def root_with(edit: Callable[[dict[str, Any]], None]) -> Callable[[Ctx], dict[str, Any]]:
    def inject(c: Ctx) -> dict[str, Any]:
        doc = json.loads(c.root_path.read_bytes())
        edit(doc)
        c.root_path.write_bytes(json.dumps(doc).encode())
        return {}

    return inject


def root_huge_integer(c: Ctx) -> dict[str, Any]:
    c.root_path.write_bytes(c.root_path.read_bytes().replace(b'"version":1', b'"version":' + HUGE, 1))
    return {}


def manifest_huge_integer(c: Ctx) -> dict[str, Any]:
    path = c.bundle / BUNDLE_MANIFEST
    path.write_bytes(b'{"n":' + HUGE + b"," + path.read_bytes()[1:])
    return {}


def member_footer_huge_integer(c: Ctx) -> dict[str, Any]:
    path = c.bundle / "cost-table.parquet"
    loaded = read_artifact(path)
    raw = b'{"n":' + HUGE + b"," + canonical_json(dict(loaded.metadata))[1:]
    sink = io.BytesIO()
    pq.write_table(loaded.table.replace_schema_metadata({b"dspark": raw}), sink)
    path.write_bytes(sink.getvalue())
    return {}


def member_too_many_rows(c: Ctx) -> dict[str, Any]:
    # 5,000 rows describe no real deployment; the footer says so before anything is decoded.
    path = c.bundle / "cost-table.parquet"
    loaded = read_artifact(path)
    table = loaded.table.take(pa.array([i % loaded.table.num_rows for i in range(5000)]))
    path.write_bytes(encode_artifact(table, dict(loaded.metadata)))
    return {}


def newer_with(unbound: frozenset[str] = frozenset(), **changes: Any) -> Callable[[Ctx], dict[str, Any]]:
    """Admit v2 of the deployment built under other (unbound) conditions; then v1 must be a rollback."""

    def inject(c: Ctx) -> dict[str, Any]:
        policy = c.policy(unbound_fields=unbound)
        newer = c.other_bundle("v2", version=2, fingerprint=make_fingerprint(**changes))
        live = make_fingerprint(**{k: v for k, v in changes.items() if k in unbound})
        assert run_admit(c, bundle=newer, policy=policy, live=live).active
        return {"policy": policy}

    return inject


def _rotated(c: Ctx, versions: int, new_artifact_signer: Any = None) -> list[Path]:
    """Root files v1..v(1+versions), each rotation signed by the (unchanged) root key; the first
    one replaces the artifact key by ``new_artifact_signer`` when given."""
    roots = [load_trust_root(c.root_path.read_bytes(), now=NOW)]
    for i in range(versions):
        changes: dict[str, Any] = {}
        if new_artifact_signer is not None and i == 0:
            changes = {
                "remove_artifact_keyids": [public_key_of(c.keys[0]).keyid],
                "add_artifact_keys": [public_key_of(new_artifact_signer)],
            }
        roots.append(
            rotate_root(roots[-1], signers=[c.keys[0]], expires=NOW + timedelta(days=300), **changes)
        )
    paths = []
    for r in roots:
        path = c.tmp / f"root-v{r.version}.json"
        path.write_bytes(r.to_bytes())
        paths.append(path)
    return paths


def root_rolled_back(c: Ctx) -> dict[str, Any]:
    """Root v2 revokes the artifact key; putting v1 back must not re-admit what that key signed."""
    new = make_signers(c.tmp / "new-keys", 1, prefix="new")
    v1, v2 = _rotated(c, 1, new[0])
    signed_by_new = make_bundle(c.tmp / "new", new, version=2)
    assert run_admit(c, bundle=signed_by_new, trust_root=v2).active
    return {"trust_root": v1}  # with the original bundle, signed by the revoked key


def root_skips_versions(c: Ctx) -> dict[str, Any]:
    v1, _, v3 = _rotated(c, 2)
    assert run_admit(c, trust_root=v1).active  # v1 recorded as the newest root seen
    return {"trust_root": v3}  # v2 is not given: v3 cannot be chained to v1


# --- hardening, round two: nesting, list columns, state permissions, live precedence ---

OTHER_UID = 65534  # nobody


def state_holding(where: str) -> Callable[[Ctx], dict[str, Any]]:
    """A ~1 KB state whose stored root (or a series binding) nests 40 deep, digests made right."""

    def inject(c: Ctx) -> dict[str, Any]:
        doc: dict[str, Any] = {"schema_version": 2, "series": {}, "legacy_series": {}, "trust_root": None}
        if where == "root-40-deep":
            doc["trust_root"] = {"version": 1, "sha256": unchecked_digest(nested()), "root": nested()}
        elif where == "binding-40-deep":
            binding = {"gpu": nested()}
            doc["series"][f"bundle:{unchecked_digest(binding)}"] = {
                "kind": "bundle",
                "binding": binding,
                "version": 1,
            }
        else:  # a stored root that is no TUF root at all, of a later version than the pinned one
            garbage = {"signed": {"_type": "root", "version": 2}, "signatures": []}
            doc["trust_root"] = {"version": 2, "sha256": unchecked_digest(garbage), "root": garbage}
        c.state.parent.mkdir(mode=0o700, parents=True)
        c.state.write_bytes(json.dumps(doc).encode())
        return {}

    return inject


def root_keyval_nested(c: Ctx) -> dict[str, Any]:
    """A validly signed root whose key carries a 40-deep extra ``keyval`` entry."""
    from tuf.api.metadata import Metadata

    md = Metadata.from_bytes(c.root_path.read_bytes())
    for key in md.signed.keys.values():
        key.keyval["extra"] = nested()
    md.signatures.clear()
    md.sign(c.keys[0])
    c.root_path.write_bytes(md.to_bytes())
    return {}


def calibration_params_expanding(c: Ctx) -> dict[str, Any]:
    """``params`` swapped (signed footer kept) for 3 million equal doubles in one row: ~1 kB
    stored, 24 MB decoded; the same file with 128 million is 50 kB and gigabytes."""
    path = c.bundle / "calibration.parquet"
    loaded = read_artifact(path)
    t = loaded.table
    field = t.schema.field("params")
    params = pa.array([[0.5] * 3_000_000] + [[0.5, 0.5]] * (t.num_rows - 1), field.type)
    path.write_bytes(
        encode_artifact(
            t.set_column(t.schema.get_field_index("params"), field, params), dict(loaded.metadata)
        )
    )
    return {}


def _recorded(c: Ctx) -> None:
    """The state as a first admission leaves it."""
    assert run_admit(c).active


def _as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a file's owner needs root")


def state_mode(mode: int) -> Callable[[Ctx], dict[str, Any]]:
    def inject(c: Ctx) -> dict[str, Any]:
        _recorded(c)
        os.chmod(c.state, mode)
        return {}

    return inject


def state_dir_mode(mode: int) -> Callable[[Ctx], dict[str, Any]]:
    def inject(c: Ctx) -> dict[str, Any]:
        _recorded(c)
        os.chmod(c.state.parent, mode)
        return {}

    return inject


def owned_by_other(name: str) -> Callable[[Ctx], dict[str, Any]]:
    """The state, its lock or its directory handed to another user (a new state must be written)."""

    def inject(c: Ctx) -> dict[str, Any]:
        _as_root()
        if name == "state":
            _recorded(c)
            os.chown(c.state, OTHER_UID, OTHER_UID)
        elif name == "lock":
            c.state.parent.mkdir(mode=0o700, parents=True)
            lock = Path(f"{c.state}.lock")
            lock.touch(mode=0o600)
            os.chown(lock, OTHER_UID, OTHER_UID)
        else:
            c.state.parent.mkdir(mode=0o700, parents=True)
            os.chown(c.state.parent, OTHER_UID, OTHER_UID)
        return {}

    return inject


def lock_is_a_symlink(c: Ctx) -> dict[str, Any]:
    c.state.parent.mkdir(mode=0o700, parents=True)
    os.symlink(c.tmp / "elsewhere", f"{c.state}.lock")  # opening it would create or truncate that file
    return {}


class _Environment(_ProbeFailing):
    """A host without GPUs whose environment and engine source tree are given."""

    def __init__(self, variables: Mapping[str, str], git: tuple[str, str]) -> None:
        self.variables, self.tree = variables, git

    def gpus(self) -> tuple[tuple[GpuInfo, ...] | None, str]:
        return None, "no GPU"

    def getenv(self, name: str) -> str | None:
        return self.variables.get(name)

    def git(self, source_dir: Path) -> tuple[str | None, str | None, str]:
        return self.tree[0], self.tree[1], f"git:{source_dir}"


def environment_over(request: str) -> Callable[[Ctx], dict[str, Any]]:
    """The signed deployment's values in ``DSPARK_*`` variables, while the probe the operator asked
    for finds something else: a dirty engine tree, another runtime. The probe must win."""

    def inject(c: Ctx) -> dict[str, Any]:
        fp = {k: v for k, v in make_fingerprint().to_dict().items() if v is not None}
        variables = {
            "DSPARK_SOURCE_HEAD": fp["source_head"],
            "DSPARK_SOURCE_DIFF_SHA256": fp["source_diff_sha256"],
            "DSPARK_RUNTIME_SNAPSHOT": fp["runtime_snapshot"],
        }
        env = _Environment(variables, git=(fp["source_head"], "f" * 64))  # uncommitted changes
        if request == "source-dir":
            given = {k: v for k, v in fp.items() if k not in ("source_head", "source_diff_sha256")}
            return {"live": {"overrides": given, "source_dir": c.tmp, "env": env}}
        given = {k: v for k, v in fp.items() if k != "runtime_snapshot"}
        return {"live": {"overrides": given, "runtime_packages": ("tensorrt_llm",), "env": env}}

    return inject


GAIN_NOT_PROVEN = "GAIN_NOT_PROVEN:predicted_gain_ci_low"
NOT_ADMITTED = {"gross_compact_value_ms_lower_bound": 120.0, "net_value_ms": -30.0, "admitted": False}
calibration_without_temperature = [
    {**r, "temperature": None, "method": "platt", "params": [1.0, 0.0]} if r["position"] == 3 else r
    for r in calibration_rows()
]
only_native = [r for r in cost_rows() if r["verifier_budget"] == 0]
foreign_cells = [
    *admission_rows(),
    {
        "graph_batch_size": 8,
        "verifier_budget": 24,
        "chosen_steps": 1,
        "value_ms": 0.1,
        "value_ms_lower_bound": 0.0,
    },
]

FAULTS: list[tuple[str, Callable[[Ctx], dict[str, Any]], str]] = [
    # missing, unreadable, corrupt or truncated files
    ("bundle-missing", bundle_missing, "BUNDLE_MEMBER_MISSING:manifest"),
    ("member-missing", member_missing, "BUNDLE_MEMBER_MISSING:cost-table"),
    ("member-unreadable", member_unreadable, "IO_ERROR"),
    ("member-corrupt", member_corrupt, "NOT_PARQUET"),
    ("member-truncated", member_truncated, "NOT_PARQUET"),
    ("manifest-truncated", manifest_truncated, "ENVELOPE_INVALID"),
    ("manifest-is-a-fifo", fifo_in_bundle(BUNDLE_MANIFEST), f"IO_ERROR:{BUNDLE_MANIFEST}"),
    ("member-is-a-fifo", fifo_in_bundle("calibration.parquet"), "IO_ERROR:calibration.parquet"),
    ("trust-root-missing", root_missing, "TRUST_ROOT_INVALID:trust_root"),
    ("trust-root-corrupt", root_corrupt, "TRUST_ROOT_INVALID:trust_root"),
    ("trust-root-is-a-fifo", root_is_a_fifo, "TRUST_ROOT_INVALID:trust_root"),
    # wrong or expired trust root, expired artifact, rollback
    ("wrong-trust-root", wrong_root, "SIGNATURE_THRESHOLD"),
    ("trust-root-expired-file", root_expired_file, "TRUST_ROOT_EXPIRED:trust_root"),
    ("trust-root-expired-loaded", root_expired_loaded, "TRUST_ROOT_EXPIRED:expires"),
    ("artifact-expired", artifact_expired, "EXPIRED:expires_at"),
    ("artifact-older-than-policy", artifact_too_old, "EXPIRED:issued_at"),
    ("rollback", rollback, "ROLLBACK:version"),
    # rollback state locked, unwritable, disk full, corrupt
    ("state-locked", state_locked, "STATE_LOCKED"),
    ("state-unwritable", state_unwritable, "STATE_UNWRITABLE"),
    ("state-disk-full", disk_full, "STATE_UNWRITABLE"),
    ("state-corrupt", state_corrupt, "STATE_CORRUPT"),
    # live collector raising
    ("live-collector-raises", live_probe_raises, "LIVE_PROBE_FAILED"),
    ("live-collector-crashes", live_probe_crashes, "INTERNAL_ERROR:live"),
    # mismatch per field (the first differing field, in binding-field order, is the reason code)
    ("mismatch-gpu", live(gpu="B300"), "FINGERPRINT_MISMATCH:gpu"),
    ("mismatch-gpu-snapshot", live(gpu_snapshot_sha256="9" * 64), "FINGERPRINT_MISMATCH:gpu_snapshot_sha256"),
    (
        "mismatch-gpu-count",
        live(gpu_count=2, global_graph_batch_sizes=(16, 32, 64)),
        "FINGERPRINT_MISMATCH:gpu_count",
    ),
    ("mismatch-topology", live(topology="DEP8"), "FINGERPRINT_MISMATCH:topology"),
    (
        "mismatch-ladder",
        live(rank_local_graph_batch_sizes=(8, 16), global_graph_batch_sizes=(8, 16)),
        "FINGERPRINT_MISMATCH:rank_local_graph_batch_sizes",
    ),
    ("mismatch-k", live(max_draft_len=4), "FINGERPRINT_MISMATCH:max_draft_len"),
    ("mismatch-source-head", live(source_head="0badc0de"), "FINGERPRINT_MISMATCH:source_head"),
    ("mismatch-source-diff", live(source_diff_sha256="0" * 64), "FINGERPRINT_MISMATCH:source_diff_sha256"),
    (
        "mismatch-runtime",
        live(runtime_snapshot="tensorrt_llm=1.4.0;torch=2.11.0"),
        "FINGERPRINT_MISMATCH:runtime_snapshot",
    ),
    ("mismatch-model", live(model_config_sha256="1" * 64), "FINGERPRINT_MISMATCH:model_config_sha256"),
    ("mismatch-kv-dtype", live(kv_dtype="fp8"), "FINGERPRINT_MISMATCH:kv_dtype"),
    ("live-field-not-established", live(runtime_snapshot=None), "FINGERPRINT_MISSING:runtime_snapshot"),
    # a member swapped for one from another bundle
    ("member-swapped", member_swapped, "BUNDLE_MEMBER_MISMATCH:cost-table"),
    ("member-from-other-deployment", member_from(gpu="H100"), "FINGERPRINT_MISMATCH:gpu"),
    ("member-from-other-conditions", member_from(context_len=4096), "CROSS_MEMBER_MISMATCH:context_len"),
    (
        "admission-member-absent",
        rebuilt(members=("cost-table", "calibration")),
        "BUNDLE_MEMBER_MISSING:admission",
    ),
    (
        "admission-cells-not-in-cost-table",
        rebuilt(admission=foreign_cells),
        "CROSS_MEMBER_MISMATCH:admission.cells",
    ),
    (
        "calibration-without-sts",
        rebuilt(calibration=calibration_without_temperature),
        "CONTENT_INVALID:calibration.temperature",
    ),
    # synthetic evidence
    (
        "synthetic",
        rebuilt(provenance=make_provenance(synthetic=True, backend="synthetic")),
        "SYNTHETIC_REFUSED:provenance.synthetic",
    ),
    # gain lower bound <= 0, and the other ways the economics fail
    ("gain-ci-low-zero", summary(predicted_gain_ci_low=0.0), GAIN_NOT_PROVEN),
    (
        "gain-negative",
        summary(predicted_gain=-0.03, predicted_gain_ci_low=-0.05, predicted_gain_ci_high=-0.01),
        GAIN_NOT_PROVEN,
    ),
    ("not-admitted", summary(**NOT_ADMITTED), GAIN_NOT_PROVEN),
    ("no-drain-guard", summary(drain_guard=None), GAIN_NOT_PROVEN),
    ("only-native-cells", rebuilt(costs=only_native, admission=[]), "GAIN_NOT_PROVEN:cost_table.cells"),
    ("summary-incomplete", without_summary_key("policy_steps"), "CONTENT_INVALID:admission.summary"),
    (
        "summary-inconsistent",
        summary(**{**NOT_ADMITTED, "admitted": True}),
        "CONTENT_INVALID:admission.summary",
    ),
    (
        "drain-guard-tail-unmeasured",
        summary(drain_guard={**admission_summary()["drain_guard"], "tail_graph_batch_size": 12}),
        "CONTENT_INVALID:planner",
    ),
    # the sentinel failing, a backend import error
    ("sentinel-fails", sentinel(f"{FAKE}:ScaledBackend", scale=1.3), "SENTINEL_FAILED:G32V0"),
    ("sentinel-measurement-error", sentinel(f"{FAKE}:FailingBackend"), "SENTINEL_FAILED"),
    (
        "sentinel-synthetic-backend",
        sentinel(f"{FAKE}:ScaledBackend", synthetic=True),
        "SYNTHETIC_REFUSED:backend",
    ),
    ("backend-import-error", sentinel("no_such_package.backends:Backend"), "BACKEND_IMPORT_ERROR:backend"),
    ("backend-not-a-backend", sentinel(f"{FAKE}:table_time_ms"), "BACKEND_IMPORT_ERROR:backend"),
    # hangs: a FIFO in place of the state, a lock held by another process (bounded wait)
    ("state-is-a-fifo", state_is_a_fifo, "IO_ERROR"),
    ("state-locked-default-wait", state_locked_default_wait, "STATE_LOCKED"),
    # resource exhaustion: a table far larger than any real one, judged from the footer
    ("member-too-many-rows", member_too_many_rows, "TABLE_TOO_LARGE"),
    # numbers the strict loader must refuse as the file's own error (never INTERNAL_ERROR)
    ("trust-root-integer-of-5000-digits", root_huge_integer, "TRUST_ROOT_INVALID:trust_root"),
    (
        "trust-root-float",
        root_with(lambda d: d["signed"].update(consistent_snapshot=1.5)),
        "TRUST_ROOT_INVALID:trust_root",
    ),
    ("manifest-integer-of-5000-digits", manifest_huge_integer, "ENVELOPE_INVALID"),
    ("member-footer-integer-of-5000-digits", member_footer_huge_integer, "METADATA_INVALID"),
    ("state-integer-of-5000-digits", state_huge_integer, "STATE_CORRUPT"),
    # rollback: the series is kind + bound fields, never the unbound ones
    ("rollback-across-context-len", newer_with(context_len=4096), "ROLLBACK:version"),
    ("rollback-across-clock-policy", newer_with(clock_policy="locked"), "ROLLBACK:version"),
    ("rollback-across-unbound-gpu", newer_with(frozenset({"gpu"}), gpu="B300"), "ROLLBACK:version"),
    # trust-root rollback: never older than the newest root seen, newer only through a chain
    ("trust-root-rolled-back", root_rolled_back, "TRUST_ROOT_ROLLBACK:trust_root"),
    ("trust-root-skips-versions", root_skips_versions, "TRUST_ROOT_ROTATION_INVALID:trust_root"),
    # nesting the writer would refuse is refused by the reader too, as the file's own error
    ("state-trust-root-nested-40-deep", state_holding("root-40-deep"), "STATE_CORRUPT"),
    ("state-binding-nested-40-deep", state_holding("binding-40-deep"), "STATE_CORRUPT"),
    ("trust-root-keyval-nested-40-deep", root_keyval_nested, "TRUST_ROOT_INVALID:trust_root"),
    # a garbage root in the state is the state's defect, not the pinned root's
    ("state-trust-root-garbage", state_holding("garbage-root"), "STATE_CORRUPT"),
    # a list column's values, counted from its page headers before decoding
    ("calibration-params-expand-past-decoded-limit", calibration_params_expanding, "TABLE_TOO_LARGE"),
    # a state another user could delete, rewrite or lock
    ("state-world-writable", state_mode(0o646), "STATE_INSECURE"),
    ("state-group-writable", state_mode(0o620), "STATE_INSECURE"),
    ("state-directory-world-writable", state_dir_mode(0o777), "STATE_INSECURE"),
    ("state-owned-by-another-user", owned_by_other("state"), "STATE_INSECURE"),
    ("state-lock-owned-by-another-user", owned_by_other("lock"), "STATE_INSECURE"),
    ("state-directory-owned-by-another-user", owned_by_other("directory"), "STATE_INSECURE"),
    ("state-lock-is-a-symlink", lock_is_a_symlink, "STATE_INSECURE"),
    # explicit options beat environment variables: a requested probe is never overridden
    (
        "env-source-head-over-source-dir",
        environment_over("source-dir"),
        "FINGERPRINT_MISMATCH:source_diff_sha256",
    ),
    (
        "env-runtime-snapshot-over-packages",
        environment_over("packages"),
        "FINGERPRINT_MISMATCH:runtime_snapshot",
    ),
    # anything unexpected
    ("metrics-callback-raises", callback_raises, "INTERNAL_ERROR:metrics_callback"),
    ("rank-collective-fails", collective_fails, "INTERNAL_ERROR:rank_agreement"),
    ("bundle-not-a-path", not_a_path, "INTERNAL_ERROR:start"),
]


@pytest.mark.parametrize(("name", "inject", "code"), FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_fails_closed(ctx: Ctx, name: str, inject: Callable[[Ctx], dict[str, Any]], code: str) -> None:
    overrides = inject(ctx)
    with fifo_watchdog(ctx.tmp):  # a read that blocks on a FIFO returns late, and wrong
        decision = run_admit(ctx, **overrides)  # admit never raises: no pytest.raises anywhere here
    assert decision.active is False
    assert not decision
    assert decision.reason_code == code, decision.message
    assert decision.reason is not Reason.OK
    assert decision.message
    assert decision.engine_config == STATIC_ENGINE_CONFIG
    assert dict(decoding_fields(decision).fields) == static_decoding_fields()
    assert decision.timings_ms["total"] < FAULT_TIME_LIMIT_MS


def test_root_rotation_chain_is_followed(ctx: Ctx) -> None:
    """A pinned root that skips versions is accepted through the roots in between, then recorded."""
    v1, v2, v3 = _rotated(ctx, 2)
    assert run_admit(ctx, trust_root=v1).active
    decision = run_admit(ctx, trust_root=v3, policy=ctx.policy(trust_root_chain=(v2,)))
    assert decision.active, decision.message
    assert json.loads(ctx.state.read_bytes())["trust_root"]["version"] == 3
    assert run_admit(ctx, trust_root=v2).reason_code == "TRUST_ROOT_ROLLBACK:trust_root"


def test_two_defects_report_the_earlier_step(ctx: Ctx) -> None:
    artifact_expired(ctx)
    decision = run_admit(ctx, live=make_fingerprint(gpu="B300"), now=NOW + timedelta(days=31))
    assert decision.reason_code == "EXPIRED:expires_at"  # freshness (6) before binding (7)


def test_every_mismatching_field_is_reported(ctx: Ctx) -> None:
    decision = run_admit(ctx, live=make_fingerprint(gpu="B300", topology="DEP8", max_draft_len=4))
    assert decision.reason is Reason.FINGERPRINT_MISMATCH
    assert {f.field for f in decision.findings} == {"gpu", "max_draft_len", "topology"}


def test_happy_path_activates(ctx: Ctx) -> None:
    records: list[Mapping[str, Any]] = []
    decision = run_admit(ctx, metrics_callback=records.append)
    assert decision.active, decision.message
    assert decision.reason is Reason.OK and decision.reason_code == "OK"
    assert set(decision.members) == {"admission", "calibration", "cost-table"}
    assert decision.economics is not None and decision.economics.predicted_gain_ci_low == 0.08
    config = decision.engine_config
    assert config["enable_confidence_scheduling"] is True
    assert config["max_draft_len"] == 5
    assert config["sts_temperatures"] == (1.1, 1.2, 1.3, 1.4, 1.5)
    assert (32, 128) in config["cells"] and (8, 0) in config["cells"]
    assert config["bundle_sha256"] == decision.bundle_sha256
    assert decision.bundle_version == 1
    assert {"trust_root", "live", "bundle", "members", "economics", "planner", "total"} <= set(
        decision.timings_ms
    )
    assert [r["reason_code"] for r in records] == ["OK"]
    # accepted versions are recorded: manifest and the three members
    state = json.loads(ctx.state.read_text())
    assert sorted(e["version"] for e in state["series"].values()) == [1, 1, 1, 1]
    assert state["trust_root"]["version"] == 1  # the trust root seen is remembered too
    # read-only members
    with pytest.raises(TypeError):
        config["enable_confidence_scheduling"] = False  # type: ignore[index]
    with pytest.raises(AttributeError):
        decision.active = False  # type: ignore[misc]


def test_live_arguments_are_collected(ctx: Ctx) -> None:
    class Host(_ProbeFailing):
        def gpus(self) -> tuple[tuple[GpuInfo, ...] | None, str]:
            return None, "no GPU in CI"

    fp = make_fingerprint()
    explicit = {
        "max_draft_len": fp.max_draft_len,
        "rank_local_graph_batch_sizes": fp.rank_local_graph_batch_sizes,
        "topology": fp.topology,
        "gpu": fp.gpu,
        "gpu_count": fp.gpu_count,
        "source_head": fp.source_head,
        "source_diff_sha256": fp.source_diff_sha256,
        "runtime_snapshot": fp.runtime_snapshot,
        "overrides": {
            "gpu_snapshot_sha256": fp.gpu_snapshot_sha256,
            "model_config_sha256": fp.model_config_sha256,
            "kv_dtype": fp.kv_dtype,
        },
        "env": Host(),
    }
    assert run_admit(ctx, live=explicit).active
    assert run_admit(ctx, live=collect_live(**explicit)).active


def test_same_version_readmitted_after_restart(ctx: Ctx) -> None:
    assert run_admit(ctx).active
    assert run_admit(ctx).active  # an equal version is not a rollback


def test_a_changed_root_file_is_verified_again_in_the_same_process(ctx: Ctx) -> None:
    # The root verified by the first admission is kept for exactly its bytes; what replaces the
    # file afterwards is checked in full (no state: the trust-root rollback rule is not at work).
    good = ctx.root_path.read_bytes()
    assert run_admit(ctx, policy=AdmissionPolicy()).active
    doc = json.loads(good)
    doc["signed"]["expires"] = "2099-01-01T00:00:00Z"  # edited after signing
    ctx.root_path.write_bytes(canonical_json(doc))
    assert run_admit(ctx, policy=AdmissionPolicy()).reason is Reason.TRUST_ROOT_INVALID
    wrong_root(ctx)  # a valid root that does not trust the bundle's signer
    assert run_admit(ctx, policy=AdmissionPolicy()).reason is Reason.SIGNATURE_THRESHOLD
    ctx.root_path.write_bytes(good)
    assert run_admit(ctx, policy=AdmissionPolicy()).active


def test_gain_test_statuses() -> None:
    econ = AdmissionEconomics.from_summary(admission_summary())
    assert gain_test(econ, 0.0).status is GainStatus.ACCEPT
    assert gain_test(econ, 0.1).status is GainStatus.UNDECIDED
    assert gain_test(econ, 0.2).status is GainStatus.REJECT
    assert gain_test(None, 0.0).status is GainStatus.UNKNOWN


def test_gain_test_can_be_disabled(ctx: Ctx) -> None:
    summary(predicted_gain_ci_low=-0.01)(ctx)
    assert not run_admit(ctx).active
    assert run_admit(ctx, policy=ctx.policy(min_gain_lower_bound=None)).active


def test_sentinel_passes_and_reports_cost(ctx: Ctx) -> None:
    decision = run_admit(
        ctx,
        policy=ctx.policy(
            sentinel=SentinelPolicy(
                backend=f"{FAKE}:ScaledBackend", backend_options={"scale": 1.02}, loader=load_sentinel_backend
            )
        ),
    )
    assert decision.active, decision.message
    assert decision.sentinel is not None and decision.sentinel.ok
    assert [(c.cell.graph_batch_size, c.cell.verifier_budget) for c in decision.sentinel.checks] == [
        (32, 0),
        (32, 64),
    ]
    assert decision.sentinel.cost_s >= 0
    assert "sentinel" in decision.timings_ms
    assert decision.log_record()["sentinel_cost_ms"] is not None


def test_one_log_line_per_decision(ctx: Ctx, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="dspark_calibrate")
    run_admit(ctx)
    run_admit(ctx, live=make_fingerprint(gpu="B300"))
    callback_raises(ctx)
    run_admit(ctx, **callback_raises(ctx))
    records = [r for r in caplog.records if r.name.startswith("dspark_calibrate.runtime_plugin.admission")]
    assert [r.levelno for r in records] == [logging.INFO, logging.WARNING, logging.ERROR]
    payloads = [json.loads(r.getMessage().split(" ", 2)[2]) for r in records]
    assert [p["reason_code"] for p in payloads] == [
        "OK",
        "FINGERPRINT_MISMATCH:gpu",
        "INTERNAL_ERROR:metrics_callback",
    ]
    for p in payloads:
        assert {
            "bundle_sha256",
            "bundle_version",
            "member_versions",
            "trust_root_version",
            "tool_version",
            "timings_ms",
        } <= set(p)
    assert records[2].exc_info is not None  # the exception is logged once, with its traceback


def test_policy_validates_itself() -> None:
    from dspark_calibrate.errors import ConfigError

    with pytest.raises(ConfigError):
        AdmissionPolicy(required_members=("cost-table",))
    with pytest.raises(ConfigError):
        AdmissionPolicy(unbound_fields=frozenset({"not_a_field"}))
    with pytest.raises(ConfigError):
        AdmissionPolicy(max_artifact_age=timedelta(0))
    with pytest.raises(ConfigError):
        SentinelPolicy(backend="x:y", tolerance=1.5)
    assert AdmissionPolicy().allow_synthetic is False
    assert AdmissionPolicy().required_members == ("admission", "calibration", "cost-table")


def test_decision_round_trips_to_json(ctx: Ctx) -> None:
    decision = run_admit(ctx)
    data = json.loads(json.dumps(decision.to_dict()))
    assert data["active"] is True and data["engine_config"]["max_draft_len"] == 5
    assert data["economics"]["predicted_gain_ci"] == [0.08, 0.16]


def test_an_identity_position_without_a_temperature_runs_at_t_1(ctx: Ctx) -> None:
    """The hook reads temperatures through the calibration model, the rule the export follows:
    an identity map is STS at T = 1, so both hand the engine the same temperatures."""
    identity_at_2 = [
        {**r, "temperature": None, "method": "identity", "params": []} if r["position"] == 2 else r
        for r in calibration_rows()
    ]
    rebuilt(calibration=identity_at_2)(ctx)
    decision = run_admit(ctx)
    assert decision.active, decision.message
    assert decision.engine_config["sts_temperatures"] == (1.1, 1.0, 1.3, 1.4, 1.5)
    exported = Calibration.from_rows(identity_at_2, use="sts").sts_temperatures()
    assert exported == decision.engine_config["sts_temperatures"]
