// Hybrid attention's window on the device (Backend.attnPartial / attnMerge): split-K decode
// attention of one query row over up to SA_SPANS spans of K/V [kvHeads, cap, headDim] (sinks and
// the ring's runs) that emits the flash-decode partial instead of the output, and the merge of a
// partial with more tokens whose logits are given (the selected offloaded ones). The split kernel
// runs decode_attn.cu's blocks (decode_attn_block.cuh, decode_attn_mma.cuh, or a plain warp block
// for the shapes they do not take) on the same chunks, cut so that none crosses a span's end; the
// chunks' partial rows merge (da_merge_head) into part [heads, headDim + 2]: normalised output,
// max (natural log units), sum. K and V are read once and no logits are written.
#include "decode_attn_block.cuh"
#include "decode_attn_mma.cuh"

static const int SA_SPANS = 4;  // core's ATTN_PARTIAL_MAX_SPANS; the table is always 4 pairs (unused: count 0)

// Block `split`'s chunk of the spans table t (start, count pairs): slots from `start`, tokens
// [j0, j1) of that span. Chunks are da_chunk of the spans' total, counted span by span; false
// past the last one.
__device__ __forceinline__ bool sa_chunk(const int *t, int maxSplits, int split, int &start, int &j0, int &j1) {
  int total = 0;
#pragma unroll
  for (int s = 0; s < SA_SPANS; s++) total += t[2 * s + 1];
  const int chunk = da_chunk(total, maxSplits);
  int first = 0;
#pragma unroll
  for (int s = 0; s < SA_SPANS; s++) {
    const int n = (t[2 * s + 1] + chunk - 1) / chunk;
    if (split < first + n) {
      start = t[2 * s];
      j0 = (split - first) * chunk;
      j1 = min(t[2 * s + 1], j0 + chunk);
      return true;
    }
    first += n;
  }
  return false;
}

// The number of chunks (and of partial rows written) for table t.
__device__ __forceinline__ int sa_chunks(const int *t, int maxSplits) {
  int total = 0, n = 0;
#pragma unroll
  for (int s = 0; s < SA_SPANS; s++) total += t[2 * s + 1];
  const int chunk = da_chunk(total, maxSplits);
#pragma unroll
  for (int s = 0; s < SA_SPANS; s++) n += (t[2 * s + 1] + chunk - 1) / chunk;
  return n;
}

// grid (maxSplits + SA_SPANS, kvHeads, head groups of DA_HEADS): decode_attn_kernel's FMA block on
// a span's chunk. part: [chunk][head][headDim + 2] = unnormalised output, max (log2), sum.
template <int KT, int LPT>
__global__ void __launch_bounds__(256) span_attn_kernel(float *part, const float *q, const void *k, const void *v, int heads, int group, int headDim,
                                                        int cap, int maxSplits, const int *tab, float sl) {
  constexpr int ES = KT == DT_F32 ? 4 : 2;
  int start, j0, j1;
  if (!sa_chunk(tab, maxSplits, blockIdx.x, start, j0, j1)) return;  // the whole block, before any barrier
  const int g = blockIdx.y, h0 = g * group + blockIdx.z * DA_HEADS;
  const int nh = min(DA_HEADS, group - (int)blockIdx.z * DA_HEADS);
  const size_t cacheRow = ((size_t)g * cap + start) * headDim * ES;
  da_block<KT, LPT, 4, false, true>(part + ((size_t)blockIdx.x * heads + h0) * (headDim + 2), q + (size_t)h0 * headDim, (const char *)k + cacheRow,
                                    (const char *)v + cacheRow, nh, headDim, j0, j1, sl);
}

// The tensor-core form (bf16/f16, head dim 64 or 128): grid (maxSplits + SA_SPANS, kvHeads, head groups of DM_HEADS), 128 threads.
template <typename T, int HD>
__global__ void __launch_bounds__(128) span_attn_mma_kernel(float *part, const float *q, const void *k, const void *v, int heads, int group, int cap,
                                                            int maxSplits, const int *tab, float sl) {
  int start, j0, j1;
  if (!sa_chunk(tab, maxSplits, blockIdx.x, start, j0, j1)) return;
  const int g = blockIdx.y, h0 = g * group + blockIdx.z * DM_HEADS;
  const int nh = min(DM_HEADS, group - (int)blockIdx.z * DM_HEADS);
  const size_t cacheRow = ((size_t)g * cap + start) * HD * 2;
  dm_block<T, HD, false, true>(part + ((size_t)blockIdx.x * heads + h0) * (HD + 2), q + (size_t)h0 * HD, (const char *)k + cacheRow, (const char *)v + cacheRow,
                               nh, j0, j1, sl);
}

