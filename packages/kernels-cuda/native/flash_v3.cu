// Causal prefill attention with Hopper's warpgroup MMA (wgmma), for bf16/f16 caches with head dim
// 64 or 128: flash_v2.cu's structure (64 query rows a block, Q in registers, K/V tiles of 64 keys
// double-buffered by cp.async, online softmax in registers, only diagonal tiles masked), but both
// products run as wgmma m64n64k16 over the whole 64-row block: S = Q·Kᵀ with Q from registers and
// K from shared memory, O += P·V with P from registers and V from shared memory (transposed
// operand, so V stays [key][dim]). Needs sm_90a code; elsewhere hg_flash_v3_supported says no.
#include "flash_mma.cuh"

// wgmma exists only in arch-specific sm_90a code; the compute_90 PTX build leaves the body empty
// (never launched: the launcher checks the device and the kernel's binary version).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define HG_WGMMA 1
#endif

namespace {

constexpr int BQ = 64;  // query rows per block (one warpgroup)

// Shared memory: a tile of 64 rows (keys) is stored as HD/64 panels of [64 rows][64 elements],
// 128 bytes a row, each 16-byte chunk c of row r at chunk c ^ (r & 7) (the 128-byte swizzle wgmma
// reads without bank conflicts). A panel is 8 KiB and 1024-byte aligned.
constexpr int PANEL_BYTES = 64 * 128;
template <int HD> struct Tiles3 {
  static constexpr int TILE_BYTES = HD / 64 * PANEL_BYTES;      // one K (or V) tile
  static constexpr int BYTES = 2 * 2 * TILE_BYTES + 1024;       // two stages of K and V, + alignment
};

#ifdef HG_WGMMA
constexpr int BK = 64;  // keys per tile

// Descriptor of a swizzled (128 B) panel region starting at shared address `addr`: stride 1024 B
// between groups of 8 rows; the leading offset is unused for this layout (1, as is customary).
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

template <typename T> struct Wg;
#define HG_WG_OUT                                                                                                                                 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), \
      "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),           \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define HG_WG_REGS "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define HG_WG_DEF(TYPE, PTX)                                                                                                                      \
  template <> struct Wg<TYPE> {                                                                                                                   \
    /* d (64 × 64 f32, this thread's 32) += a (registers, as mma.sync's A) · B (shared memory, N-major when TRANS_B) */                         \
    template <int TRANS_B> static __device__ __forceinline__ void run(float *d, const unsigned (&a)[4], unsigned long long desc) {               \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                                              \
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX " " HG_WG_REGS ", {%32,%33,%34,%35}, %36, p, 1, 1, %37;\n}\n"       \
                   : HG_WG_OUT                                                                                                                    \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(TRANS_B));                                                        \
    }                                                                                                                                             \
  };
HG_WG_DEF(__nv_bfloat16, "bf16")
HG_WG_DEF(__half, "f16")

