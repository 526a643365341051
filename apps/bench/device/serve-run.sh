#!/bin/sh
# One device call: issue 36's serving table — `hybridgen serve` on the Llama-3.1-8B shape (dummy bf16
# weights, bf16 KV) with the GPU capped below the workload's KV (--gpu-mem), clients sending
# ~32K-token prompts at once (a preset's byte tokenizer: a byte a token), full attention against
# hybrid attention with the page index (ranked on the device; fixed K, verified logits over 2·K
# candidates keeping K), each a server of its own, through apps/bench/src/serve-bench.ts; if a hybrid
# server fails early, $FALLBACK (the page index with 4·K candidates, none dropped: the configuration
# of the earlier tables) in the time left. Each configuration gets the same RATE_S seconds of serving once its model is
# loaded (a rate cut short reports the tokens streamed so far) and DEADLINE_S in all, load included.
# RUNS lists the configurations, LABEL[:CLIENTS[:FLAGS]] each: `full…` is full attention, any other label
# hybrid attention ($HYBRID); CLIENTS (default $CLIENTS) past N slots keep requests queued as others
# leave, so the server's reuse of a left request's sequence shows against renewing it; FLAGS, commas
# for spaces, go to that server alone (e.g. --preallocate).
# From $DEVICE_DIR (default .device): bun.xz, hybridgen.js, serve-bench.js, lib/libhgcpu.so,
# lib/libhgcuda.so. Prepare on the dev machine:
#   sh ../shared/device/stage-bun.sh && (cd packages/kernels-cpu && bun run build) && (cd packages/kernels-cuda && HYBRIDGEN_BUILD_CUDA=1 bun run build)
#   bun build --target=bun --external 'bun:*' apps/cli/src/hybridgen.ts --outfile .device/hybridgen.js
#   bun build --target=bun --external 'bun:*' apps/bench/src/serve-bench.ts --outfile .device/serve-bench.js
# $OUT/results.tgz holds serve.json (docs/performance/<machine>/serve/serve.json's source), each
# configuration's log (its table and the server's log) and machine.txt.
set -u
. "$(dirname "$0")/device-env.sh"
D=$DEVICE_DIR
start=$(date +%s)
nvidia-smi --query-gpu=name,serial,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/machine.txt"; free -g | grep Mem | tee -a "$OUT/machine.txt"
N=${N:-6} PROMPT=${PROMPT:-32000} OUTPUT=${OUTPUT:-1024} GPU_MEM=${GPU_MEM:-24G} BLOCK=${BLOCK:-2048} WINDOW=${WINDOW:-2048}
# N slots (--max-batch); CLIENTS past N keep requests queued, so one takes a left request's sequence when it fits it (the server's reuse);
# RATE inf: all at once, else Poisson arrivals; SPREAD: lengths uniform around their means.
CLIENTS=${CLIENTS:-$N} REQUESTS=${REQUESTS:-$N} RATE=${RATE:-inf} SPREAD=${SPREAD:-0}
RATE_S=${RATE_S:-40} DEADLINE_S=${DEADLINE_S:-62} TOTAL_S=${TOTAL_S:-140}
COMMON="--model preset:llama-3.1-8b --dummy-weights --dtype bf16 --kv-dtype bf16 --device cuda --context $((PROMPT + OUTPUT + 64)) --prefill-block $BLOCK --gpu-mem $GPU_MEM --max-batch $N --max-queue 64"
# The workload bench's hybridgen-index: fixed K chosen by the page index (ranked on the device), verified logits over 2·K
# candidates of which K keep their V rows (the link's rows 0.375× those of 4 candidates, recall-4l's answers unchanged).
HYBRID_BASE="--attention hybrid --gpu-kv-budget $WINDOW --selector index --scheduler fixed --k ${K:-256} --timing pre --logits verified"
HYBRID=${HYBRID:-"$HYBRID_BASE --candidates 2 --keep 1"} FALLBACK=${FALLBACK:-"$HYBRID_BASE --candidates 4"}
# The floors beside each step and chunk (serve-bench): HBM at the card's peak (H200 HBM3e 4.8 TB/s, H100 HBM3 3.35), the link at
# PCIe 5.0 x16's practical rate, bf16 dense tensor peak (both cards 989 TFLOP/s).
case $(head -1 "$OUT/machine.txt") in *H200*) HBM_GBS=${HBM_GBS:-4800} ;; *) HBM_GBS=${HBM_GBS:-3350} ;; esac
LINK_GBS=${LINK_GBS:-55} PEAK_TFLOPS=${PEAK_TFLOPS:-989}
SOURCE="apps/bench serve-bench: hybridgen serve, preset:llama-3.1-8b dummy bf16 weights, bf16 KV, --gpu-mem $GPU_MEM, $N slots, $REQUESTS requests of $PROMPT-token prompts + $OUTPUT tokens (spread $SPREAD) at rate $RATE, prefill block $BLOCK, each configuration served for $RATE_S s once loaded, floors at HBM $HBM_GBS GB/s, link $LINK_GBS GB/s, $PEAK_TFLOPS TFLOP/s, $(head -1 "$OUT/machine.txt"), $(date -u +%F)"
# bench LABEL DEADLINE CLIENTS ARGS…: one configuration; the outer timeout only backs up serve-bench's own deadline (and its server's exit).
bench() { label=$1; deadline=$2; clients=$3; shift 3
  t0=$(date +%s)
  timeout $((deadline + 12)) bun "$D/serve-bench.js" --server "bun $D/hybridgen.js" --serve "$COMMON $*" --clients "$clients" --requests "$REQUESTS" --rates "$RATE" \
    --prompt-bytes "$PROMPT" --output-tokens "$OUTPUT" --spread "$SPREAD" --time-limit "$RATE_S" --deadline "$deadline" \
    --hbm-gbs "$HBM_GBS" --link-gbs "$LINK_GBS" --peak-tflops "$PEAK_TFLOPS" \
    --label "$label" --json "$OUT/serve.json" --source "$SOURCE" > "$OUT/$label.log" 2>&1
  s=$?; echo "$label exit $s in $(( $(date +%s) - t0 )) s"; grep -E '^\| (all|[0-9])|rror|^loaded|^preallocated|^hybrid:|^slot [0-9]+ left:|^hybridgen_slot_re' "$OUT/$label.log" | cut -c1-700 | head -16
  return $s
}
left() { echo $(( TOTAL_S - ($(date +%s) - start) )); }
# DEADLINE_S each, less where the total leaves less (12 s kept for the outer timeout's margin and the archive).
next() { l=$(( $(left) - 12 )); echo $(( l < DEADLINE_S ? l : DEADLINE_S )); }
for run in ${RUNS:-full hybrid-index}; do
  label=${run%%:*} clients=$CLIENTS extra=""
  if [ "$run" != "$label" ]; then rest=${run#*:}; clients=${rest%%:*}; [ "$rest" != "$clients" ] && extra=$(echo "${rest#*:}" | tr , ' '); fi
  case $label in full*) args=$extra ;; *) args="$HYBRID $extra" ;; esac
  [ "$(next)" -gt 20 ] || { echo "$label skipped: $(left) s left"; continue; }
  t1=$(date +%s)
  if ! bench "$label" "$(next)" "$clients" $args && [ "${label#full}" = "$label" ]; then
    [ $(( $(date +%s) - t1 )) -lt 40 ] && [ "$(left)" -gt 50 ] && bench "$label-c4" "$(next)" "$clients" $FALLBACK $extra
  fi
done
# One archive of every result: the device tool brings back only a few files a call.
tar czf /tmp/serve-results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/serve-results.tgz "$OUT/results.tgz" && echo "results.tgz: $(du -k "$OUT/results.tgz" | cut -f1) KiB"
echo "total $(( $(date +%s) - start )) s"
exit 0
