// The backend context: device, streams, the arena (one cudaMalloc for the backend's life),
// host<->device copies, synchronisation and error strings.
#include "common.cuh"
#include "copy_rows.cuh"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const size_t INT_SCRATCH_BYTES = 4u << 20;   // 1M ints: ids, positions, slots
static const size_t BLOB_BYTES = HG_BLOB_BYTES;      // a recorded step's per-step values (graph.cu)
static const size_t SCRATCH_BYTES = 96u << 20;      // conversions and GEMM operands
static const size_t CUBLAS_WS_BYTES = 32u << 20;    // cuBLAS workspace
static const size_t MISC_BYTES = 1u << 20;          // argmax result
static const size_t DECODE_BYTES = 8u << 20;        // split-K decode attention partials (decode_attn.cu)
static const size_t UPLOAD_HALF = 256u << 10;       // pinned staging for eager int uploads, a half
// The arena's first bytes, in this order; the TypeScript allocator gets the rest.
static const size_t INTERNAL_BYTES = INT_SCRATCH_BYTES + BLOB_BYTES + SCRATCH_BYTES + CUBLAS_WS_BYTES + MISC_BYTES + DECODE_BYTES;

int hg_graph_init(HgCtx *c);
void hg_graph_free(HgCtx *c);

static void put(char *buf, int len, const char *text) {
  if (buf && len > 0) snprintf(buf, (size_t)len, "%s", text);
}

// cuBLAS statuses are reported as 10000 + status so they never collide with cudaError_t.
static const char *cublas_status_name(int s) {
  switch (s) {
    case 1: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case 3: return "CUBLAS_STATUS_ALLOC_FAILED";
    case 7: return "CUBLAS_STATUS_INVALID_VALUE";
    case 8: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case 11: return "CUBLAS_STATUS_MAPPING_ERROR";
    case 13: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case 14: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case 15: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case 16: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_UNKNOWN";
  }
}

__global__ void batched_copy_kernel(CopyBatch b) { batched_copy(b.d[blockIdx.y], blockIdx.x * (size_t)blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x); }
// The recorded form: the descriptors (destinations change every step) are in the device blob.
// Programmatic launch (hg_launch, common.cuh): waits before it reads the rows the kernel before wrote.
__global__ void batched_copy_ptr_kernel(const CopyBatch *b) {
  hg_pdl_trigger();
  hg_pdl_wait();
  batched_copy(b->d[blockIdx.y], blockIdx.x * (size_t)blockDim.x + threadIdx.x, (size_t)gridDim.x * blockDim.x);
}

int hg_launch_copybatch(HgCtx *c, const Cmd &cmd) {
  // launched programmatically (a recorded step's K/V append, before the attention)
  return hg_launch_pdl(c, true, batched_copy_ptr_kernel, dim3(cmd.s[1], cmd.s[0]), dim3(256), 0, (const CopyBatch *)cmd.p[0]);
}

int hg_flush_copies(HgCtx *c) {
  if (c->pending.n == 0) return 0;
  unsigned long long most = 0;
  for (int i = 0; i < c->pending.n; i++) most = c->pending.d[i].bytes > most ? c->pending.d[i].bytes : most;
  unsigned bx = (unsigned)((most / 16 + 255) / 256);
  dim3 grid(bx < 1 ? 1 : bx > 64 ? 64 : bx, c->pending.n);
  if (hg_recording(c)) {
    const long off = hg_blob_put(c, &c->pending, sizeof(CopyBatch));
    // The copies queued right after a recorded RoPE run inside it (rope_append.cu).
    Cmd *last = c->ncmds > 0 ? &c->cmds[c->ncmds - 1] : NULL;
    if (off >= 0 && last && last->kind == CMD_ROPE && !last->p[4] && rope_append_fits(*last, c->pending)) {
      last->p[4] = c->blobDev + off;
      last->s[5] = c->pending.n;
      c->pending.n = 0;
      return 0;
    }
    if (off >= 0) {
      Cmd cmd;
      memset(&cmd, 0, sizeof cmd);
      cmd.kind = CMD_COPYBATCH;
      cmd.s[0] = (int)grid.y;
      cmd.s[1] = (int)grid.x;
      cmd.p[0] = c->blobDev + off;
      cmd.dynOff = -1;
      c->pending.n = 0;
      return hg_submit(c, cmd);
    }
    int r = hg_drain(c);  // blob full: the rest of the step runs eagerly
    if (r) return r;
  }
  batched_copy_kernel<<<grid, 256, 0, c->compute>>>(c->pending);
  c->pending.n = 0;
  return hg_launched();
}

