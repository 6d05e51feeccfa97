"""Where an interleaved sweep's round-to-round noise comes from, per G and per mix design.

An interleaved sweep (``--interleave``) times each G's cells together in one visit per round; a
cell's value in a round is the mean of its samples in that visit, and its saving rests on the
log-ratio of that mean to its native cell's. This script splits that log-ratio's noise in two,
for every compact and control cell and each of the two mix designs (rounds that switch cells
every step, rounds that run them in runs; ``protocol.MIX_STAYS``):

- ``visit_sd``: the SD of a visit's log-ratio over the visits of an epoch (deviations from the
  epoch's mean, pooled over epochs): the noise a round's value carries;
- ``expected_sd``: what the spread of the visit's own samples predicts for their mean (the j-th
  sample of the cell against the j-th of its native, pooled within visits, over √n);
- ``excess_sd``: ``sqrt(max(visit_sd² − expected_sd², 0))``, noise that all samples of a visit
  share: the clock window the visit met, which more samples per visit do not remove.

Reads the sweep's samples (``*.samples.parquet`` in each ``--sweep`` folder) and its journal's
configuration (the interleave design and samples per visit, where a journal is there). CPU only.

Usage (repository root)::

    PYTHONPATH=src python benchmarks/visit_noise.py --sweep DIR [--sweep DIR ...] [--g 128,256] [--out FILE]

A past H200 job's sweep: ``tar xzf benchmarks/results/raw/independent_harness_interleaved_run12_work.tgz
-C /tmp/w12`` and ``--sweep /tmp/w12/work/sweep``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dspark_calibrate.calibrate.measurement.protocol import MIX_STAYS, mix_arm

#: The designs by name, in the order of :data:`MIX_STAYS`.
DESIGNS = ("switching", "runs")
assert len(DESIGNS) == len(MIX_STAYS)


def _design_of(sweep: Path) -> dict[str, Any]:
    """The interleave design and samples per visit from the journal's header (empty without one)."""
    journals = sorted(sweep.glob("*.journal.jsonl"))
    if not journals:
        return {}
    with open(journals[0], encoding="utf-8") as fh:
        head = json.loads(fh.readline()).get("config", {})
    return {
        "interleave_design": head.get("interleave"),
        "samples_per_visit": head.get("thresholds", {}).get("samples_per_visit"),
        "settle_s": head.get("settle_s"),
    }


def load_samples(sweep: Path) -> pd.DataFrame:
    """The kept samples of the sweep in ``sweep`` with their log step time and mix design.

    Raises:
        SystemExit: no samples file there, or one without the columns this needs.
    """
    files = sorted(sweep.glob("*.samples.parquet"))
    if not files:
        raise SystemExit(f"{sweep}: no *.samples.parquet (give the sweep's --out-dir)")
    frame = pd.read_parquet(files[0])
    need = {"graph_batch_size", "verifier_budget", "round", "epoch", "sample_index", "step_time_ms", "kept"}
    missing = sorted(need - set(frame.columns))
    if missing:
        raise SystemExit(f"{files[0]}: missing column(s) {missing}")
    frame = frame[frame["kept"]].copy()
    frame["log_ms"] = np.log(frame["step_time_ms"].astype(float))
    frame["design"] = [DESIGNS[mix_arm(int(r))] for r in frame["round"]]
    # The j-th sample of a cell in its visit (sample_index counts over the whole sweep).
    frame["j"] = frame.groupby(["graph_batch_size", "verifier_budget", "round"])["sample_index"].rank(
        method="first"
    )
    return frame


def _pooled_sd(deviations: pd.Series, df: int) -> float | None:
    return math.sqrt(float(np.sum(np.square(deviations))) / df) if df > 0 else None


def cell_noise(samples: pd.DataFrame, g: int, v: int, design: str) -> dict[str, Any] | None:
    """``visit_sd``, ``expected_sd`` and ``excess_sd`` of cell (g, v) in one design's rounds
    (module docstring); None where fewer than two visits share an epoch."""
    of_g = samples[(samples["graph_batch_size"] == g) & (samples["design"] == design)]
    table = of_g.pivot_table(index=["epoch", "round", "j"], columns="verifier_budget", values="log_ms")
    if v not in table.columns or 0 not in table.columns:
        return None
    ratio = (table[v] - table[0]).dropna().rename("r").reset_index()
    if ratio.empty:
        return None
    visits = ratio.groupby("round").agg(r=("r", "mean"), n=("r", "size"), epoch=("epoch", "first"))
    within = ratio["r"] - ratio.groupby("round")["r"].transform("mean")
    within_sd = _pooled_sd(within, len(ratio) - len(visits))
    between = visits["r"] - visits.groupby("epoch")["r"].transform("mean")
    visit_sd = _pooled_sd(between, len(visits) - visits["epoch"].nunique())
    if visit_sd is None or within_sd is None:
        return None
    expected = within_sd / math.sqrt(float(visits["n"].mean()))
    return {
        "visits": len(visits),
        "samples_per_visit": float(visits["n"].mean()),
        "visit_sd": visit_sd,
        "expected_sd": expected,
        "excess_sd": math.sqrt(max(visit_sd**2 - expected**2, 0.0)),
    }


def noise(samples: pd.DataFrame, gs: set[int] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """Per G (as a string) and cell ``G/V``, each design's :func:`cell_noise` (None where too few
    visits)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for g in sorted({int(x) for x in samples["graph_batch_size"]}):
        if gs is not None and g not in gs:
            continue
        budgets = sorted(
            {int(x) for x in samples.loc[samples["graph_batch_size"] == g, "verifier_budget"]} - {0}
        )
        out[str(g)] = {f"G{g}/V{v}": {d: cell_noise(samples, g, v, d) for d in DESIGNS} for v in budgets}
    return out


def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.2f}%"


def main(argv: list[str] | None = None) -> int:
    """Print each sweep's table; write them all to ``--out`` as JSON where given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="append", required=True, type=Path, help="a sweep's folder")
    parser.add_argument("--g", default=None, help="only these G (comma-separated)")
    parser.add_argument("--out", type=Path, default=None, help="write the numbers here as JSON")
    args = parser.parse_args(argv)
    gs = {int(x) for x in args.g.split(",")} if args.g else None
    result = []
    for sweep in args.sweep:
        per_g = noise(load_samples(sweep), gs)
        design = _design_of(sweep)
        result.append({"sweep": str(sweep), **design, "per_g": per_g})
        print(f"{sweep}  (interleave design {design.get('interleave_design')}, "
              f"{design.get('samples_per_visit')} samples per visit)")  # fmt: skip
        print("  cell          design     visits  visit_sd  expected  excess")
        for cells in per_g.values():
            for cell, designs in cells.items():
                for name, row in designs.items():
                    if row is None:
                        continue
                    print(
                        f"  {cell:<13} {name:<10} {row['visits']:6d}  {_pct(row['visit_sd'])}   "
                        f"{_pct(row['expected_sd'])}   {_pct(row['excess_sd'])}"
                    )
    if args.out is not None:
        args.out.write_text(json.dumps({"sweeps": result}, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
