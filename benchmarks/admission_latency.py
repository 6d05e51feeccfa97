"""Admission latency: ``admit()`` without sentinel on a typical bundle, import time, module footprint.

A typical bundle: K=5, an 8-step graph ladder (8..256) with the native and 3 compact cells per G
(32 cells, the engine limit), a 5-position STS calibration and an admission artifact with its
economics, all signed with Ed25519 and bound by a signed manifest. The bundle is made-up data and
is marked synthetic, so the policy allows synthetic evidence; every check still runs.

In-process (warm imports): median and p90 of ``admit()`` over 41 runs, with a rollback state
file (read, locked and rewritten on every run, as a serving start does) and without one, plus
per-check medians. Cold: a fresh interpreter per run timing ``import dspark_calibrate.runtime_plugin``
and then the first ``admit()`` (which loads the signing libraries lazily). Footprint: the modules
the import adds, and whether torch, pandas, matplotlib or ``dspark_calibrate.calibrate`` are among
them, after the import and after a first admission.

Run: ``.venv/bin/python benchmarks/admission_latency.py`` → ``benchmarks/results/admission.json``.
Target: warm ``admit()`` median <= 100 ms.

Side by side with another version of the package (e.g. ``git archive main src | tar -x -C /tmp/base``):
``.venv/bin/python benchmarks/admission_latency.py --compare-src /tmp/base/src`` alternates warm
measurements of both in fresh interpreters, round by round, and writes
``benchmarks/results/admission_ab.json`` with the ratio of their medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write_result

from dspark_calibrate.artifacts import (
    Expectation,
    Fingerprint,
    Provenance,
    generate_keypair,
    init_root,
    load_signer,
    public_key_of,
    read_artifact,
    require_valid,
    sign_artifact,
    verify_path,
    write_bundle,
    write_unsigned_artifact,
)
from dspark_calibrate.runtime_plugin.admission import AdmissionPolicy, admit
from dspark_calibrate.schemas import arrow_schema

RUNS = 41
COLD_RUNS = 5
TARGET_MS = 100.0
K = 5
LADDER = (8, 16, 32, 48, 64, 96, 128, 256)
HEAVY = ("torch", "pandas", "matplotlib", "dspark_calibrate.calibrate")


def _tables() -> dict[str, tuple[pa.Table, dict[str, Any] | None]]:
    cost, replay = [], []
    for g in LADDER:
        t0 = 5.0 + 0.01 * g * (K + 1) + 0.001 * g  # the native cell's time
        for v in (0, 2 * g, 3 * g, 4 * g):
            t = 5.0 + 0.01 * (v or g * (K + 1)) + 0.001 * g
            saving = 1 - t / t0
            cost.append(
                {
                    "graph_batch_size": g,
                    "verifier_budget": v,
                    "step_time_ms": t,
                    "ci_low_ms": t * 0.995,
                    "ci_high_ms": t * 1.005,
                    "p10_ms": t * 0.99,
                    "p90_ms": t * 1.01,
                    "samples": 50,
                    "stop_reason": "precision",
                    "source_result_sha256": f"{g:032x}{v:032x}",
                    # paired savings against the native cell (schema of the paired evidence)
                    "saving": saving,
                    "saving_ci_low": 0.0 if v == 0 else saving - 0.002,
                    "saving_ci_high": 0.0 if v == 0 else saving + 0.002,
                    "paired_rounds": 8,
                    "common_mode_rel": 0.003,
                    "level_rel": 0.0015,
                }
            )
            if v:
                replay.append(
                    {
                        "graph_batch_size": g,
                        "verifier_budget": v,
                        "chosen_steps": 1000,
                        "value_ms": 20.0,
                        "value_ms_lower_bound": 15.0,
                    }
                )
    calibration = [
        {
            "position": j,
            "method": "sts",
            "temperature": 1.0 + 0.1 * j,
            "params": [1.0 + 0.1 * j],
            "risk_set_size": 100_000 // j,
            "holdout_risk_set_size": 20_000 // j,
            "nll_before": 0.6,
            "nll_after": 0.5,
            "brier_before": 0.2,
            "brier_after": 0.18,
            "ece_before": 0.05,
            "ece_after": 0.01,
        }
        for j in range(1, K + 1)
    ]
    summary = {
        "predicted_gain": 0.12,
        "predicted_gain_ci_low": 0.08,
        "predicted_gain_ci_high": 0.16,
        "compact_step_share": 0.6,
        "policy_steps": 100_000,
        "compact_choices": 60_000,
        "gross_compact_value_ms_lower_bound": 90_000.0,
        "fixed_confidence_path_overhead_ms_upper_bound": 0.05,
        "safety_margin_ms": 1_000.0,
        "net_value_ms": 84_000.0,
        "admitted": True,
        "minimum_predicted_gain": 0.01,
        "drain_guard": {
            "loss_multiplier": 1.5,
            "mean_output_tokens_per_request_iteration": 2.3,
            "minimum_group_value_ms": 0.1,
            "tail_graph_batch_size": 8,
            "source_result_sha256": "d" * 64,
        },
        "workload_identity_sha256": "e" * 64,
        "selector_replay_sha256": "f" * 64,
    }
    return {
        "cost-table": (pa.Table.from_pylist(cost, schema=arrow_schema("cost-table")), None),
        "calibration": (pa.Table.from_pylist(calibration, schema=arrow_schema("calibration")), None),
        "admission": (pa.Table.from_pylist(replay, schema=arrow_schema("admission")), summary),
    }


def _bundle(tmp: Path, now: datetime) -> tuple[Path, Path, Fingerprint]:
    signer = load_signer(generate_keypair(tmp / "keys").private_path)
    key = public_key_of(signer)
    root = init_root(
        root_signers=[signer],
        root_keys=[key],
        root_threshold=1,
        artifact_keys=[key],
        artifact_threshold=1,
        expires=now + timedelta(days=365),
    )
    root_path = tmp / "root.json"
    root_path.write_bytes(root.to_bytes())
    fp = Fingerprint(
        gpu="H200",
        gpu_count=8,
        gpu_snapshot_sha256="a" * 64,
        topology="DEP8",
        source_head="abc123",
        source_diff_sha256="b" * 64,
        runtime_snapshot="tensorrt_llm=1.3.0",
        max_draft_len=K,
        rank_local_graph_batch_sizes=LADDER,
        global_graph_batch_sizes=tuple(8 * g for g in LADDER),
        model_config_sha256="c" * 64,
        kv_dtype="fp8",
    )
    prov = Provenance(tool_version="bench", backend="synthetic", synthetic=True)
    bundle = tmp / "bundle"
    bundle.mkdir()
    members = {}
    for kind, (table, summary) in _tables().items():
        path = bundle / f"{kind}.parquet"
        write_unsigned_artifact(path, table, kind=kind, fingerprint=fp, provenance=prov, summary=summary)
        sign_artifact(
            read_artifact(path), [signer], version=1, issued_at=now, expires_at=now + timedelta(days=30)
        )
        members[kind] = require_valid(
            verify_path(path, root, now=now, expected=Expectation(allow_synthetic=True))
        )
    write_bundle(bundle, members, [signer], version=1, issued_at=now, expires_at=now + timedelta(days=30))
    return bundle, root_path, fp


def _warm(bundle: Path, root: Path, fp: Fingerprint, policy: AdmissionPolicy) -> dict[str, Any]:
    totals: list[float] = []
    checks: dict[str, list[float]] = {}
    for _ in range(RUNS):
        t0 = time.perf_counter()
        decision = admit(bundle, root, live=fp, policy=policy)
        totals.append((time.perf_counter() - t0) * 1e3)
        assert decision.active, decision.message
        for name, ms in decision.timings_ms.items():
            if "." not in name and name != "total":
                checks.setdefault(name, []).append(ms)
    ordered = sorted(totals)
    return {
        "median_ms": round(statistics.median(totals), 3),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 3),
        "min_ms": round(ordered[0], 3),
        "runs": RUNS,
        "checks_median_ms": {k: round(statistics.median(v), 3) for k, v in sorted(checks.items())},
    }


_COLD = """
import json, sys, time
if sys.argv[4] == "block-pandas":  # as on a serving image without pandas
    class _NoPandas:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "pandas" or name.startswith("pandas."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None
    sys.meta_path.insert(0, _NoPandas())
t0 = time.perf_counter()
import dspark_calibrate.runtime_plugin
t1 = time.perf_counter()
after_import = sorted(sys.modules)
from dspark_calibrate.artifacts import Fingerprint
from dspark_calibrate.runtime_plugin.admission import AdmissionPolicy, admit
fp = Fingerprint.from_dict(json.loads(sys.argv[3]))
t2 = time.perf_counter()
d = admit(sys.argv[1], sys.argv[2], live=fp, policy=AdmissionPolicy(allow_synthetic=True))
t3 = time.perf_counter()
assert d.active, d.message
print(json.dumps({"import_ms": (t1 - t0) * 1e3, "first_admit_ms": (t3 - t2) * 1e3,
                  "after_import": after_import, "after_admit": sorted(sys.modules)}))
"""


def _cold_runs(bundle: Path, root: Path, fp: Fingerprint, mode: str) -> list[dict[str, Any]]:
    runs = []
    for _ in range(COLD_RUNS):
        out = subprocess.run(
            [sys.executable, "-c", _COLD, str(bundle), str(root), json.dumps(fp.to_dict()), mode],
            capture_output=True,
            check=True,
            timeout=300,
        )
        runs.append(json.loads(out.stdout.decode().strip().splitlines()[-1]))
    return runs


def _cold(bundle: Path, root: Path, fp: Fingerprint) -> dict[str, Any]:
    runs = _cold_runs(bundle, root, fp, "as-installed")
    blocked = _cold_runs(bundle, root, fp, "block-pandas")
    bare = "import json, sys; print(json.dumps(sorted(sys.modules)))"
    base = set(
        json.loads(subprocess.run([sys.executable, "-c", bare], capture_output=True, check=True).stdout)
    )

    def heavy(mods: list[str]) -> list[str]:
        return sorted({h for h in HEAVY for m in mods if m == h or m.startswith(h + ".")})

    def tops(mods: list[str]) -> list[str]:
        # third-party and our own top-level packages (the standard library is left out)
        names = {m.split(".")[0] for m in set(mods) - base}
        return sorted(n for n in names if n not in sys.stdlib_module_names and not n.startswith("_"))

    last = runs[-1]
    return {
        "import_ms_median": round(statistics.median(r["import_ms"] for r in runs), 1),
        "first_admit_ms_median": round(statistics.median(r["first_admit_ms"] for r in runs), 1),
        # pyarrow's ChunkedArray.to_numpy (logical hash, artifacts) imports pandas when installed
        "first_admit_ms_median_pandas_blocked": round(
            statistics.median(r["first_admit_ms"] for r in blocked), 1
        ),
        "runs": COLD_RUNS,
        "footprint": {
            "import_runtime_plugin": {
                "modules_added": len(set(last["after_import"]) - base),
                "top_level_packages": tops(last["after_import"]),
                "heavy": heavy(last["after_import"]),
            },
            "after_first_admit": {
                "modules_added": len(set(last["after_admit"]) - base),
                "top_level_packages": tops(last["after_admit"]),
                "heavy": heavy(last["after_admit"]),
            },
        },
    }


def _warm_only() -> None:
    """One interpreter's warm medians, as JSON on stdout (for ``--compare-src``)."""
    tmp = Path(tempfile.mkdtemp(prefix="dspark-bench-admission-"))
    now = datetime.now(UTC)
    bundle, root, fp = _bundle(tmp, now)
    import dspark_calibrate

    out = {
        "package": str(Path(dspark_calibrate.__file__).parent),
        "with_state": _warm(
            bundle, root, fp, AdmissionPolicy(allow_synthetic=True, state_path=tmp / "state.json")
        ),
        "without_state": _warm(bundle, root, fp, AdmissionPolicy(allow_synthetic=True)),
    }
    print(json.dumps(out))


def _compare(baseline_src: Path, rounds: int) -> None:
    """Alternate warm runs of the baseline package and this checkout's, then record the ratios."""
    here = str(Path(__file__).resolve().parent.parent / "src")
    samples: dict[str, dict[str, list[float]]] = {
        side: {"with_state": [], "without_state": []} for side in ("baseline", "current")
    }
    packages = {}
    for r in range(rounds):
        order = ("baseline", "current") if r % 2 == 0 else ("current", "baseline")
        for side in order:
            env = dict(os.environ, PYTHONPATH=str(baseline_src) if side == "baseline" else here)
            proc = subprocess.run(
                [sys.executable, __file__, "--warm-json"],
                capture_output=True,
                check=True,
                env=env,
                timeout=600,
            )
            result = json.loads(proc.stdout.decode().strip().splitlines()[-1])
            packages[side] = result["package"]
            for mode in ("with_state", "without_state"):
                samples[side][mode].append(result[mode]["median_ms"])
        print(
            f"round {r + 1}/{rounds}: "
            + json.dumps({s: {m: v[-1] for m, v in d.items()} for s, d in samples.items()})
        )
    summary = {
        mode: {
            "baseline_median_ms": round(statistics.median(samples["baseline"][mode]), 3),
            "current_median_ms": round(statistics.median(samples["current"][mode]), 3),
            "ratio_current_over_baseline": round(
                statistics.median(samples["current"][mode]) / statistics.median(samples["baseline"][mode]), 3
            ),
            "per_round_ratios": [
                round(c / b, 3)
                for c, b in zip(samples["current"][mode], samples["baseline"][mode], strict=True)
            ],
        }
        for mode in ("with_state", "without_state")
    }
    path = write_result(
        "admission_ab",
        {
            "rounds": rounds,
            "runs_per_round": RUNS,
            "packages": packages,
            "baseline_src": str(baseline_src),
            "samples_median_ms": samples,
            **summary,
            "method": "each round runs both packages in fresh interpreters, alternating which goes first; "
            "each value is the median of RUNS warm admit() calls; the ratio is of the medians over rounds",
        },
    )
    print(json.dumps(summary, indent=2))
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description="admit() latency, import time and footprint")
    parser.add_argument("--compare-src", type=Path, help="another package's src/ to measure side by side")
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds with --compare-src")
    parser.add_argument("--warm-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.warm_json:
        _warm_only()
        return
    if args.compare_src is not None:
        _compare(args.compare_src.resolve(), args.rounds)
        return
    tmp = Path(tempfile.mkdtemp(prefix="dspark-bench-admission-"))
    now = datetime.now(UTC)
    bundle, root, fp = _bundle(tmp, now)
    with_state = _warm(bundle, root, fp, AdmissionPolicy(allow_synthetic=True, state_path=tmp / "state.json"))
    without_state = _warm(bundle, root, fp, AdmissionPolicy(allow_synthetic=True))
    results: dict[str, Any] = {
        "bundle": {
            "cells": 32,
            "ladder": list(LADDER),
            "k": K,
            "members": ["cost-table", "calibration", "admission"],
            "signature": "ed25519",
            "file_bytes": sum(p.stat().st_size for p in bundle.iterdir()),
        },
        "admit_warm_with_state": with_state,
        "admit_warm_without_state": without_state,
        "target_median_ms": TARGET_MS,
        "meets_target": with_state["median_ms"] <= TARGET_MS and without_state["median_ms"] <= TARGET_MS,
        "cold": _cold(bundle, root, fp),
        "notes": "admit() runs without the sentinel and with an explicit live fingerprint; live=None would "
        "probe the host (NVML, then torch.cuda when NVML is absent).",
    }
    path = write_result("admission", results)
    print(json.dumps(results, indent=2, sort_keys=True))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
