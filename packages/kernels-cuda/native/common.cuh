// Shared by the backend's .cu files: the context, dtype loads/stores, launch checks.
#pragma once
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stddef.h>
#include "decode_plan.h"

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

// ---- decode-step graphs (graph.cu) ----
// Between hg_cu_step_begin and hg_cu_step_end the recordable ops (row ops, GEMV, attention
// stages, queued copies) are not launched but appended as commands; their per-step values
// (positions, token ids, span lengths, copy destinations) go to a host blob that is copied to
// the device before the step runs, and the kernels read them from there. At the end of the
// step the command list either equals the one a cached CUDA graph was captured from (the
// static part: kernels, pointers, grid) and the graph is replayed, or a new graph is captured.
// Any other op in the middle of a step (a read, a write, cuBLAS) first runs the recorded
// commands ("drain") and the rest of the step runs eagerly.
enum { CMD_EMBED = 1, CMD_RMSNORM, CMD_LAYERNORM, CMD_ROPE, CMD_SILU, CMD_RELU, CMD_GELU, CMD_ADD, CMD_SOFTMAX, CMD_GEMV, CMD_LOGITS, CMD_AGG, CMD_MEMSET, CMD_COPYBATCH, CMD_DECODE_ATTN, CMD_GEMV_FUSED, CMD_SKINNY, CMD_BATCH_ATTN, CMD_GEMV_STREAM, CMD_GATHER_ROWS, CMD_SPAN_ATTN, CMD_ATTN_MERGE, CMD_SIGNALLED_COPY, CMD_AWAIT_SIGNAL, CMD_READ_MAPPED, CMD_PAD_COLUMNS, CMD_EVENT, CMD_INDEX_RANK, CMD_CUBLAS, CMD_INDEX_RANK_ROWS, CMD_HAND_OFF_ROWS, CMD_ATTN_MERGE_ROWS, CMD_RESCORE_ROWS, CMD_SEND_ROWS, CMD_KEEP_ROWS, CMD_SPAN_ATTN_ROWS, CMD_APPEND_ROWS, CMD_SIDE };
struct Cmd {
  int kind;
  int s[12];         // static ints (shapes, dtypes, grid choices)
  float f[2];        // static floats (eps, scale)
  const void *p[8];  // device pointers (blob pointers included: their offsets are static)
  int dynOff;        // offset of this command's per-step ints in the device blob, -1 none
  int d[3];          // per-step ints by value (eager runs); NOT part of the signature
};
#define HG_CMD_SIG_BYTES offsetof(Cmd, d)
enum { STEP_NONE = 0, STEP_RECORDING = 1, STEP_EAGER = 2 };
#define HG_MAX_GRAPH_KEYS 256
#define HG_BLOB_BYTES (4u << 20)
#define HG_SEG_TIMES 256  // recorded segments timed between two hg_link_times reads (later ones are not)
struct StepGraph {
  Cmd *sig;
  int n;
  cudaGraphExec_t exec;
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
  char *uploadHost;          // pinned: eager int uploads are staged here, in two halves taken in turn
  cudaEvent_t uploadDone[2]; // the copies from a half have run: it may be rewritten
  int uploadHalf;
  size_t uploadUsed;
  char *scratch;        // conversions, overlapping copies, GEMM operands
  size_t scratchBytes;
  void *cublasWorkspace;
  size_t cublasWorkspaceBytes;
  int *argmaxOut;       // one int on the device
  float *decodePart;    // split-K decode attention: per-split (max, sum, unnormalised output)
  size_t decodePartBytes;
  int *argmaxHost;      // pinned (16 ints: [0] the argmax, [4], [5] the token feed's host slots)
  cudaEvent_t feedDone[2];  // the token feed's host slots have their pick (token_feed.cu)
  cudaEvent_t feedPicked;   // the pick is in the feed (the side stream's copy waits for it)
  cudaStream_t feedStream;  // the pick's copy to the host, off the compute stream
  // The side stream (side_stream.cu): kernels launched between CMD_SIDE begin and end run there, beside the compute stream.
  cudaStream_t side;
  cudaEvent_t sideFork, sideDone;
  int onSide, sideOpen;     // launching to the side now; side work recorded since the last join
  int numSMs;
  Cublas *cublas;       // null when cuBLAS is off or not found
  CopyBatch pending;    // queued small copies (see hg_flush_copies)
  int batchCopies;      // 0 turns the queue off (benchmarks compare)
  char cublasInfo[256];
  // decode-step graphs (graph.cu)
  int stepMode, stepKey, stepDrained;
  Cmd *cmds;
  int ncmds, capCmds;
  char *blobHost[2];        // pinned; alternate steps use alternate buffers
  cudaEvent_t blobDone[2];  // the blob's upload has run: the buffer may be rewritten
  int blobCur;
  size_t blobUsed;
  char *blobDev;            // in the arena's internal part
  StepGraph graphs[HG_MAX_GRAPH_KEYS];
  int skipSteps[HG_MAX_GRAPH_KEYS];
  long long nCaptures, nReplays, nDrains, nEagerSteps, nRecorded;
  char lastDrain[64];     // the entry point that last drained a step (diagnostics)
  int lastCaptureError;   // the last failed capture's error, 0 none
  // Each recorded segment's graph launch between two events (hg_seg_times sums them): the device's
  // time inside segments, against the span of a step, shows how long it idled between them.
  cudaEvent_t segEv[2 * HG_SEG_TIMES];
  int nSeg;
  long long hostWaitNs;   // the host blocked in hg_cu_step_begin for the device (the blob's double buffer)
  // The compute capability major hg_decode_plan plans for: the device's, or lower
  // (hg_cu_set_plan_major: checks and benches run another device's kernels here).
  int planMajor;
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

// 16 bytes of f32/bf16/f16 data widened to floats (N elements); shared by the GEMV, the fused
// decode GEMV and split-K decode attention.
template <int WT> struct Vec16;
template <> struct Vec16<DT_F32> {
  static constexpr int N = 4;
  __device__ static void cvt(const uint4 &r, float *f) { f[0] = __uint_as_float(r.x); f[1] = __uint_as_float(r.y); f[2] = __uint_as_float(r.z); f[3] = __uint_as_float(r.w); }
};
template <> struct Vec16<DT_BF16> {
  static constexpr int N = 8;
  __device__ static void cvt(const uint4 &r, float *f) {
    const unsigned u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) { f[2 * i] = __uint_as_float(u[i] << 16); f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u); }
  }
};
template <> struct Vec16<DT_F16> {
  static constexpr int N = 8;
  __device__ static void cvt(const uint4 &r, float *f) {
    const unsigned u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const float2 t = __half22float2(*reinterpret_cast<const __half2 *>(&u[i]));
      f[2 * i] = t.x; f[2 * i + 1] = t.y;
    }
  }
};

