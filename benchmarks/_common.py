"""Shared helpers for benchmarks: machine description, commit, result files."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
    }
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    info["cpu_model"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def git_commit() -> str | None:
    """The repository's HEAD commit (``$COMMIT`` when set: a lent machine's copy of the tree may
    carry a stale .git), or None outside a checkout."""
    if os.environ.get("COMMIT"):
        return os.environ["COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            check=True,
            cwd=Path(__file__).parent,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode().strip() or None


def write_result(
    name: str, data: dict[str, Any], *, out_dir: Path | None = None, argv: Sequence[str] | None = None
) -> Path:
    """Write ``results/<name>.json`` (``out_dir/<name>.json`` where given: a lent GPU machine's
    ``$OUT``) with machine, command, commit and time added; ``argv``: the script's arguments
    when its ``main`` was called with them (a test), else ``sys.argv``."""
    command = (
        [Path(sys.argv[0]).as_posix(), *sys.argv[1:]] if argv is None else [f"benchmarks/{name}.py", *argv]
    )
    record = {
        "benchmark": name,
        "measured_at": datetime.now(UTC).replace(microsecond=0).isoformat(),
        "machine": machine_info(),
        "command": " ".join(command),
        "commit": git_commit(),
        **data,
    }
    target = RESULTS if out_dir is None else out_dir
    target.mkdir(parents=True, exist_ok=True)
    path = target / f"{name}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path
