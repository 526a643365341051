#!/bin/sh
# One device call for issue 33's page index: the GPU top level (index_rank.cu: every page's bound
# from the int8/int4 index, then each KV head's best pages; checked against a host f64 reference)
# and the CPU stage's choice (src/cpu/index-bounds.c: the index against Quest's bf16 bounds on the
# host's cores, the same run), at the 8B heads, pages of 16, per layer, for CONTEXTS tokens.
# Needs no Bun: carry the kernels-cpu library built on the dev machine (`bun run build` there), e.g.
#   mkdir -p .stage/index && rsync -aR apps/bench/device/index-run.sh apps/bench/device/index_rank.cu apps/bench/src/cpu/index-bounds.c \
#     packages/kernels-cpu/native packages/kernels-cpu/lib/libhgcpu.so .stage/index/
# then carry [".stage/index"] and run `cd .stage/index && sh apps/bench/device/index-run.sh`.
set -u
CONTEXTS=${CONTEXTS:-32768,131000,1500000}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/machine.txt"
nvcc -O3 -arch=native -o /tmp/index_rank apps/bench/device/index_rank.cu && /tmp/index_rank "$CONTEXTS" | tee "$OUT/index-rank.txt"
gcc -O2 -Ipackages/kernels-cpu/native apps/bench/src/cpu/index-bounds.c -Lpackages/kernels-cpu/lib -lhgcpu -Wl,-rpath,"$PWD/packages/kernels-cpu/lib" -o /tmp/index-bounds &&
  /tmp/index-bounds "${THREADS:-13}" "$CONTEXTS" | tee "$OUT/index-bounds.txt"