__device__ __forceinline__ void wg_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit_wait() {
  asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// cp.async writes are generic-proxy writes; wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// The accumulators are live in registers across the asynchronous products: keep the compiler
// from moving their reads or writes across the fence/wait pair.
__device__ __forceinline__ void wg_pin(float *d) {
#pragma unroll
  for (int i = 0; i < 32; i++) asm volatile("" : "+f"(d[i])::"memory");
}
#endif

// grid (heads, query blocks), 128 threads (one warpgroup). MINB blocks an SM: 2 (191 registers at
// head dim 128) or 3 (168, a few spilled); which wins is measured.
template <typename T, int HD, int MINB>
__global__ void __launch_bounds__(128, MINB)
    flash3_kernel(float *out, const float *q, int rowStride, const T *k, const T *v, int group, int cap, int start, int firstPos, int n, float scaleLog2) {
#ifdef HG_WGMMA
  extern __shared__ unsigned char smem_raw[];
  constexpr int TB = Tiles3<HD>::TILE_BYTES, CH = HD / 8, PANELS = HD / 64;
  const unsigned base = (smem_u32(smem_raw) + 1023) & ~1023u;  // panels must be 1024-byte aligned for the swizzle
  const int h = blockIdx.x, g = h / group;
  const int q0 = (gridDim.y - 1 - blockIdx.y) * BQ;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2;
  const int r0 = q0 + warp * 16 + gid, r1 = r0 + 8;
  const int qLast = min(q0 + BQ, n) - 1;
  const int keyEnd = firstPos + qLast + 1;
  const int tiles = (keyEnd + BK - 1) / BK;
  const int warpFirstPos = firstPos + q0 + warp * 16;
  const T *kb = k + ((size_t)g * cap + start) * HD, *vb = v + ((size_t)g * cap + start) * HD;

  // Stage st: K tile at base + st·2·TB, V tile TB after it.
  auto load_tile = [&](int t, int st) {
    const unsigned ks = base + st * 2 * TB, vs = ks + TB;
    const int kt0 = t * BK;
#pragma unroll
    for (int i = 0; i < BK * CH / 128; i++) {
      const int e = threadIdx.x + i * 128, key = e / CH, c = e % CH;
      const bool ok = kt0 + key < keyEnd;
      const size_t off = (size_t)(ok ? kt0 + key : 0) * HD + c * 8;
      const unsigned at = (c >> 3) * PANEL_BYTES + key * 128 + (((c & 7) ^ (key & 7)) << 4);
      cp_async16(ks + at, kb + off, ok);
      cp_async16(vs + at, vb + off, ok);
    }
    cp_async_commit();
  };
  load_tile(0, 0);

  unsigned qa[HD / 16][4];
  load_q_fragments<T, HD>(qa, q, rowStride, h, r0, n, scaleLog2);
  float o[HD / 8][4];  // panel p's 64 columns are o[8p .. 8p+7]: the wgmma accumulator layout
#pragma unroll
  for (int j = 0; j < HD / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;

  for (int t = 0; t < tiles; t++) {
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();  // tile t is visible to the async proxy; every product of tile t-1 is done
    if (t + 1 < tiles) load_tile(t + 1, (t + 1) & 1);
    const int kt0 = t * BK;
    const unsigned ks = base + (t & 1) * 2 * TB, vs = ks + TB;

    float sc[BK / 8][4];
#pragma unroll
    for (int nt = 0; nt < BK / 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
    wg_pin(&sc[0][0]);
    wg_fence();
#pragma unroll
    for (int s = 0; s < HD / 16; s++)  // k-step s: panel s/4, 32 bytes (16 dims) a step within it
      Wg<T>::template run<0>(&sc[0][0], qa[s], wg_desc(ks + (s >> 2) * PANEL_BYTES + (s & 3) * 32));
    wg_commit_wait();
    wg_pin(&sc[0][0]);

    if (kt0 + BK - 1 > warpFirstPos) mask_future<BK>(sc, kt0, firstPos + r0, firstPos + r1);
    unsigned pa[BK / 16][4];
    softmax_step<T, BK, HD>(sc, m0, m1, l0, l1, o, pa);
#pragma unroll
    for (int p = 0; p < PANELS; p++) wg_pin(&o[8 * p][0]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++)  // 16 keys a step: 2048 bytes of each V panel
#pragma unroll
      for (int p = 0; p < PANELS; p++) Wg<T>::template run<1>(&o[8 * p][0], pa[kk], wg_desc(vs + p * PANEL_BYTES + kk * 2048));
    wg_commit_wait();
#pragma unroll
    for (int p = 0; p < PANELS; p++) wg_pin(&o[8 * p][0]);
  }
  store_rows<HD>(out, rowStride, h, r0, n, o, l0, l1);
#elif defined(__CUDA_ARCH__)
  __trap();  // not sm_90a code: never launched (hg_flash_v3_supported), and loud if it were
#endif
}

template <typename T, int HD, int MINB>
int launch_v3(HgCtx *c, float *out, const float *q, int rowStride, const void *k, const void *v, int group, int heads, int cap, int start, int firstPos,
              int n, float scaleLog2) {
  static bool sized = false;
  if (!sized) {
    const cudaError_t e = cudaFuncSetAttribute(flash3_kernel<T, HD, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize, Tiles3<HD>::BYTES);
    if (e != cudaSuccess) return (int)e;
    sized = true;
  }
  const int blocks = (n + BQ - 1) / BQ;
  if (blocks > 65535) return (int)cudaErrorInvalidConfiguration;
  flash3_kernel<T, HD, MINB><<<dim3(heads, blocks), 128, Tiles3<HD>::BYTES, c->compute>>>(out, q, rowStride, (const T *)k, (const T *)v, group, cap, start,
                                                                                    firstPos, n, scaleLog2);
  return hg_launched();
}

}  // namespace

// 1 when the current device runs the wgmma kernel: compute capability 9.0, which loads the
// library's sm_90a code (the build makes sm_90a machine code and compute_90 PTX only).
int hg_flash_v3_supported(void) {
  static int known = -1;
  if (known < 0) {
    int dev = 0;
    cudaDeviceProp p;
    known = cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&p, dev) == cudaSuccess && p.major == 9 && p.minor == 0 ? 1 : 0;
  }
  return known;
}

template <typename T, int HD>
int launch_v3_occ(HgCtx *c, int occ3, float *out, const float *q, int rowStride, const void *k, const void *v, int group, int heads, int cap, int start,
                  int firstPos, int n, float scaleLog2) {
  return occ3 ? launch_v3<T, HD, 3>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2)
              : launch_v3<T, HD, 2>(c, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2);
}

int hg_flash_v3(HgCtx *c, int occ3, float *out, const float *q, int rowStride, const void *k, const void *v, int dt, int heads, int group, int headDim,
                int cap, int start, int firstPos, int n, float scaleLog2) {
  if (dt == DT_BF16)
    return headDim == 128 ? launch_v3_occ<__nv_bfloat16, 128>(c, occ3, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2)
                          : launch_v3_occ<__nv_bfloat16, 64>(c, occ3, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2);
  return headDim == 128 ? launch_v3_occ<__half, 128>(c, occ3, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2)
                        : launch_v3_occ<__half, 64>(c, occ3, out, q, rowStride, k, v, group, heads, cap, start, firstPos, n, scaleLog2);
}
