"""Imports point down (STYLE rule 1): cli → calibrate → runtime_plugin → artifacts → schemas.

calibrate may use runtime_plugin's pure selector (replay must run the runtime's own semantics);
runtime_plugin never imports calibrate, except the sentinel's lazy backend import.

Static checks read every module's imports with ``ast``; dynamic checks import subpackages in a fresh
interpreter and look at ``sys.modules``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "dspark_calibrate"

#: What each layer may import from the package (besides itself and ``errors``).
ALLOWED: dict[str, set[str]] = {
    "schemas": set(),
    "errors": set(),
    "decision": set(),
    "artifacts": {"schemas"},
    "calibrate": {"schemas", "artifacts", "runtime_plugin"},
    "runtime_plugin": {"schemas", "artifacts"},
    "cli": {"schemas", "artifacts", "calibrate", "runtime_plugin"},
}
#: Deliberate exceptions, each with its reason.
EXCEPTIONS: dict[str, set[str]] = {
    # The sentinel re-measures cells through a sweep backend, imported lazily only when enabled.
    "runtime_plugin/sentinel.py": {"calibrate"},
}


def _layer(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".py")


def _imported_layers(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "dspark_calibrate" and len(parts) > 1:
                out.add(parts[1])
    return out


MODULES = sorted(p for p in SRC.rglob("*.py") if _layer(p) in ALLOWED)


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(SRC)) for p in MODULES])
def test_imports_point_down(path: Path) -> None:
    layer = _layer(path)
    rel = str(path.relative_to(SRC))
    allowed = ALLOWED[layer] | {layer, "errors", "decision", "__init__"} | EXCEPTIONS.get(rel, set())
    if layer in ("schemas", "errors", "decision"):
        allowed = {layer}
    bad = _imported_layers(path) - allowed
    assert not bad, f"{rel} imports {sorted(bad)}; {layer} may import only {sorted(allowed)}"


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_runtime_plugin_import_is_light() -> None:
    proc = _fresh(
        """
        import sys
        import dspark_calibrate.runtime_plugin
        heavy = [m for m in ("torch", "pandas", "matplotlib", "dspark_calibrate.calibrate") if m in sys.modules]
        print(",".join(heavy))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"runtime_plugin pulled in {proc.stdout.strip()}"


def test_calibrate_imports_without_cryptography() -> None:
    proc = _fresh(
        """
        import sys, importlib.abc
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("cryptography", "securesystemslib", "tuf"):
                    raise ImportError(f"blocked: {name}")
                return None
        sys.meta_path.insert(0, Block())
        import dspark_calibrate.calibrate
        import dspark_calibrate.artifacts as a
        # unsigned artifacts can still be written and read
        import pyarrow as pa, tempfile, pathlib
        from dspark_calibrate.schemas import arrow_schema
        t = pa.Table.from_pylist([{"position": 1, "method": "sts", "temperature": 1.0, "params": [1.0],
            "risk_set_size": 1, "holdout_risk_set_size": 1, "nll_before": None, "nll_after": None,
            "brier_before": None, "brier_after": None, "ece_before": None, "ece_after": None}],
            schema=arrow_schema("calibration"))
        p = pathlib.Path(tempfile.mkdtemp()) / "c.parquet"
        a.write_unsigned_artifact(p, t, kind="calibration", fingerprint=a.Fingerprint(max_draft_len=1),
                                  provenance=a.Provenance(tool_version="t"))
        assert a.read_artifact(p).kind == "calibration"
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
