// The first tensor-core causal prefill kernel (second pass), kept selectable (HYBRIDGEN_FLASH=v1)
// so benches compare it with flash_v2.cu in one run: 64 query rows a block (16 per warp), K/V tiles
// of 64 keys stored synchronously into shared memory (V transposed on the way), one buffer. Its
// softmax is flash_mma.cuh's shared step (ex2.approx.ftz since the fourth pass; was exp2f).
#include "flash_mma.cuh"

static const int FA_BQ = 64, FA_BK = 64;  // query rows per block (16 per warp), keys per tile

// grid (query blocks, heads), 128 threads.
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
  load_q_fragments<T, HD>(qa, q, rowStride, h, r0, n, scaleLog2);
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
    if (kt0 + FA_BK - 1 > warpFirstPos) mask_future<FA_BK>(sc, kt0, firstPos + r0, firstPos + r1);
    unsigned pa[FA_BK / 16][4];
    softmax_step<T, FA_BK, HD>(sc, m0, m1, l0, l1, o, pa);
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
  store_rows<HD>(out, rowStride, h, r0, n, o, l0, l1);
}

template <typename T, int HD>
static void launch_v1(HgCtx *c, float *out, const float *q, int rowStride, const void *k, const void *v, int group, int heads, int cap, int start,
                      int firstPos, int n, float scaleLog2) {
  dim3 grid((n + FA_BQ - 1) / FA_BQ, heads);
  flash_causal_kernel<T, HD><<<grid, 128, 0, c->compute>>>(out, q, rowStride, (const T *)k, (const T *)v, group, cap, start, firstPos, n, scaleLog2);
}

int hg_flash_v1(HgCtx *c, float *out, const float *q, int rowStride, const void *k, const void *v, int dt, int heads, int group, int headDim, int cap,
                int start, int firstPos, int n, float scaleLog2) {
  if (dt == DT_BF16) {
    if (headDim == 128) launch_v1<__nv_bfloat16, 128>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2);
    else launch_v1<__nv_bfloat16, 64>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2);
  } else {
    if (headDim == 128) launch_v1<__half, 128>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2);
    else launch_v1<__half, 64>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2);
  }
  return hg_launched();
}
