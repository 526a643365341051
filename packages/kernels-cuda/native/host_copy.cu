// The host link of the hybrid runtime: page-locked host memory, 2-D copies between host and
// device on the context's copy stream, events that order the copy and compute streams, and a
// per-step timeline of events from which T_gpu (compute-stream busy time) and T_tx (copy-stream
// time) are read, and the signal words host threads and the device hand work over with (the
// query sent to the CPU stage; the device waiting for the stage's output). One HgLink per
// context; TypeScript (src/host-link.ts) checks every range.
#include "common.cuh"
#include "host_link.cuh"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <stdio.h>
#include <pthread.h>
#include <sys/mman.h>

enum { MARK_RESUME = 0, MARK_PAUSE = 1, STALL_BEGIN = 2, STALL_END = 3, COPY_BEGIN = 4, COPY_END = 5 };
static const int POOL = HG_LINK_POOL;
static const double WAIT_TIMEOUT_MS = 10000;  // hg_link_await_signal's default

// hg_link_send_signalled's kernel: src's 16-byte pieces into mapped host memory, then (every
// thread's stores fenced system-wide first) the signal value into the word: a host thread that
// sees the value may read the bytes.
__global__ void signalled_copy(const uint4 *__restrict__ src, uint4 *__restrict__ dst, int pieces, volatile unsigned *word, const int *value, int valueNow) {
  for (int i = threadIdx.x; i < pieces; i += blockDim.x) dst[i] = src[i];
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) *word = value ? (unsigned)*value : (unsigned)valueNow;
}

// hg_link_await_signal's kernel (one thread): spins until the word reaches the value (mod 2^32),
// then fences so the ops after it read what the stage wrote before raising it. Past the timeout
// it records the give-up and returns; once one has, later waits return at once (and a running
// one stops: how hg_link_destroy ends it). The state's loads are issued together: each is a
// round trip to host memory.
__global__ void await_signal(volatile unsigned *word, const int *value, int valueNow, volatile HgLinkWords *w, int account) {
  const unsigned v = value ? (unsigned)*value : (unsigned)valueNow;
  const unsigned gaveUp = w->gaveUp;
  const unsigned long long limit = w->timeoutNs, waited = w->waitedNs;
  unsigned held = *word;
  if (gaveUp) return;
  const unsigned long long t0 = link_ns();
  while ((int)(held - v) < 0) {
    if (link_ns() - t0 >= limit) {
      w->gaveUpValue = v;
      w->gaveUpHeld = held;
      __threadfence_system();
      w->gaveUp = 1;
      break;
    }
    __nanosleep(64);
    held = *word;
    if (w->gaveUp) break;
  }
  __threadfence_system();
  if (account) w->waitedNs = waited + (link_ns() - t0);
}

Cmd hg_new_cmd(int kind);

// CMD_AWAIT_SIGNAL: p[0] the word's device address, p[1] the value (the step's blob when
// recording; NULL: d[0], an eager run's), p[2] the link's words (device address).
int hg_launch_await_signal(HgCtx *c, const Cmd &m) {
  await_signal<<<1, 1, 0, c->compute>>>((volatile unsigned *)m.p[0], (const int *)m.p[1], m.d[0], (volatile HgLinkWords *)m.p[2], 1);
  return hg_launched();
}

int hg_await_on(HgLink *l, cudaStream_t s, const void *word, int value) {
  await_signal<<<1, 1, 0, s>>>((volatile unsigned *)word, NULL, value, (volatile HgLinkWords *)l->wordsDev, 0);
  return hg_launched();
}

// CMD_SIGNALLED_COPY: p[0] src, p[1] dst (device address of mapped host memory), p[2] the word's
// device address, p[3] the value in the step's blob when recording (else NULL: d[0] is the value);
// s[0] 16-byte pieces.
int hg_launch_signalled_copy(HgCtx *c, const Cmd &m) {
  signalled_copy<<<1, 256, 0, hg_stream(c)>>>((const uint4 *)m.p[0], (uint4 *)m.p[1], m.s[0], (volatile unsigned *)m.p[2], (const int *)m.p[3], (int)m.d[0]);
  return hg_launched();
}

