// Decode attention as one clustered launch a layer (the attnCluster switch, off by default;
// decode_attn.cu's hg_cu_attn_decode chooses it). Same inputs and outputs as the split-K kernels.
#include "decode_attn_block.cuh"
#include "rope.cuh"
#include <cooperative_groups.h>

// ---- the clustered form (the attnCluster switch): one launch a layer ------------------------
// A cluster of CS blocks per (KV head, head group); block `rank` takes the rank-th of CS equal
// chunks of the span. Its K and V rows arrive by bulk async copies (cp.async.bulk, one per tile
// and K/V, completing on an mbarrier) into DC_STAGES shared-memory stages, so every tile of a
// short span is in flight at once and a long span keeps DC_STAGES − 1 tiles (up to 96 KB) in
// flight an SM whatever the registers. A lane takes DC_NT token rows of a tile and rescales its
// softmax state once per tile, not per row. The blocks' partial states meet in distributed shared
// memory (one cluster barrier, no partials in global memory, no merge launch, no atomics).
// Folded in when core's step allows (hg_cu_attn_decode checks): the step's K/V append (the new
// rows, f32, go to slot start + count − 1; the block whose chunk holds that slot uses them from
// registers, so no block waits for the write) and, in a recorded step, the RoPE of q and of the
// new k row (rotated as the rope kernel would, rope.cuh, and written back in place).
namespace cg = cooperative_groups;
Cmd hg_new_cmd(int kind);                       // rowops.cu
int hg_put_dyn(HgCtx *c, Cmd &cmd, int count);  // rowops.cu

static const int DC_STAGES = 4;
static const int DC_NT = 4;                                // token rows a lane takes from a tile
static const int DC_HALF = 16384;                          // a stage: the K tile, then the V tile at +16 KB
static const int DC_SMEM = DC_STAGES * 2 * DC_HALF;        // 128 KB of dynamic shared memory: one block an SM
static const int DC_MAX_CLUSTER = 16;                      // blocks a cluster (non-portable above 8)

struct DcArgs {
  float *out;
  const float *q;
  const char *k, *v;  // caches [kvHeads, cap, headDim]
  int heads, group, headDim, cap, start, count;
  float sl;
  const int *dyn;  // recorded: the step's start, count
  // The K/V append folded in (kNew null: none): KV head g's new rows at kNew/vNew + g·headDim.
  const float *kNew, *vNew;
  // RoPE folded in (cosT null: none): q (heads) and kNew (kvHeads), pairs (j, j + half), at *pos.
  const float *cosT, *sinT;
  const int *pos;
  int half;
};

// 16 bytes of f32/f16/bf16 from EL floats, rounded as the K/V append rounds (st<> in common.cuh).
template <int KT> __device__ __forceinline__ uint4 dc_pack(const float *f);
template <> __device__ __forceinline__ uint4 dc_pack<DT_F32>(const float *f) {
  return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
}
template <> __device__ __forceinline__ uint4 dc_pack<DT_BF16>(const float *f) {
  unsigned u[4];
#pragma unroll
  for (int i = 0; i < 4; i++)
    u[i] = (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i])) | ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(f[2 * i + 1])) << 16);
  return make_uint4(u[0], u[1], u[2], u[3]);
}
template <> __device__ __forceinline__ uint4 dc_pack<DT_F16>(const float *f) {
  unsigned u[4];
#pragma unroll
  for (int i = 0; i < 4; i++) u[i] = (unsigned)__half_as_ushort(__float2half_rn(f[2 * i])) | ((unsigned)__half_as_ushort(__float2half_rn(f[2 * i + 1])) << 16);
  return make_uint4(u[0], u[1], u[2], u[3]);
}

