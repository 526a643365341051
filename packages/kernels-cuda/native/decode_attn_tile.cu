// Split-K decode attention with a lane a token (attnTile switch): the first kernel of
// hg_launch_decode_attn for 2-byte K/V at head dim 64 or 128, writing the same per-split partials
// as decode_attn_block.cuh's da_block, so the same merge kernel follows.
//
// Why: da_block gives a token row to LPT lanes that hold a slice of q each, so every token pays
// shuffle reductions per head and an online-softmax rescale of the whole accumulator; Nsight
// Compute counted ≈ 250 warp-instructions a token row (8B, 2K: 9.9 µs at 18% of DRAM bandwidth,
// instruction-bound). Here a warp takes tiles of 32 tokens: lane j scores token j against the
// block's query heads (q broadcast from shared memory), the softmax rescales once a tile, and
// the p·V pass gives each lane HD/32 output dims; K and V tiles come through shared memory by
// cp.async. ≈ 50 warp-instructions a token row.
#include "decode_attn_block.cuh"

static const int DT_WARPS = 4, DT_TILE = 32;

__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
  const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

template <int KT>
__device__ __forceinline__ void dt_cvt4(const uint2 &r, float (&f)[4]) {
  if (KT == DT_BF16) {
    f[0] = __uint_as_float(r.x << 16); f[1] = __uint_as_float(r.x & 0xffff0000u);
    f[2] = __uint_as_float(r.y << 16); f[3] = __uint_as_float(r.y & 0xffff0000u);
  } else {
    const float2 a = __half22float2(*reinterpret_cast<const __half2 *>(&r.x)), b = __half22float2(*reinterpret_cast<const __half2 *>(&r.y));
    f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
  }
}

// grid (maxSplits, kvHeads, head groups of DA_HEADS), DT_WARPS·32 threads; arguments as
// decode_attn_kernel's. part: [split][head][HD + 2] = unnormalised output, max (log2), sum.
// Shared memory of a block: q, per warp its K and V tiles and p, the warps' states.
template <int HD>
struct TileSmem {
  float qs[DA_HEADS][HD];
  union {  // the warps' outputs take the V tiles' place once every warp is done with them
    unsigned char vs[DT_WARPS][DT_TILE * HD * 2];
    float smA[DT_WARPS][DA_HEADS][HD];
  };
  unsigned char ks[DT_WARPS][DT_TILE * HD * 2];
  float ps[DT_WARPS][DT_TILE][DA_HEADS];
  float smM[DT_WARPS][DA_HEADS], smL[DT_WARPS][DA_HEADS];
};

