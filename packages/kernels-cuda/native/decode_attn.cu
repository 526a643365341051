// Decode attention in two kernels (split-K "flash decoding"): one query row over the cached
// span [start, start + count) of K/V [kvHeads, cap, headDim]. The first kernel splits the span
// into chunks; a block scores its chunk for the query heads of one KV head and keeps an online
// softmax (running max, sum, unnormalised output) per head, so K and V are read once and no
// score row is written (decode_attn_block.cuh). The second kernel merges the chunks' partials
// into the output row, or (the attnMergeInKernel switch) the split kernel's last block does.
// This replaces logits + softmax + memset + aggregate (4 launches a layer) and the score row's
// round trips; recorded in a decode-step graph, start and count come from the step's blob.
#include "decode_attn_block.cuh"

// grid (maxSplits, kvHeads, head groups of DA_HEADS). part: [split][head][headDim + 2] =
// unnormalised output, then max (log2), sum. MERGE (the attnMergeInKernel switch): the last
// block of each (KV head, head group) to finish, by an atomic ticket, merges the group's
// partials into out itself (same order and arithmetic as the merge kernel, so the same bits),
// and the merge kernel's launch goes away. tickets: one int per (KV head, head group), zero
// between launches (the merging block resets its own).
// ASYNC (the attnAsyncCopy switch): K/V tiles arrive by cp.async in DA_STAGES shared-memory
// stages (dynamic shared memory, da_async_smem(UNR) bytes; decode_attn_block.cuh).
template <int KT, int LPT, int UNR, bool MERGE, bool ASYNC>
__global__ void __launch_bounds__(256) decode_attn_kernel(float *part, float *out, int *tickets, const float *q, const void *k, const void *v, int heads,
                                                          int group, int headDim, int cap, int maxSplits, int minChunk, int start, int count, float sl,
                                                          const int *dyn) {
  constexpr int ES = KT == DT_F32 ? 4 : 2;
  hg_pdl_wait();  // programmatic launch (common.cuh): q and the K/V append come from the kernels before
  if (dyn) { start = dyn[0]; count = dyn[1]; }
  const int chunk = da_chunk(count, maxSplits, minChunk);
  const int split = blockIdx.x;
  if (split * chunk >= count) return;  // the whole block, before any barrier
  const int g = blockIdx.y, h0 = g * group + blockIdx.z * DA_HEADS;
  const size_t rowBytes = (size_t)headDim * ES;
  const int nh = min(DA_HEADS, group - (int)blockIdx.z * DA_HEADS);
  const size_t cacheRow = ((size_t)g * cap + start) * rowBytes;
  const int j0 = split * chunk, j1 = min(count, j0 + chunk);
  extern __shared__ __align__(16) char daStage[];
  da_block<KT, LPT, UNR, true, ASYNC>(part + ((size_t)split * heads + h0) * (headDim + 2), q + (size_t)h0 * headDim, (const char *)k + cacheRow,
                                      (const char *)v + cacheRow, nh, headDim, j0, j1, sl, daStage);
  if (!MERGE) return;
  __shared__ int isLast;
  __threadfence();  // this block's partials are visible device-wide before its ticket
  __syncthreads();
  const int nsplit = (count + chunk - 1) / chunk;
  int *ticket = tickets + blockIdx.y * gridDim.z + blockIdx.z;
  if (threadIdx.x == 0) {
    const int t = atomicAdd(ticket, 1);
    isLast = t == nsplit - 1;
    if (isLast) *ticket = 0;  // ready for the next launch (stream order publishes it)
  }
  __syncthreads();
  if (!isLast) return;
  __threadfence();
  const size_t stride = (size_t)heads * (headDim + 2);
  for (int h = 0; h < nh; h++)
    da_merge_head<true>(out + (size_t)(h0 + h) * headDim, part + (size_t)(h0 + h) * (headDim + 2), stride, nsplit, headDim, threadIdx.x, blockDim.x);
}

