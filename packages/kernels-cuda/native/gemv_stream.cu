// The decode GEMV as a weight stream (sm_90): one persistent block an SM, a producer thread that
// copies weight chunks into shared-memory slots with bulk async copies (cp.async.bulk, completion
// on an mbarrier), and consumer warps that take the slots' dot products against x held in shared
// memory. Why: the one-warp-a-row kernel keeps only its registers' loads in flight and pays a
// launch, a ramp and a tail at every one of a layer's GEMVs. Here each SM has the whole ring
// (128 KB) in flight, and the kernel is launched programmatically: its producer starts the
// weight stream before the kernel before it has finished (weights never depend on it), and only
// the consumers wait (griddepcontrol.wait) for x. The rmsNorm of x runs once a block, while the
// first slots fill, so the norm needs no launch of its own.
//
// Work: block b takes rows [m·b/G, m·(b+1)/G); consumer warp w of NW takes the block's rows
// w, w + NW, ...; a row is read in chunks of CH elements, one slot each (with SiLU·up a slot holds
// the gate chunk and the up chunk, half a slot each). Each warp owns SPW slots, used in turn, so a
// slot's phases are waited on in order by one warp only (no parity aliasing); the producer visits
// the warps round-robin, one chunk each.
//
// Slots of 7, 8 or 16 KB, chosen per GEMV by hg_decode_plan (decode_plan.h): 16 KB halves the
// copies a byte, but a 16 KB slot would carry only an 8 KB row (k = 4096) and the ring hold half as
// much; 7 KB slots let three a warp sit beside 8B's down's 57 KB of x.
#include "common.cuh"
#include "decode_plan.h"
#include "mbarrier.cuh"
#include "trace.cuh"

static const int GS_NW = HG_GS_NW, GS_THREADS = (GS_NW + 1) * 32;
static const int GS_MAX_SMEM = HG_GS_MAX_SMEM;
enum { GS_ACCUMULATE = 1, GS_SILU = 2 };
static const int GS_SLOT7 = HG_GS_SLOT7;

struct StreamArgs {
  float *out;
  const float *x;
  const void *w, *bias, *nw;
  int bt, nt, k, m, spw;  // spw: slots a consumer warp owns
  float eps;
  int trace;  // HG_TRACE builds: the launch's number for its event records
  int fold;   // with a norm (always set): x·nw staged, the norm's scale applied to each dot product
};

// Barrier of the consumer warps alone (the producer warp does not take part).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(GS_NW * 32) : "memory"); }

// Shared memory (stream_header, stream_vec, stream_smem): decode_plan.h.

// This block's rows of an m-row GEMV: [r0, r0 + rows).
__device__ __forceinline__ void stream_block_rows(int m, int &r0, int &rows) {
  r0 = (int)((long)m * blockIdx.x / gridDim.x);
  rows = (int)((long)m * (blockIdx.x + 1) / gridDim.x) - r0;
}

