// Rows fetched ahead (core's RowFetch): a pair of slots whose row gathers run on the link's side
// stream, so a layer's selected rows cross PCIe while the compute stream still runs the layer
// before (HBM-bound GEMVs and PCIe-bound gathers overlap instead of taking turns). Per slot two
// events: `ready` (the side stream's gathers are done; the compute stream waits on it) and `freed`
// (the compute stream has consumed the rows; the next fetch into the slot waits on it). Inside a
// recorded step both are external event nodes of the graph, so a replay waits for the fetch the
// host queued before launching it.
#include "common.cuh"
#include "host_link.cuh"
#include "gather_rows.cuh"
#include <stdlib.h>

struct HgFetch {
  HgLink *l;
  cudaEvent_t ready[2], freed[2];
};

Cmd hg_new_cmd(int kind);

// A batch's fetch (hg_fetch_rows_batch): its words and gathers go as kernel parameters (the side
// stream is never recorded, so nothing is uploaded), FB_WAITS words and FB_GATHERS gathers a launch.
static const int FB_WAITS = 64, FB_GATHERS = 48;
struct FbWaits {
  unsigned long long word[FB_WAITS];
  unsigned value[FB_WAITS];
  int n;
};
struct FbGather {
  unsigned long long dst, src, table;
  long long cap;
  int groups, kmax, pieces, pad;
};
struct FbGathers {
  FbGather g[FB_GATHERS];
  int n;
};

// Thread i waits until word i reaches its value (mod 2^32), as the hand-off's wait does; past the link's
// timeout it records the give-up and returns (later waits at once). A side stream's wait: not in waitedNs.
__global__ void fetch_await_kernel(const __grid_constant__ FbWaits w, volatile HgLinkWords *lw) {
  const unsigned long long t0 = link_ns(), limit = lw->timeoutNs;
  for (int i = threadIdx.x; i < w.n; i += blockDim.x) link_await_word((volatile unsigned *)w.word[i], w.value[i], lw, t0, limit);
  __threadfence_system();
}

// blockIdx.y: a gather of the launch (gather_rows_kernel's, over blockIdx.x's chunks).
__global__ void __launch_bounds__(GATHER_THREADS) fetch_gathers_kernel(const __grid_constant__ FbGathers g) {
  __shared__ long long rowAt[GATHER_CHUNK];
  const FbGather &x = g.g[blockIdx.y];
  gather_rows_chunks((uint4 *)x.dst, (const uint4 *)x.src, (const int32_t *)x.table, x.groups, x.kmax, x.cap, x.pieces, rowAt);
}

// CMD_EVENT: p[0] the event; s[0] 1 = record it on the compute stream, 0 = the compute stream waits for it.
int hg_launch_event(HgCtx *c, const Cmd &m) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  const cudaError_t q = cudaStreamIsCapturing(c->compute, &st);
  if (q != cudaSuccess) return (int)q;
  const bool captured = st == cudaStreamCaptureStatusActive;
  cudaEvent_t ev = (cudaEvent_t)m.p[0];
  if (m.s[0]) return (int)cudaEventRecordWithFlags(ev, c->compute, captured ? cudaEventRecordExternal : cudaEventRecordDefault);
  return (int)cudaStreamWaitEvent(c->compute, ev, captured ? cudaEventWaitExternal : cudaEventWaitDefault);
}

