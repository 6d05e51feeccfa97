"""Function length across the package: few functions over 80 lines, none new over 150.

A function's length is counted with ``ast``: ``end_lineno - lineno + 1`` of its ``def``, so the
signature and docstring count and decorators do not. Methods and nested functions count as
functions of their own (a nested function's lines also count toward the function around it).

Both limits are ratchets: :data:`MAX_OVER_80` is the number of functions over 80 lines today and
may only go down, and :data:`OVER_150` lists the functions over 150 lines today with their length;
none may grow, none may be added, and one that shrinks below 150 leaves the list.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "dspark_calibrate"

#: The longest a function should be (lines).
LONG = 80
#: The longest any function may be (lines), apart from the listed ones.
TOO_LONG = 150
#: Functions over :data:`LONG` lines in the package, at most.
MAX_OVER_80 = 1
#: Functions over :data:`TOO_LONG` lines that predate this test: "path:qualname" -> lines, at most.
OVER_150: dict[str, int] = {}


@dataclass(frozen=True, slots=True)
class Function:
    """One function of the package and its length."""

    key: str  # "path/under/src.py:Qualified.name"
    lines: int


def function_lengths(tree: ast.AST, path: str) -> list[Function]:
    """Every function and method in ``tree``, nested ones included, with its length in lines."""
    out: list[Function] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                assert child.end_lineno is not None
                name = prefix + child.name
                out.append(Function(f"{path}:{name}", child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def package_functions() -> list[Function]:
    """Every function of ``src/dspark_calibrate``."""
    out: list[Function] = []
    for path in sorted(SRC.rglob("*.py")):
        out += function_lengths(ast.parse(path.read_text(encoding="utf-8")), path.relative_to(SRC).as_posix())
    return out


def _listing(functions: list[Function]) -> str:
    return "\n".join(f"  {f.lines:4d}  {f.key}" for f in sorted(functions, key=lambda f: (-f.lines, f.key)))


def test_counting_rule() -> None:
    source = '''
@decorator
def top(a,
        b):
    """Doc."""
    def inner():
        return 1
    return inner


class C:
    async def method(self):
        pass
'''
    got = {f.key: f.lines for f in function_lengths(ast.parse(source), "m.py")}
    assert got == {"m.py:top": 6, "m.py:top.<locals>.inner": 2, "m.py:C.method": 2}


def test_few_functions_over_80_lines() -> None:
    long = [f for f in package_functions() if f.lines > LONG]
    assert len(long) <= MAX_OVER_80, (
        f"{len(long)} functions are over {LONG} lines, at most {MAX_OVER_80} may be; split the new "
        f"ones into helpers that each do one thing:\n{_listing(long)}"
    )


def test_no_function_over_150_lines() -> None:
    too_long = [f for f in package_functions() if f.lines > TOO_LONG]
    new = [f for f in too_long if f.key not in OVER_150]
    grown = [f for f in too_long if f.key in OVER_150 and f.lines > OVER_150[f.key]]
    assert not new, f"functions over {TOO_LONG} lines; split them:\n{_listing(new)}"
    assert not grown, f"functions over {TOO_LONG} lines that grew; split them:\n{_listing(grown)}"
    fixed = sorted(set(OVER_150) - {f.key for f in too_long})
    assert not fixed, f"no longer over {TOO_LONG} lines (or gone); remove them from OVER_150: {fixed}"
