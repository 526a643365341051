// The decode GEMV as a weight stream (sm_90): one persistent block an SM, a producer thread that
// copies weight chunks into shared-memory slots with bulk async copies (cp.async.bulk, completion
// on an mbarrier), and consumer warps that take the slots' dot products against x held in shared
// memory. Why: the one-warp-a-row kernel keeps only its registers' loads in flight and pays a
// launch, a ramp and a tail at every one of a layer's GEMVs. Here each SM has the whole ring
// (64–192 KB) in flight, and the kernel is launched programmatically: its producer starts the
// weight stream before the kernel before it has finished (weights never depend on it), and only
// the consumers wait (griddepcontrol.wait) for x. The rmsNorm of x runs once a block, while the
// first slots fill, so the norm needs no launch of its own.
//
// Work: block b takes rows [m·b/G, m·(b+1)/G); consumer warp w of NW takes the block's rows
// w, w + NW, ...; a row is read in chunks of CH elements (one slot each; with SiLU·up a slot holds
// the gate chunk and the up chunk). Each warp owns SPW slots, used in turn, so a slot's phases
// are waited on in order by one warp only (no parity aliasing); the producer visits the warps
// round-robin, one chunk each.
#include "common.cuh"
#include "mbarrier.cuh"

static const int GS_NW = 8, GS_THREADS = (GS_NW + 1) * 32, GS_SLOT_BYTES = 8192;
static const int GS_MAX_SMEM = 227 * 1024;  // sm_90's largest dynamic shared memory a block
enum { GS_ACCUMULATE = 1, GS_SILU = 2 };

struct StreamArgs {
  float *out;
  const float *x;
  const void *w, *bias, *nw;
  int bt, nt, k, m, spw;  // spw: slots a consumer warp owns
  float eps;
};

// Barrier of the consumer warps alone (the producer warp does not take part).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(GS_NW * 32) : "memory"); }

// Bytes before x in shared memory: the full and empty barriers of ns slots, the norm's sums.
__host__ __device__ __forceinline__ size_t stream_header(int ns) { return ((size_t)2 * ns * 8 + GS_NW * 4 + 127) & ~(size_t)127; }

template <int WT>
struct StreamShape {
  static constexpr int ES = 2;  // bf16 / f16 only (f32 weights keep the one-warp kernel)
};

// The producer's share of one GEMV: every chunk of the block's rows, warp by warp round-robin.
// tw[w]: chunks already given to warp w (in earlier phases of a chain; 0 for a single GEMV).
template <bool SILU>
__device__ __forceinline__ void stream_produce(const StreamArgs &a, int spw, uint64_t *full, uint64_t *empty, unsigned char *ring, int (&tw)[GS_NW]) {
  constexpr int ES = 2, CH = GS_SLOT_BYTES / ES / (SILU ? 2 : 1);  // elements a chunk
  const int k = a.k, m = a.m, nch = (k + CH - 1) / CH;
  const int r0 = (int)((long)m * blockIdx.x / gridDim.x), rows = (int)((long)m * (blockIdx.x + 1) / gridDim.x) - r0;
  const char *wb = static_cast<const char *>(a.w);
  const int perWarp = (rows + GS_NW - 1) / GS_NW * nch;  // most chunks any warp takes
  for (int t = 0; t < perWarp; t++) {
#pragma unroll
    for (int cw = 0; cw < GS_NW; cw++) {
      const int i = cw + GS_NW * (t / nch), c = t % nch;  // the warp's row (in the block) and chunk
      if (i >= rows) continue;
      const int n = tw[cw] + t, s = cw * spw + n % spw, use = n / spw;
      if (use > 0) mbar_wait(&empty[s], (use - 1) & 1);
      const int elems = min(CH, k - c * CH);
      const unsigned bytes = (unsigned)(elems * ES);
      mbar_expect_tx(&full[s], SILU ? 2 * bytes : bytes);
      unsigned char *dst = ring + (size_t)s * GS_SLOT_BYTES;
      const size_t row = (size_t)(r0 + i);
      bulk_copy(dst, wb + (row * k + (size_t)c * CH) * ES, bytes, &full[s]);
      if (SILU) bulk_copy(dst + CH * ES, wb + ((row + m) * k + (size_t)c * CH) * ES, bytes, &full[s]);
    }
  }
#pragma unroll
  for (int cw = 0; cw < GS_NW; cw++) tw[cw] += (rows > cw ? (rows - cw + GS_NW - 1) / GS_NW : 0) * nch;
}

