#!/usr/bin/env bash
# One H200 call for the mixed prefill+decode proof (docs/mixed.md, docs/e2e.md): train (or reuse
# --checkpoint), serve with prefill traffic, sweep decode and mixed cells on the engine's own steps,
# build the decode-only and the decode + mixed bundles, admit both, and compare static K, decode-only
# evidence and decode + mixed evidence on the same prompts and arrival schedule. e2e_mixed.json is
# rewritten after every stage, so a cut run still reports. At most eight files come back.
#
#   COMMIT=$(git rev-parse HEAD) OUT=$OUT bash benchmarks/gpu_mixed_job.sh        # about 5-7 minutes (stops at 540 s)
#
# MIXED_ARGS passes options to benchmarks/e2e/mixed.py (e.g. "--ungated" to run the dynamic arms
# where the signed economics refuse them). Needs the toolkit's wheels in .whl/ (cryptography, cffi,
# pycparser, securesystemslib, tuf, urllib3, filelock, PyYAML for Python 3.12) unless installed.
set -uo pipefail
: "${OUT:?set OUT to the directory results should be written to}"
cd "$(dirname "$0")/.."
start=$(date +%s)
WORK=${WORK:-/tmp/mixed}
mkdir -p "$WORK" "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH="src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export GIT_COMMIT=$COMMIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$OUT/env.txt" 2>&1

# The script stops extra rounds before --budget-s; the timeout is the last resort. The result file
# is rewritten after every stage and copied to $OUT every 5 s, so a run cut from outside still reports.
( while sleep 5; do cp -f "$WORK/e2e/e2e_mixed.json" "$OUT/" 2>/dev/null; done ) &
copier=$!
timeout "${MIXED_TIMEOUT:-540}" python3 benchmarks/e2e/mixed.py --out "$WORK/e2e" --checkpoint "$WORK/weights.pt" \
  --budget-s "${MIXED_BUDGET:-480}" ${MIXED_ARGS:-} > "$OUT/e2e_mixed_log.txt" 2>&1
echo "mixed e2e rc=$? after $(( $(date +%s) - start )) s"
kill "$copier" 2>/dev/null
cp -f "$WORK/e2e/e2e_mixed.json" "$OUT/" 2>/dev/null
tar czf "$OUT/toolkit_mixed.tgz" -C "$WORK/e2e" --exclude='*.pem' toolkit/workload.parquet toolkit/workload.mixed.parquet \
  toolkit/mixed-sweep.parquet toolkit/mixed-sweep.samples.parquet 2>/dev/null
ls -la "$OUT"
