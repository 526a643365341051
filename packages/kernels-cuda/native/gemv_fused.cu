// The decode GEMV with its neighbours fused in (one row x, one launch instead of two or three):
//   prologue  h = rmsNorm(x)·normWeight, computed by every block into shared memory
//             (x is a few KB and sits in L2; the norm's own kernel and h's round trip go away);
//   epilogue  out = y, out += y (the residual add), or out = silu(y[j])·y[m + j] (w = [gate; up]).
// A warp computes one weight row, or with SiLU·up two at once: the gate row j and the up row
// m + j. Blocks of 16 warps (fewer blocks: fewer norm prologues); the warp's first weight
// lines are prefetched into L2 before the prologue, so the memory stream starts at once.
#include "common.cuh"

static const int FG_WARPS = 16, FG_UNROLL = 4, FG_THREADS = FG_WARPS * 32;
enum { FG_ACCUMULATE = 1, FG_SILU = 2 };

// grid: ceil(warps needed / FG_WARPS); dynamic shared memory: k floats when NORM.
// VEC: k a multiple of the vector width, w and x (or the shared copy) 16-byte aligned.
// Programmatic launch (hg_launch, common.cuh): the kernel waits before it reads x, and lets the
// next kernel in only once its loads are done (an early trigger let a chain of later kernels
// take SM slots and prefetch ahead; the H200 measured that slower, DEVICE-NOTES.md fourth pass).
template <int WT, bool NORM, int EPI, bool VEC>
__global__ void __launch_bounds__(FG_THREADS, (EPI & FG_SILU) ? 2 : 4) gemv_fused_kernel(float *out, const float *x, const void *w, const void *bias, int bt,
                                                                                  const void *nw, int nt, float eps, int k, int m) {
  extern __shared__ __align__(16) float xs[];
  constexpr bool SILU = (EPI & FG_SILU) != 0;
  constexpr int ES = WT == DT_F32 ? 4 : 2;
  const int lane = threadIdx.x & 31;
  const int wg = blockIdx.x * FG_WARPS + (threadIdx.x >> 5);
  const int r0 = wg, r1 = wg + m;  // r1: the up row (SiLU·up only)
  const bool live = wg < m;
  if (NORM && live) {  // start the weight stream while the block normalises x
    const char *row0 = (const char *)w + (size_t)r0 * k * ES, *row1 = (const char *)w + (size_t)r1 * k * ES;
    const size_t rowBytes = (size_t)k * ES;
#pragma unroll
    for (int u = 0; u < 2 * FG_UNROLL; u++) {
      const size_t off = (size_t)(lane + u * 32) * 16;
      if (off < rowBytes) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(row0 + off));
        if (SILU) asm volatile("prefetch.global.L2 [%0];" ::"l"(row1 + off));
      }
    }
  }
  hg_pdl_wait();  // x (and out, for +=) come from the kernels before this one
  const float *xv = x;
  if (NORM) {
    __shared__ float red[32];
    float ss = 0.f;
    if ((((uintptr_t)x & 15) | (k & 3)) == 0) {  // 16-byte pieces of x
      const float4 *x4 = reinterpret_cast<const float4 *>(x);
      float4 *s4 = reinterpret_cast<float4 *>(xs);
      for (int i = threadIdx.x; i < k / 4; i += blockDim.x) {
        const float4 t = x4[i];
        s4[i] = t;
        ss += t.x * t.x + t.y * t.y + t.z * t.z + t.w * t.w;
      }
    } else {
      for (int i = threadIdx.x; i < k; i += blockDim.x) {
        const float t = x[i];
        xs[i] = t;
        ss += t * t;
      }
    }
    ss = block_sum(ss, red);  // its barriers also publish xs
    const float r = rsqrtf(ss / k + eps);
    for (int i = threadIdx.x; i < k; i += blockDim.x) xs[i] *= r * load_any(nw, nt, i);
    __syncthreads();
    xv = xs;
  }
  if (!live) return;
  float a0 = 0.f, a1 = 0.f;
  if (VEC) {
    constexpr int V = Vec16<WT>::N, CHUNK = 32 * FG_UNROLL;  // 16-byte words a warp loads per iteration
    const int nvec = k / V;
    const uint4 *w0 = reinterpret_cast<const uint4 *>((const char *)w + (size_t)r0 * k * ES);
    const uint4 *w1 = reinterpret_cast<const uint4 *>((const char *)w + (size_t)(SILU ? r1 : r0) * k * ES);
    for (int c0 = 0; c0 < nvec; c0 += CHUNK) {
      uint4 raw0[FG_UNROLL], raw1[FG_UNROLL];
#pragma unroll
      for (int u = 0; u < FG_UNROLL; u++) {
        const int i = c0 + lane + u * 32;
        raw0[u] = i < nvec ? __ldg(w0 + i) : make_uint4(0, 0, 0, 0);
        if (SILU) raw1[u] = i < nvec ? __ldg(w1 + i) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < FG_UNROLL; u++) {
        const int i = c0 + lane + u * 32;
        if (i < nvec) {
          float f0[V], f1[V];
          Vec16<WT>::cvt(raw0[u], f0);
          if (SILU) Vec16<WT>::cvt(raw1[u], f1);
          const float4 *xr = reinterpret_cast<const float4 *>(xv + (size_t)i * V);
#pragma unroll
          for (int qq = 0; qq < V / 4; qq++) {
            const float4 t = xr[qq];
            a0 += f0[4 * qq] * t.x + f0[4 * qq + 1] * t.y + f0[4 * qq + 2] * t.z + f0[4 * qq + 3] * t.w;
            if (SILU) a1 += f1[4 * qq] * t.x + f1[4 * qq + 1] * t.y + f1[4 * qq + 2] * t.z + f1[4 * qq + 3] * t.w;
          }
        }
      }
    }
  } else {
    for (int c = lane; c < k; c += 32) {
      const float t = xv[c];
      a0 += ld<WT>(w, (size_t)r0 * k + c) * t;
      if (SILU) a1 += ld<WT>(w, (size_t)r1 * k + c) * t;
    }
  }
  hg_pdl_trigger();  // this warp's loads are done
  a0 = warp_sum(a0);
  if (SILU) a1 = warp_sum(a1);
  if (lane != 0) return;
  const float y0 = a0 + (bias ? load_any(bias, bt, r0) : 0.f);
  float v = y0;
  if (SILU) {
    const float y1 = a1 + (bias ? load_any(bias, bt, r1) : 0.f);
    v = y0 / (1.f + expf(-y0)) * y1;
  }
  if (EPI & FG_ACCUMULATE) out[r0] += v; else out[r0] = v;
}

