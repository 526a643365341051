// Decode attention in two kernels (split-K "flash decoding"): one query row over the cached
// span [start, start + count) of K/V [kvHeads, cap, headDim]. The first kernel splits the span
// into chunks; a block scores its chunk for the query heads of one KV head and keeps an online
// softmax (running max, sum, unnormalised output) per head, so K and V are read once and no
// score row is written (decode_attn_block.cuh). The second kernel merges the chunks' partials
// into the output row. Which block runs (tensor cores for bf16/f16 caches with head dim 64 or 128,
// decode_attn_mma.cuh; the FMA block elsewhere) and the grid: hg_decode_plan (decode_plan.h).
// This replaces logits + softmax + memset + aggregate (4 launches a layer) and the score row's
// round trips; recorded in a decode-step graph, start and count come from the step's blob.
#include "decode_attn_block.cuh"
#include "decode_attn_mma.cuh"

// grid (maxSplits, kvHeads, head groups of DA_HEADS). part: [split][head][headDim + 2] =
// unnormalised output, then max (log2), sum. UNR: token rows a lane loads per round; GROUP: a
// round's rows folded in together. The step's start and count are read before the
// wait: the blob is copied before the step's first kernel, so the blocks past the span (a recorded
// grid is sized for the capacity) leave at once instead of holding a slot until the kernel before
// has finished.
template <int KT, int LPT, int UNR, bool GROUP>
__global__ void __launch_bounds__(256) decode_attn_kernel(float *part, const float *q, const void *k, const void *v, int heads, int group, int headDim,
                                                          int cap, int maxSplits, int start, int count, float sl, const int *dyn) {
  constexpr int ES = KT == DT_F32 ? 4 : 2;
  if (dyn) { start = dyn[0]; count = dyn[1]; }
  const int chunk = da_chunk(count, maxSplits);
  const int split = blockIdx.x;
  if (split * chunk >= count) return;  // the whole block, before any barrier (the blocks that stay wait: completion stays transitive)
  hg_pdl_wait();  // programmatic launch (common.cuh): q and the K/V append come from the kernels before
  const int g = blockIdx.y, h0 = g * group + blockIdx.z * DA_HEADS;
  const size_t rowBytes = (size_t)headDim * ES;
  const int nh = min(DA_HEADS, group - (int)blockIdx.z * DA_HEADS);
  const size_t cacheRow = ((size_t)g * cap + start) * rowBytes;
  const int j0 = split * chunk, j1 = min(count, j0 + chunk);
  da_block<KT, LPT, UNR, true, GROUP>(part + ((size_t)split * heads + h0) * (headDim + 2), q + (size_t)h0 * headDim, (const char *)k + cacheRow,
                               (const char *)v + cacheRow, nh, headDim, j0, j1, sl);
}

// The tensor-core form: grid (maxSplits, kvHeads, head groups of DM_HEADS), 128 threads; the same
// chunks and partial rows as decode_attn_kernel, so the merge is shared. AHEAD: each warp's next
// tile loaded while it computes one (dm_block).
template <typename T, int HD, bool AHEAD>
__global__ void __launch_bounds__(128) decode_attn_mma_kernel(float *part, const float *q, const void *k, const void *v, int heads, int group, int cap,
                                                              int maxSplits, int start, int count, float sl, const int *dyn) {
  if (dyn) { start = dyn[0]; count = dyn[1]; }
  const int chunk = da_chunk(count, maxSplits);
  const int split = blockIdx.x;
  if (split * chunk >= count) return;  // as decode_attn_kernel: before the wait and any barrier
  hg_pdl_wait();
  const int g = blockIdx.y, h0 = g * group + blockIdx.z * DM_HEADS;
  const int nh = min(DM_HEADS, group - (int)blockIdx.z * DM_HEADS);
  const size_t cacheRow = ((size_t)g * cap + start) * HD * 2;
  const int j0 = split * chunk, j1 = min(count, j0 + chunk);
  dm_block<T, HD, true, AHEAD>(part + ((size_t)split * heads + h0) * (HD + 2), q + (size_t)h0 * HD, (const char *)k + cacheRow, (const char *)v + cacheRow, nh,
                        j0, j1, sl);
}

