// Causal prefill attention, FlashAttention-2 style, for bf16/f16 caches with head dim 64 or 128.
// A block holds NW·16 query rows (16 per warp, Q fragments in registers for the whole pass) and
// walks the keys in tiles of 64: K and V tiles arrive by cp.async into two shared-memory stages
// (tile t+1 loads while tile t is computed), K fragments come from ldmatrix and V fragments from
// ldmatrix.trans (V stays [key][dim], no transpose pass), the score accumulators become the A
// operand of P·V in registers, and only tiles that cross a warp's diagonal are masked.
#include "flash_mma.cuh"

namespace {

constexpr int BK = 64;  // keys per tile

// Shared-memory rows padded by 16 bytes: the 8 row addresses of one ldmatrix matrix then fall in
// 8 different 16-byte bank groups (no conflicts), with the same layout for K and V.
template <int HD> struct Tiles {
  static constexpr int STRIDE = HD + 8;          // elements per row
  static constexpr int TILE = BK * STRIDE;       // elements per K (or V) tile
  static constexpr int BYTES = 2 * 2 * TILE * 2; // two stages of K and V, 2-byte elements
};

// grid (heads, query blocks): the heads of one KV group run in neighbouring blocks, so their K/V
// tiles are read from L2 after the first; query blocks go longest (last) first.
// MINB blocks per SM caps the registers: 4 warps × 3 blocks holds 12 warps an SM (168 registers,
// a few spilled), 4 × 2 or 8 × 1 only 8 (no spills); which wins is measured (DEVICE-NOTES.md).
template <typename T, int HD, int NW, int MINB>
__global__ void __launch_bounds__(NW * 32, MINB)
    flash2_kernel(float *out, const float *q, int rowStride, const T *k, const T *v, int group, int cap, int start, int firstPos, int n, float scaleLog2) {
  extern __shared__ __align__(16) unsigned char smem[];
  T *const sm = reinterpret_cast<T *>(smem);
  constexpr int BQ = NW * 16, S = Tiles<HD>::STRIDE, TILE = Tiles<HD>::TILE, CH = HD / 8;  // CH: 16-byte chunks per row
  const int h = blockIdx.x, g = h / group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BQ;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2;
  const int r0 = q0 + warp * 16 + gid, r1 = r0 + 8;
  const int qLast = min(q0 + BQ, n) - 1;
  const int keyEnd = firstPos + qLast + 1;  // keys the block's last row sees
  const int tiles = (keyEnd + BK - 1) / BK;
  const int warpFirstPos = firstPos + q0 + warp * 16;                  // the warp's smallest position
  const int warpLastPos = firstPos + min(q0 + warp * 16 + 15, qLast);  // and largest real one
  const T *kb = k + ((size_t)g * cap + start) * HD, *vb = v + ((size_t)g * cap + start) * HD;

  // One tile's K and V rows into stage `st`; consecutive threads take consecutive chunks of a row.
  auto load_tile = [&](int t, int st) {
    T *ks = sm + st * 2 * TILE, *vs = ks + TILE;
    const int kt0 = t * BK;
#pragma unroll
    for (int i = 0; i < BK * CH / (NW * 32); i++) {
      const int e = threadIdx.x + i * NW * 32, key = e / CH, c = (e % CH) * 8;
      const bool ok = kt0 + key < keyEnd;
      const size_t off = (size_t)(ok ? kt0 + key : 0) * HD + c;
      cp_async16(smem_u32(ks + key * S + c), kb + off, ok);
      cp_async16(smem_u32(vs + key * S + c), vb + off, ok);
    }
    cp_async_commit();
  };
  load_tile(0, 0);

  unsigned qa[HD / 16][4];
  load_q_fragments<T, HD>(qa, q, rowStride, h, r0, n, scaleLog2);
  float o[HD / 8][4];
#pragma unroll
  for (int j = 0; j < HD / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  // ldmatrix row addresses: K (non-transposed) lane → key row lane&7, dim chunk lane>>3 (four
  // matrices = 32 dims); V (transposed) lane → key row (lane&7) + 8·((lane>>3)&1), dim chunk lane>>4.
  const int kRow = lane & 7, kCol = 8 * (lane >> 3);
  const int vRow = (lane & 7) + 8 * ((lane >> 3) & 1), vCol = 8 * (lane >> 4);

  for (int t = 0; t < tiles; t++) {
    cp_async_wait_all();
    __syncthreads();  // tile t is visible to all; every warp is done with tile t-1, whose stage loads next
    if (t + 1 < tiles) load_tile(t + 1, (t + 1) & 1);
    const int kt0 = t * BK;
    if (kt0 > warpLastPos) continue;  // every key of the tile is in the future of every row of this warp
    const T *ks = sm + (t & 1) * 2 * TILE, *vs = ks + TILE;

    float sc[BK / 8][4];
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
    for (int s = 0; s < HD / 16; s += 2) {
#pragma unroll
      for (int nt = 0; nt < BK / 8; nt++) {
        unsigned b0, b1, b2, b3;  // keys 8nt.., dims 16s.. (b0, b1) and 16(s+1).. (b2, b3)
        ldsm_x4(b0, b1, b2, b3, smem_u32(ks + (nt * 8 + kRow) * S + 16 * s + kCol));
        Mma<T>::run(sc[nt], qa[s], b0, b1);
        Mma<T>::run(sc[nt], qa[s + 1], b2, b3);
      }
    }
    if (kt0 + BK - 1 > warpFirstPos) mask_future<BK>(sc, kt0, firstPos + r0, firstPos + r1);  // the tile reaches past some row's position
    unsigned pa[BK / 16][4];
    softmax_step<T, BK, HD>(sc, m0, m1, l0, l1, o, pa);
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) {
#pragma unroll
      for (int j = 0; j < HD / 8; j += 2) {
        unsigned b0, b1, b2, b3;  // keys 16kk.. (b0) and 16kk+8.. (b1) of dims 8j.., then of dims 8(j+1)..
        ldsm_x4_trans(b0, b1, b2, b3, smem_u32(vs + (16 * kk + vRow) * S + 8 * j + vCol));
        Mma<T>::run(o[j], pa[kk], b0, b1);
        Mma<T>::run(o[j + 1], pa[kk], b2, b3);
      }
    }
  }
  store_rows<HD>(out, rowStride, h, r0, n, o, l0, l1);
}

template <typename T, int HD, int NW, int MINB>
int launch_v2(HgCtx *c, float *out, const float *q, int rowStride, const void *k, const void *v, int group, int heads, int cap, int start, int firstPos,
              int n, float scaleLog2) {
  static bool sized = false;  // dynamic shared memory beyond 48 KiB must be allowed once per kernel
  if (!sized) {
    const cudaError_t e = cudaFuncSetAttribute(flash2_kernel<T, HD, NW, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tiles<HD>::BYTES);
    if (e != cudaSuccess) return (int)e;
    sized = true;
  }
  const int blocks = (n + NW * 16 - 1) / (NW * 16);
  if (blocks > 65535) return (int)cudaErrorInvalidConfiguration;  // grid.y: 4M rows at 64 a block, far past any context
  flash2_kernel<T, HD, NW, MINB><<<dim3(heads, blocks), NW * 32, Tiles<HD>::BYTES, c->compute>>>(out, q, rowStride, (const T *)k, (const T *)v, group, cap,
                                                                                           start, firstPos, n, scaleLog2);
  return hg_launched();
}

template <typename T, int HD>
int launch_v2_shape(HgCtx *c, int shape, float *out, const float *q, int rowStride, const void *k, const void *v, int group, int heads, int cap,
                    int start, int firstPos, int n, float scaleLog2) {
  switch (shape) {
    case FLASH2_W8: return launch_v2<T, HD, 8, 1>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2);
    case FLASH2_W4_OCC3: return launch_v2<T, HD, 4, 3>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2);
    default: return launch_v2<T, HD, 4, 2>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2);
  }
}

}  // namespace

int hg_flash_v2(HgCtx *c, int shape, float *out, const float *q, int rowStride, const void *k, const void *v, int dt, int heads, int group,
                int headDim, int cap, int start, int firstPos, int n, float scaleLog2) {
  if (dt == DT_BF16)
    return headDim == 128 ? launch_v2_shape<__nv_bfloat16, 128>(c, shape, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2)
                          : launch_v2_shape<__nv_bfloat16, 64>(c, shape, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2);
  return headDim == 128 ? launch_v2_shape<__half, 128>(c, shape, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2)
                        : launch_v2_shape<__half, 64>(c, shape, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2);
}