// Queues a small copy; when it touches memory a queued copy uses, or the queue is full, the queue
// runs first as a batch of its own (inside a recorded step too: a batched step's row appends overflow it). Returns 1 when queued.
static int queue_copy(HgCtx *c, char *dst, int dd, const char *src, int sd, size_t count) {
  const size_t db = count * (dd == DT_F32 ? 4 : 2), sb = count * (sd == DT_F32 ? 4 : 2);
  if (!c->batchCopies || db > (64u << 10) || (sd != dd && sd != DT_F32)) return 0;
  if (hg_overlaps(src, sb, dst, db)) return 0;
  bool first = c->pending.n == HG_MAX_PENDING_COPIES;  // the queued copies must run before this one
  for (int i = 0; i < c->pending.n && !first; i++) {
    const CopyDesc &p = c->pending.d[i];
    first = hg_overlaps(src, sb, p.dst, p.bytes) || hg_overlaps(dst, db, p.dst, p.bytes) || hg_overlaps(dst, db, p.src, copy_src_bytes(p));
  }
  // The queue goes ahead as one batch, then this copy starts the next.
  if (first && hg_flush_copies(c) != 0) return 0;
  c->pending.d[c->pending.n++] = CopyDesc{src, dst, (unsigned long long)db, sd, dd};
  return 1;
}

extern "C" {

// 0 runs every small copy as its own cudaMemcpyAsync (to measure what the queue saves).
HG_EXPORT void hg_cu_set_batch_copies(HgCtx *c, int on) {
  if (!on) hg_flush_copies(c);
  c->batchCopies = on;
}

HG_EXPORT void hg_cu_error_string(int code, char *buf, int len) {
  char tmp[512];
  if (code >= 10000) snprintf(tmp, sizeof tmp, "%s (cuBLAS status %d)", cublas_status_name(code - 10000), code - 10000);
  else snprintf(tmp, sizeof tmp, "%s: %s", cudaGetErrorName((cudaError_t)code), cudaGetErrorString((cudaError_t)code));
  put(buf, len, tmp);
}

// Free and total bytes of `device` before any arena is taken (for sizing and error messages).
HG_EXPORT int hg_cu_mem_info(int device, double *freeTotal) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return (int)e;
  size_t f = 0, t = 0;
  e = cudaMemGetInfo(&f, &t);
  if (e != cudaSuccess) return (int)e;
  freeTotal[0] = (double)f;
  freeTotal[1] = (double)t;
  return 0;
}

