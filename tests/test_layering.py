"""The package's import structure: layers, calibrate's stage DAG, no circles, no stray local imports.

Layers, lowest first (STYLE rule 1, DESIGN §3)::

    schemas, errors, decision  →  artifacts  →  runtime_plugin  →  calibrate  →  cli

A layer imports only layers below it; ``errors`` and ``decision`` import nothing of ours, and
``schemas`` only ``errors`` (the base of its ``SchemaMismatch``). ``calibrate`` uses ``runtime_plugin``'s pure planner and
economics so that build replays the runtime's own decisions; ``runtime_plugin`` never imports
``calibrate`` (what it needs at run time, such as a sentinel's backend, is handed to it).

Inside ``calibrate`` each pipeline stage is a sub-package, and they form this DAG (an arrow means
"may import")::

    measurement   confidence        (neither imports the other)
          ↖        ↗
          deployment
              ↑
            report                  (may read every stage below it)

``calibrate/_png.py`` is below every stage; ``calibrate/demo.py`` and ``calibrate/__init__.py``
sit above all of them.

Static checks read every module's imports with ``ast``: module level, ``if TYPE_CHECKING:`` blocks
(counted like module-level imports: a circle hidden behind TYPE_CHECKING is still a circle) and
function bodies. Dynamic checks import packages in a fresh interpreter and look at ``sys.modules``.
"""

from __future__ import annotations

import ast
import functools
import graphlib
import re
import subprocess
import sys
import textwrap
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

import dspark_calibrate.artifacts as artifacts_pkg

SRC = Path(__file__).resolve().parent.parent / "src" / "dspark_calibrate"
PKG = "dspark_calibrate"

#: What each layer may import from the package, besides itself and the leaves every layer may use.
ALLOWED: dict[str, set[str]] = {
    "schemas": set(),
    "errors": set(),
    "decision": set(),
    "artifacts": {"schemas"},
    "runtime_plugin": {"schemas", "artifacts"},
    "calibrate": {"schemas", "artifacts", "runtime_plugin"},
    "cli": {"schemas", "artifacts", "runtime_plugin", "calibrate"},
}
#: Leaves that import nothing of ours and that every layer may use (``__init__`` is the root
#: package, for ``__version__``).
LEAVES = {"errors", "decision", "__init__"}

#: calibrate's stages and the stages each may import (the DAG drawn in the module docstring).
STAGES: dict[str, set[str]] = {
    "measurement": set(),
    "confidence": set(),
    "deployment": {"measurement", "confidence"},
    "report": {"measurement", "confidence", "deployment"},
}
#: calibrate's modules outside the stages: below every stage, or above all of them.
CALIBRATE_BELOW_STAGES = {"_png"}
CALIBRATE_ABOVE_STAGES = {"demo", "__init__"}


@dataclass(frozen=True)
class Edge:
    """One import of one of our modules."""

    source: str  # dotted module name
    target: str  # dotted module (or package) name imported
    names: tuple[str, ...]  # names taken with ``from target import ...`` (empty for ``import``)
    where: str  # "module", "type_checking" or "function"
    path: Path
    line: int

    def __str__(self) -> str:
        what = f"from {self.target} import {', '.join(self.names)}" if self.names else f"import {self.target}"
        return f"{self.path.relative_to(SRC.parent)}:{self.line}: {what} ({self.where})"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULE_PATHS: dict[str, Path] = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _edges(name: str, path: Path) -> list[Edge]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[Edge] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = "function"
            elif isinstance(child, ast.If) and where == "module" and _is_type_checking(child.test):
                inner = "type_checking"
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name == PKG or alias.name.startswith(PKG + "."):
                        out.append(Edge(name, alias.name, (), inner, path, child.lineno))
            elif isinstance(child, ast.ImportFrom):
                module = child.module or ""
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    module = ".".join([*base, module] if module else base)
                if module == PKG or module.startswith(PKG + "."):
                    names = tuple(a.name for a in child.names)
                    # ``from pkg import submodule`` imports the submodule
                    subs = [n for n in names if f"{module}.{n}" in MODULE_PATHS]
                    for sub in subs:
                        out.append(Edge(name, f"{module}.{sub}", (), inner, path, child.lineno))
                    rest = tuple(n for n in names if n not in subs)
                    if rest:
                        out.append(Edge(name, module, rest, inner, path, child.lineno))
            visit(child, inner)

    visit(ast.parse(path.read_text(encoding="utf-8")), "module")
    return out


