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
// (deterministic, no atomics) and adds the bias; or, with the fused reduction (setSkinny), the
// last block of each row block does, in the same order.
//
// Switches (hg_cu_set_skinny, per context): the fused reduction, and the largest n "auto"
// routes here. Outputs:
// the m weight rows may go to up to 3 tensors (a fused q/k/v or gate/up weight), and the
// result may be added to them (a residual add): hg_cu_matmul_rows, CudaBackend.matmulSplit.
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

// 8 x values (k order of the lane's fragment) rounded to the weight dtype, 2 to a register.
template <int WT> __device__ __forceinline__ void sk_pack8(unsigned (&xb)[4], const float4 &a, const float4 &b) {
  xb[0] = sk_pack<WT>(a.x, a.y); xb[1] = sk_pack<WT>(a.z, a.w);
  xb[2] = sk_pack<WT>(b.x, b.y); xb[3] = sk_pack<WT>(b.z, b.w);
}

// One 32-wide k chunk: the two k16 steps of every (weight tile i, batch tile j) product, from the
// lane's 16-byte weight words wa and its packed x words xb.
template <int WT, int NT>
__device__ __forceinline__ void sk_chunk_mma(float (&acc)[SK_MT][NT][4], const uint4 (&wa)[SK_MT][2], const unsigned (&xb)[NT][4]) {
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

// Where the m output rows (weight rows) go: up to 3 row ranges of the weight, each to its own
// [n, width] matrix (a fused q/k/v or gate/up weight into separate outputs, matmulRows), and
// whether the result is added to what the output holds (a residual add in the epilogue).
struct SkOut {
  float *p[3];
  int end[3];  // cumulative: segment j holds weight rows [end[j−1], end[j]); end[count−1] = m
  int count, accumulate;
};
// out (+)= v for batch row nn, weight row `row` (v already holds the bias).
__device__ __forceinline__ void sk_store(const SkOut &o, int nn, int row, float v) {
  float *base = o.p[0];
  int start = 0, end = o.end[0];
  if (o.count > 1 && row >= o.end[0]) {
    if (o.count > 2 && row >= o.end[1]) {
      base = o.p[2]; start = o.end[1]; end = o.end[2];
    } else {
      base = o.p[1]; start = o.end[0]; end = o.end[1];
    }
  }
  float *dst = base + (size_t)nn * (end - start) + (row - start);
  *dst = o.accumulate ? *dst + v : v;
}

// The kernel's end: the 4 warps' accumulators summed through shared memory `red`
// (SK_WARPS × SK_ROWS × (8·NT + 1) floats; the caller has synchronised if it is reused), then
// either stored (+ bias) or, with k splits, written to part[split][n][m]. With counters (fused
// reduction) the last of a row block's gridDim.y blocks to finish then sums the partials in split
// order, as skinny_reduce_kernel does, and resets its counter for the next launch.
template <int NT>
__device__ __forceinline__ void sk_finish(const SkOut &out, float *part, const void *bias, int bt, int n, int m, float (&acc)[SK_MT][NT][4], float *redMem,
                                          unsigned *counters) {
  __shared__ int lastBlock;
  float(*red)[SK_ROWS][NT * 8 + 1] = reinterpret_cast<float(*)[SK_ROWS][NT * 8 + 1]>(redMem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * SK_ROWS;
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
    else sk_store(out, nn, row, s + (bias ? load_any(bias, bt, row) : 0.f));
  }
  if (!part || !counters) return;
  __threadfence();  // this block's partials are visible before its count
  __syncthreads();
  if (threadIdx.x == 0) lastBlock = atomicAdd(&counters[blockIdx.x], 1u) == gridDim.y - 1;
  __syncthreads();
  if (!lastBlock) return;
  __threadfence();
  const size_t plane = (size_t)n * m;
  for (int e = threadIdx.x; e < SK_ROWS * NT * 8; e += blockDim.x) {
    const int rr = e % SK_ROWS, nn = e / SK_ROWS, row = row0 + rr;
    if (row >= m || nn >= n) continue;
    const float *p = part + (size_t)nn * m + row;
    float s = 0.f;
    for (int sp = 0; sp < (int)gridDim.y; sp++) s += __ldcg(p + sp * plane);  // L2: other blocks wrote them
    sk_store(out, nn, row, s + (bias ? load_any(bias, bt, row) : 0.f));
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0u;  // the next launch on the stream starts from 0
}

// grid (row blocks of 64, k splits), 128 threads. NT: n tiles of 8 (n ≤ 8·NT). Requires k % 8 == 0
// and 16-byte aligned w and x. part null: out (+ bias) directly; else part[split][n][m] partial sums
// (summed by skinny_reduce_kernel, or by the kernel itself with counters: sk_finish).
template <int WT, int NT>
__global__ void __launch_bounds__(128) skinny_gemm_kernel(SkOut out, float *part, const float *x, const void *w, const void *bias, int bt, int n,
                                                          int k, int m, int chunksPerSplit, unsigned *counters) {
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
        sk_pack8<WT>(xb[j], a, b);
      } else {
        xb[j][0] = xb[j][1] = xb[j][2] = xb[j][3] = 0u;
      }
    }
    sk_chunk_mma<WT, NT>(acc, wa, xb);
  }
  sk_finish<NT>(out, part, bias, bt, n, m, acc, &red[0][0][0], counters);
}