// The consumers' share of one GEMV: x (normalised: x·rsqrt(mean x² + eps)·nw) into shared memory,
// then the warp's rows, chunk by chunk as the slots land. t: this warp's chunk counter (its slot
// is warp·spw + t % spw, use t / spw), carried from phase to phase of a chain. L2: x and out (for
// +=) are read through L2 only, since in a chain other SMs wrote them after this SM's L1 may
// have seen the line.
template <int WT, bool NORM, int EPI, bool L2>
__device__ __forceinline__ void stream_consume(const StreamArgs &a, int spw, uint64_t *full, uint64_t *empty, float *red, float *xs, const unsigned char *ring,
                                               int &t) {
  constexpr bool SILU = (EPI & GS_SILU) != 0;
  constexpr int ES = StreamShape<WT>::ES, CH = GS_SLOT_BYTES / ES / (SILU ? 2 : 1);  // elements a chunk
  const int k = a.k, m = a.m, nch = (k + CH - 1) / CH;
  const int r0 = (int)((long)m * blockIdx.x / gridDim.x), r1 = (int)((long)m * (blockIdx.x + 1) / gridDim.x);
  const int rows = r1 - r0, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  {
    const int tid = threadIdx.x, nt = GS_NW * 32;
    float ss = 0.f;
    if ((((uintptr_t)a.x & 15) | (k & 3)) == 0) {
      const float4 *x4 = reinterpret_cast<const float4 *>(a.x);
      float4 *s4 = reinterpret_cast<float4 *>(xs);
      for (int i = tid; i < k / 4; i += nt) {
        const float4 v = L2 ? __ldcg(x4 + i) : x4[i];
        s4[i] = v;
        if (NORM) ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
      }
    } else {
      for (int i = tid; i < k; i += nt) {
        const float v = L2 ? __ldcg(a.x + i) : a.x[i];
        xs[i] = v;
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
      for (int i = tid; i < k; i += nt) xs[i] *= r * load_any(a.nw, a.nt, i);
    }
    consumers_sync();
  }
  for (int i = warp; i < rows; i += GS_NW) {
    float a0 = 0.f, a1 = 0.f;
    for (int c = 0; c < nch; c++, t++) {
      const int s = warp * spw + t % spw;
      mbar_wait(&full[s], (t / spw) & 1);
      const uint4 *w0 = reinterpret_cast<const uint4 *>(ring + (size_t)s * GS_SLOT_BYTES);
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
    if (lane == 0) {
      const int r = r0 + i;
      const float y0 = a0 + (a.bias ? load_any(a.bias, a.bt, r) : 0.f);
      float v = y0;
      if (SILU) {
        const float y1 = a1 + (a.bias ? load_any(a.bias, a.bt, r + m) : 0.f);
        v = y0 / (1.f + expf(-y0)) * y1;
      }
      if (EPI & GS_ACCUMULATE) a.out[r] = (L2 ? __ldcg(a.out + r) : a.out[r]) + v; else a.out[r] = v;
    }
  }
}

// The barriers and slots of a block's ring: thread 0 initialises them, then the whole block syncs.
__device__ __forceinline__ void stream_init(uint64_t *full, uint64_t *empty, int ns) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < ns; s++) { mbar_init(&full[s], 1); mbar_init(&empty[s], 1); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

template <int WT, bool NORM, int EPI>
__global__ void __launch_bounds__(GS_THREADS, 1) gemv_stream_kernel(StreamArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int spw = a.spw, ns = GS_NW * spw;
  uint64_t *full = reinterpret_cast<uint64_t *>(smem), *empty = full + ns;
  float *red = reinterpret_cast<float *>(empty + ns);  // the norm's per-warp sums
  float *xs = reinterpret_cast<float *>(smem + stream_header(ns));
  unsigned char *ring = reinterpret_cast<unsigned char *>(xs) + (((size_t)a.k * 4 + 127) & ~(size_t)127);
  stream_init(full, empty, ns);
  hg_pdl_trigger();  // the next kernel's blocks may queue now; they cannot share an SM with this one
  if (threadIdx.x >> 5 == GS_NW) {  // the producer: weights only, so it need not wait for the kernel before
    if ((threadIdx.x & 31) == 0) {
      int tw[GS_NW] = {};
      stream_produce<(EPI & GS_SILU) != 0>(a, spw, full, empty, ring, tw);
    }
    hg_pdl_wait();  // every thread waits before it exits: completion stays transitive
    return;
  }
  hg_pdl_wait();  // x (and out, for +=) come from the kernels before this one
  int t = 0;
  stream_consume<WT, NORM, EPI, false>(a, spw, full, empty, red, xs, ring, t);
}

// ---- A layer's four GEMVs as one launch (gemvChain switch) ----
// o_proj (+=), rmsNorm + gate/up (SiLU·up), down_proj (+=), rmsNorm + the next layer's qkv (or
// lm_head): a recorded step has them back to back. As four launches each pays a boundary: the
// block's ring drains with nothing behind it, the next kernel's block starts only when this one
// exits, and its first bytes land a latency later — 2–6 µs a GEMV over the 4.45 TB/s the stream
// reaches at steady state (H200, first call of the eighth pass). Here the producer goes straight
// on to the next phase's weights (they depend on nothing) while the consumers wait at a grid
// barrier for the phase's outputs, so the ring is full when they come back.
// One block an SM (its shared memory), grid = SMs, all resident before the kernel after it may
// start (every block triggers at its start): the barrier cannot deadlock.
static const int GS_CHAIN = 4;
static const int GS_CHAIN_SPEC[GS_CHAIN] = {GS_ACCUMULATE, 4 | GS_SILU, GS_ACCUMULATE, 4};  // norm·4 + epilogue, a phase
static const size_t GS_BAR_OFFSET = 512u << 10;  // grid-barrier counters, in the context's zeroed misc area
static const int GS_BARS = 4096;

struct ChainArgs {
  StreamArgs ph[GS_CHAIN];
  unsigned *bar;  // this launch's counter: every block adds 1 a phase; the last one out resets it
  int spw;
};

// Every block's consumers have finished the phases before (their outputs are the next x).
// Called by the consumer warps only; thread 0 arrives and spins (release / acquire at gpu scope).
__device__ __forceinline__ void chain_barrier(unsigned *bar, unsigned target) {
  consumers_sync();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(bar, 1u);
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(bar) : "memory");
    } while (seen < target);
    __threadfence();
  }
  consumers_sync();
}