@functools.cache
def edges() -> tuple[Edge, ...]:
    """Every import edge of the package (parsed on first use, not while collecting)."""
    return tuple(e for name, path in MODULE_PATHS.items() for e in _edges(name, path))


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _stage(module: str) -> str | None:
    """calibrate's stage of a module, ``_png``/``demo``/``__init__`` for the others, None outside."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] != "calibrate":
        return None
    return parts[2] if len(parts) > 2 else "__init__"


# ---------------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", sorted(MODULE_PATHS), ids=sorted(MODULE_PATHS))
def test_imports_point_down(module: str) -> None:
    layer = _layer(module)
    if layer == "__init__":
        allowed: set[str] = set()
    elif layer in ("errors", "decision"):
        allowed = {layer}
    elif layer == "schemas":
        allowed = {layer, "errors"}  # its SchemaMismatch is a DsparkError like every other error
    else:
        allowed = ALLOWED[layer] | LEAVES | {layer}
    bad = [str(e) for e in edges() if e.source == module and _layer(e.target) not in allowed]
    assert not bad, f"{module} ({layer}) may import only {sorted(allowed)}:\n" + "\n".join(bad)


def test_runtime_plugin_never_imports_calibrate() -> None:
    bad = [str(e) for e in edges() if _layer(e.source) == "runtime_plugin" and _layer(e.target) == "calibrate"]
    assert not bad, "\n".join(bad)


def test_no_private_module_of_another_layer_is_imported() -> None:
    """STYLE rule 2: underscored modules are their layer's business (tests may use them)."""
    bad = []
    for e in edges():
        private = any(p.startswith("_") for p in e.target.split(".")[2:])
        if private and _layer(e.source) != _layer(e.target):
            bad.append(str(e))
    assert not bad, "\n".join(bad)


# ---------------------------------------------------------------------------------------------
# calibrate's stages
# ---------------------------------------------------------------------------------------------


def test_stage_graph_is_a_dag() -> None:
    order = list(graphlib.TopologicalSorter(STAGES).static_order())
    assert set(order) == set(STAGES)
    assert {p.name for p in (SRC / "calibrate").iterdir() if (p / "__init__.py").exists()} == set(STAGES)


@pytest.mark.parametrize(
    "module",
    sorted(m for m in MODULE_PATHS if _stage(m) is not None),
    ids=lambda m: m.removeprefix(PKG + "."),
)
def test_calibrate_stages_import_down_the_dag(module: str) -> None:
    stage = _stage(module)
    assert stage is not None
    imported = {_stage(e.target) for e in edges() if e.source == module} - {None}
    if stage in CALIBRATE_ABOVE_STAGES:
        allowed = set(STAGES) | CALIBRATE_BELOW_STAGES | ({"demo"} if stage == "__init__" else set())
    elif stage in CALIBRATE_BELOW_STAGES:
        allowed = set()
    else:
        allowed = STAGES[stage] | {stage} | CALIBRATE_BELOW_STAGES
    bad = imported - allowed
    assert not bad, f"{module} (stage {stage}) imports {sorted(bad)}; it may import only {sorted(allowed)}"


# ---------------------------------------------------------------------------------------------
# Circles
# ---------------------------------------------------------------------------------------------


