"""build with a mixed sweep: mixed steps priced in the same joint replicates as decode steps,
the signed mixed evidence, its gates and result files, any world size."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from dspark_calibrate.artifacts import (
    read_artifact,
    sha256_hex,
    verify_bundle,
    verify_mixed,
    write_unsigned_artifact,
)
from dspark_calibrate.calibrate.deployment.build import build_bundle, load_build_inputs
from dspark_calibrate.calibrate.deployment.cells import CellGrid
from dspark_calibrate.calibrate.deployment.mixed import MixedGrid
from dspark_calibrate.calibrate.deployment.mixed_build import MIXED_MINIMUM_GAIN, deploy_mixed
from dspark_calibrate.calibrate.deployment.replay import (
    BootstrapSettings,
    estimate_drain_guard,
    prepare_evidence,
    replay,
)
from dspark_calibrate.calibrate.deployment.workload import read_workload
from dspark_calibrate.calibrate.measurement.backends.synthetic import SyntheticModel
from dspark_calibrate.calibrate.measurement.mixed import plan_from_workload
from dspark_calibrate.errors import ConfigError
from dspark_calibrate.runtime_plugin.planner import Calibration
from dspark_calibrate.schemas import MIXED_GATES, MIXED_RESULT_FILES
from tests.calibrate.build_factories import build_options
from tests.mixed_bundles import LATER, MixedBundle
from tests.signing import make_root, make_signers

ECONOMICS = (
    "policy_steps",
    "compact_choices",
    "gross_compact_value_ms_lower_bound",
    "fixed_confidence_path_overhead_ms_upper_bound",
    "safety_margin_ms",
)


@pytest.mark.parametrize("name", ["mixed_dep8", "mixed_tp1"])
def test_mixed_evidence_is_built_signed_and_verified(name: str, request: pytest.FixtureRequest) -> None:
    b: MixedBundle = request.getfixturevalue(name)
    decode = verify_bundle(b.bundle, b.root, now=LATER, expected=_allow())
    mixed = verify_mixed(b.bundle, b.root, now=LATER, decode=decode, expected=_allow())
    assert decode.ok and mixed.ok, mixed.message
    s = b.result.mixed_summary
    assert s is not None and s["route"]["world_size"] == b.files.route.world_size
    # every gate true, each backed by a result file in the bundle with the pinned hash
    assert s["gates"] == {g: True for g in MIXED_GATES}
    for key, rel in MIXED_RESULT_FILES.items():
        data = (b.bundle / "mixed" / rel).read_bytes()
        assert sha256_hex(data) == s["results"][key], key
    # the economics charge the overhead on every policy step (decode and mixed alike)
    e = {k: s[k] for k in ECONOMICS}
    assert e["policy_steps"] == b.result.summary["policy_steps"]
    net = (
        e["gross_compact_value_ms_lower_bound"]
        - e["policy_steps"] * e["fixed_confidence_path_overhead_ms_upper_bound"]
        - e["safety_margin_ms"]
    )
    assert net == pytest.approx(s["net_value_ms"]) and (net > 0) == s["admitted"]
    assert 0 < e["compact_choices"] <= e["policy_steps"]
    # one policy over the whole workload: decode steps and mixed steps split it
    d, m = s["decode_part"], s["mixed_part"]
    assert d["steps"] + m["steps"] == m["workload_steps"] == e["policy_steps"]
    assert 0.4 < m["share"] < 0.6  # the workload's prefill share
    for part in (s, d, m):
        lo = part.get("predicted_gain_ci_low", part.get("ci_low"))
        hi = part.get("predicted_gain_ci_high", part.get("ci_high"))
        assert lo <= part["predicted_gain"] <= hi
    # the decode-only policy is the decode bundle's own summary: mixed evidence does not change it
    assert b.result.summary["admitted"] in (True, False)
    assert s["decode_members"] == {
        k: r.artifact.logical_sha256 for k, r in decode.members.items() if r.artifact
    }


def _allow() -> Any:
    from dspark_calibrate.artifacts import Expectation

    return Expectation(allow_synthetic=True)


def test_selector_replay_binds_the_mixed_decisions(mixed_tp1: MixedBundle) -> None:
    """The selector replay file is the mixed selector's decisions; its hash is the receipt's."""
    data = (mixed_tp1.bundle / "mixed" / MIXED_RESULT_FILES["selector_replay"]).read_bytes()
    assert data and sha256_hex(data) == mixed_tp1.result.mixed_summary["results"]["selector_replay"]
    accuracy = json.loads((mixed_tp1.bundle / "mixed" / MIXED_RESULT_FILES["accuracy"]).read_bytes())
    assert accuracy["pass"] is True and accuracy["cells"]


def _rewrite(b: MixedBundle, tmp: Path, change: Callable[[dict[str, Any], Mapping[int, Any]], None]) -> Path:
    """A copy of the mixed sweep whose summary rows were changed by ``change(row, groups)``."""
    tmp.mkdir(parents=True, exist_ok=True)
    loaded = read_artifact(b.files.mixed_sweep)
    prov = loaded.provenance_untrusted()
    shutil.copyfile(
        b.files.mixed_sweep.with_name(prov.extra["samples_file"]), tmp / Path(prov.extra["samples_file"]).name
    )
    wl = read_workload(b.files.workload, k=b.files.route.physical_k)
    plan = plan_from_workload(wl, b.files.route)
    groups = {g.index: g for g in plan.groups}
    rows = loaded.table.to_pylist()
    for r in rows:
        change(r, groups)
    import pyarrow as pa

    out = tmp / b.files.mixed_sweep.name
    write_unsigned_artifact(
        out,
        pa.Table.from_pylist(rows, schema=loaded.table.schema),
        kind="mixed-sweep",
        fingerprint=loaded.fingerprint_untrusted(),
        provenance=prov,
        summary=loaded.metadata["summary"],
    )
    return out


def _build(b: MixedBundle, mixed_sweep: Path, out: Path) -> Any:
    signers = make_signers(out.parent / "keys", 1)
    return build_bundle(
        load_build_inputs([b.files.sweep], b.files.calibration, b.files.workload, mixed_sweep=mixed_sweep),
        out,
        signers=signers,
        trust_root=make_root(signers),
        options=build_options(allow_synthetic=True),
    )


def test_the_mixed_gain_interval_covers_the_true_gain(mixed_tp1: MixedBundle, tmp_path: Path) -> None:
    """The same build with every mixed arm at the synthetic model's noise-free time (intervals
    kept, so the same cells deploy) lands inside the measured build's mixed-part interval."""
    model = SyntheticModel(**mixed_tp1.files.model)
    route = mixed_tp1.files.route

    def truth(r: dict[str, Any], groups: Mapping[int, Any]) -> None:
        g = groups[r["mixed_group"]]
        t = model.mixed_expected_ms(g.shape(r["capacity"], 0, route))
        t0 = model.mixed_expected_ms(g.shape(0, 0, route))
        shift = t - r["step_time_ms"]
        r.update(step_time_ms=t, ci_low_ms=r["ci_low_ms"] + shift, ci_high_ms=r["ci_high_ms"] + shift)
        if r["capacity"]:
            s = 1 - t / t0
            r.update(
                saving=s,
                saving_ci_low=r["saving_ci_low"] + s - r["saving"],
                saving_ci_high=r["saving_ci_high"] + s - r["saving"],
            )

    exact = _build(mixed_tp1, _rewrite(mixed_tp1, tmp_path / "truth", truth), tmp_path / "b" / "bundle")
    measured = mixed_tp1.result.mixed_summary["mixed_part"]
    true_part = exact.mixed_summary["mixed_part"]
    assert true_part["compact_choices"] == pytest.approx(measured["compact_choices"], rel=0.1)
    assert measured["ci_low"] <= true_part["predicted_gain"] <= measured["ci_high"], (measured, true_part)


