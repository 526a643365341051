#!/bin/sh
# One device call: issue 36's serving table — `hybridgen serve` on the Llama-3.1-8B shape (dummy bf16
# weights, bf16 KV) with the GPU capped below the workload's KV (--gpu-mem), N clients sending
# ~32K-token prompts at once (the byte tokenizer of a preset: a byte a token), full attention
# against hybrid, each a server of its own, through apps/bench/src/serve-bench.ts. Prepare on the
# dev machine:
#   sh ../shared/device/stage-bun.sh && (cd packages/kernels-cpu && bun run build) && (cd packages/kernels-cuda && HYBRIDGEN_BUILD_CUDA=1 bun run build)
#   bun build --target=bun --external 'bun:*' apps/cli/src/hybridgen.ts --outfile .device/hybridgen.js
#   bun build --target=bun --external 'bun:*' apps/bench/src/serve-bench.ts --outfile .device/serve-bench.js
# and carry [".device", "packages/kernels-cpu/lib", "packages/kernels-cuda/lib"]. $OUT/serve.json is
# docs/performance/h200/serve/serve.json's source (the machine in $OUT/machine.txt).
set -u
. "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/machine.txt"; free -g | head -2 | tee -a "$OUT/machine.txt"
N=${N:-8} PROMPT=${PROMPT:-32000} OUTPUT=${OUTPUT:-256} GPU_MEM=${GPU_MEM:-32G}
COMMON="--model preset:llama-3.1-8b --dummy-weights --dtype bf16 --kv-dtype bf16 --device cuda --context $((PROMPT + OUTPUT + 64)) --prefill-block ${BLOCK:-2048} --gpu-mem $GPU_MEM --max-batch $N --max-queue 64"
SOURCE="apps/bench serve-bench: hybridgen serve, preset:llama-3.1-8b dummy bf16 weights, bf16 KV, --gpu-mem $GPU_MEM, $N clients of $PROMPT-token prompts + $OUTPUT tokens, $(head -1 "$OUT/machine.txt"), $(date -u +%F)"
bench() { label=$1; limit=$2; shift 2
  timeout "$limit" bun .device/serve-bench.js --server "bun .device/hybridgen.js" --serve "$COMMON $*" --clients "$N" --requests "$N" --rates inf \
    --prompt-bytes "$PROMPT" --output-tokens "$OUTPUT" --spread 0 --label "$label" --json "$OUT/serve.json" --source "$SOURCE" > "$OUT/$label.log" 2>&1
  echo "$label exit $?"; grep -E '^\| (all|[0-9])|error|Error' "$OUT/$label.log" | head -5
}
bench full "${FULL_S:-80}"
bench hybrid "${HYBRID_S:-100}" --attention hybrid --gpu-kv-budget "${WINDOW:-2048}" ${HYBRID_ARGS:-}
