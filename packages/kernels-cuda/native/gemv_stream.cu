// The decode GEMV as a weight stream (sm_90): one persistent block an SM, a producer thread that
// copies weight chunks into shared-memory slots with bulk async copies (cp.async.bulk, completion
// on an mbarrier), and consumer warps that take the slots' dot products against x held in shared
// memory. Why: the one-warp-a-row kernel keeps only its registers' loads in flight and pays a
// launch, a ramp and a tail at each of a layer's GEMVs. Here each SM has the whole ring in
// flight, and the kernel is launched programmatically: its producer starts the weight stream
// before the kernel before it has finished (weights never depend on it); only the consumers wait
// (griddepcontrol.wait) for x. The rmsNorm of x runs once a block, while the first slots fill.
//
// Phases: consecutive stream GEMVs of a recorded step (o_proj, gate/up, down, the next layer's
// qkv) run as ONE launch of up to GS_MAX_PHASES phases with a grid barrier between them, so the
// weight stream never stops at a kernel boundary: while the consumers wait at the barrier, the
// producer is already filling the ring with the next phase's weights. (One block an SM and no
// other work on the device between the phases, so all blocks are resident and the barrier
// cannot deadlock.)
//
// Work in a phase: block b takes rows [m·b/G, m·(b+1)/G); consumer warp w of NW takes the block's
// rows w, w + NW, ...; a row is read in chunks (one slot each; with SiLU·up a slot holds the gate
// chunk and the up chunk). Each warp owns `spw` slots, used in turn, so a slot's phases are
// waited on in order by one warp only (no mbarrier parity aliasing); the producer visits the
// warps round-robin, one chunk each.
#include "common.cuh"

static const int GS_NW = 8, GS_THREADS = (GS_NW + 1) * 32, GS_SLOT_BYTES = 8192, GS_MAX_PHASES = 4;
static const int GS_MAX_SMEM = 227 * 1024;  // sm_90's largest dynamic shared memory a block
enum { GS_ACCUMULATE = 1, GS_SILU = 2 };
// Grid-barrier counters: in the context's misc area; a merged launch uses the one of its first
// command's index in the step (zeroed when the switch turns on; the last block resets its own).
static const size_t GS_BAR_OFFSET = 512u << 10;
static const int GS_BARS = 8192;

struct StreamPhase {
  float *out;
  const float *x;
  const void *w, *bias, *nw;
  int bt, nt, k, m, epi;
  float eps;
};
struct StreamArgs {
  StreamPhase ph[GS_MAX_PHASES];
  int nph, spw;  // spw: slots a consumer warp owns
  unsigned *bar;
};

__device__ __forceinline__ unsigned smem_u32(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
// Waits until the barrier's phase of the given parity has completed.
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) {
  unsigned done = 0;
  while (!done) {
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
  }
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global to shared memory; the
// barrier's transaction count falls by `bytes` when they have landed.
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_u32(dst)), "l"(src), "r"(bytes),
               "r"(smem_u32(bar))
               : "memory");
#endif
}
// Barrier of the consumer warps alone (the producer warp does not take part).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(GS_NW * 32) : "memory"); }

