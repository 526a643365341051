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
// Head h's row of out from the chunks' partial rows at part (one op's, or one row's of a batch's).
__device__ __forceinline__ void sa_combine_head(float *out, const float *part, int heads, int headDim, int nsplit, int h) {
  float *o = out + (size_t)h * (headDim + 2);
  if (nsplit == 0) {
    for (int d = threadIdx.x; d < headDim; d += blockDim.x) o[d] = 0.f;
    if (threadIdx.x == 0) { o[headDim] = -INFINITY; o[headDim + 1] = 0.f; }
    return;
  }
  da_merge_head(o, part + (size_t)h * (headDim + 2), (size_t)heads * (headDim + 2), nsplit, headDim, threadIdx.x, blockDim.x, o + headDim);
}

__global__ void span_attn_combine_kernel(float *out, const float *part, int heads, int headDim, int maxSplits, const int *tab) {
  sa_combine_head(out, part, heads, headDim, sa_chunks(tab, maxSplits), blockIdx.x);
}

// A batched step's window partials (hg_cu_attn_partial_rows): row r of the table is one attnPartial's
// part, q, K, V and spans; its blocks are that op's own (the same chunks, the same sums), its chunk
// partials at cpart + r · rowStride. Every row's window has the same shape and capacity.
struct PartialRow {
  unsigned long long part, q, k, v;
  int tab[2 * SA_SPANS];
};

template <typename T, int HD>
__global__ void __launch_bounds__(128) span_attn_rows_mma_kernel(float *cpart, size_t rowStride, const PartialRow *rows, int hgroups, int heads, int group,
                                                                 int cap, int maxSplits, float sl) {
  const int r = blockIdx.z / hgroups, hz = blockIdx.z - r * hgroups;
  const PartialRow *R = rows + r;
  int start, j0, j1;
  if (!sa_chunk(R->tab, maxSplits, blockIdx.x, start, j0, j1)) return;
  const int g = blockIdx.y, h0 = g * group + hz * DM_HEADS;
  const int nh = min(DM_HEADS, group - hz * DM_HEADS);
  const size_t cacheRow = ((size_t)g * cap + start) * HD * 2;
  dm_block<T, HD, false, true>(cpart + r * rowStride + ((size_t)blockIdx.x * heads + h0) * (HD + 2), (const float *)R->q + (size_t)h0 * HD,
                               (const char *)R->k + cacheRow, (const char *)R->v + cacheRow, nh, j0, j1, sl);
}

template <int KT, int LPT>
__global__ void __launch_bounds__(256) span_attn_rows_kernel(float *cpart, size_t rowStride, const PartialRow *rows, int hgroups, int heads, int group,
                                                             int headDim, int cap, int maxSplits, float sl) {
  constexpr int ES = KT == DT_F32 ? 4 : 2;
  const int r = blockIdx.z / hgroups, hz = blockIdx.z - r * hgroups;
  const PartialRow *R = rows + r;
  int start, j0, j1;
  if (!sa_chunk(R->tab, maxSplits, blockIdx.x, start, j0, j1)) return;
  const int g = blockIdx.y, h0 = g * group + hz * DA_HEADS;
  const int nh = min(DA_HEADS, group - hz * DA_HEADS);
  const size_t cacheRow = ((size_t)g * cap + start) * headDim * ES;
  da_block<KT, LPT, 4, false, true>(cpart + r * rowStride + ((size_t)blockIdx.x * heads + h0) * (headDim + 2), (const float *)R->q + (size_t)h0 * headDim,
                                    (const char *)R->k + cacheRow, (const char *)R->v + cacheRow, nh, headDim, j0, j1, sl);
}

__global__ void span_attn_rows_combine_kernel(const float *cpart, size_t rowStride, const PartialRow *rows, int heads, int headDim, int maxSplits) {
  const PartialRow *R = rows + blockIdx.y;
  sa_combine_head((float *)R->part, cpart + blockIdx.y * rowStride, heads, headDim, sa_chunks(R->tab, maxSplits), blockIdx.x);
}

// A batched step's K/V appends (hg_cu_window_append_rows): row r's new K and V [kvHeads, headDim] f32
// into its window K and V [kvHeads, cap, headDim] at slot `slot` of every KV head, as copyRows of each
// KV head's row writes them. Block (r, 0) the K row, (r, 1) the V row.
struct AppendRow {
  unsigned long long k, v, kNew, vNew;
  int slot, pad[3];
};

