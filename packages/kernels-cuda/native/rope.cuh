// RoPE's rotation of one pair (rotate_half: a = x[j], b = x[j + half]) with one rounding
// sequence, shared by every kernel that rotates (rowops.cu's rope kernel, rope_append.cu's): the
// same bits whichever kernel runs. x[j + half]
// keeps the order nvcc gave the rope kernel's old `a * s + b * c`; x[j] is `a * c - b * s` fused once.
#pragma once

__device__ __forceinline__ float hg_rope_lo(float a, float b, float c, float s) { return __fmaf_rn(a, c, -__fmul_rn(b, s)); }  // x[j]
__device__ __forceinline__ float hg_rope_hi(float a, float b, float c, float s) { return __fmaf_rn(b, c, __fmul_rn(a, s)); }   // x[j + half]

// One head row rotated in place by threads t0, t0 + nt, … (pairs j, j + half for j < half);
// emit(j, v) sees each rotated element (the K/V append in rope_append.cu; a no-op elsewhere).
template <typename Emit>
__device__ __forceinline__ void hg_rope_head(float *base, const float *cr, const float *sr, int half, int t0, int nt, Emit emit) {
#pragma unroll 1  // one pair a thread at head dims ≤ 128 with 64 threads: no unrolled prologue
  for (int j = t0; j < half; j += nt) {
    const float a = base[j], b = base[j + half], c = cr[j], s = sr[j];
    const float lo = hg_rope_lo(a, b, c, s), hi = hg_rope_hi(a, b, c, s);
    base[j] = lo;
    base[j + half] = hi;
    emit(j, lo);
    emit(j + half, hi);
  }
}

// Element d of one head row x rotated by the angle whose cos/sin rows are cr/sr (pairs
// (j, j + half) for j < half; elements from 2·half on are not rotated).
__device__ __forceinline__ float hg_rope_elem(const float *x, int d, int half, const float *cr, const float *sr) {
  if (d < half) return hg_rope_lo(x[d], x[d + half], cr[d], sr[d]);
  if (d < 2 * half) return hg_rope_hi(x[d - half], x[d], cr[d - half], sr[d - half]);
  return x[d];
}
