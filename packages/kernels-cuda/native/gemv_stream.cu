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
// w, w + NW, ...; a row is read in chunks of CH elements, one slot each (with SiLU·up a slot holds
// the gate chunk and the up chunk, 4 KB each). Each warp owns SPW slots, used in turn, so a
// slot's phases are waited on in order by one warp only (no parity aliasing); the producer visits
// the warps round-robin, one chunk each.
//
// Switches, off by default until measured, from the eighth pass's per-block timeline
// (device/trace-bench.ts; DEVICE-NOTES.md, whose figures include ≈ 1 µs of that trace's own cost):
// - gemvXPass (GS_XPASS_ON): x was staged one dependent load a loop pass while the ring's copies
//   land on the same SM, so each trip is slow (2.3–5 µs a GEMV before the first dot product);
//   with it every load of a pass is issued before any is used, and the norm weights are staged
//   before the wait.
// - gemvSiluSplit (GS_SPLIT_ON): SiLU·up streamed at 3.7 TB/s with its two 4 KB copies a slot,
//   where 8 KB copies reach 4.45; with it each slot is one 8 KB copy of gate or up (a row's gate
//   chunks, then its up chunks).
// - gemvSlot16 (GS_SLOT16_ON): 16 KB slots, half the copies (and producer work) a byte.
// - gemvL2Ahead (StreamArgs.ahead, a run-time field): with each copy the producer prefetches into
//   L2 the chunk one ring ahead. A GEMV's first 16 copies took 3–4.7 µs to issue, as if the SM's
//   outstanding copies were capped; a prefetch returns nothing to the SM, so it may put more of the
//   stream in flight, and the copies then find their bytes in L2.
// Each gives the default's bits (the same elements summed in the same order).
#include "common.cuh"
#include "mbarrier.cuh"
#include "trace.cuh"

static const int GS_NW = 8, GS_THREADS = (GS_NW + 1) * 32;
static const int GS_MAX_SMEM = 227 * 1024;  // sm_90's largest dynamic shared memory a block
static const int GS_XPASS = 8;              // float4 loads of x in flight a thread
enum { GS_ACCUMULATE = 1, GS_SILU = 2 };
enum { GS_XPASS_ON = 1, GS_SPLIT_ON = 2, GS_SLOT16_ON = 4 };  // a command's s[7]: gemvXPass, gemvSiluSplit, gemvSlot16
// Bytes a slot holds: 8 KB, or 16 KB with gemvSlot16 (half the copies a byte; one slot a warp in a 128 KB ring).
__host__ __device__ constexpr int stream_slot_bytes(int v) { return v & GS_SLOT16_ON ? 16384 : 8192; }

struct StreamArgs {
  float *out;
  const float *x;
  const void *w, *bias, *nw;
  int bt, nt, k, m, spw;  // spw: slots a consumer warp owns
  float eps;
  int ahead;  // gemvL2Ahead: with each copy, prefetch into L2 the chunk this many of the warp's chunks later (0 none)
  int trace;  // HG_TRACE builds: the launch's (or chain phase's) number for its event records
};

// Barrier of the consumer warps alone (the producer warp does not take part).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(GS_NW * 32) : "memory"); }

// Shared memory: a header (the full and empty barriers of ns slots, the norm's per-warp sums, a
// chain's per-warp chunk counts), x (k floats), the norm weights (k floats, with a norm), the slots.
__host__ __device__ __forceinline__ size_t stream_header(int ns) { return ((size_t)2 * ns * 8 + 2 * GS_NW * 4 + 127) & ~(size_t)127; }
__host__ __device__ __forceinline__ size_t stream_vec(int k) { return ((size_t)k * 4 + 127) & ~(size_t)127; }
struct StreamSmem {
  uint64_t *full, *empty;
  float *red;
  int *tw;
  float *xs, *nws;
  unsigned char *ring;
  __device__ StreamSmem(unsigned char *smem, int ns, int kx, int knorm) {
    full = reinterpret_cast<uint64_t *>(smem);
    empty = full + ns;
    red = reinterpret_cast<float *>(empty + ns);
    tw = reinterpret_cast<int *>(red + GS_NW);
    xs = reinterpret_cast<float *>(smem + stream_header(ns));
    nws = reinterpret_cast<float *>(reinterpret_cast<unsigned char *>(xs) + stream_vec(kx));
    ring = reinterpret_cast<unsigned char *>(nws) + (knorm ? stream_vec(knorm) : 0);
  }
};

