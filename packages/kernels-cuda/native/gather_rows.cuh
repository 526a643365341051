// A gather of selected rows from host memory into a device buffer: table = [counts | ids] of `groups`
// groups of kmax rows, zero rows past a count or for an id outside the store. Shared by the per-row
// gather (host_gather.cu) and the batch's hand-off (hand_off_rows.cu).
#pragma once
#include <stdint.h>

// GATHER_CHUNK rows at a time: their ids come in once (one round trip to host memory), then every
// thread has GATHER_UNROLL 16-byte reads in flight. A small grid then keeps the link busy, so the
// gather can run on a side stream beside the GEMVs without taking the SMs from them.
constexpr int GATHER_CHUNK = 64, GATHER_UNROLL = 4, GATHER_THREADS = 256;

// The block's chunks blockIdx.x, blockIdx.x + gridDim.x, …; rowAt is the block's shared
// [GATHER_CHUNK] (the source row of each chunk row, -1: a zero row).
__device__ __forceinline__ void gather_rows_chunks(uint4 *__restrict__ dst, const uint4 *__restrict__ src, const int32_t *__restrict__ table,
                                                   int groups, int kmax, long long cap, int pieces, long long *rowAt) {
  const long long rows = (long long)groups * kmax, chunks = (rows + GATHER_CHUNK - 1) / GATHER_CHUNK;
  for (long long ch = blockIdx.x; ch < chunks; ch += gridDim.x) {
    const long long r0 = ch * GATHER_CHUNK;
    const int n = (int)(rows - r0 < GATHER_CHUNK ? rows - r0 : GATHER_CHUNK);
    __syncthreads();  // the previous chunk is done with rowAt
    if ((int)threadIdx.x < n) {
      const long long r = r0 + threadIdx.x;
      const int g = (int)(r / kmax), i = (int)(r % kmax);
      const int count = table[g], at = table[groups + r];  // both reads in flight: one round trip to host memory, not two
      const int id = i < count ? at : -1;
      rowAt[threadIdx.x] = id >= 0 && id < cap ? (long long)g * cap + id : -1;
    }
    __syncthreads();
    const int total = n * pieces;
    for (int base = 0; base < total; base += GATHER_THREADS * GATHER_UNROLL) {
      uint4 v[GATHER_UNROLL];
#pragma unroll
      for (int u = 0; u < GATHER_UNROLL; u++) {
        const int p = base + u * GATHER_THREADS + threadIdx.x;
        v[u] = make_uint4(0, 0, 0, 0);
        if (p < total) {
          const long long at = rowAt[p / pieces];
          if (at >= 0) v[u] = src[at * pieces + p % pieces];
        }
      }
#pragma unroll
      for (int u = 0; u < GATHER_UNROLL; u++) {
        const int p = base + u * GATHER_THREADS + threadIdx.x;
        if (p < total) dst[r0 * pieces + p] = v[u];
      }
    }
  }
}
