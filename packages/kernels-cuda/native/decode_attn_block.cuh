// The split-K decode-attention block shared by decode_attn.cu (one row) and batch_attn.cu (B
// rows): one block scores a chunk of cached tokens for up to DA_HEADS query heads of one KV head
// with an online softmax (log2 units), K and V read once, and stores the chunk's partial state
// per head; plus the merge of the chunks' partials. One copy, so both paths get every change.
#pragma once
#include "common.cuh"

static const int DA_WARPS = 8;  // 256 threads a block
static const int DA_HEADS = 4;  // query heads a block serves (grid.z covers the rest of a group)
static const int DA_MIN_CHUNK = 64;

// Chunk length for `count` tokens over at most maxSplits chunks of at least DA_MIN_CHUNK tokens
// (the split kernel and the merge agree on it).
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

// q·k of one head over a token row held by LPT lanes (EL values each), summed across them: every
// lane of the row gets the same bits.
template <int EL, int LPT>
__device__ __forceinline__ float da_score(const float (&q)[EL], const float (&k)[EL]) {
  float t = 0.f;
#pragma unroll
  for (int e = 0; e < EL; e++) t += q[e] * k[e];
#pragma unroll
  for (int o = LPT / 2; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  return t;
}

// The end of a block's chunk: each lane's softmax state merged over the warp's token rows (lanes
// with the same li), then over the warps through shared memory, into dst: per head h, at
// dst + h·(headDim + 2), the unnormalised output, then max (log2), sum. dst: the split's partial
// row in global memory (da_block).
template <int EL, int LPT>
__device__ __forceinline__ void da_block_state(float *dst, float (&m)[DA_HEADS], float (&l)[DA_HEADS], float (&acc)[DA_HEADS][EL], int nh, int headDim) {
  __shared__ float smA[DA_WARPS][DA_HEADS][256];
  __shared__ float smM[DA_WARPS][DA_HEADS], smL[DA_WARPS][DA_HEADS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane / LPT, li = lane % LPT, d0 = li * EL;
  const bool active = d0 < headDim;
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
    float *o = dst + (size_t)h * (headDim + 2);
    o[d] = a;
    if (d == 0) { o[headDim] = mm; o[headDim + 1] = ll; }
  }
}

// An empty online-softmax state per head: running max, sum, unnormalised output.
template <int EL>
__device__ __forceinline__ void da_state_init(float (&m)[DA_HEADS], float (&l)[DA_HEADS], float (&acc)[DA_HEADS][EL]) {
#pragma unroll
  for (int h = 0; h < DA_HEADS; h++) {
    m[h] = -INFINITY; l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < EL; e++) acc[h][e] = 0.f;
  }
}