template <int WT>
__global__ void __launch_bounds__(GS_THREADS, 1) gemv_chain_kernel(ChainArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int spw = a.spw, ns = GS_NW * spw;
  uint64_t *full = reinterpret_cast<uint64_t *>(smem), *empty = full + ns;
  float *red = reinterpret_cast<float *>(empty + ns);
  float *xs = reinterpret_cast<float *>(smem + stream_header(ns));
  int kmax = 0;
#pragma unroll
  for (int p = 0; p < GS_CHAIN; p++) kmax = max(kmax, a.ph[p].k);
  unsigned char *ring = reinterpret_cast<unsigned char *>(xs) + (((size_t)kmax * 4 + 127) & ~(size_t)127);
  stream_init(full, empty, ns);
  hg_pdl_trigger();
  if (threadIdx.x >> 5 == GS_NW) {
    if ((threadIdx.x & 31) == 0) {
      int tw[GS_NW] = {};
      stream_produce<false>(a.ph[0], spw, full, empty, ring, tw);
      stream_produce<true>(a.ph[1], spw, full, empty, ring, tw);
      stream_produce<false>(a.ph[2], spw, full, empty, ring, tw);
      stream_produce<false>(a.ph[3], spw, full, empty, ring, tw);
    }
    hg_pdl_wait();
    return;
  }
  hg_pdl_wait();
  const unsigned G = gridDim.x;
  int t = 0;
  stream_consume<WT, false, GS_ACCUMULATE, true>(a.ph[0], spw, full, empty, red, xs, ring, t);
  chain_barrier(a.bar, G);
  stream_consume<WT, true, GS_SILU, true>(a.ph[1], spw, full, empty, red, xs, ring, t);
  chain_barrier(a.bar, 2 * G);
  stream_consume<WT, false, GS_ACCUMULATE, true>(a.ph[2], spw, full, empty, red, xs, ring, t);
  chain_barrier(a.bar, 3 * G);
  stream_consume<WT, true, 0, true>(a.ph[3], spw, full, empty, red, xs, ring, t);
  consumers_sync();  // the last block out resets the counter for the next launch (stream-ordered)
  if (threadIdx.x == 0 && atomicAdd(a.bar, 1u) == 4 * G - 1) atomicExch(a.bar, 0u);
}

// Shared memory of a launch: the barriers, x, the slots.
static size_t stream_smem(int k, int spw) {
  const int ns = GS_NW * spw;
  return stream_header(ns) + (((size_t)k * 4 + 127) & ~(size_t)127) + (size_t)ns * GS_SLOT_BYTES;
}

// Slots a warp owns for a ring of ringKb (at least one; fewer where x leaves less room), or 0
// when x and one slot a warp do not fit.
int hg_gemv_stream_slots(int k, int ringKb) {
  int spw = ringKb * 1024 / (GS_NW * GS_SLOT_BYTES);
  if (spw < 1) spw = 1;
  while (spw > 1 && stream_smem(k, spw) > (size_t)GS_MAX_SMEM) spw--;
  return stream_smem(k, spw) <= (size_t)GS_MAX_SMEM ? spw : 0;
}

