// Attention stages for hybrid attention: logits of a query row over a span (or a set of
// slots) of cached K, written at a column offset so segments concatenate in position order;
// aggregation of probabilities over the matching V rows, overwriting or accumulating.
// K and V are [kvHeads, cap, headDim] in f32/f16/bf16; query head h reads KV head h / group.
#include "common.cuh"

static const int LOGIT_WARPS = 8, LOGIT_TOKENS_PER_WARP = 8;

// grid (token blocks, kvHeads); a warp scores one token for every query head of its group.
template <int KT>
__global__ void __launch_bounds__(256) attn_logits_kernel(float *logits, int width, const float *q, const void *k, int group, int headDim,
                                                          int cap, int start, const int *slots, int count, float scale) {
  const int g = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j0 = blockIdx.x * LOGIT_WARPS * LOGIT_TOKENS_PER_WARP;
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
                                      int start, const int *slots, int count, int chunk, int headGroups) {
  extern __shared__ float part[];  // [ty][AGG_HEADS][blockDim.x]
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

extern "C" {

// logits/probs already point at [0, col]; q/out at the row. slots (host) may be null.
HG_EXPORT int hg_cu_attn_logits(HgCtx *c, float *logits, int width, const float *q, const void *k, int kt, int heads, int kvHeads, int headDim,
                                int cap, int start, const int *slots, int count, float scale) {
  HG_FLUSH(c);
  if (count <= 0) return 0;
  const int *ds = NULL;
  if (slots) { int r = hg_upload_ints(c, slots, (size_t)count, (int **)&ds); if (r) return r; }
  const int per = LOGIT_WARPS * LOGIT_TOKENS_PER_WARP;
  dim3 grid((count + per - 1) / per, kvHeads);
  HG_DISPATCH_DT(kt, K, (attn_logits_kernel<K><<<grid, 256, 0, c->compute>>>(logits, width, q, k, heads / kvHeads, headDim, cap, start, ds, count, scale)));
  return hg_launched();
}

HG_EXPORT int hg_cu_attn_aggregate(HgCtx *c, float *out, const float *probs, int width, const void *v, int vt, int heads, int kvHeads, int headDim,
                                   int cap, int start, const int *slots, int count, int accumulate) {
  HG_FLUSH(c);
  if (!accumulate) {
    cudaError_t e = cudaMemsetAsync(out, 0, (size_t)heads * headDim * sizeof(float), c->compute);
    if (e != cudaSuccess) return (int)e;
  }
  if (count <= 0) return 0;
  const int *ds = NULL;
  if (slots) { int r = hg_upload_ints(c, slots, (size_t)count, (int **)&ds); if (r) return r; }
  const int group = heads / kvHeads;
  const int headGroups = (group + AGG_HEADS - 1) / AGG_HEADS, dChunks = (headDim + 255) / 256;
  const int bx = headDim >= 256 ? 256 : ((headDim + 31) / 32) * 32;
  const int by = 256 / bx;
  // Enough blocks to fill the chip (≈4 per SM), but at least 32 tokens each.
  const long others = (long)kvHeads * headGroups * dChunks;
  long chunks = (4L * c->numSMs + others - 1) / others;
  const long maxChunks = (count + 31) / 32;
  if (chunks > maxChunks) chunks = maxChunks;
  if (chunks < 1) chunks = 1;
  const int chunk = (int)((count + chunks - 1) / chunks);
  chunks = (count + chunk - 1) / chunk;
  dim3 grid((unsigned)chunks, kvHeads, headGroups * dChunks), block(bx, by);
  const size_t shmem = (size_t)by * AGG_HEADS * bx * sizeof(float);
  HG_DISPATCH_DT(vt, V, (attn_aggregate_kernel<V><<<grid, block, shmem, c->compute>>>(out, probs, width, v, group, headDim, cap, start, ds, count, chunk, headGroups)));
  return hg_launched();
}

}  // extern "C"