// Keeps the first failure's details for hg_link_error; returns e.
static cudaError_t note(HgLink *l, cudaError_t e, const char *what, const double *d) {
  if (e != cudaSuccess && !l->why[0]) {
    if (d) snprintf(l->why, sizeof l->why, "%s: %s (dst %#llx, src %#llx, width %.0f, rows %.0f, pitches %.0f/%.0f)", what, cudaGetErrorName(e),
                    (unsigned long long)d[0], (unsigned long long)d[1], d[2], d[3], d[4], d[5]);
    else snprintf(l->why, sizeof l->why, "%s: %s", what, cudaGetErrorName(e));
  }
  return e;
}

static int record(HgLink *l, int kind, cudaStream_t s) {
  if (l->n >= POOL) return 0;  // past the pool: ordering stays right, the step is timed short
  if (kind == STALL_BEGIN || kind == STALL_END) {
    if (!l->open) return 0;
  }
  cudaError_t e = cudaEventRecord(l->ev[l->n], s);
  if (e != cudaSuccess) return (int)e;
  l->kind[l->n++] = kind;
  return 0;
}

extern "C" {

HG_EXPORT HgLink *hg_link_create(HgCtx *c) {
  HgLink *l = (HgLink *)calloc(1, sizeof(HgLink));
  if (!l) return NULL;
  l->c = c;
  l->prev = -1;
  cudaSetDevice(c->device);
  int ok = 1;
  for (int i = 0; i < 3 && ok; i++) ok = cudaEventCreateWithFlags(&l->order[i], cudaEventDisableTiming) == cudaSuccess;
  for (int i = 0; i < POOL && ok; i++) ok = cudaEventCreate(&l->ev[i]) == cudaSuccess;
  // The signal words: a device that cannot map host memory has none (the calls that use them say so).
  void *w = NULL;
  if (ok && cudaHostAlloc(&w, sizeof(HgLinkWords), cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess) {
    if (cudaHostGetDevicePointer((void **)&l->wordsDev, w, 0) == cudaSuccess) {
      memset(w, 0, sizeof(HgLinkWords));
      l->words = (volatile HgLinkWords *)w;
      l->words->timeoutNs = (unsigned long long)(WAIT_TIMEOUT_MS * 1e6);
    } else {
      cudaFreeHost(w);
    }
  }
  cudaGetLastError();
  if (!ok) {
    if (l->words) cudaFreeHost((void *)l->words);
    for (int i = 0; i < 3; i++) if (l->order[i]) cudaEventDestroy(l->order[i]);
    for (int i = 0; i < POOL; i++) if (l->ev[i]) cudaEventDestroy(l->ev[i]);
    free(l);
    return NULL;
  }
  return l;
}

HG_EXPORT void hg_link_destroy(HgLink *l) {
  if (!l) return;
  cudaStreamSynchronize(l->c->copy);
  if (l->words) {  // waits queued or recorded on the words end before they are freed
    l->words->gaveUp = 1;
    hg_drain(l->c);
    hg_flush_copies(l->c);
    cudaStreamSynchronize(l->c->compute);
    if (l->ahead) cudaStreamSynchronize(l->ahead);
  }
  if (l->ahead) cudaStreamDestroy(l->ahead);
  for (int i = 0; i < 3; i++) cudaEventDestroy(l->order[i]);
  for (int i = 0; i < POOL; i++) cudaEventDestroy(l->ev[i]);
  if (l->words) cudaFreeHost((void *)l->words);
  free(l);
}

// On the launching stream (hg_stream: the side stream sends a ranking made there), recordable: `bytes` (a multiple of 16) of device memory src into mapped
// host memory dst (its device address), then the next value into the link's signal word:
// out[0] = the value, out[1] = the word's host address. A host thread that sees the word reach
// the value reads the bytes without anyone blocking on the device.
HG_EXPORT int hg_link_send_signalled(HgLink *l, const void *src, void *dst, double bytes, double *out) {
  if (!l->words) return (int)cudaErrorNotSupported;
  if (bytes < 16 || (size_t)bytes % 16 || bytes / 16 > 0x7fffffff) return (int)cudaErrorInvalidValue;
  HgCtx *c = l->c;
  HG_FLUSH_REC(c);
  const int value = (int)++l->signals;
  int *dev = NULL;
  // As hg_link_await_signal: in the step's blob when recording, else by value.
  if (hg_recording(c)) {
    const int e = hg_upload_ints(c, &value, 1, &dev);
    if (e) return e;
  }
  Cmd m = hg_new_cmd(CMD_SIGNALLED_COPY);
  m.p[0] = src; m.p[1] = dst; m.p[2] = (const void *)&l->wordsDev->send; m.p[3] = dev;
  m.s[0] = (int)(bytes / 16); m.d[0] = value;
  const int r = hg_submit(c, m);
  if (r) return r;
  out[0] = (double)(unsigned)value;
  out[1] = (double)(uintptr_t)&l->words->send;
  return 0;
}

// A new stage signal: out[0] = the next value, out[1] = the host address of the link's stage
// word (a CPU stage thread writes the value there once its output is in host memory), out[2] =
// the word's device address (what hg_link_await_signal takes).
HG_EXPORT int hg_link_stage_signal(HgLink *l, double *out) {
  if (!l->words) return (int)cudaErrorNotSupported;
  out[0] = (double)++l->stageSignals;
  out[1] = (double)(uintptr_t)&l->words->stage;
  out[2] = (double)(uintptr_t)&l->wordsDev->stage;
  return 0;
}

// On the compute stream, recordable: the device waits until the 32-bit word at `word` (a device
// address of mapped host memory) reaches `value` (mod 2^32), or gives up past the link's timeout.
HG_EXPORT int hg_link_await_signal(HgLink *l, const void *word, double value) {
  if (!l->words) return (int)cudaErrorNotSupported;
  if (!word || (uintptr_t)word % 4 || value < 0 || value > 4294967295.0) return (int)cudaErrorInvalidValue;
  HgCtx *c = l->c;
  HG_FLUSH_REC(c);
  const int v = (int)(unsigned)value;
  int *dev = NULL;
  // Recorded: the value lives in the step's blob, so a replay waits for the new one. Eager: by value.
  if (hg_recording(c)) {
    const int e = hg_upload_ints(c, &v, 1, &dev);
    if (e) return e;
  }
  Cmd m = hg_new_cmd(CMD_AWAIT_SIGNAL);
  m.p[0] = word; m.p[1] = dev; m.p[2] = (const void *)l->wordsDev;
  m.d[0] = v;
  return hg_submit(c, m);
}

// How long a wait may last before the device gives up (ms; waits that start later use it).
HG_EXPORT int hg_link_set_timeout(HgLink *l, double ms) {
  if (!l->words) return (int)cudaErrorNotSupported;
  if (!(ms > 0)) return (int)cudaErrorInvalidValue;
  l->words->timeoutNs = (unsigned long long)(ms * 1e6);
  return 0;
}

// 1 when a wait gave up since the last call (then out[0] = the value it waited for, out[1] =
// what the word held), and clears it; else 0.
HG_EXPORT int hg_link_gave_up(HgLink *l, double *out) {
  if (!l->words || !l->words->gaveUp) return 0;
  out[0] = l->words->gaveUpValue;
  out[1] = l->words->gaveUpHeld;
  l->words->gaveUp = 0;
  return 1;
}

// Page-locks [p, p + bytes) so copies with it are DMA'd asynchronously (cudaHostRegister),
// rounded out to whole pages. A registration must never cover another region's bytes: the
// driver takes a copy whose start lies in a registered range to be inside that range and
// refuses one that runs past its end (cudaErrorInvalidValue). So only blocks that own their
// pages are pinned — page-aligned and at least 2 MiB, as kernels-cpu's mmap'd blocks are
// (memory.c); smaller ones (and any whose pages another registration holds) return -1 and
// stay pageable, which copies handle correctly, only synchronously.
static size_t page_size(void) {
  static size_t ps = 0;
  if (!ps) {
    long v = sysconf(_SC_PAGESIZE);
    ps = v > 0 ? (size_t)v : 4096;
  }
  return ps;
}

static const size_t PIN_MIN_BYTES = 2u << 20;

// Regions this large have their pages made present by several threads before cudaHostRegister,
// which otherwise faults and zeroes every page of them on the one calling thread.
static const size_t PREFAULT_MIN_BYTES = (size_t)32 << 20, PREFAULT_PART_BYTES = (size_t)4 << 20;
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
struct Prefault {
  char *p;
  size_t len;
};
static void *prefault_part(void *arg) {
  const Prefault *f = (const Prefault *)arg;
  madvise(f->p, f->len, MADV_POPULATE_WRITE);  // a hint: the registration faults in what this leaves
  return NULL;
}
// The pages of [p, p + len) present and writable (contents unchanged), in parallel parts of whole
// 2 MiB pages; a kernel without MADV_POPULATE_WRITE leaves it to the registration.
static void prefault(char *p, size_t len) {
  if (len < PREFAULT_MIN_BYTES) return;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n > 16) n = 16;
  if (n > (long)(len / PREFAULT_PART_BYTES)) n = (long)(len / PREFAULT_PART_BYTES);
  if (n < 2) return;
  const size_t huge = (size_t)2 << 20, part = ((len / n) + huge - 1) & ~(huge - 1);
  pthread_t th[16];
  Prefault parts[16];
  int started = 0;
  for (int i = 0; i < (int)n; i++) {
    const size_t at = (size_t)i * part;
    if (at >= len) break;
    parts[i] = {p + at, at + part > len ? len - at : part};
    if (pthread_create(&th[i], NULL, prefault_part, &parts[i]) == 0) started |= 1 << i;
    else prefault_part(&parts[i]);
  }
  for (int i = 0; i < (int)n; i++)
    if (started & (1 << i)) pthread_join(th[i], NULL);
}

HG_EXPORT int hg_host_pin(void *p, double bytes) {
  const size_t ps = page_size();
  if (((uintptr_t)p & (ps - 1)) != 0 || (size_t)bytes < PIN_MIN_BYTES) return -1;
  const size_t len = ((size_t)bytes + ps - 1) & ~(ps - 1);
  prefault((char *)p, len);
  // Mapped too, so kernels may read it in place (hg_cu_gather_rows); a device that cannot map
  // host memory still gets it pinned for copies.
  cudaError_t e = cudaHostRegister(p, len, cudaHostRegisterPortable | cudaHostRegisterMapped);
  if (e != cudaSuccess && e != cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();
    e = cudaHostRegister(p, len, cudaHostRegisterPortable);
  }
  if (e == cudaErrorHostMemoryAlreadyRegistered) {
    cudaGetLastError();
    return -1;
  }
  return (int)e;
}
HG_EXPORT int hg_host_unpin(void *p) { return (int)cudaHostUnregister(p); }

// out[0] = the device address of pinned host memory at p (mapped by hg_host_pin); a non-zero
// status (memory the device does not map) leaves no error behind.
HG_EXPORT int hg_host_device_ptr(void *p, double *out) {
  void *d = NULL;
  const cudaError_t e = cudaHostGetDevicePointer(&d, p, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return (int)e;
  }
  out[0] = (double)(uintptr_t)d;
  return 0;
}

// n copies, each 6 doubles: dst address, src address, width bytes, rows, dst pitch, src pitch.
// dir 0 (device -> host): the copy stream first waits for every compute op queued so far.
// dir 1 (host -> device): it waits for the compute ops queued before the previous dir-1 call
// (the destination is double-buffered by the caller). Either way the compute stream's later
// ops wait for the copies (a D2H source may be overwritten at once; H2D data is there).
HG_EXPORT int hg_link_copy(HgLink *l, int dir, const double *d, int n) {
  HgCtx *c = l->c;
  {
    int fr = hg_drain(c);
    if (!fr) fr = hg_flush_copies(c);
    if (fr) return (int)note(l, (cudaError_t)fr, "queued ops before the copy", NULL);
  }
  cudaError_t e;
  if (dir == 0) {
    if ((e = note(l, cudaEventRecord(l->order[0], c->compute), "record compute", NULL)) != cudaSuccess) return (int)e;
    if ((e = note(l, cudaStreamWaitEvent(c->copy, l->order[0], 0), "copy waits on compute", NULL)) != cudaSuccess) return (int)e;
    l->prev = -1;  // order[0] was reused: the next H2D waits for everything queued by then
  } else {
    const int now = l->prev == 1 ? 2 : 1;
    if (l->prev >= 0 && (e = cudaStreamWaitEvent(c->copy, l->order[l->prev], 0)) != cudaSuccess) return (int)e;
    if (l->prev < 0) {
      if ((e = cudaEventRecord(l->order[0], c->compute)) != cudaSuccess) return (int)e;
      if ((e = cudaStreamWaitEvent(c->copy, l->order[0], 0)) != cudaSuccess) return (int)e;
    }
    if ((e = cudaEventRecord(l->order[now], c->compute)) != cudaSuccess) return (int)e;
    l->prev = now;
  }
  int r = record(l, COPY_BEGIN, c->copy);
  if (r) return r;
  const cudaMemcpyKind kind = dir == 0 ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  for (int i = 0; i < n; i++, d += 6) {
    void *dst = (void *)(uintptr_t)d[0];
    const void *src = (const void *)(uintptr_t)d[1];
    const size_t width = (size_t)d[2], rows = (size_t)d[3];
    if (width == 0 || rows == 0) continue;
    if (rows == 1) {
      e = cudaMemcpyAsync(dst, src, width, kind, c->copy);
    } else {
      e = cudaMemcpy2DAsync(dst, (size_t)d[4], src, (size_t)d[5], width, rows, kind, c->copy);
      if (e != cudaSuccess) {  // refused as a 2-D copy: the same bytes row by row
        note(l, e, "2-D copy (then row by row)", d);
        cudaGetLastError();
        l->rowwise++;
        e = cudaSuccess;
        for (size_t r = 0; r < rows && e == cudaSuccess; r++)
          e = cudaMemcpyAsync((char *)dst + r * (size_t)d[4], (const char *)src + r * (size_t)d[5], width, kind, c->copy);
      }
    }
    if (note(l, e, "copy", d) != cudaSuccess) return (int)e;
  }
  if ((r = record(l, COPY_END, c->copy))) return r;
  // A dedicated untimed event for the compute wait: order[0] may be re-recorded meanwhile.
  cudaEvent_t done = l->ev[l->n < POOL ? l->n - 1 : POOL - 1];
  if (l->n >= POOL) {
    if ((e = cudaEventRecord(l->order[0], c->copy)) != cudaSuccess) return (int)e;
    done = l->order[0];
    l->prev = -1;
  }
  if ((r = record(l, STALL_BEGIN, c->compute))) return r;
  if ((e = cudaStreamWaitEvent(c->compute, done, 0)) != cudaSuccess) return (int)e;
  return record(l, STALL_END, c->compute);
}

// The first failure of a copy call since creation ("" if none); out[0] = 2-D copies run row by row.
HG_EXPORT void hg_link_error(HgLink *l, char *buf, int len, double *rowwise) {
  if (buf && len > 0) snprintf(buf, (size_t)len, "%s", l->why);
  if (rowwise) *rowwise = l->rowwise;
}

// Resume (0): the host queues compute work again; pause (1): it is about to block.
HG_EXPORT int hg_link_mark(HgLink *l, int pause) {
  HG_FLUSH(l->c);
  int r = record(l, pause ? MARK_PAUSE : MARK_RESUME, l->c->compute);
  if (!r) l->open = !pause;
  return r;
}

// The host waits for every copy issued so far, and for the rows fetched ahead.
HG_EXPORT int hg_link_fence(HgLink *l) {
  const cudaError_t e = cudaStreamSynchronize(l->c->copy);
  return (int)(e == cudaSuccess && l->ahead ? cudaStreamSynchronize(l->ahead) : e);
}

// Waits for both streams, then out[0] = T_gpu ms (resume..pause spans less the compute stalls
// on copies inside them and the time hg_link_await_signal's waits took), out[1] = T_tx ms (copy
// spans), out[2] = events recorded, out[3] = the waits' ms, out[4] = the compute stream's ms inside
// recorded segments and out[5] = the host's ms blocked at a segment's start (hg_seg_times); restarts.
HG_EXPORT int hg_link_times(HgLink *l, double *out) {
  HgCtx *c = l->c;
  HG_FLUSH(c);
  cudaError_t e = cudaStreamSynchronize(c->compute);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->copy);
  if (e != cudaSuccess) return (int)e;
  double gpu = 0, tx = 0, stall = 0;
  int resume = -1, copyBegin = -1, stallBegin = -1;
  for (int i = 0; i < l->n; i++) {
    float ms = 0;
    switch (l->kind[i]) {
      case MARK_RESUME: resume = i; break;
      case MARK_PAUSE:
        if (resume >= 0 && cudaEventElapsedTime(&ms, l->ev[resume], l->ev[i]) == cudaSuccess) gpu += ms;
        resume = -1;
        break;
      case STALL_BEGIN: stallBegin = i; break;
      case STALL_END:
        if (stallBegin >= 0 && cudaEventElapsedTime(&ms, l->ev[stallBegin], l->ev[i]) == cudaSuccess) stall += ms;
        stallBegin = -1;
        break;
      case COPY_BEGIN: copyBegin = i; break;
      case COPY_END:
        if (copyBegin >= 0 && cudaEventElapsedTime(&ms, l->ev[copyBegin], l->ev[i]) == cudaSuccess) tx += ms;
        copyBegin = -1;
        break;
    }
  }
  double waited = 0;
  if (l->words) {
    waited = l->words->waitedNs / 1e6;
    l->words->waitedNs = 0;
  }
  out[0] = gpu - stall - waited > 0 ? gpu - stall - waited : 0;
  out[1] = tx;
  out[2] = l->n;
  out[3] = waited;
  hg_seg_times(c, &out[4], &out[5]);
  l->n = 0;
  l->open = 0;
  cudaGetLastError();  // an elapsed-time query on an unrecorded pair is not an error of the step
  return 0;
}

