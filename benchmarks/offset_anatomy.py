"""Where a recorded sweep's compact savings sit against the independent harness's, split by what
could move them.

A held-out job (``independent_harness.py job``) leaves the sweep's samples and the harness's
result. The sweep states each saving once; this script asks what the difference to the harness
(sweep − harness, pp, per compact cell) depends on, from the same samples:

- ``by_mix``: the rounds grouped by how many of the G's cells the visit timed, with the median SM
  clock of those visits and each cell's mean per-round saving difference. Before interleave
  design 4 a visit held only the cells still measuring, so the G's mix (and clock) changed as its
  cells stopped; since then every visit runs them all (``fill`` in the journal), and this
  grouping counts the timed cells only.
- ``by_previous``: the same difference over the rounds whose visit followed a lighter G, a
  heavier G, or the same G (the carry-over a random order leaves).
- ``by_half``: over each visit's first and second half of samples (how far a visit had settled).
- ``mean_diff_pp``: the mean over the G's compact cells of the difference of the per-round
  savings, the offset the groupings above split.

A per-round saving is ``1 − median(cell) / median(native)`` over the visit's samples; its mean
over rounds is close to, not the same as, the sweep's stated point (a paired REML estimate). CPU
only, over the recorded files: one job's folder and harness file, or recorded H200 runs by number
(their ``raw/independent_harness_interleaved_runN_work.tgz`` and ``..._harness.json``), written to
``benchmarks/results/offset_anatomy.json``::

    PYTHONPATH=src python3 benchmarks/offset_anatomy.py --sweep DIR --harness independent.json
    PYTHONPATH=src python3 benchmarks/offset_anatomy.py --runs 20,21,22,23
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write_result
from visit_noise import load_samples

#: The recorded H200 jobs (``--runs``).
RAW = Path(__file__).resolve().parent / "results" / "raw"

#: The harness's compact cells: (G, V) → saving.
Savings = Mapping[tuple[int, int], float]


def harness_savings(harness: Mapping[str, Any]) -> dict[tuple[int, int], float]:
    """The harness's compact savings by (G, V).

    Raises:
        SystemExit: a file without compact cells.
    """
    out = {
        (int(c["graph_batch_size"]), int(c["verifier_budget"])): float(c["saving"])
        for c in harness.get("cells", [])
        if c.get("kind") == "compact" and c.get("saving") is not None
    }
    if not out:
        raise SystemExit("the harness file holds no compact cell with a saving (give its independent.json)")
    return out


def _round_diffs(visit: pd.DataFrame, g: int, harness: Savings) -> dict[int, float]:
    """Each compact cell's saving in one visit, less the harness's (pp); empty without a native."""
    native = visit.loc[visit["verifier_budget"] == 0, "step_time_ms"]
    if native.empty:
        return {}
    base = float(np.median(native))
    out = {}
    for v, cell in visit.groupby("verifier_budget"):
        if (g, int(v)) in harness:
            out[int(v)] = 100.0 * (1.0 - float(np.median(cell["step_time_ms"])) / base - harness[g, int(v)])
    return out


def _split(
    visits: Sequence[tuple[Any, pd.DataFrame]], g: int, harness: Savings, key: Callable[[pd.DataFrame], str]
) -> dict[str, dict[str, Any]]:
    """Rounds grouped by ``key``: rounds, median clock and each cell's mean difference (pp)."""
    groups: dict[str, list[pd.DataFrame]] = {}
    for _, visit in visits:
        groups.setdefault(key(visit), []).append(visit)
    out = {}
    for name, members in sorted(groups.items()):
        diffs: dict[int, list[float]] = {}
        for visit in members:
            for v, d in _round_diffs(visit, g, harness).items():
                diffs.setdefault(v, []).append(d)
        clocks = pd.concat(members).get("sm_clock_mhz", pd.Series([], dtype=float)).dropna()
        out[name] = {
            "rounds": len(members),
            "sm_clock_mhz_median": float(np.median(clocks)) if len(clocks) else None,
            "diff_pp": {f"V{v}": float(np.mean(d)) for v, d in sorted(diffs.items())},
        }
    return out


def _previous(g: int) -> Callable[[pd.DataFrame], str]:
    def key(visit: pd.DataFrame) -> str:
        prev = visit["prev_graph_batch_size"].iloc[0] if "prev_graph_batch_size" in visit else None
        if prev is None or pd.isna(prev):
            return "first"
        return "same" if int(prev) == g else ("lighter" if int(prev) < g else "heavier")

    return key


