#!/bin/sh
# One device call: the CUDA backend's device check (every op, every kernel hg_decode_plan picks on
# this GPU and on an sm_80 plan, stream chains, batched kernels, transformers parity, graphs, the
# greedy feed, bad input), its lost-context run, the CPU backend against it, then the 8B decode
# bench (at most 590 s with the default limits). Prepare on the dev machine, from the repository root:
#   sh ../shared/device/stage-bun.sh && (cd packages/kernels-cpu && bun run build) && (cd packages/kernels-cuda && HYBRIDGEN_BUILD_CUDA=1 bun run build)
#   for f in packages/kernels-cuda/device/device-check.ts apps/bench/src/cuda/cpu-vs-cuda.ts apps/bench/src/cuda/bench.ts; do
#     bun build --target=bun --external 'bun:*' "$f" --outfile ".device/$(basename "$f" .ts).js"; done
# and carry [".device", "packages/kernels-cpu/lib", "packages/kernels-cuda/lib"].
set -u
. "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,serial,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${CHECK_S:-240}" bun .device/device-check.js > "$OUT/device-check.log" 2>&1
echo "device-check exit $?"; grep -E 'FAIL|ALL PASS|FAILED|^## ' "$OUT/device-check.log" | head -40
timeout 60 bun .device/device-check.js --trap > "$OUT/trap.log" 2>&1
echo "trap exit $?"; cat "$OUT/trap.log"
timeout "${CPU_S:-120}" bun .device/cpu-vs-cuda.js > "$OUT/cpu-vs-cuda.log" 2>&1
echo "cpu-vs-cuda exit $?"; cat "$OUT/cpu-vs-cuda.log"
timeout "${BENCH_S:-170}" bun .device/bench.js --contexts "${CONTEXTS:-2048,8192,32768}" ${BENCH_ARGS:---diag off} > "$OUT/bench.log" 2>&1
echo "bench exit $?"; sed -n '/^## /,$p' "$OUT/bench.log"
