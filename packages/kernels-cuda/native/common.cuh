// Shared by the backend's .cu files: the context, dtype loads/stores, launch checks.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stddef.h>

#define HG_EXPORT __attribute__((visibility("default")))

// dtype codes shared with the TypeScript side (src/native-cuda.ts).
enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2 };

struct Cublas;  // cublas.cu

// Small same-dtype row copies (a decode step's K/V appends: one per KV head) are queued and
// run as one kernel at the next other op, instead of one cudaMemcpyAsync each.
struct CopyDesc {
  const char *src;
  char *dst;
  unsigned long long bytes;  // destination bytes
  int sd, dd;                // dtypes: equal = plain copy, else f32 -> f16/bf16 conversion
};
#define HG_MAX_PENDING_COPIES 40
struct CopyBatch {
  CopyDesc d[HG_MAX_PENDING_COPIES];
  int n;
};

// One backend instance: its device, streams, the arena (one cudaMalloc at start) and the
// arena's internal scratch, which host arrays (ids, positions, slots) and dtype conversions use.
struct HgCtx {
  int device;
  cudaStream_t compute;
  cudaStream_t copy;
  char *arena;          // whole arena
  size_t arenaBytes;
  int *intScratch;      // host int arrays land here (stream-ordered, so reuse is safe)
  size_t intScratchCount;
  char *scratch;        // conversions, overlapping copies, GEMM operands
  size_t scratchBytes;
  void *cublasWorkspace;
  size_t cublasWorkspaceBytes;
  int *argmaxOut;       // one int on the device
  int *argmaxHost;      // pinned
  int numSMs;
  Cublas *cublas;       // null when cuBLAS is off or not found
  CopyBatch pending;    // queued small copies (see hg_flush_copies)
  int batchCopies;      // 0 turns the queue off (benchmarks compare)
  char cublasInfo[256];
};

// Loads one element of any dtype as float.
template <int DT> __device__ __forceinline__ float ld(const void *p, size_t i);
template <> __device__ __forceinline__ float ld<DT_F32>(const void *p, size_t i) { return ((const float *)p)[i]; }
template <> __device__ __forceinline__ float ld<DT_F16>(const void *p, size_t i) { return __half2float(((const __half *)p)[i]); }
template <> __device__ __forceinline__ float ld<DT_BF16>(const void *p, size_t i) { return __bfloat162float(((const __nv_bfloat16 *)p)[i]); }

template <int DT> __device__ __forceinline__ void st(void *p, size_t i, float v);
template <> __device__ __forceinline__ void st<DT_F32>(void *p, size_t i, float v) { ((float *)p)[i] = v; }
template <> __device__ __forceinline__ void st<DT_F16>(void *p, size_t i, float v) { ((__half *)p)[i] = __float2half_rn(v); }
template <> __device__ __forceinline__ void st<DT_BF16>(void *p, size_t i, float v) { ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v); }

// Dispatch a templated launch on a runtime dtype code.
#define HG_DISPATCH_DT(code, DTNAME, ...)                  \
  switch (code) {                                          \
    case DT_F32: { constexpr int DTNAME = DT_F32; __VA_ARGS__; } break; \
    case DT_F16: { constexpr int DTNAME = DT_F16; __VA_ARGS__; } break; \
    case DT_BF16: { constexpr int DTNAME = DT_BF16; __VA_ARGS__; } break; \
    default: return (int)cudaErrorInvalidValue;            \
  }

// Error of the launch just made (configuration errors); execution errors surface at the next sync.
static inline int hg_launched(void) { return (int)cudaGetLastError(); }

static inline unsigned hg_blocks(size_t n, unsigned threads, unsigned cap = 65535u * 16u) {
  size_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  return (unsigned)(b > cap ? cap : b);
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum for blockDim.x a multiple of 32 (≤ 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : 0.f;
  return warp_sum(t);
}
__device__ __forceinline__ float block_max(float v, float *red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float t = lane < nw ? red[lane] : -INFINITY;
  return warp_max(t);
}

// Runs the queued small copies (one launch); every op calls it before its own work.
int hg_flush_copies(HgCtx *c);
#define HG_FLUSH(c) do { int fr_ = hg_flush_copies(c); if (fr_) return fr_; } while (0)

// Copies `count` host ints into the context's int scratch (stream-ordered: a later upload
// cannot overwrite them before the kernels queued before it have run).
int hg_upload_ints(HgCtx *c, const int *host, size_t count, int **dev);

// cuBLAS (cublas.cu): out[n,m] = x[n,k]·w[m,k]ᵀ with x and w of dtype `dt`, out f32.
// Returns -1 when cuBLAS is not loaded (caller falls back), else a cuBLAS/CUDA status.
int hg_cublas_gemm(HgCtx *c, float *out, const void *x, const void *w, int dt, int n, int k, int m);
int hg_cublas_load(HgCtx *c, const char *path);
void hg_cublas_unload(HgCtx *c);
