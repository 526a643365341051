#!/bin/sh
# One device call for issue 34, run from a staged copy (the run tool ships the main checkout):
# what prefill calibration costs on the Llama-3.1-8B shape at 32K (medians of 2) and 128K (one)
# in the same run; the retrieval models of apps/bench/train/retrieval_models.py grown from
# recall-4l and trained (seed 1, a time budget each); then every model's accuracy on the CUDA
# backend (bf16 KV) with no profile and no K given, at 4K, 8K and 16K. One log, the eval's JSON
# and README table file, and the trained weights come back in $OUT (8 files at most). Stage:
#   S=/work/main/.stage/calib; mkdir -p $S/.device $S/packages/kernels-cpu/lib $S/packages/kernels-cuda/lib
#   cp --parents apps/bench/device/calibration-run.sh apps/bench/device/device-env.sh apps/bench/train/retrieval_models.py $S/
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
PYTHONUNBUFFERED=1 timeout "${TRAIN_S:-130}" python3 apps/bench/train/retrieval_models.py --out /tmp/models --models "${TRAIN:-ruler-8l,ruler-12l}" \
  --grow-from .device/recall-4l --lr 3e-4 --time-budget "${BUDGET:-50}" >> "$LOG" 2>&1
echo "train exit $?"; grep -E 'steps in|rror' "$LOG" | tail -4
MODELS=.device/recall-4l:needle
for m in ruler-8l ruler-12l; do
  [ -d /tmp/models/$m ] || continue
  MODELS="$MODELS,/tmp/models/$m:${TASK:-needle}"
  [ -n "${NO_WEIGHTS:-}" ] || for f in /tmp/models/$m/model*.safetensors /tmp/models/$m/model.safetensors.index.json; do [ -f "$f" ] && cp "$f" "$OUT/$m.$(basename "$f")"; done
  cat /tmp/models/$m/recipe.json >> "$LOG"
done
# The accuracy table: every model and length in one process, results written after each length.
timeout "${EVAL_S:-150}" bun .device/calibrated-eval.js --backend cuda --models "$MODELS" --lengths "${LENGTHS:-4096,8192,16384}" --prompts "${PROMPTS:-20}" \
  --modes "${MODES:-full,default,default-fixed,quest,uncalibrated}" --json "$OUT/eval.json" --table "$OUT/table.json" > /tmp/eval.log 2>&1
echo "eval exit $?"; tr '\r' '\n' < /tmp/eval.log | tee -a "$LOG" | grep -E '^\||rror|pre-QK|exact layers' | head -60
ls -la "$OUT"
