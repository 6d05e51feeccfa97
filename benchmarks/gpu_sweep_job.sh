#!/usr/bin/env bash
# GPU jobs of the sweep benchmark (issue 3). Run from the repository root; results go under $OUT.
#
#   bash benchmarks/gpu_sweep_job.sh job1        # 1 x H200: adaptive + fixed sweeps, same cells, same job
#   bash benchmarks/gpu_sweep_job.sh job2        # 1 x H200, a separate job: a second adaptive sweep
#   bash benchmarks/gpu_sweep_job.sh job3        # 1 x H200, a third job: out-of-sample check of the intervals
#   bash benchmarks/gpu_sweep_job.sh job4        # 1 x H200, a fourth job (another machine start)
#   bash benchmarks/gpu_sweep_job.sh tp2         # 2 x H200: 2-rank torchrun sweep, tensor-parallel model
#   bash benchmarks/gpu_sweep_job.sh heavy       # 1 x H200: two separate jobs of a compute-bound step
#                                                # (8 Llama-8B layers, ladder 8..256, power-capped)
#   bash benchmarks/gpu_sweep_job.sh compare-heavy DIR1 DIR2   # CPU: heavy_step in sweep_efficiency.json
#   bash benchmarks/gpu_sweep_job.sh compare DIR1 DIR2 [DIR_TP [DIR3 [DIR4]]]   # CPU: write sweep_efficiency.json
#   bash benchmarks/gpu_sweep_job.sh smoke       # CPU: the same pipeline on the tiny config, in seconds
#
# Each GPU job stays under 8 minutes: sweep budgets are capped (150 s adaptive, 230 s fixed) and the
# whole command runs under `timeout 470`.
set -euo pipefail
: "${OUT:?set OUT to the directory results should be written to}"
cd "$(dirname "$0")/.."
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_NCCL_AVOID_RECORD_STREAMS=1
PY=${PYTHON:-python3}
MODEL=(--k 5 --ladder 1,2,4,8,16,32 --config deepseek-v3 --layers 4 --context-len 2048 --ep 8)
# A compute-bound step: 8 Llama-3-8B-shaped layers, K=5, ladder to 256 rows (1,536 tokens at full
# width), six candidate budgets per G (1.5-5 tokens per row). With NVML telemetry on, an H200 runs
# it at its power cap: the serving condition the default throttle policy keeps.
HEAVY=(--k 5 --ladder 8,16,32,64,128,256 --config "${HEAVY_CONFIG:-llama-8b}" --layers "${HEAVY_LAYERS:-8}"
       --context-len 1024 --ep 1 --replays "${HEAVY_REPLAYS:-2}"
       --budgets 8:12,16,20,24,32,40 --budgets 16:24,32,40,48,64,80 --budgets 32:48,64,80,96,128,160
       --budgets 64:96,128,160,192,256,320 --budgets 128:192,256,320,384,512,640
       --budgets 256:384,512,640,768,1024,1280)

log_env() {
  mkdir -p "$OUT/$1"
  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv || true
    "$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' || true
  } > "$OUT/$1/env.txt" 2>&1
}

case "${1:-}" in
  job1)
    log_env job1
    timeout 470 "$PY" benchmarks/sweep_efficiency.py run --tag job1 --protocols adaptive,fixed --seed 1 \
      "${MODEL[@]}" --out-dir "$OUT/job1" 2>&1 | tee "$OUT/job1/log.txt"
    ;;
  job2)
    log_env job2
    timeout 470 "$PY" benchmarks/sweep_efficiency.py run --tag job2 --protocols adaptive --seed 2 \
      "${MODEL[@]}" --out-dir "$OUT/job2" 2>&1 | tee "$OUT/job2/log.txt"
    ;;
  job3|job4)
    log_env "$1"
    seed=${1#job}
    timeout 470 "$PY" benchmarks/sweep_efficiency.py run --tag "$1" --protocols adaptive --seed "$seed" \
      "${MODEL[@]}" --out-dir "$OUT/$1" 2>&1 | tee "$OUT/$1/log.txt"
    ;;
  tp2)
    log_env tp2
    timeout 470 "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 \
      benchmarks/sweep_efficiency.py run --tag tp2 --protocols adaptive --seed 3 \
      "${MODEL[@]}" --out-dir "$OUT/tp2" 2>&1 | tee "$OUT/tp2/log.txt"
    ;;
  heavy)
    # Two separate processes, back to back: each one's intervals are out of sample for the other.
    # HEAVY_JOBS="heavy1" then "heavy2" runs them as two calls (a longer budget each);
    # HEAVY_EXTRA adds sweep options (e.g. "--max-samples 128").
    for job in ${HEAVY_JOBS:-heavy1 heavy2}; do
      log_env "$job"
      seed=${job#heavy}
      # shellcheck disable=SC2086
      timeout "${HEAVY_TIMEOUT:-280}" "$PY" benchmarks/sweep_efficiency.py run --tag "$job" --protocols adaptive \
        --seed "$seed" "${HEAVY[@]}" --adaptive-budget ${HEAVY_BUDGET:-150} --passes "${HEAVY_PASSES:-1}" \
        ${HEAVY_EXTRA:-} --out-dir "$OUT/$job" 2>&1 | tee "$OUT/$job/log.txt"
    done
    ;;
  compare-heavy)
    "$PY" benchmarks/sweep_efficiency.py compare-heavy --job1 "$2" --job2 "$3" \
      --out "${RESULT:-benchmarks/results/sweep_efficiency.json}"
    ;;
  heavy-smoke)
    SMOKE=(--k 3 --ladder 2,4 --config tiny --layers 1 --context-len 32 --ep 1 --device cpu --preset quick
           --precision 0.05 --adaptive-budget 20 --budgets 2:3,4,5 --budgets 4:6,8,10)
    for job in heavy1 heavy2; do
      "$PY" benchmarks/sweep_efficiency.py run --tag "$job" --protocols adaptive --seed "${job#heavy}" "${SMOKE[@]}" \
        --passes "${HEAVY_PASSES:-1}" --out-dir "$OUT/$job"
    done
    RESULT="$OUT/sweep_efficiency.json" "$0" compare-heavy "$OUT/heavy1" "$OUT/heavy2"
    ;;
  compare)
    "$PY" benchmarks/sweep_efficiency.py compare --job1 "$2" --job2 "$3" ${4:+--tp "$4"} ${5:+--job3 "$5"} ${6:+--job3 "$6"} \
      --out "$OUT/sweep_efficiency.json"
    ;;
  smoke)
    SMOKE=(--k 3 --ladder 1,2,4 --config tiny --layers 1 --context-len 32 --ep 1 --device cpu --preset quick
           --precision 0.05 --adaptive-budget 20 --fixed-budget 60)
    "$PY" benchmarks/sweep_efficiency.py run --tag s1 --protocols adaptive,fixed --seed 1 "${SMOKE[@]}" --out-dir "$OUT/s1"
    "$PY" benchmarks/sweep_efficiency.py run --tag s2 --protocols adaptive --seed 2 "${SMOKE[@]}" --out-dir "$OUT/s2"
    "$PY" benchmarks/sweep_efficiency.py compare --job1 "$OUT/s1" --job2 "$OUT/s2" --out "$OUT/sweep_efficiency.json"
    ;;
  *)
    echo "usage: OUT=dir bash benchmarks/gpu_sweep_job.sh {job1|job2|job3|job4|tp2|heavy|compare DIR1 DIR2 [DIR_TP [DIR3 [DIR4]]]|compare-heavy DIR1 DIR2|smoke|heavy-smoke}" >&2
    exit 2
    ;;
esac
