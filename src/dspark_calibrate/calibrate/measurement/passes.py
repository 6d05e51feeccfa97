"""A sweep run in several processes (passes), so what a new process draws is in the evidence.

A capture epoch (``--recapture-every``) builds every cell's graph again inside one process. On an
H200 running at its power cap that was not enough: two separate processes' savings differed by a
per-cell component (SD about 0.5 pp) that the epochs of either process did not show, while the
epochs' own spread was what their rounds predicted. Whatever a process fixes for its lifetime (the
CUDA context, the allocator's layout, the clock and power state it starts in) varies only between
processes, so only separate processes can estimate it.

``dspark-calibrate sweep --passes N`` therefore runs the sweep as N consecutive child processes
over one journal: pass p measures rounds ``[p·R, (p+1)·R)`` (R = ``--recapture-every``) and stops
(:func:`~.sweep.run_sweep`'s ``until_round``), the next resumes the journal in a fresh process, and
the last runs until every cell has stopped and writes the outputs. Each pass is one epoch (the
samples of pass p carry epoch p; no re-capture inside a pass), so the between-epoch components of
:mod:`~.stats` become between-process components, and every cell must span ``N`` passes before it
may stop.

:func:`pass_commands` is pure (it only rewrites a command line); :func:`run_passes` runs them.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from dspark_calibrate.errors import ConfigError

__all__ = ["PASS_OPTIONS", "pass_commands", "run_passes"]

#: Options the parent sets for its children: (name, takes a value).
PASS_OPTIONS: tuple[tuple[str, bool], ...] = (
    ("--passes", True),
    ("--until-round", True),
    ("--recapture-every", True),
    ("--epochs-required", True),
    ("--pass-index", True),
    ("--resume", False),
    ("--json", False),
)


def _strip(argv: Sequence[str]) -> list[str]:
    takes = dict(PASS_OPTIONS)
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name, eq, _ = arg.partition("=")
        if name in takes:
            skip = takes[name] and not eq
            continue
        out.append(arg)
    return out


def pass_commands(
    argv: Sequence[str], *, passes: int, rounds_per_pass: int, resume: bool, as_json: bool
) -> list[list[str]]:
    """The ``sweep`` arguments of every pass, from the user's ``sweep`` arguments.

    Args:
        argv: the arguments after ``sweep`` as the user gave them.
        passes: processes to run (>= 2).
        rounds_per_pass: rounds each pass measures before the next process takes over.
        resume: the first pass continues an existing journal too.
        as_json: the last pass prints the JSON report.

    Raises:
        ConfigError: fewer than two passes or rounds per pass below one.
    """
    if passes < 2:
        raise ConfigError(f"--passes {passes}: a sweep in separate processes needs at least 2 passes")
    if rounds_per_pass < 1:
        raise ConfigError(
            f"--recapture-every {rounds_per_pass}: with --passes every pass measures at least one round"
        )
    base = _strip(argv)
    out = []
    for p in range(passes):
        cmd = [
            *base,
            "--passes",
            "1",
            "--recapture-every",
            str(rounds_per_pass),
            "--epochs-required",
            str(passes),
            "--pass-index",
            str(p),
        ]
        if p > 0 or resume:
            cmd.append("--resume")
        if p < passes - 1:
            cmd += ["--until-round", str((p + 1) * rounds_per_pass)]
        elif as_json:
            cmd.append("--json")
        out.append(cmd)
    return out


def run_passes(
    commands: Sequence[Sequence[str]],
    *,
    out: Path,
    run: Callable[[list[str]], int] | None = None,
) -> int:
    """Run the passes one after another, each in a fresh ``python -m dspark_calibrate.cli sweep``.

    Stops at the first pass that fails (its exit code is returned) and after a pass that wrote
    ``out`` (every cell stopped before the last pass).

    Args:
        commands: from :func:`pass_commands`.
        out: the summary file the last pass writes.
        run: runs one argument list and returns its exit code (default: a child process).
    """

    def child(args: list[str]) -> int:
        return subprocess.run(
            [sys.executable, "-m", "dspark_calibrate.cli", "sweep", *args], check=False
        ).returncode

    def written() -> float | None:
        try:
            return Path(out).stat().st_mtime_ns
        except OSError:
            return None

    runner = run or child
    before = written()
    for i, cmd in enumerate(commands):
        rc = runner(list(cmd))
        if rc != 0:
            return rc
        if i < len(commands) - 1 and written() not in (None, before):
            break
    return 0