// Every block's consumers have finished the phase before any block's consumers go on (their
// outputs are the next phase's x). Called by the consumer warps only.
__device__ __forceinline__ void grid_barrier(unsigned *bar, unsigned target) {
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

// Bytes before x in shared memory: the full and empty barriers of ns slots, the norm's sums.
__host__ __device__ __forceinline__ size_t stream_header(int ns) { return ((size_t)2 * ns * 8 + GS_NW * 4 + 127) & ~(size_t)127; }
// Elements of a row a slot holds (2-byte weights; SiLU·up: half a slot each for gate and up).
__host__ __device__ __forceinline__ int stream_chunk(bool silu) { return GS_SLOT_BYTES / 2 / (silu ? 2 : 1); }

// One slot's dot products (gate, and up with SiLU·up) against x; x chunk aligned with the slot.
template <int WT, bool SILU>
__device__ __forceinline__ void stream_dot(const unsigned char *slot, const float *xs, int nv, int lane, float &a0, float &a1) {
  const uint4 *w0 = reinterpret_cast<const uint4 *>(slot);
  const uint4 *w1 = w0 + stream_chunk(true) / 8;
  const float4 *x4 = reinterpret_cast<const float4 *>(xs);
#pragma unroll 4
  for (int v = lane; v < nv; v += 32) {
    float f0[8], f1[8];
    Vec16<WT>::cvt(w0[v], f0);
    if (SILU) Vec16<WT>::cvt(w1[v], f1);
    const float4 xa = x4[2 * v], xb = x4[2 * v + 1];
    a0 += f0[0] * xa.x + f0[1] * xa.y + f0[2] * xa.z + f0[3] * xa.w + f0[4] * xb.x + f0[5] * xb.y + f0[6] * xb.z + f0[7] * xb.w;
    if (SILU) a1 += f1[0] * xa.x + f1[1] * xa.y + f1[2] * xa.z + f1[3] * xa.w + f1[4] * xb.x + f1[5] * xb.y + f1[6] * xb.z + f1[7] * xb.w;
  }
}

template <int WT>
__global__ void __launch_bounds__(GS_THREADS, 1) gemv_stream_kernel(StreamArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int spw = a.spw, ns = GS_NW * spw, G = (int)gridDim.x;
  uint64_t *full = reinterpret_cast<uint64_t *>(smem), *empty = full + ns;
  float *red = reinterpret_cast<float *>(empty + ns);  // the norm's per-warp sums
  float *xs = reinterpret_cast<float *>(smem + stream_header(ns));
  int kmax = 0;
  for (int p = 0; p < a.nph; p++) kmax = max(kmax, a.ph[p].k);
  unsigned char *ring = reinterpret_cast<unsigned char *>(xs) + (((size_t)kmax * 4 + 127) & ~(size_t)127);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ns; s++) { mbar_init(&full[s], 1); mbar_init(&empty[s], 1); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  hg_pdl_trigger();  // the next kernel's blocks may queue now
  if (warp == GS_NW) {  // the producer: weights only, so it need not wait for the kernel before
    if (lane == 0) {
      int tw[GS_NW];  // chunks issued to each warp so far (its slot is cw·spw + tw % spw)
#pragma unroll
      for (int i = 0; i < GS_NW; i++) tw[i] = 0;
      for (int p = 0; p < a.nph; p++) {
        const StreamPhase &ph = a.ph[p];
        const bool silu = (ph.epi & GS_SILU) != 0;
        const int CH = stream_chunk(silu), k = ph.k, m = ph.m, nch = (k + CH - 1) / CH;
        const int r0 = (int)((long)m * blockIdx.x / G), rows = (int)((long)m * (blockIdx.x + 1) / G) - r0;
        const int perWarp = (rows + GS_NW - 1) / GS_NW * nch;
        const char *wb = static_cast<const char *>(ph.w);
        for (int t = 0; t < perWarp; t++) {
#pragma unroll
          for (int cw = 0; cw < GS_NW; cw++) {
            const int i = cw + GS_NW * (t / nch), c = t % nch;  // the warp's row (in the block) and chunk
            if (i >= rows) continue;
            const int s = cw * spw + tw[cw] % spw, use = tw[cw] / spw;
            tw[cw]++;
            if (use > 0) mbar_wait(&empty[s], (use - 1) & 1);
            const unsigned bytes = (unsigned)(min(CH, k - c * CH) * 2);
            mbar_expect_tx(&full[s], silu ? 2 * bytes : bytes);
            unsigned char *dst = ring + (size_t)s * GS_SLOT_BYTES;
            const size_t row = (size_t)(r0 + i);
            bulk_copy(dst, wb + (row * k + (size_t)c * CH) * 2, bytes, &full[s]);
            if (silu) bulk_copy(dst + GS_SLOT_BYTES / 2, wb + ((row + m) * k + (size_t)c * CH) * 2, bytes, &full[s]);
          }
        }
      }
    }
    hg_pdl_wait();  // every thread waits before it exits: completion stays transitive
    return;
  }
  hg_pdl_wait();  // x (and out, for +=) come from the kernels before this one
  int t = 0;      // this warp's chunk counter (its slot is warp·spw + t % spw, use t / spw)
  for (int p = 0; p < a.nph; p++) {
    const StreamPhase &ph = a.ph[p];
    if (p > 0) grid_barrier(a.bar, (unsigned)(p * G));
    const bool silu = (ph.epi & GS_SILU) != 0;
    const int CH = stream_chunk(silu), k = ph.k, m = ph.m, nch = (k + CH - 1) / CH;
    const int r0 = (int)((long)m * blockIdx.x / G), rows = (int)((long)m * (blockIdx.x + 1) / G) - r0;
    // x (normalised: x·rsqrt(mean x² + eps)·nw) into shared memory. L2 loads (__ldcg): x may have
    // been written by other SMs in the phase before, after this SM's L1 saw the line.
    {
      const int tid = threadIdx.x, nt = GS_NW * 32;
      float ss = 0.f;
      if ((((uintptr_t)ph.x & 15) | (k & 3)) == 0) {
        const float4 *x4 = reinterpret_cast<const float4 *>(ph.x);
        float4 *s4 = reinterpret_cast<float4 *>(xs);
        for (int i = tid; i < k / 4; i += nt) {
          const float4 v = __ldcg(x4 + i);
          s4[i] = v;
          ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
      } else {
        for (int i = tid; i < k; i += nt) {
          const float v = __ldcg(ph.x + i);
          xs[i] = v;
          ss += v * v;
        }
      }
      if (ph.nw) {
        ss = warp_sum(ss);
        if (lane == 0) red[warp] = ss;
        consumers_sync();
        float tot = 0.f;
#pragma unroll
        for (int i = 0; i < GS_NW; i++) tot += red[i];
        const float r = rsqrtf(tot / k + ph.eps);
        for (int i = tid; i < k; i += nt) xs[i] *= r * load_any(ph.nw, ph.nt, i);
      }
      consumers_sync();
    }
    for (int i = warp; i < rows; i += GS_NW) {
      float a0 = 0.f, a1 = 0.f;
      for (int c = 0; c < nch; c++, t++) {
        const int s = warp * spw + t % spw;
        mbar_wait(&full[s], (t / spw) & 1);
        const unsigned char *slot = ring + (size_t)s * GS_SLOT_BYTES;
        const int nv = min(CH, k - c * CH) / 8;
        if (silu) stream_dot<WT, true>(slot, xs + (size_t)c * CH, nv, lane, a0, a1);
        else stream_dot<WT, false>(slot, xs + (size_t)c * CH, nv, lane, a0, a1);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);  // the slot may be refilled
      }
      a0 = warp_sum(a0);
      if (silu) a1 = warp_sum(a1);
      if (lane == 0) {
        const int r = r0 + i;
        const float y0 = a0 + (ph.bias ? load_any(ph.bias, ph.bt, r) : 0.f);
        float v = y0;
        if (silu) {
          const float y1 = a1 + (ph.bias ? load_any(ph.bias, ph.bt, r + m) : 0.f);
          v = y0 / (1.f + expf(-y0)) * y1;
        }
        if (ph.epi & GS_ACCUMULATE) v += __ldcg(ph.out + r);
        __stcg(ph.out + r, v);
      }
    }
  }
  if (a.nph > 1) {  // the last block out resets the counter for the next launch (stream-ordered)
    consumers_sync();
    if (threadIdx.x == 0 && atomicAdd(a.bar, 1u) == (unsigned)(a.nph * G - 1)) atomicExch(a.bar, 0u);
  }
}

// Shared memory of a launch: the barriers, x of the longest row, the slots.
static size_t stream_smem(int kmax, int spw) {
  const int ns = GS_NW * spw;
  return stream_header(ns) + (((size_t)kmax * 4 + 127) & ~(size_t)127) + (size_t)ns * GS_SLOT_BYTES;
}

// Slots a warp owns for a ring of at most ringKb (at least one; fewer where x leaves less room),
// or 0 when x and one slot a warp do not fit.
int hg_gemv_stream_slots(int k, int ringKb) {
  int spw = ringKb * 1024 / (GS_NW * GS_SLOT_BYTES);
  if (spw < 1) spw = 1;
  while (spw > 1 && stream_smem(k, spw) > (size_t)GS_MAX_SMEM) spw--;
  return stream_smem(k, spw) <= (size_t)GS_MAX_SMEM ? spw : 0;
}

// Zeroes the grid-barrier counters (when the switch turns on; stream-ordered).
int hg_gemv_stream_reset(HgCtx *c) {
  return (int)cudaMemsetAsync((char *)c->argmaxOut + GS_BAR_OFFSET, 0, GS_BARS * sizeof(unsigned), c->compute);
}

template <int WT>
static int launch_stream(HgCtx *c, const StreamArgs &a, size_t smem) {
  static bool opted = false;  // shared memory above 48 KB is opted into once per kernel instance
  if (!opted) {
    cudaError_t e = cudaFuncSetAttribute(gemv_stream_kernel<WT>, cudaFuncAttributeMaxDynamicSharedMemorySize, GS_MAX_SMEM);
    if (e != cudaSuccess) return (int)e;
    opted = true;
  }
  return hg_launch_pdl(c, true, gemv_stream_kernel<WT>, dim3((unsigned)c->numSMs), dim3(GS_THREADS), smem, a);
}

static StreamPhase stream_phase(const Cmd &cmd) {
  return {(float *)cmd.p[0], (const float *)cmd.p[1], cmd.p[2], cmd.p[3], cmd.p[4], cmd.s[1], cmd.s[2], cmd.s[3], cmd.s[4], cmd.s[5], cmd.f[0]};
}

// CMD_GEMV_STREAM: p[0] out, p[1] x, p[2] w, p[3] bias, p[4] norm weight (null: none); s[0]
// weight dtype, s[1] bias dtype, s[2] norm dtype, s[3] k, s[4] m, s[5] epilogue (0 y, 1 +=,
// 2 SiLU·up), s[6] slots a warp; f[0] eps. Launches cmds[0] together with the stream commands
// that follow it (up to GS_MAX_PHASES, same weight dtype, x and the ring still fitting) as the
// phases of one launch; *used: how many it took. `index`: the first command's place in its step
// (its grid-barrier counter).
int hg_launch_gemv_stream(HgCtx *c, const Cmd *cmds, int avail, int index, int *used) {
  StreamArgs a = {};
  int spw = cmds[0].s[6], kmax = cmds[0].s[3], n = 1;
  a.ph[0] = stream_phase(cmds[0]);
  while (n < avail && n < GS_MAX_PHASES && n < c->gemvStreamPhases && cmds[n].kind == CMD_GEMV_STREAM && cmds[n].s[0] == cmds[0].s[0]) {
    const int k2 = max(kmax, cmds[n].s[3]);
    int s2 = min(spw, cmds[n].s[6]);
    while (s2 > 1 && stream_smem(k2, s2) > (size_t)GS_MAX_SMEM) s2--;
    if (stream_smem(k2, s2) > (size_t)GS_MAX_SMEM) break;
    a.ph[n] = stream_phase(cmds[n]);
    spw = s2;
    kmax = k2;
    n++;
  }
  a.nph = n;
  a.spw = spw;
  a.bar = (unsigned *)((char *)c->argmaxOut + GS_BAR_OFFSET) + (index % GS_BARS);
  *used = n;
  const size_t smem = stream_smem(kmax, spw);
  switch (cmds[0].s[0]) {
    case DT_BF16: return launch_stream<DT_BF16>(c, a, smem);
    case DT_F16: return launch_stream<DT_F16>(c, a, smem);
    default: return (int)cudaErrorInvalidValue;
  }
}