// Creates a context whose arena is `arenaBytes` (0: `fraction` of the free memory). The
// first bytes of the arena are the context's scratch; the rest is handed out by the
// TypeScript allocator. On failure returns null and writes the reason to err.
HG_EXPORT HgCtx *hg_cu_create(int device, double arenaBytes, double fraction, const char *cublasPath, int cublasOff, char *err, int errLen) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) { hg_cu_error_string((int)e, err, errLen); return NULL; }
  size_t freeB = 0, totalB = 0;
  if ((e = cudaMemGetInfo(&freeB, &totalB)) != cudaSuccess) { hg_cu_error_string((int)e, err, errLen); return NULL; }
  size_t want = arenaBytes > 0 ? (size_t)arenaBytes : (size_t)((double)freeB * fraction);
  want &= ~(size_t)((1u << 21) - 1);  // whole 2 MiB pages
  size_t internal = INTERNAL_BYTES;
  if (want < internal + (16u << 20)) {
    char tmp[256];
    snprintf(tmp, sizeof tmp, "an arena of %zu bytes is too small (the backend needs at least %zu)", want, internal + (16u << 20));
    put(err, errLen, tmp);
    return NULL;
  }
  if (want > freeB) {
    char tmp[256];
    snprintf(tmp, sizeof tmp, "an arena of %zu bytes was requested, but device %d has %zu bytes free (%zu in all)", want, device, freeB, totalB);
    put(err, errLen, tmp);
    return NULL;
  }
  HgCtx *c = (HgCtx *)calloc(1, sizeof(HgCtx));
  if (!c) { put(err, errLen, "out of host memory"); return NULL; }
  c->device = device;
  c->batchCopies = 1;
  c->stepKey = -1;
  cudaDeviceGetAttribute(&c->numSMs, cudaDevAttrMultiProcessorCount, device);
  if ((e = cudaMalloc((void **)&c->arena, want)) != cudaSuccess) goto fail;
  c->arenaBytes = want;
  if ((e = cudaStreamCreateWithFlags(&c->compute, cudaStreamNonBlocking)) != cudaSuccess) goto fail;
  if ((e = cudaStreamCreateWithFlags(&c->copy, cudaStreamNonBlocking)) != cudaSuccess) goto fail;
  if ((e = cudaMallocHost((void **)&c->argmaxHost, 64)) != cudaSuccess) goto fail;
  if ((e = cudaMallocHost((void **)&c->uploadHost, 2 * UPLOAD_HALF)) != cudaSuccess) goto fail;
  for (int i = 0; i < 2; i++)
    if ((e = cudaEventCreateWithFlags(&c->uploadDone[i], cudaEventDisableTiming)) != cudaSuccess) goto fail;
  if ((e = (cudaError_t)hg_graph_init(c)) != cudaSuccess) goto fail;
  c->intScratch = (int *)c->arena;
  c->intScratchCount = INT_SCRATCH_BYTES / sizeof(int);
  c->blobDev = c->arena + INT_SCRATCH_BYTES;
  c->scratch = c->blobDev + BLOB_BYTES;
  c->scratchBytes = SCRATCH_BYTES;
  c->cublasWorkspace = c->scratch + SCRATCH_BYTES;
  c->cublasWorkspaceBytes = CUBLAS_WS_BYTES;
  c->argmaxOut = (int *)((char *)c->cublasWorkspace + CUBLAS_WS_BYTES);
  c->decodePart = (float *)((char *)c->argmaxOut + MISC_BYTES);
  c->decodePartBytes = DECODE_BYTES;
  // The misc area starts zeroed: a token feed read before any pick reads 0, not stale memory.
  if ((e = cudaMemsetAsync(c->argmaxOut, 0, MISC_BYTES, c->compute)) != cudaSuccess) goto fail;
  if (cublasOff) snprintf(c->cublasInfo, sizeof c->cublasInfo, "off");
  else hg_cublas_load(c, cublasPath && cublasPath[0] ? cublasPath : NULL);
  return c;
fail:
  hg_cu_error_string((int)e, err, errLen);
  hg_graph_free(c);
  if (c->argmaxHost) cudaFreeHost(c->argmaxHost);
  if (c->uploadHost) cudaFreeHost(c->uploadHost);
  for (int i = 0; i < 2; i++)
    if (c->uploadDone[i]) cudaEventDestroy(c->uploadDone[i]);
  if (c->compute) cudaStreamDestroy(c->compute);
  if (c->copy) cudaStreamDestroy(c->copy);
  if (c->arena) cudaFree(c->arena);
  free(c);
  return NULL;
}

HG_EXPORT void hg_cu_destroy(HgCtx *c) {
  if (!c) return;
  cudaSetDevice(c->device);
  hg_drain(c);
  c->stepMode = STEP_NONE;
  hg_flush_copies(c);
  cudaStreamSynchronize(c->compute);
  hg_graph_free(c);
  hg_feed_free(c);
  hg_side_free(c);
  hg_cublas_unload(c);
  cudaFreeHost(c->argmaxHost);
  cudaFreeHost(c->uploadHost);
  for (int i = 0; i < 2; i++) cudaEventDestroy(c->uploadDone[i]);
  cudaStreamDestroy(c->compute);
  cudaStreamDestroy(c->copy);
  cudaFree(c->arena);
  free(c);
}

