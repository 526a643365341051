#!/bin/sh
# One device call for issue 34: what prefill calibration costs on the Llama-3.1-8B shape (32K, and
# 128K with one repeat), then the retrieval models of apps/bench/train/retrieval_models.py trained
# (seed 1, a time budget each); their weights and recipes come back in $OUT (the config and tokenizer
# files are written here afterwards with --meta-only). Prepare on the dev machine:
#   sh ../shared/device/stage-bun.sh && (cd packages/kernels-cpu && bun run build) && (cd packages/kernels-cuda && HYBRIDGEN_BUILD_CUDA=1 bun run build)
#   bun build --target=bun --external 'bun:*' apps/bench/src/calibration-cost.ts --outfile .device/calibration-cost.js
# and carry [".device", "packages/kernels-cpu/lib", "packages/kernels-cuda/lib"].
set -u
. "$(dirname "$0")/device-env.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/machine.txt"
timeout "${COST_S:-100}" bun .device/calibration-cost.js --contexts 32768 --repeats 2 > "$OUT/cost-32k.log" 2>&1
echo "cost 32K exit $?"; sed -n '/^| /p' "$OUT/cost-32k.log"; grep -iE 'error' "$OUT/cost-32k.log" | head -3
timeout "${COST128_S:-90}" bun .device/calibration-cost.js --contexts 131072 --repeats 1 --steps 2 > "$OUT/cost-128k.log" 2>&1
echo "cost 128K exit $?"; sed -n '/^| /p' "$OUT/cost-128k.log"; grep -iE 'error' "$OUT/cost-128k.log" | head -3
timeout "${TRAIN_S:-170}" python3 apps/bench/train/retrieval_models.py --out /tmp/models --time-budget "${BUDGET:-75}" > "$OUT/train.log" 2>&1
echo "train exit $?"; grep -E 'steps in|Error' "$OUT/train.log"
for m in ruler-8l ruler-12l; do
  [ -f /tmp/models/$m/model.safetensors ] && cp /tmp/models/$m/model.safetensors "$OUT/$m.safetensors" && cp /tmp/models/$m/recipe.json "$OUT/$m.recipe.json"
done
ls -la "$OUT"
