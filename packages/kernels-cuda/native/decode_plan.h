// Which kernel a decode op runs, picked from the device and the op's shape by one pure function
// (hg_decode_plan), as llama.cpp picks its flash-attention kernel. No CUDA calls and no context:
// the package's tests compile this header with the host C compiler and check the picks
// (test/decode-plan.test.ts); the .cu files launch what it returns.
#pragma once

#ifdef __CUDACC__
#define HG_PLAN_FN static __host__ __device__ __forceinline__
#else
#define HG_PLAN_FN static inline
#include <stddef.h>
#endif

// The ops a plan is made for, and the kernels each may get.
enum { HG_PLAN_GEMV = 0, HG_PLAN_ATTN = 1, HG_PLAN_ARGMAX = 2 };
enum { HG_GEMV_WARP = 0, HG_GEMV_STREAM = 1 };   // one warp a weight row (gemv_fused.cu) / the weight stream (gemv_stream.cu)
enum { HG_ATTN_FLASH = 0, HG_ATTN_SPLIT = 1, HG_ATTN_SPLIT_MMA = 2 };  // flash kernel / split-K FMA block / split-K on tensor cores
enum { HG_ARGMAX_ROWS = 0, HG_ARGMAX_SPLIT = 1 };  // a block a row (float4 loads) / one long row over many blocks, then one warp

// The weight stream's layout (gemv_stream.cu): 8 consumer warps, a 128 KB ring an SM, and
// sm_90's largest dynamic shared memory a block.
#define HG_GS_NW 8
#define HG_GS_RING_KB 128
#define HG_GS_MAX_SMEM (227 * 1024)
#define HG_GS_SLOT7 7168
// The argmax split (rowops.cu): threads a block, the shortest row it takes, most blocks.
#define HG_AM_SPLIT_THREADS 256
#define HG_AM_SPLIT_MIN 8192
#define HG_AM_SPLIT_MAX_BLOCKS 1024

typedef struct {
  int major;  // compute capability major (the weight stream needs sm_90's bulk async copies)
  int sms;    // multiprocessors
} HgPlanDevice;

typedef struct {
  int op;       // HG_PLAN_*
  int dtype;    // weights (GEMV) or the K/V cache (attention): 0 f32, 1 f16, 2 bf16
  int k, m;     // GEMV: row length and rows; argmax: columns and rows
  int epi;      // GEMV epilogue: bit 0 accumulate, bit 1 SiLU·up
  int norm;     // GEMV: x normalised in the kernel (its weights staged beside x)
  int headDim;  // attention
  int aligned;  // the streamed operand (weights, K and V, the argmax row) starts on 16 bytes
  int qAligned; // attention: q starts on 16 bytes
} HgPlanShape;

typedef struct {
  int kernel;        // HG_GEMV_* / HG_ATTN_* / HG_ARGMAX_*
  int slotBytes;     // stream GEMV: bytes a ring slot holds
  int slotsPerWarp;  // stream GEMV: slots a consumer warp owns
  int grid;          // stream GEMV and argmax split: blocks
  int lanes;         // split attention: lanes that hold one token row
  int splitsPerSm;   // split attention: blocks an SM the grid is sized for
  int chunkSplitsPerSm;  // split attention: blocks an SM the span's chunks are cut for (the rest leave at once)
} HgPlan;

// Shared memory of a stream block: the barriers of ns slots and the norm's per-warp sums, then x
// (k floats), the norm weights as floats (with a norm), the slots.
HG_PLAN_FN size_t stream_header(int ns) { return ((size_t)2 * ns * 8 + HG_GS_NW * 4 + 127) & ~(size_t)127; }
HG_PLAN_FN size_t stream_vec(int k) { return ((size_t)k * 4 + 127) & ~(size_t)127; }
HG_PLAN_FN size_t stream_smem(int k, int spw, int slot, int norm) {
  const int ns = HG_GS_NW * spw;
  return stream_header(ns) + stream_vec(k) + (norm ? stream_vec(k) : 0) + (size_t)ns * slot;
}