__device__ __forceinline__ void dc_wait(unsigned bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "DC_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DC_DONE;\n"
      "bra DC_WAIT;\n"
      "DC_DONE:\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// grid (CS, kvHeads, head groups), clusters of CS blocks along x; 256 threads.
template <int KT, int LPT>
__global__ void __launch_bounds__(256, 1) decode_attn_cluster_kernel(const DcArgs a) {
  constexpr int ES = KT == DT_F32 ? 4 : 2, EL = Vec16<KT>::N, TPW = 32 / LPT, SLOTS = DA_WARPS * TPW, T = SLOTS * DC_NT;
  extern __shared__ __align__(128) char dcStage[];
  __shared__ __align__(8) unsigned long long full[DC_STAGES];
  __shared__ float bp[DA_HEADS * (256 + 2)];  // this block's state: per head [headDim + 2] (da_block_state)
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = (int)cluster.block_rank(), cs = (int)cluster.num_blocks();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, sub = lane / LPT, li = lane % LPT, d0 = li * EL;
  const int hd = a.headDim;
  const bool active = d0 < hd;
  int start = a.start, count = a.count;
  if (a.dyn) { start = a.dyn[0]; count = a.dyn[1]; }
  const int g = blockIdx.y, zg = blockIdx.z, h0 = g * a.group + zg * DA_HEADS, nh = min(DA_HEADS, a.group - zg * DA_HEADS);
  const size_t rowBytes = (size_t)hd * ES;
  const char *kb = a.k + ((size_t)g * a.cap + start) * rowBytes, *vb = a.v + ((size_t)g * a.cap + start) * rowBytes;
  const int chunk = (count + cs - 1) / cs, j0 = min(count, rank * chunk), j1 = min(count, j0 + chunk);
  const int ntiles = (j1 - j0 + T - 1) / T;
  const unsigned bar0 = smem_u32(full), st0 = smem_u32(dcStage);
  if (tid == 0) {
    for (int s = 0; s < DC_STAGES; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar0 + 8 * s) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  // Tile t (T token rows from j0 + t·T, fewer at the chunk's end) into stage t % DC_STAGES.
  auto issue = [&](int t) {
    const int s = t % DC_STAGES, tj = j0 + t * T, n = min(T, j1 - tj);
    const unsigned bytes = (unsigned)((size_t)n * rowBytes), bar = bar0 + 8 * s, dk = st0 + (unsigned)(s * 2 * DC_HALF);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(2 * bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dk), "l"(kb + (size_t)tj * rowBytes), "r"(bytes),
                 "r"(bar)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dk + DC_HALF), "l"(vb + (size_t)tj * rowBytes),
                 "r"(bytes), "r"(bar)
                 : "memory");
  };
  if (tid == 0)
    for (int t = 0; t < ntiles && t < DC_STAGES; t++) issue(t);
  // q (rotated here when the RoPE is folded in), pre-scaled as da_block does.
  const bool rope = a.cosT != nullptr;
  const float *cr = nullptr, *sr = nullptr;
  if (rope) {
    const int p = *a.pos;
    cr = a.cosT + (size_t)p * a.half;
    sr = a.sinT + (size_t)p * a.half;
  }
  float qr[DA_HEADS][EL];
#pragma unroll
  for (int h = 0; h < DA_HEADS; h++) {
    const float *qh = a.q + (size_t)(h0 + h) * hd;
#pragma unroll
    for (int e = 0; e < EL; e++) qr[h][e] = (h < nh && active) ? (rope ? hg_rope_elem(qh, d0 + e, a.half, cr, sr) : qh[d0 + e]) * a.sl : 0.f;
  }
  // The appended token (the span's last) from the new rows, rounded to the cache's dtype as the
  // append rounds them; its block writes it to the cache.
  const int jNew = count - 1;
  const bool hasNew = a.kNew != nullptr && jNew >= j0 && jNew < j1;
  uint4 kNewRaw = make_uint4(0, 0, 0, 0), vNewRaw = make_uint4(0, 0, 0, 0);
  if (hasNew && active) {
    const float *kr = a.kNew + (size_t)g * hd, *vr = a.vNew + (size_t)g * hd;
    float kf[EL], vf[EL];
#pragma unroll
    for (int e = 0; e < EL; e++) {
      kf[e] = rope ? hg_rope_elem(kr, d0 + e, a.half, cr, sr) : kr[d0 + e];
      vf[e] = vr[d0 + e];
    }
    kNewRaw = dc_pack<KT>(kf);
    vNewRaw = dc_pack<KT>(vf);
    if (zg == 0 && warp == 0 && sub == 0) {
      *reinterpret_cast<uint4 *>(const_cast<char *>(kb) + (size_t)jNew * rowBytes + (size_t)d0 * ES) = kNewRaw;
      *reinterpret_cast<uint4 *>(const_cast<char *>(vb) + (size_t)jNew * rowBytes + (size_t)d0 * ES) = vNewRaw;
    }
  }
  float m[DA_HEADS], l[DA_HEADS], acc[DA_HEADS][EL];
  da_state_init<EL>(m, l, acc);
  for (int t = 0; t < ntiles; t++) {
    const int s = t % DC_STAGES, tj = j0 + t * T;
    dc_wait(bar0 + 8 * s, (unsigned)(t / DC_STAGES) & 1u);
    const char *ks = dcStage + (size_t)s * 2 * DC_HALF, *vs = ks + DC_HALF;
    // This lane's piece of its row u of the tile (K or V stage; zero past the chunk), the
    // appended row from registers.
    auto piece = [&](const char *stage, int u, const uint4 &appended) {
      const int jj = warp * TPW + u * SLOTS + sub, j = tj + jj;
      if (hasNew && j == jNew) return appended;
      return active && j < j1 ? *reinterpret_cast<const uint4 *>(stage + (size_t)jj * rowBytes + (size_t)d0 * ES) : make_uint4(0, 0, 0, 0);
    };
    // Scores of this lane's DC_NT rows (−∞ past the chunk), then one rescale for all of them.
    float sc[DC_NT][DA_HEADS];
#pragma unroll
    for (int u = 0; u < DC_NT; u++) {
      const int j = tj + warp * TPW + u * SLOTS + sub;
      float kf[EL];
      Vec16<KT>::cvt(piece(ks, u, kNewRaw), kf);
#pragma unroll
      for (int h = 0; h < DA_HEADS; h++) {
        const float x = da_score<EL, LPT>(qr[h], kf);
        sc[u][h] = j < j1 ? x : -INFINITY;
      }
    }
    float scale[DA_HEADS];
#pragma unroll
    for (int h = 0; h < DA_HEADS; h++) {
      float mx = m[h];
#pragma unroll
      for (int u = 0; u < DC_NT; u++) mx = fmaxf(mx, sc[u][h]);
      if (mx == -INFINITY) {  // no row yet
        scale[h] = 1.f;
#pragma unroll
        for (int u = 0; u < DC_NT; u++) sc[u][h] = 0.f;
      } else {
        scale[h] = exp2f(m[h] - mx);
        float ps = 0.f;
#pragma unroll
        for (int u = 0; u < DC_NT; u++) {
          sc[u][h] = exp2f(sc[u][h] - mx);
          ps += sc[u][h];
        }
        l[h] = l[h] * scale[h] + ps;
        m[h] = mx;
      }
#pragma unroll
      for (int e = 0; e < EL; e++) acc[h][e] *= scale[h];
    }
#pragma unroll
    for (int u = 0; u < DC_NT; u++) {
      float vf[EL];
      Vec16<KT>::cvt(piece(vs, u, vNewRaw), vf);
#pragma unroll
      for (int h = 0; h < DA_HEADS; h++)
#pragma unroll
        for (int e = 0; e < EL; e++) acc[h][e] = fmaf(sc[u][h], vf[e], acc[h][e]);
    }
    __syncthreads();  // every warp is done with stage s
    if (tid == 0 && t + DC_STAGES < ntiles) {
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // those reads before the copy's writes
      issue(t + DC_STAGES);
    }
  }
  da_block_state<EL, LPT>(bp, m, l, acc, nh, hd);
  cluster.sync();  // every block's state is in its shared memory, and every block has read q and the new rows
  if (rope && rank == 0) {
    // The rotated rows back in place, as the rope kernel leaves them: q's heads of this group,
    // and (one cluster a KV head: hg_cu_attn_decode folds RoPE only then) the new k row.
    for (int i = tid; i < (nh + 1) * a.half; i += blockDim.x) {
      const int r = i / a.half, j = i % a.half;
      float *x = r < nh ? const_cast<float *>(a.q) + (size_t)(h0 + r) * hd : const_cast<float *>(a.kNew) + (size_t)g * hd;
      const float xa = x[j], xb = x[j + a.half];
      x[j] = hg_rope_lo(xa, xb, cr[j], sr[j]);
      x[j + a.half] = hg_rope_hi(xa, xb, cr[j], sr[j]);
    }
  }
  // out = Σ_rank e^(M_r − M) A_r / Σ_rank e^(M_r − M) L_r, the outputs spread over the cluster;
  // every rank's three values are loaded at once (one distributed-shared-memory round trip).
  for (int i = tid * cs + rank; i < nh * hd; i += cs * (int)blockDim.x) {
    const int h = i / hd, d = i % hd;
    float mr[DC_MAX_CLUSTER], lr[DC_MAX_CLUSTER], ar[DC_MAX_CLUSTER];
#pragma unroll
    for (int r = 0; r < DC_MAX_CLUSTER; r++) {
      if (r < cs) {
        float *st = bp + h * (hd + 2);
        mr[r] = *cluster.map_shared_rank(st + hd, r);
        lr[r] = *cluster.map_shared_rank(st + hd + 1, r);
        ar[r] = *cluster.map_shared_rank(st + d, r);
      }
    }
    float mx = -INFINITY;
#pragma unroll
    for (int r = 0; r < DC_MAX_CLUSTER; r++)
      if (r < cs) mx = fmaxf(mx, mr[r]);
    float den = 0.f, x = 0.f;
#pragma unroll
    for (int r = 0; r < DC_MAX_CLUSTER; r++) {
      if (r < cs && mr[r] != -INFINITY) {  // an empty chunk adds nothing
        const float w = exp2f(mr[r] - mx);
        den += lr[r] * w;
        x += ar[r] * w;
      }
    }
    a.out[(size_t)(h0 + h) * hd + d] = x / den;
  }
  cluster.sync();  // no block leaves while another reads its shared memory
}

