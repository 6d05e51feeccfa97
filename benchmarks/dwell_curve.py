"""How a compact saving moves with the policy's dwell, from a recorded harness run.

``independent_harness.py --harness-stays 0.5,0,0.85`` times every G's cells in sequences drawn at
several stay probabilities in one process, and records every step. This reads that file and
states, per compact cell, its saving at each stay with the dwell the sequences had (steps over
runs of one cell), the saving of its steps that follow another cell and of those that follow
itself, and how far the savings span (pp). Pure over the file; nothing runs on a GPU::

    PYTHONPATH=src python3 benchmarks/dwell_curve.py \\
        --harness benchmarks/results/raw/independent_harness_interleaved_run17_harness.json \\
        --out benchmarks/results/dwell_curve.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def dwell_of(steps: Sequence[Mapping[str, Any]], stay: float, discard: int) -> float | None:
    """The mean run (steps over runs of one cell) of the recorded sequences drawn at ``stay``,
    after each sequence's first ``discard`` steps; None when none was drawn at it."""
    total = runs = 0
    for block in steps:
        if block["stay"] != stay:
            continue
        cells = block["cells"][discard:]
        total += len(cells)
        runs += 1 + sum(a != b for a, b in itertools.pairwise(cells)) if cells else 0
    return total / runs if runs else None


def dwell_curve(harness: Mapping[str, Any]) -> dict[str, Any]:
    """Per compact cell: the saving and dwell at each recorded stay, after a switch and after
    itself, and the span of its savings over the stays (pp); and the largest span per G."""
    stays = harness.get("by_stay") or {f"{harness['stays'][0]:g}": harness}
    discard = int(harness["discard"])
    dwell = {name: dwell_of(harness["steps"], float(name), discard) for name in stays}
    split = {(c["graph_batch_size"], c["verifier_budget"]): c for c in harness["cells"]}
    cells = []
    for key, first in split.items():
        if first["kind"] != "compact":
            continue
        by_stay = {}
        for name, part in stays.items():
            mine = next(c for c in part["cells"] if (c["graph_batch_size"], c["verifier_budget"]) == key)
            by_stay[name] = {"dwell": dwell[name], "saving": mine["saving"]}
        savings = [v["saving"] for v in by_stay.values()]
        cells.append(
            {
                "cell": f"G{key[0]}/V{key[1]}",
                "graph_batch_size": key[0],
                "by_stay": by_stay,
                "saving_after_switch": first.get("saving_after_switch"),
                "saving_after_stay": first.get("saving_after_stay"),
                "span_pp": 100.0 * (max(savings) - min(savings)),
            }
        )
    per_g: dict[str, float] = {}
    for c in cells:
        g = str(c["graph_batch_size"])
        per_g[g] = max(per_g.get(g, 0.0), c["span_pp"])
    return {"gpu": harness.get("gpu"), "dwell_by_stay": dwell, "cells": cells, "span_pp_per_g": per_g}


def main(argv: list[str] | None = None) -> int:
    """Read ``--harness``, write ``--out`` (JSON) and print one line per compact cell."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--harness", required=True, type=Path, help="an independent.json with recorded steps")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    harness = json.loads(args.harness.read_text())
    if "steps" not in harness:
        raise SystemExit(f"{args.harness}: no recorded steps; run independent_harness.py from a75d848 on")
    curve = dwell_curve(harness)
    where = args.harness.resolve()
    curve["harness"] = where.relative_to(ROOT).as_posix() if where.is_relative_to(ROOT) else str(where)
    if args.out is not None:
        args.out.write_text(json.dumps(curve, indent=2, sort_keys=True) + "\n")
    for c in curve["cells"]:
        parts = [f"dwell {v['dwell']:.2f}: {100 * v['saving']:.2f}%" for v in c["by_stay"].values()]
        print(f"{c['cell']:>11}  " + "  ".join(parts) + f"  span {c['span_pp']:.2f} pp")
    return 0


if __name__ == "__main__":
    sys.exit(main())