// Where the allocator's part of the arena starts (device address) and how many bytes it has.
HG_EXPORT double hg_cu_heap_base(HgCtx *c) { return (double)(uintptr_t)(c->arena + INTERNAL_BYTES); }
HG_EXPORT double hg_cu_heap_bytes(HgCtx *c) { return (double)(c->arenaBytes - INTERNAL_BYTES); }
HG_EXPORT double hg_cu_arena_bytes(HgCtx *c) { return (double)c->arenaBytes; }
HG_EXPORT int hg_cu_num_sms(HgCtx *c) { return c->numSMs; }
HG_EXPORT void hg_cu_cublas_info(HgCtx *c, char *buf, int len) { put(buf, len, c->cublasInfo); }

// Waits for the compute stream; returns the first error of anything queued on it.
HG_EXPORT int hg_cu_sync(HgCtx *c) {
  HG_FLUSH(c);
  cudaError_t e = cudaStreamSynchronize(c->compute);
  if (e == cudaSuccess) e = cudaGetLastError();
  return (int)e;
}

// Raw bytes host -> device (loadWeight); synchronous, so the host bytes may go right after.
HG_EXPORT int hg_cu_upload(HgCtx *c, void *dst, const void *src, double bytes) {
  HG_FLUSH(c);
  cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyHostToDevice, c->compute);
  if (e != cudaSuccess) return (int)e;
  return (int)cudaStreamSynchronize(c->compute);
}

HG_EXPORT int hg_cu_memset0(HgCtx *c, void *dst, double bytes) {
  HG_FLUSH(c);
  return (int)cudaMemsetAsync(dst, 0, (size_t)bytes, c->compute);
}

}  // extern "C"

int hg_upload_ints2(HgCtx *c, const int *a, size_t na, const int *b, size_t nb, int **dev) {
  const size_t n = na + nb;
  if (hg_recording(c)) {
    const long off = hg_blob_put(c, NULL, n * sizeof(int));
    if (off >= 0) {
      int *h = (int *)(c->blobHost[c->blobCur] + off);
      if (na) memcpy(h, a, na * sizeof(int));
      if (nb) memcpy(h + na, b, nb * sizeof(int));
      *dev = (int *)(c->blobDev + off);
      return 0;
    }
    int r = hg_drain(c);  // blob full: the caller sees the step is no longer recording
    if (r) return r;
  }
  if (n > c->intScratchCount) return (int)cudaErrorInvalidValue;
  *dev = c->intScratch;
  const size_t bytes = n * sizeof(int);
  cudaError_t e = cudaSuccess;
  if (bytes > UPLOAD_HALF) {  // pageable: the driver may wait for the stream first
    e = na ? cudaMemcpyAsync(c->intScratch, a, na * sizeof(int), cudaMemcpyHostToDevice, c->compute) : cudaSuccess;
    if (e == cudaSuccess && nb) e = cudaMemcpyAsync(c->intScratch + na, b, nb * sizeof(int), cudaMemcpyHostToDevice, c->compute);
    return (int)e;
  }
  // Staged in pinned memory, so the copy never waits for the stream (which may be spinning on the
  // CPU stage); a half is rewritten only once the copies from its last turn have run.
  if (c->uploadUsed + bytes > UPLOAD_HALF) {
    if ((e = cudaEventRecord(c->uploadDone[c->uploadHalf], c->compute)) != cudaSuccess) return (int)e;
    c->uploadHalf ^= 1;
    c->uploadUsed = 0;
    if ((e = cudaEventSynchronize(c->uploadDone[c->uploadHalf])) != cudaSuccess) return (int)e;
  }
  int *h = (int *)(c->uploadHost + c->uploadHalf * UPLOAD_HALF + c->uploadUsed);
  if (na) memcpy(h, a, na * sizeof(int));
  if (nb) memcpy(h + na, b, nb * sizeof(int));
  c->uploadUsed += (bytes + 15) & ~(size_t)15;
  return (int)cudaMemcpyAsync(c->intScratch, h, bytes, cudaMemcpyHostToDevice, c->compute);
}

