#!/bin/sh
# One device call for issue 33's page index: the GPU top level (index_rank.cu runs kernels-cuda's
# page_index.cuh: each KV head's best pages by their int8/int4 bounds; checked against a host f64 reference)
# and the CPU stage's choice (src/cpu/index-bounds.c: the index against Quest's bf16 bounds on the
# host's cores, the same run), at the 8B heads, pages of 16, per layer, for CONTEXTS tokens.
# Needs no Bun: libhgcpu is built here from packages/kernels-cpu/native with build-native.mjs's
# flags. Stage and carry only what it reads:
#   mkdir -p .stage/index && cp --parents apps/bench/device/index-run.sh apps/bench/device/index_rank.cu apps/bench/src/cpu/index-bounds.c \
#     packages/kernels-cuda/native/page_index.cuh packages/kernels-cpu/native/* .stage/index/
# then carry [".stage/index"] and run `cd .stage/index && sh apps/bench/device/index-run.sh`.
set -u
CONTEXTS=${CONTEXTS:-32768,131000,1500000}
SRC=packages/kernels-cpu/native LIB=/tmp/hg-lib
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$OUT/machine.txt"
nvcc -O3 -std=c++17 -arch=native -o /tmp/index_rank apps/bench/device/index_rank.cu && /tmp/index_rank "$CONTEXTS" | tee "$OUT/index-rank.txt"
mkdir -p "$LIB/obj"
C="-O3 -std=gnu11 -fPIC -fno-math-errno -pthread -fvisibility=hidden"
for isa in generic avx2 avx512; do
  case $isa in generic) F="" ;; avx2) F="-mavx2 -mfma -mf16c" ;; *) F="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx2 -mfma -mf16c" ;; esac
  U=$(echo $isa | tr a-z A-Z)
  for f in kernels_matmul kernels_logits kernels_attn kernels_elem; do gcc $C $F -DHG_ISA_$U -DHG_SUFFIX=_$isa -c $SRC/$f.c -o "$LIB/obj/${f}_$isa.o" & done
done
for f in pool dispatch ops attn_partial memory random_fill cpu_stage sel_prims sel_topk sel_quest sel_index kv_tier file_rows kq; do gcc $C -c $SRC/$f.c -o "$LIB/obj/$f.o" & done
wait
gcc -shared -pthread -o "$LIB/libhgcpu.so" "$LIB"/obj/*.o -lm &&
  gcc -O2 -I$SRC apps/bench/src/cpu/index-bounds.c -L"$LIB" -lhgcpu -Wl,-rpath,"$LIB" -o /tmp/index-bounds &&
  /tmp/index-bounds "${THREADS:-13}" "$CONTEXTS" | tee "$OUT/index-bounds.txt" &&
  /tmp/index-bounds "${THREADS:-13}" "$CONTEXTS" 1 | grep index | tee "$OUT/index-bounds-avx2.txt"
