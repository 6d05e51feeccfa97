"""build: the workload's rows are decoded and grouped once; the replay derives the deployed evidence
from the candidates' and publishes what a fresh evaluation of the deployed cells would."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from dspark_calibrate.calibrate.deployment.build import BuildResult, build_bundle, load_build_inputs
from dspark_calibrate.calibrate.deployment.cells import CellGrid
from dspark_calibrate.calibrate.deployment.replay import StepEvidence, prepare_evidence
from tests.calibrate.build_factories import BuildFiles, build_files, build_options
from tests.signing import make_root, make_signers

# The package exports functions named like these modules; take the modules themselves.
build_module = importlib.import_module("dspark_calibrate.calibrate.deployment.build")
replay_module = importlib.import_module("dspark_calibrate.calibrate.deployment.replay")


def _build(out: Path, files: BuildFiles, signers: tuple[Any, ...]) -> BuildResult:
    inputs = load_build_inputs([files.sweep], files.calibration, files.workload)
    return build_bundle(inputs, out, signers=signers, trust_root=make_root(signers), options=build_options())


def test_a_build_groups_the_rows_once_and_replays_as_a_fresh_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = build_files(tmp_path / "inputs")
    signers = make_signers(tmp_path / "keys", 1)  # one key: the two bundles' bytes are comparable
    ladders: list[tuple[int, ...]] = []
    grouped = replay_module._prepare_rows

    def counting(*args: Any, **kwargs: Any) -> Any:
        ladders.append(args[1].ladder)
        return grouped(*args, **kwargs)

    monkeypatch.setattr(replay_module, "_prepare_rows", counting)
    once = _build(tmp_path / "once", files, signers)
    assert len(ladders) == 1

    # What the build did before: evaluate the deployed grid from the workload again.
    def fresh(candidates: StepEvidence, final: CellGrid) -> StepEvidence:
        src = candidates.source
        assert src is not None
        return prepare_evidence(
            src.rows.workload, final, src.calibration, min_verify_len=candidates.min_verify_len, per_row=True
        )

    monkeypatch.setattr(build_module, "deployed_evidence", fresh)
    twice = _build(tmp_path / "twice", files, signers)
    assert len(ladders) == 3 and ladders[1] == ladders[2]
    a, b = once.to_dict(), twice.to_dict()
    for key in ("replay", "selection", "summary", "notes"):
        assert a[key] == b[key], key
    members = sorted(p.relative_to(once.out_dir) for p in once.out_dir.rglob("*.parquet"))
    assert members and members == sorted(
        p.relative_to(twice.out_dir) for p in twice.out_dir.rglob("*.parquet")
    )
    for m in members:
        assert (once.out_dir / m).read_bytes() == (twice.out_dir / m).read_bytes(), m
