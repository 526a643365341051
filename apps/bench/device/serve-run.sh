#!/bin/sh
# One device call: issue 36's serving table — `hybridgen serve` on the Llama-3.1-8B shape (dummy bf16
# weights, bf16 KV) with the GPU capped below the workload's KV (--gpu-mem), N clients sending
# ~32K-token prompts at once (a preset's byte tokenizer: a byte a token), full attention against
# hybrid attention with the page index (ranked on the device), each a server of its own, through
# apps/bench/src/serve-bench.ts; if the hybrid server fails early, the page index ranked on the host
# in the time left. From $DEVICE_DIR (default .device): bun.xz, hybridgen.js, serve-bench.js,
# lib/libhgcpu.so, lib/libhgcuda.so. Prepare on the dev machine:
#   sh ../shared/device/stage-bun.sh && (cd packages/kernels-cpu && bun run build) && (cd packages/kernels-cuda && HYBRIDGEN_BUILD_CUDA=1 bun run build)
#   bun build --target=bun --external 'bun:*' apps/cli/src/hybridgen.ts --outfile .device/hybridgen.js
#   bun build --target=bun --external 'bun:*' apps/bench/src/serve-bench.ts --outfile .device/serve-bench.js
# $OUT/serve.json is docs/performance/<machine>/serve/serve.json's source (the machine in $OUT/machine.txt).
set -u
D=${DEVICE_DIR:-.device}
export HYBRIDGEN_KERNELS_CPU_LIB="${HYBRIDGEN_KERNELS_CPU_LIB:-$PWD/$D/lib/libhgcpu.so}" HYBRIDGEN_KERNELS_CUDA_LIB="${HYBRIDGEN_KERNELS_CUDA_LIB:-$PWD/$D/lib/libhgcuda.so}"
mkdir -p /tmp/bunbin && xz -dc "$D/bun.xz" > /tmp/bunbin/bun && chmod +x /tmp/bunbin/bun
export PATH=/tmp/bunbin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/machine.txt"; free -g | grep Mem | tee -a "$OUT/machine.txt"
N=${N:-8} PROMPT=${PROMPT:-32000} OUTPUT=${OUTPUT:-256} GPU_MEM=${GPU_MEM:-24G} BLOCK=${BLOCK:-2048} WINDOW=${WINDOW:-2048}
COMMON="--model preset:llama-3.1-8b --dummy-weights --dtype bf16 --kv-dtype bf16 --device cuda --context $((PROMPT + OUTPUT + 64)) --prefill-block $BLOCK --gpu-mem $GPU_MEM --max-batch $N --max-queue 64"
SOURCE="apps/bench serve-bench: hybridgen serve, preset:llama-3.1-8b dummy bf16 weights, bf16 KV, --gpu-mem $GPU_MEM, $N clients of $PROMPT-token prompts + $OUTPUT tokens at once, prefill block $BLOCK, $(head -1 "$OUT/machine.txt"), $(date -u +%F)"
bench() { label=$1; limit=$2; shift 2
  t0=$(date +%s)
  timeout "$limit" bun "$D/serve-bench.js" --server "bun $D/hybridgen.js" --serve "$COMMON $*" --clients "$N" --requests "$N" --rates inf \
    --prompt-bytes "$PROMPT" --output-tokens "$OUTPUT" --spread 0 --label "$label" --json "$OUT/serve.json" --source "$SOURCE" > "$OUT/$label.log" 2>&1
  s=$?; echo "$label exit $s in $(( $(date +%s) - t0 )) s"; grep -E '^\| (all|[0-9])|rror' "$OUT/$label.log" | head -5
  return $s
}
start=$(date +%s)
bench full "${FULL_S:-65}"
HYBRID="--attention hybrid --gpu-kv-budget $WINDOW --selector index"
left=$(( ${TOTAL_S:-168} - ($(date +%s) - start) ))
t1=$(date +%s)
if ! bench hybrid-index "$left" $HYBRID; then
  left=$(( ${TOTAL_S:-168} - ($(date +%s) - start) ))
  [ $(( $(date +%s) - t1 )) -lt 40 ] && [ "$left" -gt 30 ] && bench hybrid-index-host "$left" $HYBRID --selector-options '{"placement":"host"}'
fi
exit 0
