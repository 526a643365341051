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
// hg_pdl_wait/trigger (common.cuh) do nothing in this kernel's plain launch; the trigger after
// the loads lets a programmatically launched weight stream that follows (gemv_stream.cu) start.
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
  if (nw) { HG_DISPATCH_DT(wt, W, return (launch_fg_epi<W, true>(c, epi, vec, blocks, shmem, out, x, w, bias, bt, nw, nt, cmd.f[0], k, m))); }
  HG_DISPATCH_DT(wt, W, return (launch_fg_epi<W, false>(c, epi, vec, blocks, shmem, out, x, w, bias, bt, nw, nt, cmd.f[0], k, m)));
  return 0;
}

Cmd hg_new_cmd(int kind);

extern "C" {

// Largest k the normalising prologue takes (x staged in shared memory).
HG_EXPORT int hg_cu_matvec_max_norm_k(void) { return 57344; }

// out[0, :m] (+)= epilogue(h · wᵀ + bias), h = x or rmsNorm(x)·nw (nw null: no norm). epi: bit 0
// accumulate, bit 1 SiLU·up (w and bias have 2m rows: gate then up), bit 2: take the norm only
// in the weight stream (free there), else return -1 and launch nothing. One row; recordable.
HG_EXPORT int hg_cu_matvec(HgCtx *c, float *out, const float *x, const void *w, int wt, const void *bias, int bt, const void *nw, int nt, float eps,
                           int k, int m, int epi) {
  // The weight stream (gemv_stream.cu) or one warp a row: hg_decode_plan picks.
  HgPlanShape shape = {HG_PLAN_GEMV, wt, k, m, epi & 3, nw != nullptr, 0, ((uintptr_t)w & 15) == 0, 0};
  const HgPlan plan = hg_decode_plan(hg_plan_device(c), shape);
  const int spw = plan.kernel == HG_GEMV_STREAM ? plan.slotsPerWarp : 0;
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
    sc.s[7] = plan.slotBytes;
    sc.s[8] = nw ? 1 : 0;
    sc.s[9] = plan.grid;
    sc.f[0] = eps;
    return hg_submit(c, sc);
  }
  const int vw = wt == DT_F32 ? 4 : 8;
  Cmd cmd = hg_new_cmd(CMD_GEMV_FUSED);
  cmd.p[0] = out; cmd.p[1] = x; cmd.p[2] = w; cmd.p[3] = bias; cmd.p[4] = nw;
  cmd.s[0] = wt; cmd.s[1] = bt; cmd.s[2] = nt; cmd.s[3] = k; cmd.s[4] = m; cmd.s[5] = epi & 3;
  cmd.s[6] = k % vw == 0 && ((uintptr_t)w & 15) == 0 && (nw || ((uintptr_t)x & 15) == 0);
  cmd.f[0] = eps;
  return hg_submit(c, cmd);
}

}  // extern "C"
