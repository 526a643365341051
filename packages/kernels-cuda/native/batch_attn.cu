// The attention half of a batched decode step in three launches for all B rows: each row (its
// own sequence) appends its new K/V row to its own cache, then split-K decode attention of its
// query over its own cached span, then the merge of the splits. A per-call table (cache
// addresses, capacity, the slot written, span start and length per row) is uploaded with the
// step's blob when the step is recorded (so the captured graph serves every step: only the
// table's contents change), or through the int scratch when eager. The split-K kernel follows
// decode_attn.cu's (one query row per block group, online softmax in log2 units, K and V read
// once); here blockIdx.z also picks the row.
#include "common.cuh"

// One row of the table: 8 ints (TypeScript writes the addresses as two 32-bit halves).
struct BatchAttnRow {
  unsigned long long k, v;  // K and V caches [kvHeads, cap, headDim]
  int cap, slot;            // capacity; the slot the row's new K/V goes to
  int start, count;         // attended slots start .. start + count - 1
};
static_assert(sizeof(BatchAttnRow) == 8 * sizeof(int), "table rows are 8 ints");

static const int BA_WARPS = 8;  // 256 threads a block
static const int BA_HEADS = 4;  // query heads a block serves
static const int BA_MIN_CHUNK = 64;

__device__ __forceinline__ int ba_chunk(int count, int maxSplits) {
  const int c = (count + maxSplits - 1) / maxSplits;
  return c > BA_MIN_CHUNK ? c : BA_MIN_CHUNK;
}

template <int EL>
__device__ __forceinline__ void ba_merge(float &m, float &l, float *a, float m2, float l2, const float *a2) {
  const float mx = fmaxf(m, m2);
  const float s1 = m == -INFINITY ? 0.f : exp2f(m - mx), s2 = m2 == -INFINITY ? 0.f : exp2f(m2 - mx);
  l = l * s1 + l2 * s2;
#pragma unroll
  for (int e = 0; e < EL; e++) a[e] = a[e] * s1 + a2[e] * s2;
  m = mx;
}

// grid (B): row b's new k/v rows ([kvHeads, headDim] f32) into its caches at its slot.
template <int KT>
__global__ void batch_append_kernel(const BatchAttnRow *tab, const float *kNew, const float *vNew, int kvHeads, int headDim) {
  hg_pdl_trigger();
  hg_pdl_wait();
  const BatchAttnRow r = tab[blockIdx.x];
  const int width = kvHeads * headDim;
  const float *ks = kNew + (size_t)blockIdx.x * width, *vs = vNew + (size_t)blockIdx.x * width;
  for (int e = threadIdx.x; e < width; e += blockDim.x) {
    const int g = e / headDim, d = e % headDim;
    const size_t i = ((size_t)g * r.cap + r.slot) * headDim + d;
    st<KT>((void *)r.k, i, ks[e]);
    st<KT>((void *)r.v, i, vs[e]);
  }
}

