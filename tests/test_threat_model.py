"""Every test the threat model in docs/runtime.md names exists (so the table cannot rot)."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "runtime.md"
#: `tests/x/test_y.py::test_z[id, id*]`, `test_y.py::test_z`, or `::test_z` (same file as before).
REFERENCE = re.compile(r"`((?:tests/)?[\w/]*test_\w+\.py)?::(\w+)(?:\[([^\]]+)\])?`")


def _section() -> str:
    text = DOC.read_text(encoding="utf-8")
    start = text.index("## Threat model")
    return text[start : text.index("\n## ", start + 1)]


def _resolve(name: str) -> Path:
    direct = ROOT / name
    if direct.is_file():
        return direct
    found = sorted((ROOT / "tests").rglob(Path(name).name))
    assert len(found) == 1, f"{name}: {len(found)} files match"
    return found[0]


def test_threat_model_covers_every_attack_class() -> None:
    section = _section()
    for attack in (
        "rollback",
        "freeze",
        "mix and match",
        "threshold",
        "root rollback",
        "resource exhaustion",
        "malformed input",
    ):
        assert f"| {attack} |" in section, attack


def test_every_named_test_exists() -> None:
    section = _section()
    current: Path | None = None
    checked = 0
    for file_name, function, ids in REFERENCE.findall(section):
        if file_name:
            current = _resolve(file_name)
        assert current is not None, f"::{function} names no file"
        source = current.read_text(encoding="utf-8")
        assert re.search(rf"^def {function}\(", source, re.M), f"{current.name}::{function} does not exist"
        # Table rows are named by string literals in the same file (ids of parametrized cases).
        literals = set(re.findall(r'"([\w.\-]+)"', source))
        for wanted in (i.strip() for i in ids.split(",") if ids):
            assert fnmatch.filter(literals, wanted), f"{current.name}::{function}[{wanted}] matches no case"
        checked += 1
    assert checked >= 20