// SLOT: bytes a slot holds. A chunk is CH elements of a row; with SiLU·up a slot holds the gate
// chunk and the up chunk (m rows further on), so CH is half as long. x is staged with GS_XLOADS
// loads in flight a thread and the norm weights before the wait, so x is ready sooner after it; the
// same bits as one load a pass.
static const int GS_XLOADS = 4;
template <int WT, bool NORM, int EPI, int SLOT>
__global__ void __launch_bounds__(GS_THREADS, 1) gemv_stream_kernel(StreamArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr bool SILU = (EPI & GS_SILU) != 0;
  constexpr int ES = 2, CH = SLOT / ES / (SILU ? 2 : 1);  // bf16 / f16 only (f32 weights keep the one-warp kernel)
  const int k = a.k, m = a.m, spw = a.spw, ns = GS_NW * spw, nch = (k + CH - 1) / CH;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint64_t *full = reinterpret_cast<uint64_t *>(smem), *empty = full + ns;
  float *red = reinterpret_cast<float *>(empty + ns);
  float *xs = reinterpret_cast<float *>(smem + stream_header(ns));
  float *nws = reinterpret_cast<float *>(reinterpret_cast<unsigned char *>(xs) + stream_vec(k));
  unsigned char *ring = reinterpret_cast<unsigned char *>(nws) + (NORM ? stream_vec(k) : 0);
  int r0, rows;
  stream_block_rows(m, r0, rows);
  if (threadIdx.x == 0) {
    for (int s = 0; s < ns; s++) { mbar_init(&full[s], 1); mbar_init(&empty[s], 1); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0) HG_TR(a, 0);  // the block is resident
  hg_pdl_trigger();  // the next kernel's blocks may queue now; they cannot share an SM with this one
  if (warp == GS_NW) {  // the producer: weights only, so it need not wait for the kernel before
    if (lane == 0) {
      // Every chunk of the block's rows, warp by warp round-robin: warp w's rows are w, w + NW, ...
      // and it owns slots w·spw .. w·spw + spw - 1, used in turn.
      const char *wb = static_cast<const char *>(a.w);
      const int perWarp = (rows + GS_NW - 1) / GS_NW * nch;  // most chunks any warp takes
      HG_TR(a, 1);  // the GEMV's first copy
      for (int t = 0; t < perWarp; t++) {
        if (t == spw) HG_TR(a, 2);  // trace point: every ring slot holds a copy in flight
        for (int cw = 0; cw < GS_NW; cw++) {
          const int i = cw + GS_NW * (t / nch), c = t % nch;  // the warp's row (in the block) and chunk
          if (i >= rows) continue;
          const int s = cw * spw + t % spw, use = t / spw;
          if (use > 0) mbar_wait(&empty[s], (use - 1) & 1);
          const unsigned bytes = (unsigned)(min(CH, k - c * CH) * ES);
          mbar_expect_tx(&full[s], SILU ? 2 * bytes : bytes);
          unsigned char *dst = ring + (size_t)s * SLOT;
          const size_t row = (size_t)(r0 + i);
          bulk_copy(dst, wb + (row * k + (size_t)c * CH) * ES, bytes, &full[s]);
          if (SILU) bulk_copy(dst + CH * ES, wb + ((row + m) * k + (size_t)c * CH) * ES, bytes, &full[s]);
        }
      }
      HG_TR(a, 3);  // the last copy issued
    }
    hg_pdl_wait();  // every thread waits before it exits: completion stays transitive
    return;
  }
  // With fold, x·nw goes into shared memory as x is read and rs = rsqrt(mean x² + eps) scales
  // each dot product afterwards, so x is read once and the first slot waits on one barrier fewer.
  const bool fold = NORM && a.fold;
  if (NORM) {  // constant: staged before the wait
    for (int i = threadIdx.x; i < k; i += GS_NW * 32) nws[i] = load_any(a.nw, a.nt, i);
    if (fold) consumers_sync();  // fold reads other threads' elements while staging x
  }
  hg_pdl_wait();  // x (and out, for +=) come from the kernels before this one
  if (threadIdx.x == 0) HG_TR(a, 4);  // x may be read
  // x (normalised: x·rsqrt(mean x² + eps)·nw, or x·nw with fold) into shared memory, by the consumer warps.
  float rs = 1.f;
  {
    const int tid = threadIdx.x, nt = GS_NW * 32;
    float ss = 0.f;
    if ((((uintptr_t)a.x & 15) | (k & 3)) == 0) {
      const float4 *x4 = reinterpret_cast<const float4 *>(a.x);
      float4 *s4 = reinterpret_cast<float4 *>(xs);
      for (int b = tid; b < k / 4; b += nt * GS_XLOADS) {  // every load of a pass issued before any is used
        float4 v[GS_XLOADS];
#pragma unroll
        for (int u = 0; u < GS_XLOADS; u++) v[u] = b + u * nt < k / 4 ? x4[b + u * nt] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int u = 0; u < GS_XLOADS; u++)
          if (b + u * nt < k / 4) {
            if (NORM) ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
            if (fold) {
              const float4 n = reinterpret_cast<const float4 *>(nws)[b + u * nt];
              v[u].x *= n.x; v[u].y *= n.y; v[u].z *= n.z; v[u].w *= n.w;
            }
            s4[b + u * nt] = v[u];
          }
      }
    } else {
      for (int i = tid; i < k; i += nt) {
        const float v = a.x[i];
        xs[i] = fold ? v * nws[i] : v;
        if (NORM) ss += v * v;
      }
    }
    if (NORM) {
      ss = warp_sum(ss);
      if (lane == 0) red[warp] = ss;
      consumers_sync();
      float tot = 0.f;
#pragma unroll
      for (int i = 0; i < GS_NW; i++) tot += red[i];
      const float r = rsqrtf(tot / k + a.eps);
      if (fold) rs = r;  // the barrier above also published x·nw
      else for (int i = tid; i < k; i += nt) xs[i] *= r * nws[i];
    }
    if (!fold) consumers_sync();
  }
  if (threadIdx.x == 0) HG_TR(a, 5);  // x in shared memory (normalised)
  int t = 0;  // this warp's chunk counter (its slot is warp·spw + t % spw, use t / spw)
  for (int i = warp; i < rows; i += GS_NW) {
    const int r = r0 + i;
    float a0 = 0.f, a1 = 0.f;
    for (int c = 0; c < nch; c++, t++) {
      const int s = warp * spw + t % spw;
      mbar_wait(&full[s], (t / spw) & 1);
#ifdef HG_TRACE
      if (threadIdx.x == 0 && i == 0 && c == 0) HG_TR(a, 6);  // warp 0's first slot landed
#endif
      const uint4 *w0 = reinterpret_cast<const uint4 *>(ring + (size_t)s * SLOT);
      const uint4 *w1 = w0 + CH * ES / 16;
      const float4 *x4 = reinterpret_cast<const float4 *>(xs + (size_t)c * CH);
      const int nv = min(CH, k - c * CH) / 8;
#pragma unroll 4
      for (int v = lane; v < nv; v += 32) {
        float f0[8], f1[8];
        Vec16<WT>::cvt(w0[v], f0);
        if (SILU) Vec16<WT>::cvt(w1[v], f1);
        const float4 xa = x4[2 * v], xb = x4[2 * v + 1];
        a0 += f0[0] * xa.x + f0[1] * xa.y + f0[2] * xa.z + f0[3] * xa.w + f0[4] * xb.x + f0[5] * xb.y + f0[6] * xb.z + f0[7] * xb.w;
        if (SILU) a1 += f1[0] * xa.x + f1[1] * xa.y + f1[2] * xa.z + f1[3] * xa.w + f1[4] * xb.x + f1[5] * xb.y + f1[6] * xb.z + f1[7] * xb.w;
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);  // the slot may be refilled
    }
    a0 = warp_sum(a0);
    if (SILU) a1 = warp_sum(a1);
    if (fold) { a0 *= rs; a1 *= rs; }
    if (lane == 0) {
      const float y0 = a0 + (a.bias ? load_any(a.bias, a.bt, r) : 0.f);
      float v = y0;
      if (SILU) {
        const float y1 = a1 + (a.bias ? load_any(a.bias, a.bt, r + m) : 0.f);
        v = y0 / (1.f + expf(-y0)) * y1;
      }
      if (EPI & GS_ACCUMULATE) a.out[r] += v; else a.out[r] = v;
    }
  }
#ifdef HG_TRACE
  if (lane == 0) HG_TR(a, 7 + warp);  // consumer warp `warp` done with the GEMV
#endif
}

