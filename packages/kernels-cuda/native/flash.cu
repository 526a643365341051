// Causal prefill attention without the n × n score matrix. Query row i (position firstPos + i)
// attends cached keys [0, firstPos + i], stored at slots start + j. bf16/f16 caches with head dims
// 64/128 take a tensor-core kernel (flash_v3.cu on sm_90 at head dim 128, else flash_v2.cu);
// other shapes and f32 caches take the warp-per-row kernel below.
#include <stdlib.h>
#include <string.h>
#include "flash_mma.cuh"

static const int SIMT_MAX_HD = 256;

// Any dtype and head dim ≤ 256: a warp per (query row, head); lanes score 32 keys at a time,
// then each lane accumulates its dims (lane + 32·i) over those keys.
template <int KT>
__global__ void __launch_bounds__(128) flash_causal_simt_kernel(float *out, const float *q, int rowStride, const void *k, const void *v, int group,
                                                                int headDim, int cap, int start, int firstPos, int n, float scaleLog2) {
  __shared__ float qs[4][SIMT_MAX_HD];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int row = blockIdx.x * 4 + warp, h = blockIdx.y, g = h / group;
  if (row >= n) return;
  for (int d = lane; d < headDim; d += 32) qs[warp][d] = q[(size_t)row * rowStride + (size_t)h * headDim + d] * scaleLog2;
  __syncwarp();
  const int keys = firstPos + row + 1;
  const size_t base = ((size_t)g * cap + start) * headDim;
  float m = -INFINITY, l = 0.f, acc[SIMT_MAX_HD / 32];
#pragma unroll
  for (int i = 0; i < SIMT_MAX_HD / 32; i++) acc[i] = 0.f;
  for (int j0 = 0; j0 < keys; j0 += 32) {
    const int j = j0 + lane;
    float s = -INFINITY;
    if (j < keys) {
      s = 0.f;
      for (int d = 0; d < headDim; d++) s += qs[warp][d] * ld<KT>(k, base + (size_t)j * headDim + d);
    }
    const float mnew = fmaxf(m, warp_max(s));  // key j0 is always valid: never -inf
    const float alpha = exp2f(m - mnew), p = j < keys ? exp2f(s - mnew) : 0.f;
    l = l * alpha + warp_sum(p);
#pragma unroll
    for (int i = 0; i < SIMT_MAX_HD / 32; i++) acc[i] *= alpha;
    const int cnt = min(32, keys - j0);
    for (int t = 0; t < cnt; t++) {
      const float pt = __shfl_sync(0xffffffffu, p, t);
      const size_t vrow = base + (size_t)(j0 + t) * headDim;
#pragma unroll
      for (int i = 0; i < SIMT_MAX_HD / 32; i++) {
        const int d = lane + 32 * i;
        if (d < headDim) acc[i] += pt * ld<KT>(v, vrow + d);
      }
    }
    m = mnew;
  }
  const float inv = 1.f / l;
#pragma unroll
  for (int i = 0; i < SIMT_MAX_HD / 32; i++) {
    const int d = lane + 32 * i;
    if (d < headDim) out[(size_t)row * rowStride + (size_t)h * headDim + d] = acc[i] * inv;
  }
}

