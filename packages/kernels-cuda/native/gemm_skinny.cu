// Skinny GEMM for batched decode: out[n, m] = x[n, k] · w[m, k]ᵀ (+ bias) for 2 ≤ n ≤ 32 rows
// and f16/bf16 weights, on tensor cores (mma.sync m16n8k16, f32 accumulation). The weights are
// read once, with 16-byte loads straight into the A fragments; x is rounded to the weight dtype
// in registers (the rounding the cuBLAS path makes) and used as the B fragments.
//
// Fragment trick: a dot product does not care in which order k is summed, as long as A and B
// agree. Lane (g = lane/4, t = lane%4) loads 8 consecutive k values [8t, 8t+8) of a 32-wide k
// chunk for weight rows g and g+8, and the same 8 k values of x row g. Read as two k16 steps,
// its 32-bit words 2s and 2s+1 are exactly the fragment registers the mma expects for logical
// columns {2t, 2t+1} and {2t+8, 2t+9} of step s: one uint4 load per operand, no shuffles.
//
// Work split: a block = 4 warps over the same 64 weight rows (4 m16 tiles a warp, so each x
// value loaded is used for 64 rows); the warps take every 4th k chunk of the block's k range and
// are summed through shared memory. When the row blocks alone cannot fill the GPU (q/k/v/o
// projections), grid.y splits k further and a second kernel sums the splits in a fixed order
// (deterministic, no atomics) and adds the bias.
#include "common.cuh"

static const int SK_WARPS = 4, SK_MT = 4, SK_ROWS = SK_MT * 16;
// Returned by hg_skinny_matmul when the shape/dtype/alignment is not its case (caller falls back).
#define HG_SKINNY_NOT_TAKEN (-2)

template <int WT> __device__ __forceinline__ unsigned sk_pack(float lo, float hi);
template <> __device__ __forceinline__ unsigned sk_pack<DT_BF16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned *>(&h);
}
template <> __device__ __forceinline__ unsigned sk_pack<DT_F16>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const unsigned *>(&h);
}

