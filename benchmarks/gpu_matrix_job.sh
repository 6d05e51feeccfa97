#!/usr/bin/env bash
# One H200 call per part of the prediction matrix (docs/e2e.md, "The prediction matrix"): the
# gated build's prediction against what an ungated dynamic arm realises, over two seeds of decode
# C=256, decode C=64 and prefill traffic with about 50% and 25% of the steps mixed. Run the two
# parts back to back on the same machine: the first trains and keeps the checkpoint, sweeps and
# fits in $WORK (/tmp survives between calls); the second reuses the checkpoint and merges its
# runs into the first part's result.
#
#   COMMIT=$(git rev-parse HEAD) OUT=$OUT bash benchmarks/gpu_matrix_job.sh decode   # about 8 minutes
#   COMMIT=$(git rev-parse HEAD) OUT=$OUT bash benchmarks/gpu_matrix_job.sh mixed    # about 7 minutes
#
# What comes back in $OUT (five files): prediction_matrix.json (both parts so far, rewritten after
# every stage and round), prediction_matrix.png, matrix_<part>_log.txt, env.txt and
# matrix_<part>_toolkit.tgz (the part's recorded workloads, sweep, fit and build reports).
# MATRIX_BUDGET (default 480 s) stops adding rounds; MATRIX_TIMEOUT (default 545 s) is the last
# resort; MATRIX_ARGS passes other options (e.g. "--seeds 3,4"). Needs the toolkit's wheels in
# .whl/ (cryptography, cffi, pycparser, securesystemslib, tuf, urllib3 for Python 3.12) unless
# they are installed already.
set -uo pipefail
: "${OUT:?set OUT to the directory results should be written to}"
PART=${1:-${PART:-all}}
cd "$(dirname "$0")/.."
start=$(date +%s)
WORK=${WORK:-/tmp/prediction-matrix}
mkdir -p "$WORK" "$OUT"
if compgen -G ".whl/*.whl" >/dev/null && [ ! -f /tmp/site/.matrix-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.matrix-wheels || exit 1
fi
export PYTHONPATH="src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export GIT_COMMIT=$COMMIT
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$OUT/env.txt" 2>&1

# The script stops adding rounds before --budget-s and rewrites the result after every stage; the
# copier brings it to $OUT every 5 s, so a run cut from outside still reports what it measured.
( while sleep 5; do cp -f "$WORK/prediction_matrix.json" "$OUT/" 2>/dev/null; done ) &
copier=$!
timeout "${MATRIX_TIMEOUT:-545}" python3 benchmarks/e2e/matrix.py --part "$PART" --work "$WORK" --out "$WORK/out" \
  --budget-s "${MATRIX_BUDGET:-480}" ${MATRIX_ARGS:-} > "$OUT/matrix_${PART}_log.txt" 2>&1
echo "matrix part $PART rc=$? after $(( $(date +%s) - start )) s"
kill "$copier" 2>/dev/null
cp -f "$WORK/prediction_matrix.json" "$OUT/" 2>/dev/null
cp -f "$WORK/out/prediction_matrix.png" "$OUT/" 2>/dev/null
parts=$([ "$PART" = all ] && echo "decode mixed" || echo "$PART")
( cd "$WORK" && tar czf "$OUT/matrix_${PART}_toolkit.tgz" --exclude='*.pem' --exclude='*.journal.jsonl' \
  $(for p in $parts; do echo "$p/toolkit/sweep.parquet $p/toolkit/deployment.json $p/toolkit/fit"; \
    ls -d "$p"/*-s*/workload*.parquet "$p"/*-s*/bundle/report 2>/dev/null; done) 2>/dev/null )
ls -la "$OUT"