extern "C" {

// A new pair of slots (NULL: the device cannot map the link's words, or no events). The side
// stream is the link's, made on first use at the highest priority: its small gathers should start
// as soon as an SM frees up, not after the GEMV queued behind them.
HG_EXPORT HgFetch *hg_fetch_create(HgLink *l) {
  if (!l->words) return NULL;
  cudaSetDevice(l->c->device);
  if (!l->ahead) {
    int least = 0, greatest = 0;
    cudaDeviceGetStreamPriorityRange(&least, &greatest);
    if (cudaStreamCreateWithPriority(&l->ahead, cudaStreamNonBlocking, greatest) != cudaSuccess) {
      l->ahead = NULL;
      cudaGetLastError();
      return NULL;
    }
  }
  HgFetch *f = (HgFetch *)calloc(1, sizeof(HgFetch));
  if (!f) return NULL;
  f->l = l;
  bool ok = true;
  for (int i = 0; i < 2 && ok; i++)
    ok = cudaEventCreateWithFlags(&f->ready[i], cudaEventDisableTiming) == cudaSuccess &&
         cudaEventCreateWithFlags(&f->freed[i], cudaEventDisableTiming) == cudaSuccess;
  if (!ok) {
    for (int i = 0; i < 2; i++) {
      if (f->ready[i]) cudaEventDestroy(f->ready[i]);
      if (f->freed[i]) cudaEventDestroy(f->freed[i]);
    }
    free(f);
    cudaGetLastError();
    return NULL;
  }
  return f;
}

// Queued now on the side stream, never recorded: after the slot's last release launched before
// this call, wait until `word` (device address) reaches `value`, then the n gathers, each 7
// doubles: dst, src (device address of the mapped store), table (device address of the mapped
// [counts | ids]), groups, kmax, cap, rowBytes; then the slot is ready.
HG_EXPORT int hg_fetch_rows(HgFetch *f, int slot, const void *word, double value, const double *g, int n) {
  if (slot < 0 || slot > 1 || n < 0) return (int)cudaErrorInvalidValue;
  HgLink *l = f->l;
  cudaStream_t s = l->ahead;
  cudaError_t e = cudaStreamWaitEvent(s, f->freed[slot], 0);
  if (e != cudaSuccess) return (int)e;
  int r = hg_await_on(l, s, word, (int)(unsigned)value);
  for (int i = 0; i < n && !r; i++, g += 7)
    r = hg_gather_rows_on(l->c, s, (void *)(uintptr_t)g[0], (const void *)(uintptr_t)g[1], (const int *)(uintptr_t)g[2], (int)g[3], (int)g[4], (long long)g[5], (int)g[6] / 16);
  if (r) return r;
  return (int)cudaEventRecord(f->ready[slot], s);
}

// A batch's rows in one fetch, queued now on the side stream, never recorded: after the slot's last
// release launched before this call, wait until every word (waits: n × [device address, value])
// reaches its value, then the m gathers (7 doubles each, as hg_fetch_rows'); then the slot is ready.
HG_EXPORT int hg_fetch_rows_batch(HgFetch *f, int slot, const double *waits, int n, const double *g, int m) {
  if (slot < 0 || slot > 1 || n < 1 || m < 0 || !waits || (m && !g)) return (int)cudaErrorInvalidValue;
  for (int i = 0; i < n; i++)
    if (!waits[2 * i] || (unsigned long long)waits[2 * i] % 4 || waits[2 * i + 1] < 0 || waits[2 * i + 1] > 4294967295.0) return (int)cudaErrorInvalidValue;
  for (int j = 0; j < m; j++) {
    const double *d = g + 7 * j;
    if (!d[0] || !d[1] || !d[2] || (unsigned long long)d[2] % 4 || d[3] < 1 || d[4] < 1 || d[5] < d[4] || d[6] < 16 || (long long)d[6] % 16) return (int)cudaErrorInvalidValue;
  }
  HgLink *l = f->l;
  cudaStream_t s = l->ahead;
  cudaError_t e = cudaStreamWaitEvent(s, f->freed[slot], 0);
  if (e != cudaSuccess) return (int)e;
  for (int i0 = 0; i0 < n; i0 += FB_WAITS) {
    FbWaits w = {};
    w.n = n - i0 < FB_WAITS ? n - i0 : FB_WAITS;
    for (int i = 0; i < w.n; i++) {
      w.word[i] = (unsigned long long)waits[2 * (i0 + i)];
      w.value[i] = (unsigned)waits[2 * (i0 + i) + 1];
    }
    fetch_await_kernel<<<1, FB_WAITS, 0, s>>>(w, (volatile HgLinkWords *)l->wordsDev);
    int r = hg_launched();
    if (r) return r;
  }
  const int half = l->c->numSMs > 1 ? l->c->numSMs / 2 : 1;  // as the per-row gather: ~1 MiB in flight, the SMs left to the GEMVs
  for (int j0 = 0; j0 < m; j0 += FB_GATHERS) {
    FbGathers x = {};
    x.n = m - j0 < FB_GATHERS ? m - j0 : FB_GATHERS;
    for (int j = 0; j < x.n; j++) {
      const double *d = g + 7 * (j0 + j);
      x.g[j] = FbGather{(unsigned long long)d[0], (unsigned long long)d[1], (unsigned long long)d[2], (long long)d[5], (int)d[3], (int)d[4], (int)d[6] / 16, 0};
    }
    fetch_gathers_kernel<<<dim3((unsigned)((half + x.n - 1) / x.n), (unsigned)x.n), GATHER_THREADS, 0, s>>>(x);
    int r = hg_launched();
    if (r) return r;
  }
  return (int)cudaEventRecord(f->ready[slot], s);
}

// On the compute stream, recordable: release = 0, the ops after it wait for the slot's last fetch
// (ready); release = 1, the slot's rows are consumed once the ops before it have run.
HG_EXPORT int hg_fetch_mark(HgFetch *f, int slot, int release) {
  if (slot < 0 || slot > 1) return (int)cudaErrorInvalidValue;
  HgCtx *c = f->l->c;
  HG_FLUSH_REC(c);
  Cmd m = hg_new_cmd(CMD_EVENT);
  m.p[0] = release ? (const void *)f->freed[slot] : (const void *)f->ready[slot];
  m.s[0] = release ? 1 : 0;
  return hg_submit(c, m);
}

// Waits for the side stream (a fetch still waiting for its signal gives up at the link's timeout), then frees the slots.
HG_EXPORT void hg_fetch_destroy(HgFetch *f) {
  if (!f) return;
  if (f->l->ahead) cudaStreamSynchronize(f->l->ahead);
  for (int i = 0; i < 2; i++) {
    cudaEventDestroy(f->ready[i]);
    cudaEventDestroy(f->freed[i]);
  }
  free(f);
  cudaGetLastError();
}

}  // extern "C"
