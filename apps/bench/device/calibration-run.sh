#!/bin/sh
# One device call for issue 34, from the repository root with the shared stage in $DEVICE_DIR
# (device-env.sh: bun.xz, lib/, calibrated-eval.js, and calibration-cost.js for COST) and recall-4l
# as $STAGE/recall-4l.tar.xz (tar cJf $STAGE/recall-4l.tar.xz -C ../shared/models recall-4l):
#   STAGE=.stage/calib DEVICE_DIR=.device sh apps/bench/device/calibration-run.sh
#   STAGE=.stage/calib-tiny DEVICE_DIR=.device COST=1 RECALL_MODES= VT_LRS= RULER_LR= WALL=45 sh apps/bench/device/calibration-run.sh
#     (the cost alone, then only the models staged in $STAGE/models.txt: recall-4l.tar.xz is not needed)
# 1. COST=1, first and alone on the card: what prefill calibration costs on the Llama-3.1-8B shape at
#    32K (medians of 2 pairs) and, with COST128=1, 128K (one pair), both arms in one run; one process,
#    cut at COST_S seconds.
# 2. The retrieval models of apps/bench/train/retrieval_models.py grown from recall-4l, trained side
#    by side (seed 1): vt-8l on the vartrack mix for VT_BUDGET seconds once per learning rate of
#    VT_LRS (the run answering more of fresh training-format batches at 4K is kept: its recipe.json
#    says which), ruler-12l on the ruler mix for RULER_BUDGET at RULER_LR (empty VT_LRS or RULER_LR:
#    that model is not trained; RULER_STEPS / VT_STEPS: a fixed step count, which the schedule then follows;
#    VT_PHASES: vt-8l's curriculum, retrieval_models.py --phases). Meanwhile recall-4l (RECALL_LENGTHS,
#    RECALL_MODES; empty modes: none) and the models staged as $STAGE/NAME.tar.xz with a line
#    NAME:TASK:LENGTHS in $STAGE/models.txt (flags of their own in $STAGE/args-NAME.txt, e.g. vt-3l's
#    --window 64 --records 24) are evaluated.
# 3. Each model's accuracy on the CUDA backend (bf16 KV), no profile and no K given, as soon as its
#    training ends: its lengths below LONG (16K) in one process, each longer length in SPLIT processes
#    of their own seed (other prompts), side by side (each process with ARENA of the card).
#    Every process is cut where the call's WALL seconds end (its results are written after each
#    prompt); the processes' --json files are added up per model (calibrated-eval --from).
# $OUT: run.log, cost.table.json (COST: the README result file of calibration-cost --table), eval.tar (per model NAME.json, NAME.table.json, the trained models' recipe.json),
# the trained models' weights (vt-8l's file, ruler-12l's shards and index).
set -u
START=$(date +%s)
. "$(dirname "$0")/device-env.sh"
# Seconds left of the call's WALL, less a margin for what follows the step (at least 1: timeout 0 would never stop).
left() { l=$(( ${WALL:-92} - ($(date +%s) - START) - $1 )); [ "$l" -gt 0 ] && echo "$l" || echo 1; }
STAGE=${STAGE:-.stage/calib}
RULER_LR=${RULER_LR-3e-4}
# Scratch (models, training runs, eval logs); EVAL_BACKEND=cpu with short lengths is a dry run where there is no GPU.
W=${WORK:-/tmp/calib-run}
LOG="$OUT/run.log"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$LOG"
if [ -n "${COST:-}" ]; then
  # One process and one model for both contexts (32K: 2 pairs, 128K: 1), so 128K needs no warm-up of its own.
  if [ -n "${COST128:-}" ]; then ctx=32768,131072 reps=2,1; else ctx=32768 reps=2; fi
  timeout "${COST_S:-32}" bun "$DEVICE_DIR/calibration-cost.js" --contexts $ctx --repeats $reps --steps 2 --table "$OUT/cost.table.json" >> "$LOG" 2>&1; echo "cost exit $? at $(( $(date +%s) - START )) s" >> "$LOG"
  grep -E '^\| |^## |loaded|exit|rror' "$LOG"