// The clustered kernel's launch: 256 threads, its shared-memory stages, clusters of cs along x.
static void dc_config(cudaLaunchConfig_t &cfg, cudaLaunchAttribute (&at)[1], dim3 grid, int cs, cudaStream_t stream) {
  cfg = cudaLaunchConfig_t{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(256);
  cfg.dynamicSmemBytes = DC_SMEM;
  cfg.stream = stream;
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = (unsigned)cs;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
}

// Clusters of cs blocks fit (max active clusters, one block an SM) for kernel instance f, cached.
template <int KT, int LPT>
static int dc_active_clusters(int cs) {
  static int cached[2] = {-1, -1};  // cs 16, 8
  int &slot = cached[cs == 16 ? 0 : 1];
  if (slot >= 0) return slot;
  auto f = decode_attn_cluster_kernel<KT, LPT>;
  if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, DC_SMEM) != cudaSuccess ||
      cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
    cudaGetLastError();
    return slot = 0;
  }
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute at[1];
  dc_config(cfg, at, dim3((unsigned)cs, 1, 1), cs, 0);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, f, &cfg) != cudaSuccess) { cudaGetLastError(); n = 0; }
  return slot = n;
}

template <int KT, int LPT>
static int dc_pick(int clusters) {
  const int a16 = dc_active_clusters<KT, LPT>(16);
  if (a16 >= clusters) return 16;
  const int a8 = dc_active_clusters<KT, LPT>(8);
  if (a8 >= clusters || (a8 > 0 && a8 * 8 >= a16 * 16)) return 8;
  return a16 > 0 ? 16 : 0;
}

