// The split-K decode-attention block on tensor cores (hg_decode_plan picks it): the same chunk and partial
// rows as da_block (decode_attn_block.cuh), so the merge is shared, but q·k and p·v are
// mma.m16n8k16 products with f32 accumulation. At 2K the FMA block is issue-bound (≈ 250
// warp-instructions a token row); here a warp's 16 tokens take 32 MMAs.
//
// Layout (PTX's m16n8k16 fragments; g = lane / 4, c = lane % 4):
// - S = Q·Kᵀ: A rows 0–7 are up to 8 query heads rounded to 16 bits (hi), rows 8–15 their
//   remainders (lo), so hi + lo carries q to ≈ 2⁻¹⁸ relative and a thread's accumulator rows g
//   and g + 8 add up to head g's score without a shuffle. B is Kᵀ straight from the cache rows
//   (K is exact in 16 bits). The sum over the head dim is taken in a permuted order so that the
//   loads coalesce: lane c's 16-byte piece i of its token is dims 32i + 8c … 32i + 8c + 7 (the 4
//   lanes of a token read 64 contiguous bytes), k-step s is dims 32⌊s/2⌋ + 8c + 4(s mod 2) + 0..3,
//   and Q's fragments follow the same order.
// - O = P·V: A is P, head g's probabilities split hi/lo into rows g and g + 8 — the registers the
//   score accumulator left them in (the FlashAttention-2 reuse). B is V (16 tokens × 8 dims): lane
//   g reads dims 64b + 8g … 64b + 8g + 7 of 4 token rows and pairs them with byte permutes, so
//   n-tile j, column n is dim 64⌊j/8⌋ + 8n + j mod 8; at the end lane c holds head g's dims
//   64b + 16c … 64b + 16c + 15.
#pragma once
#include "decode_attn_block.cuh"
#include "flash_mma.cuh"

static const int DM_WARPS = 4;  // 128 threads; a warp takes 16 tokens at a time
static const int DM_HEADS = 8;  // query heads a block serves (A rows 0–7; grid.z covers the rest)

template <typename T> __device__ __forceinline__ float2 dm_unpack(unsigned u);
template <> __device__ __forceinline__ float2 dm_unpack<__nv_bfloat16>(unsigned u) { return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u)); }
template <> __device__ __forceinline__ float2 dm_unpack<__half>(unsigned u) { return __half22float2(*reinterpret_cast<const __half2 *>(&u)); }

// (a, b) rounded to T (hi) and what rounding left (lo), both packed: a + b ≈ hi + lo to 2⁻¹⁸.
template <typename T> __device__ __forceinline__ void dm_split(float a, float b, unsigned &hi, unsigned &lo) {
  hi = Mma<T>::pack(a, b);
  const float2 h = dm_unpack<T>(hi);
  lo = Mma<T>::pack(a - h.x, b - h.y);
}

// A lane's K and V pieces of the 16-token tile at `base` (chunk end j1): K rows base + g and base +
// 8 + g (its QD dims), V rows base + 2c, 2c + 1, 2c + 8, 2c + 9 (its VD dims). Piece i of a lane is
// 64 bytes apart in K (4 lanes a row), 128 in V (8 lanes a row). Rows past the chunk read as zeros
// (no NaN into p·v).
template <int HD>
__device__ __forceinline__ void dm_load_tile(uint4 (&kr)[2][HD / 32], uint4 (&vr)[4][HD / 64], const char *kl, const char *vl, int base, int j1) {
  constexpr size_t ROW = (size_t)HD * 2;
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int t = 0; t < 2; t++) {
    const int j = base + 8 * t + g;
    const uint4 *p = reinterpret_cast<const uint4 *>(kl + (size_t)j * ROW);
#pragma unroll
    for (int i = 0; i < HD / 32; i++) kr[t][i] = j < j1 ? __ldg(p + 4 * i) : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int r = 0; r < 4; r++) {
    const int j = base + 2 * c + (r & 1) + 8 * (r >> 1);
    const uint4 *p = reinterpret_cast<const uint4 *>(vl + (size_t)j * ROW);
#pragma unroll
    for (int i = 0; i < HD / 64; i++) vr[r][i] = j < j1 ? __ldg(p + 8 * i) : make_uint4(0, 0, 0, 0);
  }
}

