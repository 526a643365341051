// RoPE's rotation of one pair (rotate_half: a = x[j], b = x[j + half]) with one rounding
// sequence, shared by every kernel that rotates (rowops.cu's rope kernel, and decode_attn.cu's
// clustered kernel that folds a decode step's RoPE in): the same bits whichever kernel runs. x[j + half]
// keeps the order nvcc gave the rope kernel's old `a * s + b * c`; x[j] is `a * c - b * s` fused once.
#pragma once

__device__ __forceinline__ float hg_rope_lo(float a, float b, float c, float s) { return __fmaf_rn(a, c, -__fmul_rn(b, s)); }  // x[j]
__device__ __forceinline__ float hg_rope_hi(float a, float b, float c, float s) { return __fmaf_rn(b, c, __fmul_rn(a, s)); }   // x[j + half]

// Element d of one head row x rotated by the angle whose cos/sin rows are cr/sr (pairs
// (j, j + half) for j < half; elements from 2·half on are not rotated).
__device__ __forceinline__ float hg_rope_elem(const float *x, int d, int half, const float *cr, const float *sr) {
  if (d < half) return hg_rope_lo(x[d], x[d + half], cr[d], sr[d]);
  if (d < 2 * half) return hg_rope_hi(x[d - half], x[d], cr[d - half], sr[d - half]);
  return x[d];
}
