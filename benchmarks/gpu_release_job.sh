#!/usr/bin/env bash
# One H200 call for the release measurements: the gated end-to-end run (device planner by default,
# the host planner beside it at every level, the forced-K overhead measured in the serving loop
# before build), then the device-planner benchmark on the same trained weights, then, if time is
# left, the heavy-step sweep on a wider step. Everything that matters is copied to $OUT (at most
# eight files come back from a lent machine); the rest stays in $WORK.
#
#   OUT=/results bash benchmarks/gpu_release_job.sh            # about 9 minutes
#
# Needs the toolkit's wheels in .whl/ (cryptography, cffi, pycparser, securesystemslib, tuf,
# urllib3, filelock, PyYAML for Python 3.12; see docs/e2e.md) unless they are installed already.
set -uo pipefail
: "${OUT:?set OUT to the directory results should be written to}"
cd "$(dirname "$0")/.."
start=$(date +%s)
left() { echo $(( ${LIMIT_S:-585} - ($(date +%s) - start) )); }
WORK=${WORK:-/tmp/release}
mkdir -p "$WORK" "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH="src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export GIT_COMMIT=$COMMIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$OUT/env.txt" 2>&1

# 1. The gated end-to-end run; it rewrites e2e.json after every stage, so a cut run still reports.
timeout "${E2E_TIMEOUT:-390}" python3 benchmarks/e2e/run.py --out "$WORK/e2e" --checkpoint "$WORK/weights.pt" \
  --budget-s "${E2E_BUDGET:-330}" ${E2E_ARGS:-} > "$OUT/e2e_log.txt" 2>&1
echo "e2e rc=$? after $(( $(date +%s) - start )) s"
cp "$WORK/e2e/e2e.json" "$WORK/e2e/e2e.png" "$OUT/" 2>/dev/null

# 2. The device planner against the host planner, on the same weights.
if [ "$(left)" -gt 60 ] && [ "${DP:-1}" = 1 ]; then
  timeout $(( $(left) - 20 )) python3 benchmarks/device_planner.py --out "$WORK/dp" --checkpoint "$WORK/weights.pt" \
    > "$OUT/device_planner_log.txt" 2>&1
  echo "device planner rc=$? after $(( $(date +%s) - start )) s"
  cp "$WORK/dp/device_planner.json" "$OUT/" 2>/dev/null
fi

# 3. The heavy step on wider layers (Llama-70B-shaped), if at least two minutes are left.
if [ "$(left)" -gt 150 ] && [ "${HEAVY:-1}" = 1 ]; then
  passes=${HEAVY_PASSES:-1}
  budget=$(( ($(left) - 30 - 30 * passes) / 2 )); [ "$budget" -gt 90 ] && budget=90
  OUT="$WORK/heavy" HEAVY_BUDGET=$budget HEAVY_CONFIG=llama-70b HEAVY_LAYERS=4 HEAVY_REPLAYS=4 HEAVY_PASSES=$passes \
    bash benchmarks/gpu_sweep_job.sh heavy > "$WORK/heavy_log.txt" 2>&1
  echo "heavy rc=$? after $(( $(date +%s) - start )) s"
  RESULT="$WORK/heavy/sweep_efficiency_heavy.json" bash benchmarks/gpu_sweep_job.sh compare-heavy \
    "$WORK/heavy/heavy1" "$WORK/heavy/heavy2" >> "$WORK/heavy_log.txt" 2>&1
  tar czf "$OUT/heavy.tgz" -C "$WORK" heavy heavy_log.txt 2>/dev/null
fi
ls -la "$OUT"
