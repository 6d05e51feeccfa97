"""The generic engine adapter: a DynamicVerifier exists only for an active decision."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dspark_calibrate.runtime_plugin.admission import AdmissionDecision, AdmissionPolicy, admit
from dspark_calibrate.runtime_plugin.engine import DynamicVerifier
from dspark_calibrate.runtime_plugin.planner import StepRows
from tests.factories import K, make_fingerprint
from tests.runtime_plugin.bundles import LATER, make_bundle
from tests.signing import make_root, make_signers


@pytest.fixture(scope="module")
def decisions(tmp_path_factory: pytest.TempPathFactory) -> tuple[AdmissionDecision, AdmissionDecision]:
    tmp = tmp_path_factory.mktemp("engine")
    keys = make_signers(tmp / "keys", 1)
    bundle = make_bundle(tmp / "bundle", keys)
    root: Any = make_root(keys)
    on = admit(bundle, root, live=make_fingerprint(), policy=AdmissionPolicy(), now=LATER)
    off = admit(bundle, root, live=make_fingerprint(topology="DEP8"), policy=AdmissionPolicy(), now=LATER)
    return on, off


def test_only_an_active_decision_builds_a_verifier(
    decisions: tuple[AdmissionDecision, AdmissionDecision],
) -> None:
    on, off = decisions
    assert on.active and not off.active
    with pytest.raises(RuntimeError, match="static K"):
        DynamicVerifier.from_decision(off)
    verifier = DynamicVerifier.from_decision(on)
    assert verifier.max_draft_len == K
    assert verifier.decision_digest == on.agreement_digest()
    assert verifier.calibration.sts_temperatures() == (1.1, 1.2, 1.3, 1.4, 1.5)
    table = verifier.cost_table
    assert table.graph_batch_sizes == (8, 16, 32)
    assert table.drain_guard is not None and table.drain_guard.tail_graph_batch_size == 8
    assert table.minimum_predicted_gain == pytest.approx(0.01)
    assert table.time(32, 64) == pytest.approx(5.0 + 0.64 + 0.032)


def test_verifier_selects_and_allocates_over_verified_cells(
    decisions: tuple[AdmissionDecision, AdmissionDecision],
) -> None:
    verifier = DynamicVerifier.from_decision(decisions[0])
    confident = StepRows.single_rank(np.full((8, K), 6.0))
    doubtful = StepRows.single_rank(np.full((8, K), -6.0))
    for rows in (confident, doubtful):
        p = verifier.plan(rows)
        assert p.graph_batch_size == 8
        assert p.verifier_budget in (0, 16, 32)
        assert verifier.select(rows).verifier_budget == p.verifier_budget
    # doubtful drafts: verifying fewer tokens is worth it; confident ones: it is not
    assert verifier.select(doubtful).verifier_budget != 0
    assert verifier.select(confident).verifier_budget == 0
    plan = verifier.allocate(doubtful, 8, 16)
    assert int(np.sum(plan.windows + 1)) == 16  # the allocation fills the bucket exactly
    assert set(plan.windows.tolist()) <= set(range(1, K + 1))


def test_native_calibration_maps_can_be_used(decisions: tuple[AdmissionDecision, AdmissionDecision]) -> None:
    verifier = DynamicVerifier.from_decision(decisions[0], calibration_use="native", min_verify_len=2)
    assert verifier.calibration.k == K
    assert all(w >= 2 for w in verifier.plan(StepRows.single_rank(np.zeros((4, K)))).windows.tolist())


def test_bundle_path_is_recorded(decisions: tuple[AdmissionDecision, AdmissionDecision]) -> None:
    assert isinstance(decisions[0].bundle_path, Path)