// 16 KB slots where a row (with SiLU·up its gate and up halves) takes no more ring space than in
// 8 KB ones; a plain row longer than 16 KB and a multiple of 7 KB (8B's down) takes 7 KB slots.
HG_PLAN_FN int stream_slot_bytes(int k, int silu) {
  const long row = (long)k * 2 * (silu ? 2 : 1);
  if (!silu && row > 16384 && row % HG_GS_SLOT7 == 0) return HG_GS_SLOT7;
  const long in8 = (row + 8191) / 8192 * 8192, in16 = (row + 16383) / 16384 * 16384;
  return in16 <= in8 ? 16384 : 8192;
}

// Slots a warp owns (7 KB slots: as many as fit), or 0 when x, the norm weights and one slot a
// warp do not fit.
HG_PLAN_FN int stream_slots(int k, int slot, int norm) {
  int spw = slot == HG_GS_SLOT7 ? 4 : HG_GS_RING_KB * 1024 / (HG_GS_NW * slot);
  if (spw < 1) spw = 1;
  while (spw > 1 && stream_smem(k, spw, slot, norm) > (size_t)HG_GS_MAX_SMEM) spw--;
  return stream_smem(k, spw, slot, norm) <= (size_t)HG_GS_MAX_SMEM ? spw : 0;
}

// The most blocks, down to 15/16 of the SMs, that give every block the same number of rows (8B on
// 132 SMs: 128), else one block an SM.
HG_PLAN_FN int stream_grid(int sms, int m) {
  for (int g = sms; g >= sms - sms / 16 && g > 0; g--)
    if (m % g == 0) return g;
  return sms;
}

// Lanes that hold one token row of the split-K block (16-byte pieces, 4–32 lanes), 0 when the
// head dim does not fit it.
HG_PLAN_FN int da_lanes(int dt, int headDim) {
  const int el = dt == 0 ? 4 : 8;
  if (headDim <= 0 || headDim % el != 0 || headDim > 256) return 0;
  int pieces = headDim / el, lpt = 4;
  while (lpt < pieces) lpt <<= 1;
  return lpt <= 32 ? lpt : 0;
}

HG_PLAN_FN HgPlan hg_decode_plan(HgPlanDevice d, HgPlanShape s) {
  HgPlan p = {0, 0, 0, 0, 0, 0, 0};
  if (s.op == HG_PLAN_GEMV) {
    const int half = s.dtype == 1 || s.dtype == 2;
    if (d.major >= 9 && half && s.k % 8 == 0 && s.aligned && (s.epi & 3) != 3) {
      const int slot = stream_slot_bytes(s.k, (s.epi & 2) != 0);
      const int spw = stream_slots(s.k, slot, s.norm);
      if (spw > 0) {
        p.kernel = HG_GEMV_STREAM;
        p.slotBytes = slot;
        p.slotsPerWarp = spw;
        p.grid = stream_grid(d.sms, s.m);
      }
    }
  } else if (s.op == HG_PLAN_ATTN) {
    p.lanes = da_lanes(s.dtype, s.headDim);
    if (p.lanes && s.aligned) {
      // Tensor cores: a grid of 4 blocks an SM whose span is cut into the chunks of 2 an SM.
      const int mma = (s.dtype == 1 || s.dtype == 2) && (s.headDim == 64 || s.headDim == 128) && s.qAligned;
      p.kernel = mma ? HG_ATTN_SPLIT_MMA : HG_ATTN_SPLIT;
      p.splitsPerSm = 4;
      p.chunkSplitsPerSm = mma ? 2 : 4;
    }
  } else if (s.op == HG_PLAN_ARGMAX) {
    if (s.m == 1 && s.k >= HG_AM_SPLIT_MIN && s.aligned) {
      int nb = (s.k >> 2) / HG_AM_SPLIT_THREADS;
      if (nb > d.sms) nb = d.sms;
      if (nb > HG_AM_SPLIT_MAX_BLOCKS) nb = HG_AM_SPLIT_MAX_BLOCKS;
      p.kernel = HG_ARGMAX_SPLIT;
      p.grid = nb;
    }
  }
  return p;
}
