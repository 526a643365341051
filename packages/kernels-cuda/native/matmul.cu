// out[n, m] = x[n, k] · w[m, k]ᵀ (+ bias): decode GEMVs in our own kernel (weights read once
// at full bandwidth), larger n through cuBLAS when it is loaded, else a tiled GEMM.
#include "common.cuh"

// ---- GEMV for n ≤ 8 rows: one warp per weight row, 16-byte weight loads, 8 rows per block ----


static const int GEMV_WARPS = 8, GEMV_UNROLL = 4;

// VEC: k is a multiple of the vector width and w, x are 16-byte aligned.
template <int WT, int NR, bool VEC>
__global__ void __launch_bounds__(256) gemv_kernel(float *out, const float *x, const void *w, const void *bias, int bt, int n, int k, int m) {
  hg_pdl_wait();  // a no-op in hg_launch's plain launch: see common.cuh
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  if (row >= m) return;
  float acc[NR];
#pragma unroll
  for (int r = 0; r < NR; r++) acc[r] = 0.f;
  if (VEC) {
    constexpr int V = Vec16<WT>::N;
    constexpr int ES = WT == DT_F32 ? 4 : 2;
    const uint4 *wr = reinterpret_cast<const uint4 *>((const char *)w + (size_t)row * k * ES);
    const int nvec = k / V;  // 16-byte words in the row
    for (int base = lane; base < nvec; base += 32 * GEMV_UNROLL) {
      uint4 raw[GEMV_UNROLL];
#pragma unroll
      for (int u = 0; u < GEMV_UNROLL; u++) {
        const int i = base + u * 32;
        raw[u] = i < nvec ? __ldg(wr + i) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < GEMV_UNROLL; u++) {
        const int i = base + u * 32;
        if (i < nvec) {
          float wf[V];
          Vec16<WT>::cvt(raw[u], wf);
#pragma unroll
          for (int r = 0; r < NR; r++) {
            if (r < n) {
              const float4 *xr = reinterpret_cast<const float4 *>(x + (size_t)r * k + (size_t)i * V);
#pragma unroll
              for (int q = 0; q < V / 4; q++) {
                const float4 xv = xr[q];
                acc[r] += wf[4 * q] * xv.x + wf[4 * q + 1] * xv.y + wf[4 * q + 2] * xv.z + wf[4 * q + 3] * xv.w;
              }
            }
          }
        }
      }
    }
  } else {
    for (int c = lane; c < k; c += 32) {
      const float wv = ld<WT>(w, (size_t)row * k + c);
#pragma unroll
      for (int r = 0; r < NR; r++)
        if (r < n) acc[r] += wv * x[(size_t)r * k + c];
    }
  }
  hg_pdl_trigger();  // this warp's loads are done
  const float b = bias ? load_any(bias, bt, row) : 0.f;
#pragma unroll
  for (int r = 0; r < NR; r++) {
    const float s = warp_sum(acc[r]);
    if (r < n && lane == 0) out[(size_t)r * m + row] = s + b;
  }
}

// ---- tiled GEMM (no cuBLAS): 64×64 output tiles, 4×4 per thread, f32 accumulation ----

template <int WT>
__global__ void __launch_bounds__(256) gemm_tiled_kernel(float *out, const float *x, const void *w, const void *bias, int bt, int n, int k, int m) {
  constexpr int BM = 64, BN = 64, BK = 16;
  __shared__ float xs[BK][BM + 4];
  __shared__ float ws[BK][BN + 4];
  const int tid = threadIdx.x, tr = tid / 16, tc = tid % 16;
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < k; k0 += BK) {
    for (int e = tid; e < BM * BK; e += 256) {
      const int r = e / BK, kk = e % BK;
      const int gr = row0 + r, gk = k0 + kk;
      xs[kk][r] = (gr < n && gk < k) ? x[(size_t)gr * k + gk] : 0.f;
      const int gc = col0 + r;
      ws[kk][r] = (gc < m && gk < k) ? ld<WT>(w, (size_t)gc * k + gk) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk++) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; i++) { a[i] = xs[kk][tr * 4 + i]; b[i] = ws[kk][tc * 4 + i]; }
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const int r = row0 + tr * 4 + i;
    if (r >= n) continue;