template <int WT> __device__ __forceinline__ void sk_mma(float *d, const unsigned *a, const unsigned *b);
template <> __device__ __forceinline__ void sk_mma<DT_BF16>(float *d, const unsigned *a, const unsigned *b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> __device__ __forceinline__ void sk_mma<DT_F16>(float *d, const unsigned *a, const unsigned *b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ unsigned sk_word(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// grid (row blocks of 64, k splits), 128 threads. NT: n tiles of 8 (n ≤ 8·NT). Requires k % 8 == 0
// and 16-byte aligned w and x. part null: out (+ bias) directly; else part[split][n][m] partial sums.
template <int WT, int NT>
__global__ void __launch_bounds__(128) skinny_gemm_kernel(float *out, float *part, const float *x, const void *w, const void *bias, int bt, int n,
                                                          int k, int m, int chunksPerSplit) {
  __shared__ float red[SK_WARPS][SK_ROWS][NT * 8 + 1];
  hg_pdl_trigger();
  hg_pdl_wait();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * SK_ROWS;
  const int nChunks = (k + 31) >> 5;
  const int c0 = blockIdx.y * chunksPerSplit, c1 = min(nChunks, c0 + chunksPerSplit);
  float acc[SK_MT][NT][4];
#pragma unroll
  for (int i = 0; i < SK_MT; i++)
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
      for (int e = 0; e < 4; e++) acc[i][j][e] = 0.f;
  const unsigned short *wh = reinterpret_cast<const unsigned short *>(w);
  for (int ch = c0 + warp; ch < c1; ch += SK_WARPS) {
    const int kk = (ch << 5) + (t << 3);
    const bool kin = kk < k;  // k % 8 == 0: a lane's 8 values are all in or all out
    uint4 wa[SK_MT][2];
#pragma unroll
    for (int i = 0; i < SK_MT; i++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int r = row0 + i * 16 + g + 8 * h;
        wa[i][h] = (kin && r < m) ? __ldg(reinterpret_cast<const uint4 *>(wh + (size_t)r * k + kk)) : make_uint4(0, 0, 0, 0);
      }
    unsigned xb[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) {
      const int r = j * 8 + g;
      if (kin && r < n) {
        const float4 *xp = reinterpret_cast<const float4 *>(x + (size_t)r * k + kk);
        const float4 a = xp[0], b = xp[1];
        xb[j][0] = sk_pack<WT>(a.x, a.y); xb[j][1] = sk_pack<WT>(a.z, a.w);
        xb[j][2] = sk_pack<WT>(b.x, b.y); xb[j][3] = sk_pack<WT>(b.z, b.w);
      } else {
        xb[j][0] = xb[j][1] = xb[j][2] = xb[j][3] = 0u;
      }
    }
#pragma unroll
    for (int s = 0; s < 2; s++)
#pragma unroll
      for (int i = 0; i < SK_MT; i++) {
        const unsigned a[4] = {sk_word(wa[i][0], 2 * s), sk_word(wa[i][1], 2 * s), sk_word(wa[i][0], 2 * s + 1), sk_word(wa[i][1], 2 * s + 1)};
#pragma unroll
        for (int j = 0; j < NT; j++) {
          const unsigned b[2] = {xb[j][2 * s], xb[j][2 * s + 1]};
          sk_mma<WT>(acc[i][j], a, b);
        }
      }
  }
  // C fragment: acc[i][j][0..1] = rows i·16 + g, columns j·8 + 2t (+1); [2..3] = rows + 8.
#pragma unroll
  for (int i = 0; i < SK_MT; i++)
#pragma unroll
    for (int j = 0; j < NT; j++) {
      red[warp][i * 16 + g][j * 8 + 2 * t] = acc[i][j][0];
      red[warp][i * 16 + g][j * 8 + 2 * t + 1] = acc[i][j][1];
      red[warp][i * 16 + g + 8][j * 8 + 2 * t] = acc[i][j][2];
      red[warp][i * 16 + g + 8][j * 8 + 2 * t + 1] = acc[i][j][3];
    }
  __syncthreads();
  // Row-fastest so a warp's stores to out[nn, row0 ..] are contiguous.
  for (int e = threadIdx.x; e < SK_ROWS * NT * 8; e += blockDim.x) {
    const int rr = e % SK_ROWS, nn = e / SK_ROWS, row = row0 + rr;
    if (row >= m || nn >= n) continue;
    float s = 0.f;
#pragma unroll
    for (int wv = 0; wv < SK_WARPS; wv++) s += red[wv][rr][nn];
    if (part) part[((size_t)blockIdx.y * n + nn) * m + row] = s;
    else out[(size_t)nn * m + row] = s + (bias ? load_any(bias, bt, row) : 0.f);
  }
}

// out[i] = Σ_split part[split][i] (in split order) + bias.
__global__ void skinny_reduce_kernel(float *out, const float *part, const void *bias, int bt, int n, int m, int splits) {
  hg_pdl_trigger();
  hg_pdl_wait();
  const size_t total = (size_t)n * m;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int sp = 0; sp < splits; sp++) s += part[(size_t)sp * total + i];
    out[i] = s + (bias ? load_any(bias, bt, (int)(i % m)) : 0.f);
  }
}

template <int WT, int NT>
static int launch_skinny_nt(HgCtx *c, float *out, const float *x, const void *w, const void *bias, int bt, int n, int k, int m, int splits, int cps) {
  float *part = splits > 1 ? (float *)c->scratch : NULL;
  const dim3 grid((unsigned)((m + SK_ROWS - 1) / SK_ROWS), (unsigned)splits);
  int r = hg_launch(c, skinny_gemm_kernel<WT, NT>, grid, dim3(32 * SK_WARPS), 0, out, part, x, w, bias, bt, n, k, m, cps);
  if (r || splits == 1) return r;
  return hg_launch(c, skinny_reduce_kernel, dim3(hg_blocks((size_t)n * m, 256, (unsigned)c->numSMs * 4)), dim3(256), 0, out, (const float *)part, bias, bt, n, m,
                   splits);
}

template <int WT>
static int launch_skinny(HgCtx *c, float *out, const float *x, const void *w, const void *bias, int bt, int n, int k, int m, int splits, int cps) {
  switch ((n + 7) / 8) {
    case 1: return launch_skinny_nt<WT, 1>(c, out, x, w, bias, bt, n, k, m, splits, cps);
    case 2: return launch_skinny_nt<WT, 2>(c, out, x, w, bias, bt, n, k, m, splits, cps);
    case 3: return launch_skinny_nt<WT, 3>(c, out, x, w, bias, bt, n, k, m, splits, cps);
    default: return launch_skinny_nt<WT, 4>(c, out, x, w, bias, bt, n, k, m, splits, cps);
  }
}

int hg_launch_skinny(HgCtx *c, const Cmd &m) {
  float *out = (float *)m.p[0];
  const float *x = (const float *)m.p[1];
  const int wt = m.s[0], bt = m.s[1], n = m.s[2], k = m.s[3], rows = m.s[4], splits = m.s[5], cps = m.s[6];
  if (wt == DT_BF16) return launch_skinny<DT_BF16>(c, out, x, m.p[2], m.p[3], bt, n, k, rows, splits, cps);
  if (wt == DT_F16) return launch_skinny<DT_F16>(c, out, x, m.p[2], m.p[3], bt, n, k, rows, splits, cps);
  return (int)cudaErrorInvalidValue;
}

// The shapes the kernel takes: f16/bf16 weights, 2 ≤ n ≤ 32, k % 8 == 0, 16-byte aligned operands.
static bool skinny_fits(const float *x, const void *w, int wt, int n, int k) {
  return (wt == DT_BF16 || wt == DT_F16) && n >= 2 && n <= 32 && k > 0 && k % 8 == 0 && (((uintptr_t)x | (uintptr_t)w) & 15) == 0;
}

// Blocks of the (WT, NT) kernel one SM holds at once (registers bound it: 72–136 a thread), asked
// of the runtime once per process.
template <int WT, int NT>
static int sk_occupancy_nt() {
  static int blocks = 0;
  if (!blocks && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, skinny_gemm_kernel<WT, NT>, 32 * SK_WARPS, 0) != cudaSuccess) blocks = 0;
  return blocks > 0 ? blocks : 2;
}
template <int WT>
static int sk_occupancy(int nt) {
  return nt == 1 ? sk_occupancy_nt<WT, 1>() : nt == 2 ? sk_occupancy_nt<WT, 2>() : nt == 3 ? sk_occupancy_nt<WT, 3>() : sk_occupancy_nt<WT, 4>();
}

