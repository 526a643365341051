#!/bin/sh
# One device call: the baselines' parity on CUDA (flexgen, moe-lightning, all-tokens against full
# attention; the selective ones run), then `hybridgen bench` with every configuration, results
# under $OUT/bench (bench.json, the tables, Figs. 15/16/17/21 as SVG). Prepare on the dev machine:
#   sh ../shared/device/stage-bun.sh && (cd packages/kernels-cpu && bun run build) && (cd packages/kernels-cuda && bun run build)
#   bun build --target=bun --external 'bun:*' apps/cli/src/hybridgen.ts --outfile .device/hybridgen.js
#   bun build --target=bun --external 'bun:*' apps/bench/src/baseline-parity.ts --outfile .device/baseline-parity.js
# and carry [".device", "packages/kernels-cpu/lib", "packages/kernels-cuda/lib"].
# MODELS, CONTEXTS, BATCHES, STEPS, BUDGET (--gpu-kv-budget), K and BENCH_ARGS override the bench.
# The defaults (every config × 3 contexts × 3 batch sizes; flexgen streams every offloaded row a
# step, ×16 at batch 16) need more than one 10-minute call: run one figure a call, e.g.
#   Fig. 16 + 21: SKIP_PARITY=1 CONTEXTS=2048,8192,32768,131000 BATCHES=1 (parity: the default call)
#   Fig. 17:      SKIP_PARITY=1 CONTEXTS=8192 BATCHES=1,4,16
#   Fig. 15:      SKIP_PARITY=1 CONTEXTS=8192 BATCHES=1 MODELS=preset:llama-3.1-8b,preset:qwen2.5-7b
# (each call's --out holds that figure's SVG and its bench.json).
set -u
. "$(dirname "$0")/device-env.sh"
mkdir -p "$OUT/bench"
nvidia-smi --query-gpu=name,serial,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/gpu.txt"
if [ "${SKIP_PARITY:-0}" != 1 ]; then
  timeout "${CHECK_S:-150}" bun .device/baseline-parity.js --backend cuda --preset "${PARITY_PRESET:-llama-3.2-1b}" > "$OUT/parity.log" 2>&1
  echo "parity exit $?"; cat "$OUT/parity.log" | cut -c1-220
fi
timeout "${BENCH_S:-400}" bun .device/hybridgen.js bench --device cuda --dummy-weights \
  --model "${MODELS:-preset:llama-3.1-8b}" --contexts "${CONTEXTS:-2048,8192,32768}" --batch "${BATCHES:-1,4,16}" \
  --steps "${STEPS:-24}" --warmup 4 --gpu-kv-budget "${BUDGET:-1024}" --sink-tokens 4 --k "${K:-256}" \
  --out "$OUT/bench" ${BENCH_ARGS:-} > "$OUT/bench/tables.md" 2> "$OUT/bench/progress.log"
echo "bench exit $?"; cat "$OUT/bench/tables.md"; tail -5 "$OUT/bench/progress.log"
