"""One home for every fact (DESIGN §3): no module-level constant is defined twice.

The scan reads every module of ``src/dspark_calibrate`` (its syntax tree; nothing is imported) and
collects the module-level assignments to UPPER_CASE or _UPPER_CASE names whose value is a literal:
a string, bytes, number, tuple, list, set or dict of literals, ``frozenset(...)`` or ``tuple(...)``
of one, ``MappingProxyType`` of a literal dict, or ``re.compile`` of a literal pattern. A constant
bound to another name (``MEMBER_KINDS = BUNDLE_KINDS``) or computed is a reference, not a second
definition, and is not collected. It fails when

- the same name is bound to a literal in two modules (whatever the values: two different
  ``_PRINTABLE`` regexes are a fact stated twice, or two facts sharing a name); or
- the same value is bound in two modules, under any names. Numbers, booleans and None are left
  out (``4``, ``0.05`` and ``True`` mean many unrelated things), and so are strings and bytes
  shorter than :data:`MIN_TEXT` characters (short labels like ``"sts"`` recur by coincidence).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "dspark_calibrate"
NAME = re.compile(r"^_?[A-Z][A-Z0-9_]*$")
#: Strings and bytes shorter than this are not compared by value.
MIN_TEXT = 4

Value = tuple[str, object]


def _literal(node: ast.expr) -> Value | None:
    """``(form, value)`` of a literal constant, or None for anything else."""
    if isinstance(node, ast.Call) and node.args and not node.keywords:
        func = node.func
        try:
            arg = ast.literal_eval(node.args[0])
        except ValueError:
            return None
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "compile"
            and getattr(func.value, "id", "") == "re"
        ):
            return ("re", arg)
        name = getattr(func, "id", "")
        if name == "frozenset" and len(node.args) == 1:
            return ("set", frozenset(arg))
        if name == "tuple" and len(node.args) == 1:
            return ("seq", tuple(arg))
        if name == "MappingProxyType" and isinstance(arg, dict):
            return ("map", tuple(sorted(arg.items(), key=repr)))
        return None
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return None
    if isinstance(value, list):
        return ("seq", tuple(value))
    if isinstance(value, set):
        return ("set", frozenset(value))
    if isinstance(value, dict):
        return ("map", tuple(sorted(value.items(), key=repr)))
    return ("lit", value)


def _compared_by_value(value: Value) -> bool:
    v = value[1]
    if v is None or isinstance(v, bool | int | float):
        return False
    return not (isinstance(v, str | bytes) and len(v) < MIN_TEXT)


def _hashable(value: Value) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def constants() -> list[tuple[str, str, Value]]:
    """``(module, name, value)`` of every module-level literal constant of the package."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            else:
                continue
            if not isinstance(target, ast.Name) or not NAME.match(target.id):
                continue
            literal = _literal(value)
            if literal is not None:
                out.append((module, target.id, literal))
    return out


def _twice(groups: dict[object, list[tuple[str, str]]]) -> list[str]:
    return sorted(
        f"{key!r:.100}: {sorted(sites)}" for key, sites in groups.items() if len({m for m, _ in sites}) > 1
    )


def test_the_scan_sees_the_package() -> None:
    found = {(m, n) for m, n, _ in constants()}
    assert ("dspark_calibrate.schemas._arrow", "BUNDLE_KINDS") in found
    assert ("dspark_calibrate.artifacts._models", "NON_PRINTABLE_ASCII") in found


def test_no_constant_name_is_defined_in_two_modules() -> None:
    by_name: dict[object, list[tuple[str, str]]] = defaultdict(list)
    for module, name, _ in constants():
        by_name[name].append((module, name))
    assert _twice(by_name) == []


def test_no_constant_value_is_defined_in_two_modules() -> None:
    by_value: dict[object, list[tuple[str, str]]] = defaultdict(list)
    for module, name, value in constants():
        if _compared_by_value(value) and _hashable(value):
            by_value[value].append((module, name))
    assert _twice(by_value) == []
