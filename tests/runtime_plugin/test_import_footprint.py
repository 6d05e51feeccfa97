"""Importing the runtime plugin in a fresh interpreter stays light (DESIGN §3, STYLE rule 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import make_fingerprint
from tests.runtime_plugin.bundles import LATER, make_bundle
from tests.signing import make_root, make_signers

HEAVY = ("torch", "pandas", "matplotlib", "dspark_calibrate.calibrate")
MODULES = (
    "dspark_calibrate.runtime_plugin",
    "dspark_calibrate.runtime_plugin.admission",
    "dspark_calibrate.runtime_plugin.engine",
    "dspark_calibrate.runtime_plugin.ranks",
    "dspark_calibrate.runtime_plugin.sentinel",
    "dspark_calibrate.runtime_plugin.trtllm",
)


def _modules_after(code: str, tmp: Path) -> list[str]:
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, check=True, cwd=tmp, timeout=120
    )
    loaded: list[str] = json.loads(out.stdout.decode().strip().splitlines()[-1])
    return loaded


def _heavy(loaded: list[str]) -> list[str]:
    return sorted(m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("module", MODULES)
def test_import_pulls_in_nothing_heavy(module: str, tmp_path: Path) -> None:
    assert _heavy(_modules_after(f"import {module}", tmp_path)) == []


def test_admit_without_sentinel_pulls_in_nothing_heavy(tmp_path: Path) -> None:
    # The bundle is built here (pyarrow's from_pylist loads pandas). Admission itself loads neither
    # torch, matplotlib nor the calibration stack, nor pandas: pyarrow's to_numpy and fill_null
    # would import it (~0.4 s of CPU at every serving process's first admission), so the logical
    # hash and the content rules read Arrow buffers instead (artifacts/_arrow_numpy.py).
    keys = make_signers(tmp_path / "k", 1)
    bundle = make_bundle(tmp_path / "b", keys)
    root = tmp_path / "root.json"
    root.write_bytes(make_root(keys).to_bytes())
    code = f"""
from datetime import datetime
from dspark_calibrate.artifacts import Fingerprint
from dspark_calibrate.runtime_plugin.admission import admit
live = Fingerprint.from_dict({make_fingerprint().to_dict()!r})
now = datetime.fromisoformat({LATER.isoformat()!r})
assert admit({str(bundle)!r}, {str(root)!r}, live=live, now=now).active
"""
    assert _heavy(_modules_after(code, tmp_path)) == []