def _cycles(edges: list[Edge]) -> list[list[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for e in edges:
        if e.target in MODULE_PATHS and e.target != e.source:
            graph[e.source].add(e.target)
    # Tarjan's strongly connected components: any component of two or more modules is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(MODULE_PATHS):
        if v not in index:
            connect(v)
    return out


def test_no_import_circles() -> None:
    """No circle among our modules, counting module-level, TYPE_CHECKING and function-local imports.

    (A parent package's ``__init__`` running before its submodules is not counted: Python imports
    the package first by construction.)
    """
    cycles = _cycles(list(edges()))
    assert not cycles, "import circles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_circle_check_finds_a_circle() -> None:
    a, b = sorted(MODULE_PATHS)[1:3]
    fake = [Edge(a, b, (), "module", SRC, 1), Edge(b, a, (), "type_checking", SRC, 1)]
    assert _cycles(fake) == [sorted([a, b])]


# ---------------------------------------------------------------------------------------------
# Function-local imports
# ---------------------------------------------------------------------------------------------

#: artifacts serves these names lazily because they need ``cryptography`` (keys, envelopes, the
#: trust root, signing, verification). Importing them inside the function that uses them keeps
#: ``calibrate`` importable on GPU images without ``cryptography`` (DESIGN §3) and keeps
#: ``import dspark_calibrate.runtime_plugin`` from loading it before admission runs.
LAZY_ARTIFACT_NAMES: frozenset[str] = frozenset(artifacts_pkg._LAZY)
#: ``dspark-calibrate`` imports every command module to build its app (for ``--help`` and for
#: each command), so a command imports the library layers it calls inside its own body: one
#: command, or ``--help``, does not pay for the others (the calibration stack alone loads scipy
#: and pyarrow, 1-2 s).
CLI_LAZY_TARGETS = {"schemas", "artifacts", "runtime_plugin", "calibrate"}


def _local_import_allowed(e: Edge) -> bool:
    if e.target == f"{PKG}.artifacts" and e.names and set(e.names) <= LAZY_ARTIFACT_NAMES:
        return True
    return _layer(e.source) == "cli" and _layer(e.target) in CLI_LAZY_TARGETS


def test_function_local_imports_are_the_documented_lazy_loads() -> None:
    bad = [str(e) for e in edges() if e.where == "function" and not _local_import_allowed(e)]
    assert not bad, (
        "function-local imports of our modules outside the allow-list (import at module level, or "
        "extend the allow-list with the reason):\n" + "\n".join(bad)
    )


def test_the_lazy_names_really_need_cryptography() -> None:
    """The allow-list is only as good as artifacts' lazy table: every name in it must come from a
    module that imports cryptography, securesystemslib or tuf (directly or through another)."""
    heavy = ("cryptography", "securesystemslib", "tuf")
    graph = defaultdict(set)
    for e in edges():
        graph[e.source].add(e.target)

    def needs_crypto(module: str, seen: set[str]) -> bool:
        text = MODULE_PATHS[module].read_text(encoding="utf-8")
        if any(re.search(rf"^(from|import) {h}\b", text, re.M) for h in heavy):
            return True
        seen.add(module)
        return any(needs_crypto(t, seen) for t in graph[module] if t in MODULE_PATHS and t not in seen)

    light = sorted(
        {m for m in artifacts_pkg._LAZY.values() if not needs_crypto(f"{PKG}.artifacts.{m}", set())}
    )
    assert not light, f"artifacts serves names of {light} lazily although they do not need cryptography"


# ---------------------------------------------------------------------------------------------
# One home per fact
# ---------------------------------------------------------------------------------------------

#: Facts with one home: module-level names that must be defined (assigned) there and nowhere else.
HOMES: dict[str, str] = {
    "MAX_COMPACT_CELLS_PER_G": "dspark_calibrate.schemas._limits",
    "MAX_COMPACT_CELLS_TOTAL": "dspark_calibrate.schemas._limits",
    "MAX_COST_TABLE_ROWS": "dspark_calibrate.schemas._limits",
    "MAX_MIXED_CELLS": "dspark_calibrate.schemas._limits",
    "TRTLLM_BODY_BUCKETS": "dspark_calibrate.artifacts._mixed_geometry",
    "TRTLLM_MIXED_K": "dspark_calibrate.artifacts._mixed_geometry",
    "TRTLLM_MIXED_WORLD_SIZE": "dspark_calibrate.artifacts._mixed_geometry",
    "MIXED_EXECUTION_MODE": "dspark_calibrate.artifacts._mixed_geometry",
    "MAX_TRUST_ROOT_BYTES": "dspark_calibrate.artifacts._trust",
    "Status": "dspark_calibrate.decision",
    "Decision": "dspark_calibrate.decision",
}
#: Names that restate one of those facts under another name.
ALIASES = re.compile(r"^_?(MAX_(COMPACT|DEPLOYED|TRUST_ROOT|MIXED)\w*|TRTLLM_(BODY_BUCKETS|MIXED_K|MIXED_WORLD)\w*)$")


def _definitions() -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for module, path in MODULE_PATHS.items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets: list[str] = []
            if isinstance(node, ast.ClassDef):
                targets = [node.name]
            elif isinstance(node, ast.Assign):
                targets = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                targets = [node.target.id]
            for name in targets:
                out[name].append(module)
    return out


def test_each_fact_has_one_home() -> None:
    defs = _definitions()
    for name, home in HOMES.items():
        assert defs[name] == [home], f"{name} is defined in {defs[name]}; its one home is {home}"
    strays = sorted((n, m) for n, ms in defs.items() if ALIASES.match(n) and n not in HOMES for m in ms)
    assert not strays, f"limits restated outside their home: {strays}"


def test_public_class_names_are_unique() -> None:
    """Two public classes with one name (``Calibration`` in calibrate and in the planner) make
    every reader check which one they hold."""
    classes: dict[str, list[str]] = defaultdict(list)
    for module, path in MODULE_PATHS.items():
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                classes[node.name].append(module)
    dupes = {n: ms for n, ms in classes.items() if len(ms) > 1}
    assert not dupes, f"public class names defined twice: {dupes}"


# ---------------------------------------------------------------------------------------------
# Fresh interpreters
# ---------------------------------------------------------------------------------------------


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120
    )


def test_runtime_plugin_import_is_light() -> None:
    proc = _fresh(
        """
        import sys
        import dspark_calibrate.runtime_plugin
        import dspark_calibrate.runtime_plugin.sentinel
        heavy = [m for m in ("torch", "pandas", "matplotlib", "dspark_calibrate.calibrate") if m in sys.modules]
        print(",".join(heavy))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"runtime_plugin pulled in {proc.stdout.strip()}"


def test_calibrate_imports_without_cryptography() -> None:
    proc = _fresh(
        """
        import sys, importlib, importlib.abc, pkgutil
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("cryptography", "securesystemslib", "tuf"):
                    raise ImportError(f"blocked: {name}")
                return None
        sys.meta_path.insert(0, Block())
        import dspark_calibrate.calibrate as c
        # every calibrate module, not only the ones the package re-exports from
        for info in pkgutil.walk_packages(c.__path__, c.__name__ + "."):
            importlib.import_module(info.name)
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
