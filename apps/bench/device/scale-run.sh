#!/bin/sh
# One device call: issue 22's scale run on the H200 machine (Llama-3.1-8B shape, dummy bf16
# weights, bf16 KV, batch 1): a real chunked prefill of 256K tokens, 1.5M tokens with synthetic
# KV (GPU window + host), then 2M with synthetic KV and the disk tier (last: its fill writes ~45 GiB
# through the tier's file mappings, 150 s or more). Each run prints the planner's bytes per tier
# and predicted ms/token beside the measurement. BATCH=B instead runs the 2M equivalent in a batch,
# a call of its own (the three runs fill one): B sequences of 2M/B tokens with synthetic KV and the
# disk tier, each its own tiered store on a B-th of every tier and of the host budget:
#   BATCH=4 sh apps/bench/device/scale-run.sh    # bun .device/scale-run.js --contexts 500000 --batch 4 --synthetic-kv --kv-disk DIR --host-kv-budget 100G
# Prepare on the dev machine:
#   sh ../shared/device/stage-bun.sh && (cd packages/kernels-cpu && bun run build) && (cd packages/kernels-cuda && HYBRIDGEN_BUILD_CUDA=1 bun run build)
#   bun build --target=bun --external 'bun:*' apps/bench/src/scale-run.ts --outfile .device/scale-run.js
# and carry [".device", "packages/kernels-cpu/lib", "packages/kernels-cuda/lib"].
set -u
. "$(dirname "$0")/device-env.sh"
DISK=${KV_DISK:-/var/tmp/hg-kv} # the disk tier's files: never under $OUT (they would come back)
mkdir -p "$DISK"
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader | tee "$OUT/machine.txt"
lscpu | grep -E 'Model name|^CPU\(s\)|NUMA node' | tee -a "$OUT/machine.txt"
free -g | tee -a "$OUT/machine.txt"; df -h "$DISK" | tee -a "$OUT/machine.txt"
run() { name=$1; limit=$2; shift 2
  timeout "$limit" bun .device/scale-run.js "$@" > "$OUT/$name.log" 2>&1
  s=$?; echo "$name exit $s (files left in $DISK: $(ls "$DISK" | wc -l))"; sed -n '/^| [0-9]/p' "$OUT/$name.log" | tail -1; grep -E 'refused|Error|error' "$OUT/$name.log" | head -3
}
if [ -n "${BATCH:-}" ]; then
  run "scale-2M-batch$BATCH" "${S4:-540}" --contexts $((2000000 / BATCH)) --batch "$BATCH" --synthetic-kv --steps "${STEPS:-12}" --kv-disk "$DISK" --host-kv-budget "${HOST_BUDGET:-100G}" ${ARGS:-}
  exit 0
fi
run prefill-256K "${S3:-170}" --contexts 262144 --steps 12 --window 32768 ${ARGS:-}  # a window below the context: the prefill offloads for real
run scale-1.5M "${S1:-110}" --contexts 1500000 --synthetic-kv --steps "${STEPS:-12}" ${ARGS:-}
run scale-2M "${S2:-300}" --contexts 2000000 --synthetic-kv --steps "${STEPS:-12}" --kv-disk "$DISK" --host-kv-budget "${HOST_BUDGET:-100G}" ${ARGS:-}