// One element of any dtype by a run-time dtype code.
__device__ __forceinline__ float load_any(const void *p, int dt, int i) {
  return dt == DT_F32 ? ld<DT_F32>(p, i) : dt == DT_F16 ? ld<DT_F16>(p, i) : ld<DT_BF16>(p, i);
}

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

// The stream a kernel is launched on: the compute stream, or the side stream between CMD_SIDE begin and end.
static inline cudaStream_t hg_stream(const HgCtx *c) { return c->onSide ? c->side : c->compute; }


// Programmatic dependent launch (sm_90): a kernel launched with the attribute (hg_launch_pdl(c,
// true, ...): the weight stream, gemv_stream.cu) may start while the kernel before it drains. It
// must call hg_pdl_wait() before it touches anything an earlier kernel writes (or writes anything
// an earlier kernel reads). hg_pdl_trigger() lets the next kernel's blocks be scheduled once every
// block of this one has called it (or exited): the big kernels call it after their loads, not at
// their start. Both are no-ops in a kernel launched without the attribute, which is how hg_launch
// launches most kernels (the attribute on all decode kernels measured slower on the H200:
// DEVICE-NOTES.md); their waits and triggers stay so that a weight stream after them can start
// early. The split-K decode attention's two kernels, and a recorded step's RoPE and K/V append
// before them, are launched with it.
// Every kernel launched with the attribute waits in every thread before it exits, so completion
// stays transitive.
__device__ __forceinline__ void hg_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void hg_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// Launches `kernel` on the launching stream (hg_stream), with the programmatic-serialization attribute when
// `pdl` (the kernel then follows the hg_pdl_wait contract above).
template <typename... KArgs, typename... Args>
static inline int hg_launch_pdl(const HgCtx *c, bool pdl, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t shmem, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = shmem;
  cfg.stream = hg_stream(c);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
  const cudaError_t last = cudaGetLastError();
  return (int)(e != cudaSuccess ? e : last);
}
// A plain launch on the launching stream (the launch error, as hg_launched reports it).
template <typename... KArgs, typename... Args>
static inline int hg_launch(const HgCtx *c, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t shmem, Args... args) {
  return hg_launch_pdl(c, false, kernel, grid, block, shmem, args...);
}

