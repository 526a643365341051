// Row and elementwise ops: embedding, RMSNorm, LayerNorm, RoPE, SiLU·up, ReLU, GELU, add,
// softmax, argmax. Activations are f32; tables and norm weights may be any dtype.
#include "common.cuh"
#include "rope.cuh"
#include <string.h>

template <int DT>
__global__ void embedding_kernel(float *out, const void *table, int dim, const int *ids, int id0, int n) {
  hg_pdl_trigger();
  hg_pdl_wait();  // out may still be read by the kernel before (the previous step's last one)
  for (int row = blockIdx.y; row < n; row += gridDim.y) {  // grid.y is capped at 65535 rows
    const size_t id = ids ? (size_t)ids[row] : (size_t)id0;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < dim; c += gridDim.x * blockDim.x)
      out[(size_t)row * dim + c] = ld<DT>(table, id * dim + c);
  }
}

template <int WT>
__global__ void rmsnorm_kernel(float *out, const float *x, const void *w, int d, float eps) {
  __shared__ float red[32];
  hg_pdl_trigger();  // one block: the next kernel (a GEMV) may start loading its weights
  hg_pdl_wait();
  const float *xr = x + (size_t)blockIdx.x * d;
  float *orow = out + (size_t)blockIdx.x * d;
  float ss = 0.f;
  for (int c = threadIdx.x; c < d; c += blockDim.x) ss += xr[c] * xr[c];
  ss = block_sum(ss, red);
  const float r = rsqrtf(ss / d + eps);
  for (int c = threadIdx.x; c < d; c += blockDim.x) orow[c] = xr[c] * r * ld<WT>(w, c);
}

template <int WT, int BT>
__global__ void layernorm_kernel(float *out, const float *x, const void *w, const void *b, int d, float eps) {
  __shared__ float red[32];
  const float *xr = x + (size_t)blockIdx.x * d;
  float *orow = out + (size_t)blockIdx.x * d;
  float s = 0.f;
  for (int c = threadIdx.x; c < d; c += blockDim.x) s += xr[c];
  const float mean = block_sum(s, red) / d;
  float v = 0.f;
  for (int c = threadIdx.x; c < d; c += blockDim.x) { float t = xr[c] - mean; v += t * t; }
  const float r = rsqrtf(block_sum(v, red) / d + eps);
  for (int c = threadIdx.x; c < d; c += blockDim.x) orow[c] = (xr[c] - mean) * r * ld<WT>(w, c) + ld<BT>(b, c);
}

// One block per (row, head); pairs (j, j + half) rotate by the angle of the row's position.
__global__ void rope_kernel(float *x, int width, const int *positions, int pos0, int headDim, const float *cosT, const float *sinT, int half) {
  hg_pdl_trigger();
  hg_pdl_wait();
  const int row = blockIdx.x, h = blockIdx.y;
  const int p = positions ? positions[row] : pos0;
  float *base = x + (size_t)row * width + (size_t)h * headDim;
  const float *cr = cosT + (size_t)p * half, *sr = sinT + (size_t)p * half;
  hg_rope_head(base, cr, sr, half, threadIdx.x, blockDim.x, [](int, float) {});  // rope.cuh: the rounding every rotating kernel shares
}

__global__ void silu_mul_kernel(float *out, const float *g, const float *u, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const float v = g[i];
    out[i] = v / (1.f + expf(-v)) * u[i];
  }
}
__global__ void relu_kernel(float *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] = fmaxf(x[i], 0.f);
}
__global__ void gelu_kernel(float *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    x[i] = 0.5f * x[i] * (1.f + erff(x[i] * 0.70710678118654752f));
}
__global__ void add_kernel(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) out[i] = a[i] + b[i];
}

// Row-wise softmax of the first `cols` of each row (row stride `width`); one block per row.
// In a recorded step `cols` comes from the device blob (it grows every decode step).
__global__ void softmax_kernel(float *x, int width, int cols, const int *dyn) {
  __shared__ float red[32];
  if (dyn) cols = dyn[0];
  float *r = x + (size_t)blockIdx.x * width;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, r[j]);
  m = block_max(m, red);
  float s = 0.f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) s += expf(r[j] - m);
  const float inv = 1.f / block_sum(s, red);
  for (int j = threadIdx.x; j < cols; j += blockDim.x) r[j] = expf(r[j] - m) * inv;
}