// Blocks per cluster for this dtype and lane count (16 when kvHeads·groups clusters of 16 fit the
// GPU at once, else 8), 0 when the clustered kernel cannot run (pre-sm_90, or no cluster fits).
int dc_cluster_size(int dt, int lpt, int clusters) {
  switch (dt * 64 + lpt) {
#define DC_CASE(KT, L) case KT * 64 + L: return dc_pick<KT, L>(clusters);
    DC_CASE(DT_F32, 4) DC_CASE(DT_F32, 8) DC_CASE(DT_F32, 16) DC_CASE(DT_F32, 32)
    DC_CASE(DT_F16, 4) DC_CASE(DT_F16, 8) DC_CASE(DT_F16, 16) DC_CASE(DT_F16, 32)
    DC_CASE(DT_BF16, 4) DC_CASE(DT_BF16, 8) DC_CASE(DT_BF16, 16) DC_CASE(DT_BF16, 32)
#undef DC_CASE
    default: return 0;
  }
}

template <int KT, int LPT>
static int launch_dc_k(HgCtx *c, int cs, dim3 grid, const DcArgs &a) {
  if (dc_active_clusters<KT, LPT>(cs) <= 0) return (int)cudaErrorInvalidConfiguration;  // also sets the kernel's attributes
  cudaLaunchConfig_t cfg;
  cudaLaunchAttribute at[1];
  dc_config(cfg, at, grid, cs, c->compute);
  const cudaError_t e = cudaLaunchKernelEx(&cfg, decode_attn_cluster_kernel<KT, LPT>, a);
  const cudaError_t last = cudaGetLastError();
  return (int)(e != cudaSuccess ? e : last);
}