template <typename T>
static int launch_dm(HgCtx *c, int headDim, dim3 grid, const float *q, const void *k, const void *v, int heads, int group, int cap, int maxSplits,
                     int start, int count, float sl, const int *dyn) {
#define DM_LAUNCH(HD) \
  return hg_launch_pdl(c, true, decode_attn_mma_kernel<T, HD, true>, grid, dim3(128), 0, c->decodePart, q, k, v, heads, group, cap, maxSplits, start, count, sl, dyn)
  if (headDim == 64) DM_LAUNCH(64);
  DM_LAUNCH(128);
#undef DM_LAUNCH
}

// grid (heads): out[h, :] = Σ_split e^(m_s − M) a_s / Σ_split e^(m_s − M) l_s.
__global__ void decode_attn_merge_kernel(float *out, const float *part, int heads, int headDim, int maxSplits, int count, const int *dyn) {
  hg_pdl_trigger();
  if (dyn) count = dyn[1];  // the blob: before the wait (see decode_attn_kernel)
  hg_pdl_wait();
  const int chunk = da_chunk(count, maxSplits);
  const int nsplit = (count + chunk - 1) / chunk;
  const int h = blockIdx.x;
  da_merge_head(out + (size_t)h * headDim, part + (size_t)h * (headDim + 2), (size_t)heads * (headDim + 2), nsplit, headDim, threadIdx.x, blockDim.x);
}

Cmd hg_new_cmd(int kind);                       // rowops.cu
int hg_put_dyn(HgCtx *c, Cmd &cmd, int count);  // rowops.cu

template <int KT, int UNR, bool GROUP>
static int launch_da_l(HgCtx *c, int lpt, dim3 grid, const float *q, const void *k, const void *v, int heads, int group, int headDim, int cap, int maxSplits,
                       int start, int count, float sl, const int *dyn) {
  switch (lpt) {
#define DA_CASE(L) \
  case L: return hg_launch_pdl(c, true, decode_attn_kernel<KT, L, UNR, GROUP>, grid, dim3(256), 0, c->decodePart, q, k, v, heads, group, headDim, cap, maxSplits, start, count, sl, dyn);
    DA_CASE(4) DA_CASE(8) DA_CASE(16)
#undef DA_CASE
    default:
      return hg_launch_pdl(c, true, decode_attn_kernel<KT, 32, UNR, GROUP>, grid, dim3(256), 0, c->decodePart, q, k, v, heads, group, headDim, cap, maxSplits, start, count, sl, dyn);
  }
}
// Command: s[5] the grid's splits, s[11] the splits the chunks are cut for (≤ s[5]; the grid's
// other blocks leave at once), s[6] lanes a token row, s[8] the plan's kernel (HG_ATTN_SPLIT or
// HG_ATTN_SPLIT_MMA). The FMA block loads 4 token rows a lane a round and folds them in together.
int hg_launch_decode_attn(HgCtx *c, const Cmd &m, const char *dynBase) {
  const int dt = m.s[0], heads = m.s[1], kvHeads = m.s[2], headDim = m.s[3], cap = m.s[4], gridSplits = m.s[5], lpt = m.s[6];
  const int maxSplits = m.s[11];
  const int group = heads / kvHeads;
  const int *dyn = dynBase ? (const int *)(dynBase + m.dynOff) : NULL;
  const float *q = (const float *)m.p[1];
  int r = 0;
  if (m.s[8] == HG_ATTN_SPLIT_MMA) {
    const dim3 grid((unsigned)gridSplits, kvHeads, (group + DM_HEADS - 1) / DM_HEADS);
    r = dt == DT_BF16 ? launch_dm<__nv_bfloat16>(c, headDim, grid, q, m.p[2], m.p[3], heads, group, cap, maxSplits, m.d[0], m.d[1], m.f[0], dyn)
                      : launch_dm<__half>(c, headDim, grid, q, m.p[2], m.p[3], heads, group, cap, maxSplits, m.d[0], m.d[1], m.f[0], dyn);
  } else {
    const dim3 grid((unsigned)gridSplits, kvHeads, (group + DA_HEADS - 1) / DA_HEADS);
    HG_DISPATCH_DT(dt, K, r = (launch_da_l<K, 4, true>(c, lpt, grid, q, m.p[2], m.p[3], heads, group, headDim, cap, maxSplits, m.d[0], m.d[1], m.f[0], dyn)));
  }
  if (r) return r;
  // Both kernels launched programmatically (they wait before they read), so the merge and then the
  // weight stream after it (o_proj) are scheduled as the split kernel's blocks drain.
  return hg_launch_pdl(c, true, decode_attn_merge_kernel, dim3(heads), dim3(headDim >= 128 ? 128 : 64), 0, (float *)m.p[0],
                       (const float *)c->decodePart, heads, headDim, maxSplits, m.d[1], dyn);
}

