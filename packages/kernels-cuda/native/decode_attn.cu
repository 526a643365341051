// Decode attention in two kernels (split-K "flash decoding"): one query row over the cached
// span [start, start + count) of K/V [kvHeads, cap, headDim]. The first kernel splits the span
// into chunks; a block scores its chunk for the query heads of one KV head and keeps an online
// softmax (running max, sum, unnormalised output) per head, so K and V are read once and no
// score row is written. The second kernel merges the chunks' partials into the output row.
// This replaces logits + softmax + memset + aggregate (4 launches a layer) and the score row's
// round trips; recorded in a decode-step graph, start and count come from the step's blob.
#include "common.cuh"

static const int DA_WARPS = 8;  // 256 threads a block
static const int DA_HEADS = 4;  // query heads a block serves (grid.z covers the rest of a group)
static const int DA_MIN_CHUNK = 64;

// Chunk length for `count` tokens over at most maxSplits chunks (both kernels agree on it).
__device__ __forceinline__ int da_chunk(int count, int maxSplits) {
  const int c = (count + maxSplits - 1) / maxSplits;
  return c > DA_MIN_CHUNK ? c : DA_MIN_CHUNK;
}


// Merges (m2, l2, a2) into (m, l, a): softmax states in log2 units.
template <int EL>
__device__ __forceinline__ void da_merge(float &m, float &l, float *a, float m2, float l2, const float *a2) {
  const float mx = fmaxf(m, m2);
  const float s1 = m == -INFINITY ? 0.f : exp2f(m - mx), s2 = m2 == -INFINITY ? 0.f : exp2f(m2 - mx);
  l = l * s1 + l2 * s2;
#pragma unroll
  for (int e = 0; e < EL; e++) a[e] = a[e] * s1 + a2[e] * s2;
  m = mx;
}

// grid (maxSplits, kvHeads, head groups of DA_HEADS). LPT lanes hold one token row (EL values
// each, 16-byte loads); a warp covers 32 / LPT tokens at a time, UNR (2 or 4) at once per lane
// for loads in flight. part: [split][head][headDim + 2] = unnormalised output, then max (log2), sum.
template <int KT, int LPT, int UNR>
__global__ void __launch_bounds__(256) decode_attn_kernel(float *part, const float *q, const void *k, const void *v, int heads, int group,
                                                          int headDim, int cap, int maxSplits, int start, int count, float sl, const int *dyn) {
  constexpr int ES = KT == DT_F32 ? 4 : 2, EL = Vec16<KT>::N, TPW = 32 / LPT, SLOTS = DA_WARPS * TPW;
  __shared__ float smA[DA_WARPS][DA_HEADS][256];
  __shared__ float smM[DA_WARPS][DA_HEADS], smL[DA_WARPS][DA_HEADS];
  hg_pdl_wait();  // programmatic launch (common.cuh): q and the K/V append come from the kernels before
  if (dyn) { start = dyn[0]; count = dyn[1]; }
  const int chunk = da_chunk(count, maxSplits);
  const int split = blockIdx.x;
  if (split * chunk >= count) return;  // the whole block, before any barrier
  const int g = blockIdx.y, h0 = g * group + blockIdx.z * DA_HEADS;
  const size_t rowBytes = (size_t)headDim * ES;
  const int nh = min(DA_HEADS, group - (int)blockIdx.z * DA_HEADS);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane / LPT, li = lane % LPT;
  const int d0 = li * EL;
  const bool active = d0 < headDim;
  float qr[DA_HEADS][EL];
#pragma unroll
  for (int h = 0; h < DA_HEADS; h++)
#pragma unroll
    for (int e = 0; e < EL; e++) qr[h][e] = (h < nh && active) ? q[(size_t)(h0 + h) * headDim + d0 + e] * sl : 0.f;
  float m[DA_HEADS], l[DA_HEADS], acc[DA_HEADS][EL];
#pragma unroll
  for (int h = 0; h < DA_HEADS; h++) {
    m[h] = -INFINITY; l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < EL; e++) acc[h][e] = 0.f;
  }
  const char *kb = (const char *)k + ((size_t)g * cap + start) * rowBytes + (size_t)d0 * ES;
  const char *vb = (const char *)v + ((size_t)g * cap + start) * rowBytes + (size_t)d0 * ES;
  const int j0 = split * chunk, j1 = min(count, j0 + chunk);
  // `base` depends only on the warp: every lane runs the same iterations (the shuffles below).
  for (int base = j0 + warp * TPW; base < j1; base += SLOTS * UNR) {
    uint4 kr[UNR], vr[UNR];
#pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int j = base + u * SLOTS + sub;
      const bool ok = active && j < j1;
      kr[u] = ok ? __ldg(reinterpret_cast<const uint4 *>(kb + (size_t)j * rowBytes)) : make_uint4(0, 0, 0, 0);
      vr[u] = ok ? __ldg(reinterpret_cast<const uint4 *>(vb + (size_t)j * rowBytes)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < UNR; u++) {
      const int j = base + u * SLOTS + sub;
      float kf[EL], vf[EL];
      Vec16<KT>::cvt(kr[u], kf);
      Vec16<KT>::cvt(vr[u], vf);
      float s[DA_HEADS];
#pragma unroll
      for (int h = 0; h < DA_HEADS; h++) {
        float t = 0.f;
#pragma unroll
        for (int e = 0; e < EL; e++) t += qr[h][e] * kf[e];
#pragma unroll
        for (int o = LPT / 2; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        s[h] = t;
      }
      if (j < j1) {
#pragma unroll
        for (int h = 0; h < DA_HEADS; h++) {
          const float mx = fmaxf(m[h], s[h]);
          const float cr = exp2f(m[h] - mx), p = exp2f(s[h] - mx);
          l[h] = l[h] * cr + p;
#pragma unroll
          for (int e = 0; e < EL; e++) acc[h][e] = acc[h][e] * cr + p * vf[e];
          m[h] = mx;
        }
      }
    }
  }
  hg_pdl_trigger();  // this warp's loads are done: the merge kernel may be scheduled
  // Merge the warp's token rows (lanes with the same li), then the warps through shared memory.
#pragma unroll
  for (int o = LPT; o < 32; o <<= 1) {
#pragma unroll
    for (int h = 0; h < DA_HEADS; h++) {
      float a2[EL];
#pragma unroll
      for (int e = 0; e < EL; e++) a2[e] = __shfl_xor_sync(0xffffffffu, acc[h][e], o);
      const float m2 = __shfl_xor_sync(0xffffffffu, m[h], o), l2 = __shfl_xor_sync(0xffffffffu, l[h], o);
      da_merge<EL>(m[h], l[h], acc[h], m2, l2, a2);
    }
  }
  if (sub == 0) {
#pragma unroll
    for (int h = 0; h < DA_HEADS; h++) {
      if (active)
#pragma unroll
        for (int e = 0; e < EL; e++) smA[warp][h][d0 + e] = acc[h][e];
      if (li == 0) { smM[warp][h] = m[h]; smL[warp][h] = l[h]; }
    }
  }
  __syncthreads();
  for (int t = threadIdx.x; t < nh * headDim; t += blockDim.x) {
    const int h = t / headDim, d = t % headDim;
    float mm = -INFINITY, ll = 0.f, a = 0.f;
    for (int w = 0; w < DA_WARPS; w++) da_merge<1>(mm, ll, &a, smM[w][h], smL[w][h], &smA[w][h][d]);
    float *dst = part + ((size_t)split * heads + h0 + h) * (headDim + 2);
    dst[d] = a;
    if (d == 0) { dst[headDim] = mm; dst[headDim + 1] = ll; }
  }
}

