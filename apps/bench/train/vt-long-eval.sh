#!/bin/sh
# Variable tracking at 4K, 8K and 16K on the CPU alone (no GPU, no torch): trains needle-3l with numpy
# (tiny_retrieval.py, seed 1) into DIR unless it is there, fine-tunes it on retrieval_mix.py's vartrack
# mix with positions stretched over up to 20 000 (--span: 512-token sequences with a 16K context's
# distances) into DIR/vt-3l-long, grows that to 8 layers and fine-tunes it the same way into
# DIR/vt-8l-long, and grows needle-3l to 8 layers first and teaches it the walks over a span of 40 000
# into DIR/vt-8l-long40 (each unless it is there), then runs calibrated-eval on both 8-layer models with
# the issue's setting: window 256 + 4 sinks, 64 distractor records.
#   sh apps/bench/train/vt-long-eval.sh [DIR] [calibrated-eval flags, e.g. --lengths 4096 --prompts 8 --table FILE]
set -eu
cd "$(dirname "$0")/../../.."
DIR=${1:-.cache/models}
[ $# -gt 0 ] && shift
T=apps/bench/train/tiny_retrieval.py
[ -f "$DIR/needle-3l/model.safetensors" ] || python3 $T --out "$DIR"
[ -f "$DIR/vt-3l-long/model.safetensors" ] || python3 $T --out "$DIR" --mix vartrack --start "$DIR/needle-3l" --steps 2000 --lr 1e-3 --span 20000
[ -f "$DIR/vt-8l-long/model.safetensors" ] || python3 $T --out "$DIR" --mix vartrack --start "$DIR/vt-3l-long" --grow 8 --steps 400 --lr 1e-3 --span 20000
# Grown first, then taught the walks over a wider span (about 13 minutes on one core).
[ -f "$DIR/vt-8l-long40/model.safetensors" ] || python3 $T --out "$DIR" --mix vartrack --start "$DIR/needle-3l" --grow 8 --steps 2000 --lr 1e-3 --span 40000 --name vt-8l-long40
# The caller's flags first: the eval reads a flag's first occurrence.
exec ./bun apps/bench/src/eval/calibrated-eval.ts "$@" --models "$DIR/vt-8l-long:vartrack,$DIR/vt-8l-long40:vartrack" --lengths 4096,8192,16384 --prompts 16 --threads 1 \
  --modes full,default,default-uncapped,default-cap64,default-device,exact,speculative,verified-c1,quest,infinigen,streaming,uncalibrated
