// Causal prefill attention without the n × n score matrix: K/V tiles pass through shared
// memory, each warp keeps 16 query rows' scores, running max and sum in registers (online
// softmax) and its output rows in tensor-core accumulators. Query row i (position
// firstPos + i) attends cached keys [0, firstPos + i], stored at slots start + j.
// bf16/f16 caches with head dims 64/128 use mma.sync (m16n8k16, f32 accumulation); other
// shapes and f32 caches take a plain warp-per-row kernel.
#include "common.cuh"

template <typename T> struct Mma;
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ unsigned pack(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);  // a in the low half: the lower column
    return *reinterpret_cast<unsigned *>(&h);
  }
  static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma<__half> {
  static __device__ __forceinline__ unsigned pack(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<unsigned *>(&h);
  }
  static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

static const int FA_BQ = 64, FA_BK = 64;  // query rows per block (16 per warp), keys per tile

// grid (query blocks, heads), 128 threads. Fragment layouts are PTX's for m16n8k16: lane =
// 4·gid + tid; A rows gid and gid + 8, columns 2·tid (+1) and 2·tid + 8 (+1); B column gid,
// rows 2·tid (+1) and 2·tid + 8 (+1); C rows gid and gid + 8, columns 2·tid (+1).
template <typename T, int HD>
__global__ void __launch_bounds__(128) flash_causal_kernel(float *out, const float *q, int rowStride, const T *k, const T *v, int group,
                                                           int cap, int start, int firstPos, int n, float scaleLog2) {
  __shared__ __align__(16) T Ks[FA_BK][HD + 8];  // [key][dim]
  __shared__ __align__(16) T Vt[HD][FA_BK + 8];  // [dim][key]: B fragments of P·V are two adjacent keys
  const int h = blockIdx.y, g = h / group;
  const int q0 = (gridDim.x - 1 - blockIdx.x) * FA_BQ;  // the longest (last) query blocks start first
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tid = lane & 3;
  const int r0 = q0 + warp * 16 + gid, r1 = r0 + 8;

  unsigned qa[HD / 16][4];
  {
    const float *q0p = q + (size_t)r0 * rowStride + (size_t)h * HD, *q1p = q + (size_t)r1 * rowStride + (size_t)h * HD;
#pragma unroll
    for (int s = 0; s < HD / 16; s++) {
      const int c0 = 16 * s + 2 * tid, c1 = c0 + 8;
      float2 a = make_float2(0.f, 0.f), b = a, cc = a, d = a;
      if (r0 < n) { a = *reinterpret_cast<const float2 *>(q0p + c0); cc = *reinterpret_cast<const float2 *>(q0p + c1); }
      if (r1 < n) { b = *reinterpret_cast<const float2 *>(q1p + c0); d = *reinterpret_cast<const float2 *>(q1p + c1); }
      qa[s][0] = Mma<T>::pack(a.x * scaleLog2, a.y * scaleLog2);
      qa[s][1] = Mma<T>::pack(b.x * scaleLog2, b.y * scaleLog2);
      qa[s][2] = Mma<T>::pack(cc.x * scaleLog2, cc.y * scaleLog2);
      qa[s][3] = Mma<T>::pack(d.x * scaleLog2, d.y * scaleLog2);
    }
  }
  float o[HD / 8][4];
#pragma unroll
  for (int j = 0; j < HD / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  const int qLast = min(q0 + FA_BQ, n) - 1;
  const int keyEnd = firstPos + qLast + 1;
  const int warpFirstPos = firstPos + q0 + warp * 16;  // the warp's smallest query position
  const T *kb = k + ((size_t)g * cap + start) * HD, *vb = v + ((size_t)g * cap + start) * HD;

  for (int kt0 = 0; kt0 < keyEnd; kt0 += FA_BK) {
    __syncthreads();  // the previous tile's readers are done
    for (int e = threadIdx.x; e < FA_BK * HD / 8; e += blockDim.x) {
      const int key = e / (HD / 8), c8 = (e % (HD / 8)) * 8;  // consecutive threads: one K row
      uint4 kv = make_uint4(0, 0, 0, 0);
      if (kt0 + key < keyEnd) kv = *reinterpret_cast<const uint4 *>(kb + (size_t)(kt0 + key) * HD + c8);
      *reinterpret_cast<uint4 *>(&Ks[key][c8]) = kv;
    }
    for (int e = threadIdx.x; e < FA_BK * HD / 8; e += blockDim.x) {
      const int key = e % FA_BK, c8 = (e / FA_BK) * 8;  // consecutive threads: consecutive keys
      uint4 vv = make_uint4(0, 0, 0, 0);
      if (kt0 + key < keyEnd) vv = *reinterpret_cast<const uint4 *>(vb + (size_t)(kt0 + key) * HD + c8);
      const T *ve = reinterpret_cast<const T *>(&vv);
#pragma unroll
      for (int i = 0; i < 8; i++) Vt[c8 + i][key] = ve[i];
    }
    __syncthreads();
    if (kt0 > firstPos + min(q0 + warp * 16 + 15, qLast)) continue;  // every key of the tile is in this warp's future

    float sc[FA_BK / 8][4];
#pragma unroll
    for (int nt = 0; nt < FA_BK / 8; nt++) {
      sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
      for (int s = 0; s < HD / 16; s++) {
        const unsigned b0 = *reinterpret_cast<const unsigned *>(&Ks[nt * 8 + gid][16 * s + 2 * tid]);
        const unsigned b1 = *reinterpret_cast<const unsigned *>(&Ks[nt * 8 + gid][16 * s + 8 + 2 * tid]);
        Mma<T>::run(sc[nt], qa[s], b0, b1);
      }
    }
    if (kt0 + FA_BK - 1 > warpFirstPos) {  // the tile reaches past some row's position: mask the future
#pragma unroll
      for (int nt = 0; nt < FA_BK / 8; nt++) {
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int kj = kt0 + nt * 8 + 2 * tid + e;
          if (kj > firstPos + r0) sc[nt][e] = -INFINITY;
          if (kj > firstPos + r1) sc[nt][2 + e] = -INFINITY;
        }
      }
    }
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int nt = 0; nt < FA_BK / 8; nt++) {
      mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float base0 = mx0 == -INFINITY ? 0.f : mx0, base1 = mx1 == -INFINITY ? 0.f : mx1;
    const float a0 = exp2f(m0 - base0), a1 = exp2f(m1 - base1);
    m0 = mx0;
    m1 = mx1;
    l0 *= a0;
    l1 *= a1;
#pragma unroll
    for (int j = 0; j < HD / 8; j++) { o[j][0] *= a0; o[j][1] *= a0; o[j][2] *= a1; o[j][3] *= a1; }
    unsigned pa[FA_BK / 16][4];
#pragma unroll
    for (int nt = 0; nt < FA_BK / 8; nt++) {
      const float p00 = exp2f(sc[nt][0] - base0), p01 = exp2f(sc[nt][1] - base0);
      const float p10 = exp2f(sc[nt][2] - base1), p11 = exp2f(sc[nt][3] - base1);
      l0 += p00 + p01;
      l1 += p10 + p11;
      pa[nt / 2][(nt & 1) * 2] = Mma<T>::pack(p00, p01);
      pa[nt / 2][(nt & 1) * 2 + 1] = Mma<T>::pack(p10, p11);
    }
#pragma unroll
    for (int j = 0; j < HD / 8; j++) {
#pragma unroll
      for (int kk = 0; kk < FA_BK / 16; kk++) {
        const unsigned b0 = *reinterpret_cast<const unsigned *>(&Vt[8 * j + gid][16 * kk + 2 * tid]);
        const unsigned b1 = *reinterpret_cast<const unsigned *>(&Vt[8 * j + gid][16 * kk + 8 + 2 * tid]);
        Mma<T>::run(o[j], pa[kk], b0, b1);
      }
    }
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
  for (int j = 0; j < HD / 8; j++) {
    const size_t col = (size_t)h * HD + 8 * j + 2 * tid;
    if (r0 < n) *reinterpret_cast<float2 *>(out + (size_t)r0 * rowStride + col) = make_float2(o[j][0] * i0, o[j][1] * i0);
    if (r1 < n) *reinterpret_cast<float2 *>(out + (size_t)r1 * rowStride + col) = make_float2(o[j][2] * i1, o[j][3] * i1);
  }
}

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

template <typename T, int HD>
static void launch_mma(HgCtx *c, float *out, const float *q, int rowStride, const void *k, const void *v, int group, int heads, int cap, int start,
                       int firstPos, int n, float scaleLog2) {
  dim3 grid((n + FA_BQ - 1) / FA_BQ, heads);
  flash_causal_kernel<T, HD><<<grid, 128, 0, c->compute>>>(out, q, rowStride, (const T *)k, (const T *)v, group, cap, start, firstPos, n, scaleLog2);
}

extern "C" {

// 1 when the tensor-core kernel serves this dtype/head dim (tests and benches report it).
HG_EXPORT int hg_cu_attn_causal_path(int dt, int headDim) { return (dt == DT_BF16 || dt == DT_F16) && (headDim == 64 || headDim == 128) ? 1 : 0; }

// out/q: [n, heads·headDim] f32 with row stride rowStride; K/V [kvHeads, cap, headDim] of dtype dt.
HG_EXPORT int hg_cu_attn_causal(HgCtx *c, float *out, const float *q, int rowStride, const void *k, const void *v, int dt, int heads, int kvHeads,
                                int headDim, int cap, int start, int firstPos, int n, float scale) {
  HG_FLUSH(c);
  if (n <= 0) return 0;
  if (headDim > SIMT_MAX_HD) return (int)cudaErrorInvalidValue;
  const int group = heads / kvHeads;
  const float sl = scale * 1.4426950408889634f;  // exp(x) = exp2(x·log2 e)
  const bool aligned = (((uintptr_t)q | (uintptr_t)out) & 7) == 0 && rowStride % 2 == 0 && (((uintptr_t)k | (uintptr_t)v) & 15) == 0;
  if (hg_cu_attn_causal_path(dt, headDim) && aligned) {
    if (dt == DT_BF16) {
      if (headDim == 128) launch_mma<__nv_bfloat16, 128>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, sl);
      else launch_mma<__nv_bfloat16, 64>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, sl);
    } else {
      if (headDim == 128) launch_mma<__half, 128>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, sl);
      else launch_mma<__half, 64>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, sl);
    }
    return hg_launched();
  }
  dim3 grid((n + 3) / 4, heads);
  HG_DISPATCH_DT(dt, K, (flash_causal_simt_kernel<K><<<grid, 128, 0, c->compute>>>(out, q, rowStride, k, v, group, headDim, cap, start, firstPos, n, sl)));
  return hg_launched();
}

}  // extern "C"