// grid (heads): out[h, :] = Σ_split e^(m_s − M) a_s / Σ_split e^(m_s − M) l_s.
__global__ void decode_attn_merge_kernel(float *out, const float *part, int heads, int headDim, int maxSplits, int count, const int *dyn) {
  hg_pdl_trigger();
  hg_pdl_wait();
  if (dyn) count = dyn[1];
  const int nsplit = (count + da_chunk(count, maxSplits) - 1) / da_chunk(count, maxSplits);
  const int h = blockIdx.x;
  const size_t stride = (size_t)heads * (headDim + 2);
  const float *p = part + (size_t)h * (headDim + 2);
  float mx = -INFINITY;
  for (int s = 0; s < nsplit; s++) mx = fmaxf(mx, p[s * stride + headDim]);
  float den = 0.f;
  for (int s = 0; s < nsplit; s++) den += p[s * stride + headDim + 1] * exp2f(p[s * stride + headDim] - mx);
  const float inv = 1.f / den;
  for (int d = threadIdx.x; d < headDim; d += blockDim.x) {
    float a = 0.f;
    for (int s = 0; s < nsplit; s++) a += p[s * stride + d] * exp2f(p[s * stride + headDim] - mx);
    out[(size_t)h * headDim + d] = a * inv;
  }
}

// Lanes per token row: EL-value pieces rounded up to a power of two (≤ 32); 0 unsupported.
static int da_lanes(int dt, int headDim) {
  const int el = dt == DT_F32 ? 4 : 8;
  if (headDim <= 0 || headDim % el != 0 || headDim > 256) return 0;
  int pieces = headDim / el, lpt = 4;
  while (lpt < pieces) lpt <<= 1;
  return lpt <= 32 ? lpt : 0;
}

template <int KT, int UNR>
static int launch_da_u(HgCtx *c, int lpt, dim3 grid, float *part, const float *q, const void *k, const void *v, int heads, int group, int headDim,
                       int cap, int maxSplits, int start, int count, float sl, const int *dyn) {
  switch (lpt) {
    case 4: return hg_launch(c, decode_attn_kernel<KT, 4, UNR>, grid, dim3(256), 0, part, q, k, v, heads, group, headDim, cap, maxSplits, start, count, sl, dyn);
    case 8: return hg_launch(c, decode_attn_kernel<KT, 8, UNR>, grid, dim3(256), 0, part, q, k, v, heads, group, headDim, cap, maxSplits, start, count, sl, dyn);
    case 16: return hg_launch(c, decode_attn_kernel<KT, 16, UNR>, grid, dim3(256), 0, part, q, k, v, heads, group, headDim, cap, maxSplits, start, count, sl, dyn);
    default: return hg_launch(c, decode_attn_kernel<KT, 32, UNR>, grid, dim3(256), 0, part, q, k, v, heads, group, headDim, cap, maxSplits, start, count, sl, dyn);
  }
}

