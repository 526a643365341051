// Rows fetched ahead (core's RowFetch): a pair of slots whose row gathers run on the link's side
// stream, so a layer's selected rows cross PCIe while the compute stream still runs the layer
// before (HBM-bound GEMVs and PCIe-bound gathers overlap instead of taking turns). Per slot two
// events: `ready` (the side stream's gathers are done; the compute stream waits on it) and `freed`
// (the compute stream has consumed the rows; the next fetch into the slot waits on it). Inside a
// recorded step both are external event nodes of the graph, so a replay waits for the fetch the
// host queued before launching it.
#include "common.cuh"
#include "host_link.cuh"
#include <stdlib.h>

struct HgFetch {
  HgLink *l;
  cudaEvent_t ready[2], freed[2];
};

Cmd hg_new_cmd(int kind);

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