template <int WT>
struct StreamShape {
  static constexpr int ES = 2;  // bf16 / f16 only (f32 weights keep the one-warp kernel)
};

// Elements a chunk holds, copies a slot takes, and chunks a row takes: SiLU·up packs a gate chunk
// and an up chunk into each slot, or (SPLIT) takes a row's gate chunks, then its up chunks.
template <bool SILU, bool SPLIT, int SLOT>
struct StreamChunks {
  static constexpr bool PACKED = SILU && !SPLIT;
  static constexpr int CH = SLOT / 2 / (PACKED ? 2 : 1);
  static constexpr int COPIES = PACKED ? 2 : 1;
  __device__ static int per_row(int k) { return (k + CH - 1) / CH * (SILU && SPLIT ? 2 : 1); }
};

// This block's rows of an m-row GEMV: [r0, r0 + rows).
__device__ __forceinline__ void stream_block_rows(int m, int &r0, int &rows) {
  r0 = (int)((long)m * blockIdx.x / gridDim.x);
  rows = (int)((long)m * (blockIdx.x + 1) / gridDim.x) - r0;
}

// Where chunk cr of block row i starts in W, and its bytes (the gate half; a packed slot's up
// chunk lies m rows further on). With SPLIT, chunks nch.. of a row are its up chunks.
template <bool SILU, bool SPLIT, int CH>
__device__ __forceinline__ const char *stream_chunk_src(const StreamArgs &a, int r0, int i, int cr, int nch, unsigned &bytes) {
  const bool up = SILU && SPLIT && cr >= nch;
  const int c = up ? cr - nch : cr;
  bytes = (unsigned)(min(CH, a.k - c * CH) * 2);
  const size_t row = (size_t)(r0 + i) + (up ? a.m : 0);
  return static_cast<const char *>(a.w) + (row * a.k + (size_t)c * CH) * 2;
}

// The producer's share of one GEMV: every chunk of the block's rows, warp by warp round-robin.
// In a chain, tw[w] (shared memory, the producer's alone) counts the chunks already given to warp
// w in the phases before; a single GEMV has none, and its loop is the first kernel's, unchanged.
template <bool SILU, bool SPLIT, int SLOT, bool CHAINED>
__device__ __forceinline__ void stream_produce(const StreamArgs &a, int spw, const StreamSmem &sm) {
  using C = StreamChunks<SILU, SPLIT, SLOT>;
  constexpr int CH = C::CH;
  const size_t upOff = (size_t)a.m * a.k * 2;  // a packed slot's up chunk: m rows further on
  const int nch = (a.k + CH - 1) / CH, nrow = C::per_row(a.k);
  int r0, rows;
  stream_block_rows(a.m, r0, rows);
  const int perWarp = (rows + GS_NW - 1) / GS_NW * nrow;  // most chunks any warp takes
  HG_TR(a, 1);  // producer: the GEMV's first copy
  for (int t = 0; t < perWarp; t++) {
    if (t == 2) HG_TR(a, 2);  // the ring's first pass issued (two slots a warp)
    for (int cw = 0; cw < GS_NW; cw++) {
      const int i = cw + GS_NW * (t / nrow), cr = t % nrow;  // the warp's row (in the block) and chunk of the row
      if (i >= rows) continue;
      const int n = CHAINED ? sm.tw[cw] + t : t;
      const int s = cw * spw + n % spw, use = n / spw;
      if (use > 0) mbar_wait(&sm.empty[s], (use - 1) & 1);
      unsigned bytes;
      const char *src = stream_chunk_src<SILU, SPLIT, CH>(a, r0, i, cr, nch, bytes);
      mbar_expect_tx(&sm.full[s], bytes * C::COPIES);
      unsigned char *dst = sm.ring + (size_t)s * SLOT;
      bulk_copy(dst, src, bytes, &sm.full[s]);
      if (C::PACKED) bulk_copy(dst + CH * 2, src + upOff, bytes, &sm.full[s]);
      if (a.ahead) {  // gemvL2Ahead: the warp's chunk `ahead` later, into L2
        const int t2 = t + a.ahead, i2 = cw + GS_NW * (t2 / nrow);
        if (i2 < rows) {
          unsigned bytes2;
          const char *src2 = stream_chunk_src<SILU, SPLIT, CH>(a, r0, i2, t2 % nrow, nch, bytes2);
          bulk_prefetch_l2(src2, bytes2);
          if (C::PACKED) bulk_prefetch_l2(src2 + upOff, bytes2);
        }
      }
    }
  }
  HG_TR(a, 3);  // producer: the last copy issued
  if (CHAINED)
    for (int cw = 0; cw < GS_NW; cw++) sm.tw[cw] += (rows > cw ? (rows - cw + GS_NW - 1) / GS_NW : 0) * nrow;
}