// Shapes the blocks above do not take (a head dim that is not a multiple of 16 bytes, a cache not
// on 16 bytes): grid (maxSplits + SA_SPANS, heads), 4 warps; a warp scores one token at a time
// (lanes over dims) with its own online softmax, the warps merge through shared memory.
static const int SG_WARPS = 4;
template <int KT>
__global__ void __launch_bounds__(128) span_attn_plain_kernel(float *part, const float *q, const void *k, const void *v, int heads, int group, int headDim,
                                                              int cap, int maxSplits, const int *tab, float sl) {
  int start, j0, j1;
  if (!sa_chunk(tab, maxSplits, blockIdx.x, start, j0, j1)) return;
  const int h = blockIdx.y, g = h / group, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float *qh = q + (size_t)h * headDim;
  const size_t base = ((size_t)g * cap + start) * headDim;
  float m = -INFINITY, l = 0.f, acc[8];  // dims lane + 32i (head dim ≤ 256)
#pragma unroll
  for (int i = 0; i < 8; i++) acc[i] = 0.f;
  for (int j = j0 + warp; j < j1; j += SG_WARPS) {
    const size_t row = base + (size_t)j * headDim;
    float s = 0.f;
    for (int d = lane; d < headDim; d += 32) s += qh[d] * ld<KT>(k, row + d);
    s = warp_sum(s) * sl;
    const float mx = fmaxf(m, s), cr = exp2f(m - mx), p = exp2f(s - mx);
    l = l * cr + p;
#pragma unroll
    for (int i = 0; i < 8; i++)
      if (lane + 32 * i < headDim) acc[i] = acc[i] * cr + p * ld<KT>(v, row + lane + 32 * i);
    m = mx;
  }
  __shared__ float smA[SG_WARPS][256], smM[SG_WARPS], smL[SG_WARPS];
#pragma unroll
  for (int i = 0; i < 8; i++)
    if (lane + 32 * i < headDim) smA[warp][lane + 32 * i] = acc[i];
  if (lane == 0) { smM[warp] = m; smL[warp] = l; }
  __syncthreads();
  float *dst = part + ((size_t)blockIdx.x * heads + h) * (headDim + 2);
  for (int d = threadIdx.x; d < headDim; d += blockDim.x) {
    float mm = -INFINITY, ll = 0.f, a = 0.f;
    for (int w = 0; w < SG_WARPS; w++) da_merge<1>(mm, ll, &a, smM[w], smL[w], &smA[w][d]);
    dst[d] = a;
    if (d == 0) { dst[headDim] = mm; dst[headDim + 1] = ll; }
  }
}

// grid (heads): the chunks' partial rows of head h merged into its row of `out` (the op's partial);
// no chunk at all: output 0, max −∞, sum 0.
__global__ void span_attn_combine_kernel(float *out, const float *part, int heads, int headDim, int maxSplits, const int *tab) {
  const int nsplit = sa_chunks(tab, maxSplits), h = blockIdx.x;
  float *o = out + (size_t)h * (headDim + 2);
  if (nsplit == 0) {
    for (int d = threadIdx.x; d < headDim; d += blockDim.x) o[d] = 0.f;
    if (threadIdx.x == 0) { o[headDim] = -INFINITY; o[headDim + 1] = 0.f; }
    return;
  }
  da_merge_head(o, part + (size_t)h * (headDim + 2), (size_t)heads * (headDim + 2), nsplit, headDim, threadIdx.x, blockDim.x, o + headDim);
}

static const int MERGE_WARPS = 8;

