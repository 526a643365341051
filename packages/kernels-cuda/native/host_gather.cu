// V rows without a CPU copy: the device gathers the selected rows of a KV head-major store
// [kvHeads, cap, row] straight from page-locked host memory (mapped into the device's address
// space). hg_cu_gather_rows (ids from the call) and hg_cu_gather_rows_at (ids read from mapped
// host memory when it runs) are the hybrid step's ops (recordable: a layer's V rows are gathered
// inside its recorded segment); hg_cu_gather_bench times the same read against the CPU stage's
// way (rows memcpy'd into a pinned staging buffer, then one DMA) and against one copy per run of
// consecutive ids, on the copy stream for one (K, id pattern), and checks that they agree.
#include "common.cuh"
#include "host_link.cuh"
#include "gather_rows.cuh"
#include <stdlib.h>
#include <string.h>
#include <time.h>

// One warp a row, 16-byte pieces: dst[g, i, :] = src[g, ids[g * kmax + i], :] for i < kmax.
__global__ void gather_mapped_rows(uint4 *__restrict__ dst, const uint4 *__restrict__ src, const int32_t *__restrict__ ids,
                                   int kvHeads, int kmax, long long cap, int pieces) {
  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= (long long)kvHeads * kmax) return;
  const int g = (int)(warp / kmax);
  const long long row = (long long)g * cap + ids[warp];
  const uint4 *s = src + row * pieces;
  uint4 *d = dst + warp * pieces;
  for (int p = lane; p < pieces; p += 32) d[p] = s[p];
}

// The hybrid step's gather: table = [counts (groups) | ids (groups · kmax)]; dst[g, i, :] =
// src[g, ids[g · kmax + i], :] for i < counts[g] and an id inside the store, else a zero row (as
// the CPU stage pads its staged rows, so both paths give the same bytes). A block takes a chunk of
__global__ void __launch_bounds__(GATHER_THREADS) gather_rows_kernel(uint4 *__restrict__ dst, const uint4 *__restrict__ src, const int32_t *__restrict__ table,
                                                                      int groups, int kmax, long long cap, int pieces) {
  __shared__ long long rowAt[GATHER_CHUNK];
  gather_rows_chunks(dst, src, table, groups, kmax, cap, pieces, rowAt);
}

Cmd hg_new_cmd(int kind);

int hg_gather_rows_on(HgCtx *c, cudaStream_t s, void *dst, const void *src, const int *table, int groups, int kmax, long long cap, int pieces) {
  const long long chunks = ((long long)groups * kmax + GATHER_CHUNK - 1) / GATHER_CHUNK;
  const int most = c->numSMs > 1 ? c->numSMs / 2 : 1;  // half the SMs: ~1 MiB in flight, far past what the link needs
  const unsigned blocks = (unsigned)(chunks < most ? chunks : most);
  gather_rows_kernel<<<blocks, GATHER_THREADS, 0, s>>>((uint4 *)dst, (const uint4 *)src, (const int32_t *)table, groups, kmax, cap, pieces);
  return hg_launched();
}

// CMD_GATHER_ROWS: p[0] dst, p[1] src (device address of the mapped region), p[2] table; s[0]
// groups, s[1] kmax, s[2] 16-byte pieces a row, s[3] cap. The grid follows kmax (static: a
// recorded step whose width changes captures again, as its blob offsets change anyway).
int hg_launch_gather_rows(HgCtx *c, const Cmd &m) {
  return hg_gather_rows_on(c, c->compute, (void *)m.p[0], m.p[1], (const int *)m.p[2], m.s[0], m.s[1], m.s[3], m.s[2]);
}

static double now_ms() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