int hg_upload_ints(HgCtx *c, const int *host, size_t count, int **dev) { return hg_upload_ints2(c, host, count, NULL, 0, dev); }

// ---- dtype conversion ------------------------------------------------------------------------

template <int DD, int SD>
__global__ void convert_kernel(void *dst, const void *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    st<DD>(dst, i, ld<SD>(src, i));
}

static int convert(HgCtx *c, void *dst, int dd, const void *src, int sd, size_t n) {
  if (n == 0) return 0;
  if (dd == sd) {
    size_t b = n * (dd == DT_F32 ? 4 : 2);
    return (int)cudaMemcpyAsync(dst, src, b, cudaMemcpyDeviceToDevice, c->compute);
  }
  unsigned blocks = hg_blocks(n, 256, (unsigned)c->numSMs * 16);
  HG_DISPATCH_DT(dd, D, HG_DISPATCH_DT(sd, S, (convert_kernel<D, S><<<blocks, 256, 0, c->compute>>>(dst, src, n))));
  return hg_launched();
}

int hg_convert_device(HgCtx *c, void *dst, int dd, const void *src, int sd, size_t n) { return convert(c, dst, dd, src, sd, n); }

extern "C" {

// f32 host values -> tensor of dtype dt (through the scratch when a conversion is needed).
HG_EXPORT int hg_cu_write(HgCtx *c, void *dst, int dt, const float *src, double countD) {
  size_t count = (size_t)countD;
  HG_FLUSH(c);
  if (dt == DT_F32) return (int)cudaMemcpyAsync(dst, src, count * 4, cudaMemcpyHostToDevice, c->compute);
  size_t chunk = c->scratchBytes / 4, eb = 2;
  for (size_t off = 0; off < count; off += chunk) {
    size_t n = count - off < chunk ? count - off : chunk;
    cudaError_t e = cudaMemcpyAsync(c->scratch, src + off, n * 4, cudaMemcpyHostToDevice, c->compute);
    if (e != cudaSuccess) return (int)e;
    int r = convert(c, (char *)dst + off * eb, dt, c->scratch, DT_F32, n);
    if (r) return r;
  }
  return 0;
}

// Tensor of dtype dt -> f32 host values; waits for the copy (and everything before it).
HG_EXPORT int hg_cu_read(HgCtx *c, float *dst, const void *src, int dt, double countD) {
  size_t count = (size_t)countD;
  HG_FLUSH(c);
  if (dt == DT_F32) {
    cudaError_t e = cudaMemcpyAsync(dst, src, count * 4, cudaMemcpyDeviceToHost, c->compute);
    if (e != cudaSuccess) return (int)e;
    return hg_cu_sync(c);
  }
  size_t chunk = c->scratchBytes / 4, eb = 2;
  for (size_t off = 0; off < count; off += chunk) {
    size_t n = count - off < chunk ? count - off : chunk;
    int r = convert(c, c->scratch, DT_F32, (const char *)src + off * eb, dt, n);
    if (r) return r;
    cudaError_t e = cudaMemcpyAsync(dst + off, c->scratch, n * 4, cudaMemcpyDeviceToHost, c->compute);
    if (e != cudaSuccess) return (int)e;
    if ((r = hg_cu_sync(c))) return r;
  }
  return hg_cu_sync(c);
}

// count elements src (dtype sd) -> dst (dtype dd), memmove semantics for same-dtype overlap.
HG_EXPORT int hg_cu_copy(HgCtx *c, void *dst, int dd, const void *src, int sd, double countD) {
  size_t count = (size_t)countD;
  if (count == 0) return 0;
  size_t bytes = count * (dd == DT_F32 ? 4 : 2);
  char *d = (char *)dst;
  const char *s = (const char *)src;
  size_t gap = d > s ? (size_t)(d - s) : (size_t)(s - d);
  if (queue_copy(c, d, dd, s, sd, count)) return 0;
  HG_FLUSH(c);
  if (dd != sd) return convert(c, dst, dd, src, sd, count);
  if (gap >= bytes) return (int)cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice, c->compute);
  if (gap == 0) return 0;
  if (bytes <= c->scratchBytes) {  // through the scratch: two plain copies
    cudaError_t e = cudaMemcpyAsync(c->scratch, s, bytes, cudaMemcpyDeviceToDevice, c->compute);
    if (e == cudaSuccess) e = cudaMemcpyAsync(d, c->scratch, bytes, cudaMemcpyDeviceToDevice, c->compute);
    return (int)e;
  }
  // Overlap: pieces no longer than the gap never overlap each other; go forward when the
  // destination is below the source, backward otherwise, so no source byte is overwritten first.
  size_t pieces = (bytes + gap - 1) / gap;
  for (size_t i = 0; i < pieces; i++) {
    size_t p = d < s ? i : pieces - 1 - i;
    size_t off = p * gap, len = bytes - off < gap ? bytes - off : gap;
    cudaError_t e = cudaMemcpyAsync(d + off, s + off, len, cudaMemcpyDeviceToDevice, c->compute);
    if (e != cudaSuccess) return (int)e;
  }
  return 0;
}

}  // extern "C"