// ---- the split form (the gemvSplit switch): k of a row over S warps ----
// One warp a row leaves the 4096-row GEMVs at 256 blocks of 16 warps: under two a SM, each warp
// with one load round in flight between its FMAs, so few bytes are in flight an SM and the last
// blocks run alone. Here a block of 16 warps holds R = 16 / S rows × S slices: warp (r, s) sums
// the chunks s, s + S, s + 2S, ... of row r (a chunk = 32·U 16-byte words, U loads in flight a
// lane and row), and one thread a row adds the S partial sums from shared memory in slice order
// (deterministic; bit-equal run to run). Vector loads only (the one-warp kernel serves the rest).
// NORM folds rmsNorm into the epilogue instead of a prologue: the warps sum w·(x·nw) and x² over
// their slices as the weights stream (a row's S slices cover all of k, so the row's group has
// Σx² without another pass over x), and y = rsqrt(Σx²/k + eps)·Σ w·(x·nw): no wait before the
// weight stream, no rmsNorm launch. Resident blocks an SM by the 16-byte registers a lane
// holds, L = U·(SiLU ? 2 : 1): L = 4 → 3 (40 registers; at 4 blocks, 32 registers, it spilled),
// 8 → 2, 16 → 1: ≥ 64 KB of loads in flight an SM either way.
struct SplitArgs {
  float *out;
  const float *x;
  const void *w, *bias, *nw;  // nw (NORM): the norm weight, of the weights' dtype
  int bt, k, m;
  float eps;
  // ROPE: rows [0, ropeRows) are heads of 2·half values rotated by RoPE at position *pos
  // (cos/sin tables [positions, half]), as rope_kernel (rowops.cu) does it.
  const float *cosT, *sinT;
  const int *pos;
  int ropeRows, half;
};

