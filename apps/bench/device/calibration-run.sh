#!/bin/sh
# One device call for issue 34, from the repository root with the shared stage in $DEVICE_DIR
# (device-env.sh: bun.xz, lib/, calibrated-eval.js) and recall-4l as $STAGE/recall-4l.tar.xz
# (tar cJf $STAGE/recall-4l.tar.xz -C ../shared/models recall-4l):
#   STAGE=.stage/calib DEVICE_DIR=.device sh apps/bench/device/calibration-run.sh
# 1. With COST=1 first (needs $DEVICE_DIR/calibration-cost.js): what prefill calibration costs on
#    the Llama-3.1-8B shape at 32K (medians of 2) and, with COST128=1, 128K, both arms in one run.
# 2. The retrieval models of apps/bench/train/retrieval_models.py grown from recall-4l, trained side
#    by side (seed 1): vt-8l on the vartrack mix for VT_BUDGET seconds once per learning rate of
#    VT_LRS (the run answering more of fresh training-format batches at 4K is kept: its recipe.json
#    says which), ruler-12l on the ruler mix for RULER_BUDGET; recall-4l's eval (RECALL_LENGTHS,
#    RECALL_MODES) meanwhile.
# 3. Each trained model's accuracy on the CUDA backend (bf16 KV), no profile and no K given, as soon
#    as its training ends, cut where the call's WALL seconds end (a length's results are written as
#    soon as it ends: the longest first, the shorter ones are cheap on the CPU backend too).
# $OUT: run.log, eval.tar (the evals' JSON and README table files, the trained models' recipe.json), vt-8l's weights.
set -u
START=$(date +%s)
. "$(dirname "$0")/device-env.sh"
# Seconds left of the call's WALL, less a margin for what follows the step (at least 1: timeout 0 would never stop).
left() { l=$(( ${WALL:-115} - ($(date +%s) - START) - $1 )); [ "$l" -gt 0 ] && echo "$l" || echo 1; }
STAGE=${STAGE:-.stage/calib}
LOG="$OUT/run.log"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$LOG"
if [ -n "${COST:-}" ]; then
  timeout "${COST_S:-60}" bun "$DEVICE_DIR/calibration-cost.js" --contexts 32768 --repeats 2 >> "$LOG" 2>&1; echo "cost 32K exit $?" >> "$LOG"
  [ -z "${COST128:-}" ] || { timeout "${COST128_S:-90}" bun "$DEVICE_DIR/calibration-cost.js" --contexts 131072 --repeats 1 --steps 2 >> "$LOG" 2>&1; echo "cost 128K exit $?" >> "$LOG"; }
  grep -E '^\| |^## |exit|rror' "$LOG"
fi
mkdir -p /tmp/models /tmp/eval /tmp/train
tar xJf "$STAGE/recall-4l.tar.xz" -C /tmp/models
EVAL="bun $DEVICE_DIR/calibrated-eval.js --backend cuda"
[ -z "${RECALL_MODES-full,quest,default}" ] || timeout "$(left 8)" $EVAL --models /tmp/models/recall-4l:needle --lengths "${RECALL_LENGTHS:-16384}" \
  --prompts "${RECALL_PROMPTS:-8}" --modes "${RECALL_MODES:-full,quest,default}" --json /tmp/eval/recall-4l.json --table /tmp/eval/recall-4l.table.json \
  < /dev/null > /tmp/eval/recall-4l.log 2>&1 &
train() { # name lr dir budget
  PYTHONUNBUFFERED=1 timeout "${TRAIN_S:-70}" python3 apps/bench/train/retrieval_models.py --out "$3" --models "$1" --grow-from /tmp/models/recall-4l \
    --lr "$2" --time-budget "$4" > "$3.txt" 2>&1
  grep -E 'before|steps in|rror' "$3.txt" | tail -3
}
evaluate() { # name task lengths modes
  cp "/tmp/models/$1/recipe.json" "/tmp/eval/$1.recipe.json"
  timeout "$(left 4)" $EVAL --models "/tmp/models/$1:$2" --lengths "$3" --prompts "${PROMPTS:-6}" --modes "$4" \
    --json "/tmp/eval/$1.json" --table "/tmp/eval/$1.table.json" < /dev/null > "/tmp/eval/$1.log" 2>&1
}
# Each model's eval starts as soon as its training ends (ruler-12l's budget is shorter: 18 s taught it the needles before).
(
  for lr in ${VT_LRS:-3e-4 1e-3}; do train vt-8l "$lr" "/tmp/train/vt-8l-$lr" "${VT_BUDGET:-40}" & done
  wait
  # The vt-8l run that answers more of the training-format batches at 4K.
  best=$(python3 -c "
import glob, json
runs = [(json.load(open(f))['answer_accuracy']['4096'], f) for f in glob.glob('/tmp/train/vt-8l-*/vt-8l/recipe.json')]
print(max(runs)[1].rsplit('/', 1)[0] if runs else '')")
  echo "vt-8l kept: $best"
  [ -z "$best" ] || { mv "$best" /tmp/models/vt-8l; cp /tmp/models/vt-8l/model.safetensors "$OUT/vt-8l.model.safetensors"
    evaluate vt-8l vartrack "${VT_LENGTHS:-16384,4096,8192}" "${VT_MODES:-full,default,default-uncapped,default-fixed,exact,speculative,quest,infinigen,streaming,uncalibrated}"; }
) &
(
  train ruler-12l "${RULER_LR:-3e-4}" /tmp/train/ruler-12l "${RULER_BUDGET:-20}"
  [ -d /tmp/train/ruler-12l/ruler-12l ] && mv /tmp/train/ruler-12l/ruler-12l /tmp/models/ruler-12l &&
    evaluate ruler-12l needle "${RULER_LENGTHS:-16384,4096,8192}" "${RULER_MODES:-full,default,default-uncapped,quest}"
) &
wait
for f in /tmp/train/*.txt; do echo "== $f" >> "$LOG"; cat "$f" >> "$LOG"; done
for f in /tmp/eval/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | tee -a "$LOG" | grep -vE 'prompt [0-9]+/' | tail -40; done
(cd /tmp/eval && tar cf "$OUT/eval.tar" *.json)
ls -la "$OUT"
