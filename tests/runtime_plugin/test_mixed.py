"""Mixed admission and the runtime's mixed selector.

``admit()`` decides mixed evidence apart from decode: every way mixed evidence can be bad or
missing leaves mixed steps native with its reason code and never turns off an admitted decode
policy; an inactive decode decision clears it. The selector looks cells up exactly, keeps first
context chunks native and prefers the higher score, then the smaller capacity.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from dspark_calibrate.artifacts import (
    MIXED_EXECUTION_MODE,
    TRTLLM_BODY_BUCKETS,
    ContextChunk,
    GenerationRequest,
    MixedLive,
    MixedRoute,
    MixedStep,
    RankStep,
    step_candidates,
    validate_trtllm,
)
from dspark_calibrate.runtime_plugin.admission import AdmissionPolicy, admit
from dspark_calibrate.runtime_plugin.mixed import MixedCell, MixedCostTable, choose_mixed, mixed_windows
from dspark_calibrate.runtime_plugin.trtllm import decoding_fields
from tests.mixed_bundles import LATER, TP1_BUCKETS, MixedBundle, copy_bundle, resign_mixed

SELECTOR = "5" * 64
LIVE_DEP8 = MixedLive(TRTLLM_BODY_BUCKETS, MIXED_EXECUTION_MODE)
LIVE_TP1 = MixedLive(TP1_BUCKETS, MIXED_EXECUTION_MODE)


def _admit(b: MixedBundle, bundle: Path | None = None, *, live: Any = None, **policy: Any) -> Any:
    kw: dict[str, Any] = {"allow_synthetic": True, "mixed_live": LIVE_DEP8, **policy}
    return admit(
        bundle or b.bundle, b.root, live=live or b.files.fingerprint, policy=AdmissionPolicy(**kw), now=LATER
    )


@pytest.mark.parametrize(("name", "live"), [("mixed_dep8", LIVE_DEP8), ("mixed_tp1", LIVE_TP1)])
def test_decode_and_mixed_are_both_admitted(
    name: str, live: MixedLive, request: pytest.FixtureRequest
) -> None:
    b: MixedBundle = request.getfixturevalue(name)
    d = _admit(b, mixed_live=live)
    assert d.active and d.mixed is not None and d.mixed.active, (d.reason_code, d.mixed)
    assert d.mixed.reason_code == "OK" and d.mixed.table is not None
    assert d.mixed.cells == len(d.mixed.table.cells) > 0
    assert d.engine_config["mixed"]["active"] is True  # ranks agree on it with the rest
    assert d.to_dict()["mixed"]["active"] is True


def _rm(rel: str) -> Callable[[Path, MixedBundle], None]:
    def edit(bundle: Path, b: MixedBundle) -> None:
        target = bundle / rel
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    return edit


def _fail_gate(bundle: Path, b: MixedBundle) -> None:
    def change(s: dict[str, Any]) -> None:
        s["gates"] = {**s["gates"], "accuracy_pass": False, "production_admission": False}

    resign_mixed(bundle, "mixed-admission", b.signers, b.root, summary=change)


def _no_economics(bundle: Path, b: MixedBundle) -> None:
    def change(s: dict[str, Any]) -> None:
        s["safety_margin_ms"] = s["gross_compact_value_ms_lower_bound"] * 2

    resign_mixed(bundle, "mixed-admission", b.signers, b.root, summary=change)


def _economics_refuse(bundle: Path, b: MixedBundle) -> None:
    """Signed economics that consistently do not admit (the receipt rule gives no)."""

    def change(s: dict[str, Any]) -> None:
        s["safety_margin_ms"] = s["gross_compact_value_ms_lower_bound"] * 2
        s["net_value_ms"] = (
            s["gross_compact_value_ms_lower_bound"]
            - s["policy_steps"] * s["fixed_confidence_path_overhead_ms_upper_bound"]
            - s["safety_margin_ms"]
        )
        s["admitted"] = False
        s["gates"] = {**s["gates"], "production_admission": False}

    resign_mixed(bundle, "mixed-admission", b.signers, b.root, summary=change)


def _append(rel: str) -> Callable[[Path, MixedBundle], None]:
    def edit(bundle: Path, b: MixedBundle) -> None:
        with open(bundle / rel, "ab") as f:
            f.write(b"\n")

    return edit


# (id, how to spoil the bundle, policy overrides, expected mixed reason code prefix)
MixedCase = tuple[str, Callable[[Path, MixedBundle], None] | None, dict[str, Any], str]
MIXED_CASES: list[MixedCase] = [
    ("no mixed evidence", _rm("mixed"), {}, "MIXED_ABSENT"),
    ("mixed manifest missing", _rm("mixed/mixed.dsse.json"), {}, "BUNDLE_MEMBER_MISSING"),
    ("result file edited", _append("mixed/results/accuracy.json"), {}, "BUNDLE_MEMBER_MISMATCH:accuracy"),
    ("a gate not passed", _fail_gate, {}, "GAIN_NOT_PROVEN:mixed"),
    ("economics inconsistent with admitted", _no_economics, {}, "CONTENT_INVALID:mixed"),
    ("economics do not admit", _economics_refuse, {}, "GAIN_NOT_PROVEN:mixed"),
    ("live body buckets unknown", None, {"mixed_live": None}, "FINGERPRINT_MISSING:body_buckets"),
    (
        "live body buckets differ",
        None,
        {"mixed_live": MixedLive(TRTLLM_BODY_BUCKETS[:5], MIXED_EXECUTION_MODE)},
        "FINGERPRINT_MISMATCH:body_buckets",
    ),
    (
        "live execution mode differs",
        None,
        {"mixed_live": MixedLive(TRTLLM_BODY_BUCKETS, "PIECEWISE")},
        "FINGERPRINT_MISMATCH:execution_mode",
    ),
    ("mixed not asked for", None, {"mixed": False}, "CONFIG_INVALID:mixed"),
]


@pytest.mark.parametrize(
    ("spoil", "policy", "code"), [c[1:] for c in MIXED_CASES], ids=[c[0] for c in MIXED_CASES]
)
def test_bad_mixed_evidence_leaves_decode_admitted(
    mixed_dep8: MixedBundle,
    tmp_path: Path,
    spoil: Callable[[Path, MixedBundle], None] | None,
    policy: dict[str, Any],
    code: str,
) -> None:
    bundle = copy_bundle(mixed_dep8, tmp_path)
    if spoil is not None:
        spoil(bundle, mixed_dep8)
    d = _admit(mixed_dep8, bundle, **policy)
    assert d.active and d.reason_code == "OK", d.message  # decode stands
    assert d.mixed is not None and not d.mixed.active and d.mixed.table is None
    assert d.mixed.reason_code.startswith(code), (d.mixed.reason_code, d.mixed.message)
    assert d.engine_config["mixed"]["active"] is False


def test_an_inactive_decode_decision_clears_mixed(mixed_dep8: MixedBundle) -> None:
    other = mixed_dep8.files.fingerprint.to_dict()
    other["gpu"] = "H100"
    from dspark_calibrate.artifacts import Fingerprint

    d = _admit(mixed_dep8, live=Fingerprint.from_dict(other))
    assert not d.active and d.reason_code.startswith("FINGERPRINT_MISMATCH")
    assert d.mixed is not None and not d.mixed.active and "cleared" in d.mixed.message


def test_the_launcher_options_carry_the_mixed_decision(mixed_dep8: MixedBundle, tmp_path: Path) -> None:
    d = _admit(mixed_dep8)
    opts = decoding_fields(d, selector_identity=SELECTOR, out_dir=tmp_path / "out")
    assert opts.active and opts.mixed_active and opts.mixed_reason_code is None
    block = opts.fields["confidence_mixed_evidence"]
    package = Path(block["costs_path"]).parent
    files = {p.name: p.read_bytes() for p in package.iterdir() if p.is_file()}
    assert validate_trtllm(files, selector_identity=SELECTOR, allow_synthetic=True) == []
    merged = yaml.safe_load(yaml.safe_dump(opts.llm_api_options({})))
    assert merged["speculative_config"]["confidence_mixed_evidence"] == block
    assert opts.to_dict()["mixed"]["active"] is True


def test_evidence_off_the_consumers_route_exports_decode_only(mixed_tp1: MixedBundle, tmp_path: Path) -> None:
    """World size 1 is admitted by our runtime hook, but TensorRT-LLM's mixed route is DEP8 only:
    the export leaves the mixed block out with a reason, the decode fields stand."""
    d = _admit(mixed_tp1, mixed_live=LIVE_TP1)
    assert d.active and d.mixed is not None and d.mixed.active
    opts = decoding_fields(d, selector_identity=SELECTOR, out_dir=tmp_path / "out")
    assert opts.active and not opts.mixed_active
    assert "confidence_mixed_evidence" not in opts.fields
    assert opts.mixed_reason_code is not None and "world size" in (opts.mixed_message or "")


# --- the selector ---------------------------------------------------------------------------------

K = 3
ROUTE = MixedRoute(K, 1, (32, 48, 64, 96))


def _step(position: int = 128, gens: int = 12) -> MixedStep:
    return MixedStep(
        ((RankStep((ContextChunk(16, position),), tuple(GenerationRequest(50) for _ in range(gens)))),)
    )


def _table(
    step: MixedStep, native_ms: float = 10.0, cand_ms: dict[int, float] | None = None
) -> MixedCostTable:
    _, geos = step_candidates(step.features(K), K, ROUTE.body_buckets)
    cand_ms = cand_ms or {}
    cells = tuple(MixedCell(g, native_ms, cand_ms.get(g.capacity, 7.0), "a" * 64) for g in geos)
    return MixedCostTable(ROUTE, cells, 0.01)


def _survivals(step: MixedStep, p: float) -> list[np.ndarray]:
    return [np.full((len(r.generations), K), p) for r in step.ranks]


def test_a_covered_step_runs_compact_and_its_windows_fit_the_rows() -> None:
    step = _step()
    table = _table(step)
    choice = choose_mixed(step, _survivals(step, 0.3), table)
    assert choice.reason == "compact" and choice.capacity is not None and choice.cell is not None
    assert choice.capacity < choice.native_capacity
    (w,) = mixed_windows(step, _survivals(step, 0.3), choice, K)
    assert 16 + int((w + 1).sum()) == choice.cell.geometry.actual_rank_rows[0]
    assert w.min() >= 1 and w.max() <= K


def test_lookup_is_exact_and_the_first_chunk_stays_native() -> None:
    step = _step()
    other = _step(position=256)  # another geometry: no nearest-cell fallback
    assert choose_mixed(other, _survivals(other, 0.3), _table(step)).reason == "no_cell"
    first = _step(position=0)
    choice = choose_mixed(first, _survivals(first, 0.3), _table(first))
    assert choice.reason == "first_chunk" and choice.capacity is None and choice.covered
    assert choose_mixed(step, _survivals(step, 0.3), None).reason == "no_cell"


def test_high_acceptance_keeps_native_and_ties_prefer_the_smaller_capacity() -> None:
    step = _step()
    # survivals near 1: the full window's yield beats the cheaper step
    assert choose_mixed(step, _survivals(step, 0.99), _table(step, cand_ms={48: 9.5, 64: 9.5})).reason == (
        "native_score"
    )
    _, geos = step_candidates(step.features(K), K, ROUTE.body_buckets)
    caps = sorted(g.capacity for g in geos)
    if len(caps) >= 2:
        # zero survivals: every candidate yields the same; equal costs tie, the smaller capacity wins
        choice = choose_mixed(step, _survivals(step, 0.0), _table(step))
        assert choice.capacity == caps[0]


def test_admission_summary_records_the_mixed_decision(mixed_dep8: MixedBundle) -> None:
    d = _admit(mixed_dep8)
    doc = json.loads(json.dumps(d.to_dict()))
    assert doc["mixed"]["reason_code"] == "OK" and doc["mixed"]["cells"] == d.mixed.cells