// ROPE: a block's R rows are R/2 RoPE pairs (j, j + half of one head), so the epilogue rotates
// them in place; the rows past the RoPE region follow in order. Else: rows b·R + i.
template <int R, bool ROPE>
__device__ __forceinline__ int split_row(const SplitArgs &a, int b, int i) {
  if (ROPE) {
    const int ropeBlocks = a.ropeRows / R;
    if (b < ropeBlocks) {
      const int p = b * (R / 2) + i / 2, hh = p / a.half, pi = p % a.half;
      return hh * 2 * a.half + pi + (i & 1) * a.half;
    }
    return a.ropeRows + (b - ropeBlocks) * R + i;
  }
  return b * R + i;
}
template <int EPI, int U>
struct SplitOcc { static constexpr int L = U * ((EPI & FG_SILU) ? 2 : 1), BLOCKS = L <= 4 ? 3 : L <= 8 ? 2 : 1; };
template <int WT, int EPI, int S, int U, bool NORM, bool ROPE>
__global__ void __launch_bounds__(FG_THREADS, SplitOcc<EPI, U>::BLOCKS) gemv_split_kernel(SplitArgs a) {
  constexpr bool SILU = (EPI & FG_SILU) != 0;
  constexpr int ES = WT == DT_F32 ? 4 : 2, V = Vec16<WT>::N, R = FG_WARPS / S, CHUNK = 32 * U;
  __shared__ float part[3][FG_WARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, k = a.k, m = a.m;
  const int r0 = split_row<R, ROPE>(a, blockIdx.x, warp / S), slice = warp % S;
  hg_pdl_wait();  // x (and out, for +=) come from the kernels before this one
  float a0 = 0.f, a1 = 0.f, ss = 0.f;
  if (r0 < m) {
    const int nvec = k / V;
    const uint4 *w0 = reinterpret_cast<const uint4 *>((const char *)a.w + (size_t)r0 * k * ES);
    const uint4 *w1 = reinterpret_cast<const uint4 *>((const char *)a.w + (size_t)(SILU ? r0 + m : r0) * k * ES);
    const float4 *x4 = reinterpret_cast<const float4 *>(a.x);
    const uint4 *n4 = reinterpret_cast<const uint4 *>(a.nw);
    for (int i0 = slice * CHUNK + lane; i0 < nvec; i0 += S * CHUNK) {
      uint4 raw0[U], raw1[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int i = i0 + u * 32;
        raw0[u] = i < nvec ? __ldg(w0 + i) : make_uint4(0, 0, 0, 0);
        if (SILU) raw1[u] = i < nvec ? __ldg(w1 + i) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int i = i0 + u * 32;
        if (i < nvec) {
          float f0[V], f1[V], h[V];
          Vec16<WT>::cvt(raw0[u], f0);
          if (SILU) Vec16<WT>::cvt(raw1[u], f1);
          const float4 *xr = x4 + i * (V / 4);
#pragma unroll
          for (int qq = 0; qq < V / 4; qq++) {
            const float4 t = xr[qq];
            h[4 * qq] = t.x; h[4 * qq + 1] = t.y; h[4 * qq + 2] = t.z; h[4 * qq + 3] = t.w;
          }
          if (NORM) {
            float nf[V];
            Vec16<WT>::cvt(__ldg(n4 + i), nf);
#pragma unroll
            for (int e = 0; e < V; e++) { ss += h[e] * h[e]; h[e] *= nf[e]; }
          }
#pragma unroll
          for (int qq = 0; qq < V / 4; qq++) {
            a0 += f0[4 * qq] * h[4 * qq] + f0[4 * qq + 1] * h[4 * qq + 1] + f0[4 * qq + 2] * h[4 * qq + 2] + f0[4 * qq + 3] * h[4 * qq + 3];
            if (SILU) a1 += f1[4 * qq] * h[4 * qq] + f1[4 * qq + 1] * h[4 * qq + 1] + f1[4 * qq + 2] * h[4 * qq + 2] + f1[4 * qq + 3] * h[4 * qq + 3];
          }
        }
      }
    }
  }
  hg_pdl_trigger();  // this warp's loads are done
  a0 = warp_sum(a0);
  if (SILU) a1 = warp_sum(a1);
  if (NORM) ss = warp_sum(ss);
  if (lane == 0) { part[0][warp] = a0; part[1][warp] = a1; part[2][warp] = ss; }
  __syncthreads();
  if (threadIdx.x >= R) return;
  const int row = split_row<R, ROPE>(a, blockIdx.x, threadIdx.x);
  if (row >= m) return;  // never inside the RoPE region (ropeRows ≤ m): the pairs below stay whole
  float y0 = 0.f, y1 = 0.f, sq = 0.f;
#pragma unroll
  for (int j = 0; j < S; j++) {
    y0 += part[0][threadIdx.x * S + j];
    if (SILU) y1 += part[1][threadIdx.x * S + j];
    if (NORM) sq += part[2][threadIdx.x * S + j];
  }
  if (NORM) {
    const float r = rsqrtf(sq / k + a.eps);
    y0 *= r;
    y1 *= r;
  }
  y0 += a.bias ? load_any(a.bias, a.bt, row) : 0.f;
  float v = y0;
  if (SILU) {
    y1 += a.bias ? load_any(a.bias, a.bt, row + m) : 0.f;
    v = y0 / (1.f + expf(-y0)) * y1;
  }
  if (ROPE && blockIdx.x < a.ropeRows / R) {  // rotate the pair (thread i holds j or j + half)
    __shared__ float yv[FG_WARPS];
    yv[threadIdx.x] = v;
    __syncwarp((1u << R) - 1);
    const float other = yv[threadIdx.x ^ 1];
    const int pi = (blockIdx.x * (R / 2) + threadIdx.x / 2) % a.half;
    const size_t t = (size_t)*a.pos * a.half + pi;
    const float c = a.cosT[t], s = a.sinT[t];
    v = (threadIdx.x & 1) == 0 ? v * c - other * s : other * s + v * c;
  }
  if (EPI & FG_ACCUMULATE) a.out[row] += v; else a.out[row] = v;
}

// S for a launch: the switch's fixed value, or (1, auto) the smallest that gives about two waves
// of resident warps (m·S ≥ 128 warps an SM); never more slices than the row has chunks.
static int split_ways(const HgCtx *c, int setting, int chunks, int m) {
  int s = setting;
  if (s == 1) {
    const long want = 128L * c->numSMs;
    s = 1;
    while (s < 8 && (long)m * s < want) s <<= 1;
  }
  while (s > 1 && s > chunks) s >>= 1;
  return s;
}

template <int WT, int EPI, int U, bool NORM, bool ROPE = false>
static int launch_split_s(HgCtx *c, int S, const SplitArgs &a) {
  const unsigned blocks = (unsigned)((a.m + FG_WARPS / S - 1) / (FG_WARPS / S));
  switch (S) {
    case 1:
      if constexpr (NORM) return hg_launch(c, gemv_split_kernel<WT, EPI, 1, U, NORM, ROPE>, dim3(blocks), dim3(FG_THREADS), 0, a);
      return (int)cudaErrorInvalidValue;  // S = 1 without a norm is the one-warp kernel's
    case 2: return hg_launch(c, gemv_split_kernel<WT, EPI, 2, U, NORM, ROPE>, dim3(blocks), dim3(FG_THREADS), 0, a);
    case 4: return hg_launch(c, gemv_split_kernel<WT, EPI, 4, U, NORM, ROPE>, dim3(blocks), dim3(FG_THREADS), 0, a);
    default: return hg_launch(c, gemv_split_kernel<WT, EPI, 8, U, NORM, ROPE>, dim3(blocks), dim3(FG_THREADS), 0, a);
  }
}

template <int WT, int EPI, bool NORM>
static int launch_split_u(HgCtx *c, int S, int U, const SplitArgs &a) {
  return U == 8 ? launch_split_s<WT, EPI, 8, NORM>(c, S, a) : launch_split_s<WT, EPI, 4, NORM>(c, S, a);
}

// epi 0 (y), 1 (+= y), 2 (SiLU·up); with the norm only 0 and 2 (core's qkv, gate/up and lm_head);
// RoPE (ropeRows > 0) only with epi 0 and 4 loads a lane (hg_cu_rope folds it only then).
template <int WT>
static int launch_split(HgCtx *c, int epi, int S, int U, const SplitArgs &a) {
  if (a.ropeRows > 0) {
    if (epi != 0 || U != 4) return (int)cudaErrorInvalidValue;
    return a.nw ? launch_split_s<WT, 0, 4, true, true>(c, S, a) : launch_split_s<WT, 0, 4, false, true>(c, S, a);
  }
  if (a.nw) {
    if (epi == 0) return launch_split_u<WT, 0, true>(c, S, U, a);
    if (epi == 2) return launch_split_u<WT, 2, true>(c, S, U, a);
    return (int)cudaErrorInvalidValue;
  }
  switch (epi) {
    case 0: return launch_split_u<WT, 0, false>(c, S, U, a);
    case 1: return launch_split_u<WT, 1, false>(c, S, U, a);
    default: return launch_split_u<WT, 2, false>(c, S, U, a);
  }
}

template <int WT, bool NORM, int EPI>
static int launch_fg(HgCtx *c, bool vec, unsigned blocks, size_t shmem, float *out, const float *x, const void *w, const void *bias, int bt,
                      const void *nw, int nt, float eps, int k, int m) {
  if (vec) return hg_launch(c, gemv_fused_kernel<WT, NORM, EPI, true>, dim3(blocks), dim3(FG_THREADS), shmem, out, x, w, bias, bt, nw, nt, eps, k, m);
  return hg_launch(c, gemv_fused_kernel<WT, NORM, EPI, false>, dim3(blocks), dim3(FG_THREADS), shmem, out, x, w, bias, bt, nw, nt, eps, k, m);
}

template <int WT, bool NORM>
static int launch_fg_epi(HgCtx *c, int epi, bool vec, unsigned blocks, size_t shmem, float *out, const float *x, const void *w, const void *bias,
                         int bt, const void *nw, int nt, float eps, int k, int m) {
  switch (epi) {
    case 0: return launch_fg<WT, NORM, 0>(c, vec, blocks, shmem, out, x, w, bias, bt, nw, nt, eps, k, m);
    case 1: return launch_fg<WT, NORM, 1>(c, vec, blocks, shmem, out, x, w, bias, bt, nw, nt, eps, k, m);
    case 2: return launch_fg<WT, NORM, 2>(c, vec, blocks, shmem, out, x, w, bias, bt, nw, nt, eps, k, m);
    default: return launch_fg<WT, NORM, 3>(c, vec, blocks, shmem, out, x, w, bias, bt, nw, nt, eps, k, m);
  }
}

// Shared memory above the default 48 KB must be opted into, per kernel instance.
template <int WT>
static int allow_shmem(size_t bytes) {
  const void *fns[8] = {
      (const void *)gemv_fused_kernel<WT, true, 0, true>, (const void *)gemv_fused_kernel<WT, true, 1, true>,
      (const void *)gemv_fused_kernel<WT, true, 2, true>, (const void *)gemv_fused_kernel<WT, true, 3, true>,
      (const void *)gemv_fused_kernel<WT, true, 0, false>, (const void *)gemv_fused_kernel<WT, true, 1, false>,
      (const void *)gemv_fused_kernel<WT, true, 2, false>, (const void *)gemv_fused_kernel<WT, true, 3, false>};
  for (const void *f : fns) {
    cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) return (int)e;
  }
  return 0;
}

