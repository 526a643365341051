#!/bin/sh
# Every mode beside full attention on vartrack walks, on the CPU alone (no GPU, no torch): trains
# needle-3l with numpy (tiny_retrieval.py, seed 1) into DIR unless it is there, fine-tunes it on
# retrieval_mix.py's vartrack mix into DIR/vt-3l unless that is there, grows vt-3l to 8 layers and
# fine-tunes that into DIR/vt-8l-tiny unless it is there, then runs calibrated-eval on both on the
# CPU backend at short contexts (they were trained on 512 tokens at most) with a 64-token window + 4 sinks.
#   sh apps/bench/train/vt-3l-eval.sh [DIR] [calibrated-eval flags, e.g. --table FILE]
set -eu
cd "$(dirname "$0")/../../.."
DIR=${1:-.cache/models}
[ $# -gt 0 ] && shift
[ -f "$DIR/needle-3l/model.safetensors" ] || python3 apps/bench/train/tiny_retrieval.py --out "$DIR"
[ -f "$DIR/vt-3l/model.safetensors" ] || python3 apps/bench/train/tiny_retrieval.py --out "$DIR" --mix vartrack --start "$DIR/needle-3l" --steps 2000 --lr 1e-3
[ -f "$DIR/vt-8l-tiny/model.safetensors" ] || python3 apps/bench/train/tiny_retrieval.py --out "$DIR" --mix vartrack --start "$DIR/vt-3l" --grow 8 --steps 400 --lr 1e-3
exec ./bun apps/bench/src/eval/calibrated-eval.ts --models "$DIR/vt-3l:vartrack,$DIR/vt-8l-tiny:vartrack" --lengths 256,512,1024 --window 64 --sinks 4 --records 24 --prompts 16 --threads 1 \
  --modes full,default,default-uncapped,default-device,exact,speculative,verified-c1,quest,infinigen,streaming,uncalibrated "$@"
