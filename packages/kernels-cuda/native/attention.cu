// Attention stages for hybrid attention: logits of a query row over a span (or a set of
// slots) of cached K, written at a column offset so segments concatenate in position order;
// aggregation of probabilities over the matching V rows, overwriting or accumulating.
// K and V are [kvHeads, cap, headDim] in f32/f16/bf16; query head h reads KV head h / group.
#include "common.cuh"

static const int LOGIT_WARPS = 8, LOGIT_TOKENS_PER_WARP = 8;

// grid (token blocks, kvHeads), blocks striding over token blocks; a warp scores one token for
// every query head of its group. dyn (a recorded step): start and count from the device blob.
template <int KT>
__global__ void __launch_bounds__(256) attn_logits_kernel(float *logits, int width, const float *q, const void *k, int group, int headDim,
                                                          int cap, int start, const int *slots, int count, float scale, const int *dyn) {
  if (dyn) { start = dyn[0]; count = dyn[1]; }
  const int g = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int j0 = blockIdx.x * LOGIT_WARPS * LOGIT_TOKENS_PER_WARP; j0 < count; j0 += gridDim.x * LOGIT_WARPS * LOGIT_TOKENS_PER_WARP)
  for (int t = 0; t < LOGIT_TOKENS_PER_WARP; t++) {
    const int j = j0 + t * LOGIT_WARPS + warp;
    if (j >= count) break;
    const size_t slot = slots ? (size_t)slots[j] : (size_t)(start + j);
    const size_t kBase = ((size_t)g * cap + slot) * headDim;
    for (int hh = 0; hh < group; hh++) {
      const int h = g * group + hh;
      const float *qh = q + (size_t)h * headDim;
      float s = 0.f;
      for (int d = lane; d < headDim; d += 32) s += qh[d] * ld<KT>(k, kBase + d);
      s = warp_sum(s);
      if (lane == 0) logits[(size_t)h * width + j] = scale * s;
    }
  }
}

static const int AGG_HEADS = 8;  // query heads per block (grid.z covers the rest of a group)

// grid (token chunks, kvHeads, head sub-groups × dim chunks of 256); thread x owns one dim,
// thread y a share of the chunk's tokens; partial sums meet in shared memory, then atomics.
template <int VT>
__global__ void attn_aggregate_kernel(float *out, const float *probs, int width, const void *v, int group, int headDim, int cap,
                                      int start, const int *slots, int count, int headGroups, const int *dyn) {
  extern __shared__ float part[];  // [ty][AGG_HEADS][blockDim.x]
  if (dyn) { start = dyn[0]; count = dyn[1]; }
  const int chunk = (count + gridDim.x - 1) / gridDim.x;
  if ((int)blockIdx.x * chunk >= count) return;  // the whole block: before any barrier
  const int g = blockIdx.y;
  const int hg = blockIdx.z % headGroups, dchunk = blockIdx.z / headGroups;
  const int d = dchunk * 256 + threadIdx.x;
  const int h0 = g * group + hg * AGG_HEADS;
  const int nh = min(AGG_HEADS, group - hg * AGG_HEADS);
  const int jBegin = blockIdx.x * chunk, jEnd = min(count, jBegin + chunk);
  float acc[AGG_HEADS];
#pragma unroll
  for (int i = 0; i < AGG_HEADS; i++) acc[i] = 0.f;
  if (d < headDim) {
    for (int j = jBegin + threadIdx.y; j < jEnd; j += blockDim.y) {
      const size_t slot = slots ? (size_t)slots[j] : (size_t)(start + j);
      const float vv = ld<VT>(v, ((size_t)g * cap + slot) * headDim + d);
#pragma unroll
      for (int i = 0; i < AGG_HEADS; i++)
        if (i < nh) acc[i] += probs[(size_t)(h0 + i) * width + j] * vv;
    }
  }
#pragma unroll
  for (int i = 0; i < AGG_HEADS; i++) part[(threadIdx.y * AGG_HEADS + i) * blockDim.x + threadIdx.x] = acc[i];
  __syncthreads();
  if (threadIdx.y == 0 && d < headDim) {
    for (int i = 0; i < nh; i++) {
      float s = 0.f;
      for (int y = 0; y < (int)blockDim.y; y++) s += part[(y * AGG_HEADS + i) * blockDim.x + threadIdx.x];
      atomicAdd(out + (size_t)(h0 + i) * headDim + d, s);
    }
  }
}

Cmd hg_new_cmd(int kind);
int hg_put_dyn(HgCtx *c, Cmd &cmd, int count);