int hg_launch_gemv_fused(HgCtx *c, const Cmd &cmd) {
  float *out = (float *)cmd.p[0];
  const float *x = (const float *)cmd.p[1];
  const void *w = cmd.p[2], *bias = cmd.p[3], *nw = cmd.p[4];
  const int wt = cmd.s[0], bt = cmd.s[1], nt = cmd.s[2], k = cmd.s[3], m = cmd.s[4], epi = cmd.s[5];
  const bool vec = cmd.s[6] != 0;
  const unsigned blocks = (unsigned)((m + FG_WARPS - 1) / FG_WARPS);
  const size_t shmem = nw ? (size_t)k * sizeof(float) : 0;
  // The split form (s[7] S, s[8] U; 0: not taken): vector loads, the norm in the epilogue.
  if (cmd.s[7] > 0) {
    // s[9] RoPE rows (0 none), s[10] half; p[5] cos, p[6] sin, p[7] the position (blob)
    const SplitArgs a = {out, x, w, bias, nw, bt, k, m, cmd.f[0], (const float *)cmd.p[5], (const float *)cmd.p[6], (const int *)cmd.p[7], cmd.s[9], cmd.s[10]};
    HG_DISPATCH_DT(wt, W, return launch_split<W>(c, epi, cmd.s[7], cmd.s[8], a));
  }
  if (nw) { HG_DISPATCH_DT(wt, W, return (launch_fg_epi<W, true>(c, epi, vec, blocks, shmem, out, x, w, bias, bt, nw, nt, cmd.f[0], k, m))); }
  HG_DISPATCH_DT(wt, W, return (launch_fg_epi<W, false>(c, epi, vec, blocks, shmem, out, x, w, bias, bt, nw, nt, cmd.f[0], k, m)));
  return 0;
}