// grid (heads): out[h, :] = Σ_split e^(m_s − M) a_s / Σ_split e^(m_s − M) l_s.
__global__ void decode_attn_merge_kernel(float *out, const float *part, int heads, int headDim, int maxSplits, int minChunk, int count, const int *dyn) {
  hg_pdl_trigger();
  hg_pdl_wait();
  if (dyn) count = dyn[1];
  const int chunk = da_chunk(count, maxSplits, minChunk);
  const int nsplit = (count + chunk - 1) / chunk;
  const int h = blockIdx.x;
  da_merge_head<false>(out + (size_t)h * headDim, part + (size_t)h * (headDim + 2), (size_t)heads * (headDim + 2), nsplit, headDim, threadIdx.x, blockDim.x);
}

// The merge-in-kernel tickets: in the context's misc area, past the argmax result.
static const size_t DA_TICKET_OFFSET = 4096, DA_MAX_TICKETS = 4096;
static int *da_tickets(HgCtx *c) { return (int *)((char *)c->argmaxOut + DA_TICKET_OFFSET); }
int hg_decode_attn_reset_tickets(HgCtx *c) { return (int)cudaMemsetAsync(da_tickets(c), 0, DA_MAX_TICKETS * sizeof(int), c->compute); }

// The split kernel's arguments, as hg_launch_decode_attn reads them from the command.
struct DaLaunch {
  dim3 grid;
  float *part, *out;
  int *tickets;
  const float *q;
  const void *k, *v;
  int heads, group, headDim, cap, maxSplits, minChunk, start, count;
  float sl;
  const int *dyn;
};

template <int KT, int LPT, int UNR, bool MERGE, bool ASYNC>
static int launch_da_k(HgCtx *c, const DaLaunch &a) {
  return hg_launch(c, decode_attn_kernel<KT, LPT, UNR, MERGE, ASYNC>, a.grid, dim3(256), ASYNC ? da_async_smem(UNR) : 0, a.part, a.out, a.tickets, a.q, a.k,
                   a.v, a.heads, a.group, a.headDim, a.cap, a.maxSplits, a.minChunk, a.start, a.count, a.sl, a.dyn);
}

template <int KT, int UNR, bool MERGE, bool ASYNC>
static int launch_da_u(HgCtx *c, int lpt, const DaLaunch &a) {
  switch (lpt) {
    case 4: return launch_da_k<KT, 4, UNR, MERGE, ASYNC>(c, a);
    case 8: return launch_da_k<KT, 8, UNR, MERGE, ASYNC>(c, a);
    case 16: return launch_da_k<KT, 16, UNR, MERGE, ASYNC>(c, a);
    default: return launch_da_k<KT, 32, UNR, MERGE, ASYNC>(c, a);
  }
}

// unr: token rows a lane loads per round (K and V each), 2 or 4 (the attnUnroll switch); the
// cp.async form takes 2 (4 would need 96 KB of stages: one block an SM).
template <int KT, bool MERGE>
static int launch_da(HgCtx *c, int lpt, int unr, bool async, const DaLaunch &a) {
  if (async) return launch_da_u<KT, 2, MERGE, true>(c, lpt, a);
  if (unr == 4) return launch_da_u<KT, 4, MERGE, false>(c, lpt, a);
  return launch_da_u<KT, 2, MERGE, false>(c, lpt, a);
}

// The cp.async form's stages exceed the default 48 KB of shared memory a block (with the
// block's static 33 KB): opted into per kernel instance when the switch turns on.
template <int KT, bool MERGE>
static int da_allow_async_kt(void) {
  const void *fns[4] = {(const void *)decode_attn_kernel<KT, 4, 2, MERGE, true>, (const void *)decode_attn_kernel<KT, 8, 2, MERGE, true>,
                        (const void *)decode_attn_kernel<KT, 16, 2, MERGE, true>, (const void *)decode_attn_kernel<KT, 32, 2, MERGE, true>};
  for (const void *f : fns) {
    const cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)da_async_smem(2));
    if (e != cudaSuccess) return (int)e;
  }
  return 0;
}
int hg_decode_attn_allow_async(void) {
  int r = da_allow_async_kt<DT_F32, false>();
  if (!r) r = da_allow_async_kt<DT_F32, true>();
  if (!r) r = da_allow_async_kt<DT_F16, false>();
  if (!r) r = da_allow_async_kt<DT_F16, true>();
  if (!r) r = da_allow_async_kt<DT_BF16, false>();
  if (!r) r = da_allow_async_kt<DT_BF16, true>();
  return r;
}