#pragma unroll
    for (int j = 0; j < 4; j++) {
      const int cc = col0 + tc * 4 + j;
      if (cc < m) out[(size_t)r * m + cc] = acc[i][j] + (bias ? load_any(bias, bt, cc) : 0.f);
    }
  }
}

__global__ void bias_rows_kernel(float *out, const void *bias, int bt, int n, int m) {
  const size_t total = (size_t)n * m;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
    out[i] += load_any(bias, bt, (int)(i % m));
}

int hg_convert_device(HgCtx *c, void *dst, int dd, const void *src, int sd, size_t n);

template <int WT, int NR>
static int launch_gemv(HgCtx *c, bool vec, float *out, const float *x, const void *w, const void *bias, int bt, int n, int k, int m) {
  const unsigned blocks = (unsigned)((m + GEMV_WARPS - 1) / GEMV_WARPS);
  if (vec) return hg_launch(c, gemv_kernel<WT, NR, true>, dim3(blocks), dim3(256), 0, out, x, w, bias, bt, n, k, m);
  return hg_launch(c, gemv_kernel<WT, NR, false>, dim3(blocks), dim3(256), 0, out, x, w, bias, bt, n, k, m);
}

static const int GEMV_MAX_ROWS = 8;

Cmd hg_new_cmd(int kind);
int hg_skinny_matmul(HgCtx *c, float *out, const float *x, const void *w, int wt, const void *bias, int bt, int n, int k, int m);  // gemm_skinny.cu
int hg_skinny_max_rows(const HgCtx *c);  // gemm_skinny.cu (setSkinny)
#define HG_SKINNY_NOT_TAKEN (-2)

int hg_launch_gemv(HgCtx *c, const Cmd &m) {
  float *out = (float *)m.p[0];
  const float *x = (const float *)m.p[1];
  const void *w = m.p[2], *bias = m.p[3];
  const int wt = m.s[0], bt = m.s[1], n = m.s[2], k = m.s[3], rows = m.s[4];
  const bool vec = m.s[5] != 0;
  switch (m.s[6]) {
    case 1: HG_DISPATCH_DT(wt, W, return (launch_gemv<W, 1>(c, vec, out, x, w, bias, bt, n, k, rows))); break;
    case 2: HG_DISPATCH_DT(wt, W, return (launch_gemv<W, 2>(c, vec, out, x, w, bias, bt, n, k, rows))); break;
    case 4: HG_DISPATCH_DT(wt, W, return (launch_gemv<W, 4>(c, vec, out, x, w, bias, bt, n, k, rows))); break;
    default: HG_DISPATCH_DT(wt, W, return (launch_gemv<W, 8>(c, vec, out, x, w, bias, bt, n, k, rows))); break;
  }
  return 0;
}

// CMD_CUBLAS: out[n,m] = x·wᵀ (+ bias) through cuBLAS, x rounded to the weight dtype in the scratch
// `chunk` rows at a time (s: wt, bt, n, k, m, chunk; p: out, x, w, bias).
int hg_launch_cublas(HgCtx *c, const Cmd &cmd) {
  float *out = (float *)cmd.p[0];
  const float *x = (const float *)cmd.p[1];
  const void *w = cmd.p[2], *bias = cmd.p[3];
  const int wt = cmd.s[0], bt = cmd.s[1], n = cmd.s[2], k = cmd.s[3], m = cmd.s[4], chunk = cmd.s[5];
  for (int r0 = 0; r0 < n; r0 += chunk) {
    const int rows = n - r0 < chunk ? n - r0 : chunk;
    const void *xop = x + (size_t)r0 * k;
    if (wt != DT_F32) {
      int e = hg_convert_device(c, c->scratch, wt, xop, DT_F32, (size_t)rows * k);
      if (e) return e;
      xop = c->scratch;
    }
    int e = hg_cublas_gemm(c, out + (size_t)r0 * m, xop, w, wt, rows, k, m);
    if (e) return e;
  }
  if (!bias) return 0;
  bias_rows_kernel<<<hg_blocks((size_t)n * m, 256, c->numSMs * 8), 256, 0, c->compute>>>(out, bias, bt, n, m);
  return hg_launched();
}

