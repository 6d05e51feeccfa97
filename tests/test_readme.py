"""README.md's pipeline, run as written: every `$ ` command of "The pipeline on a real deployment",
in order, with the substitutions of its "CPU trial" table, in one scratch directory.

The commands and the substitutions are both read from the README, so the README cannot drift
from what the tools accept. Each command runs through the installed console scripts' entry
points in a subprocess (the way a user runs them) and must exit 0.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BIN = Path(sys.executable).parent


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def pipeline_commands(text: str) -> list[str]:
    """The `$ ` lines of the pipeline section, in order."""
    body = _section(text, "The pipeline on a real deployment")
    return [line[2:].strip() for line in body.splitlines() if line.startswith("$ ")]


def cpu_substitutions(text: str) -> list[tuple[str, str]]:
    """The rows of the CPU trial table: (GPU deployment, CPU trial)."""
    body = _section(text, "The pipeline on a real deployment")
    table = body[body.index("### CPU trial") :]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|$", table, flags=re.MULTILINE)
    assert rows, "the CPU trial table has no rows"
    return rows


def cpu_variant(command: str, subs: list[tuple[str, str]]) -> list[str]:
    for old, new in subs:
        command = command.replace(old, new)
    return [part.strip() for part in command.split(" && ")]


def test_readme_lists_every_stage() -> None:
    text = README.read_text(encoding="utf-8")
    programs = [shlex.split(c)[:2] for c in pipeline_commands(text)]
    stages = [p[1] if p[0] == "dspark-calibrate" else p[0] for p in programs]
    for stage in (
        "keygen",
        "trust",
        "sweep",
        "fit",
        "workload",
        "build",
        "export",
        "report",
        "dspark-verify",
    ):
        assert stage in stages, stage
    for old, _ in cpu_substitutions(text):
        assert any(old in c for c in pipeline_commands(text)), f"substitution {old!r} matches no command"


@pytest.mark.slow
def test_readme_pipeline_runs_on_cpu(tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    subs = cpu_substitutions(text)
    # 80 columns: the width a new user's terminal and a CI log have; nothing may be cut to fit it.
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "COLUMNS": "80"}
    env.pop("WORLD_SIZE", None)
    for command in pipeline_commands(text):
        for part in cpu_variant(command, subs):
            argv = shlex.split(part)
            assert argv[0] in ("dspark-calibrate", "dspark-verify"), part
            done = subprocess.run(
                [str(BIN / argv[0]), *argv[1:]],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, (
                f"{part}\nexit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            )
            assert "Traceback" not in done.stderr, part
            # Digests, keyids and paths are printed whole: a table wraps them, never cuts them.
            assert "…" not in done.stdout + done.stderr, f"{part}\n{done.stdout}{done.stderr}"
    opts = (tmp_path / "opts.yaml").read_text()
    assert "enable_confidence_scheduling: true" in opts, opts
    for path in re.findall(r"_path: (\S+)", opts):
        assert Path(path).is_absolute() and Path(path).exists(), path
    assert (tmp_path / "report.html").exists() and (tmp_path / "trtllm" / "admission_receipt.json").exists()
