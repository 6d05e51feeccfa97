"""Bundles with mixed evidence for tests, and helpers to change one and sign it again.

``build_mixed_bundle`` runs the real path (decode inputs of the staircase model, a workload with
prefill traffic, a synthetic mixed sweep of its mixed steps, ``build_bundle``) and returns where
everything is; ``copy_bundle`` gives a test its own copy to break, and ``resign_mixed`` signs a
changed mixed member and the mixed manifest again so that a case fails at its own check.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

from dspark_calibrate.artifacts import Expectation, logical_sha256, verify_path
from dspark_calibrate.artifacts._bundle import MIXED_LAYOUT, write_bundle
from dspark_calibrate.artifacts._mixed_bundle import MIXED_DIR, MIXED_FILES
from dspark_calibrate.calibrate.deployment.build import BuildResult, build_bundle, load_build_inputs
from tests.calibrate.build_factories import MixedFiles, build_options, mixed_files
from tests.factories import NOW
from tests.signing import make_root, make_signers, resign

#: Body buckets of the one-GPU test deployment (its generation rows and chunks fit below 192).
TP1_BUCKETS = (32, 48, 64, 96, 128, 192)
#: The one-GPU deployment's mixed step cost: rows cost more than on eight ranks' shared step.
TP1_MODEL = {"tile": 8, "per_tile_ms": 0.4, "mixed_per_row_ms": 0.05}
#: A time after the bundles were issued (they are issued at ``NOW``, valid 30 days).
LATER = NOW + timedelta(hours=1)


@dataclass(frozen=True)
class MixedBundle:
    """Where a built bundle with mixed evidence and its inputs and keys are."""

    files: MixedFiles
    bundle: Path
    result: BuildResult
    signers: tuple[Any, ...]
    root: Any
    root_file: Path
    key_file: Path


def build_mixed_bundle(
    tmp: Path,
    *,
    ranks: int,
    buckets: Sequence[int] | None = None,
    steps: int = 1000,
    seed: int = 0,
    model: Mapping[str, Any] | None = None,
) -> MixedBundle:
    files = mixed_files(tmp / "inputs", ranks=ranks, buckets=buckets, steps=steps, seed=seed, model=model)
    signers = make_signers(tmp / "keys", 1)
    root = make_root(signers)
    (tmp / "root.json").write_bytes(root.to_bytes())
    result = build_bundle(
        load_build_inputs([files.sweep], files.calibration, files.workload, mixed_sweep=files.mixed_sweep),
        tmp / "bundle",
        signers=signers,
        trust_root=root,
        options=build_options(allow_synthetic=True),
    )
    assert result.bundle.ok and result.mixed_valid and result.summary["admitted"], result.notes
    return MixedBundle(
        files, tmp / "bundle", result, signers, root, tmp / "root.json", tmp / "keys" / "k0.pem"
    )


def copy_bundle(source: MixedBundle, tmp: Path) -> Path:
    """A private copy of the bundle directory."""
    out = tmp / "bundle"
    shutil.copytree(source.bundle, out)
    return out


def remanifest(bundle: Path, signers: Sequence[Any], root: Any) -> None:
    """Sign the mixed manifest again over the members as they are now."""
    mixed = bundle / MIXED_DIR
    members = {}
    for kind, name in MIXED_FILES.items():
        report = verify_path(mixed / name, root, now=LATER, expected=Expectation(allow_synthetic=True))
        assert report.artifact is not None, report.message
        members[kind] = report.artifact
    write_bundle(
        mixed,
        members,
        list(signers),
        version=1,
        issued_at=NOW,
        expires_at=NOW + timedelta(days=30),
        layout=MIXED_LAYOUT,
    )


def resign_mixed(
    bundle: Path,
    kind: str,
    signers: Sequence[Any],
    root: Any,
    *,
    summary: Callable[[dict[str, Any]], None] | None = None,
    table: Callable[[pa.Table], pa.Table] | None = None,
) -> None:
    """Change a mixed member's signed summary and/or table, sign it and the manifest again."""
    path = bundle / MIXED_DIR / MIXED_FILES[kind]
    from dspark_calibrate.artifacts import read_artifact

    new_table = table(read_artifact(path).table) if table is not None else None

    def mutate(statement: dict[str, Any]) -> None:
        if summary is not None:
            summary(statement["predicate"]["summary"])
        if new_table is not None:
            statement["subject"][0]["digest"]["sha256"] = logical_sha256(new_table, kind)

    resign(path, signers, mutate, table=new_table)
    remanifest(bundle, signers, root)