// grid (maxSplits, kvHeads, zGroups · B): blockIdx.z / zGroups is the row, % zGroups its head
// group. part: [row][split][head][headDim + 2] = unnormalised output, max (log2), sum.
template <int KT, int LPT, int UNR>
__global__ void __launch_bounds__(256) batch_attn_kernel(float *part, const float *q, const BatchAttnRow *tab, int heads, int group, int headDim,
                                                         int maxSplits, int zGroups, float sl) {
  constexpr int ES = KT == DT_F32 ? 4 : 2, EL = Vec16<KT>::N, TPW = 32 / LPT, SLOTS = BA_WARPS * TPW;
  __shared__ float smA[BA_WARPS][BA_HEADS][256];
  __shared__ float smM[BA_WARPS][BA_HEADS], smL[BA_WARPS][BA_HEADS];
  hg_pdl_trigger();
  hg_pdl_wait();
  const int row = blockIdx.z / zGroups, zg = blockIdx.z % zGroups;
  const BatchAttnRow r = tab[row];
  const int count = r.count, cap = r.cap, start = r.start;
  const int chunk = ba_chunk(count, maxSplits);
  const int split = blockIdx.x;
  if (split * chunk >= count) return;  // the whole block, before any barrier
  const int g = blockIdx.y, h0 = g * group + zg * BA_HEADS;
  const int nh = min(BA_HEADS, group - zg * BA_HEADS);
  const size_t rowBytes = (size_t)headDim * ES;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, sub = lane / LPT, li = lane % LPT;
  const int d0 = li * EL;
  const bool active = d0 < headDim;
  const float *qrow = q + (size_t)row * heads * headDim;
  float qr[BA_HEADS][EL];
#pragma unroll
  for (int h = 0; h < BA_HEADS; h++)
#pragma unroll
    for (int e = 0; e < EL; e++) qr[h][e] = (h < nh && active) ? qrow[(size_t)(h0 + h) * headDim + d0 + e] * sl : 0.f;
  float m[BA_HEADS], l[BA_HEADS], acc[BA_HEADS][EL];
#pragma unroll
  for (int h = 0; h < BA_HEADS; h++) {
    m[h] = -INFINITY; l[h] = 0.f;
#pragma unroll
    for (int e = 0; e < EL; e++) acc[h][e] = 0.f;
  }
  const char *kb = (const char *)r.k + ((size_t)g * cap + start) * rowBytes + (size_t)d0 * ES;
  const char *vb = (const char *)r.v + ((size_t)g * cap + start) * rowBytes + (size_t)d0 * ES;
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
      float s[BA_HEADS];
#pragma unroll
      for (int h = 0; h < BA_HEADS; h++) {
        float t = 0.f;
#pragma unroll
        for (int e = 0; e < EL; e++) t += qr[h][e] * kf[e];
#pragma unroll
        for (int o = LPT / 2; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
        s[h] = t;
      }
      if (j < j1) {
#pragma unroll
        for (int h = 0; h < BA_HEADS; h++) {
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
#pragma unroll
  for (int o = LPT; o < 32; o <<= 1) {
#pragma unroll
    for (int h = 0; h < BA_HEADS; h++) {
      float a2[EL];
#pragma unroll
      for (int e = 0; e < EL; e++) a2[e] = __shfl_xor_sync(0xffffffffu, acc[h][e], o);
      const float m2 = __shfl_xor_sync(0xffffffffu, m[h], o), l2 = __shfl_xor_sync(0xffffffffu, l[h], o);
      ba_merge<EL>(m[h], l[h], acc[h], m2, l2, a2);
    }
  }
  if (sub == 0) {
#pragma unroll
    for (int h = 0; h < BA_HEADS; h++) {
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
    for (int w = 0; w < BA_WARPS; w++) ba_merge<1>(mm, ll, &a, smM[w][h], smL[w][h], &smA[w][h][d]);
    float *dst = part + (((size_t)row * maxSplits + split) * heads + h0 + h) * (headDim + 2);
    dst[d] = a;
    if (d == 0) { dst[headDim] = mm; dst[headDim + 1] = ll; }
  }
}

// grid (heads, B): out[row, h, :] = Σ_split e^(m_s − M) a_s / Σ_split e^(m_s − M) l_s.
__global__ void batch_attn_merge_kernel(float *out, const float *part, const BatchAttnRow *tab, int heads, int headDim, int maxSplits) {
  hg_pdl_trigger();
  hg_pdl_wait();
  const int row = blockIdx.y, h = blockIdx.x;
  const int count = tab[row].count;
  const int nsplit = (count + ba_chunk(count, maxSplits) - 1) / ba_chunk(count, maxSplits);
  const size_t stride = (size_t)heads * (headDim + 2);
  const float *p = part + (size_t)row * maxSplits * stride + (size_t)h * (headDim + 2);
  float mx = -INFINITY;
  for (int s = 0; s < nsplit; s++) mx = fmaxf(mx, p[s * stride + headDim]);
  float den = 0.f;
  for (int s = 0; s < nsplit; s++) den += p[s * stride + headDim + 1] * exp2f(p[s * stride + headDim] - mx);
  const float inv = 1.f / den;
  for (int d = threadIdx.x; d < headDim; d += blockDim.x) {
    float a = 0.f;
    for (int s = 0; s < nsplit; s++) a += p[s * stride + d] * exp2f(p[s * stride + headDim] - mx);
    out[((size_t)row * heads + h) * headDim + d] = a * inv;
  }
}

// Lanes per token row as decode_attn.cu picks them: EL-value pieces rounded up to a power of two.
static int ba_lanes(int dt, int headDim) {
  const int el = dt == DT_F32 ? 4 : 8;
  if (headDim <= 0 || headDim % el != 0 || headDim > 256) return 0;
  int pieces = headDim / el, lpt = 4;
  while (lpt < pieces) lpt <<= 1;
  return lpt <= 32 ? lpt : 0;
}

template <int KT, int UNR>
static int launch_ba_u(HgCtx *c, int lpt, dim3 grid, const float *q, const BatchAttnRow *tab, int heads, int group, int headDim, int maxSplits, int zGroups,
                       float sl) {
  switch (lpt) {
    case 4: return hg_launch(c, batch_attn_kernel<KT, 4, UNR>, grid, dim3(256), 0, c->decodePart, q, tab, heads, group, headDim, maxSplits, zGroups, sl);
    case 8: return hg_launch(c, batch_attn_kernel<KT, 8, UNR>, grid, dim3(256), 0, c->decodePart, q, tab, heads, group, headDim, maxSplits, zGroups, sl);
    case 16: return hg_launch(c, batch_attn_kernel<KT, 16, UNR>, grid, dim3(256), 0, c->decodePart, q, tab, heads, group, headDim, maxSplits, zGroups, sl);
    default: return hg_launch(c, batch_attn_kernel<KT, 32, UNR>, grid, dim3(256), 0, c->decodePart, q, tab, heads, group, headDim, maxSplits, zGroups, sl);
  }
}

template <int KT>
static int launch_ba(HgCtx *c, const Cmd &m) {
  float *out = (float *)m.p[0];
  const float *q = (const float *)m.p[1];
  const float *kNew = (const float *)m.p[2], *vNew = (const float *)m.p[3];
  const BatchAttnRow *tab = (const BatchAttnRow *)m.p[4];
  const int heads = m.s[1], kvHeads = m.s[2], headDim = m.s[3], B = m.s[4], splits = m.s[5], lpt = m.s[6], unr = m.s[7];
  const int group = heads / kvHeads, zGroups = (group + BA_HEADS - 1) / BA_HEADS;
  int r = hg_launch(c, batch_append_kernel<KT>, dim3((unsigned)B), dim3(256), 0, tab, kNew, vNew, kvHeads, headDim);
  if (r) return r;
  const dim3 grid((unsigned)splits, (unsigned)kvHeads, (unsigned)(zGroups * B));
  r = unr == 4 ? launch_ba_u<KT, 4>(c, lpt, grid, q, tab, heads, group, headDim, splits, zGroups, m.f[0])
               : launch_ba_u<KT, 2>(c, lpt, grid, q, tab, heads, group, headDim, splits, zGroups, m.f[0]);
  if (r) return r;
  return hg_launch(c, batch_attn_merge_kernel, dim3((unsigned)heads, (unsigned)B), dim3(headDim >= 128 ? 128 : 64), 0, out, (const float *)c->decodePart, tab,
                   heads, headDim, splits);
}

int hg_launch_batch_attn(HgCtx *c, const Cmd &m) {
  HG_DISPATCH_DT(m.s[0], K, return launch_ba<K>(c, m));
  return 0;
}

Cmd hg_new_cmd(int kind);

extern "C" {

// B rows (B ≤ 64): q/out [B, heads·headDim] f32, kNew/vNew [B, kvHeads·headDim] f32; table: B
// rows of 8 ints (BatchAttnRow, host memory, checked by the caller: caches of dtype dt, 16-byte
// aligned, slot < cap, start + count ≤ cap, count ≥ 1). Recordable in a decode step.
HG_EXPORT int hg_cu_attn_decode_batch(HgCtx *c, float *out, const float *q, const float *kNew, const float *vNew, int dt, int B, int heads, int kvHeads,
                                      int headDim, const int *table, float scale) {
  const int lpt = ba_lanes(dt, headDim);
  if (!lpt || B < 1 || B > 64 || kvHeads < 1 || heads % kvHeads != 0) return (int)cudaErrorInvalidValue;
  int maxCap = 0, maxCount = 0;
  for (int i = 0; i < B; i++) {
    const BatchAttnRow *r = reinterpret_cast<const BatchAttnRow *>(table + 8 * i);
    if (r->cap > maxCap) maxCap = r->cap;
    if (r->count > maxCount) maxCount = r->count;
  }
  HG_FLUSH_REC(c);
  int *dev = NULL;
  int e = hg_upload_ints(c, table, (size_t)B * 8, &dev);
  if (e) return e;
  // Splits: ≈ 4 blocks an SM over all rows; a recorded step sizes the grid for the capacity
  // (blocks past a row's span return at once), an eager one for the longest span.
  const int zGroups = (heads / kvHeads + BA_HEADS - 1) / BA_HEADS;
  const int bound = hg_recording(c) ? maxCap : maxCount;
  long splits = (4L * c->numSMs + (long)kvHeads * zGroups * B - 1) / ((long)kvHeads * zGroups * B);
  const long byLength = (bound + BA_MIN_CHUNK - 1) / BA_MIN_CHUNK;
  const long bySpace = (long)(c->decodePartBytes / ((size_t)B * heads * (headDim + 2) * sizeof(float)));
  if (splits > byLength) splits = byLength;
  if (splits > bySpace) splits = bySpace;
  if (splits < 1) return (int)cudaErrorInvalidValue;
  Cmd m = hg_new_cmd(CMD_BATCH_ATTN);
  m.p[0] = out; m.p[1] = q; m.p[2] = kNew; m.p[3] = vNew; m.p[4] = dev;
  m.s[0] = dt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = B; m.s[5] = (int)splits; m.s[6] = lpt; m.s[7] = c->attnUnroll;
  m.f[0] = scale * 1.4426950408889634f;  // scores in log2 units
  return hg_submit(c, m);
}

}  // extern "C"