// Command (s[10] == 2): s[5] blocks a cluster, s[6] lanes a token row, s[7] RoPE's half (0: not
// folded), s[8] the RoPE position's offset in the step's blob; p[4]/p[5] the new K/V rows (null:
// no append folded), p[6]/p[7] RoPE's cos/sin tables.
int launch_decode_attn_cluster(HgCtx *c, const Cmd &m, const char *dynBase) {
  DcArgs a;
  const int dt = m.s[0], kvHeads = m.s[2], cs = m.s[5], lpt = m.s[6];
  a.out = (float *)m.p[0];
  a.q = (const float *)m.p[1];
  a.k = (const char *)m.p[2];
  a.v = (const char *)m.p[3];
  a.heads = m.s[1]; a.headDim = m.s[3]; a.cap = m.s[4];
  a.group = a.heads / kvHeads;
  a.start = m.d[0]; a.count = m.d[1]; a.sl = m.f[0];
  a.dyn = dynBase ? (const int *)(dynBase + m.dynOff) : NULL;
  a.kNew = (const float *)m.p[4];
  a.vNew = (const float *)m.p[5];
  a.half = m.s[7];
  const bool rope = a.half > 0 && dynBase != NULL && m.s[8] >= 0;
  a.cosT = rope ? (const float *)m.p[6] : NULL;
  a.sinT = rope ? (const float *)m.p[7] : NULL;
  a.pos = rope ? (const int *)(dynBase + m.s[8]) : NULL;
  const dim3 grid((unsigned)cs, (unsigned)kvHeads, (unsigned)((a.group + DA_HEADS - 1) / DA_HEADS));
  switch (dt * 64 + lpt) {
#define DC_CASE(KT, L) case KT * 64 + L: return launch_dc_k<KT, L>(c, cs, grid, a);
    DC_CASE(DT_F32, 4) DC_CASE(DT_F32, 8) DC_CASE(DT_F32, 16) DC_CASE(DT_F32, 32)
    DC_CASE(DT_F16, 4) DC_CASE(DT_F16, 8) DC_CASE(DT_F16, 16) DC_CASE(DT_F16, 32)
    DC_CASE(DT_BF16, 4) DC_CASE(DT_BF16, 8) DC_CASE(DT_BF16, 16) DC_CASE(DT_BF16, 32)
#undef DC_CASE
    default: return (int)cudaErrorInvalidValue;
  }
}


