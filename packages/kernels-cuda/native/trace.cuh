// Per-block event timestamps (%globaltimer) for device studies of kernel boundaries, compiled in
// only with -DHG_TRACE (a separate library build; device/trace-bench.ts reads the records back
// through hg_trace_set / hg_trace_read). Without it HG_TR is nothing and the exports answer -1.
// Each (launch, block, event) has its own record, written with a plain store: a global atomic to
// hand out records would put its round trip (≈ 1 µs under the weight stream) on the traced
// thread's path — the first version did, and inflated every interval it measured.
#pragma once
#include "common.cuh"

struct TraceRec {
  unsigned long long t;  // ns
  const void *tag;       // which GEMV: its weight pointer
  int block, ev;
};
static const int HG_TRACE_EVENTS = 16;  // a block's events a launch: 0–6, 7 + warp (warp done)
#ifdef HG_TRACE
static const unsigned HG_TRACE_MAX = 1u << 20;
// Defined here (no relocatable device code): only gemv_stream.cu includes this header.
static __device__ TraceRec g_trace[HG_TRACE_MAX];
static __device__ int g_trace_on;
// A launch's records start at id · HG_TRACE_BLOCKS, not id · gridDim.x: stream grids differ between
// GEMVs (hg_decode_plan), and launches of different grids would overwrite each other's records.
static const unsigned HG_TRACE_BLOCKS = 256;  // at least any stream grid (one block an SM at most)
// id: the launch's number (StreamArgs.trace, given by the host at launch; a graph replays its ids).
__device__ __forceinline__ void hg_trace(int id, const void *tag, int ev) {
  if (!g_trace_on) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  const unsigned i = (((unsigned)id * HG_TRACE_BLOCKS + blockIdx.x) * HG_TRACE_EVENTS + (unsigned)ev) % HG_TRACE_MAX;
  g_trace[i] = {t, tag, (int)blockIdx.x, ev};
}
#define HG_TR(a, ev) hg_trace((a).trace, (a).w, ev)
#else
#define HG_TR(a, ev) ((void)0)
#endif
