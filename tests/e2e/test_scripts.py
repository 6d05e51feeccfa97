"""The benchmark scripts run as files (``python benchmarks/e2e/mixed.py``), not only as modules.

A script started by path has no parent package, so a relative import anywhere in its own file (at
module level or inside a function reached later) fails with ``ImportError`` only when that line
runs, possibly minutes into a GPU job. The modules a script imports may use relative imports; the
script file itself must not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _scripts() -> list[Path]:
    out = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        if 'if __name__ == "__main__"' in path.read_text(encoding="utf-8"):
            out.append(path)
    return out


def relative_imports(source: str) -> list[int]:
    """Line numbers of every relative ``from . import`` in ``source``."""
    return [n.lineno for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom) and n.level > 0]


def test_the_benchmark_scripts_are_found() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in _scripts()}
    assert {"benchmarks/e2e/mixed.py", "benchmarks/e2e/run.py", "benchmarks/device_planner.py"} <= names


@pytest.mark.parametrize("path", _scripts(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_script_file_has_no_relative_import(path: Path) -> None:
    lines = relative_imports(path.read_text(encoding="utf-8"))
    assert not lines, (
        f"{path.relative_to(ROOT)}: relative import on line(s) {lines}; run as a file it has no package"
    )


def test_the_check_finds_a_relative_import_inside_a_function() -> None:
    src = "import os\n\ndef main():\n    from .mixed_graphs import MixedSteps\n    return MixedSteps\n"
    assert relative_imports(src) == [4]
    assert relative_imports("from benchmarks.e2e.mixed_graphs import MixedSteps\n") == []
