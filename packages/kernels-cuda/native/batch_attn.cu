// The attention half of a batched decode step in three launches for all B rows: each row (its
// own sequence) appends its new K/V row to its own cache, then split-K decode attention of its
// query over its own cached span, then the merge of the splits. A per-call table (cache
// addresses, capacity, the slot written, span start and length per row) is uploaded with the
// step's blob when the step is recorded (so the captured graph serves every step: only the
// table's contents change), or through the int scratch when eager. The split-K kernel follows
// decode_attn.cu's (one query row per block group, online softmax in log2 units, K and V read
// once; the block body is decode_attn_block.cuh's); here blockIdx.z also picks the row.
#include "decode_attn_block.cuh"

// One row of the table: 8 ints (TypeScript writes the addresses as two 32-bit halves).
struct BatchAttnRow {
  unsigned long long k, v;  // K and V caches [kvHeads, cap, headDim]
  int cap, slot;            // capacity; the slot the row's new K/V goes to
  int start, count;         // attended slots start .. start + count - 1
};
static_assert(sizeof(BatchAttnRow) == 8 * sizeof(int), "table rows are 8 ints");

// The block body, chunk length and merge are decode_attn_block.cuh's (batched rows use the
// default minimum chunk).

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
  constexpr int ES = KT == DT_F32 ? 4 : 2;
  hg_pdl_trigger();
  hg_pdl_wait();
  const int row = blockIdx.z / zGroups, zg = blockIdx.z % zGroups;
  const BatchAttnRow r = tab[row];
  const int count = r.count, cap = r.cap, start = r.start;
  const int chunk = da_chunk(count, maxSplits);
  const int split = blockIdx.x;
  if (split * chunk >= count) return;  // the whole block, before any barrier
  const int g = blockIdx.y, h0 = g * group + zg * DA_HEADS;
  const int nh = min(DA_HEADS, group - zg * DA_HEADS);
  const size_t rowBytes = (size_t)headDim * ES;
  const size_t cacheRow = ((size_t)g * cap + start) * rowBytes;
  const int j0 = split * chunk, j1 = min(count, j0 + chunk);
  da_block<KT, LPT, UNR, false>(part + (((size_t)row * maxSplits + split) * heads + h0) * (headDim + 2), q + (size_t)row * heads * headDim + (size_t)h0 * headDim,
                                (const char *)r.k + cacheRow, (const char *)r.v + cacheRow, nh, headDim, j0, j1, sl);
}

// grid (heads, B): out[row, h, :] = Σ_split e^(m_s − M) a_s / Σ_split e^(m_s − M) l_s.
__global__ void batch_attn_merge_kernel(float *out, const float *part, const BatchAttnRow *tab, int heads, int headDim, int maxSplits) {
  hg_pdl_trigger();
  hg_pdl_wait();
  const int row = blockIdx.y, h = blockIdx.x;
  const int count = tab[row].count;
  const int chunk = da_chunk(count, maxSplits);
  const int nsplit = (count + chunk - 1) / chunk;
  const size_t stride = (size_t)heads * (headDim + 2);
  const float *p = part + (size_t)row * maxSplits * stride + (size_t)h * (headDim + 2);
  da_merge_head(out + ((size_t)row * heads + h) * headDim, p, stride, nsplit, headDim, threadIdx.x, blockDim.x);
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
  const int group = heads / kvHeads, zGroups = (group + DA_HEADS - 1) / DA_HEADS;
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
  const int lpt = da_lanes(dt, headDim);
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
  const int zGroups = (heads / kvHeads + DA_HEADS - 1) / DA_HEADS;
  const int bound = hg_recording(c) ? maxCap : maxCount;
  long splits = (4L * c->numSMs + (long)kvHeads * zGroups * B - 1) / ((long)kvHeads * zGroups * B);
  const long byLength = (bound + DA_MIN_CHUNK - 1) / DA_MIN_CHUNK;
  const long bySpace = (long)(c->decodePartBytes / ((size_t)B * heads * (headDim + 2) * sizeof(float)));
  if (splits > byLength) splits = byLength;
  if (splits > bySpace) splits = bySpace;
  if (splits < 1) return (int)cudaErrorInvalidValue;
  Cmd m = hg_new_cmd(CMD_BATCH_ATTN);
  m.p[0] = out; m.p[1] = q; m.p[2] = kNew; m.p[3] = vNew; m.p[4] = dev;
  m.s[0] = dt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = B; m.s[5] = (int)splits; m.s[6] = lpt;
  m.s[7] = 2;  // 2 rows a round: 4 measured slower at B = 8 (DEVICE-NOTES.md)
  m.f[0] = scale * 1.4426950408889634f;  // scores in log2 units
  return hg_submit(c, m);
}

}  // extern "C"