// Pinned copy bandwidth over `bytes` between a cudaMallocHost buffer and `dev` on the copy
// stream: out[0] host -> device, out[1] device -> host, in bytes per second.
HG_EXPORT int hg_link_bandwidth(HgLink *l, void *dev, double bytesD, int iters, double *out) {
  HgCtx *c = l->c;
  HG_FLUSH(c);
  const size_t bytes = (size_t)bytesD;
  void *host = NULL;
  cudaError_t e = cudaMallocHost(&host, bytes);
  if (e != cudaSuccess) return (int)e;
  memset(host, 1, bytes);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int dir = 0; dir < 2 && e == cudaSuccess; dir++) {
    const cudaMemcpyKind k = dir == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    void *dst = dir == 0 ? dev : host;
    const void *src = dir == 0 ? host : dev;
    e = cudaMemcpyAsync(dst, src, bytes, k, c->copy);  // warm-up
    if (e == cudaSuccess) e = cudaEventRecord(a, c->copy);
    for (int i = 0; i < iters && e == cudaSuccess; i++) e = cudaMemcpyAsync(dst, src, bytes, k, c->copy);
    if (e == cudaSuccess) e = cudaEventRecord(b, c->copy);
    float ms = 0;
    if (e == cudaSuccess) e = cudaEventSynchronize(b);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
    if (e == cudaSuccess) out[dir] = (double)bytes * iters / (ms / 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFreeHost(host);
  return (int)e;
}

}  // extern "C"