template <int DT>
__global__ void window_append_rows_kernel(const AppendRow *rows, int kvHeads, int headDim, int cap) {
  const AppendRow *R = rows + blockIdx.x;
  const float *src = (const float *)(blockIdx.y ? R->vNew : R->kNew);
  void *dst = (void *)(blockIdx.y ? R->v : R->k);
  const int slot = R->slot;
  for (int i = threadIdx.x; i < kvHeads * headDim; i += blockDim.x) {
    const int g = i / headDim;
    st<DT>(dst, ((size_t)g * cap + slot) * headDim + (i - g * headDim), src[i]);
  }
}

static const int MERGE_WARPS = 8, MERGE_HEADS = 4, MERGE_MIN_CHUNK = 8, MERGE_MAX_SPLITS = 32;

// The merge in two kernels, as split-K decode: a block per (column chunk, KV head, batch of up to
// MERGE_HEADS query heads) reads each of its V rows once for every head that shares it; a step has
// only a few hundred columns, so splitting them is what fills the SMs.
// Chunk partials: c->decodePart [split][head][headDim + 2] = unnormalised output, max (natural log
// units), sum; a chunk with nothing attended has max −∞ and sum 0. dyn (a recorded step): start
// and count from the blob.
// The split kernel's block (split, KV head g, head batch hz) as a function: one merge's
// (attn_merge_split_kernel) or one row's of a batch's (attn_merge_rows_split_kernel), the same sums.
template <int VT>
__device__ __forceinline__ void merge_split_block(float *cpart, int heads, const float *logits, int width, const void *v, int group, int headDim, int cap,
                                                  int maxSplits, int start, int count, int split, int g, int hz) {
  const int chunk = max((count + maxSplits - 1) / maxSplits, MERGE_MIN_CHUNK);
  const int j0 = split * chunk, j1 = min(count, j0 + chunk);
  if (j0 >= count) return;  // the whole block: the combine counts the same chunks
  __shared__ float smA[MERGE_WARPS][MERGE_HEADS][256], smS[MERGE_WARPS][MERGE_HEADS], smM[MERGE_HEADS];
  const int h0 = g * group + hz * MERGE_HEADS, nh = min(MERGE_HEADS, group - hz * MERGE_HEADS);
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31;
  if (warp < nh) {  // warp w: head h0 + w's max over the chunk
    const float *row = logits + (size_t)(h0 + warp) * width;
    float mx = -INFINITY;
    for (int j = j0 + lane; j < j1; j += 32) mx = fmaxf(mx, row[j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) smM[warp] = mx;
  }
  __syncthreads();
  float acc[MERGE_HEADS][8] = {}, ps[MERGE_HEADS] = {};  // head dim ≤ 256
  const size_t vbase = ((size_t)g * cap + start) * headDim;
  for (int j = j0 + warp; j < j1; j += MERGE_WARPS) {
    float vr[8];
    const size_t r = vbase + (size_t)j * headDim;
#pragma unroll
    for (int i = 0; i < 8; i++) vr[i] = lane + 32 * i < headDim ? ld<VT>(v, r + lane + 32 * i) : 0.f;
#pragma unroll
    for (int hh = 0; hh < MERGE_HEADS; hh++) {
      if (hh >= nh || smM[hh] == -INFINITY) continue;
      const float p = expf(logits[(size_t)(h0 + hh) * width + j] - smM[hh]);  // −∞ columns: 0
      ps[hh] += p;
#pragma unroll
      for (int i = 0; i < 8; i++) acc[hh][i] += p * vr[i];
    }
  }
#pragma unroll
  for (int hh = 0; hh < MERGE_HEADS; hh++) {
#pragma unroll
    for (int i = 0; i < 8; i++)
      if (lane + 32 * i < headDim) smA[warp][hh][lane + 32 * i] = acc[hh][i];
    if (lane == 0) smS[warp][hh] = ps[hh];
  }
  __syncthreads();
  for (int hh = 0; hh < nh; hh++) {
    float *o = cpart + ((size_t)split * heads + h0 + hh) * (headDim + 2);
    for (int d = t; d < headDim; d += blockDim.x) {
      float a = 0.f;
      for (int w = 0; w < MERGE_WARPS; w++) a += smA[w][hh][d];
      o[d] = a;
    }
    if (t == 0) {
      float l = 0.f;
      for (int w = 0; w < MERGE_WARPS; w++) l += smS[w][hh];
      o[headDim] = smM[hh];
      o[headDim + 1] = l;
    }
  }
}

template <int VT>
__global__ void __launch_bounds__(32 * MERGE_WARPS) attn_merge_split_kernel(float *cpart, int heads, const float *logits, int width, const void *v,
                                                                            int group, int headDim, int cap, int maxSplits, int start, int count,
                                                                            const int *dyn) {
  if (dyn) { start = dyn[0]; count = dyn[1]; }
  merge_split_block<VT>(cpart, heads, logits, width, v, group, headDim, cap, maxSplits, start, count, blockIdx.x, blockIdx.y, blockIdx.z);
}

// The combine's block for head h as a function (one merge's, or one row's of a batch's).
__device__ __forceinline__ void merge_combine_block(float *out, const float *part, const float *cpart, int heads, int headDim, int maxSplits, int count, int h) {
  const int chunk = max((count + maxSplits - 1) / maxSplits, MERGE_MIN_CHUNK), nsplit = (count + chunk - 1) / chunk;
  const int t = threadIdx.x;
  const float *pr = part + (size_t)h * (headDim + 2);
  const size_t stride = (size_t)heads * (headDim + 2);
  const float *cp = cpart + (size_t)h * (headDim + 2);
  __shared__ float wts[MERGE_MAX_SPLITS];
  float mx = pr[headDim + 1] > 0.f ? pr[headDim] : -INFINITY;  // every thread: nsplit ≤ MERGE_MAX_SPLITS reads
  for (int s = 0; s < nsplit; s++)
    if (cp[s * stride + headDim + 1] > 0.f) mx = fmaxf(mx, cp[s * stride + headDim]);
  float *o = out + (size_t)h * headDim;
  if (mx == -INFINITY) {
    for (int d = t; d < headDim; d += blockDim.x) o[d] = 0.f;
    return;
  }
  const float sw = pr[headDim + 1] > 0.f ? pr[headDim + 1] * expf(pr[headDim] - mx) : 0.f;
  float den = sw;
  for (int s = 0; s < nsplit; s++) {
    const float l = cp[s * stride + headDim + 1], w = l > 0.f ? expf(cp[s * stride + headDim] - mx) : 0.f;
    if (t == 0) wts[s] = w;
    den += l * w;
  }
  __syncthreads();
  for (int d = t; d < headDim; d += blockDim.x) {
    float a = sw * pr[d];
    for (int s = 0; s < nsplit; s++) a += cp[s * stride + d] * wts[s];
    o[d] = a / den;
  }
}

// grid (heads): out[h] = the window's partial part[h] (normalised output, max, sum) merged with
// the chunks' partials; nothing attended anywhere: 0.
__global__ void attn_merge_combine_kernel(float *out, const float *part, const float *cpart, int heads, int headDim, int maxSplits, int count,
                                          const int *dyn) {
  if (dyn) count = dyn[1];
  merge_combine_block(out, part, cpart, heads, headDim, maxSplits, count, blockIdx.x);
}

// A batched step's merges (Backend.attnMergeRows): row r of the table is one attnMerge's out, part,
// logits (at its first column) and V, its V rows' cap, start and count; its chunk partials at
// cpart + r · rowStride. The blocks of row r are those of its own attnMerge, so its sums are the same.
struct MergeRow {
  unsigned long long out, part, logits, v;
  int cap, start, count, pad;
};

template <int VT>
__global__ void __launch_bounds__(32 * MERGE_WARPS) attn_merge_rows_split_kernel(float *cpart, size_t rowStride, const MergeRow *rows, int hgroups, int heads,
                                                                                 int width, int group, int headDim, int maxSplits) {
  const int r = blockIdx.z / hgroups;
  const MergeRow m = rows[r];
  merge_split_block<VT>(cpart + r * rowStride, heads, (const float *)m.logits, width, (const void *)m.v, group, headDim, m.cap, maxSplits, m.start, m.count,
                        blockIdx.x, blockIdx.y, blockIdx.z % hgroups);
}

__global__ void attn_merge_rows_combine_kernel(const float *cpart, size_t rowStride, const MergeRow *rows, int heads, int headDim, int maxSplits) {
  const MergeRow m = rows[blockIdx.y];
  merge_combine_block((float *)m.out, (const float *)m.part, cpart + blockIdx.y * rowStride, heads, headDim, maxSplits, m.count, blockIdx.x);
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

// CMD_SPAN_ATTN_ROWS: p[0] the rows' table (PartialRow [s[8]], the step's blob when recording); s[0]
// dtype, s[1] heads, s[2] kvHeads, s[3] headDim, s[4] cap, s[5] the splits, s[6] lanes a token row,
// s[7] the plan's kernel (split MMA or split FMA); f[0] the scale in log2 units. Rows go in runs whose
// chunk partials fit the decode scratch, each run one split and one combine launch.
int hg_launch_span_attn_rows(HgCtx *c, const Cmd &m) {
  const int dt = m.s[0], heads = m.s[1], kvHeads = m.s[2], headDim = m.s[3], cap = m.s[4], splits = m.s[5], lpt = m.s[6], n = m.s[8];
  const int group = heads / kvHeads;
  const bool mma = m.s[7] == HG_ATTN_SPLIT_MMA;
  const int hgroups = (group + (mma ? DM_HEADS : DA_HEADS) - 1) / (mma ? DM_HEADS : DA_HEADS);
  const size_t rowStride = (size_t)(splits + SA_SPANS) * heads * (headDim + 2);
  const int run = (int)max((size_t)1, c->decodePartBytes / (rowStride * sizeof(float)));
  const PartialRow *rows = (const PartialRow *)m.p[0];
  const float sl = m.f[0];
  const unsigned gx = (unsigned)(splits + SA_SPANS);
  for (int r0 = 0; r0 < n; r0 += run) {
    const int nr = min(run, n - r0);
    const dim3 grid(gx, kvHeads, (unsigned)(hgroups * nr));
    int r = 0;
    if (mma) {
#define SR_MMA(T, HD) hg_launch(c, span_attn_rows_mma_kernel<T, HD>, grid, dim3(128), 0, c->decodePart, rowStride, rows + r0, hgroups, heads, group, cap, splits, sl)
      if (dt == DT_BF16) r = headDim == 64 ? SR_MMA(__nv_bfloat16, 64) : SR_MMA(__nv_bfloat16, 128);
      else r = headDim == 64 ? SR_MMA(__half, 64) : SR_MMA(__half, 128);
#undef SR_MMA
    } else {
#define SR_FMA(L) hg_launch(c, span_attn_rows_kernel<K, L>, grid, dim3(256), 0, c->decodePart, rowStride, rows + r0, hgroups, heads, group, headDim, cap, splits, sl)
      HG_DISPATCH_DT(dt, K, r = lpt == 4 ? SR_FMA(4) : lpt == 8 ? SR_FMA(8) : lpt == 16 ? SR_FMA(16) : SR_FMA(32));
#undef SR_FMA
    }
    if (r) return r;
    r = hg_launch(c, span_attn_rows_combine_kernel, dim3((unsigned)heads, (unsigned)nr), dim3(headDim >= 128 ? 128 : 64), 0, (const float *)c->decodePart,
                  rowStride, rows + r0, heads, headDim, splits);
    if (r) return r;
  }
  return 0;
}

// CMD_APPEND_ROWS: p[0] the rows' table (AppendRow [s[3]]); s[0] the windows' dtype, s[1] kvHeads, s[2] headDim, s[4] cap.
int hg_launch_window_append_rows(HgCtx *c, const Cmd &m) {
  int r = 0;
  HG_DISPATCH_DT(m.s[0], W, r = hg_launch(c, window_append_rows_kernel<W>, dim3((unsigned)m.s[3], 2), dim3(128), 0, (const AppendRow *)m.p[0], m.s[1], m.s[2], m.s[4]));
  return r;
}

// CMD_ATTN_MERGE: p[0] out, p[1] part, p[2] logits (at the first column), p[3] v; s[0] dtype,
// s[1] heads, s[2] kvHeads, s[3] headDim, s[4] cap, s[5] the logits' row width; d[0] start, d[1] count.
int hg_launch_attn_merge(HgCtx *c, const Cmd &m, const char *dynBase) {
  const int *dyn = dynBase ? (const int *)(dynBase + m.dynOff) : NULL;
  const int heads = m.s[1], kvHeads = m.s[2], headDim = m.s[3], width = m.s[5], group = heads / kvHeads;
  // Splits for the widest step the logits row allows (a recorded grid), at least MERGE_MIN_CHUNK columns each.
  const int splits = max(1, min(MERGE_MAX_SPLITS, (width + MERGE_MIN_CHUNK - 1) / MERGE_MIN_CHUNK));
  const dim3 grid((unsigned)splits, (unsigned)kvHeads, (unsigned)((group + MERGE_HEADS - 1) / MERGE_HEADS));
  int r = 0;
  HG_DISPATCH_DT(m.s[0], V, r = hg_launch(c, attn_merge_split_kernel<V>, grid, dim3(32 * MERGE_WARPS), 0, c->decodePart, heads, (const float *)m.p[2], width,
                                          m.p[3], group, headDim, m.s[4], splits, m.d[0], m.d[1], dyn));
  if (r) return r;
  return hg_launch(c, attn_merge_combine_kernel, dim3(heads), dim3(headDim >= 128 ? 128 : 64), 0, (float *)m.p[0], (const float *)m.p[1],
                   (const float *)c->decodePart, heads, headDim, splits, m.d[1], dyn);
}

// CMD_ATTN_MERGE_ROWS: p[0] the rows' table (MergeRow [s[6]], the step's blob when recording); s[0]
// dtype, s[1] heads, s[2] kvHeads, s[3] headDim, s[4] the logits rows' width, s[6] rows. Rows go in
// runs whose chunk partials fit the decode scratch, each run one split and one combine launch.
int hg_launch_attn_merge_rows(HgCtx *c, const Cmd &m) {
  const int heads = m.s[1], kvHeads = m.s[2], headDim = m.s[3], width = m.s[4], n = m.s[6], group = heads / kvHeads;
  const int splits = max(1, min(MERGE_MAX_SPLITS, (width + MERGE_MIN_CHUNK - 1) / MERGE_MIN_CHUNK)), hgroups = (group + MERGE_HEADS - 1) / MERGE_HEADS;
  const size_t rowStride = (size_t)splits * heads * (headDim + 2);
  const int run = (int)max((size_t)1, c->decodePartBytes / (rowStride * sizeof(float)));
  const MergeRow *rows = (const MergeRow *)m.p[0];
  for (int r0 = 0; r0 < n; r0 += run) {
    const int nr = min(run, n - r0);
    int r = 0;
    HG_DISPATCH_DT(m.s[0], V, r = hg_launch(c, attn_merge_rows_split_kernel<V>, dim3((unsigned)splits, (unsigned)kvHeads, (unsigned)(hgroups * nr)),
                                            dim3(32 * MERGE_WARPS), 0, c->decodePart, rowStride, rows + r0, hgroups, heads, width, group, headDim, splits));
    if (r) return r;
    r = hg_launch(c, attn_merge_rows_combine_kernel, dim3((unsigned)heads, (unsigned)nr), dim3(headDim >= 128 ? 128 : 64), 0, (const float *)c->decodePart,
                  rowStride, rows + r0, heads, headDim, splits);
    if (r) return r;
  }
  return 0;
}

// The plan of an attnPartial on these pointers.
static HgPlan sa_plan(HgCtx *c, const void *q, const void *k, const void *v, int dt, int headDim) {
  const bool aligned = (((uintptr_t)k | (uintptr_t)v) & 15) == 0;
  HgPlanShape shape = {HG_PLAN_ATTN, dt, 0, 0, 0, 0, headDim, aligned, ((uintptr_t)q & 15) == 0};
  return hg_decode_plan(hg_plan_device(c), shape);
}

// Splits as hg_cu_attn_decode's (the plan's chunk blocks an SM, bounded by the `bound` tokens and the
// partials' space, which also holds a chunk more per span); 0 where the space holds none.
static long sa_splits(const HgCtx *c, const HgPlan &plan, int heads, int kvHeads, int headDim, int bound) {
  const bool mma = plan.kernel == HG_ATTN_SPLIT_MMA;
  const int blocksPer = plan.kernel == HG_ATTN_FLASH ? heads : kvHeads * ((heads / kvHeads + (mma ? DM_HEADS : DA_HEADS) - 1) / (mma ? DM_HEADS : DA_HEADS));
  long splits = ((long)(plan.kernel == HG_ATTN_FLASH ? 4 : plan.chunkSplitsPerSm) * c->numSMs + blocksPer - 1) / blocksPer;
  const long byLength = (bound + DA_MIN_CHUNK - 1) / DA_MIN_CHUNK;
  const long bySpace = (long)(c->decodePartBytes / ((size_t)heads * (headDim + 2) * sizeof(float))) - SA_SPANS;
  if (bySpace < 1) return 0;
  if (splits > byLength) splits = byLength;
  if (splits > bySpace) splits = bySpace;
  if (splits < 1) splits = 1;
  return splits;
}

extern "C" {

// n merges of one shape at once (a batched step's rows, Backend.attnMergeRows): rows holds 7 doubles
// a row — out, part, logits (at the first column; rows `width` floats apart), V [kvHeads, cap,
// headDim] of dtype dt, cap, start, count — checked by the caller; each row as hg_cu_attn_merge
// would compute it. Recordable (the rows go with the step's blob).
HG_EXPORT int hg_cu_attn_merge_rows(HgCtx *c, const double *rows, int n, int dt, int heads, int kvHeads, int headDim, int width) {
  if (n < 1 || n > 4096 || headDim > 256 || kvHeads < 1 || heads % kvHeads != 0 || width < 1 || !rows) return (int)cudaErrorInvalidValue;
  MergeRow *t = (MergeRow *)calloc((size_t)n, sizeof(MergeRow));
  if (!t) return (int)cudaErrorMemoryAllocation;
  for (int i = 0; i < n; i++) {
    const double *r = rows + 7 * i;
    if (!r[0] || !r[1] || !r[2] || !r[3] || r[4] < 1 || r[5] < 0 || r[6] < 0 || r[5] + r[6] > r[4]) {
      free(t);
      return (int)cudaErrorInvalidValue;
    }
    t[i] = MergeRow{(unsigned long long)r[0], (unsigned long long)r[1], (unsigned long long)r[2], (unsigned long long)r[3], (int)r[4], (int)r[5], (int)r[6], 0};
  }
  int e = hg_flush_copies(c);
  int *dev = NULL;
  if (!e) e = hg_upload_ints(c, (const int *)t, (size_t)n * sizeof(MergeRow) / sizeof(int), &dev);
  free(t);
  if (e) return e;
  Cmd m = hg_new_cmd(CMD_ATTN_MERGE_ROWS);
  m.p[0] = dev;
  m.s[0] = dt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = width; m.s[6] = n;
  return hg_submit(c, m);
}

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
  const HgPlan plan = sa_plan(c, q, k, v, dt, headDim);
  const long splits = sa_splits(c, plan, heads, kvHeads, headDim, hg_recording(c) ? cap : total);
  if (splits < 1) return (int)cudaErrorInvalidValue;
  int *dev = NULL;
  int e = hg_upload_ints(c, tab, 2 * SA_SPANS, &dev);
  if (e) return e;
  Cmd m = hg_new_cmd(CMD_SPAN_ATTN);
  m.p[0] = part; m.p[1] = q; m.p[2] = k; m.p[3] = v; m.p[4] = dev;
  m.s[0] = dt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = cap; m.s[5] = (int)splits; m.s[6] = plan.lanes; m.s[7] = plan.kernel;
  m.f[0] = scale * 1.4426950408889634f;  // scores in log2 units: exp(x) = exp2(x·log2 e)
  return hg_submit(c, m);
}

// n attnPartials of one shape at once (a batched step's rows, Backend.attnPartialRows): rows holds 12
// doubles a row — part, q, K, V (addresses), then the spans table's 4 (start, count) pairs (unused:
// count 0) — checked by the caller; each row as hg_cu_attn_partial computes it. Recorded, the rows go
// with the step's blob as one op (the splits cut for the capacity, as a recorded attnPartial's); eager,
// or on the plain warp block, each row is its own attnPartial.
HG_EXPORT int hg_cu_attn_partial_rows(HgCtx *c, const double *rows, int n, int dt, int heads, int kvHeads, int headDim, int cap, float scale) {
  if (n < 1 || n > 4096 || !rows || headDim > 256 || kvHeads < 1 || heads % kvHeads != 0) return (int)cudaErrorInvalidValue;
  HG_FLUSH_REC(c);
  PartialRow *t = (PartialRow *)calloc((size_t)n, sizeof(PartialRow));
  if (!t) return (int)cudaErrorMemoryAllocation;
  bool aligned = true, qAligned = true;
  for (int i = 0; i < n; i++) {
    const double *r = rows + 12 * i;
    t[i].part = (unsigned long long)r[0]; t[i].q = (unsigned long long)r[1]; t[i].k = (unsigned long long)r[2]; t[i].v = (unsigned long long)r[3];
    for (int j = 0; j < 2 * SA_SPANS; j++) t[i].tab[j] = (int)r[4 + j];
    if (!t[i].part || !t[i].q || !t[i].k || !t[i].v) { free(t); return (int)cudaErrorInvalidValue; }
    aligned = aligned && ((t[i].k | t[i].v) & 15) == 0;
    qAligned = qAligned && (t[i].q & 15) == 0;
  }
  HgPlanShape shape = {HG_PLAN_ATTN, dt, 0, 0, 0, 0, headDim, aligned, qAligned};
  const HgPlan plan = hg_decode_plan(hg_plan_device(c), shape);
  const long splits = sa_splits(c, plan, heads, kvHeads, headDim, cap);
  int *dev = NULL;
  int e = 0;
  if (hg_recording(c) && plan.kernel != HG_ATTN_FLASH && splits >= 1) e = hg_upload_ints(c, (const int *)t, (size_t)n * sizeof(PartialRow) / sizeof(int), &dev);
  // Eager (a blob that filled up drained the step), or the plain warp block: each row its own attnPartial.
  if (!e && (!hg_recording(c) || plan.kernel == HG_ATTN_FLASH || splits < 1)) {
    for (int i = 0; i < n && !e; i++)
      e = hg_cu_attn_partial(c, (float *)t[i].part, (const float *)t[i].q, (const void *)t[i].k, (const void *)t[i].v, dt, heads, kvHeads, headDim, cap, t[i].tab, SA_SPANS, scale);
    free(t);
    return e;
  }
  free(t);
  if (e) return e;
  Cmd m = hg_new_cmd(CMD_SPAN_ATTN_ROWS);
  m.p[0] = dev;
  m.s[0] = dt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = cap; m.s[5] = (int)splits; m.s[6] = plan.lanes; m.s[7] = plan.kernel; m.s[8] = n;
  m.f[0] = scale * 1.4426950408889634f;
  return hg_submit(c, m);
}

// n K/V appends at once (a batched step's rows, Backend.appendKvRows): rows holds 5 doubles a row — the
// window K and V [kvHeads, cap, headDim] of dtype dt, the new K and V [kvHeads, headDim] f32 (addresses),
// the slot — checked by the caller. Recordable (the rows go with the step's blob).
HG_EXPORT int hg_cu_window_append_rows(HgCtx *c, const double *rows, int n, int dt, int kvHeads, int headDim, int cap) {
  if (n < 1 || n > 4096 || !rows || kvHeads < 1 || headDim < 1 || cap < 1) return (int)cudaErrorInvalidValue;
  AppendRow *t = (AppendRow *)calloc((size_t)n, sizeof(AppendRow));
  if (!t) return (int)cudaErrorMemoryAllocation;
  for (int i = 0; i < n; i++) {
    const double *r = rows + 5 * i;
    t[i] = AppendRow{(unsigned long long)r[0], (unsigned long long)r[1], (unsigned long long)r[2], (unsigned long long)r[3], (int)r[4], {0, 0, 0}};
    if (!t[i].k || !t[i].v || !t[i].kNew || !t[i].vNew || t[i].slot < 0 || t[i].slot >= cap) { free(t); return (int)cudaErrorInvalidValue; }
  }
  int e = hg_flush_copies(c);
  int *dev = NULL;
  if (!e) e = hg_upload_ints(c, (const int *)t, (size_t)n * sizeof(AppendRow) / sizeof(int), &dev);
  free(t);
  if (e) return e;
  Cmd m = hg_new_cmd(CMD_APPEND_ROWS);
  m.p[0] = dev;
  m.s[0] = dt; m.s[1] = kvHeads; m.s[2] = headDim; m.s[3] = n; m.s[4] = cap;
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
