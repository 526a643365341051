// Tensor-core pieces shared by the causal prefill attention kernels (flash_v2.cu, flash_v3.cu):
// mma.sync m16n8k16 with f32 accumulation per 16-bit type, ldmatrix, cp.async, and the launchers
// flash.cu dispatches to. Fragment layouts are PTX's for m16n8k16: lane = 4·gid + tid; A rows
// gid and gid + 8, columns 2·tid (+1) and 2·tid + 8 (+1); B column gid, rows 2·tid (+1) and
// 2·tid + 8 (+1); C rows gid and gid + 8, columns 2·tid (+1).
#pragma once
#include "common.cuh"

template <typename T> struct Mma;
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ unsigned pack(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);  // a in the low half: the lower column
    return *reinterpret_cast<unsigned *>(&h);
  }
  // Not volatile: a pure register op, so the compiler may interleave independent products.
  static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
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
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// A warp's 16 query rows (r0 = its row gid, r1 = r0 + 8) as A fragments over the whole head:
// read once from the f32 rows, scaled by scale·log2(e) (the softmax then uses exp2), rounded to T.
// Rows at or past n read as zeros.
template <typename T, int HD>
__device__ __forceinline__ void load_q_fragments(unsigned (&qa)[HD / 16][4], const float *q, int rowStride, int h, int r0, int n, float scaleLog2) {
  const int tid = threadIdx.x & 3, r1 = r0 + 8;
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


// 16 bytes global -> shared without a register stop; `valid` false writes zeros (keys past the
// end are never read from memory, and zeros cannot turn into NaN in P·V).
__device__ __forceinline__ void cp_async16(unsigned dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// Four 8x8 16-bit matrices; lanes 8i..8i+7 give matrix i's row addresses.
__device__ __forceinline__ void ldsm_x4(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}

// ---- the per-tile softmax shared by the kernels: 16 rows a warp (r0 = row gid, r1 = r0 + 8), a
// tile of BK keys as BK/8 accumulator fragments sc[nt] (columns 8·nt + 2·tid, +1) ----

// Keys after a row's position (p0, p1: positions of rows r0, r1) score -inf.
template <int BK>
__device__ __forceinline__ void mask_future(float (&sc)[BK / 8][4], int kt0, int p0, int p1) {
  const int tid = threadIdx.x & 3;
#pragma unroll
  for (int nt = 0; nt < BK / 8; nt++) {
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int kj = kt0 + nt * 8 + 2 * tid + e;
      if (kj > p0) sc[nt][e] = -INFINITY;
      if (kj > p1) sc[nt][2 + e] = -INFINITY;
    }
  }
}

// One online-softmax step (scores already scaled by log2 e): the running max m and sum l of both
// rows absorb the tile, o is rescaled, and the probabilities become P's A fragments (n-tiles 2kk,
// 2kk+1 are k-step kk's two halves). Key 0 is in the first tile and visible to every row, so the
// max is finite from then on; a row whose keys in a later tile are all masked keeps it (2^-inf = 0).
template <typename T, int BK, int HD>
__device__ __forceinline__ void softmax_step(float (&sc)[BK / 8][4], float &m0, float &m1, float &l0, float &l1, float (&o)[HD / 8][4],
                                             unsigned (&pa)[BK / 16][4]) {
  float mx0 = m0, mx1 = m1;
#pragma unroll
  for (int nt = 0; nt < BK / 8; nt++) {
    mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
    mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float a0 = exp2_ftz(m0 - mx0), a1 = exp2_ftz(m1 - mx1);  // first tile: 2^-inf = 0
  m0 = mx0;
  m1 = mx1;
  l0 *= a0;
  l1 *= a1;
#pragma unroll
  for (int j = 0; j < HD / 8; j++) { o[j][0] *= a0; o[j][1] *= a0; o[j][2] *= a1; o[j][3] *= a1; }
#pragma unroll
  for (int nt = 0; nt < BK / 8; nt++) {
    const float p00 = exp2_ftz(sc[nt][0] - mx0), p01 = exp2_ftz(sc[nt][1] - mx0);
    const float p10 = exp2_ftz(sc[nt][2] - mx1), p11 = exp2_ftz(sc[nt][3] - mx1);
    l0 += p00 + p01;
    l1 += p10 + p11;
    pa[nt / 2][(nt & 1) * 2] = Mma<T>::pack(p00, p01);
    pa[nt / 2][(nt & 1) * 2 + 1] = Mma<T>::pack(p10, p11);
  }
}

// The rows' sums over the quad, then o / l written to out rows r0 and r0 + 8 of head h (rows < n).
template <int HD>
__device__ __forceinline__ void store_rows(float *out, int rowStride, int h, int r0, int n, const float (&o)[HD / 8][4], float l0, float l1) {
  const int tid = threadIdx.x & 3, r1 = r0 + 8;
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

// Block shapes of flash_v2.cu: 4 warps (64 query rows) at 2 or 3 blocks an SM, or 8 warps (128 rows).
enum { FLASH2_W4 = 0, FLASH2_W4_OCC3 = 1, FLASH2_W8 = 2 };

// Launchers (dt: DT_BF16 or DT_F16, headDim 64 or 128; pointers checked aligned by the caller).
// Both return the launch's cudaError_t as int.
// The wgmma kernel (flash_v3.cu; occ3: 3 blocks an SM, else 2) runs only where
// hg_flash_v3_supported says 1 (sm_90 devices).
int hg_flash_v3_supported(void);
int hg_flash_v3(HgCtx *c, int occ3, float *out, const float *q, int rowStride, const void *k, const void *v, int dt, int heads, int group, int headDim, int cap,
                int start, int firstPos, int n, float scaleLog2);
int hg_flash_v2(HgCtx *c, int shape, float *out, const float *q, int rowStride, const void *k, const void *v, int dt, int heads, int group,
                int headDim, int cap, int start, int firstPos, int n, float scaleLog2);