// The queued copies are exactly this step's K/V append into these caches: 2·kvHeads f32 rows
// (K then V for each KV head, as core's KvCache.writeRows queues them), KV head g's from
// kNew/vNew + g·headDim, to slot start + count − 1, apart from out. Then *kNew/*vNew are set.
static bool dc_match_append(const HgCtx *c, int dt, int kvHeads, int headDim, int cap, const void *k, const void *v, int start, int count, const float *out,
                            int heads, const float **kNew, const float **vNew) {
  const CopyBatch &pb = c->pending;
  if (pb.n != 2 * kvHeads) return false;
  const size_t rowBytes = (size_t)headDim * (dt == DT_F32 ? 4 : 2), slot = (size_t)start + (size_t)count - 1;
  const char *k0 = pb.d[0].src, *v0 = pb.d[1].src;
  for (int g = 0; g < kvHeads; g++) {
    const CopyDesc &ck = pb.d[2 * g], &cv = pb.d[2 * g + 1];
    if (ck.sd != DT_F32 || cv.sd != DT_F32 || ck.dd != dt || cv.dd != dt || ck.bytes != rowBytes || cv.bytes != rowBytes) return false;
    if (ck.dst != (const char *)k + ((size_t)g * cap + slot) * rowBytes || cv.dst != (const char *)v + ((size_t)g * cap + slot) * rowBytes) return false;
    if (ck.src != k0 + (size_t)g * headDim * 4 || cv.src != v0 + (size_t)g * headDim * 4) return false;
  }
  const size_t rows = (size_t)kvHeads * headDim * 4, outBytes = (size_t)heads * headDim * 4;
  if (hg_overlaps(k0, rows, out, outBytes) || hg_overlaps(v0, rows, out, outBytes) || hg_overlaps(k0, rows, v0, rows)) return false;
  *kNew = (const float *)k0;
  *vNew = (const float *)v0;
  return true;
}

// Records (or runs) the clustered kernel, folding the queued K/V append and the recorded RoPE in
// when they are this step's; returns 0 or an error.
int decode_attn_cluster(HgCtx *c, int cs, float *out, const float *q, const void *k, const void *v, int dt, int heads, int kvHeads, int headDim, int cap,
                        int start, int count, float scale, int lpt) {
  const float *kNew = NULL, *vNew = NULL;
  const bool append = dc_match_append(c, dt, kvHeads, headDim, cap, k, v, start, count, out, heads, &kNew, &vNew);
  // RoPE: the last recorded command rotates this q row and the new k rows (one row, heads +
  // kvHeads heads, from q), its position in the blob; one cluster a KV head (the write-back).
  const Cmd *rope = NULL;
  if (append && hg_recording(c) && c->ncmds > 0 && heads / kvHeads <= DA_HEADS) {
    const Cmd &r = c->cmds[c->ncmds - 1];
    const char *pos = (const char *)r.p[1];
    if (r.kind == CMD_ROPE && r.p[0] == q && r.s[0] == 1 && r.s[2] == heads + kvHeads && r.s[3] == headDim && r.s[4] > 0 && 2 * r.s[4] <= headDim &&
        kNew == q + (size_t)heads * headDim && pos >= c->blobDev && pos + sizeof(int) <= c->blobDev + HG_BLOB_BYTES)
      rope = &r;
  }
  Cmd m = hg_new_cmd(CMD_DECODE_ATTN);
  m.p[0] = out; m.p[1] = q; m.p[2] = k; m.p[3] = v;
  m.s[0] = dt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = cap; m.s[5] = cs; m.s[6] = lpt; m.s[7] = 0; m.s[8] = -1; m.s[10] = 2;
  m.f[0] = scale * 1.4426950408889634f;
  m.d[0] = start; m.d[1] = count;
  if (append) {
    m.p[4] = kNew; m.p[5] = vNew;
    c->pending.n = 0;  // the kernel appends them
  } else {
    HG_FLUSH_REC(c);
  }
  // The step's start and count into the blob first: a full blob drains the step (the RoPE
  // command then runs as recorded, and this one eagerly without it).
  int r = hg_put_dyn(c, m, 2);
  if (r) return r;
  if (rope && hg_recording(c)) {
    m.p[6] = rope->p[2]; m.p[7] = rope->p[3];
    m.s[7] = rope->s[4];
    m.s[8] = (int)((const char *)rope->p[1] - c->blobDev);
    c->ncmds--;  // the kernel rotates q and k itself
    c->nRecorded--;
  }
  return hg_submit(c, m);
}