// One block's chunk [j0, j1) for heads h0 .. h0 + nh − 1 (nh ≤ DM_HEADS) of one KV head; the
// arguments as da_block's. TRIGGER: let the next kernel in once this warp's loads are done.
// AHEAD: a warp's first tile is loaded before q, and each next tile while the one
// before is computed (64 registers more: 2 blocks an SM instead of 3).
template <typename T, int HD, bool TRIGGER, bool AHEAD = false>
__device__ __forceinline__ void dm_block(float *dst, const float *qh, const char *kbase, const char *vbase, int nh, int j0, int j1, float sl) {
  constexpr int KS = HD / 16;  // k-steps of q·k
  constexpr int QD = HD / 4;   // dims a lane reads of a K row (and holds of the output)
  constexpr int VD = HD / 8;   // dims a lane reads of a V row; also the number of n-tiles
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const char *kl = kbase + (size_t)c * 16, *vl = vbase + (size_t)g * 16;
  uint4 kr[2][QD / 8], vr[4][VD / 8];
  if (AHEAD && j0 + warp * 16 < j1) dm_load_tile<HD>(kr, vr, kl, vl, j0 + warp * 16, j1);
  unsigned qa[KS][4];
  {
    const bool on = g < nh;
    const float *qp = qh + (size_t)g * HD + 8 * c;
#pragma unroll
    for (int s = 0; s < KS; s++) {
      const float4 x = on ? *reinterpret_cast<const float4 *>(qp + 32 * (s / 2) + 4 * (s % 2)) : make_float4(0.f, 0.f, 0.f, 0.f);
      dm_split<T>(x.x * sl, x.y * sl, qa[s][0], qa[s][1]);
      dm_split<T>(x.z * sl, x.w * sl, qa[s][2], qa[s][3]);
    }
  }
  float m = -INFINITY, l = 0.f;  // head g's running max (log2) and this lane's part of the sum
  float o[VD][4];
#pragma unroll
  for (int j = 0; j < VD; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  for (int base = j0 + warp * 16; base < j1; base += DM_WARPS * 16) {
    if (!AHEAD) dm_load_tile<HD>(kr, vr, kl, vl, base, j1);
    uint4 kn[2][QD / 8], vn[4][VD / 8];
    if (AHEAD && base + DM_WARPS * 16 < j1) dm_load_tile<HD>(kn, vn, kl, vl, base + DM_WARPS * 16, j1);
    // Scores: n-tile t is tokens base + 8t … base + 8t + 7; this lane gets tokens 2c, 2c + 1 of each.
    float sc[2][4];
#pragma unroll
    for (int t = 0; t < 2; t++) {
      sc[t][0] = sc[t][1] = sc[t][2] = sc[t][3] = 0.f;
      const unsigned *kw = reinterpret_cast<const unsigned *>(kr[t]);
#pragma unroll
      for (int s = 0; s < KS; s++) Mma<T>::run(sc[t], qa[s], kw[2 * s], kw[2 * s + 1]);
    }
    float p[2][2];
    float mx = m;
#pragma unroll
    for (int t = 0; t < 2; t++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const float s = sc[t][e] + sc[t][e + 2];
        p[t][e] = base + 8 * t + 2 * c + e < j1 ? s : -INFINITY;
        mx = fmaxf(mx, p[t][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));  // finite: token `base` is in the chunk
    const float cr = exp2_ftz(m - mx);
    m = mx;
    float ps = 0.f;
#pragma unroll
    for (int t = 0; t < 2; t++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        p[t][e] = exp2_ftz(p[t][e] - mx);
        ps += p[t][e];
      }
    l = l * cr + ps;
    if (__any_sync(0xffffffffu, cr != 1.f))
#pragma unroll
      for (int j = 0; j < VD; j++) { o[j][0] *= cr; o[j][1] *= cr; o[j][2] *= cr; o[j][3] *= cr; }
    unsigned pa[4];
    dm_split<T>(p[0][0], p[0][1], pa[0], pa[1]);
    dm_split<T>(p[1][0], p[1][1], pa[2], pa[3]);
    const unsigned *v0 = reinterpret_cast<const unsigned *>(vr[0]), *v1 = reinterpret_cast<const unsigned *>(vr[1]);
    const unsigned *v2 = reinterpret_cast<const unsigned *>(vr[2]), *v3 = reinterpret_cast<const unsigned *>(vr[3]);
#pragma unroll
    for (int j = 0; j < VD; j++) {
      const unsigned sel = (j & 1) ? 0x7632u : 0x5410u;  // the high or low 16-bit halves, token 2c's low
      Mma<T>::run(o[j], pa, __byte_perm(v0[j / 2], v1[j / 2], sel), __byte_perm(v2[j / 2], v3[j / 2], sel));
    }
    if (AHEAD) {
#pragma unroll
      for (int t = 0; t < 2; t++)
#pragma unroll
        for (int i = 0; i < QD / 8; i++) kr[t][i] = kn[t][i];
#pragma unroll
      for (int r = 0; r < 4; r++)
#pragma unroll
        for (int i = 0; i < VD / 8; i++) vr[r][i] = vn[r][i];
    }
  }
  if (TRIGGER) hg_pdl_trigger();  // this warp's loads are done
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  // The warps' states through shared memory, merged per head and dim into dst. Head rows of SM
  // floats and 4 floats of padding after every 32 dims: a quarter-warp's float4 stores (lanes g,
  // g + 1 × c) land on 8 distinct bank groups.
  constexpr int SM = HD == 64 ? 72 : 152;
  static_assert(HD == 64 || HD == 128, "head dims 64 and 128");
  __shared__ __align__(16) float smO[DM_WARPS][DM_HEADS][SM];
  __shared__ float smM[DM_WARPS][DM_HEADS], smL[DM_WARPS][DM_HEADS];
  if (g < nh) {
#pragma unroll
    for (int b = 0; b < VD / 8; b++)
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int j = 8 * b + 4 * (i & 1), hl = i >> 1;  // dims 64b + 16c + 4i …: columns 2c (i < 2) or 2c + 1
        const float4 w = make_float4(o[j][hl] + o[j][hl + 2], o[j + 1][hl] + o[j + 1][hl + 2], o[j + 2][hl] + o[j + 2][hl + 2], o[j + 3][hl] + o[j + 3][hl + 2]);
        const int d = 64 * b + 16 * c + 4 * i;
        *reinterpret_cast<float4 *>(&smO[warp][g][d + 4 * (d / 32)]) = w;
      }
    if (c == 0) { smM[warp][g] = m; smL[warp][g] = l; }
  }
  __syncthreads();
  for (int t = threadIdx.x; t < nh * HD; t += DM_WARPS * 32) {
    const int h = t / HD, d = t % HD;
    float mm = -INFINITY, ll = 0.f, a = 0.f;
#pragma unroll
    for (int w = 0; w < DM_WARPS; w++) da_merge<1>(mm, ll, &a, smM[w][h], smL[w][h], &smO[w][h][d + 4 * (d / 32)]);
    float *out = dst + (size_t)h * (HD + 2);
    out[d] = a;
    if (d == 0) { out[HD] = mm; out[HD + 1] = ll; }
  }
}

