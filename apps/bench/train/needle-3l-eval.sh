#!/bin/sh
# The calibrated defaults beside full attention on a model nobody profiled, on the CPU alone (no GPU,
# no torch): trains needle-3l with numpy (tiny_retrieval.py, seed 1) into DIR unless it is there,
# then runs calibrated-eval on the CPU backend at short contexts with a 64-token window + 4 sinks.
#   sh apps/bench/train/needle-3l-eval.sh [DIR] [calibrated-eval flags, e.g. --table FILE]
set -eu
cd "$(dirname "$0")/../../.."
DIR=${1:-.cache/models}
[ $# -gt 0 ] && shift
[ -f "$DIR/needle-3l/model.safetensors" ] || python3 apps/bench/train/tiny_retrieval.py --out "$DIR"
exec ./bun apps/bench/src/eval/calibrated-eval.ts --models "$DIR/needle-3l:needle" --lengths 512,1024 --window 64 --sinks 4 --records 24 \
  --prompts 16 --threads 1 --modes full,default,default-uncapped,default-device,quest,uncalibrated "$@"
