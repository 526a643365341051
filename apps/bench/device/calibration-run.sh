#!/bin/sh
# One device call for issue 34, run from a staged copy (the run tool ships the main checkout):
# what prefill calibration costs on the Llama-3.1-8B shape at 32K (medians of 2) and 128K (one)
# in the same run; the retrieval models of apps/bench/train/retrieval_models.py grown from
# recall-4l and trained (seed 1, a time budget each); then every model's accuracy on the CUDA
# backend (bf16 KV) with no profile and no K given, at 4K, 8K and 16K. One log, the evals' JSON and
# README table files (eval.tar), and the trained weights come back in $OUT (8 files at most). Stage:
#   S=/work/main/.stage/calib; mkdir -p $S/.device $S/packages/kernels-cpu/lib $S/packages/kernels-cuda/lib
#   cp --parents apps/bench/device/calibration-run.sh apps/bench/device/device-env.sh apps/bench/train/retrieval_models.py apps/bench/train/llama_files.py $S/
#   cp packages/kernels-cpu/lib/libhgcpu.so $S/packages/kernels-cpu/lib/; cp packages/kernels-cuda/lib/libhgcuda.so $S/packages/kernels-cuda/lib/
#   cp -r ../shared/models/recall-4l $S/.device/; cp .device/bun.xz $S/.device/   (sh ../shared/device/stage-bun.sh makes it)
#   for e in calibration-cost eval/calibrated-eval; do bun build --target=bun --external 'bun:*' apps/bench/src/$e.ts --outfile $S/.device/$(basename $e).js; done
# then carry [".stage/calib"] and run `cd .stage/calib && sh apps/bench/device/calibration-run.sh`.
set -u
. "$(dirname "$0")/device-env.sh"
LOG="$OUT/run.log"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$LOG"
if [ -z "${SKIP_COST:-}" ]; then
  timeout "${COST_S:-60}" bun .device/calibration-cost.js --contexts 32768 --repeats 2 >> "$LOG" 2>&1; echo "cost 32K exit $?" >> "$LOG"
  timeout "${COST128_S:-90}" bun .device/calibration-cost.js --contexts 131072 --repeats 1 --steps 2 >> "$LOG" 2>&1; echo "cost 128K exit $?" >> "$LOG"
  grep -E '^\| |^## |exit|rror' "$LOG"
fi
# recall-4l's eval starts at once; the two models train side by side meanwhile (tiny models: the GPU
# has room for all three), then their evals run side by side too. Accuracy does not depend on the
# timing, but the feedback scheduler's choice of pre or post does: the eval reports the steps run pre.
EVAL="bun .device/calibrated-eval.js --backend cuda --lengths ${LENGTHS:-4096,8192,16384} --prompts ${PROMPTS:-20} --modes ${MODES:-full,default,default-fixed,quest,uncalibrated}"
mkdir -p /tmp/eval
[ "${RECALL:-1}" = 0 ] || timeout "${EVAL_S:-150}" $EVAL --models .device/recall-4l:needle --json /tmp/eval/recall-4l.json --table /tmp/eval/recall-4l.table.json > /tmp/eval/recall-4l.log 2>&1 &
TRAINING=""
for m in ${TRAIN:-ruler-8l ruler-12l}; do
  PYTHONUNBUFFERED=1 timeout "${TRAIN_S:-70}" python3 apps/bench/train/retrieval_models.py --out /tmp/models --models $m \
    --grow-from .device/recall-4l --lr 3e-4 --time-budget "${BUDGET:-50}" > /tmp/eval/train-$m.txt 2>&1 &
  TRAINING="$TRAINING $!"
done
wait $TRAINING
for m in ${TRAIN:-ruler-8l ruler-12l}; do
  cat /tmp/eval/train-$m.txt >> "$LOG"; grep -E 'steps in|rror' /tmp/eval/train-$m.txt | tail -2
  [ -d /tmp/models/$m ] || continue
  [ -n "${NO_WEIGHTS:-}" ] || for f in /tmp/models/$m/model*.safetensors /tmp/models/$m/model.safetensors.index.json; do [ -f "$f" ] && cp "$f" "$OUT/$m.$(basename "$f")"; done
  timeout "${RULER_EVAL_S:-100}" $EVAL --models /tmp/models/$m:${TASK:-needle} --json /tmp/eval/$m.json --table /tmp/eval/$m.table.json > /tmp/eval/$m.log 2>&1 &
done
wait
for f in /tmp/eval/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | tee -a "$LOG" | grep -E '^\||rror|pre-QK|exact layers' | head -40; done
(cd /tmp/eval && tar cf "$OUT/eval.tar" *.json)
ls -la "$OUT"
