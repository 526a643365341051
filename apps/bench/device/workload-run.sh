#!/bin/sh
# Issue 35's device runs (Llama-3.1-8B shape, dummy bf16 weights, bf16 KV), from $DEVICE_DIR (default
# .device): bun.xz, lib/ (libhgcpu.so, libhgcuda.so), hybridgen.js, hybrid-bench.js, and for a same-run
# baseline arm hybridgen-base.js. Prepare on the dev machine:
#   sh ../shared/device/stage-bun.sh && (cd packages/kernels-cpu && bun run build) && (cd packages/kernels-cuda && HYBRIDGEN_BUILD_CUDA=1 bun run build)
#   bun build --target=bun --external 'bun:*' apps/cli/src/hybridgen.ts --outfile .device/hybridgen.js
#   bun build --target=bun --external 'bun:*' apps/bench/src/cuda/hybrid-bench.ts --outfile .device/hybrid-bench.js
# PART selects what runs (several, space-separated; each under its own time limit, results under $OUT):
#   checks    the CUDA hybrid checks (hybrid-bench.js --skip-bench: a batch of 3 equals each alone, recorded per layer);
#             CHECKS="batch of" runs only the checks whose name holds it (or one of its |-separated parts)
#   batch     the 8K batch scaling: BATCH_CONFIGS (default full, the default hybrid and hybridgen-index) at batch 1/4/16,
#             window 1024 (`bench --batch`; BATCH_STEPS, BATCH_WARMUP)
#   base      the same hybrid points from hybridgen-base.js (BASE_BATCHES, default 16): the change's baseline arm
#   workload  `bench --workload` for each of WORKLOADS (default "8x131000 32x32768": 128K less the decoded steps, which
#             must fit the model's 131 072 positions) under GPU_MEM, --synthetic-kv; CONFIGS default full, the default
#             hybrid (a top-K scan of every offloaded K) and hybridgen-index (the page index ranked on the device for the batch);
#             a workload written NxC:B gives full attention's batch B (--full-batch: an earlier run's search result, not searched again)
#   trace     where the device's time goes in the 8K batch of 16 (TRACE_CONFIG, default hybridgen-index): the bench under
#             Nsight Systems (nsys, where the machine has it; CUDA graphs traced node by node), its kernel summary kept
# GPU_MEM defaults to 80G where the card has more than 80 GiB, else the card's memory less 2 GiB (an H100's 80 GB
# card cannot hold an 80 GiB arena beside CUDA's own); CONFIGS, STEPS, WARMUP, K and STAGE_THREADS (the CPU-stage threads the
# batch's sequences share; the first step folds every offloaded row into a page index on them) override the workload bench;
# ISSUE_MS and STAGE_MS (ms a row a layer, from an earlier run's stats line) give the planner the host's per-row costs,
# GATHER_GBS the rate at which the device gathers rows from pinned host memory (the device part of the planner's step).
# WALL (seconds, default 600) bounds the whole call: each part is cut where what is left of it ends.
# PROFILE="batch workload" (parts): those parts' benches write the driving thread's profile (Bun's --cpu-prof-md) under
# $OUT/prof when they end within their limit (a profiled run is a little slower: profile the part whose figures are not the table's).
set -u
START=$(date +%s)
. "$(dirname "$0")/device-env.sh"
prof() { case " ${PROFILE:-} " in *" $1 "*) echo "--cpu-prof-md --cpu-prof-dir=$OUT/prof/$1" ;; esac; }
# A part's limit: its own, or what is left of WALL less a margin for the archive at the end (at least 1: timeout 0 never stops).
limit() { l=$(( ${WALL:-600} - ($(date +%s) - START) - 6 )); [ "$l" -gt "$1" ] && l=$1; [ "$l" -gt 0 ] && echo "$l" || echo 1; }
D=$DEVICE_DIR
nvidia-smi --query-gpu=name,serial,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/machine.txt"
free -g | grep Mem | tee -a "$OUT/machine.txt"
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ -z "${GPU_MEM:-}" ]; then
  if [ "$total_mib" -gt 90000 ]; then GPU_MEM=80G; else GPU_MEM=$(( total_mib / 1024 - 2 ))G; fi