// out[i] = Σ_split part[split][i] (in split order) + bias.
__global__ void skinny_reduce_kernel(SkOut out, const float *part, const void *bias, int bt, int n, int m, int splits) {
  hg_pdl_trigger();
  hg_pdl_wait();
  const size_t total = (size_t)n * m;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    float s = 0.f;
    for (int sp = 0; sp < splits; sp++) s += part[(size_t)sp * total + i];
    sk_store(out, (int)(i / m), (int)(i % m), s + (bias ? load_any(bias, bt, (int)(i % m)) : 0.f));
  }
}

// Variant flags (setSkinny; the Cmd's s[7]). SK_FUSED_REDUCE: the k splits are summed by the
// last block of each row block to finish (sk_finish), no second launch. (Bit 0 is unused.)
enum { SK_FUSED_REDUCE = 2 };

// ---- per-context switches and counters ----------------------------------------------------------
//
// setSkinny (hg_cu_set_skinny): the largest n the automatic path gives the skinny GEMM (above it
// cuBLAS, as before it), and the variant flags. Kept here, keyed by context, so the shared
// context struct stays as it is; a context claiming a free entry starts at the defaults. The
// fused reduction's counters are one set per entry: past SK_STATES live contexts entries are
// shared, and two contexts running split GEMMs with the fused reduction at the same moment on one
// device could then mix their counts (not a memory hazard; documented in the README).
static const int SK_STATES = 16, SK_COUNTERS = 4096;
__device__ unsigned sk_counter_sets[SK_STATES][SK_COUNTERS];
struct SkState {
  const HgCtx *owner;
  int maxRows, flags;
  unsigned *counters;  // device address of this entry's counter set (on the owner's device)
};
static SkState sk_states[SK_STATES];

static SkState &sk_state(const HgCtx *c) {
  int free = -1;
  for (int i = 0; i < SK_STATES; i++) {
    if (sk_states[i].owner == c) return sk_states[i];
    if (free < 0 && !sk_states[i].owner) free = i;
  }
  const int i = free >= 0 ? free : (int)(((uintptr_t)c >> 6) % SK_STATES);
  SkState &st = sk_states[i];
  st.owner = c;
  st.maxRows = 32;
  st.flags = 0;
  void *base = NULL;
  st.counters = cudaGetSymbolAddress(&base, sk_counter_sets) == cudaSuccess ? (unsigned *)base + (size_t)i * SK_COUNTERS : NULL;
  return st;
}

template <int WT, int NT>
static int launch_skinny_nt(HgCtx *c, const SkOut &out, const float *x, const void *w, const void *bias, int bt, int n, int k, int m, int splits, int cps, int flags,
                            unsigned *counters) {
  float *part = splits > 1 ? (float *)c->scratch : NULL;
  const dim3 grid((unsigned)((m + SK_ROWS - 1) / SK_ROWS), (unsigned)splits);
  int r;
  unsigned *cnt = part && (flags & SK_FUSED_REDUCE) ? counters : NULL;
  r = hg_launch(c, skinny_gemm_kernel<WT, NT>, grid, dim3(32 * SK_WARPS), 0, out, part, x, w, bias, bt, n, k, m, cps, cnt);
  if (r || splits == 1 || cnt) return r;
  return hg_launch(c, skinny_reduce_kernel, dim3(hg_blocks((size_t)n * m, 256, (unsigned)c->numSMs * 4)), dim3(256), 0, out, (const float *)part, bias, bt, n, m,
                   splits);
}