extern "C" {

HG_EXPORT int hg_cu_attn_causal(HgCtx *c, float *out, const float *q, int rowStride, const void *k, const void *v, int dt, int heads, int kvHeads,
                                int headDim, int cap, int start, int firstPos, int n, float scale);

// 1 when hg_cu_attn_decode runs the split-K kernels for this dtype/head dim (else the flash kernel).
HG_EXPORT int hg_cu_attn_decode_path(int dt, int headDim) { return da_lanes(dt, headDim) ? 1 : 0; }

// One query row (position firstPos) over slots start .. start + firstPos of K/V [kvHeads, cap,
// headDim]; out/q: heads·headDim f32. Recordable in a decode step (start and length per step).
HG_EXPORT int hg_cu_attn_decode(HgCtx *c, float *out, const float *q, const void *k, const void *v, int dt, int heads, int kvHeads, int headDim,
                                int cap, int start, int firstPos, float scale) {
  const int count = firstPos + 1;
  const bool aligned = (((uintptr_t)k | (uintptr_t)v) & 15) == 0;
  HgPlanShape shape = {HG_PLAN_ATTN, dt, 0, 0, 0, 0, headDim, aligned, ((uintptr_t)q & 15) == 0};
  const HgPlan plan = hg_decode_plan(hg_plan_device(c), shape);
  const bool mma = plan.kernel == HG_ATTN_SPLIT_MMA;
  // Splits: the plan's blocks an SM, bounded by the span and the partials' space; a recorded step
  // sizes the grid for the capacity (blocks past the span return at once).
  const int zGroups = (heads / kvHeads + (mma ? DM_HEADS : DA_HEADS) - 1) / (mma ? DM_HEADS : DA_HEADS);
  const int bound = hg_recording(c) ? cap : count;
  const long byLength = (bound + DA_MIN_CHUNK - 1) / DA_MIN_CHUNK;
  const long bySpace = (long)(c->decodePartBytes / ((size_t)heads * (headDim + 2) * sizeof(float)));
  auto splitsFor = [&](long perSM) {
    long s = (perSM * c->numSMs + (long)kvHeads * zGroups - 1) / ((long)kvHeads * zGroups);
    if (s > byLength) s = byLength;
    if (s > bySpace) s = bySpace;
    return s;
  };
  const long splits = splitsFor(plan.splitsPerSm);
  const long chunkSplits = splitsFor(plan.chunkSplitsPerSm);
  if (plan.kernel == HG_ATTN_FLASH || splits < 1) return hg_cu_attn_causal(c, out, q, heads * headDim, k, v, dt, heads, kvHeads, headDim, cap, start, firstPos, 1, scale);
  HG_FLUSH_REC(c);
  Cmd m = hg_new_cmd(CMD_DECODE_ATTN);
  m.p[0] = out; m.p[1] = q; m.p[2] = k; m.p[3] = v;
  m.s[0] = dt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = cap; m.s[5] = (int)splits; m.s[6] = plan.lanes;
  m.s[8] = plan.kernel;
  m.s[11] = (int)chunkSplits;
  m.f[0] = scale * 1.4426950408889634f;  // scores in log2 units: exp(x) = exp2(x·log2 e)
  m.d[0] = start; m.d[1] = count;
  int r = hg_put_dyn(c, m, 2);
  return r ? r : hg_submit(c, m);
}

}  // extern "C"