// One block's chunk [j0, j1) for heads h0 .. h0 + nh − 1 of KV head g. qh: the first of those
// heads' query rows; kb/vb: the cache rows of slot `start` of KV head g (byte pointers);
// dst: the first head's partial row ([headDim + 2]: unnormalised output, max (log2), sum; the
// next head's row follows). LPT lanes hold one token row (EL values each, 16-byte loads); a warp
// covers 32 / LPT tokens at a time, UNR at once per lane for loads in flight. TRIGGER: let the
// next kernel in (programmatic launch, common.cuh) once the loads are done.
// GROUP: a lane's UNR token rows of a round are scored first and folded into
// the online softmax together — one max, one rescale of the accumulator and one exp for it per
// round instead of per row, and exps by exp2_ftz — about a fifth fewer instructions a token row.
template <int KT, int LPT, int UNR, bool TRIGGER, bool GROUP = false>
__device__ __forceinline__ void da_block(float *dst, const float *qh, const char *kbase, const char *vbase, int nh, int headDim, int j0, int j1, float sl) {
  constexpr int ES = KT == DT_F32 ? 4 : 2, EL = Vec16<KT>::N, TPW = 32 / LPT, SLOTS = DA_WARPS * TPW;
  const size_t rowBytes = (size_t)headDim * ES;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane / LPT, li = lane % LPT;
  const int d0 = li * EL;
  const bool active = d0 < headDim;
  float qr[DA_HEADS][EL];
#pragma unroll
  for (int h = 0; h < DA_HEADS; h++)
#pragma unroll
    for (int e = 0; e < EL; e++) qr[h][e] = (h < nh && active) ? qh[(size_t)h * headDim + d0 + e] * sl : 0.f;
  float m[DA_HEADS], l[DA_HEADS], acc[DA_HEADS][EL];
  da_state_init<EL>(m, l, acc);
  // One token row (K and V pieces of this lane) into the online softmax; j ≥ j1: scores only.
  auto token = [&](const uint4 &kraw, const uint4 &vraw, int j) {
    float kf[EL], vf[EL];
    Vec16<KT>::cvt(kraw, kf);
    Vec16<KT>::cvt(vraw, vf);
    float s[DA_HEADS];
#pragma unroll
    for (int h = 0; h < DA_HEADS; h++) s[h] = da_score<EL, LPT>(qr[h], kf);
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
  };
  const char *kb = kbase + (size_t)d0 * ES;
  const char *vb = vbase + (size_t)d0 * ES;
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
    if (GROUP) {
      float sc[UNR][DA_HEADS];
#pragma unroll
      for (int u = 0; u < UNR; u++) {
        float kf[EL];
        Vec16<KT>::cvt(kr[u], kf);
        const bool in = base + u * SLOTS + sub < j1;
#pragma unroll
        for (int h = 0; h < DA_HEADS; h++) {
          const float x = da_score<EL, LPT>(qr[h], kf);
          sc[u][h] = in ? x : -INFINITY;
        }
      }
#pragma unroll
      for (int h = 0; h < DA_HEADS; h++) {
        float mx = m[h];
#pragma unroll
        for (int u = 0; u < UNR; u++) mx = fmaxf(mx, sc[u][h]);
        if (mx == -INFINITY) {  // no row of this lane yet: the state stays empty, and p·V
          for (int u = 0; u < UNR; u++) sc[u][h] = 0.f;  // below must see p = 0, not −∞ (−∞·0 = NaN)
          continue;
        }
        const float cr = exp2_ftz(m[h] - mx);
        float ps = 0.f;
#pragma unroll
        for (int u = 0; u < UNR; u++) {
          sc[u][h] = exp2_ftz(sc[u][h] - mx);
          ps += sc[u][h];
        }
        l[h] = l[h] * cr + ps;
#pragma unroll
        for (int e = 0; e < EL; e++) acc[h][e] *= cr;
        m[h] = mx;
      }
#pragma unroll
      for (int u = 0; u < UNR; u++) {
        float vf[EL];
        Vec16<KT>::cvt(vr[u], vf);
#pragma unroll
        for (int h = 0; h < DA_HEADS; h++)
#pragma unroll
          for (int e = 0; e < EL; e++) acc[h][e] = fmaf(sc[u][h], vf[e], acc[h][e]);
      }
    } else {
#pragma unroll
      for (int u = 0; u < UNR; u++) token(kr[u], vr[u], base + u * SLOTS + sub);
    }
  }
  if (TRIGGER) hg_pdl_trigger();  // this warp's loads are done
  da_block_state<EL, LPT>(dst, m, l, acc, nh, headDim);
}

// One head's merged output, by the whole block (nt threads, t0 = threadIdx.x; every thread of the
// block calls it): out[d] = Σ_split e^(m_s − M) a_s[d] / Σ_split e^(m_s − M) l_s over the nsplit
// partial rows p, p + stride, ... The splits' weights e^(m_s − M) are computed once, in parallel,
// into shared memory, and each output dim's sum keeps 8 loads in flight: walking the splits one
// dependent load at a time took longer than the split kernel before it. stats (optional): the
// merged max in natural-log units (the partials hold log2 units) and the sum, for a partial row.
static const int DA_MERGE_MAX = 1024;  // splits the weights' shared array holds; more are folded in place
__device__ __forceinline__ void da_merge_head(float *out, const float *p, size_t stride, int nsplit, int headDim, int t0, int nt, float *stats = nullptr) {
  __shared__ float wts[DA_MERGE_MAX];
  __shared__ float red[32];
  float mx = -INFINITY;
  for (int s = t0; s < nsplit; s += nt) mx = fmaxf(mx, p[s * stride + headDim]);
  mx = block_max(mx, red);
  float den = 0.f;
  for (int s = t0; s < nsplit; s += nt) {
    const float w = exp2f(p[s * stride + headDim] - mx);
    if (s < DA_MERGE_MAX) wts[s] = w;
    den += p[s * stride + headDim + 1] * w;
  }
  den = block_sum(den, red);  // its barriers also publish wts
  if (stats && t0 == 0) { stats[0] = mx * 0.69314718055994531f; stats[1] = den; }
  const float inv = 1.f / den;
  const int cached = min(nsplit, DA_MERGE_MAX);
  for (int d = t0; d < headDim; d += nt) {
    float a = 0.f;
    int s = 0;
    for (; s + 8 <= cached; s += 8) {
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; u++) v[u] = p[(s + u) * stride + d];
#pragma unroll
      for (int u = 0; u < 8; u++) a += v[u] * wts[s + u];
    }
    for (; s < cached; s++) a += p[s * stride + d] * wts[s];
    for (; s < nsplit; s++) a += p[s * stride + d] * exp2f(p[s * stride + headDim] - mx);
    out[d] = a * inv;
  }
}

// Lanes per token row (da_lanes): decode_plan.h.