// Which tensor-core kernel serves: FLASH_V2 with 4 warps (64 query rows a block) at 2 or 3 blocks
// an SM or with 8 warps (128 rows), or FLASH_V3 (wgmma; sm_90 only, else v2-64 serves).
// hg_cu_flash_variant picks one: the backend's flash option sends its choice before each prefill
// call (no environment switch: two backends in a process must not share a hidden global). Code 1 (a retired kernel) is unknown, like any code out
// of range. v3 serves head dim 128 only: at 64 it fails the device check (not understood yet), so
// there v2-64 serves; FLASH_V3_ALL forces it at 64 too (diagnosis only).
enum { FLASH_DEFAULT = 0, FLASH_V2_64 = 2, FLASH_V2_128 = 3, FLASH_V2_64X3 = 4, FLASH_V3 = 5, FLASH_V3X3 = 6, FLASH_V3_ALL = 7, FLASH_VARIANTS = 8 };
static const char *const FLASH_NAMES[FLASH_VARIANTS] = {NULL, NULL, "v2-64", "v2-128", "v2-64x3", "v3", "v3x3", "v3-all"};
// The default: v3 (the fastest on the H200: the package README's prefill figures),
// which falls back to v2-64 at head dim 64 and on devices other than sm_90.
static const int FLASH_CHOSEN = FLASH_V3;
static int flashVariant = FLASH_CHOSEN;

static int flash_variant(void) { return flashVariant; }

extern "C" {

// Sets the tensor-core kernel (FLASH_* above; 0 = the default) when v is one of them; returns the
// one in effect.
HG_EXPORT int hg_cu_flash_variant(int v) {
  if (v >= 0 && v < FLASH_VARIANTS && (v == FLASH_DEFAULT || FLASH_NAMES[v])) flashVariant = v == FLASH_DEFAULT ? FLASH_CHOSEN : v;
  return flash_variant();
}

// 1 when this device runs the wgmma kernel (v3, v3x3); elsewhere those variants fall back to v2-64.
HG_EXPORT int hg_cu_flash_wgmma(void) { return hg_flash_v3_supported(); }

// 1 when a tensor-core kernel serves this dtype/head dim (tests and benches report it).
HG_EXPORT int hg_cu_attn_causal_path(int dt, int headDim) { return (dt == DT_BF16 || dt == DT_F16) && (headDim == 64 || headDim == 128) ? 1 : 0; }

// out/q: [n, heads·headDim] f32 with row stride rowStride; K/V [kvHeads, cap, headDim] of dtype dt.
HG_EXPORT int hg_cu_attn_causal(HgCtx *c, float *out, const float *q, int rowStride, const void *k, const void *v, int dt, int heads, int kvHeads,
                                int headDim, int cap, int start, int firstPos, int n, float scale) {
  HG_FLUSH(c);
  if (n <= 0) return 0;
  if (headDim > SIMT_MAX_HD || kvHeads <= 0 || heads % kvHeads != 0) return (int)cudaErrorInvalidValue;
  const int group = heads / kvHeads;
  const float sl = scale * 1.4426950408889634f;  // exp(x) = exp2(x·log2 e)
  // The tensor-core kernels read q/out as float2 and K/V rows as 16-byte chunks.
  const bool aligned = (((uintptr_t)q | (uintptr_t)out) & 7) == 0 && rowStride % 2 == 0 && (((uintptr_t)k | (uintptr_t)v) & 15) == 0;
  if (hg_cu_attn_causal_path(dt, headDim) && aligned) {
    const int variant = flash_variant();
    if ((((variant == FLASH_V3 || variant == FLASH_V3X3) && headDim == 128) || variant == FLASH_V3_ALL) && hg_flash_v3_supported())
      return hg_flash_v3(c, variant == FLASH_V3X3, out, q, rowStride, k, v, dt, heads, group, headDim, cap, start, firstPos, n, sl);
    const int shape = variant == FLASH_V2_128 ? FLASH2_W8 : variant == FLASH_V2_64X3 ? FLASH2_W4_OCC3 : FLASH2_W4;
    return hg_flash_v2(c, shape, out, q, rowStride, k, v, dt, heads, group, headDim, cap, start, firstPos, n, sl);
  }
  dim3 grid((n + 3) / 4, heads);
  HG_DISPATCH_DT(dt, K, (flash_causal_simt_kernel<K><<<grid, 128, 0, c->compute>>>(out, q, rowStride, k, v, group, headDim, cap, start, firstPos, n, sl)));
  return hg_launched();
}

}  // extern "C"
