#!/bin/sh
# One device call for issue 34: what prefill calibration costs on the Llama-3.1-8B shape (32K; 128K
# with CONTEXTS128=1), then the retrieval models of apps/bench/train/retrieval_models.py grown from
# recall-4l (copied to .device/recall-4l: the model directory is not in the checkout) and trained
# (seed 1, a time budget each); their weights and recipes come back in $OUT (the config and tokenizer
# files are written here afterwards with --meta-only). Prepare on the dev machine:
#   sh ../shared/device/stage-bun.sh && (cd packages/kernels-cpu && bun run build) && (cd packages/kernels-cuda && HYBRIDGEN_BUILD_CUDA=1 bun run build)
#   bun build --target=bun --external 'bun:*' apps/bench/src/calibration-cost.ts --outfile .device/calibration-cost.js
#   bun build --target=bun --external 'bun:*' apps/bench/src/eval/calibrated-eval.ts --outfile .device/calibrated-eval.js
# and carry [".device", "packages/kernels-cpu/lib", "packages/kernels-cuda/lib"].
set -u
. "$(dirname "$0")/device-env.sh"
# At most 8 files come back: the machine goes at the top of the cost log, the recipes are in train.log.
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$OUT/cost-32k.log"
timeout "${COST_S:-100}" bun .device/calibration-cost.js --contexts 32768 --repeats 2 >> "$OUT/cost-32k.log" 2>&1
echo "cost 32K exit $?"; sed -n '/^| /p' "$OUT/cost-32k.log"; grep -iE 'error' "$OUT/cost-32k.log" | head -3
if [ -n "${CONTEXTS128:-}" ]; then
  timeout "${COST128_S:-90}" bun .device/calibration-cost.js --contexts 131072 --repeats 1 --steps 2 > "$OUT/cost-128k.log" 2>&1
  echo "cost 128K exit $?"; sed -n '/^| /p' "$OUT/cost-128k.log"; grep -iE 'error' "$OUT/cost-128k.log" | head -3
fi
timeout "${TRAIN_S:-170}" python3 apps/bench/train/retrieval_models.py --out /tmp/models --models "${TRAIN:-ruler-8l,ruler-12l}" --grow-from .device/recall-4l --lr 3e-4 --time-budget "${BUDGET:-75}" > "$OUT/train.log" 2>&1
echo "train exit $?"; grep -E 'steps in|Error' "$OUT/train.log"
for m in ruler-8l ruler-12l; do
  [ -d /tmp/models/$m ] || continue
  for f in /tmp/models/$m/model*.safetensors /tmp/models/$m/model.safetensors.index.json; do [ -f "$f" ] && cp "$f" "$OUT/$m.$(basename "$f")"; done
  cat /tmp/models/$m/recipe.json >> "$OUT/train.log"
done
# Their accuracy table on the CPU backend of this host (16 threads), one model and task at a time; results written after each length.
for mt in ${EVALS:-ruler-8l:vartrack ruler-12l:multivalue}; do
  m=${mt%%:*}; [ -d /tmp/models/$m ] || continue
  timeout "${EVAL_S:-70}" bun .device/calibrated-eval.js --models /tmp/models/$mt --lengths "${LENGTHS:-4096,8192,16384}" --prompts "${PROMPTS:-12}" --threads 16 \
    --modes "${MODES:-full,default,default-device,exact,speculative,quest,streaming,uncalibrated}" --json "$OUT/eval-$m.json" > /tmp/eval-$m.log 2>&1
  echo "eval $mt exit $?"; tr '\r' '\n' < /tmp/eval-$m.log | grep -E '^\||rror' | head -14
done
ls -la "$OUT"