// One tile's rows [t0, t0 + n) of K or V (ROW bytes each) into a warp's buffer by cp.async, rows
// past n zero-filled; ROT: each row's 16-byte pieces rotated (piece c of row r at c ^ (r mod NCH)),
// so that lane r reading piece c of its K row is free of bank conflicts while q stays a broadcast.
template <int HD, bool ROT>
__device__ __forceinline__ void dt_load_tile(unsigned char *buf, const char *base, int t0, int n, int lane) {
  constexpr int NCH = HD / 8;
  constexpr size_t ROW = HD * 2;
#pragma unroll
  for (int i = 0; i < NCH; i++) {
    const int ci = i * 32 + lane, row = ci / NCH, piece = ci % NCH;
    const int at = ROT ? piece ^ (row % NCH) : piece;
    cp_async16(buf + (size_t)row * ROW + (size_t)at * 16, base + (size_t)(t0 + min(row, n - 1)) * ROW + piece * 16, row < n);
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most one of this thread's cp.async groups is still in flight, then for the warp.
__device__ __forceinline__ void dt_wait_all_but_one() {
  asm volatile("cp.async.wait_group 1;" ::: "memory");
  __syncwarp();
}

// grid (maxSplits, kvHeads, head groups of DA_HEADS), DT_WARPS·32 threads; arguments as
// decode_attn_kernel's. part: [split][head][HD + 2] = unnormalised output, max (log2), sum.
// Each warp pipelines its tiles: the next tile's K loads while this tile's p·V runs, the next
// tile's V while the next scores run (one cp.async group each, waited on in turn).
template <int KT, int HD>
__global__ void __launch_bounds__(DT_WARPS * 32) decode_attn_tile_kernel(float *part, const float *q, const void *k, const void *v, int heads, int group,
                                                                         int cap, int maxSplits, int start, int count, float sl, const int *dyn) {
  constexpr int NCH = HD / 8;   // 16-byte pieces of a K row
  constexpr int DPL = HD / 32;  // output dims a lane owns in the p·V pass (4 or 2)
  constexpr size_t ROW = HD * 2;
  extern __shared__ __align__(16) unsigned char dsm[];
  TileSmem<HD> &S = *reinterpret_cast<TileSmem<HD> *>(dsm);
  hg_pdl_wait();
  if (dyn) { start = dyn[0]; count = dyn[1]; }
  const int chunk = da_chunk(count, maxSplits);
  const int split = blockIdx.x;
  if (split * chunk >= count) return;  // the whole block, before any barrier
  const int g = blockIdx.y, h0 = g * group + blockIdx.z * DA_HEADS;
  const int nh = min(DA_HEADS, group - (int)blockIdx.z * DA_HEADS);
  const int j0 = split * chunk, j1 = min(count, j0 + chunk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const char *kb = (const char *)k + ((size_t)g * cap + start) * ROW;
  const char *vb = (const char *)v + ((size_t)g * cap + start) * ROW;
  unsigned char *kw = S.ks[warp], *vw = S.vs[warp];
  const int step = DT_WARPS * DT_TILE;
  int t0 = j0 + warp * DT_TILE;
  if (t0 < j1) {  // the first tile's loads go out before q is staged
    dt_load_tile<HD, true>(kw, kb, t0, min(DT_TILE, j1 - t0), lane);
    dt_load_tile<HD, false>(vw, vb, t0, min(DT_TILE, j1 - t0), lane);
  }
  for (int i = threadIdx.x; i < DA_HEADS * HD; i += blockDim.x) {
    const int h = i / HD;
    S.qs[h][i % HD] = h < nh ? q[(size_t)(h0 + h) * HD + i % HD] * sl : 0.f;
  }
  __syncthreads();
  float m[DA_HEADS], l[DA_HEADS], acc[DA_HEADS][DPL];  // m uniform over the warp; l a lane's share
#pragma unroll
  for (int h = 0; h < DA_HEADS; h++) {
    m[h] = -INFINITY; l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < DPL; e++) acc[h][e] = 0.f;
  }
  for (; t0 < j1; t0 += step) {
    const int n = min(DT_TILE, j1 - t0), tn = t0 + step, nn = min(DT_TILE, j1 - tn);  // this tile's and the next one's tokens
    const bool valid = lane < n;
    dt_wait_all_but_one();  // K of this tile (its V may still be on the way)
    float s[DA_HEADS];
#pragma unroll
    for (int h = 0; h < DA_HEADS; h++) s[h] = 0.f;
    const uint4 *krow = reinterpret_cast<const uint4 *>(kw + (size_t)lane * ROW);
#pragma unroll
    for (int c = 0; c < NCH; c++) {
      float kf[8];
      Vec16<KT>::cvt(krow[c ^ (lane % NCH)], kf);
#pragma unroll
      for (int h = 0; h < DA_HEADS; h++) {
        const float4 qa = *reinterpret_cast<const float4 *>(&S.qs[h][c * 8]), qb = *reinterpret_cast<const float4 *>(&S.qs[h][c * 8 + 4]);
        s[h] += kf[0] * qa.x + kf[1] * qa.y + kf[2] * qa.z + kf[3] * qa.w + kf[4] * qb.x + kf[5] * qb.y + kf[6] * qb.z + kf[7] * qb.w;
      }
    }
    __syncwarp();  // every lane is done with the K tile: the next one may land there
    if (nn > 0) dt_load_tile<HD, true>(kw, kb, tn, nn, lane);
    else asm volatile("cp.async.commit_group;" ::: "memory");  // an empty group keeps the count
    // Online softmax, once a tile: the tile's max per head, then p for this lane's token.
    float p[DA_HEADS];
#pragma unroll
    for (int h = 0; h < DA_HEADS; h++) {
      float mt = valid ? s[h] : -INFINITY;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
      const float mx = fmaxf(m[h], mt);
      const float cr = exp2f(m[h] - mx);  // m = −∞ on the first tile: 0
      p[h] = valid ? exp2f(s[h] - mx) : 0.f;
      l[h] = l[h] * cr + p[h];
#pragma unroll
      for (int e = 0; e < DPL; e++) acc[h][e] *= cr;
      m[h] = mx;
    }
    *reinterpret_cast<float4 *>(&S.ps[warp][lane][0]) = make_float4(p[0], p[1], p[2], p[3]);
    dt_wait_all_but_one();  // V of this tile (the next K may still be on the way)
    // p·V: lane owns dims [DPL·lane, DPL·lane + DPL) of every head.
#pragma unroll 4
    for (int jj = 0; jj < n; jj++) {
      float vf[4];
      if (DPL == 4) {
        dt_cvt4<KT>(*reinterpret_cast<const uint2 *>(vw + (size_t)jj * ROW + lane * 8), vf);
      } else {
        const unsigned r = *reinterpret_cast<const unsigned *>(vw + (size_t)jj * ROW + lane * 4);
        float t4[4];
        dt_cvt4<KT>(make_uint2(r, 0u), t4);
        vf[0] = t4[0]; vf[1] = t4[1];
      }
      const float4 pj = *reinterpret_cast<const float4 *>(&S.ps[warp][jj][0]);
      const float pp[4] = {pj.x, pj.y, pj.z, pj.w};
#pragma unroll
      for (int h = 0; h < DA_HEADS; h++)
#pragma unroll
        for (int e = 0; e < DPL; e++) acc[h][e] += pp[h] * vf[e];
    }
    __syncwarp();  // the V tile and p are rewritten next
    if (nn > 0) dt_load_tile<HD, false>(vw, vb, tn, nn, lane);
    else asm volatile("cp.async.commit_group;" ::: "memory");
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  // The warps' states into shared memory, then merged per head and output dim into the partial row.
  __syncthreads();  // smA overlays the V tiles
#pragma unroll
  for (int h = 0; h < DA_HEADS; h++) {
    const float lt = warp_sum(l[h]);
#pragma unroll
    for (int e = 0; e < DPL; e++) S.smA[warp][h][lane * DPL + e] = acc[h][e];
    if (lane == 0) { S.smM[warp][h] = m[h]; S.smL[warp][h] = lt; }
  }
  __syncthreads();
  float *dst = part + ((size_t)split * heads + h0) * (HD + 2);
  for (int t = threadIdx.x; t < nh * HD; t += blockDim.x) {
    const int h = t / HD, d = t % HD;
    float mm = -INFINITY, ll = 0.f, a = 0.f;
#pragma unroll
    for (int w = 0; w < DT_WARPS; w++) da_merge<1>(mm, ll, &a, S.smM[w][h], S.smL[w][h], &S.smA[w][h][d]);
    float *o = dst + (size_t)h * (HD + 2);
    o[d] = a;
    if (d == 0) { o[HD] = mm; o[HD + 1] = ll; }
  }
}

// Blocks of this kernel an SM holds (68 KB of shared memory each at d128): the host sizes the
// split count to one wave of them.
int dt_tile_blocks_per_sm(void) { return 3; }

// 1 when the tile kernel takes this dtype / head dim.
int dt_tile_supported(int dt, int headDim) { return (dt == DT_BF16 || dt == DT_F16) && (headDim == 64 || headDim == 128); }

template <int KT, int HD>
static int launch_tile(HgCtx *c, dim3 grid, const float *q, const void *k, const void *v, int heads, int group, int cap, int maxSplits, int start,
                       int count, float sl, const int *dyn) {
  static bool opted = false;  // shared memory above 48 KB is opted into once per kernel instance
  const size_t bytes = sizeof(TileSmem<HD>);
  if (!opted) {
    const cudaError_t e = cudaFuncSetAttribute(decode_attn_tile_kernel<KT, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) return (int)e;
    opted = true;
  }
  return hg_launch(c, decode_attn_tile_kernel<KT, HD>, grid, dim3(DT_WARPS * 32), bytes, c->decodePart, q, k, v, heads, group, cap, maxSplits, start,
                   count, sl, dyn);
}

// The first kernel of hg_launch_decode_attn in its tile form (same grid and partials).
int launch_decode_attn_tile(HgCtx *c, dim3 grid, int dt, const float *q, const void *k, const void *v, int heads, int group, int headDim, int cap,
                            int maxSplits, int start, int count, float sl, const int *dyn) {
#define DT_CASE(KT, HD) return launch_tile<KT, HD>(c, grid, q, k, v, heads, group, cap, maxSplits, start, count, sl, dyn)
  if (dt == DT_BF16) {
    if (headDim == 128) DT_CASE(DT_BF16, 128);
    if (headDim == 64) DT_CASE(DT_BF16, 64);
  } else if (dt == DT_F16) {
    if (headDim == 128) DT_CASE(DT_F16, 128);
    if (headDim == 64) DT_CASE(DT_F16, 64);
  }
#undef DT_CASE
  return (int)cudaErrorInvalidValue;
}