// grid (heads), MERGE_WARPS warps: out[h] = one softmax over the partial's tokens and logits[h, 0 ..
// count) applied to their V rows (the columns' rows v[h / group, start + j]); −∞ columns weigh 0;
// nothing attended: 0. Warp w takes columns w, w + MERGE_WARPS, …, a lane every 32nd dim, so the
// warps' row loads overlap (a column at a time per block is latency-bound). dyn (a recorded step):
// start and count from the blob.
template <int VT>
__global__ void __launch_bounds__(32 * MERGE_WARPS) attn_merge_kernel(float *out, const float *part, const float *logits, int width, const void *v,
                                                                      int group, int headDim, int cap, int start, int count, const int *dyn) {
  if (dyn) { start = dyn[0]; count = dyn[1]; }
  __shared__ float red[32];
  __shared__ float smA[MERGE_WARPS][256], smS[MERGE_WARPS];
  const int h = blockIdx.x, g = h / group, t = threadIdx.x, nt = blockDim.x, warp = t >> 5, lane = t & 31;
  const float *pr = part + (size_t)h * (headDim + 2), *row = logits + (size_t)h * width;
  float *o = out + (size_t)h * headDim;
  const float mw = pr[headDim], lw = pr[headDim + 1];
  float mx = -INFINITY;
  for (int j = t; j < count; j += nt) mx = fmaxf(mx, row[j]);
  mx = block_max(mx, red);
  if (lw > 0.f) mx = fmaxf(mx, mw);
  if (mx == -INFINITY) {
    for (int d = t; d < headDim; d += nt) o[d] = 0.f;
    return;
  }
  const float sw = lw > 0.f ? lw * expf(mw - mx) : 0.f;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, ps = 0.f;  // head dim ≤ 256
  const size_t vbase = ((size_t)g * cap + start) * headDim;
#pragma unroll 4
  for (int j = warp; j < count; j += MERGE_WARPS) {
    const float p = expf(row[j] - mx);
    ps += p;
    const size_t r = vbase + (size_t)j * headDim;
#pragma unroll
    for (int i = 0; i < 8; i++)
      if (lane + 32 * i < headDim) acc[i] += p * ld<VT>(v, r + lane + 32 * i);
  }
#pragma unroll
  for (int i = 0; i < 8; i++)
    if (lane + 32 * i < headDim) smA[warp][lane + 32 * i] = acc[i];
  if (lane == 0) smS[warp] = ps;
  __syncthreads();
  float den = sw;
  for (int w = 0; w < MERGE_WARPS; w++) den += smS[w];
  for (int d = t; d < headDim; d += nt) {
    float a = 0.f;
    for (int w = 0; w < MERGE_WARPS; w++) a += smA[w][d];
    o[d] = (sw * pr[d] + a) / den;
  }
}

Cmd hg_new_cmd(int kind);                       // rowops.cu
int hg_put_dyn(HgCtx *c, Cmd &cmd, int count);  // rowops.cu

// CMD_SPAN_ATTN: p[0] part (the op's output), p[1] q, p[2] k, p[3] v, p[4] the spans table (int
// scratch or blob); s[0] dtype, s[1] heads, s[2] kvHeads, s[3] headDim, s[4] cap, s[5] the splits
// the chunks are cut for, s[6] lanes a token row, s[7] the plan's kernel (HG_ATTN_FLASH: the plain
// warp block); f[0] the scale in log2 units.
int hg_launch_span_attn(HgCtx *c, const Cmd &m) {
  const int dt = m.s[0], heads = m.s[1], kvHeads = m.s[2], headDim = m.s[3], cap = m.s[4], splits = m.s[5], lpt = m.s[6];
  const int group = heads / kvHeads;
  const float *q = (const float *)m.p[1];
  const int *tab = (const int *)m.p[4];
  const float sl = m.f[0];
  const unsigned gx = (unsigned)(splits + SA_SPANS);
  int r = 0;
  if (m.s[7] == HG_ATTN_SPLIT_MMA) {
    const dim3 grid(gx, kvHeads, (group + DM_HEADS - 1) / DM_HEADS);
#define SA_MMA(T, HD) hg_launch(c, span_attn_mma_kernel<T, HD>, grid, dim3(128), 0, c->decodePart, q, m.p[2], m.p[3], heads, group, cap, splits, tab, sl)
    if (dt == DT_BF16) r = headDim == 64 ? SA_MMA(__nv_bfloat16, 64) : SA_MMA(__nv_bfloat16, 128);
    else r = headDim == 64 ? SA_MMA(__half, 64) : SA_MMA(__half, 128);
#undef SA_MMA
  } else if (m.s[7] == HG_ATTN_SPLIT) {
    const dim3 grid(gx, kvHeads, (group + DA_HEADS - 1) / DA_HEADS);
#define SA_FMA(L) hg_launch(c, span_attn_kernel<K, L>, grid, dim3(256), 0, c->decodePart, q, m.p[2], m.p[3], heads, group, headDim, cap, splits, tab, sl)
    HG_DISPATCH_DT(dt, K, r = lpt == 4 ? SA_FMA(4) : lpt == 8 ? SA_FMA(8) : lpt == 16 ? SA_FMA(16) : SA_FMA(32));
#undef SA_FMA
  } else {
    HG_DISPATCH_DT(dt, K, r = hg_launch(c, span_attn_plain_kernel<K>, dim3(gx, heads), dim3(128), 0, c->decodePart, q, m.p[2], m.p[3], heads, group, headDim,
                                        cap, splits, tab, sl));
  }
  if (r) return r;
  return hg_launch(c, span_attn_combine_kernel, dim3(heads), dim3(headDim >= 128 ? 128 : 64), 0, (float *)m.p[0], (const float *)c->decodePart, heads, headDim,
                   splits, tab);
}