def _mixed_replays(b: MixedBundle, half: float) -> tuple[Any, Any]:
    """The build's replay of the fixture's deployed mixed cells, as measured and with every
    deployed cell's saving interval ``half`` wider on each side; the runtime's bounds and hence
    every decision are the measured ones in both."""
    inputs = load_build_inputs(
        [b.files.sweep], b.files.calibration, b.files.workload, mixed_sweep=b.files.mixed_sweep
    )
    assert inputs.mixed is not None
    grid = MixedGrid.from_rows(inputs.mixed.rows, inputs.mixed.route, inputs.mixed.protocol_sha256)
    calibration = Calibration.from_rows(inputs.calibration_table.to_pylist())
    _, _, mixed = deploy_mixed(inputs.workload, grid, calibration, minimum_predicted_gain=MIXED_MINIMUM_GAIN)
    wide = tuple(
        dataclasses.replace(
            c,
            time=dataclasses.replace(
                c.time, saving_ci_low=c.time.saving_ci_low - half, saving_ci_high=c.time.saving_ci_high + half
            ),
        )
        for c in mixed.deployed
    )
    evidence = prepare_evidence(
        inputs.workload, CellGrid.from_rows(inputs.k, inputs.sweep_rows), calibration, per_row=True
    )
    guard, _ = estimate_drain_guard(evidence, minimum_predicted_gain=0.0)
    out = []
    for ev in (mixed, dataclasses.replace(mixed, deployed=wide)):
        report = replay(
            evidence, drain_guard=guard, overhead_ms=0.0, bootstrap=BootstrapSettings(resamples=300), mixed=ev
        )
        assert report.mixed is not None
        out.append(report.mixed)
    return out[0], out[1]