Cmd hg_new_cmd(int kind);

// Called by hg_cu_matmul (matmul.cu) for path 3 and for the automatic choice; HG_SKINNY_NOT_TAKEN
// when skinny_fits says no. Recordable in a decode step (no per-step values).
int hg_skinny_matmul(HgCtx *c, float *out, const float *x, const void *w, int wt, const void *bias, int bt, int n, int k, int m) {
  if (!skinny_fits(x, w, wt, n, k) || m <= 0) return HG_SKINNY_NOT_TAKEN;
  HG_FLUSH_REC(c);
  // k splits: as many blocks as the SMs hold at once, rounded down (no second, mostly empty wave),
  // at least 2 k chunks a warp, partials within the scratch.
  const int rowBlocks = (m + SK_ROWS - 1) / SK_ROWS, nChunks = (k + 31) / 32, nt = (n + 7) / 8;
  const long slots = (long)(wt == DT_BF16 ? sk_occupancy<DT_BF16>(nt) : sk_occupancy<DT_F16>(nt)) * c->numSMs;
  long splits = slots / rowBlocks;
  const long byWork = nChunks / (2 * SK_WARPS);
  const long bySpace = (long)(c->scratchBytes / ((size_t)n * m * sizeof(float)));
  if (splits > byWork) splits = byWork;
  if (splits > bySpace) splits = bySpace;
  if (splits < 1) splits = 1;
  const int cps = (int)((nChunks + splits - 1) / splits);
  splits = (nChunks + cps - 1) / cps;
  Cmd cmd = hg_new_cmd(CMD_SKINNY);
  cmd.p[0] = out; cmd.p[1] = x; cmd.p[2] = w; cmd.p[3] = bias;
  cmd.s[0] = wt; cmd.s[1] = bt; cmd.s[2] = n; cmd.s[3] = k; cmd.s[4] = m; cmd.s[5] = (int)splits; cmd.s[6] = cps;
  return hg_submit(c, cmd);
}

extern "C" {

// The path hg_cu_matmul takes under "auto" for n rows of a dtype-wt weight with k columns:
// 0 GEMV, 1 cuBLAS, 2 tiled, 3 skinny tensor-core GEMM (x and w assumed 16-byte aligned).
HG_EXPORT int hg_cu_matmul_path(HgCtx *c, int n);  // matmul.cu

HG_EXPORT int hg_cu_matmul_path_for(HgCtx *c, int n, int wt, int k) {
  if ((wt == DT_BF16 || wt == DT_F16) && n >= 2 && n <= 32 && k > 0 && k % 8 == 0) return 3;
  return hg_cu_matmul_path(c, n);
}

}  // extern "C"