template <int WT>
static int launch_skinny(HgCtx *c, const SkOut &out, const float *x, const void *w, const void *bias, int bt, int n, int k, int m, int splits, int cps, int flags,
                         unsigned *counters) {
  switch ((n + 7) / 8) {
    case 1: return launch_skinny_nt<WT, 1>(c, out, x, w, bias, bt, n, k, m, splits, cps, flags, counters);
    case 2: return launch_skinny_nt<WT, 2>(c, out, x, w, bias, bt, n, k, m, splits, cps, flags, counters);
    case 3: return launch_skinny_nt<WT, 3>(c, out, x, w, bias, bt, n, k, m, splits, cps, flags, counters);
    default: return launch_skinny_nt<WT, 4>(c, out, x, w, bias, bt, n, k, m, splits, cps, flags, counters);
  }
}

// p: out0, x, w, bias, out1, out2; s: wt, bt, n, k, m, splits, k chunks a split, variant flags,
// end0, end1, accumulate (all static: part of the graph key). The fused reduction's counters are
// the context's own (fixed for its life).
int hg_launch_skinny(HgCtx *c, const Cmd &m) {
  const float *x = (const float *)m.p[1];
  const int wt = m.s[0], bt = m.s[1], n = m.s[2], k = m.s[3], rows = m.s[4], splits = m.s[5], cps = m.s[6], flags = m.s[7];
  SkOut out;
  out.p[0] = (float *)m.p[0]; out.p[1] = (float *)m.p[4]; out.p[2] = (float *)m.p[5];
  out.count = out.p[2] ? 3 : out.p[1] ? 2 : 1;
  out.end[0] = out.count > 1 ? m.s[8] : rows;
  out.end[1] = out.count > 2 ? m.s[9] : rows;
  out.end[2] = rows;
  out.accumulate = m.s[10];
  unsigned *cnt = (flags & SK_FUSED_REDUCE) ? sk_state(c).counters : NULL;
  if (wt == DT_BF16) return launch_skinny<DT_BF16>(c, out, x, m.p[2], m.p[3], bt, n, k, rows, splits, cps, flags, cnt);
  if (wt == DT_F16) return launch_skinny<DT_F16>(c, out, x, m.p[2], m.p[3], bt, n, k, rows, splits, cps, flags, cnt);
  return (int)cudaErrorInvalidValue;
}

// The shapes the kernel takes: f16/bf16 weights, 2 ≤ n ≤ 32, k % 8 == 0, 16-byte aligned operands.
static bool skinny_fits(const float *x, const void *w, int wt, int n, int k) {
  return (wt == DT_BF16 || wt == DT_F16) && n >= 2 && n <= 32 && k > 0 && k % 8 == 0 && (((uintptr_t)x | (uintptr_t)w) & 15) == 0;
}

// Blocks of a (WT, NT) kernel one SM holds at once (registers bound it: 66–132 a thread), asked
// of the runtime once per process.
template <int WT, int NT>
static int sk_occupancy_nt() {
  static int b = 0;
  if (!b) {
    const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, skinny_gemm_kernel<WT, NT>, 32 * SK_WARPS, 0);
    if (e != cudaSuccess || b < 0) {
      (void)cudaGetLastError();  // not sticky: the launch reports a real problem
      b = 0;
      return 2;
    }
  }
  return b > 0 ? b : 1;
}
template <int WT>
static int sk_occupancy(int nt) {
  return nt == 1 ? sk_occupancy_nt<WT, 1>() : nt == 2 ? sk_occupancy_nt<WT, 2>() : nt == 3 ? sk_occupancy_nt<WT, 3>() : sk_occupancy_nt<WT, 4>();
}

Cmd hg_new_cmd(int kind);

// The largest n the automatic path sends here (matmul.cu's routing asks).
int hg_skinny_max_rows(const HgCtx *c) { return sk_state(c).maxRows; }