// ---- events (timing and stream ordering) and diagnostics -------------------------------------

extern "C" {

HG_EXPORT void *hg_cu_event_new(void) {
  cudaEvent_t e = NULL;
  return cudaEventCreate(&e) == cudaSuccess ? (void *)e : NULL;
}
HG_EXPORT void hg_cu_event_free(void *e) { if (e) cudaEventDestroy((cudaEvent_t)e); }
// stream: 0 compute, 1 copy.
HG_EXPORT int hg_cu_event_record(HgCtx *c, void *e, int stream) {
  HG_FLUSH(c);
  return (int)cudaEventRecord((cudaEvent_t)e, stream ? c->copy : c->compute);
}
// Makes `stream` wait for the event (cross-stream ordering without a host sync).
HG_EXPORT int hg_cu_stream_wait(HgCtx *c, int stream, void *e) {
  HG_FLUSH(c);
  return (int)cudaStreamWaitEvent(stream ? c->copy : c->compute, (cudaEvent_t)e, 0);
}
// Milliseconds between two recorded events; waits for the second.
HG_EXPORT int hg_cu_event_elapsed(void *a, void *b, float *ms) {
  cudaError_t e = cudaEventSynchronize((cudaEvent_t)b);
  if (e == cudaSuccess) e = cudaEventElapsedTime(ms, (cudaEvent_t)a, (cudaEvent_t)b);
  return (int)e;
}

// Device-to-device copy bandwidth (bytes read + written per second) over `iters` copies of
// `bytes` from src to dst, timed with events: the floor the decode benchmark compares with.
HG_EXPORT int hg_cu_copy_bandwidth(HgCtx *c, void *dst, const void *src, double bytes, int iters, double *bytesPerSecond) {
  HG_FLUSH(c);
  float ms = 0;
  const int r = hg_time_runs(c, iters, [&]() { return cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDeviceToDevice, c->compute); }, &ms);
  if (r == 0) *bytesPerSecond = 2.0 * bytes * iters / (ms / 1e3);
  return r;
}

}  // extern "C"

__global__ void trap_kernel(int *p) { if (threadIdx.x == 0) __trap(); *p = 1; }
__global__ void noop_kernel(void) {}

extern "C" {
// Test hook: kind 0 launches with an invalid block size (a launch error the context survives),
// kind 1 traps inside a kernel (a sticky error: the context is lost until the process ends).
HG_EXPORT int hg_cu_test_fault(HgCtx *c, int kind) {
  HG_FLUSH(c);
  if (kind == 0) noop_kernel<<<1, 4096, 0, c->compute>>>();
  else trap_kernel<<<1, 32, 0, c->compute>>>(c->argmaxOut);
  int r = hg_launched();
  return r ? r : (int)cudaStreamSynchronize(c->compute);
}
}