// Command: s[5] maxSplits, s[6] lanes a token row, s[7] unroll, s[8] merge in the split kernel,
// s[9] the chunks' minimum length (tokens), s[10] K/V by cp.async.
int hg_launch_decode_attn(HgCtx *c, const Cmd &m, const char *dynBase) {
  DaLaunch a;
  const int dt = m.s[0], kvHeads = m.s[2], lpt = m.s[6], unr = m.s[7];
  const bool merge = m.s[8] != 0, async = m.s[10] != 0;
  a.out = (float *)m.p[0];
  a.q = (const float *)m.p[1];
  a.k = m.p[2]; a.v = m.p[3];
  a.part = c->decodePart;
  a.tickets = da_tickets(c);
  a.heads = m.s[1]; a.headDim = m.s[3]; a.cap = m.s[4]; a.maxSplits = m.s[5]; a.minChunk = m.s[9];
  a.group = a.heads / kvHeads;
  a.start = m.d[0]; a.count = m.d[1]; a.sl = m.f[0];
  a.dyn = dynBase ? (const int *)(dynBase + m.dynOff) : NULL;
  a.grid = dim3((unsigned)a.maxSplits, kvHeads, (a.group + DA_HEADS - 1) / DA_HEADS);
  int r = 0;
  if (merge) {
    HG_DISPATCH_DT(dt, K, r = (launch_da<K, true>(c, lpt, unr, async, a)));
    return r;
  }
  HG_DISPATCH_DT(dt, K, r = (launch_da<K, false>(c, lpt, unr, async, a)));
  if (r) return r;
  return hg_launch(c, decode_attn_merge_kernel, dim3(a.heads), dim3(a.headDim >= 128 ? 128 : 64), 0, a.out, (const float *)a.part, a.heads, a.headDim,
                   a.maxSplits, a.minChunk, a.count, a.dyn);
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
  const int minChunk = c->attnMinChunk;
  long splits = (4L * c->numSMs + (long)kvHeads * zGroups - 1) / ((long)kvHeads * zGroups);
  const long byLength = (bound + minChunk - 1) / minChunk;
  const long bySpace = (long)(c->decodePartBytes / ((size_t)heads * (headDim + 2) * sizeof(float)));
  if (splits > byLength) splits = byLength;
  if (splits > bySpace) splits = bySpace;
  const bool aligned = (((uintptr_t)k | (uintptr_t)v) & 15) == 0;
  if (!lpt || !aligned || splits < 1) return hg_cu_attn_causal(c, out, q, heads * headDim, k, v, dt, heads, kvHeads, headDim, cap, start, firstPos, 1, scale);
  // Merging in the split kernel takes a ticket per (KV head, head group).
  const bool merge = c->attnMergeInKernel && (long)kvHeads * zGroups <= (long)DA_MAX_TICKETS;
  HG_FLUSH_REC(c);
  Cmd m = hg_new_cmd(CMD_DECODE_ATTN);
  m.p[0] = out; m.p[1] = q; m.p[2] = k; m.p[3] = v;
  m.s[0] = dt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = cap; m.s[5] = (int)splits; m.s[6] = lpt; m.s[7] = c->attnUnroll;
  m.s[8] = merge ? 1 : 0; m.s[9] = minChunk; m.s[10] = c->attnAsyncCopy ? 1 : 0;
  m.f[0] = scale * 1.4426950408889634f;  // scores in log2 units: exp(x) = exp2(x·log2 e)
  m.d[0] = start; m.d[1] = count;
  int r = hg_put_dyn(c, m, 2);
  return r ? r : hg_submit(c, m);
}

}  // extern "C"