// Runs `run()` (which returns a cudaError_t) once to warm up, then `iters` times between two
// events on the compute stream; *ms is the time of the iters runs (the bandwidth probes).
template <typename F>
static inline int hg_time_runs(HgCtx *c, int iters, F run, float *ms) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaError_t e = run();  // warm-up
  if (e == cudaSuccess) e = cudaEventRecord(a, c->compute);
  for (int i = 0; i < iters && e == cudaSuccess; i++) e = run();
  if (e == cudaSuccess) e = cudaEventRecord(b, c->compute);
  if (e == cudaSuccess) e = cudaEventSynchronize(b);
  if (e == cudaSuccess) e = cudaEventElapsedTime(ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return (int)e;
}

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

// 2^x as one MUFU op: flushing subnormal results to zero drops nothing a softmax keeps, while
// exp2f's subnormal handling costs three more instructions per probability.
__device__ __forceinline__ float exp2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}
// A shared-memory pointer as the 32-bit address PTX's shared-space instructions take.
__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

// Runs the queued small copies (one launch, or one recorded command inside a step).
int hg_flush_copies(HgCtx *c);
// Inside a recorded step: runs what was recorded, and the rest of the step runs eagerly.
int hg_drain_at(HgCtx *c, const char *who);
#define hg_drain(c) hg_drain_at((c), __func__)
// The device's ms in recorded segments and the host's ms blocked at a segment's start since the last call (graph.cu).
void hg_seg_times(HgCtx *c, double *segMs, double *hostWaitMs);
// Ops that cannot be recorded call HG_FLUSH before their work; recordable ones HG_FLUSH_REC.
#define HG_FLUSH(c) do { int fr_ = hg_drain(c); if (!fr_) fr_ = hg_flush_copies(c); if (fr_) return fr_; } while (0)
#define HG_FLUSH_REC(c) do { int fr_ = hg_flush_copies(c); if (fr_) return fr_; } while (0)
static inline bool hg_recording(const HgCtx *c) { return c->stepMode == STEP_RECORDING; }
// Whether byte ranges [a, a + an) and [b, b + bn) share a byte (queued copies and the folds that take them).
static inline bool hg_overlaps(const void *a, size_t an, const void *b, size_t bn) {
  return (const char *)a < (const char *)b + bn && (const char *)b < (const char *)a + an;
}
// Appends `bytes` of per-step data to the blob (data NULL: reserves them, the caller fills
// blobHost[blobCur] + offset); returns its offset, or -1 when the blob is full (the step is
// then drained and continues eagerly).
long hg_blob_put(HgCtx *c, const void *data, size_t bytes);
// Records a command (inside a step) or runs it now.
int hg_submit(HgCtx *c, const Cmd &cmd);
// Launches one command; dynBase null: eager (per-step ints by value), else the device blob.
int hg_run_cmd(HgCtx *c, const Cmd &cmd, const char *dynBase);
// Per-kind launchers (in the .cu file of each op).
int hg_launch_rowop(HgCtx *c, const Cmd &cmd, const char *dynBase);
int hg_launch_gemv(HgCtx *c, const Cmd &cmd);
int hg_launch_attn(HgCtx *c, const Cmd &cmd, const char *dynBase);
int hg_launch_copybatch(HgCtx *c, const Cmd &cmd);
bool rope_append_fits(const Cmd &rope, const CopyBatch &q);                 // rope_append.cu
int hg_launch_argmax(HgCtx *c, const float *x, int rows, int cols, int *out);  // rowops.cu
int hg_launch_rope_append(HgCtx *c, const Cmd &rope, const char *dynBase);  // rope_append.cu
int hg_launch_gemv_fused(HgCtx *c, const Cmd &cmd);
int hg_launch_decode_attn(HgCtx *c, const Cmd &cmd, const char *dynBase);
int hg_launch_skinny(HgCtx *c, const Cmd &cmd);                             // gemm_skinny.cu
int hg_launch_batch_attn(HgCtx *c, const Cmd &cmd);                         // batch_attn.cu
int hg_launch_gemv_stream(HgCtx *c, const Cmd &cmd);  // gemv_stream.cu
int hg_launch_gather_rows(HgCtx *c, const Cmd &cmd);  // host_gather.cu
int hg_launch_signalled_copy(HgCtx *c, const Cmd &cmd);  // host_copy.cu
int hg_launch_await_signal(HgCtx *c, const Cmd &cmd);    // host_copy.cu
int hg_launch_read_mapped(HgCtx *c, const Cmd &cmd);     // mapped_ops.cu
int hg_launch_pad_columns(HgCtx *c, const Cmd &cmd);     // mapped_ops.cu
int hg_launch_hand_off_rows(HgCtx *c, const Cmd &cmd);   // hand_off_rows.cu
int hg_launch_rescore_rows(HgCtx *c, const Cmd &cmd);    // hand_off_rows.cu
int hg_launch_send_rows(HgCtx *c, const Cmd &cmd);       // hand_off_rows.cu
int hg_launch_keep_rows(HgCtx *c, const Cmd &cmd);       // hand_off_rows.cu
int hg_launch_side(HgCtx *c, const Cmd &cmd);            // side_stream.cu
void hg_side_free(HgCtx *c);                             // side_stream.cu
int hg_launch_index_rank(HgCtx *c, const Cmd &cmd, const char *dynBase);  // page_index.cu
int hg_launch_index_rank_rows(HgCtx *c, const Cmd &cmd);                   // page_index.cu
int hg_launch_event(HgCtx *c, const Cmd &cmd);           // row_fetch.cu
int hg_launch_cublas(HgCtx *c, const Cmd &cmd);          // matmul.cu
int hg_launch_span_attn(HgCtx *c, const Cmd &cmd);    // span_attn.cu
int hg_launch_attn_merge(HgCtx *c, const Cmd &cmd, const char *dynBase);
int hg_launch_attn_merge_rows(HgCtx *c, const Cmd &cmd);  // span_attn.cu
int hg_launch_span_attn_rows(HgCtx *c, const Cmd &cmd);   // span_attn.cu
int hg_launch_window_append_rows(HgCtx *c, const Cmd &cmd);  // span_attn.cu

// The device a decode plan is made for (decode_plan.h).
static inline HgPlanDevice hg_plan_device(const HgCtx *c) { return HgPlanDevice{c->planMajor, c->numSMs}; }
void hg_feed_free(HgCtx *c);  // token_feed.cu

// Copies `count` host ints into the context's int scratch (stream-ordered: a later upload
// cannot overwrite them before the kernels queued before it have run). Inside a recorded
// step they go to the step's blob instead (the device pointer is then the blob's).
int hg_upload_ints(HgCtx *c, const int *host, size_t count, int **dev);
// As hg_upload_ints, for two host arrays that land back to back as one table [a | b].
int hg_upload_ints2(HgCtx *c, const int *a, size_t na, const int *b, size_t nb, int **dev);

// cuBLAS (cublas.cu): out[n,m] = x[n,k]·w[m,k]ᵀ with x and w of dtype `dt`, out f32.
// Returns -1 when cuBLAS is not loaded (caller falls back), else a cuBLAS/CUDA status.
int hg_cublas_gemm(HgCtx *c, float *out, const void *x, const void *w, int dt, int n, int k, int m);
int hg_cublas_load(HgCtx *c, const char *path);
void hg_cublas_unload(HgCtx *c);