// A thread's running argmax over the elements it visits in increasing index order: the first
// of the largest (idx == cols: none yet, so the first visited is taken and loses every tie).
__device__ __forceinline__ void argmax_take(float t, int j, int cols, float &v, int &idx) {
  if (t > v || idx == cols) { v = t; idx = j; }
}

// First index of the largest value of each row of x [gridDim.x, cols], a block a row (1024
// threads): a thread keeps the first of its strided maxima, the reductions keep the lower index
// of equal values. One block serves Backend.argmax and the greedy feed, n blocks argmaxRows.
// VEC: a 16-byte aligned row read as float4s, AM_LOADS of them in flight a thread,
// then the last cols % 4 elements; the scalar loop compiles to one load a trip, each compare
// waiting for it. The same pick either way (a thread still visits its elements in increasing
// order).
static const int AM_LOADS = 8;
template <bool VEC>
__global__ void __launch_bounds__(1024) argmax_rows_kernel(const float *x, int cols, int *out) {
  __shared__ float bv[32];
  __shared__ int bi[32];
  const float *row = x + (size_t)blockIdx.x * cols;
  float v = -INFINITY;
  int idx = cols;  // "none yet": loses every tie
  if (VEC && ((uintptr_t)row & 15) == 0) {
    const float4 *r4 = reinterpret_cast<const float4 *>(row);
    const int n4 = cols >> 2, nt = blockDim.x;
    for (int b = threadIdx.x; b < n4; b += AM_LOADS * nt) {
      float4 q[AM_LOADS];
#pragma unroll
      for (int u = 0; u < AM_LOADS; u++) q[u] = b + u * nt < n4 ? r4[b + u * nt] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int u = 0; u < AM_LOADS; u++)
        if (b + u * nt < n4) {
          const int j = 4 * (b + u * nt);
          argmax_take(q[u].x, j, cols, v, idx);
          argmax_take(q[u].y, j + 1, cols, v, idx);
          argmax_take(q[u].z, j + 2, cols, v, idx);
          argmax_take(q[u].w, j + 3, cols, v, idx);
        }
    }
    for (int j = 4 * n4 + threadIdx.x; j < cols; j += nt) argmax_take(row[j], j, cols, v, idx);
  } else {
    for (int j = threadIdx.x; j < cols; j += blockDim.x) argmax_take(row[j], j, cols, v, idx);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { bv[warp] = v; bi[warp] = idx; }
  __syncthreads();
  if (warp == 0) {
    const int nw = blockDim.x >> 5;
    v = lane < nw ? bv[lane] : -INFINITY;
    idx = lane < nw ? bi[lane] : cols;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
    }
    if (lane == 0) out[blockIdx.x] = idx < cols ? idx : 0;
  }
}

// The split argmax: one long row's argmax over many blocks, then one warp. Part 1: block b takes the
// float4s [n4·b/B, n4·(b+1)/B) (the last block also the cols % 4 tail), a thread in increasing
// order, and writes its block's first largest (value, index) to pv[b], pi[b]. Part 2 (launched
// programmatically) keeps the lowest index of the largest over the blocks in order: the pick of
// the one-block kernel. Why: one block reads the 128K-float row of a greedy step in ≈ 16 dependent
// rounds of L2 loads from one SM, on the step's critical path; 132 blocks read it in one.
static const int AM_SPLIT_THREADS = HG_AM_SPLIT_THREADS, AM_SPLIT_MAX_BLOCKS = HG_AM_SPLIT_MAX_BLOCKS;
static const int AM_SPLIT_AREA = 4096;  // the partials: ints past this many into the misc area (1 MB)
__device__ __forceinline__ void argmax_keep(float ov, int oi, float &v, int &idx) {
  if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
}
__global__ void __launch_bounds__(AM_SPLIT_THREADS) argmax_part_kernel(const float *x, int cols, float *pv, int *pi) {
  __shared__ float bv[AM_SPLIT_THREADS / 32];
  __shared__ int bi[AM_SPLIT_THREADS / 32];
  hg_pdl_trigger();
  const int n4 = cols >> 2, b = blockIdx.x, nb = gridDim.x;
  const int lo = (int)((long)n4 * b / nb), hi = (int)((long)n4 * (b + 1) / nb);
  const float4 *r4 = reinterpret_cast<const float4 *>(x);
  float v = -INFINITY;
  int idx = cols;
  for (int j = lo + threadIdx.x; j < hi; j += AM_SPLIT_THREADS) {
    const float4 q = r4[j];
    argmax_take(q.x, 4 * j, cols, v, idx);
    argmax_take(q.y, 4 * j + 1, cols, v, idx);
    argmax_take(q.z, 4 * j + 2, cols, v, idx);
    argmax_take(q.w, 4 * j + 3, cols, v, idx);
  }
  if (b == nb - 1)
    for (int j = 4 * n4 + threadIdx.x; j < cols; j += AM_SPLIT_THREADS) argmax_take(x[j], j, cols, v, idx);
  for (int o = 16; o > 0; o >>= 1) argmax_keep(__shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o), v, idx);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) { bv[warp] = v; bi[warp] = idx; }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < AM_SPLIT_THREADS / 32; w++) argmax_keep(bv[w], bi[w], v, idx);
    pv[b] = v;
    pi[b] = idx;
  }
}
__global__ void argmax_final_kernel(const float *pv, const int *pi, int nb, int cols, int *out) {
  hg_pdl_wait();
  float v = -INFINITY;
  int idx = cols;
  for (int b = threadIdx.x; b < nb; b += 32) argmax_keep(pv[b], pi[b], v, idx);
  for (int o = 16; o > 0; o >>= 1) argmax_keep(__shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o), v, idx);
  if (threadIdx.x == 0) *out = idx < cols ? idx : 0;
}