def test_cost_uncertainty_widens_the_interval_in_the_same_draws(mixed_tp1: MixedBundle) -> None:
    """Wider mixed saving intervals widen the gain's interval and lower the gross value's bound;
    the point estimate is unchanged (one joint model, not a second one beside it). The runtime's
    decisions are held (its bounds follow the saving's lower end, ``paired_bounds``): only the
    pricing differs."""
    base, wide = _mixed_replays(mixed_tp1, 0.05)
    assert wide.economics.compact_choices == base.economics.compact_choices > 0
    width = lambda s: s["ci_high"] - s["ci_low"]  # noqa: E731
    assert wide.predicted_gain == pytest.approx(base.predicted_gain, rel=1e-9)
    assert width(wide.mixed_part) > 1.2 * width(base.mixed_part)
    assert (
        wide.economics.gross_compact_value_ms_lower_bound < base.economics.gross_compact_value_ms_lower_bound
    )


def test_a_mixed_sweep_of_another_deployment_is_refused(
    mixed_tp1: MixedBundle, mixed_dep8: MixedBundle
) -> None:
    with pytest.raises(ConfigError, match="mixed sweep of another deployment"):
        load_build_inputs(
            [mixed_tp1.files.sweep],
            mixed_tp1.files.calibration,
            mixed_tp1.files.workload,
            mixed_sweep=mixed_dep8.files.mixed_sweep,
        )


def test_without_a_mixed_sweep_mixed_steps_are_named_and_left_native(mixed_tp1: MixedBundle) -> None:
    inputs = load_build_inputs([mixed_tp1.files.sweep], mixed_tp1.files.calibration, mixed_tp1.files.workload)
    assert inputs.mixed is None
    assert any("no mixed sweep was given" in n for n in inputs.notes)


def test_nothing_deployable_writes_no_mixed_evidence(mixed_tp1: MixedBundle, tmp_path: Path) -> None:
    """A mixed sweep whose cells never save for sure: the bundle has no mixed/, decode unchanged."""

    def lose(r: dict[str, Any], groups: Mapping[int, Any]) -> None:
        if r["capacity"]:
            r.update(saving=-0.01, saving_ci_low=-0.02, saving_ci_high=0.0)

    out = tmp_path / "b" / "bundle"
    result = _build(mixed_tp1, _rewrite(mixed_tp1, tmp_path / "lose", lose), out)
    assert result.bundle.ok and not (out / "mixed").exists()
    assert any("no mixed cell is deployed" in n for n in result.notes)
    assert dataclasses.asdict(result.selection) == dataclasses.asdict(mixed_tp1.result.selection)
