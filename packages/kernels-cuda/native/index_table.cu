// A device index's ranked pages made into the hybrid step's [counts | ids] table on the device
// (HostTransfers.indexTable): what the CPU stage's "index" job with the device's pages does
// (hg_pages_to_list: whole pages while they fit, the page that does not by its best rows by exact
// q·k, ids ascending), so a verified layer's rows can be gathered with no stage round trip. The
// table goes to mapped host memory, where gatherRowsAt and padColumnsAt read a stage's, then the
// done word is raised (a side-stream fetch waits for it as for a stage's). A block a KV head: the
// work is a few hundred ids a head and at most one page's scores, bound by latency, not bandwidth.
#include "common.cuh"
#include <math.h>

constexpr int TABLE_THREADS = 256, TABLE_WANT_MAX = 256, TABLE_PAGE_MAX = 1024, TABLE_D_MAX = 256;

Cmd hg_new_cmd(int kind);                       // rowops.cu
int hg_put_dyn(HgCtx *c, Cmd &cmd, int count);  // rowops.cu

// NaN never wins a place (as the stage's top-K): it ranks as −∞.
__device__ __forceinline__ float rankable(float x) { return isnan(x) ? -INFINITY : x; }

// A block a KV head: its pages walked best first (whole while they fit, the partial page's best
// rows by exact q·k), then its ids written by every thread at once; each thread's stores fenced
// system-wide so the word raised after the kernel (raise_word) is seen after them.
template <int DT>
__global__ void __launch_bounds__(TABLE_THREADS) index_table_kernel(int *table, const int *pages, const float *q, const void *keys,
                                                                     int kvHeads, int group, int d, long long cap, int P, int want, int budget, int kmax,
                                                                     int nVal, const int *dyn) {
  __shared__ float score[TABLE_PAGE_MAX];
  __shared__ int pick[TABLE_PAGE_MAX];  // the partial page's chosen rows, ascending
  __shared__ int best[TABLE_WANT_MAX], sorted[TABLE_WANT_MAX], off[TABLE_WANT_MAX + 1];
  __shared__ int usedS, partialS, leftS;
  const int n = dyn ? dyn[0] : nVal;
  const int k = min(budget, n), count = (n + P - 1) / P, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = blockIdx.x;
  if (tid < want) best[tid] = pages[(long long)g * want + tid];
  __syncthreads();
  if (tid == 0) {
    int taken = 0, used = 0, partial = -1, left = 0;
    while (used < want && taken < k) {
      const int p = best[used];
      if (p < 0 || p >= count) break;
      used++;
      const int from = p * P, to = min(n, from + P);
      if (to - from <= k - taken) taken += to - from;
      else { partial = p; left = k - taken; taken = k; }
    }
    usedS = used; partialS = partial; leftS = left;
  }
  __syncthreads();
  const int used = usedS, partial = partialS, left = leftS;
  if (partial >= 0) {
    const int from = partial * P, m = min(n, from + P) - from;
    for (int r = warp; r < m; r += TABLE_THREADS / 32) {
      const size_t at = ((size_t)g * cap + from + r) * d;
      // The row's channels in registers first: its loads cross the link together, once, not once a query head.
      float kr[TABLE_D_MAX / 32];
#pragma unroll
      for (int i = 0; i < TABLE_D_MAX / 32; i++) kr[i] = lane + 32 * i < d ? ld<DT>(keys, at + lane + 32 * i) : 0.f;
      float top = -INFINITY;
      for (int j = 0; j < group; j++) {
        const float *qj = q + ((size_t)g * group + j) * d;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < TABLE_D_MAX / 32; i++)
          if (lane + 32 * i < d) s += qj[lane + 32 * i] * kr[i];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (s > top) top = s;
      }
      if (lane == 0) score[r] = top;
    }
    __syncthreads();
    // Row r is taken when fewer than `left` rows beat it (higher score, or equal at a lower slot).
    for (int r = tid; r < m; r += TABLE_THREADS) {
      const float a = rankable(score[r]);
      int above = 0;
      for (int s2 = 0; s2 < m; s2++) {
        const float b = rankable(score[s2]);
        above += b > a || (b == a && s2 < r);
      }
      pick[r] = above < left;
    }
    __syncthreads();
    if (tid == 0) {
      int o = 0;
      for (int r = 0; r < m; r++)
        if (pick[r]) pick[o++] = r;
    }
  }
  // The used pages ascending (they are distinct): each one's place is the count of those below it.
  if (tid < used) {
    const int p = best[tid];
    int below = 0;
    for (int j = 0; j < used; j++) below += best[j] < p;
    sorted[below] = p;
  }
  __syncthreads();
  if (tid == 0) {
    off[0] = 0;
    for (int i = 0; i < used; i++) {
      const int p = sorted[i], from = p * P;
      off[i + 1] = off[i] + (p == partial ? left : min(n, from + P) - from);
    }
    table[g] = off[used];
  }
  __syncthreads();
  // Every id at once: id o lies in the last page i with off[i] ≤ o.
  int *ids = table + kvHeads + (long long)g * kmax;
  const int total = off[used];
  for (int o = tid; o < total; o += TABLE_THREADS) {
    int lo = 0, hi = used - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (off[mid] <= o) lo = mid;
      else hi = mid - 1;
    }
    const int p = sorted[lo], t = o - off[lo];
    ids[o] = p * P + (p == partial ? pick[t] : t);
  }
  __threadfence_system();
}