template <int WT, bool NORM, int EPI, int SLOT>
static int launch_stream(HgCtx *c, const StreamArgs &a, int grid) {
  static bool opted = false;  // shared memory above 48 KB is opted into once per kernel instance
  if (!opted) {
    const cudaError_t e = cudaFuncSetAttribute(gemv_stream_kernel<WT, NORM, EPI, SLOT>, cudaFuncAttributeMaxDynamicSharedMemorySize, GS_MAX_SMEM);
    if (e != cudaSuccess) return (int)e;
    opted = true;
  }
  const size_t smem = stream_smem(a.k, a.spw, SLOT, NORM);
  return hg_launch_pdl(c, true, gemv_stream_kernel<WT, NORM, EPI, SLOT>, dim3((unsigned)grid), dim3(GS_THREADS), smem, a);
}

template <int WT, bool NORM, int EPI>
static int launch_stream_slot(HgCtx *c, int slot, const StreamArgs &a, int grid) {
  if constexpr ((EPI & GS_SILU) == 0)
    if (slot == GS_SLOT7) return launch_stream<WT, NORM, EPI, GS_SLOT7>(c, a, grid);
  return slot == 16384 ? launch_stream<WT, NORM, EPI, 16384>(c, a, grid) : launch_stream<WT, NORM, EPI, 8192>(c, a, grid);
}

