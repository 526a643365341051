// A recorded step's RoPE and the K/V append queued after it as one kernel.
// Core rotates the step's q and k rows in place (qkv's first heads + kvHeads heads), then queues
// one copy a KV head for K (from a rotated head) and one for V (from outside the rotated rows).
// Apart, that is two small kernels and a programmatic boundary between them before the attention
// (a few µs a layer at 2K beside the tensor-core attention). Folded, the block that
// rotates a head also writes it to each copy whose source is that head (rounded as the copy kernel
// rounds: the same bits), and one more block a copy does those that read no rotated row.
#include "common.cuh"
#include "copy_rows.cuh"
#include "rope.cuh"

// grid (rows, heads + copies), 64 or 32 threads. The copies are in the blob (destinations change
// every step); every copy either reads exactly one rotated head or none (rope_append_fits). Block
// (0, heads + i) does copy i if it reads no rotated row (V), each in its own block: one block doing
// them in turn measured slower (DEVICE-NOTES.md).
__global__ void rope_append_kernel(float *x, int width, const int *positions, int pos0, int headDim, const float *cosT, const float *sinT, int half,
                                   int heads, int rows, const CopyBatch *b) {
  hg_pdl_trigger();
  hg_pdl_wait();
  const int row = blockIdx.x, h = blockIdx.y;
  const char *lo = (const char *)x, *hi = (const char *)(x + (size_t)(rows - 1) * width + (size_t)heads * headDim);
  if (h >= heads) {  // a copy from outside the rotated rows (V)
    if (row != 0 || h - heads >= b->n) return;
    const CopyDesc d = b->d[h - heads];
    if (d.src < lo || d.src >= hi) batched_copy(d, threadIdx.x, blockDim.x);
    return;
  }
  float *base = x + (size_t)row * width + (size_t)h * headDim;
  // The copies that read this head (core's K append: one), found by the threads in parallel.
  __shared__ int mine[HG_MAX_PENDING_COPIES];
  __shared__ int nmine;
  if (threadIdx.x == 0) nmine = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < b->n; i += blockDim.x)
    if (b->d[i].src == (const char *)base) mine[atomicAdd(&nmine, 1)] = i;
  __syncthreads();
  const int p = positions ? positions[row] : pos0;
  const float *cr = cosT + (size_t)p * half, *sr = sinT + (size_t)p * half;
  const int n = nmine;
  auto append = [&](int j, float v) {
    for (int k = 0; k < n; k++) store_any(b->d[mine[k]].dst, b->d[mine[k]].dd, j, v);
  };
  hg_rope_head(base, cr, sr, half, threadIdx.x, blockDim.x, append);
  for (int j = 2 * half + threadIdx.x; j < headDim; j += blockDim.x) append(j, base[j]);  // past the rotated pairs (partial rotary)
}

// True when every queued copy either reads exactly one head row of the RoPE command `m` (f32, headDim
// elements) or nothing it rotates, and none writes into its rows: then the copies can run inside it.
bool rope_append_fits(const Cmd &m, const CopyBatch &q) {
  const float *x = (const float *)m.p[0];
  const int rows = m.s[0], width = m.s[1], heads = m.s[2], headDim = m.s[3];
  const char *lo = (const char *)x;
  const size_t span = ((size_t)(rows - 1) * width + (size_t)heads * headDim) * sizeof(float);
  for (int i = 0; i < q.n; i++) {
    const CopyDesc &d = q.d[i];
    const size_t srcBytes = copy_src_bytes(d);
    if (hg_overlaps(d.dst, d.bytes, lo, span)) return false;
    if (!hg_overlaps(d.src, srcBytes, lo, span)) continue;
    const size_t off = (size_t)(d.src - lo);
    if (d.sd != DT_F32 || off % sizeof(float) || srcBytes != (size_t)headDim * sizeof(float)) return false;
    const size_t f = off / sizeof(float), r = f / width, col = f % width;
    if (r >= (size_t)rows || col % headDim || col / headDim >= (size_t)heads) return false;
  }
  return true;
}

int hg_launch_rope_append(HgCtx *c, const Cmd &m, const char *dynBase) {
  return hg_launch_pdl(c, dynBase != NULL, rope_append_kernel, dim3(m.s[0], m.s[2] + m.s[5]), dim3(m.s[4] >= 64 ? 64 : 32), 0, (float *)m.p[0], m.s[1],
                       (const int *)m.p[1], m.d[0], m.s[3], (const float *)m.p[2], (const float *)m.p[3], m.s[4], m.s[2], m.s[0], (const CopyBatch *)m.p[4]);
}