// Recorded commands size their grid for the cache capacity (the per-step count is unknown
// when the graph is captured); blocks past the count return at once.
int hg_launch_attn(HgCtx *c, const Cmd &m, const char *dynBase) {
  const int kt = m.s[0], heads = m.s[1], kvHeads = m.s[2], headDim = m.s[3], cap = m.s[4];
  const int start = m.d[0], count = m.d[1];
  const int bound = dynBase ? cap : count;
  const int *dyn = dynBase ? (const int *)(dynBase + m.dynOff) : NULL;
  const int group = heads / kvHeads;
  if (m.kind == CMD_LOGITS) {
    const int per = LOGIT_WARPS * LOGIT_TOKENS_PER_WARP;
    int gx = (bound + per - 1) / per;
    const int most = (8 * c->numSMs + kvHeads - 1) / kvHeads;
    if (gx > most) gx = most;
    if (gx < 1) gx = 1;
    HG_DISPATCH_DT(kt, K, (attn_logits_kernel<K><<<dim3(gx, kvHeads), 256, 0, c->compute>>>((float *)m.p[0], m.s[5], (const float *)m.p[1], m.p[2], group, headDim, cap, start, (const int *)m.p[3], count, m.f[0], dyn)));
    return hg_launched();
  }
  const int headGroups = (group + AGG_HEADS - 1) / AGG_HEADS, dChunks = (headDim + 255) / 256;
  const int bx = headDim >= 256 ? 256 : ((headDim + 31) / 32) * 32;
  const int by = 256 / bx;
  // Enough blocks to fill the chip (≈4 per SM), but at least 32 tokens each.
  const long others = (long)kvHeads * headGroups * dChunks;
  long chunks = (4L * c->numSMs + others - 1) / others;
  const long maxChunks = (bound + 31) / 32;
  if (chunks > maxChunks) chunks = maxChunks;
  if (chunks < 1) chunks = 1;
  dim3 grid((unsigned)chunks, kvHeads, headGroups * dChunks), block(bx, by);
  const size_t shmem = (size_t)by * AGG_HEADS * bx * sizeof(float);
  HG_DISPATCH_DT(kt, V, (attn_aggregate_kernel<V><<<grid, block, shmem, c->compute>>>((float *)m.p[0], (const float *)m.p[1], m.s[5], m.p[2], group, headDim, cap, start, (const int *)m.p[3], count, headGroups, dyn)));
  return hg_launched();
}

static int attn_cmd(HgCtx *c, int kind, void *dst, const float *src, int width, const void *kv, int dt, int heads, int kvHeads, int headDim,
                    int cap, int start, const int *slots, int count, float scale) {
  const int *ds = NULL;
  if (slots) { int r = hg_upload_ints(c, slots, (size_t)count, (int **)&ds); if (r) return r; }
  Cmd m = hg_new_cmd(kind);
  m.p[0] = dst; m.p[1] = src; m.p[2] = kv; m.p[3] = ds;
  m.s[0] = dt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = cap; m.s[5] = width;
  m.f[0] = scale;
  m.d[0] = start; m.d[1] = count;
  int r = hg_put_dyn(c, m, 2);
  return r ? r : hg_submit(c, m);
}

extern "C" {

// logits/probs already point at [0, col]; q/out at the row. slots (host) may be null.
HG_EXPORT int hg_cu_attn_logits(HgCtx *c, float *logits, int width, const float *q, const void *k, int kt, int heads, int kvHeads, int headDim,
                                int cap, int start, const int *slots, int count, float scale) {
  HG_FLUSH_REC(c);
  if (count <= 0) return 0;
  return attn_cmd(c, CMD_LOGITS, logits, q, width, k, kt, heads, kvHeads, headDim, cap, start, slots, count, scale);
}

HG_EXPORT int hg_cu_attn_aggregate(HgCtx *c, float *out, const float *probs, int width, const void *v, int vt, int heads, int kvHeads, int headDim,
                                   int cap, int start, const int *slots, int count, int accumulate) {
  HG_FLUSH_REC(c);
  if (!accumulate) {
    Cmd z = hg_new_cmd(CMD_MEMSET);
    z.p[0] = out; z.s[0] = heads * headDim; z.s[1] = (int)sizeof(float);
    int r = hg_submit(c, z);
    if (r) return r;
  }
  if (count <= 0) return 0;
  return attn_cmd(c, CMD_AGG, out, probs, width, v, vt, heads, kvHeads, headDim, cap, start, slots, count, 0.f);
}

}  // extern "C"
