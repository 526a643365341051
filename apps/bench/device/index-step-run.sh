#!/bin/sh
# One device call for issue 33's page index inside the hybrid step: index-check (Backend.indexRank
# against the definition; hybrid decode with the index ranked on the device against the stage's own
# search), hybrid-modes at 32K and 131K (full attention, the default feedback pair, Quest and the
# index configs in the same run), then scale-run at 1.5M tokens with the index ranked on the device
# (the planner's window, synthetic KV). The 1.5M run needs the H200 machine (its host store does not
# fit beside an H100's smaller window). Prepare on the dev machine, from the repository root:
#   sh ../shared/device/stage-bun.sh && (cd packages/kernels-cpu && bun run build) && (cd packages/kernels-cuda && HYBRIDGEN_BUILD_CUDA=1 bun run build)
#   for b in cuda/index-check hybrid-modes scale-run; do bun build --target=bun --external 'bun:*' apps/bench/src/$b.ts --outfile .device/$(basename $b).js; done
# and carry [".device", "packages/kernels-cpu/lib", "packages/kernels-cuda/lib"] (or stage those and this script under one folder).
set -u
. "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/machine.txt"
free -g | sed -n 2p | tee -a "$OUT/machine.txt"
if [ "${CHECK:-1}" = 1 ]; then
  timeout "${CHECK_S:-45}" bun .device/index-check.js > "$OUT/index-check.log" 2>&1
  echo "index-check exit $?"; grep -E 'PASS|FAIL|rror' "$OUT/index-check.log" | head -20
fi
if [ "${MODES:-1}" = 1 ]; then
  timeout "${MODES_S:-95}" bun .device/hybrid-modes.js --contexts "${CONTEXTS:-32768,131000}" --steps "${STEPS:-24}" \
    --configs "${CONFIGS:-full,feedback,pre-index,pre-index-exact}" > "$OUT/hybrid-modes.log" 2>&1
  echo "hybrid-modes exit $?"; grep -E '^\| [0-9]|bytes a step|rror' "$OUT/hybrid-modes.log"
fi
if [ "${SCALE:-1}" = 1 ]; then
  timeout "${SCALE_S:-125}" bun .device/scale-run.js --contexts "${SCALE_CONTEXTS:-1500000}" --synthetic-kv --steps "${SCALE_STEPS:-12}" --config pre-index \
    --index-form "${INDEX_FORM:-int4}" > "$OUT/scale.log" 2>&1
  echo "scale-run exit $?"; grep -E '^context|^\| [0-9]|refused|rror|synthetic|loaded' "$OUT/scale.log" | head -12
fi