// The argmax of each of `rows` rows of x [rows, cols] into out[0, rows): float4 loads, or one long
// aligned row over many blocks with its partials in the misc area, as hg_decode_plan picks.
int hg_launch_argmax(HgCtx *c, const float *x, int rows, int cols, int *out) {
  HgPlanShape shape = {HG_PLAN_ARGMAX, DT_F32, cols, rows, 0, 0, 0, ((uintptr_t)x & 15) == 0, 0};
  const HgPlan plan = hg_decode_plan(hg_plan_device(c), shape);
  if (plan.kernel == HG_ARGMAX_SPLIT) {
    const int nb = plan.grid;
    float *pv = reinterpret_cast<float *>(c->argmaxOut + AM_SPLIT_AREA);
    int *pi = c->argmaxOut + AM_SPLIT_AREA + AM_SPLIT_MAX_BLOCKS;
    argmax_part_kernel<<<(unsigned)nb, AM_SPLIT_THREADS, 0, c->compute>>>(x, cols, pv, pi);
    int r = hg_launched();
    return r ? r : hg_launch_pdl(c, true, argmax_final_kernel, dim3(1), dim3(32), 0, (const float *)pv, (const int *)pi, nb, cols, out);
  }
  argmax_rows_kernel<true><<<(unsigned)rows, 1024, 0, c->compute>>>(x, cols, out);
  return hg_launched();
}

static unsigned row_threads(int d) { return d >= 4096 ? 1024 : d >= 1024 ? 512 : d >= 256 ? 256 : 128; }

static Cmd new_cmd(int kind) {
  Cmd cmd;
  memset(&cmd, 0, sizeof cmd);
  cmd.kind = kind;
  cmd.dynOff = -1;
  return cmd;
}
static void put_count(Cmd &cmd, size_t n) { cmd.s[0] = (int)(n & 0x7fffffff); cmd.s[1] = (int)(n >> 31); }
static size_t get_count(const Cmd &cmd) { return (size_t)(unsigned)cmd.s[0] | ((size_t)(unsigned)cmd.s[1] << 31); }

