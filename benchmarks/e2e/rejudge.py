"""Re-build every run of a prediction matrix on the CPU with the current code and judge it again.

A matrix run on the GPU keeps each run's recorded workload, the deployment's sweep and fit, and
what build charged for the confidence path (``matrix_<part>_toolkit.tgz``). A change to the
prediction model can then be checked against the runs already served, without a GPU: this script
builds each run's bundle again (the overhead evidence rebuilt from the recorded mean and standard
error of its runs, which is all the replicates use), takes the new prediction and gated decision,
keeps the realised gain (the arms' outputs were identical token for token, so the throughput and
latency measures of a round coincide), and evaluates the matrix's targets again. The result goes
under ``rejudged`` in the matrix JSON, beside the run as served, never in its place.

Run: ``.venv/bin/python benchmarks/e2e/rejudge.py`` (about two minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.e2e.matrix import summarize  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
KEYS = ("objective", "regime", "regime_source", "predicted_gain", "predicted_gain_ci_low", "predicted_gain_ci_high")


def _evidence(overhead: dict[str, Any]) -> dict[str, Any]:
    """Runs with the recorded mean and standard error (the replicates use nothing else)."""
    n = int(overhead["runs"])
    spread = np.arange(n) - (n - 1) / 2
    spread = spread / np.std(spread, ddof=1) * float(overhead["standard_error_ms"]) * math.sqrt(n)
    return {
        "planner": overhead["planner"],
        "per_step_ms": [float(overhead["mean_ms"] + x) for x in spread],
        "source": "rebuilt from the run's build.json: the mean and standard error of its measured runs",
    }


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dspark_calibrate.cli", *args], capture_output=True, text=True)


def rebuild(tree: Path, part: str, run_id: str, keys: Path, work: Path) -> dict[str, Any]:
    """Build one run again; its new prediction and gated decision."""
    report = json.loads((tree / part / run_id / "bundle" / "report" / "build.json").read_text())
    evidence = work / f"{run_id}-overhead.json"
    evidence.write_text(json.dumps(_evidence(report["replay"]["overhead"])))
    done = _cli(
        "build",
        "--sweep", str(tree / part / "toolkit" / "sweep.parquet"),
        "--calibration", str(tree / part / "toolkit" / "fit" / "calibration.parquet"),
        "--workload", str(tree / part / run_id / "workload.parquet"),
        "--key", str(keys / "signing-key.pem"),
        "--trust-root", str(work / "root.json"),
        "--version", "1",
        "--out", str(work / run_id),
        "--overhead", str(evidence),
        "--no-plots",
        "--json",
    )  # fmt: skip
    doc = json.loads(done.stdout)
    s = doc["summary"]
    return {
        **{k: s[k] for k in KEYS},
        "gated_decision": "admit" if doc["replay"]["decision"]["status"] == "ACCEPT" else "refuse",
        "as_served": {k: report["summary"][k] for k in KEYS},
    }


def rejudge(matrix: dict[str, Any], tarballs: list[Path]) -> dict[str, Any]:
    """The matrix's runs judged against predictions rebuilt with the current code."""
    with tempfile.TemporaryDirectory() as tmp:
        tree, work = Path(tmp) / "tree", Path(tmp) / "work"
        tree.mkdir()
        work.mkdir()
        for tgz in tarballs:
            with tarfile.open(tgz) as tar:
                tar.extractall(tree, filter="data")
        keys = work / "keys"
        for args in (("keygen", "--out", str(keys)), ("trust", "init", "--key", str(keys / "signing-key.pem"), "--out", str(work / "root.json"))):
            if _cli(*args).returncode:
                raise SystemExit(f"could not make a signing key: {' '.join(args)}")
        entries = []
        for run in matrix["runs"]:
            new = rebuild(tree, run["part"], run["id"], keys, work)
            low, high = new["predicted_gain_ci_low"], new["predicted_gain_ci_high"]
            mean = run["realised_gain"]
            entries.append(
                {
                    **run,
                    "regime": new["regime"],
                    "objective": new["objective"],
                    "predicted_gain": new["predicted_gain"],
                    "predicted_ci": [low, high],
                    "gated_decision": new["gated_decision"],
                    "error_pp": 100.0 * (mean - new["predicted_gain"]),
                    "inside_predicted_ci": bool(low <= mean <= high),
                    "rebuilt": new,
                }
            )
    seeds = sorted({r["seed"] for r in matrix["runs"]})
    configs = sorted({r["id"].rsplit("-s", 1)[0] for r in matrix["runs"]})
    keep = ("id", "regime", "objective", "predicted_gain", "predicted_ci", "realised_gain", "realised_ci", "gated_decision", "error_pp", "inside_predicted_ci", "rebuilt")
    return {
        "method": (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        "command": "benchmarks/e2e/rejudge.py",
        "summary": summarize(entries, seeds, configs),
        "runs": [{k: e[k] for k in keep} for e in entries],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--matrix", type=Path, default=RESULTS / "prediction_matrix.json")
    parser.add_argument(
        "--toolkit",
        type=Path,
        nargs="+",
        default=[RESULTS / "raw" / "matrix_decode_toolkit.tgz", RESULTS / "raw" / "matrix_mixed_toolkit.tgz"],
    )
    args = parser.parse_args(argv)
    matrix = json.loads(args.matrix.read_text())
    matrix["rejudged"] = rejudge(matrix, list(args.toolkit))
    args.matrix.write_text(json.dumps(matrix, indent=2, sort_keys=True) + "\n")
    s = matrix["rejudged"]["summary"]
    print(json.dumps({k: s[k] for k in ("median_abs_error_pp", "max_abs_error_pp", "inside_predicted_ci_share", "targets_met")}))
    return 0 if s["targets_met"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