// CMD_ATTN_MERGE: p[0] out, p[1] part, p[2] logits (at the first column), p[3] v; s[0] dtype,
// s[1] heads, s[2] kvHeads, s[3] headDim, s[4] cap, s[5] the logits' row width; d[0] start, d[1] count.
int hg_launch_attn_merge(HgCtx *c, const Cmd &m, const char *dynBase) {
  const int *dyn = dynBase ? (const int *)(dynBase + m.dynOff) : NULL;
  const int group = m.s[1] / m.s[2];
  HG_DISPATCH_DT(m.s[0], V, return hg_launch(c, attn_merge_kernel<V>, dim3(m.s[1]), dim3(32 * MERGE_WARPS), 0, (float *)m.p[0], (const float *)m.p[1], (const float *)m.p[2],
                                             m.s[5], m.p[3], group, m.s[3], m.s[4], m.d[0], m.d[1], dyn));
  return 0;
}

extern "C" {

// part [heads, headDim + 2] f32 = the partial of q (heads·headDim f32) over nspans ≤ 4 spans (host
// table of start, count pairs, checked by the caller) of K/V [kvHeads, cap, headDim] (headDim ≤ 256).
// Recordable in a decode step (the table goes with the step's blob).
HG_EXPORT int hg_cu_attn_partial(HgCtx *c, float *part, const float *q, const void *k, const void *v, int dt, int heads, int kvHeads, int headDim,
                                 int cap, const int *spans, int nspans, float scale) {
  if (nspans < 0 || nspans > SA_SPANS || headDim > 256 || kvHeads < 1 || heads % kvHeads != 0) return (int)cudaErrorInvalidValue;
  HG_FLUSH_REC(c);
  int tab[2 * SA_SPANS] = {0};
  int total = 0;
  for (int i = 0; i < 2 * nspans; i++) tab[i] = spans[i];
  for (int s = 0; s < nspans; s++) total += spans[2 * s + 1];
  const bool aligned = (((uintptr_t)k | (uintptr_t)v) & 15) == 0;
  HgPlanShape shape = {HG_PLAN_ATTN, dt, 0, 0, 0, 0, headDim, aligned, ((uintptr_t)q & 15) == 0};
  const HgPlan plan = hg_decode_plan(hg_plan_device(c), shape);
  const bool mma = plan.kernel == HG_ATTN_SPLIT_MMA;
  // Splits as hg_cu_attn_decode's (the plan's chunk blocks an SM, bounded by the tokens and the
  // partials' space, which also holds a chunk more per span); a recorded step cuts for the capacity.
  const int blocksPer = plan.kernel == HG_ATTN_FLASH ? heads : kvHeads * ((heads / kvHeads + (mma ? DM_HEADS : DA_HEADS) - 1) / (mma ? DM_HEADS : DA_HEADS));
  const int bound = hg_recording(c) ? cap : total;
  long splits = ((long)(plan.kernel == HG_ATTN_FLASH ? 4 : plan.chunkSplitsPerSm) * c->numSMs + blocksPer - 1) / blocksPer;
  const long byLength = (bound + DA_MIN_CHUNK - 1) / DA_MIN_CHUNK;
  const long bySpace = (long)(c->decodePartBytes / ((size_t)heads * (headDim + 2) * sizeof(float))) - SA_SPANS;
  if (splits > byLength) splits = byLength;
  if (splits > bySpace) splits = bySpace;
  if (splits < 1) splits = 1;
  if (bySpace < 1) return (int)cudaErrorInvalidValue;
  int *dev = NULL;
  int e = hg_upload_ints(c, tab, 2 * SA_SPANS, &dev);
  if (e) return e;
  Cmd m = hg_new_cmd(CMD_SPAN_ATTN);
  m.p[0] = part; m.p[1] = q; m.p[2] = k; m.p[3] = v; m.p[4] = dev;
  m.s[0] = dt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = cap; m.s[5] = (int)splits; m.s[6] = plan.lanes; m.s[7] = plan.kernel;
  m.f[0] = scale * 1.4426950408889634f;  // scores in log2 units: exp(x) = exp2(x·log2 e)
  return hg_submit(c, m);
}

// out (heads·headDim f32) = part merged with logits[h·width + j] (logits at the first column) and V
// rows start + j of v [kvHeads, cap, headDim], j < count. Recordable (start and count per step).
HG_EXPORT int hg_cu_attn_merge(HgCtx *c, float *out, const float *part, const float *logits, int width, const void *v, int dt, int heads, int kvHeads,
                               int headDim, int cap, int start, int count) {
  if (headDim > 256 || kvHeads < 1 || heads % kvHeads != 0) return (int)cudaErrorInvalidValue;
  HG_FLUSH_REC(c);
  Cmd m = hg_new_cmd(CMD_ATTN_MERGE);
  m.p[0] = out; m.p[1] = part; m.p[2] = logits; m.p[3] = v;
  m.s[0] = dt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = cap; m.s[5] = width;
  m.d[0] = start; m.d[1] = count;
  int r = hg_put_dyn(c, m, 2);
  return r ? r : hg_submit(c, m);
}

}  // extern "C"