int hg_launch_rowop(HgCtx *c, const Cmd &m, const char *dynBase) {
  float *out = (float *)m.p[0];
  switch (m.kind) {
    case CMD_EMBED: {
      dim3 grid((m.s[1] + 255) / 256, m.s[2] < 65535 ? m.s[2] : 65535);
      HG_DISPATCH_DT(m.s[0], T, return hg_launch(c, embedding_kernel<T>, grid, dim3(256), 0, out, m.p[1], m.s[1], (const int *)m.p[2], m.d[0], m.s[2]));
      break;
    }
    case CMD_RMSNORM:
      HG_DISPATCH_DT(m.s[0], W, return hg_launch(c, rmsnorm_kernel<W>, dim3(m.s[2]), dim3(row_threads(m.s[3])), 0, out, (const float *)m.p[1], m.p[2], m.s[3], m.f[0]));
      break;
    case CMD_LAYERNORM:
      HG_DISPATCH_DT(m.s[0], W, HG_DISPATCH_DT(m.s[1], B, (layernorm_kernel<W, B><<<m.s[2], row_threads(m.s[3]), 0, c->compute>>>(out, (const float *)m.p[1], m.p[2], m.p[3], m.s[3], m.f[0]))));
      break;
    case CMD_ROPE:  // a recorded step's RoPE launched programmatically; p[4]: the K/V append folded in
      if (m.p[4]) return hg_launch_rope_append(c, m, dynBase);
      return hg_launch_pdl(c, dynBase != NULL, rope_kernel, dim3(m.s[0], m.s[2]), dim3(m.s[4] >= 64 ? 64 : 32), 0, out, m.s[1], (const int *)m.p[1], m.d[0], m.s[3], (const float *)m.p[2],
                       (const float *)m.p[3], m.s[4]);
    case CMD_SILU: {
      const size_t n = get_count(m);
      silu_mul_kernel<<<hg_blocks(n, 256, c->numSMs * 8), 256, 0, c->compute>>>(out, (const float *)m.p[1], (const float *)m.p[2], n);
      break;
    }
    case CMD_RELU: {
      const size_t n = get_count(m);
      relu_kernel<<<hg_blocks(n, 256, c->numSMs * 8), 256, 0, c->compute>>>(out, n);
      break;
    }
    case CMD_GELU: {
      const size_t n = get_count(m);
      gelu_kernel<<<hg_blocks(n, 256, c->numSMs * 8), 256, 0, c->compute>>>(out, n);
      break;
    }
    case CMD_ADD: {
      const size_t n = get_count(m);
      add_kernel<<<hg_blocks(n, 256, c->numSMs * 8), 256, 0, c->compute>>>(out, (const float *)m.p[1], (const float *)m.p[2], n);
      break;
    }
    case CMD_SOFTMAX: {
      // Recorded: the block size follows the row width (static), not the per-step column count.
      const int by = dynBase ? m.s[1] : m.d[0];
      softmax_kernel<<<m.s[0], by >= 4096 ? 1024 : 256, 0, c->compute>>>(out, m.s[1], m.d[0], dynBase ? (const int *)(dynBase + m.dynOff) : NULL);
      break;
    }
    default: return (int)cudaErrorInvalidValue;
  }
  return hg_launched();
}

// Per-step ints of a command: into the blob when recording (the kernel reads them there).
static int put_dyn(HgCtx *c, Cmd &cmd, int count) {
  if (!hg_recording(c)) return 0;
  const long off = hg_blob_put(c, cmd.d, (size_t)count * sizeof(int));
  if (off >= 0) { cmd.dynOff = (int)off; return 0; }
  return hg_drain(c);
}
int hg_put_dyn(HgCtx *c, Cmd &cmd, int count) { return put_dyn(c, cmd, count); }
Cmd hg_new_cmd(int kind) { return new_cmd(kind); }