// Submits (records, in a step) one skinny GEMM whose m weight rows go to `count` outputs
// (cumulative row ends `ends`), added to them when `accumulate`; HG_SKINNY_NOT_TAKEN when
// skinny_fits says no. No per-step values: recordable.
static int sk_submit(HgCtx *c, float *const *outs, const int *ends, int count, int accumulate, const float *x, const void *w, int wt, const void *bias, int bt,
                     int n, int k, int m) {
  if (!skinny_fits(x, w, wt, n, k) || m <= 0) return HG_SKINNY_NOT_TAKEN;
  HG_FLUSH_REC(c);
  const SkState &st = sk_state(c);
  // k splits: as many blocks as the SMs hold at once, rounded down (no second, mostly empty wave),
  // partials within the scratch; at least 2 k chunks a warp.
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
  // The fused reduction needs a counter a row block.
  const bool fused = (st.flags & SK_FUSED_REDUCE) && st.counters && rowBlocks <= SK_COUNTERS;
  Cmd cmd = hg_new_cmd(CMD_SKINNY);
  cmd.p[0] = outs[0]; cmd.p[1] = x; cmd.p[2] = w; cmd.p[3] = bias;
  cmd.p[4] = count > 1 ? outs[1] : NULL; cmd.p[5] = count > 2 ? outs[2] : NULL;
  cmd.s[0] = wt; cmd.s[1] = bt; cmd.s[2] = n; cmd.s[3] = k; cmd.s[4] = m; cmd.s[5] = (int)splits; cmd.s[6] = cps;
  cmd.s[7] = fused ? SK_FUSED_REDUCE : 0;
  cmd.s[8] = count > 1 ? ends[0] : m; cmd.s[9] = count > 2 ? ends[1] : m; cmd.s[10] = accumulate ? 1 : 0;
  return hg_submit(c, cmd);
}

// Called by hg_cu_matmul (matmul.cu) for path 3 and for the automatic choice.
int hg_skinny_matmul(HgCtx *c, float *out, const float *x, const void *w, int wt, const void *bias, int bt, int n, int k, int m) {
  float *outs[1] = {out};
  const int ends[1] = {m};
  return sk_submit(c, outs, ends, 1, 0, x, w, wt, bias, bt, n, k, m);
}

extern "C" {

// The path hg_cu_matmul takes under "auto" for n rows of a dtype-wt weight with k columns:
// 0 GEMV, 1 cuBLAS, 2 tiled, 3 skinny tensor-core GEMM (x and w assumed 16-byte aligned).
HG_EXPORT int hg_cu_matmul_path(HgCtx *c, int n);  // matmul.cu

HG_EXPORT int hg_cu_matmul_path_for(HgCtx *c, int n, int wt, int k) {
  const bool half = wt == DT_BF16 || wt == DT_F16;
  if (half && n >= 2 && n <= hg_skinny_max_rows(c) && k > 0 && k % 8 == 0) return 3;
  if (half && n >= 2 && n <= 32 && c->cublas && n > hg_skinny_max_rows(c)) return 1;
  return hg_cu_matmul_path(c, n);
}

// maxRows (1..32; 1 = never automatically): the largest n "auto" gives the skinny GEMM, cuBLAS
// above (default 32). flags: 2 the fused split reduction (default 0); other bits are refused (1,
// the pipelined kernel, is gone).
// Negative leaves a value as it is. Returns 0, or cudaErrorInvalidValue out of range.
HG_EXPORT int hg_cu_set_skinny(HgCtx *c, int maxRows, int flags) {
  if (maxRows > 32 || maxRows == 0 || (flags >= 0 && (flags & ~SK_FUSED_REDUCE) != 0)) return (int)cudaErrorInvalidValue;
  SkState &st = sk_state(c);
  if (maxRows > 0) st.maxRows = maxRows;
  if (flags >= 0) st.flags = flags;
  return 0;
}

// CudaBackend.matmulSplit: out_j[n, widths[j]] (+)= x · w[rows of segment j]ᵀ (+ bias), the
// segments (1..3) taking the weight's m rows in order; the skinny kernel only (the caller checks
// shapes, overlaps and the path first). HG_SKINNY_NOT_TAKEN (−2) when its shape is not the
// kernel's (the caller then runs matmul and add).
HG_EXPORT int hg_cu_matmul_rows(HgCtx *c, float *out0, float *out1, float *out2, int w0, int w1, int w2, int accumulate, const float *x, const void *w, int wt,
                                const void *bias, int bt, int n, int k) {
  float *outs[3] = {out0, out1, out2};
  const int widths[3] = {w0, w1, w2};
  int count = 0, ends[3] = {0, 0, 0}, m = 0;
  for (int j = 0; j < 3; j++) {
    if (!outs[j]) break;
    if (widths[j] <= 0) return (int)cudaErrorInvalidValue;
    m += widths[j];
    ends[count++] = m;
  }
  if (count == 0) return (int)cudaErrorInvalidValue;
  return sk_submit(c, outs, ends, count, accumulate, x, w, wt, bias, bt, n, k, m);
}

}  // extern "C"