template <int WT, bool NORM>
static int launch_stream_epi(HgCtx *c, int epi, int slot, const StreamArgs &a, int grid) {
  switch (epi) {
    case 0: return launch_stream_slot<WT, NORM, 0>(c, slot, a, grid);
    case 1: return launch_stream_slot<WT, NORM, 1>(c, slot, a, grid);
    case 2: return launch_stream_slot<WT, NORM, 2>(c, slot, a, grid);
    default: return (int)cudaErrorInvalidValue;  // SiLU·up with += has no caller
  }
}

#ifdef HG_TRACE
static int g_trace_seq;  // the next launch's number (host side; a captured graph keeps the ones it got)
#endif

// CMD_GEMV_STREAM: p[0] out, p[1] x, p[2] w, p[3] bias, p[4] norm weight; s[0] weight dtype,
// s[1] bias dtype, s[2] norm dtype, s[3] k, s[4] m, s[5] epilogue, s[6] slots a warp, s[7] slot
// bytes, s[8] the norm folded into the dot products (always, with a norm), s[9] blocks; f[0] eps.
int hg_launch_gemv_stream(HgCtx *c, const Cmd &cmd) {
  StreamArgs a = {(float *)cmd.p[0], (const float *)cmd.p[1], cmd.p[2], cmd.p[3], cmd.p[4], cmd.s[1], cmd.s[2], cmd.s[3], cmd.s[4], cmd.s[6], cmd.f[0], 0, cmd.s[8]};
#ifdef HG_TRACE
  a.trace = g_trace_seq++;
#endif
  const bool norm = cmd.p[4] != nullptr;
  const int slot = cmd.s[7];
  switch (cmd.s[0]) {
    case DT_BF16: return norm ? launch_stream_epi<DT_BF16, true>(c, cmd.s[5], slot, a, cmd.s[9]) : launch_stream_epi<DT_BF16, false>(c, cmd.s[5], slot, a, cmd.s[9]);
    case DT_F16: return norm ? launch_stream_epi<DT_F16, true>(c, cmd.s[5], slot, a, cmd.s[9]) : launch_stream_epi<DT_F16, false>(c, cmd.s[5], slot, a, cmd.s[9]);
    default: return (int)cudaErrorInvalidValue;
  }
}

extern "C" {

// Device studies (HG_TRACE builds only; -1 elsewhere): turn the per-block event records on or
// off (on: every record zeroed first), and read them back.
HG_EXPORT int hg_trace_set(int on) {
#ifdef HG_TRACE
  if (cudaDeviceSynchronize() != cudaSuccess) return -1;
  void *buf = nullptr;
  if (on && (cudaGetSymbolAddress(&buf, g_trace) != cudaSuccess || cudaMemset(buf, 0, sizeof(TraceRec) * HG_TRACE_MAX) != cudaSuccess)) return -1;
  if (cudaDeviceSynchronize() != cudaSuccess) return -1;
  return cudaMemcpyToSymbol(g_trace_on, &on, sizeof on) == cudaSuccess ? 0 : -1;
#else
  (void)on;
  return -1;
#endif
}

// Every record slot (up to max), written or not (t = 0): returns how many were copied.
HG_EXPORT int hg_trace_read(TraceRec *out, int max) {
#ifdef HG_TRACE
  const int n = max < (int)HG_TRACE_MAX ? max : (int)HG_TRACE_MAX;
  if (cudaDeviceSynchronize() != cudaSuccess) return -1;
  return cudaMemcpyFromSymbol(out, g_trace, (size_t)n * sizeof(TraceRec)) == cudaSuccess ? n : -1;
#else
  (void)out; (void)max;
  return -1;
#endif
}

}  // extern "C"