extern "C" {

// Which path a matmul of n rows takes (0 gemv, 1 cuBLAS, 2 tiled); for tests and benches.
HG_EXPORT int hg_cu_matmul_path(HgCtx *c, int n) { return n <= GEMV_MAX_ROWS ? 0 : c->cublas ? 1 : 2; }

// bias may be null. forcePath: -1 automatic, else 0/1/2 as hg_cu_matmul_path (tests compare them).
HG_EXPORT int hg_cu_matmul(HgCtx *c, float *out, const float *x, const void *w, int wt, const void *bias, int bt, int n, int k, int m, int forcePath) {
  // Path 3 and the automatic choice for 2..maxRows (setSkinny, ≤ 32) rows of f16/bf16 weights:
  // the skinny tensor-core GEMM (gemm_skinny.cu), unless the shape is not its case. Above
  // maxRows, up to 32, "auto" takes cuBLAS when it is loaded (the GEMV would be slower).
  const bool half = wt == DT_BF16 || wt == DT_F16;
  if (forcePath == 3 || (forcePath < 0 && n >= 2 && n <= hg_skinny_max_rows(c))) {
    const int r = hg_skinny_matmul(c, out, x, w, wt, bias, bt, n, k, m);
    if (r != HG_SKINNY_NOT_TAKEN) return r;
    forcePath = -1;
  } else if (forcePath < 0 && half && n >= 2 && n <= 32 && c->cublas) {
    forcePath = 1;
  }
  int path = forcePath >= 0 ? forcePath : hg_cu_matmul_path(c, n);
  if (path == 1 && !c->cublas) path = 2;
  if (path == 0 && n > GEMV_MAX_ROWS) path = 2;
  if (path == 0) {  // the decode GEMV: recordable in a step
    HG_FLUSH_REC(c);
    const int vw = wt == DT_F32 ? 4 : 8;
    Cmd cmd = hg_new_cmd(CMD_GEMV);
    cmd.p[0] = out; cmd.p[1] = x; cmd.p[2] = w; cmd.p[3] = bias;
    cmd.s[0] = wt; cmd.s[1] = bt; cmd.s[2] = n; cmd.s[3] = k; cmd.s[4] = m;
    cmd.s[5] = k % vw == 0 && ((uintptr_t)w & 15) == 0 && ((uintptr_t)x & 15) == 0;
    cmd.s[6] = n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8;
    return hg_submit(c, cmd);
  }
  if (path == 1) {
    // cuBLAS wants both operands in one type: x is rounded to the weight dtype in the scratch,
    // in row chunks that fit. A command of its own, so a recorded step keeps it (a batched
    // step of 9–32 rows would otherwise drain at every projection): cuBLAS's workspace is the
    // arena's, which stream capture needs.
    const int chunk = wt == DT_F32 ? n : (int)(c->scratchBytes / ((size_t)k * 2));
    if (chunk >= 1) {
      HG_FLUSH_REC(c);
      Cmd cmd = hg_new_cmd(CMD_CUBLAS);
      cmd.p[0] = out; cmd.p[1] = x; cmd.p[2] = w; cmd.p[3] = bias;
      cmd.s[0] = wt; cmd.s[1] = bt; cmd.s[2] = n; cmd.s[3] = k; cmd.s[4] = m; cmd.s[5] = chunk;
      return hg_submit(c, cmd);
    }
    path = 2;
  }
  HG_FLUSH(c);
  dim3 grid((m + 63) / 64, (n + 63) / 64);
  HG_DISPATCH_DT(wt, W, (gemm_tiled_kernel<W><<<grid, 256, 0, c->compute>>>(out, x, w, bias, bt, n, k, m)));
  return hg_launched();
}

}  // extern "C"
