// Row and elementwise ops: embedding, RMSNorm, LayerNorm, RoPE, SiLU·up, ReLU, GELU, add,
// softmax, argmax. Activations are f32; tables and norm weights may be any dtype.
#include "common.cuh"

template <int DT>
__global__ void embedding_kernel(float *out, const void *table, int dim, const int *ids, int id0) {
  const int row = blockIdx.y;
  const size_t id = ids ? (size_t)ids[row] : (size_t)id0;
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < dim; c += gridDim.x * blockDim.x)
    out[(size_t)row * dim + c] = ld<DT>(table, id * dim + c);
}

template <int WT>
__global__ void rmsnorm_kernel(float *out, const float *x, const void *w, int d, float eps) {
  __shared__ float red[32];
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
  const int row = blockIdx.x, h = blockIdx.y;
  const int p = positions ? positions[row] : pos0;
  float *base = x + (size_t)row * width + (size_t)h * headDim;
  const float *cr = cosT + (size_t)p * half, *sr = sinT + (size_t)p * half;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const float a = base[j], b = base[j + half], c = cr[j], s = sr[j];
    base[j] = a * c - b * s;
    base[j + half] = a * s + b * c;
  }
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
__global__ void softmax_kernel(float *x, int width, int cols) {
  __shared__ float red[32];
  float *r = x + (size_t)blockIdx.x * width;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, r[j]);
  m = block_max(m, red);
  float s = 0.f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) s += expf(r[j] - m);
  const float inv = 1.f / block_sum(s, red);
  for (int j = threadIdx.x; j < cols; j += blockDim.x) r[j] = expf(r[j] - m) * inv;
}

// First index of the largest value of one row; one block.
__global__ void argmax_kernel(const float *x, int n, int *out) {
  __shared__ float bv[32];
  __shared__ int bi[32];
  float v = -INFINITY;
  int idx = n;  // "none yet": loses every tie
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float t = x[j];
    if (t > v || idx == n) { v = t; idx = j; }
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
    idx = lane < nw ? bi[lane] : n;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (ov > v || (ov == v && oi < idx)) { v = ov; idx = oi; }
    }
    if (lane == 0) *out = idx < n ? idx : 0;
  }
}

static unsigned row_threads(int d) { return d >= 4096 ? 1024 : d >= 1024 ? 512 : d >= 256 ? 256 : 128; }

extern "C" {

// ids: host array of n ids (already range-checked); n == 1 passes the id by value.
HG_EXPORT int hg_cu_embedding(HgCtx *c, float *out, const void *table, int dt, int dim, const int *ids, int n) {
  HG_FLUSH(c);
  const int *dids = NULL;
  if (n > 1) { int r = hg_upload_ints(c, ids, (size_t)n, (int **)&dids); if (r) return r; }
  dim3 grid((dim + 255) / 256, n);
  HG_DISPATCH_DT(dt, T, (embedding_kernel<T><<<grid, 256, 0, c->compute>>>(out, table, dim, dids, ids[0])));
  return hg_launched();
}

HG_EXPORT int hg_cu_rmsnorm(HgCtx *c, float *out, const float *x, const void *w, int wt, int n, int d, float eps) {
  HG_FLUSH(c);
  HG_DISPATCH_DT(wt, W, (rmsnorm_kernel<W><<<n, row_threads(d), 0, c->compute>>>(out, x, w, d, eps)));
  return hg_launched();
}

HG_EXPORT int hg_cu_layernorm(HgCtx *c, float *out, const float *x, const void *w, int wt, const void *b, int bt, int n, int d, float eps) {
  HG_FLUSH(c);
  HG_DISPATCH_DT(wt, W, HG_DISPATCH_DT(bt, B, (layernorm_kernel<W, B><<<n, row_threads(d), 0, c->compute>>>(out, x, w, b, d, eps))));
  return hg_launched();
}

HG_EXPORT int hg_cu_rope(HgCtx *c, float *x, int n, int width, const int *positions, int heads, int headDim, const float *cosT, const float *sinT, int half) {
  HG_FLUSH(c);
  const int *dpos = NULL;
  if (n > 1) { int r = hg_upload_ints(c, positions, (size_t)n, (int **)&dpos); if (r) return r; }
  unsigned t = half >= 64 ? 64 : 32;
  rope_kernel<<<dim3(n, heads), t, 0, c->compute>>>(x, width, dpos, positions[0], headDim, cosT, sinT, half);
  return hg_launched();
}

HG_EXPORT int hg_cu_silu_mul(HgCtx *c, float *out, const float *g, const float *u, double n) {
  HG_FLUSH(c);
  silu_mul_kernel<<<hg_blocks((size_t)n, 256, c->numSMs * 8), 256, 0, c->compute>>>(out, g, u, (size_t)n);
  return hg_launched();
}
HG_EXPORT int hg_cu_relu(HgCtx *c, float *x, double n) {
  HG_FLUSH(c);
  relu_kernel<<<hg_blocks((size_t)n, 256, c->numSMs * 8), 256, 0, c->compute>>>(x, (size_t)n);
  return hg_launched();
}
HG_EXPORT int hg_cu_gelu(HgCtx *c, float *x, double n) {
  HG_FLUSH(c);
  gelu_kernel<<<hg_blocks((size_t)n, 256, c->numSMs * 8), 256, 0, c->compute>>>(x, (size_t)n);
  return hg_launched();
}
HG_EXPORT int hg_cu_add(HgCtx *c, float *out, const float *a, const float *b, double n) {
  HG_FLUSH(c);
  add_kernel<<<hg_blocks((size_t)n, 256, c->numSMs * 8), 256, 0, c->compute>>>(out, a, b, (size_t)n);
  return hg_launched();
}
HG_EXPORT int hg_cu_softmax(HgCtx *c, float *x, int rows, int width, int cols) {
  HG_FLUSH(c);
  softmax_kernel<<<rows, cols >= 4096 ? 1024 : 256, 0, c->compute>>>(x, width, cols);
  return hg_launched();
}

// Greedy pick on the device: only one int crosses to the host. Returns the index, or
// -(error) on failure.
HG_EXPORT int hg_cu_argmax(HgCtx *c, const float *x, int n) {
  { int fr = hg_flush_copies(c); if (fr) return -fr; }
  argmax_kernel<<<1, 1024, 0, c->compute>>>(x, n, c->argmaxOut);
  int r = hg_launched();
  if (r) return -r;
  cudaError_t e = cudaMemcpyAsync(c->argmaxHost, c->argmaxOut, sizeof(int), cudaMemcpyDeviceToHost, c->compute);
  if (e != cudaSuccess) return -(int)e;
  e = cudaStreamSynchronize(c->compute);
  if (e != cudaSuccess) return -(int)e;
  return *c->argmaxHost;
}

}  // extern "C"
