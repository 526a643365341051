#!/bin/sh
# One device call for issue 33's page index inside the hybrid step, within a wall-clock allowance
# (WALL, seconds; each part gets what is left): index-check (Backend.indexRank against the definition;
# hybrid decode with the index ranked on the device against the stage's own search; the ranking's
# device time a layer; CHECK_ARGS its flags), hybrid-modes once per RUNS entry CONTEXT:CONFIGS (full attention
# and the index configs in the same run; default 32K and 131K, full and pre-index; each step's timings in traces/; the
# hand-off probe's line), the CPU
# stage's index bounds per ISA (AVX2 against AVX-512, when the host has it), then scale-run with
# the index ranked on the device (synthetic KV; the planner's least window: the host store held to
# SCALE_HOST_KV, default 88G, the window the rest) at 1.5M where the GPU holds more than 100 GB, else
# 1M (an H100's window leaves 1.5M more host store than 125 GiB holds: the planner refuses it in one line). Prepare on the dev machine, from the repository root:
#   sh ../shared/device/stage-bun.sh && (cd packages/kernels-cpu && bun run build) && (cd packages/kernels-cuda && HYBRIDGEN_BUILD_CUDA=1 bun run build)
#   for b in cuda/index-check hybrid-modes scale-run; do bun build --target=bun --external 'bun:*' apps/bench/src/$b.ts --outfile .device/$(basename $b).js; done
#   gcc -O2 -Ipackages/kernels-cpu/native apps/bench/src/cpu/index-bounds.c -L.device/lib -lhgcpu -Wl,-rpath,'$ORIGIN/lib' -o .device/index-bounds
# with both libraries in .device/lib, and carry [".device"] (or stage those and this script under one folder, DEVICE_DIR=it).
# ORDER: the parts in turn (default: check modes bounds scale profiles); SCALE_S and MODES_S cap the scale run's and each
# hybrid-modes run's seconds (MODES_ARGS more of its flags, e.g. --synthetic-kv: no prefill); PROFILES=name:context:config …: profile-run.sh (ncu kernel times of one step) in the time left.
set -u
. "$(dirname "$0")/device-env.sh"
START=$(date +%s)
left() { echo $((${WALL:-175} - ($(date +%s) - START))); }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/machine.txt"
echo "avx512f: $(grep -c -m1 avx512f /proc/cpuinfo)" | tee -a "$OUT/machine.txt"
free -g | sed -n 2p | tee -a "$OUT/machine.txt"
check() {
  timeout "${CHECK_S:-30}" bun "$DEVICE_DIR/index-check.js" ${CHECK_ARGS:-} > "$OUT/index-check.log" 2>&1
  echo "index-check exit $?"; grep -E 'PASS|FAIL|rror|index checks|^\| [0-9]|^ranking' "$OUT/index-check.log" | head -40
}
modes() {
  for run in ${RUNS:-32768:full,pre-index 131000:full,pre-index}; do
    ctx=${run%%:*}; T=$(( $(left) - 2 ))
    if [ -n "${MODES_S:-}" ] && [ "$MODES_S" -lt "$T" ]; then T=$MODES_S; fi
    if [ "$T" -lt 15 ]; then echo "hybrid-modes $ctx skipped: $T s left"; continue; fi
    timeout "$T" bun "$DEVICE_DIR/hybrid-modes.js" --contexts "$ctx" --steps "${STEPS:-16}" --configs "${run#*:}" --trace-dir "$OUT/traces" ${MODES_ARGS:-} > "$OUT/hybrid-modes-$ctx.log" 2>&1
    echo "hybrid-modes $ctx exit $?"; grep -E '^\| [0-9]|bytes a step|bandwidths|planner|hand-off:|synthetic KV in|prefilled in|rror' "$OUT/hybrid-modes-$ctx.log"
  done
}
bounds() {
  [ -x "$DEVICE_DIR/index-bounds" ] || return 0
  for isa in 1 2; do
    timeout 15 "$DEVICE_DIR/index-bounds" "${THREADS:-13}" "${BOUNDS_CONTEXTS:-131000,1500000}" $isa > "$OUT/index-bounds-isa$isa.txt" 2>&1
    echo "index-bounds ISA $isa exit $?"; cat "$OUT/index-bounds-isa$isa.txt"
  done
}
scale() {
  GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  SCALE_CONTEXTS=${SCALE_CONTEXTS:-$([ "${GPU_MIB:-0}" -gt 100000 ] && echo 1500000 || echo 1000000)}
  T=$(left); if [ -n "${SCALE_S:-}" ] && [ "$SCALE_S" -lt "$T" ]; then T=$SCALE_S; fi
  if [ "$T" -lt 30 ]; then echo "scale-run skipped: ${T} s left"; return 0; fi
  timeout "$T" bun "$DEVICE_DIR/scale-run.js" --contexts "$SCALE_CONTEXTS" --synthetic-kv --steps "${SCALE_STEPS:-10}" --config pre-index \
    --index-form "${INDEX_FORM:-int4}" --window "${SCALE_WINDOW:-least}" --host-kv-budget "${SCALE_HOST_KV:-88G}" > "$OUT/scale.log" 2>&1
  echo "scale-run $SCALE_CONTEXTS exit $?"; grep -E '^context|^\| [0-9]|refused|rror|synthetic|loaded|hybrid:|tiers:|device:|bytes a step|ranks a layer' "$OUT/scale.log" | head -16
}
# profile-run.sh's name:context:config entries: ncu kernel times of one step each, with what is left.
profiles() {
  T=$(( $(left) - 2 ))
  if [ "$T" -lt 40 ]; then echo "profiles skipped: $T s left"; else PROFILE_S=$T sh "$(dirname "$0")/profile-run.sh"; fi
}
for part in ${ORDER:-check modes bounds scale profiles}; do
  case $part in
    check) [ "${CHECK:-1}" = 1 ] && check ;;
    modes) [ "${MODES:-1}" = 1 ] && modes ;;
    bounds) [ "${BOUNDS:-1}" = 1 ] && bounds ;;
    scale) [ "${SCALE:-1}" = 1 ] && scale ;;
    profiles) [ -n "${PROFILES:-}" ] && profiles ;;
    *) echo "index-step-run.sh: unknown part $part (check, modes, bounds, scale, profiles)"; exit 2 ;;
  esac
done
exit 0
