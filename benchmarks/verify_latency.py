"""Verification latency against the read floor, and dspark-verify cold start.

In-process: ``verify_path`` (read + the whole pipeline) of a 32-cell cost table and of a
5,000-row artifact, against the floor of reading the same file with pyarrow; medians of 101 runs,
interleaved so drift hits all alike. Alongside, the sequential form (``read_artifact`` then
``verify_artifact``), which does not overlap decoding with the signature check. CLI: wall time of a cold ``dspark-verify`` process.

Run: ``.venv/bin/python benchmarks/verify_latency.py`` → ``benchmarks/results/verify_latency.json``.
Targets: verification <= 2x the read floor; CLI cold start <= 1.5 s.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import write_result

from dspark_calibrate.artifacts import (
    Expectation,
    Fingerprint,
    Provenance,
    canonical_json,
    generate_keypair,
    init_root,
    load_signer,
    public_key_of,
    read_artifact,
    sign_artifact,
    verify_artifact,
    verify_path,
    write_unsigned_artifact,
)
from dspark_calibrate.schemas import arrow_schema

RUNS = 101
K = 5


def _cost_rows(ladder: list[int]) -> list[dict[str, object]]:
    rows = []
    for g in ladder:
        native = 5.0 + 0.01 * g * (K + 1)
        for v in (0, 2 * g, 3 * g, 4 * g):
            t = 5.0 + 0.01 * (v or g * (K + 1))
            saving = 1.0 - t / native
            rows.append(
                {
                    "graph_batch_size": g,
                    "verifier_budget": v,
                    "step_time_ms": t,
                    "ci_low_ms": t * 0.99,
                    "ci_high_ms": t * 1.01,
                    "p10_ms": t * 0.98,
                    "p90_ms": t * 1.02,
                    "samples": 50,
                    "stop_reason": "precision",
                    "source_result_sha256": f"{g:032x}{v:032x}",
                    # The paired columns every cost table carries (schema 2 on): a native row saves 0.
                    "saving": saving,
                    "saving_ci_low": saving - (0.002 if v else 0.0),
                    "saving_ci_high": saving + (0.002 if v else 0.0),
                    "paired_rounds": 0 if v == 0 else 12,
                    "common_mode_rel": 0.003,
                    "level_rel": 0.004,
                }
            )
    return rows


def _samples_rows(n: int) -> list[dict[str, object]]:
    return [
        {
            "graph_batch_size": 8 * (1 + i % 8),
            "verifier_budget": 0,
            "round": i // 8,
            "rank": 0,
            "sample_index": i,
            "step_time_ms": 5.0 + (i % 97) / 100,
            "replays": 8,
            "sm_clock_mhz": 1980.0,
            "temperature_c": 55.0,
            "power_w": 600.0,
            "throttle_reasons": 0,
            "kept": True,
            "epoch": i // 64,
            "prev_graph_batch_size": None if i == 0 else 8 * (1 + (i - 1) % 8),
            "prev_verifier_budget": None if i == 0 else 0,
            "warmup": 4,
            "first_replay_ms": 5.1 + (i % 97) / 100,
        }
        for i in range(n)
    ]


def _time(fn: object, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dspark-bench-"))
    pair = generate_keypair(tmp)
    signer = load_signer(pair.private_path)
    key = public_key_of(signer)
    now = datetime.now(UTC)
    root = init_root(
        root_signers=[signer],
        root_keys=[key],
        root_threshold=1,
        artifact_keys=[key],
        artifact_threshold=1,
        expires=now + timedelta(days=30),
    )
    (tmp / "root.json").write_bytes(root.to_bytes())
    ladder = [8, 16, 32, 48, 64, 96, 128, 256]
    fp = Fingerprint(
        gpu="H200",
        gpu_count=1,
        gpu_snapshot_sha256="a" * 64,
        topology="TP1",
        source_head="abc",
        source_diff_sha256="b" * 64,
        runtime_snapshot="bench",
        max_draft_len=K,
        rank_local_graph_batch_sizes=tuple(ladder),
        global_graph_batch_sizes=tuple(ladder),
    )
    prov = Provenance(tool_version="bench", backend="synthetic", synthetic=True)
    cases = {
        "cost_table_32_cells": ("cost-table", _cost_rows(ladder)),
        "samples_5000_rows": ("sweep-samples", _samples_rows(5000)),
    }
    results: dict[str, object] = {}
    for name, (kind, rows) in cases.items():
        path = tmp / f"{name}.parquet"
        write_unsigned_artifact(
            path,
            pa.Table.from_pylist(rows, schema=arrow_schema(kind)),
            kind=kind,
            fingerprint=fp,
            provenance=prov,
        )
        sign_artifact(
            read_artifact(path), [signer], version=1, issued_at=now, expires_at=now + timedelta(days=1)
        )
        expected = Expectation(kind=kind, fingerprint=fp, allow_synthetic=True)
        report = verify_path(path, root, now=now, expected=expected)
        assert report.ok, report.message
        verify_s, seq_s, floor_s = [], [], []
        for _ in range(RUNS):  # interleaved: the same drift hits all three
            verify_s += _time(lambda p=path, e=expected: verify_path(p, root, now=now, expected=e), 1)
            seq_s += _time(
                lambda p=path, e=expected: verify_artifact(read_artifact(p), root, now=now, expected=e), 1
            )
            floor_s += _time(lambda p=path: pq.read_table(p), 1)
        med_v, med_s, med_f = (statistics.median(x) for x in (verify_s, seq_s, floor_s))
        results[name] = {
            "rows": len(rows),
            "file_bytes": path.stat().st_size,
            "verify_ms_median": round(med_v * 1e3, 4),
            "read_floor_ms_median": round(med_f * 1e3, 4),
            "ratio": round(med_v / med_f, 3),
            # The same checks with the table read first (no overlap of decode and signature check).
            "sequential_ms_median": round(med_s * 1e3, 4),
            "sequential_ratio": round(med_s / med_f, 3),
            "runs": RUNS,
            "target_ratio": 2.0,
            "steps_ms_first_run": {k: round(v * 1e3, 4) for k, v in report.timings},
        }
    # Cold CLI start: a fresh process each time, as a launcher would run it.
    exe = Path(sys.executable).with_name("dspark-verify")
    cmd = [
        str(exe),
        str(tmp / "cost_table_32_cells.parquet"),
        "--trust-root",
        str(tmp / "root.json"),
        "--allow-synthetic",
    ]
    env = dict(os.environ)
    cold = []
    for _ in range(7):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, env=env)
        cold.append(time.perf_counter() - t0)
        assert proc.returncode == 0, proc.stderr.decode()
    help_cold = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([str(exe), "--help"], capture_output=True, env=env, check=True)
        help_cold.append(time.perf_counter() - t0)
    results["cli_cold_start_s_median"] = round(statistics.median(cold), 3)
    results["cli_help_s_median"] = round(statistics.median(help_cold), 3)
    results["cli_target_s"] = 1.5
    results["cli_runs"] = len(cold)
    path = write_result("verify_latency", results)
    print(canonical_json(results).decode())
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
