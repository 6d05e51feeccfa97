"""The report's code stays readable: no function of the report package or its command is longer
than 80 lines (signature and decorators included), counted with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src" / "dspark_calibrate"
FILES = [*sorted((SRC / "calibrate" / "report").glob("*.py")), SRC / "cli" / "report.py"]
MAX_FUNCTION_LINES = 80


def _long_functions(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            length = (node.end_lineno or node.lineno) - start + 1
            if length > MAX_FUNCTION_LINES:
                out.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_report_function_is_longer_than_80_lines() -> None:
    assert len(FILES) >= 7
    long = [entry for path in FILES for entry in _long_functions(path)]
    assert not long, "split these functions:\n" + "\n".join(long)