fi
mkdir -p "$W/models" "$W/eval" "$W/train" "$W/runs"
# recall-4l: evaluated and the trained models' start (a call measuring the cost alone stages none).
[ ! -f "$STAGE/recall-4l.tar.xz" ] || tar xJf "$STAGE/recall-4l.tar.xz" -C "$W/models"
EVAL="bun $DEVICE_DIR/calibrated-eval.js --backend ${EVAL_BACKEND:-cuda} --arena ${ARENA:-0.05}"
# One process: model task lengths seed prompts modes [flags]; its --json is $W/runs/NAME-LENGTHS-SEED.json.
ev() {
  n=$1 t=$2 l=$3 s=$4 p=$5 m=$6
  shift 6
  f="$n-$(echo "$l" | tr ',' '_')-$s"
  timeout "$(left 3)" $EVAL "$@" --models "$W/models/$n:$t" --lengths "$l" --seed "$s" --prompts "$p" --modes "$m" \
    --json "$W/runs/$f.json" < /dev/null > "$W/eval/$f.log" 2>&1
}
# A model's lengths below LONG in one process (PROMPTS prompts each), each length of LONG and more in SPLIT processes of
# their own seed (PROMPTS_LONG prompts each), side by side; then their runs added up.
evaluate() { # name task lengths modes [flags]
  n=$1 t=$2 ls=$3 m=$4
  shift 4
  [ ! -f "$W/models/$n/recipe.json" ] || cp "$W/models/$n/recipe.json" "$W/eval/$n.recipe.json"
  short=""
  for l in $(echo "$ls" | tr ',' ' '); do
    if [ "$l" -ge "${LONG:-16384}" ]; then
      for s in $(seq 1 "${SPLIT:-2}"); do ev "$n" "$t" "$l" "$s" "${PROMPTS_LONG:-6}" "$m" "$@" & done
    else
      short="$short${short:+,}$l"
    fi
  done
  [ -z "$short" ] || ev "$n" "$t" "$short" 1 "${PROMPTS:-12}" "$m" "$@" &
  wait
  runs=$(ls "$W/runs/$n"-*.json 2>/dev/null | tr '\n' ',')
  [ -z "$runs" ] || bun "$DEVICE_DIR/calibrated-eval.js" --from "$runs" --json "$W/eval/$n.json" --table "$W/eval/$n.table.json" > "$W/eval/$n.merged.txt" 2>&1
}
ALL_MODES=full,default,default-uncapped,default-cap64,default-fixed,exact,speculative,quest,infinigen,streaming,uncalibrated
[ -z "${RECALL_MODES-$ALL_MODES}" ] || evaluate recall-4l needle "${RECALL_LENGTHS:-4096,8192,16384}" "${RECALL_MODES-$ALL_MODES}" &
[ ! -f "$STAGE/models.txt" ] || while IFS=: read -r name task lengths; do
  [ -n "$name" ] || continue
  tar xJf "$STAGE/$name.tar.xz" -C $W/models
  evaluate "$name" "$task" "$lengths" "${STAGED_MODES:-$ALL_MODES}" $(cat "$STAGE/args-$name.txt" 2>/dev/null) &
done < "$STAGE/models.txt"
train() { # name lr dir budget [steps] [phases]
  # The training's own budget ends 10 s before its timeout, so that a call running late still saves (and evaluates) the weights.
  b=$(left 35); [ "$b" -lt "$4" ] || b=$4
  PYTHONUNBUFFERED=1 timeout "$(left 25)" python3 apps/bench/train/retrieval_models.py --out "$3" --models "$1" --grow-from $W/models/recall-4l \
    --lr "$2" --time-budget "$b" ${5:+--steps "$5"} ${6:+--phases "$6"} > "$3.txt" 2>&1
  grep -E 'before|steps in|rror' "$3.txt" | tail -3
}
[ -z "${VT_LRS-3e-4 1e-3}" ] || (
  for lr in ${VT_LRS-3e-4 1e-3}; do train vt-8l "$lr" "$W/train/vt-8l-$lr" "${VT_BUDGET:-30}" "${VT_STEPS:-}" "${VT_PHASES:-}" & done
  wait
  # The vt-8l run that answers more of the training-format batches at 4K.
  best=$(python3 -c "
import glob, json
runs = [(json.load(open(f))['answer_accuracy']['4096'], f) for f in glob.glob('$W/train/vt-8l-*/vt-8l/recipe.json')]
print(max(runs)[1].rsplit('/', 1)[0] if runs else '')")
  echo "vt-8l kept: $best"
  [ -z "$best" ] || { mv "$best" $W/models/vt-8l; cp $W/models/vt-8l/model.safetensors "$OUT/vt-8l.model.safetensors"
    evaluate vt-8l vartrack "${VT_LENGTHS:-4096,8192,16384}" "${VT_MODES:-$ALL_MODES}"; }
) &
[ -z "${RULER_LR-3e-4}" ] || (
  train ruler-12l "$RULER_LR" $W/train/ruler-12l "${RULER_BUDGET:-15}" "${RULER_STEPS:-}"
  [ -d $W/train/ruler-12l/ruler-12l ] && mv $W/train/ruler-12l/ruler-12l $W/models/ruler-12l && {
    for f in $W/models/ruler-12l/model*.safetensors*; do cp "$f" "$OUT/ruler-12l.$(basename "$f")"; done
    evaluate ruler-12l needle "${RULER_LENGTHS:-4096,8192,16384}" "${RULER_MODES:-$ALL_MODES}"; }
) &
wait
echo "all done at $(( $(date +%s) - START )) s" >> "$LOG"
for f in $W/train/*.txt; do [ -f "$f" ] || continue; echo "== $f" >> "$LOG"; cat "$f" >> "$LOG"; done
for f in $W/eval/*.log; do [ -f "$f" ] || continue; echo "== $f" >> "$LOG"; tr '\r' '\n' < "$f" | grep -vE 'prompt [0-9]+/' | tail -4 >> "$LOG"; done
for f in $W/eval/*.merged.txt; do [ -f "$f" ] || continue; echo "== $f"; cat "$f"; done | tee -a "$LOG" | grep -E '^\| |^retrieval|exact layers|pre-QK'
files=$(cd "$W" && ls eval/*.json runs/*.json 2>/dev/null)
[ -z "$files" ] || (cd "$W" && tar cf "$OUT/eval.tar" $files)
ls -la "$OUT"
