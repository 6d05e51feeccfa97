"""Long fuzz run of every target in ``tests/fuzz/targets.py`` (``make fuzz``).

Targets run round-robin in slices until the time budget is spent; each slice is a series of
hypothesis runs from fresh seeds, so the whole run is reproducible from ``--seed``. A crash, hang
or accepted mutant is recorded (with the mutation that caused it) and the run goes on. Each slice
runs in a forked child, so that a mutant that kills the process from C code (an abort, a
segfault) is recorded as a crash too, with the last mutation the child started. Progress is
printed after every slice.

Run: ``.venv/bin/python benchmarks/fuzz.py --minutes 10`` -> ``benchmarks/results/fuzz.json``.
Target: 0 crashes, 0 hangs, 0 accepted mutants. Exits 1 if any was found.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import queue
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write_result
from tests.fuzz.targets import HANG_S, TARGETS, Corpus, Stats, Target, fuzz

#: Examples per hypothesis run inside a slice (one seed each).
BATCH = 50


def _run_slice(target: Target, corpus: Corpus, seed: int, until: float, journal: Path, out: Any) -> None:
    """In the child: fuzz ``target`` until ``until``; send back the stats and the next seed."""
    stats = Stats(journal=journal)
    while time.monotonic() < until:
        fuzz(target, corpus, stats, examples=BATCH, seed=seed, strict=False)
        seed += 1
    out.put((stats, seed))


def _slice(target: Target, corpus: Corpus, total: Stats, seed: int, until: float, journal: Path) -> int:
    """One slice in a forked child; merge its counts into ``total``; a dead child is a crash."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    journal.unlink(missing_ok=True)
    child = ctx.Process(target=_run_slice, args=(target, corpus, seed, until, journal, out))
    child.start()
    try:
        stats, seed = out.get(timeout=max(until - time.monotonic(), 0) + 4 * HANG_S + 60)
    except queue.Empty:
        stats = None
    child.join(timeout=30)
    if stats is None or child.exitcode != 0:
        if child.is_alive():
            child.kill()
            child.join(timeout=30)
        last = journal.read_text(encoding="utf-8") if journal.exists() else "<none>"
        total.executions += 1
        total.outcomes["crash"] += 1
        total.crashes.append({"mutation": last[:2000], "error": f"process died (exit {child.exitcode})"})
        return seed + 1
    total.executions += stats.executions
    total.outcomes.update(stats.outcomes)
    total.crashes.extend(stats.crashes)
    total.hangs.extend(stats.hangs)
    total.max_seconds = max(total.max_seconds, stats.max_seconds)
    return int(seed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget (default 10)")
    parser.add_argument("--slice-seconds", type=float, default=20.0, help="time per target per turn")
    parser.add_argument("--seed", type=int, default=1, help="first hypothesis seed")
    parser.add_argument("--targets", nargs="*", help="only these targets (default: all)")
    parser.add_argument("--out", default="fuzz", help="result name under benchmarks/results/")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # admit() logs every decision; the counts are the output
    warnings.simplefilter("ignore")  # mutated inputs make libraries warn (overflow, unpickling)
    targets = [t for t in TARGETS if not args.targets or t.name in args.targets]
    if not targets:
        parser.error(f"no such target; choose from {[t.name for t in TARGETS]}")
    stats = {t.name: Stats() for t in targets}
    seed = args.seed
    budget = args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="dspark-fuzz-") as tmp:
        started = time.monotonic()
        corpus = Corpus(Path(tmp))
        journal = Path(tmp) / "last-mutation.txt"
        while time.monotonic() - started < budget:
            for target in targets:
                slice_end = min(time.monotonic() + args.slice_seconds, started + budget)
                seed = _slice(target, corpus, stats[target.name], seed, slice_end, journal)
                s = stats[target.name]
                print(
                    f"[{(time.monotonic() - started) / 60:5.1f} min] {target.name:17s} "
                    f"{s.executions:7d} execs  crashes {len(s.crashes)}  hangs {len(s.hangs)}  "
                    f"accepted mutants {s.accepted_mutants}",
                    flush=True,
                )
                if time.monotonic() - started >= budget:
                    break
        wall = time.monotonic() - started
    totals = {
        "executions": sum(s.executions for s in stats.values()),
        "crashes": sum(len(s.crashes) for s in stats.values()),
        "hangs": sum(len(s.hangs) for s in stats.values()),
        "accepted_mutants": sum(s.accepted_mutants for s in stats.values()),
    }
    path = write_result(
        args.out,
        {
            "wall_s": round(wall, 1),
            "seeds": [args.seed, seed - 1],
            "hang_limit_s": HANG_S,
            **totals,
            "targets": {t.name: {"description": t.description, **stats[t.name].to_dict()} for t in targets},
            "target": "0 crashes, 0 hangs, 0 accepted mutants",
        },
    )
    print(f"{totals} -> {path}")
    return 1 if totals["crashes"] or totals["hangs"] or totals["accepted_mutants"] else 0


if __name__ == "__main__":
    sys.exit(main())