fi
echo "gpu-mem $GPU_MEM" | tee -a "$OUT/machine.txt"
BENCH="--device cuda --dummy-weights --model preset:llama-3.1-8b"
for part in ${PART:-checks batch workload}; do
  t0=$(date +%s)
  case $part in
    checks)
      timeout "$(limit "${CHECK_S:-90}")" bun "$D/hybrid-bench.js" --skip-bench ${CHECKS:+--checks "$CHECKS"} > "$OUT/checks.log" 2>&1
      echo "checks exit $?"; echo "$(grep -c '^PASS' "$OUT/checks.log") passed"; grep -E '^FAIL|batch of|indexRankRows|attnPartialRows|appendKvRows|ALL PASS|FAILED' "$OUT/checks.log" | cut -c1-240 ;;
    batch)
      mkdir -p "$OUT/batch"
      timeout "$(limit "${BATCH_S:-150}")" bun $(prof batch) "$D/hybridgen.js" bench $BENCH --contexts 8192 --batch "${BATCHES:-1,4,16}" --configs "${BATCH_CONFIGS:-full,hybridgen,hybridgen-index}" \
        --steps "${BATCH_STEPS:-24}" --warmup "${BATCH_WARMUP:-4}" --gpu-kv-budget 1024 --sink-tokens 4 --k 256 --out "$OUT/batch" > "$OUT/batch/tables.md" 2> "$OUT/batch/progress.log"
      echo "batch exit $?"; sed -n '/Fig. 17/,/^$/p' "$OUT/batch/tables.md"; grep -E 'tok/s|error' "$OUT/batch/progress.log" | cut -c1-300 | tail -12 ;;
    base)
      mkdir -p "$OUT/batch-base"
      timeout "$(limit "${BASE_S:-90}")" bun "$D/hybridgen-base.js" bench $BENCH --contexts 8192 --batch "${BASE_BATCHES:-16}" --configs hybridgen \
        --steps 24 --warmup 4 --gpu-kv-budget 1024 --sink-tokens 4 --k 256 --out "$OUT/batch-base" > "$OUT/batch-base/tables.md" 2> "$OUT/batch-base/progress.log"
      echo "base exit $?"; sed -n '/Fig. 17/,/^$/p' "$OUT/batch-base/tables.md" ;;
    workload)
      for spec in ${WORKLOADS:-8x131000 32x32768}; do
        w=${spec%%:*}; fb=""; [ "$w" != "$spec" ] && fb="--full-batch ${spec#*:}"
        mkdir -p "$OUT/workload-$w"
        timeout "$(limit "${WORKLOAD_S:-200}")" bun $(prof workload) "$D/hybridgen.js" bench $BENCH --workload "$w" $fb --gpu-mem "$GPU_MEM" --synthetic-kv \
          --configs "${CONFIGS:-full,hybridgen,hybridgen-index}" --steps "${STEPS:-12}" --warmup "${WARMUP:-4}" --k "${K:-256}" ${STAGE_THREADS:+--cpu-stage-threads "$STAGE_THREADS"} \
          ${ISSUE_MS:+--issue-ms "$ISSUE_MS"} ${STAGE_MS:+--stage-ms "$STAGE_MS"} ${GATHER_GBS:+--gather-gbs "$GATHER_GBS"} \
          --out "$OUT/workload-$w" > "$OUT/workload-$w/table.md" 2> "$OUT/workload-$w/progress.log"
        echo "workload $w exit $?"; cat "$OUT/workload-$w/table.md"; grep -E 'fit|full attention|holds|filled|planner|steps|tokens/s|error|Error|sequence 0' "$OUT/workload-$w/progress.log" | cut -c1-900 | tail -16
        free -g | grep Mem
      done ;;
    trace)
      mkdir -p "$OUT/trace"
      NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
      if [ -z "$NSYS" ]; then echo "trace: no nsys on this machine"; else
        timeout "$(limit "${TRACE_S:-70}")" "$NSYS" profile -o "$OUT/trace/b16" --force-overwrite true --trace cuda --cuda-graph-trace node \
          bun "$D/hybridgen.js" bench $BENCH --contexts 8192 --batch 16 --configs "${TRACE_CONFIG:-hybridgen-index}" --steps 6 --warmup 2 \
          --gpu-kv-budget 1024 --sink-tokens 4 --k 256 > "$OUT/trace/bench.log" 2>&1
        echo "trace exit $?"
        timeout "$(limit 40)" "$NSYS" stats --report cuda_gpu_kern_sum --format csv --output "$OUT/trace/kern" "$OUT/trace/b16.nsys-rep" > "$OUT/trace/stats.log" 2>&1
        rm -f "$OUT/trace/b16.nsys-rep" "$OUT/trace/b16.sqlite"
        head -30 "$OUT"/trace/kern*.csv | cut -c1-200
      fi ;;
    *) echo "unknown part $part" ;;
  esac
  echo "$part: $(( $(date +%s) - t0 )) s"
done
# One archive of every result: the device tool brings back only a few files a call.
tar czf /tmp/results.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/results.tgz "$OUT/" && echo "results.tgz: $(du -k "$OUT/results.tgz" | cut -f1) KiB"
