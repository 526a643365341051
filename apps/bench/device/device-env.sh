# Sourced by every device run (sh apps/bench/device/X-run.sh from the repository root), so the set-up is written once:
# Bun from $DEVICE_DIR/bun.xz (default .device) on PATH, CUDA's libraries, the kernels' libraries by absolute path (the bundles
# move; a caller's own paths win, then $DEVICE_DIR/lib's where it holds them), and $OUT.
DEVICE_DIR=${DEVICE_DIR:-.device}
mkdir -p /tmp/bunbin && xz -dc "$DEVICE_DIR/bun.xz" > /tmp/bunbin/bun && chmod +x /tmp/bunbin/bun
if [ -f "$DEVICE_DIR/lib/libhgcpu.so" ]; then export HYBRIDGEN_KERNELS_CPU_LIB="${HYBRIDGEN_KERNELS_CPU_LIB:-$PWD/$DEVICE_DIR/lib/libhgcpu.so}"; fi
if [ -f "$DEVICE_DIR/lib/libhgcuda.so" ]; then export HYBRIDGEN_KERNELS_CUDA_LIB="${HYBRIDGEN_KERNELS_CUDA_LIB:-$PWD/$DEVICE_DIR/lib/libhgcuda.so}"; fi
export PATH=/tmp/bunbin:$PATH LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export HYBRIDGEN_KERNELS_CPU_LIB="${HYBRIDGEN_KERNELS_CPU_LIB:-$PWD/packages/kernels-cpu/lib/libhgcpu.so}" HYBRIDGEN_KERNELS_CUDA_LIB="${HYBRIDGEN_KERNELS_CUDA_LIB:-$PWD/packages/kernels-cuda/lib/libhgcuda.so}"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
