// Per-block event timestamps (%globaltimer) for device studies of kernel boundaries, compiled in
// only with -DHG_TRACE (a separate library build; device/trace-bench.ts reads the records back
// through hg_trace_set / hg_trace_read). Without it HG_TR is nothing and the exports answer -1.
#pragma once
#include "common.cuh"

struct TraceRec {
  unsigned long long t;  // ns
  const void *tag;       // which GEMV: its weight pointer
  int block, ev;
};
#ifdef HG_TRACE
static const unsigned HG_TRACE_MAX = 1u << 20;
// Defined here (no relocatable device code): only gemv_stream.cu includes this header.
static __device__ TraceRec g_trace[HG_TRACE_MAX];
static __device__ unsigned g_trace_n;
static __device__ int g_trace_on;
__device__ __forceinline__ void hg_trace(const void *tag, int ev) {
  if (!g_trace_on) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  const unsigned i = atomicAdd(&g_trace_n, 1u);
  if (i < HG_TRACE_MAX) g_trace[i] = {t, tag, (int)blockIdx.x, ev};
}
#define HG_TR(tag, ev) hg_trace(tag, ev)
#else
#define HG_TR(tag, ev) ((void)0)
#endif