template <int WT, bool NORM, int EPI>
static int launch_stream(HgCtx *c, const StreamArgs &a) {
  static bool opted = false;  // shared memory above 48 KB is opted into once per kernel instance
  if (!opted) {
    cudaError_t e = cudaFuncSetAttribute(gemv_stream_kernel<WT, NORM, EPI>, cudaFuncAttributeMaxDynamicSharedMemorySize, GS_MAX_SMEM);
    if (e != cudaSuccess) return (int)e;
    opted = true;
  }
  return hg_launch_pdl(c, true, gemv_stream_kernel<WT, NORM, EPI>, dim3((unsigned)c->numSMs), dim3(GS_THREADS), stream_smem(a.k, a.spw), a);
}

template <int WT, bool NORM>
static int launch_stream_epi(HgCtx *c, int epi, const StreamArgs &a) {
  switch (epi) {
    case 0: return launch_stream<WT, NORM, 0>(c, a);
    case 1: return launch_stream<WT, NORM, 1>(c, a);
    case 2: return launch_stream<WT, NORM, 2>(c, a);
    default: return (int)cudaErrorInvalidValue;  // SiLU·up with += has no caller
  }
}

// CMD_GEMV_STREAM: p[0] out, p[1] x, p[2] w, p[3] bias, p[4] norm weight; s[0] weight dtype,
// s[1] bias dtype, s[2] norm dtype, s[3] k, s[4] m, s[5] epilogue, s[6] slots a warp; f[0] eps.
static StreamArgs stream_args(const Cmd &cmd) {
  return {(float *)cmd.p[0], (const float *)cmd.p[1], cmd.p[2], cmd.p[3], cmd.p[4], cmd.s[1], cmd.s[2], cmd.s[3], cmd.s[4], cmd.s[6], cmd.f[0]};
}

int hg_launch_gemv_stream(HgCtx *c, const Cmd &cmd) {
  const StreamArgs a = stream_args(cmd);
  const bool norm = cmd.p[4] != nullptr;
  switch (cmd.s[0]) {
    case DT_BF16: return norm ? launch_stream_epi<DT_BF16, true>(c, cmd.s[5], a) : launch_stream_epi<DT_BF16, false>(c, cmd.s[5], a);
    case DT_F16: return norm ? launch_stream_epi<DT_F16, true>(c, cmd.s[5], a) : launch_stream_epi<DT_F16, false>(c, cmd.s[5], a);
    default: return (int)cudaErrorInvalidValue;
  }
}

template <int WT>
static int launch_chain(HgCtx *c, const ChainArgs &a, size_t smem) {
  static bool opted = false;
  if (!opted) {
    cudaError_t e = cudaFuncSetAttribute(gemv_chain_kernel<WT>, cudaFuncAttributeMaxDynamicSharedMemorySize, GS_MAX_SMEM);
    if (e != cudaSuccess) return (int)e;
    opted = true;
  }
  return hg_launch_pdl(c, true, gemv_chain_kernel<WT>, dim3((unsigned)c->numSMs), dim3(GS_THREADS), smem, a);
}

// cmds[0..3] as one chain launch when they are a layer's four stream GEMVs (GS_CHAIN_SPEC, one
// weight dtype, the longest x and a ring fit); -1 and nothing launched otherwise. index: the
// first command's place in its step, which picks its barrier counter.
int hg_launch_gemv_chain(HgCtx *c, const Cmd *cmds, int avail, int index) {
  if (!c->gemvChain || avail < GS_CHAIN) return -1;
  ChainArgs a = {};
  int spw = 1 << 30, kmax = 0;
  for (int p = 0; p < GS_CHAIN; p++) {
    const Cmd &m = cmds[p];
    if (m.kind != CMD_GEMV_STREAM || m.s[0] != cmds[0].s[0] || (m.p[4] ? 4 : 0) + m.s[5] != GS_CHAIN_SPEC[p]) return -1;
    a.ph[p] = stream_args(m);
    spw = min(spw, m.s[6]);
    kmax = max(kmax, m.s[3]);
  }
  while (spw > 1 && stream_smem(kmax, spw) > (size_t)GS_MAX_SMEM) spw--;
  if (stream_smem(kmax, spw) > (size_t)GS_MAX_SMEM) return -1;
  a.spw = spw;
  a.bar = (unsigned *)((char *)c->argmaxOut + GS_BAR_OFFSET) + index % GS_BARS;
  switch (cmds[0].s[0]) {
    case DT_BF16: return launch_chain<DT_BF16>(c, a, stream_smem(kmax, spw));
    case DT_F16: return launch_chain<DT_F16>(c, a, stream_smem(kmax, spw));
    default: return -1;
  }
}
