#!/bin/sh
# One device call: the calibrated defaults beside full attention on the CUDA backend (bf16 KV), no
# profile and no K given, for every model of $STAGE/models.txt side by side (one eval process each,
# a quarter of the card each), each process cut at EVAL_S seconds (a length's results are written
# as soon as it ends, so a cut run keeps the lengths it finished). From the repository root, with
# the shared stage's bun.xz, lib/ and calibrated-eval.js in $DEVICE_DIR (device-env.sh):
#   STAGE=.stage/calib DEVICE_DIR=.device sh apps/bench/device/calibrated-accuracy-run.sh
# $STAGE holds each model as NAME.tar.xz (tar cJf $STAGE/NAME.tar.xz -C DIR/.. NAME: weights travel
# compressed, the carry holds 64 MiB), models.txt (lines NAME:TASK:LENGTHS, lengths comma-separated)
# and optionally args-NAME.txt (calibrated-eval flags for that model, ahead of the defaults: e.g. --prompts 6).
set -u
. "$(dirname "$0")/device-env.sh"
STAGE=${STAGE:-.stage/calib}
LOG="$OUT/run.log"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$LOG"
mkdir -p /tmp/models /tmp/eval
while IFS=: read -r name task lengths; do
  [ -n "$name" ] || continue
  tar xJf "$STAGE/$name.tar.xz" -C /tmp/models
  # The model's own flags first: the eval takes a flag's first occurrence.
  timeout "${EVAL_S:-75}" bun "$DEVICE_DIR/calibrated-eval.js" $(cat "$STAGE/args-$name.txt" 2>/dev/null) --backend cuda --models "/tmp/models/$name:$task" \
    --lengths "$lengths" --prompts "${PROMPTS:-8}" --modes "${MODES:-full,default,default-uncapped,quest}" \
    --json "$OUT/$name.json" --table "$OUT/$name.table.json" < /dev/null > "/tmp/eval/$name.log" 2>&1 &
done < "$STAGE/models.txt"
wait
for f in /tmp/eval/*.log; do echo "== $f"; tr '\r' '\n' < "$f" | tee -a "$LOG" | grep -vE 'prompt [0-9]+/' | tail -40; done
ls -la "$OUT"