extern "C" {

// The hybrid step's gather (see gather_rows_kernel) on the compute stream, or recorded inside a
// step: counts and ids (host arrays the caller checked) go up as one table (the step's blob when
// recording), so the caller may rewrite them as soon as this returns. src: a device address.
HG_EXPORT int hg_cu_gather_rows(HgCtx *c, void *dst, const void *src, const int *counts, const int *ids, int groups, int kmax, int cap, int rowBytes) {
  if (groups < 1 || kmax < 1 || cap < 1 || rowBytes < 16 || rowBytes % 16) return (int)cudaErrorInvalidValue;
  HG_FLUSH_REC(c);
  int *dev = NULL;
  const int e = hg_upload_ints2(c, counts, (size_t)groups, ids, (size_t)groups * kmax, &dev);
  if (e) return e;
  Cmd m = hg_new_cmd(CMD_GATHER_ROWS);
  m.p[0] = dst; m.p[1] = src; m.p[2] = dev;
  m.s[0] = groups; m.s[1] = kmax; m.s[2] = rowBytes / 16; m.s[3] = cap;
  return hg_submit(c, m);
}

// hg_cu_gather_rows with the table read by the kernel from mapped host memory (its device
// address) when it runs: the CPU stage writes it after the step was queued (the device waits
// for the stage's signal first: hg_link_await_signal).
HG_EXPORT int hg_cu_gather_rows_at(HgCtx *c, void *dst, const void *src, const int *table, int groups, int kmax, int cap, int rowBytes) {
  if (groups < 1 || kmax < 1 || cap < 1 || rowBytes < 16 || rowBytes % 16 || !table || (uintptr_t)table % 4) return (int)cudaErrorInvalidValue;
  HG_FLUSH_REC(c);
  Cmd m = hg_new_cmd(CMD_GATHER_ROWS);
  m.p[0] = dst; m.p[1] = src; m.p[2] = table;
  m.s[0] = groups; m.s[1] = kmax; m.s[2] = rowBytes / 16; m.s[3] = cap;
  return hg_submit(c, m);
}

// in: kvHeads, cap, kmax, rowBytes (multiple of 16), contiguous (0: ascending random ids per
// head; 1: the last kmax slots), iters. dev: 3 · kvHeads · kmax · rowBytes device bytes, devIds:
// kvHeads · kmax int32 (arena blocks of the caller). out[0..3] = ms per gather: CPU gather into a pinned
// buffer (one thread), that buffer's DMA, the mapped-memory kernel, 2-D copies per run;
// out[4] = runs per head; out[5] = 1 when the three results are byte-identical.
HG_EXPORT int hg_cu_gather_bench(HgCtx *c, void *dev, void *devIds, const double *in, double *out) {
  HG_FLUSH(c);
  const int kvHeads = (int)in[0], kmax = (int)in[2], rowBytes = (int)in[3], contiguous = (int)in[4], iters = (int)in[5];
  const long long cap = (long long)in[1];
  if (kvHeads <= 0 || kmax <= 0 || cap < kmax || rowBytes <= 0 || rowBytes % 16 || iters <= 0) return (int)cudaErrorInvalidValue;
  const size_t storeBytes = (size_t)kvHeads * cap * rowBytes, outBytes = (size_t)kvHeads * kmax * rowBytes;
  char *store = NULL, *staging = NULL, *check = NULL;
  int32_t *ids = (int32_t *)malloc((size_t)kvHeads * kmax * sizeof(int32_t));
  cudaEvent_t a = NULL, b = NULL;
  cudaError_t e = ids ? cudaSuccess : cudaErrorMemoryAllocation;
  if (!e) e = cudaHostAlloc((void **)&store, storeBytes, cudaHostAllocMapped);
  if (!e) e = cudaHostAlloc((void **)&staging, outBytes, cudaHostAllocDefault);
  if (!e) e = cudaHostAlloc((void **)&check, 3 * outBytes, cudaHostAllocDefault);
  if (!e) e = cudaEventCreate(&a);
  if (!e) e = cudaEventCreate(&b);
  void *mapped = NULL;
  if (!e) e = cudaHostGetDevicePointer(&mapped, store, 0);
  if (!e) {
    for (size_t i = 0; i < storeBytes / 4; i++) ((uint32_t *)store)[i] = (uint32_t)(i * 2654435761u);
    // ascending ids per head: every (cap / kmax)-th slot with a random offset inside its stride, or the last kmax slots
    unsigned seed = 12345;
    const long long stride = cap / kmax;
    for (int g = 0; g < kvHeads; g++)
      for (int i = 0; i < kmax; i++) {
        seed = seed * 1103515245u + 12345u;
        ids[g * kmax + i] = contiguous ? (int32_t)(cap - kmax + i) : (int32_t)(i * stride + (long long)((seed >> 8) % (unsigned)stride));
      }
    e = cudaMemcpy(devIds, ids, (size_t)kvHeads * kmax * sizeof(int32_t), cudaMemcpyHostToDevice);
  }
  char *dCpu = (char *)dev, *dMapped = dCpu + outBytes, *dRuns = dMapped + outBytes;
  float ms = 0;
  // 1. the CPU stage's way: rows into the pinned staging buffer (host wall time), one DMA (events)
  double gatherMs = 0, dmaMs = 0;
  for (int it = 0; it <= iters && !e; it++) {
    const double t0 = now_ms();
    for (int g = 0; g < kvHeads; g++)
      for (int i = 0; i < kmax; i++)
        memcpy(staging + ((size_t)g * kmax + i) * rowBytes, store + ((size_t)g * cap + ids[g * kmax + i]) * rowBytes, rowBytes);
    const double t1 = now_ms();
    e = cudaEventRecord(a, c->copy);
    if (!e) e = cudaMemcpyAsync(dCpu, staging, outBytes, cudaMemcpyHostToDevice, c->copy);
    if (!e) e = cudaEventRecord(b, c->copy);
    if (!e) e = cudaEventSynchronize(b);
    if (!e) e = cudaEventElapsedTime(&ms, a, b);
    if (it > 0) gatherMs += t1 - t0, dmaMs += ms;
  }
  // 2. the device reads the rows where they live
  const int threads = 256;
  const long long warps = (long long)kvHeads * kmax;
  const int blocks = (int)((warps * 32 + threads - 1) / threads);
  double mappedMs = 0;
  for (int it = 0; it <= iters && !e; it++) {
    e = cudaEventRecord(a, c->copy);
    if (!e) {
      gather_mapped_rows<<<blocks, threads, 0, c->copy>>>((uint4 *)dMapped, (const uint4 *)mapped, (const int32_t *)devIds, kvHeads, kmax, cap, rowBytes / 16);
      e = cudaGetLastError();
    }
    if (!e) e = cudaEventRecord(b, c->copy);
    if (!e) e = cudaEventSynchronize(b);
    if (!e) e = cudaEventElapsedTime(&ms, a, b);
    if (it > 0) mappedMs += ms;
  }
  // 3. one copy per run of consecutive ids (a 2-D copy would need equal runs: each run is 1-D)
  double runsMs = 0;
  long long runs = 0;
  for (int it = 0; it <= iters && !e; it++) {
    runs = 0;
    e = cudaEventRecord(a, c->copy);
    for (int g = 0; g < kvHeads && !e; g++) {
      int i = 0;
      while (i < kmax && !e) {
        int j = i + 1;
        while (j < kmax && ids[g * kmax + j] == ids[g * kmax + j - 1] + 1) j++;
        e = cudaMemcpyAsync(dRuns + ((size_t)g * kmax + i) * rowBytes, store + ((size_t)g * cap + ids[g * kmax + i]) * rowBytes,
                            (size_t)(j - i) * rowBytes, cudaMemcpyHostToDevice, c->copy);
        runs++;
        i = j;
      }
    }
    if (!e) e = cudaEventRecord(b, c->copy);
    if (!e) e = cudaEventSynchronize(b);
    if (!e) e = cudaEventElapsedTime(&ms, a, b);
    if (it > 0) runsMs += ms;
  }
  if (!e) e = cudaMemcpy(check, dev, 3 * outBytes, cudaMemcpyDeviceToHost);
  if (!e) {
    out[0] = gatherMs / iters;
    out[1] = dmaMs / iters;
    out[2] = mappedMs / iters;
    out[3] = runsMs / iters;
    out[4] = (double)runs / kvHeads;
    out[5] = memcmp(check, check + outBytes, outBytes) == 0 && memcmp(check, check + 2 * outBytes, outBytes) == 0 &&
             memcmp(check, staging, outBytes) == 0;
  }
  if (a) cudaEventDestroy(a);
  if (b) cudaEventDestroy(b);
  cudaFreeHost(store);
  cudaFreeHost(staging);
  cudaFreeHost(check);
  free(ids);
  cudaGetLastError();
  return (int)e;
}

}  // extern "C"