def anatomy(samples: pd.DataFrame, harness: Savings) -> dict[str, Any]:
    """Per G with a compact cell in ``harness``: the mean difference and its splits (module
    docstring). ``samples`` as :func:`visit_noise.load_samples` gives them (kept, ``j`` the
    sample's rank within its visit). Pure."""
    per_g: dict[str, Any] = {}
    for g in sorted({g for g, _ in harness}):
        mine = samples[samples["graph_batch_size"] == g]
        if mine.empty:
            continue
        visits = list(mine.groupby("round"))
        every = [d for _, visit in visits for d in _round_diffs(visit, g, harness).values()]
        halves = []
        for r, visit in visits:  # a cell's j-th sample of n is late when j > n / 2
            size = visit.groupby("verifier_budget")["j"].transform("max")
            late = visit["j"] > size / 2
            halves += [
                (r, part.assign(half=h))
                for h, part in (("early", visit[~late]), ("late", visit[late]))
                if len(part)
            ]
        by_half = _split(halves, g, harness, lambda v: str(v["half"].iloc[0]))
        per_g[str(g)] = {
            "mean_diff_pp": float(np.mean(every)) if every else None,
            "by_mix": _split(visits, g, harness, lambda v: f"{v['verifier_budget'].nunique()} cells"),
            "by_previous": _split(visits, g, harness, _previous(g)),
            "by_half": by_half,
        }
    return {"per_g": per_g}


def _read_harness(path: Path) -> dict[tuple[int, int], float]:
    try:
        return harness_savings(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"{path}: not a readable harness result ({exc})") from None


def recorded_run(run: int, raw: Path = RAW) -> dict[str, Any]:
    """:func:`anatomy` of recorded H200 run ``run`` (its work archive unpacked to a temporary folder).

    Raises:
        SystemExit: the run's archive or harness file is not there.
    """
    archive = raw / f"independent_harness_interleaved_run{run}_work.tgz"
    harness = raw / f"independent_harness_interleaved_run{run}_harness.json"
    missing = [p.name for p in (archive, harness) if not p.exists()]
    if missing:
        raise SystemExit(f"run {run}: {', '.join(missing)} not in {raw}")
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
        sweeps = sorted(Path(tmp).glob("**/sweep"))
        if not sweeps:
            raise SystemExit(f"{archive}: no sweep folder inside")
        return anatomy(load_samples(sweeps[0]), _read_harness(harness))


def _print(per_g: Mapping[str, Any], label: str) -> None:
    for g, row in per_g.items():
        prev = ", ".join(
            f"{k} {np.mean(list(x['diff_pp'].values())):+.2f}"
            for k, x in row["by_previous"].items()
            if x["diff_pp"]
        )
        print(f"{label}G{g}: mean {row['mean_diff_pp']:+.2f} pp; by previous G: {prev}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweep", type=Path, default=None, help="the sweep's folder (*.samples.parquet)")
    parser.add_argument("--harness", type=Path, default=None, help="the harness's independent.json")
    parser.add_argument("--runs", default=None, help="recorded H200 runs by number, comma-separated (20,21)")
    parser.add_argument(
        "--out", type=Path, default=None, help="with --sweep: write the JSON here (default: print it)"
    )
    args = parser.parse_args(argv)
    if args.runs is not None:
        if args.sweep is not None or args.harness is not None:
            parser.error("--runs reads the recorded runs; drop --sweep and --harness")
        try:
            runs = [int(r) for r in args.runs.split(",")]
        except ValueError:
            parser.error(f"--runs {args.runs!r} is not a comma-separated list of run numbers")
        by_run = {}
        for run in runs:
            by_run[f"run{run}"] = recorded_run(run)
            _print(by_run[f"run{run}"]["per_g"], f"run {run} ")
        path = write_result("offset_anatomy", {"runs": by_run}, argv=argv)
        print(f"wrote {path}", file=sys.stderr)
        return 0
    if args.sweep is None or args.harness is None:
        parser.error("give --sweep DIR and --harness FILE, or --runs N,...")
    result: dict[str, Any] = {"sweep": str(args.sweep), "harness": str(args.harness)}
    result |= anatomy(load_samples(args.sweep), _read_harness(args.harness))
    text = json.dumps(result, indent=2, sort_keys=True) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    _print(result["per_g"], "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
