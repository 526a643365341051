// One queued row copy (CopyDesc, common.cuh) done by threads t0, t0 + stride, …: a plain copy, or
// f32 rows rounded into an f16/bf16 cache. Shared by the copy-batch kernels (context.cu) and the
// RoPE kernel that takes a decode step's K/V append (rope_append.cu).
#pragma once
#include "common.cuh"

// The bytes a queued copy reads: its destination's, or twice that for f32 rows into a 16-bit cache.
static inline size_t copy_src_bytes(const CopyDesc &d) { return d.sd == d.dd ? d.bytes : d.bytes * 2; }

// Stores v as element i of a row of dtype dt.
__device__ __forceinline__ void store_any(void *p, int dt, size_t i, float v) {
  if (dt == DT_BF16) st<DT_BF16>(p, i, v);
  else if (dt == DT_F16) st<DT_F16>(p, i, v);
  else st<DT_F32>(p, i, v);
}

__device__ __forceinline__ void batched_copy(const CopyDesc &d, size_t t0, size_t stride) {
  if (d.sd != d.dd) {  // f32 rows into an f16/bf16 cache (the K/V append of a decode step)
    const float *s = (const float *)d.src;
    for (size_t i = t0; i < d.bytes / 2; i += stride) store_any(d.dst, d.dd, i, s[i]);
    return;
  }
  if ((((uintptr_t)d.src | (uintptr_t)d.dst | d.bytes) & 15) == 0) {
    const uint4 *s = (const uint4 *)d.src;
    uint4 *o = (uint4 *)d.dst;
    for (size_t i = t0; i < d.bytes / 16; i += stride) o[i] = s[i];
  } else if ((((uintptr_t)d.src | (uintptr_t)d.dst | d.bytes) & 3) == 0) {
    const unsigned *s = (const unsigned *)d.src;
    unsigned *o = (unsigned *)d.dst;
    for (size_t i = t0; i < d.bytes / 4; i += stride) o[i] = s[i];
  } else {
    for (size_t i = t0; i < d.bytes; i += stride) d.dst[i] = d.src[i];
  }
}