// unr: token rows a lane loads per round (K and V each), 2 or 4 (the attnUnroll switch).
template <int KT>
static int launch_da(HgCtx *c, int lpt, int unr, dim3 grid, float *part, const float *q, const void *k, const void *v, int heads, int group,
                     int headDim, int cap, int maxSplits, int start, int count, float sl, const int *dyn) {
  if (unr == 4) return launch_da_u<KT, 4>(c, lpt, grid, part, q, k, v, heads, group, headDim, cap, maxSplits, start, count, sl, dyn);
  return launch_da_u<KT, 2>(c, lpt, grid, part, q, k, v, heads, group, headDim, cap, maxSplits, start, count, sl, dyn);
}

int hg_launch_decode_attn(HgCtx *c, const Cmd &m, const char *dynBase) {
  float *out = (float *)m.p[0];
  const float *q = (const float *)m.p[1];
  const int dt = m.s[0], heads = m.s[1], kvHeads = m.s[2], headDim = m.s[3], cap = m.s[4], maxSplits = m.s[5], lpt = m.s[6];
  const int group = heads / kvHeads;
  const int *dyn = dynBase ? (const int *)(dynBase + m.dynOff) : NULL;
  dim3 grid((unsigned)maxSplits, kvHeads, (group + DA_HEADS - 1) / DA_HEADS);
  int r = 0;
  HG_DISPATCH_DT(dt, K, r = launch_da<K>(c, lpt, m.s[7], grid, c->decodePart, q, m.p[2], m.p[3], heads, group, headDim, cap, maxSplits, m.d[0], m.d[1], m.f[0], dyn));
  if (r) return r;
  return hg_launch(c, decode_attn_merge_kernel, dim3(heads), dim3(headDim >= 128 ? 128 : 64), 0, out, (const float *)c->decodePart, heads, headDim, maxSplits,
                   m.d[1], dyn);
}

Cmd hg_new_cmd(int kind);
int hg_put_dyn(HgCtx *c, Cmd &cmd, int count);

extern "C" {

HG_EXPORT int hg_cu_attn_causal(HgCtx *c, float *out, const float *q, int rowStride, const void *k, const void *v, int dt, int heads, int kvHeads,
                                int headDim, int cap, int start, int firstPos, int n, float scale);

// 1 when hg_cu_attn_decode runs the split-K kernels for this dtype/head dim (else the flash kernel).
HG_EXPORT int hg_cu_attn_decode_path(int dt, int headDim) { return da_lanes(dt, headDim) ? 1 : 0; }

// One query row (position firstPos) over slots start .. start + firstPos of K/V [kvHeads, cap,
// headDim]; out/q: heads·headDim f32. Recordable in a decode step (start and length per step).
HG_EXPORT int hg_cu_attn_decode(HgCtx *c, float *out, const float *q, const void *k, const void *v, int dt, int heads, int kvHeads, int headDim,
                                int cap, int start, int firstPos, float scale) {
  const int lpt = da_lanes(dt, headDim);
  const int count = firstPos + 1;
  // Splits: enough blocks for ≈ 4 a SM at long spans, bounded by the partials' space; a recorded
  // step sizes the grid for the capacity (blocks past the span return at once).
  const int zGroups = (heads / kvHeads + DA_HEADS - 1) / DA_HEADS;
  const int bound = hg_recording(c) ? cap : count;
  long splits = (4L * c->numSMs + (long)kvHeads * zGroups - 1) / ((long)kvHeads * zGroups);
  const long byLength = (bound + DA_MIN_CHUNK - 1) / DA_MIN_CHUNK;
  const long bySpace = (long)(c->decodePartBytes / ((size_t)heads * (headDim + 2) * sizeof(float)));
  if (splits > byLength) splits = byLength;
  if (splits > bySpace) splits = bySpace;
  const bool aligned = (((uintptr_t)k | (uintptr_t)v) & 15) == 0;
  if (!lpt || !aligned || splits < 1) return hg_cu_attn_causal(c, out, q, heads * headDim, k, v, dt, heads, kvHeads, headDim, cap, start, firstPos, 1, scale);
  HG_FLUSH_REC(c);
  Cmd m = hg_new_cmd(CMD_DECODE_ATTN);
  m.p[0] = out; m.p[1] = q; m.p[2] = k; m.p[3] = v;
  m.s[0] = dt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = cap; m.s[5] = (int)splits; m.s[6] = lpt; m.s[7] = c->attnUnroll;
  m.f[0] = scale * 1.4426950408889634f;  // scores in log2 units: exp(x) = exp2(x·log2 e)
  m.d[0] = start; m.d[1] = count;
  int r = hg_put_dyn(c, m, 2);
  return r ? r : hg_submit(c, m);
}

}  // extern "C"