extern "C" {

// ids: host array of n ids (already range-checked); n == 1 passes the id by value.
HG_EXPORT int hg_cu_embedding(HgCtx *c, float *out, const void *table, int dt, int dim, const int *ids, int n) {
  HG_FLUSH_REC(c);
  const int *dids = NULL;
  if (n > 1 || hg_recording(c)) { int r = hg_upload_ints(c, ids, (size_t)n, (int **)&dids); if (r) return r; }
  Cmd m = new_cmd(CMD_EMBED);
  m.p[0] = out; m.p[1] = table; m.p[2] = dids;
  m.s[0] = dt; m.s[1] = dim; m.s[2] = n; m.d[0] = ids[0];
  return hg_submit(c, m);
}

HG_EXPORT int hg_cu_rmsnorm(HgCtx *c, float *out, const float *x, const void *w, int wt, int n, int d, float eps) {
  HG_FLUSH_REC(c);
  Cmd m = new_cmd(CMD_RMSNORM);
  m.p[0] = out; m.p[1] = x; m.p[2] = w;
  m.s[0] = wt; m.s[2] = n; m.s[3] = d; m.f[0] = eps;
  return hg_submit(c, m);
}

HG_EXPORT int hg_cu_layernorm(HgCtx *c, float *out, const float *x, const void *w, int wt, const void *b, int bt, int n, int d, float eps) {
  HG_FLUSH_REC(c);
  Cmd m = new_cmd(CMD_LAYERNORM);
  m.p[0] = out; m.p[1] = x; m.p[2] = w; m.p[3] = b;
  m.s[0] = wt; m.s[1] = bt; m.s[2] = n; m.s[3] = d; m.f[0] = eps;
  return hg_submit(c, m);
}


HG_EXPORT int hg_cu_rope(HgCtx *c, float *x, int n, int width, const int *positions, int heads, int headDim, const float *cosT, const float *sinT, int half) {
  HG_FLUSH_REC(c);
  const int *dpos = NULL;
  if (n > 1 || hg_recording(c)) { int r = hg_upload_ints(c, positions, (size_t)n, (int **)&dpos); if (r) return r; }
  Cmd m = new_cmd(CMD_ROPE);
  m.p[0] = x; m.p[1] = dpos; m.p[2] = cosT; m.p[3] = sinT;
  m.s[0] = n; m.s[1] = width; m.s[2] = heads; m.s[3] = headDim; m.s[4] = half; m.d[0] = positions[0];
  return hg_submit(c, m);
}

static int elementwise(HgCtx *c, int kind, float *out, const float *a, const float *b, double n) {
  HG_FLUSH_REC(c);
  Cmd m = new_cmd(kind);
  m.p[0] = out; m.p[1] = a; m.p[2] = b;
  put_count(m, (size_t)n);
  return hg_submit(c, m);
}

HG_EXPORT int hg_cu_silu_mul(HgCtx *c, float *out, const float *g, const float *u, double n) { return elementwise(c, CMD_SILU, out, g, u, n); }
HG_EXPORT int hg_cu_relu(HgCtx *c, float *x, double n) { return elementwise(c, CMD_RELU, x, NULL, NULL, n); }
HG_EXPORT int hg_cu_gelu(HgCtx *c, float *x, double n) { return elementwise(c, CMD_GELU, x, NULL, NULL, n); }
HG_EXPORT int hg_cu_add(HgCtx *c, float *out, const float *a, const float *b, double n) { return elementwise(c, CMD_ADD, out, a, b, n); }

HG_EXPORT int hg_cu_softmax(HgCtx *c, float *x, int rows, int width, int cols) {
  HG_FLUSH_REC(c);
  Cmd m = new_cmd(CMD_SOFTMAX);
  m.p[0] = x;
  m.s[0] = rows; m.s[1] = width; m.d[0] = cols;
  int r = put_dyn(c, m, 1);
  return r ? r : hg_submit(c, m);
}

// Greedy picks of a batched decode step: the argmax of each of n rows in one launch and one copy
// of the n indices to the host, instead of n launch + copy + sync round trips.
// hostOut[i] = argmax of row i of x [n, cols] (f32), for i < n. devOut: n ints of device memory
// (the caller's scratch). Runs whatever a recorded step holds first (a read), then waits.
HG_EXPORT int hg_cu_argmax_rows(HgCtx *c, const float *x, int n, int cols, int *devOut, int *hostOut) {
  HG_FLUSH(c);
  if (n <= 0 || cols <= 0) return (int)cudaErrorInvalidValue;
  int r = hg_launch_argmax(c, x, n, cols, devOut);
  if (r) return r;
  cudaError_t e = cudaMemcpyAsync(hostOut, devOut, (size_t)n * sizeof(int), cudaMemcpyDeviceToHost, c->compute);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->compute);
  return (int)e;
}


// Greedy pick on the device: only one int crosses to the host. Returns the index, or
// -(error) on failure.
HG_EXPORT int hg_cu_argmax(HgCtx *c, const float *x, int n) {
  { int fr = hg_drain(c); if (!fr) fr = hg_flush_copies(c); if (fr) return -fr; }
  int r = hg_launch_argmax(c, x, 1, n, c->argmaxOut);
  if (r) return -r;
  cudaError_t e = cudaMemcpyAsync(c->argmaxHost, c->argmaxOut, sizeof(int), cudaMemcpyDeviceToHost, c->compute);
  if (e != cudaSuccess) return -(int)e;
  e = cudaStreamSynchronize(c->compute);
  if (e != cudaSuccess) return -(int)e;
  return *c->argmaxHost;
}

}  // extern "C"