// After the table's kernel (stream order): the done value into the word.
__global__ void raise_word(volatile unsigned *word, int valueVal, const int *dyn) {
  __threadfence_system();
  *word = dyn ? (unsigned)dyn[1] : (unsigned)valueVal;
}

// CMD_INDEX_TABLE: p[0] table, p[1] word (device addresses of mapped host memory), p[2] pages,
// p[3] q, p[4] keys (mapped); s[0] K dtype, s[1] kvHeads, s[2] group, s[3] headDim, s[4] cap,
// s[5] page size, s[6] want, s[7] budget, s[8] kmax; d[0] n, d[1] the done value (per step).
int hg_launch_index_table(HgCtx *c, const Cmd &m, const char *dynBase) {
  const int *dyn = dynBase ? (const int *)(dynBase + m.dynOff) : NULL;
  cudaStream_t s = hg_stream(c);
  auto go = [&](auto kernel) {
    kernel<<<m.s[1], TABLE_THREADS, 0, s>>>((int *)m.p[0], (const int *)m.p[2], (const float *)m.p[3], m.p[4], m.s[1], m.s[2], m.s[3], (long long)m.s[4], m.s[5], m.s[6],
                                           m.s[7], m.s[8], m.d[0], dyn);
  };
  if (m.s[0] == DT_BF16) go(index_table_kernel<DT_BF16>);
  else if (m.s[0] == DT_F16) go(index_table_kernel<DT_F16>);
  else go(index_table_kernel<DT_F32>);
  const int e = hg_launched();
  if (e) return e;
  raise_word<<<1, 1, 0, s>>>((volatile unsigned *)m.p[1], m.d[1], dyn);
  return hg_launched();
}

extern "C" {

// Whether hg_cu_index_table runs this shape: want ≤ 256 pages a head, pages of at most 1 024 rows.
HG_EXPORT int hg_cu_index_table_fits(int want, int pageSize) { return want >= 1 && want <= TABLE_WANT_MAX && pageSize >= 1 && pageSize <= TABLE_PAGE_MAX; }

// On the launching stream (hg_stream), recordable: table (mapped host, int32 [counts (kvHeads) | ids (kvHeads ·
// kmax)]) from pages (device, int32 [kvHeads, want], best first) over the first n rows, the partial
// page scored with q (f32 [kvHeads · group, headDim]) against keys (mapped host [kvHeads, cap,
// headDim] of dtype dt); then value into word. n and value change every step: the step's blob.
HG_EXPORT int hg_cu_index_table(HgCtx *c, int *table, unsigned *word, const int *pages, const float *q, const void *keys, int dt, int kvHeads, int group,
                                int headDim, int cap, int pageSize, int want, int budget, int kmax, int n, unsigned value) {
  if (!hg_cu_index_table_fits(want, pageSize) || kvHeads < 1 || group < 1 || headDim < 1 || headDim > TABLE_D_MAX || cap < 1 || budget < 1 || n < 0 || n > cap || kmax < min(budget, n) ||
      (dt != DT_F32 && dt != DT_F16 && dt != DT_BF16) || !table || !word || !pages || !q || !keys || (uintptr_t)table % 4 || (uintptr_t)word % 4)
    return (int)cudaErrorInvalidValue;
  HG_FLUSH_REC(c);
  Cmd m = hg_new_cmd(CMD_INDEX_TABLE);
  m.p[0] = table; m.p[1] = word; m.p[2] = pages; m.p[3] = q; m.p[4] = keys;
  m.s[0] = dt; m.s[1] = kvHeads; m.s[2] = group; m.s[3] = headDim; m.s[4] = cap; m.s[5] = pageSize; m.s[6] = want; m.s[7] = budget; m.s[8] = kmax;
  m.d[0] = n; m.d[1] = (int)value;
  const int r = hg_put_dyn(c, m, 2);
  return r ? r : hg_submit(c, m);
}

}  // extern "C"
