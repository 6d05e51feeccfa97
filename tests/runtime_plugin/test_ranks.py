"""Rank agreement: the pure rule, and real gloo processes exchanging their decisions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_calibrate.artifacts import Finding, Reason
from dspark_calibrate.runtime_plugin.admission import STATIC_ENGINE_CONFIG, AdmissionDecision
from dspark_calibrate.runtime_plugin.ranks import agree, distributed_ready, reconcile
from tests.runtime_plugin.bundles import make_bundle
from tests.signing import make_root, make_signers

REPO = Path(__file__).resolve().parents[2]


def _active(bundle_sha: str = "a" * 64) -> AdmissionDecision:
    return AdmissionDecision(
        active=True,
        reason=Reason.OK,
        reason_code="OK",
        message="admitted",
        engine_config={"enable_confidence_scheduling": True, "bundle_sha256": bundle_sha},
        bundle_sha256=bundle_sha,
    )


def _inactive(reason: Reason) -> AdmissionDecision:
    return AdmissionDecision(active=False, reason=reason, reason_code=reason.value, message="no")


def test_agreeing_ranks_keep_their_decision() -> None:
    d = _active()
    assert reconcile(d, [d.agreement_digest()] * 4) is d


def test_any_disagreement_makes_every_rank_inactive() -> None:
    on, off = _active(), _inactive(Reason.FINGERPRINT_MISMATCH)
    digests = [on.agreement_digest(), off.agreement_digest()]
    for rank, mine in enumerate((on, off)):
        out = reconcile(mine, digests, rank)
        assert out.active is False
        assert out.reason is Reason.RANK_DISAGREEMENT
        assert out.engine_config == STATIC_ENGINE_CONFIG
        assert "ranks [0]" in out.message and "ranks [1]" in out.message


def test_two_active_ranks_on_different_bundles_disagree() -> None:
    a, b = _active("a" * 64), _active("b" * 64)
    assert reconcile(a, [a.agreement_digest(), b.agreement_digest()]).reason is Reason.RANK_DISAGREEMENT


def test_inactive_ranks_agree_whatever_their_reasons() -> None:
    x, y = _inactive(Reason.EXPIRED), _inactive(Reason.ROLLBACK)
    assert x.agreement_digest() == y.agreement_digest()
    assert reconcile(x, [x.agreement_digest(), y.agreement_digest()]).reason is Reason.EXPIRED


def test_agree_uses_the_injected_gather_and_skips_without_torch() -> None:
    d = _active()
    assert agree(d, gather=lambda mine: [mine, "0" * 64]).reason is Reason.RANK_DISAGREEMENT
    if "torch" not in sys.modules:
        assert distributed_ready() is False
    assert agree(d) is d  # no process group: nothing to agree on


def test_fallback_keeps_members_and_records_the_finding() -> None:
    d = _active()
    out = d.fallback(Finding(Reason.RANK_DISAGREEMENT, "split", field="ranks"))
    assert out.reason_code == "RANK_DISAGREEMENT:ranks" and out.findings[0].message == "split"


@pytest.mark.slow
def test_gloo_two_processes(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    keys = make_signers(tmp_path / "keys", 1)
    root = tmp_path / "root.json"
    root.write_bytes(make_root(keys).to_bytes())
    bundle = make_bundle(tmp_path / "bundle", keys)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.runtime_plugin.rank_worker",
                "--rank",
                str(r),
                "--world",
                "2",
                "--store",
                str(tmp_path / "store"),
                "--bundle",
                str(bundle),
                "--root",
                str(root),
                "--out",
                str(tmp_path / f"rank{r}.json"),
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    for p in procs:
        output, _ = p.communicate(timeout=120)
        assert p.returncode == 0, output.decode()
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # the same evidence on both ranks: both active
    assert [r["agree"] for r in results] == [[True, "OK"], [True, "OK"]]
    # rank 1 sees another GPU: it refuses, so rank 0 must not activate either
    assert [r["disagree"] for r in results] == [[False, "RANK_DISAGREEMENT:ranks"]] * 2
    assert all(r["rank_agreement_ms"] is not None for r in results)