Cmd hg_new_cmd(int kind);

// The qkvRope switch: RoPE of one row (n = 1) recorded right after a split GEMV (4 loads a lane,
// epilogue y) that wrote that row is done by the GEMV's epilogue instead of rope_kernel. g: the
// last recorded command; x: the row RoPE rotates (heads·2·half values); dpos: the position in
// the step's blob. Returns 1 when folded (the caller then records nothing).
int hg_gemv_fold_rope(Cmd &g, const float *x, int heads, int headDim, const float *cosT, const float *sinT, int half, const int *dpos) {
  if (g.kind != CMD_GEMV_FUSED || g.s[7] < 1 || g.s[8] != 4 || g.s[5] != 0 || g.s[9] != 0 || g.p[0] != x || !dpos) return 0;
  const int R = FG_WARPS / g.s[7];
  const long ropeRows = (long)heads * headDim;
  if (headDim != 2 * half || half < 1 || R < 2 || ropeRows > g.s[4] || ropeRows % R != 0) return 0;
  g.p[5] = cosT; g.p[6] = sinT; g.p[7] = dpos;
  g.s[9] = (int)ropeRows; g.s[10] = half;
  return 1;
}

extern "C" {

// Largest k the normalising prologue takes (x staged in shared memory).
HG_EXPORT int hg_cu_matvec_max_norm_k(void) { return 57344; }

// out[0, :m] (+)= epilogue(h · wᵀ + bias), h = x or rmsNorm(x)·nw (nw null: no norm). epi: bit 0
// accumulate, bit 1 SiLU·up (w and bias have 2m rows: gate then up), bit 2: take the norm only
// in the weight stream (free there), else return -1 and launch nothing. One row; recordable.
HG_EXPORT int hg_cu_matvec(HgCtx *c, float *out, const float *x, const void *w, int wt, const void *bias, int bt, const void *nw, int nt, float eps,
                           int k, int m, int epi) {
  // The weight stream (gemvStream switch, gemv_stream.cu): 2-byte weights in rows of 16-byte pieces.
  const int spw = c->gemvStream && (wt == DT_BF16 || wt == DT_F16) && k % 8 == 0 && ((uintptr_t)w & 15) == 0 && (epi & 3) != 3
                      ? hg_gemv_stream_slots(k, c->gemvStream) : 0;
  if ((epi & 4) && nw && spw == 0) return -1;  // the caller rather normalises apart than in this kernel's prologue
  if (nw && k > hg_cu_matvec_max_norm_k()) return (int)cudaErrorInvalidValue;
  if (nw && (size_t)k * sizeof(float) > (48u << 10)) {
    static size_t allowed[3] = {0, 0, 0};  // per weight dtype: the largest opt-in made so far
    const size_t bytes = (size_t)k * sizeof(float);
    if (wt < 0 || wt > 2) return (int)cudaErrorInvalidValue;
    if (bytes > allowed[wt]) {
      int r = 0;
      HG_DISPATCH_DT(wt, W, r = allow_shmem<W>(bytes));
      if (r) return r;
      allowed[wt] = bytes;
    }
  }
  HG_FLUSH_REC(c);
  if (spw > 0) {
    Cmd sc = hg_new_cmd(CMD_GEMV_STREAM);
    sc.p[0] = out; sc.p[1] = x; sc.p[2] = w; sc.p[3] = bias; sc.p[4] = nw;
    sc.s[0] = wt; sc.s[1] = bt; sc.s[2] = nt; sc.s[3] = k; sc.s[4] = m; sc.s[5] = epi & 3; sc.s[6] = spw;
    sc.f[0] = eps;
    return hg_submit(c, sc);
  }
  const int vw = wt == DT_F32 ? 4 : 8;
  Cmd cmd = hg_new_cmd(CMD_GEMV_FUSED);
  cmd.p[0] = out; cmd.p[1] = x; cmd.p[2] = w; cmd.p[3] = bias; cmd.p[4] = nw;
  cmd.s[0] = wt; cmd.s[1] = bt; cmd.s[2] = nt; cmd.s[3] = k; cmd.s[4] = m; cmd.s[5] = epi & 3;
  cmd.s[6] = k % vw == 0 && ((uintptr_t)w & 15) == 0 && (nw || ((uintptr_t)x & 15) == 0);
  // The split form (gemvSplit switch): x 16-byte aligned; a norm weight of the weights' dtype,
  // aligned, and epilogue y or SiLU·up. S = 1 takes it only to fold the norm (else the one-warp
  // kernel is the same thing).
  const bool normOk = !nw || (nt == wt && ((uintptr_t)nw & 15) == 0 && ((epi & 3) == 0 || (epi & 3) == 2));
  if (c->gemvSplit && cmd.s[6] && ((uintptr_t)x & 15) == 0 && (epi & 3) != 3 && normOk) {
    const int U = c->gemvUnroll, chunks = (k / vw + 32 * U - 1) / (32 * U);
    const int S = split_ways(c, c->gemvSplit, chunks, m);
    if (S > 1 || nw) { cmd.s[7] = S; cmd.s[8] = U; }
  }
  cmd.f[0] = eps;
  return hg_submit(c, cmd);
}

}  // extern "C"
