"""Eight processes admitting at once share one rollback state, and it stays consistent."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest

from dspark_calibrate.runtime_plugin.admission import AdmissionPolicy, admit
from tests.factories import make_fingerprint
from tests.runtime_plugin.bundles import LATER, make_bundle
from tests.signing import make_root, make_signers

PROCESSES = 8


def _admit_worker(bundle: str, root: str, state: str, barrier: Any, out: Any) -> None:
    barrier.wait(timeout=60)  # all eight start verifying together
    decision = admit(
        bundle,
        root,
        live=make_fingerprint(),
        policy=AdmissionPolicy(state_path=Path(state), state_lock_timeout_s=30.0),
        now=LATER,
    )
    out.put((bundle, decision.active, decision.reason_code))


@pytest.mark.slow
def test_eight_processes_admit_at_once(tmp_path: Path) -> None:
    keys = make_signers(tmp_path / "keys", 1)
    root = tmp_path / "root.json"
    root.write_bytes(make_root(keys).to_bytes())
    v1 = make_bundle(tmp_path / "v1", keys, version=1)
    v2 = make_bundle(tmp_path / "v2", keys, version=2)
    state = tmp_path / "state" / "rollback.json"
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(PROCESSES), ctx.Queue()
    bundles = [v2 if i % 2 else v1 for i in range(PROCESSES)]
    procs = [
        ctx.Process(target=_admit_worker, args=(str(b), str(root), str(state), barrier, out)) for b in bundles
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    by_bundle: dict[str, list[tuple[bool, str]]] = {}
    for bundle, active, code in results:
        by_bundle.setdefault(bundle, []).append((active, code))
    # the newer bundle is always admitted; the older one only before the newer was recorded
    assert by_bundle[str(v2)] == [(True, "OK")] * (PROCESSES // 2)
    assert all(code in ("OK", "ROLLBACK:version") for _, code in by_bundle[str(v1)])
    # the state holds the highest version of every series (manifest + 3 members), never lowered
    data = json.loads(state.read_text())
    assert data["schema_version"] == 2
    assert sorted(e["version"] for e in data["series"].values()) == [2, 2, 2, 2]
    assert sorted(p.name for p in state.parent.iterdir()) == ["rollback.json", "rollback.json.lock"]
    # and a sequential admission afterwards agrees with it
    late = admit(v1, root, live=make_fingerprint(), policy=AdmissionPolicy(state_path=state), now=LATER)
    assert late.reason_code == "ROLLBACK:version"
