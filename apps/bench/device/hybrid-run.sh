#!/bin/sh
# One device call: the CUDA hybrid checks (every logits mode against full attention and the CPU
# backend), then hybrid-modes at 32K and 128K with traces under $OUT. Prepare on the dev machine:
#   sh ../shared/device/stage-bun.sh && (cd packages/kernels-cpu && bun run build) && (cd packages/kernels-cuda && HYBRIDGEN_BUILD_CUDA=1 bun run build)
#   bun build --target=bun --external 'bun:*' apps/bench/src/hybrid-modes.ts --outfile .device/hybrid-modes.js
#   bun build --target=bun --external 'bun:*' apps/bench/src/cuda/hybrid-bench.ts --outfile .device/hybrid-bench.js
# and carry [".device", "packages/kernels-cpu/lib", "packages/kernels-cuda/lib"]. With .device/base (prepare-base.sh BASE)
# the same configs then run from BASE's build: a same-run baseline for a change.
set -u
. "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,serial,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/gpu.txt"
timeout "${CHECK_S:-120}" bun .device/hybrid-bench.js --skip-bench > "$OUT/checks.log" 2>&1
echo "checks exit $?"; grep -E 'PASS|FAIL' "$OUT/checks.log"
timeout "${BENCH_S:-420}" bun .device/hybrid-modes.js --contexts "${CONTEXTS:-4096,32768,131000}" --steps "${STEPS:-64}" --trace-dir "$OUT/traces" \
  --source "apps/bench hybrid-modes, one H200 + 16-core host, $(date -u +%F)" ${BENCH_ARGS:-} > "$OUT/hybrid-modes.log" 2>&1
echo "bench exit $?"; sed -n '/^## /,$p' "$OUT/hybrid-modes.log"; tail -3 "$OUT/hybrid-modes.log"
# The baseline arm of a same-run A/B (prepare-base.sh): the same checks and configs from BASE's bundles and libraries.
if [ -f .device/base/hybrid-modes.js ]; then
  export HYBRIDGEN_KERNELS_CPU_LIB=$PWD/.device/base/lib/libhgcpu.so HYBRIDGEN_KERNELS_CUDA_LIB=$PWD/.device/base/lib/libhgcuda.so
  timeout "${CHECK_S:-120}" bun .device/base/hybrid-bench.js --skip-bench > "$OUT/checks-base.log" 2>&1
  echo "base checks exit $?"; grep -E 'FAIL' "$OUT/checks-base.log"; grep -c PASS "$OUT/checks-base.log"
  timeout "${BASE_S:-300}" bun .device/base/hybrid-modes.js --contexts "${CONTEXTS:-4096,32768,131000}" --steps "${STEPS:-64}" ${BENCH_ARGS:-} > "$OUT/hybrid-modes-base.log" 2>&1
  echo "base $(cat .device/base/BUILT) exit $?"; sed -n '/^## /,$p' "$OUT/hybrid-modes-base.log"
fi
