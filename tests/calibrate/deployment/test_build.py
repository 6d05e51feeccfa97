"""build: inputs cross-checked, cells selected from the measured set, signed, verified, atomic."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from dspark_calibrate.artifacts import Expectation, read_artifact, verify_bundle
from dspark_calibrate.calibrate.deployment.build import (
    ADMISSION_PREDICTION_KEYS,
    ADMISSION_SUMMARY_KEYS,
    DRAIN_GUARD_SUMMARY_KEYS,
    PER_BUCKET_KEYS,
    BuildResult,
    build_bundle,
    load_build_inputs,
)
from dspark_calibrate.calibrate.deployment.select_cells import SelectionRefused
from dspark_calibrate.calibrate.deployment.workload import synthesize_workload, write_workload
from dspark_calibrate.cli import build_calibrate_app
from dspark_calibrate.errors import ConfigError
from tests.calibrate.build_factories import (
    BuildFiles,
    build_files,
    build_options,
    sweep_rows,
    write_calibration,
    write_sweep,
)
from tests.factories import NOW, make_fingerprint, make_provenance
from tests.signing import make_root, make_signers

LATER = NOW + timedelta(hours=1)


@dataclass(frozen=True)
class Keys:
    signers: tuple[Any, ...]
    root: Any
    key_file: Path
    root_file: Path


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    tmp = tmp_path_factory.mktemp("keys")
    signers = make_signers(tmp, 1)
    root = make_root(signers)
    (tmp / "root.json").write_bytes(root.to_bytes())
    return Keys(signers, root, tmp / "k0.pem", tmp / "root.json")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> BuildFiles:
    return build_files(tmp_path_factory.mktemp("inputs"))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, files: BuildFiles, keys: Keys) -> BuildResult:
    out = tmp_path_factory.mktemp("out") / "bundle"
    inputs = load_build_inputs([files.sweep], files.calibration, files.workload)
    return build_bundle(
        inputs, out, signers=keys.signers, trust_root=keys.root, options=build_options(plots=True)
    )


def test_bundle_verifies_and_binds_the_deployment(built: BuildResult, keys: Keys) -> None:
    report = verify_bundle(
        built.out_dir, keys.root, now=LATER, expected=Expectation(fingerprint=make_fingerprint())
    )
    assert report.ok, report.message
    assert set(report.members) == {"cost-table", "calibration", "admission"}
    assert built.bundle.ok and built.summary["admitted"]
    leftovers = [p.name for p in built.out_dir.parent.iterdir() if p.name.startswith(".")]
    assert leftovers == []
    assert {p.name for p in built.plots} == {"value_per_cell.png", "predicted_gain.png"}
    assert json.loads((built.out_dir / "report" / "build.json").read_text())["valid"] is True


def test_summary_has_exactly_the_runtime_and_prediction_keys(built: BuildResult, keys: Keys) -> None:
    adm = verify_bundle(built.out_dir, keys.root, now=LATER).artifact("admission")
    assert adm is not None
    summary = dict(adm.summary)
    assert sorted(summary) == sorted(ADMISSION_SUMMARY_KEYS + ADMISSION_PREDICTION_KEYS)
    assert summary["objective"] in ("throughput", "latency")
    assert summary["regime"] in ("saturated", "arrival-bound")
    assert set(summary["predictions"]) == {"throughput", "latency"}
    assert summary["predictions"][summary["objective"]]["gain"] == pytest.approx(summary["predicted_gain"])
    assert set(summary["drain_guard"]) == set(DRAIN_GUARD_SUMMARY_KEYS)
    assert all(set(b) == set(PER_BUCKET_KEYS) for b in summary["per_bucket"])
    assert summary["net_value_ms"] == pytest.approx(
        summary["gross_compact_value_ms_lower_bound"]
        - summary["policy_steps"] * summary["fixed_confidence_path_overhead_ms_upper_bound"]
        - summary["safety_margin_ms"]
    )
    assert summary["admitted"] == (summary["compact_choices"] > 0 and summary["net_value_ms"] > 0)


def test_cost_table_is_the_measured_cells(built: BuildResult, files: BuildFiles, keys: Keys) -> None:
    sweep = {
        (r["graph_batch_size"], r["verifier_budget"]): r for r in read_artifact(files.sweep).table.to_pylist()
    }
    ct = verify_bundle(built.out_dir, keys.root, now=LATER).artifact("cost-table")
    assert ct is not None
    rows = ct.table.to_pylist()
    cells = {(r["graph_batch_size"], r["verifier_budget"]) for r in rows}
    assert cells == {(g, 0) for g in (8, 16, 32)} | set(built.selection.cells)
    for r in rows:
        src = sweep[(r["graph_batch_size"], r["verifier_budget"])]
        assert all(
            r[k] == src[k] for k in ("step_time_ms", "ci_low_ms", "ci_high_ms", "source_result_sha256")
        )
        assert r["verifier_budget"] != r["graph_batch_size"]  # V=G is never deployed
    adm = read_artifact(built.out_dir / "admission.parquet").table.to_pylist()
    assert {(r["graph_batch_size"], r["verifier_budget"]) for r in adm} == cells
    prov = ct.provenance
    assert prov.extra["selection"]["decision"]["status"] == "ACCEPT" and not prov.synthetic


# --- refused inputs (nothing is built) ---------------------------------------------------------


def _mutate(tmp: Path, files: BuildFiles, what: str) -> tuple[list[Path], Path, Path]:
    sweeps, cal, wl = [files.sweep], files.calibration, files.workload
    if what == "calibration K":
        cal = write_calibration(tmp / "c4.parquet", temperatures=(1.2, 1.3, 1.4, 1.5))
    elif what == "calibration of another deployment":
        cal = write_calibration(
            tmp / "cx.parquet", fingerprint=make_fingerprint(model_config_sha256="d" * 64)
        )
    elif what == "workload of another K":
        wl = tmp / "w4.parquet"
        write_workload(wl, synthesize_workload(k=4, steps=20, max_rows=8))
    elif what == "G without native cell":
        sweeps = [
            write_sweep(
                tmp / "s.parquet",
                [r for r in sweep_rows() if (r["graph_batch_size"], r["verifier_budget"]) != (16, 0)],
            )
        ]
    elif what == "sweeps of two deployments":
        sweeps.append(
            write_sweep(tmp / "s2.parquet", sweep_rows((8,)), fingerprint=make_fingerprint(gpu="H100"))
        )
    elif what == "fingerprint lacks engine fields":
        sweeps = [
            write_sweep(tmp / "s3.parquet", sweep_rows(), fingerprint=make_fingerprint(source_head=None))
        ]
    elif what == "G outside the ladder":
        sweeps = [write_sweep(tmp / "s4.parquet", sweep_rows((8, 16, 32, 64)))]
    elif what == "not a sweep":
        sweeps = [cal]
    return sweeps, cal, wl


INPUT_CASES = [
    ("calibration K", r"covers positions \[1, 2, 3, 4\], the deployment has K=5"),
    ("calibration of another deployment", r"fitted for another deployment \(model_config_sha256"),
    ("workload of another K", "K=4 logits per row, the deployment has K=5"),
    ("G without native cell", r"G \[16\] has no measured native cell"),
    ("sweeps of two deployments", "sweep of another deployment"),
    ("fingerprint lacks engine fields", "lacks source_head"),
    ("G outside the ladder", "outside the fingerprint ladder"),
    ("not a sweep", "expected 'sweep'"),
]


@pytest.mark.parametrize(("what", "match"), INPUT_CASES, ids=[c[0] for c in INPUT_CASES])
def test_bad_inputs_are_refused(tmp_path: Path, files: BuildFiles, what: str, match: str) -> None:
    sweeps, cal, wl = _mutate(tmp_path, files, what)
    with pytest.raises(ConfigError, match=match):
        load_build_inputs(sweeps, cal, wl)


def test_synthetic_inputs_need_permission(tmp_path: Path, files: BuildFiles, keys: Keys) -> None:
    synthetic_sweep = write_sweep(
        tmp_path / "s.parquet", sweep_rows(), provenance=make_provenance(synthetic=True)
    )
    inputs = load_build_inputs([synthetic_sweep], files.calibration, files.workload)
    assert inputs.synthetic
    with pytest.raises(ConfigError, match="--allow-synthetic"):
        build_bundle(
            inputs, tmp_path / "b", signers=keys.signers, trust_root=keys.root, options=build_options()
        )
    assert not (tmp_path / "b").exists()


def test_flat_table_builds_nothing(tmp_path: Path, files: BuildFiles, keys: Keys) -> None:
    flat = write_sweep(tmp_path / "flat.parquet", sweep_rows(flat=True))
    inputs = load_build_inputs([flat], files.calibration, files.workload)
    with pytest.raises(SelectionRefused, match="flat"):
        build_bundle(
            inputs, tmp_path / "b", signers=keys.signers, trust_root=keys.root, options=build_options()
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flat.parquet"]


def test_untrusted_key_fails_the_self_check_and_leaves_nothing(
    tmp_path: Path, files: BuildFiles, keys: Keys
) -> None:
    stranger = make_signers(tmp_path / "k", 1, prefix="x")
    inputs = load_build_inputs([files.sweep], files.calibration, files.workload)
    out = tmp_path / "out" / "bundle"
    out.parent.mkdir()
    with pytest.raises(ConfigError, match="self-check failed"):
        build_bundle(inputs, out, signers=stranger, trust_root=keys.root, options=build_options())
    assert list(out.parent.iterdir()) == []


def test_existing_output_needs_force(tmp_path: Path, files: BuildFiles, keys: Keys) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "old.txt").write_text("old")
    inputs = load_build_inputs([files.sweep], files.calibration, files.workload)
    with pytest.raises(ConfigError, match="pass --force"):
        build_bundle(inputs, out, signers=keys.signers, trust_root=keys.root, options=build_options())
    res = build_bundle(
        inputs, out, signers=keys.signers, trust_root=keys.root, options=build_options(force=True, version=2)
    )
    assert res.bundle.ok and not (out / "old.txt").exists()
    with pytest.raises(ConfigError, match="--expires"):
        replace(build_options(), expires_at=NOW)


# --- CLI ---------------------------------------------------------------------------------------


def _cli_args(files: BuildFiles, keys: Keys, out: Path, *extra: str) -> list[str]:
    return [
        "build",
        "--sweep",
        str(files.sweep),
        "--calibration",
        str(files.calibration),
        "--workload",
        str(files.workload),
        "--key",
        str(keys.key_file),
        "--trust-root",
        str(keys.root_file),
        "--out",
        str(out),
        "--version",
        "1",
        "--resamples",
        "100",
        "--no-plots",
        *extra,
    ]


def test_cli_build_json(tmp_path: Path, files: BuildFiles, keys: Keys) -> None:
    res = CliRunner().invoke(build_calibrate_app(), _cli_args(files, keys, tmp_path / "b", "--json"))
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["valid"] is True and doc["summary"]["admitted"] is True
    assert doc["selection"]["decision"]["status"] == "ACCEPT"


def test_cli_build_table_and_refusals(tmp_path: Path, files: BuildFiles, keys: Keys) -> None:
    runner = CliRunner()
    ok = runner.invoke(build_calibrate_app(), _cli_args(files, keys, tmp_path / "b"))
    assert ok.exit_code == 0, ok.output
    assert "predicted gain" in ok.stdout and "deployed compact cells" in ok.stdout
    flat = write_sweep(tmp_path / "flat.parquet", sweep_rows(flat=True))
    rejected = runner.invoke(
        build_calibrate_app(),
        _cli_args(BuildFiles(flat, files.calibration, files.workload), keys, tmp_path / "c"),
    )
    assert rejected.exit_code == 1 and "flat" in rejected.stderr
    missing = runner.invoke(
        build_calibrate_app(),
        _cli_args(
            BuildFiles(tmp_path / "nope.parquet", files.calibration, files.workload), keys, tmp_path / "d"
        ),
    )
    assert missing.exit_code == 2 and "cannot read" in missing.stderr
    expensive = runner.invoke(
        build_calibrate_app(), _cli_args(files, keys, tmp_path / "e", "--overhead-ms", "50")
    )
    assert expensive.exit_code == 1 and "NOT ADMITTED" in expensive.stderr
    assert (tmp_path / "e" / "bundle.dsse.json").exists()


# --- the overhead's evidence and the uncertainty model (DESIGN §9) -----------------------------


def _build(tmp: Path, keys: Keys, sweep: Path, files: BuildFiles, **options: Any) -> BuildResult:
    inputs = load_build_inputs([sweep], files.calibration, files.workload)
    return build_bundle(
        inputs, tmp / "b", signers=keys.signers, trust_root=keys.root, options=build_options(**options)
    )


def test_the_forced_k_arm_is_the_default_overhead_and_its_source_is_signed(
    tmp_path: Path, files: BuildFiles, keys: Keys
) -> None:
    sweep = write_sweep(tmp_path / "s.parquet", sweep_rows(forced_k_rel=0.01))
    result = _build(tmp_path, keys, sweep, files)
    e = result.report.economics
    assert e.overhead_source.startswith("measured: forced-K arms")
    # The arms cost 1% of each native step (+-0.2% paired): the bound lies above the point.
    natives = {8: 0.0, 16: 0.0, 32: 0.0}
    for r in sweep_rows():
        if r["verifier_budget"] == 0:
            natives[r["graph_batch_size"]] = r["step_time_ms"]
    assert (
        0.01 * min(natives.values())
        < e.fixed_confidence_path_overhead_ms_upper_bound
        < 0.013 * max(natives.values())
    )
    ct = verify_bundle(result.out_dir, keys.root, now=LATER).artifact("cost-table")
    assert ct is not None
    assert all(r["verifier_budget"] >= 0 for r in ct.table.to_pylist())  # the arm is never deployed
    extra = ct.provenance.extra
    assert extra["economics_sources"]["overhead"] == e.overhead_source
    assert [a["graph_batch_size"] for a in extra["forced_k_arms"]] == [8, 16, 32]
    assert extra["uncertainty_model"].startswith("joint")


def test_a_given_overhead_records_where_it_came_from(tmp_path: Path, files: BuildFiles, keys: Keys) -> None:
    result = _build(
        tmp_path, keys, files.sweep, files, overhead_ms=0.05, overhead_source="measured: serving-loop bracket"
    )
    e = result.report.economics
    assert e.fixed_confidence_path_overhead_ms_upper_bound == 0.05
    assert e.overhead_source == "measured: serving-loop bracket"
    prov = verify_bundle(result.out_dir, keys.root, now=LATER).artifact("admission")
    assert prov is not None and prov.provenance.extra["build_options"]["overhead_source"] == e.overhead_source


def test_a_pre_pairing_sweep_is_priced_the_old_way_and_says_so(
    tmp_path: Path, files: BuildFiles, keys: Keys
) -> None:
    paired = _build(tmp_path / "p", keys, files.sweep, files)
    legacy_sweep = write_sweep(tmp_path / "legacy.parquet", sweep_rows(paired=False))
    legacy = _build(tmp_path / "l", keys, legacy_sweep, files)
    assert legacy.report.uncertainty_model.startswith("legacy")
    assert any(n.startswith("LEGACY_UNPAIRED_COSTS") for n in legacy.notes)
    assert not any(n.startswith("LEGACY_UNPAIRED_COSTS") for n in paired.notes)
    # The per-step worst case of two unpaired intervals throws away value the pairing keeps.
    assert (
        legacy.report.economics.gross_compact_value_ms_lower_bound
        < paired.report.economics.gross_compact_value_ms_lower_bound
    )
    ct = verify_bundle(legacy.out_dir, keys.root, now=LATER).artifact("cost-table")
    assert ct is not None and {r["paired_rounds"] for r in ct.table.to_pylist()} == {0}