// Before the wait (or a chain's barrier): the norm weights into shared memory as floats, since
// they depend on no kernel. Consumer warps only.
template <bool NORM, bool XPASS>
__device__ __forceinline__ void stream_stage_nw(const StreamArgs &a, const StreamSmem &sm) {
  if constexpr (NORM && XPASS)
    for (int i = threadIdx.x; i < a.k; i += GS_NW * 32) sm.nws[i] = load_any(a.nw, a.nt, i);
}

// The consumers' share of one GEMV: x (normalised: x·rsqrt(mean x² + eps)·nw) into shared memory,
// then the warp's rows, chunk by chunk as the slots land. t: this warp's chunk counter (its slot
// is warp·spw + t % spw, use t / spw), carried from phase to phase of a chain. L2: x and out (for
// +=) are read through L2 only, since in a chain other SMs wrote them after this SM's L1 may
// have seen the line.
template <int WT, bool NORM, int EPI, bool L2, int V>
__device__ __forceinline__ void stream_consume(const StreamArgs &a, int spw, const StreamSmem &sm, int &t) {
  constexpr bool SILU = (EPI & GS_SILU) != 0, XPASS = (V & GS_XPASS_ON) != 0, SPLIT = (V & GS_SPLIT_ON) != 0;
  constexpr int SLOT = stream_slot_bytes(V);
  using C = StreamChunks<SILU, SPLIT, SLOT>;
  constexpr int ES = StreamShape<WT>::ES, CH = C::CH;
  const int k = a.k, m = a.m, nch = (k + CH - 1) / CH, nrow = C::per_row(k);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int r0, rows;
  stream_block_rows(m, r0, rows);
  float *xs = sm.xs;
  if (threadIdx.x == 0) HG_TR(a, 4);  // consumers: x may be read (wait or barrier passed)
  {
    const int tid = threadIdx.x, nt = GS_NW * 32;
    float ss = 0.f;
    if ((((uintptr_t)a.x & 15) | (k & 3)) == 0) {
      const float4 *x4 = reinterpret_cast<const float4 *>(a.x);
      float4 *s4 = reinterpret_cast<float4 *>(xs);
      if constexpr (!XPASS) {
        for (int i = tid; i < k / 4; i += nt) {
          const float4 v = L2 ? __ldcg(x4 + i) : x4[i];
          s4[i] = v;
          if (NORM) ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
      } else {
        // GS_XPASS loads in flight a thread, all issued before any is used.
        for (int b = 0; b < k / 4; b += nt * GS_XPASS) {
          float4 v[GS_XPASS];
#pragma unroll
          for (int u = 0; u < GS_XPASS; u++) {
            const int i = b + u * nt + tid;
            v[u] = i < k / 4 ? (L2 ? __ldcg(x4 + i) : x4[i]) : make_float4(0.f, 0.f, 0.f, 0.f);
          }
#pragma unroll
          for (int u = 0; u < GS_XPASS; u++) {
            const int i = b + u * nt + tid;
            if (i < k / 4) s4[i] = v[u];
            if (NORM) ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
          }
        }
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
      if (lane == 0) sm.red[warp] = ss;
      consumers_sync();
      float tot = 0.f;
#pragma unroll
      for (int i = 0; i < GS_NW; i++) tot += sm.red[i];
      const float r = rsqrtf(tot / k + a.eps);
      if constexpr (!XPASS)
        for (int i = tid; i < k; i += nt) xs[i] *= r * load_any(a.nw, a.nt, i);
      else
        for (int i = tid; i < k; i += nt) xs[i] *= r * sm.nws[i];
    }
    consumers_sync();
  }
  if (threadIdx.x == 0) HG_TR(a, 5);  // x in shared memory (normalised)
  for (int i = warp; i < rows; i += GS_NW) {
    float a0 = 0.f, a1 = 0.f;
    for (int cr = 0; cr < nrow; cr++, t++) {
      const int s = warp * spw + t % spw;
      mbar_wait(&sm.full[s], (t / spw) & 1);
#ifdef HG_TRACE
      if (threadIdx.x == 0 && i == 0 && cr == 0) HG_TR(a, 6);  // warp 0's first slot landed
#endif
      const uint4 *w0 = reinterpret_cast<const uint4 *>(sm.ring + (size_t)s * SLOT);
      const bool up = SILU && SPLIT && cr >= nch;
      const int c = up ? cr - nch : cr;
      const float4 *x4 = reinterpret_cast<const float4 *>(xs + (size_t)c * CH);
      const int nv = min(CH, k - c * CH) / 8;
      if constexpr (C::PACKED) {
        const uint4 *w1 = w0 + CH * ES / 16;
#pragma unroll 4
        for (int v = lane; v < nv; v += 32) {
          float f0[8], f1[8];
          Vec16<WT>::cvt(w0[v], f0);
          Vec16<WT>::cvt(w1[v], f1);
          const float4 xa = x4[2 * v], xb = x4[2 * v + 1];
          a0 += f0[0] * xa.x + f0[1] * xa.y + f0[2] * xa.z + f0[3] * xa.w + f0[4] * xb.x + f0[5] * xb.y + f0[6] * xb.z + f0[7] * xb.w;
          a1 += f1[0] * xa.x + f1[1] * xa.y + f1[2] * xa.z + f1[3] * xa.w + f1[4] * xb.x + f1[5] * xb.y + f1[6] * xb.z + f1[7] * xb.w;
        }
      } else {
        float acc = up ? a1 : a0;  // SiLU·up: the gate chunks sum into a0, the up chunks into a1
#pragma unroll 4
        for (int v = lane; v < nv; v += 32) {
          float f0[8];
          Vec16<WT>::cvt(w0[v], f0);
          const float4 xa = x4[2 * v], xb = x4[2 * v + 1];
          acc += f0[0] * xa.x + f0[1] * xa.y + f0[2] * xa.z + f0[3] * xa.w + f0[4] * xb.x + f0[5] * xb.y + f0[6] * xb.z + f0[7] * xb.w;
        }
        if (up) a1 = acc; else a0 = acc;
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&sm.empty[s]);  // the slot may be refilled
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
#ifdef HG_TRACE
  if (lane == 0) HG_TR(a, 7 + warp);  // consumer warp `warp` done with the GEMV
#endif
}

// The barriers and slots of a block's ring: thread 0 initialises them, then the whole block syncs.
__device__ __forceinline__ void stream_init(uint64_t *full, uint64_t *empty, int ns) {
  if (threadIdx.x == 0) {
    for (int s = 0; s < ns; s++) { mbar_init(&full[s], 1); mbar_init(&empty[s], 1); }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
}

// V: the GS_XPASS_ON / GS_SPLIT_ON switches.
template <int WT, bool NORM, int EPI, int V>
__global__ void __launch_bounds__(GS_THREADS, 1) gemv_stream_kernel(StreamArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr bool XPASS = (V & GS_XPASS_ON) != 0, SPLIT = (V & GS_SPLIT_ON) != 0;
  const int spw = a.spw, ns = GS_NW * spw;
  const StreamSmem sm(smem, ns, a.k, NORM && XPASS ? a.k : 0);
  stream_init(sm.full, sm.empty, ns);
  if (threadIdx.x == 0) HG_TR(a, 0);  // the block is resident
  hg_pdl_trigger();  // the next kernel's blocks may queue now; they cannot share an SM with this one
  if (threadIdx.x >> 5 == GS_NW) {  // the producer: weights only, so it need not wait for the kernel before
    if ((threadIdx.x & 31) == 0) stream_produce<(EPI & GS_SILU) != 0, SPLIT, stream_slot_bytes(V), false>(a, spw, sm);
    hg_pdl_wait();  // every thread waits before it exits: completion stays transitive
    return;
  }
  stream_stage_nw<NORM, XPASS>(a, sm);  // constant: before the wait
  hg_pdl_wait();  // x (and out, for +=) come from the kernels before this one
  int t = 0;
  stream_consume<WT, NORM, EPI, false, V>(a, spw, sm, t);
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
  int spw, kmax, knorm;  // the longest x, the longest normalised x
};

// Every block's consumers have finished the phases before (their outputs are the next x).
// Called by the consumer warps only; thread 0 arrives and spins (release / acquire at gpu scope).
__device__ __forceinline__ void chain_barrier(unsigned *bar, unsigned target, const StreamArgs &ph) {
  consumers_sync();
  if (threadIdx.x == 0) {
    HG_TR(ph, 15);  // every consumer warp of the block is done with phase ph: arrive
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

template <int WT, int V>
__global__ void __launch_bounds__(GS_THREADS, 1) gemv_chain_kernel(ChainArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr bool XPASS = (V & GS_XPASS_ON) != 0, SPLIT = (V & GS_SPLIT_ON) != 0;
  const int spw = a.spw, ns = GS_NW * spw;
  const StreamSmem sm(smem, ns, a.kmax, XPASS ? a.knorm : 0);
  stream_init(sm.full, sm.empty, ns);
  if (threadIdx.x == 0) HG_TR(a.ph[0], 0);
  hg_pdl_trigger();
  if (threadIdx.x >> 5 == GS_NW) {
    if ((threadIdx.x & 31) == 0) {
      for (int w = 0; w < GS_NW; w++) sm.tw[w] = 0;
      constexpr int SLOT = stream_slot_bytes(V);
      stream_produce<false, false, SLOT, true>(a.ph[0], spw, sm);
      stream_produce<true, SPLIT, SLOT, true>(a.ph[1], spw, sm);
      stream_produce<false, false, SLOT, true>(a.ph[2], spw, sm);
      stream_produce<false, false, SLOT, true>(a.ph[3], spw, sm);
    }
    hg_pdl_wait();
    return;
  }
  hg_pdl_wait();
  const unsigned G = gridDim.x;
  int t = 0;
  constexpr int V1 = V & ~GS_SPLIT_ON;  // the phases without SiLU·up: no split to make
  stream_consume<WT, false, GS_ACCUMULATE, true, V1>(a.ph[0], spw, sm, t);
  stream_stage_nw<true, XPASS>(a.ph[1], sm);  // before the barrier: weights only (x is in its own array)
  chain_barrier(a.bar, G, a.ph[0]);
  stream_consume<WT, true, GS_SILU, true, V>(a.ph[1], spw, sm, t);
  chain_barrier(a.bar, 2 * G, a.ph[1]);
  stream_consume<WT, false, GS_ACCUMULATE, true, V1>(a.ph[2], spw, sm, t);
  stream_stage_nw<true, XPASS>(a.ph[3], sm);
  chain_barrier(a.bar, 3 * G, a.ph[2]);
  stream_consume<WT, true, 0, true, V1>(a.ph[3], spw, sm, t);
  consumers_sync();  // the last block out resets the counter for the next launch (stream-ordered)
  if (threadIdx.x == 0 && atomicAdd(a.bar, 1u) == 4 * G - 1) atomicExch(a.bar, 0u);
}

// Shared memory of a launch: the header, x, the norm weights (knorm > 0), the slots.
static size_t stream_smem(int k, int spw, int knorm, int v) {
  const int ns = GS_NW * spw;
  return stream_header(ns) + stream_vec(k) + (knorm > 0 ? stream_vec(knorm) : 0) + (size_t)ns * stream_slot_bytes(v);
}

// Slots a warp owns for a ring of ringKb (at least one; fewer where x, and the norm weights that
// gemvXPass stages (stagedNorm), leave less room), or 0 when they and one slot a warp do not fit.
int hg_gemv_stream_slots(int k, int ringKb, bool stagedNorm, int v) {
  const int knorm = stagedNorm ? k : 0;
  int spw = ringKb * 1024 / (GS_NW * stream_slot_bytes(v));
  if (spw < 1) spw = 1;
  while (spw > 1 && stream_smem(k, spw, knorm, v) > (size_t)GS_MAX_SMEM) spw--;
  return stream_smem(k, spw, knorm, v) <= (size_t)GS_MAX_SMEM ? spw : 0;
}

// Shared memory above 48 KB is opted into once per kernel instance (the caller's static flag).
template <typename Args>
static int stream_opt_in(void (*kernel)(Args), bool &opted) {
  if (opted) return 0;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, GS_MAX_SMEM);
  if (e == cudaSuccess) opted = true;
  return (int)e;
}

template <int WT, bool NORM, int EPI, int V>
static int launch_stream(HgCtx *c, const StreamArgs &a) {
  static bool opted = false;
  if (int e = stream_opt_in(gemv_stream_kernel<WT, NORM, EPI, V>, opted)) return e;
  const int knorm = NORM && (V & GS_XPASS_ON) ? a.k : 0;
  return hg_launch_pdl(c, true, gemv_stream_kernel<WT, NORM, EPI, V>, dim3((unsigned)c->numSMs), dim3(GS_THREADS), stream_smem(a.k, a.spw, knorm, V), a);
}

// v: the command's switch bits (the split only matters to SiLU·up).
template <int WT, bool NORM, int EPI, int SPLIT>
static int launch_stream_xs(HgCtx *c, int v, const StreamArgs &a) {
  switch (v & (GS_XPASS_ON | GS_SLOT16_ON)) {
    case 0: return launch_stream<WT, NORM, EPI, SPLIT>(c, a);
    case GS_XPASS_ON: return launch_stream<WT, NORM, EPI, SPLIT | GS_XPASS_ON>(c, a);
    case GS_SLOT16_ON: return launch_stream<WT, NORM, EPI, SPLIT | GS_SLOT16_ON>(c, a);
    default: return launch_stream<WT, NORM, EPI, SPLIT | GS_XPASS_ON | GS_SLOT16_ON>(c, a);
  }
}
template <int WT, bool NORM, int EPI>
static int launch_stream_v(HgCtx *c, int v, const StreamArgs &a) {
  if constexpr (EPI == GS_SILU)
    if (v & GS_SPLIT_ON) return launch_stream_xs<WT, NORM, EPI, GS_SPLIT_ON>(c, v, a);
  return launch_stream_xs<WT, NORM, EPI, 0>(c, v, a);
}

template <int WT, bool NORM>
static int launch_stream_epi(HgCtx *c, int epi, int v, const StreamArgs &a) {
  switch (epi) {
    case 0: return launch_stream_v<WT, NORM, 0>(c, v, a);
    case 1: return launch_stream_v<WT, NORM, 1>(c, v, a);
    case 2: return launch_stream_v<WT, NORM, 2>(c, v, a);
    default: return (int)cudaErrorInvalidValue;  // SiLU·up with += has no caller
  }
}

// CMD_GEMV_STREAM: p[0] out, p[1] x, p[2] w, p[3] bias, p[4] norm weight; s[0] weight dtype,
// s[1] bias dtype, s[2] norm dtype, s[3] k, s[4] m, s[5] epilogue, s[6] slots a warp, s[7] the
// GS_*_ON switches as recorded, s[8] the L2 prefetch's lead in chunks (0 none); f[0] eps.
static StreamArgs stream_args(const Cmd &cmd) {
  return {(float *)cmd.p[0], (const float *)cmd.p[1], cmd.p[2], cmd.p[3], cmd.p[4], cmd.s[1], cmd.s[2], cmd.s[3], cmd.s[4], cmd.s[6], cmd.f[0], cmd.s[8]};
}

#ifdef HG_TRACE
static int g_trace_seq;  // the next launch's number (host side; a captured graph keeps the ones it got)
#endif

int hg_launch_gemv_stream(HgCtx *c, const Cmd &cmd) {
  StreamArgs a = stream_args(cmd);
#ifdef HG_TRACE
  a.trace = g_trace_seq++;
#endif
  const bool norm = cmd.p[4] != nullptr;
  const int v = cmd.s[7];
  switch (cmd.s[0]) {
    case DT_BF16: return norm ? launch_stream_epi<DT_BF16, true>(c, cmd.s[5], v, a) : launch_stream_epi<DT_BF16, false>(c, cmd.s[5], v, a);
    case DT_F16: return norm ? launch_stream_epi<DT_F16, true>(c, cmd.s[5], v, a) : launch_stream_epi<DT_F16, false>(c, cmd.s[5], v, a);
    default: return (int)cudaErrorInvalidValue;
  }
}

template <int WT, int V>
static int launch_chain(HgCtx *c, const ChainArgs &a, size_t smem) {
  static bool opted = false;
  if (int e = stream_opt_in(gemv_chain_kernel<WT, V>, opted)) return e;
  return hg_launch_pdl(c, true, gemv_chain_kernel<WT, V>, dim3((unsigned)c->numSMs), dim3(GS_THREADS), smem, a);
}

template <int WT>
static int launch_chain_v(HgCtx *c, int v, const ChainArgs &a, size_t smem) {
  switch (v & 7) {
#define GS_CHAIN_CASE(V) \
  case V: return launch_chain<WT, V>(c, a, smem);
    GS_CHAIN_CASE(0) GS_CHAIN_CASE(1) GS_CHAIN_CASE(2) GS_CHAIN_CASE(3) GS_CHAIN_CASE(4) GS_CHAIN_CASE(5) GS_CHAIN_CASE(6) GS_CHAIN_CASE(7)
#undef GS_CHAIN_CASE
  }
  return -1;
}

// cmds[0..3] as one chain launch when they are a layer's four stream GEMVs (GS_CHAIN_SPEC, one
// weight dtype, the same switches, the longest x and a ring fit); -1 and nothing launched
// otherwise. index: the first command's place in its step, which picks its barrier counter.
int hg_launch_gemv_chain(HgCtx *c, const Cmd *cmds, int avail, int index) {
  if (!c->gemvChain || avail < GS_CHAIN) return -1;
  ChainArgs a = {};
  const int v = cmds[0].s[7];
  int spw = 1 << 30, kmax = 0, knorm = 0;
  for (int p = 0; p < GS_CHAIN; p++) {
    const Cmd &m = cmds[p];
    if (m.kind != CMD_GEMV_STREAM || m.s[0] != cmds[0].s[0] || m.s[7] != v || m.s[8] != cmds[0].s[8] || (m.p[4] ? 4 : 0) + m.s[5] != GS_CHAIN_SPEC[p]) return -1;
    a.ph[p] = stream_args(m);
#ifdef HG_TRACE
    a.ph[p].trace = g_trace_seq++;
#endif
    spw = min(spw, m.s[6]);
    kmax = max(kmax, m.s[3]);
    if (m.p[4] && (v & GS_XPASS_ON)) knorm = max(knorm, m.s[3]);
  }
  while (spw > 1 && stream_smem(kmax, spw, knorm, v) > (size_t)GS_MAX_SMEM) spw--;
  if (stream_smem(kmax, spw, knorm, v) > (size_t)GS_MAX_SMEM) return -1;
  a.spw = spw;
  a.kmax = kmax;
  a.knorm = knorm;
  a.bar = (unsigned *)((char *)c->argmaxOut + GS_BAR_OFFSET) + index % GS_BARS;
  const size_t smem = stream_smem(kmax, spw, knorm, v);
  switch (cmds[0].s[0]) {
    case DT_BF16: return launch_chain_v<DT_BF16>(c, v, a, smem);
    case DT_F16: return launch_chain_v<DT_F16>(c, v, a, smem);
    default: return -1;
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
