// Decode-step graphs: record a step's launches as commands, replay a cached CUDA graph when the
// commands match the ones it was captured from, capture a new one when they do not. A decode
// step of an 8B model is ~420 launches of a few µs of host time each; one graph launch
// replaces them. The per-step values live in a device blob the kernels read (see common.cuh).
#include "common.cuh"
#include <cuda_profiler_api.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

// A key whose step had to drain runs its next steps eagerly without recording (a step that
// reads or writes host memory mid-way, e.g. hybrid attention, would drain every time).
static const int SKIP_AFTER_DRAIN = 32;

long hg_blob_put(HgCtx *c, const void *data, size_t bytes) {
  const size_t off = (c->blobUsed + 15) & ~(size_t)15;
  if (off + bytes > HG_BLOB_BYTES) return -1;
  if (data) memcpy(c->blobHost[c->blobCur] + off, data, bytes);
  c->blobUsed = off + bytes;
  return (long)off;
}

int hg_run_cmd(HgCtx *c, const Cmd &cmd, const char *dynBase) {
  switch (cmd.kind) {
    case CMD_GEMV: return hg_launch_gemv(c, cmd);
    case CMD_LOGITS:
    case CMD_AGG: return hg_launch_attn(c, cmd, dynBase);
    case CMD_COPYBATCH: return hg_launch_copybatch(c, cmd);
    case CMD_GEMV_FUSED: return hg_launch_gemv_fused(c, cmd);
    case CMD_DECODE_ATTN: return hg_launch_decode_attn(c, cmd, dynBase);
    case CMD_SKINNY: return hg_launch_skinny(c, cmd);
    case CMD_BATCH_ATTN: return hg_launch_batch_attn(c, cmd);
    case CMD_GEMV_STREAM: return hg_launch_gemv_stream(c, cmd);
    case CMD_GATHER_ROWS: return hg_launch_gather_rows(c, cmd);
    case CMD_SIGNALLED_COPY: return hg_launch_signalled_copy(c, cmd);
    case CMD_AWAIT_SIGNAL: return hg_launch_await_signal(c, cmd);
    case CMD_READ_MAPPED: return hg_launch_read_mapped(c, cmd);
    case CMD_PAD_COLUMNS: return hg_launch_pad_columns(c, cmd);
    case CMD_HAND_OFF_ROWS: return hg_launch_hand_off_rows(c, cmd);
    case CMD_ATTN_MERGE_ROWS: return hg_launch_attn_merge_rows(c, cmd);
    case CMD_RESCORE_ROWS: return hg_launch_rescore_rows(c, cmd);
    case CMD_SEND_ROWS: return hg_launch_send_rows(c, cmd);
    case CMD_KEEP_ROWS: return hg_launch_keep_rows(c, cmd);
    case CMD_EVENT: return hg_launch_event(c, cmd);
    case CMD_INDEX_RANK: return hg_launch_index_rank(c, cmd, dynBase);
    case CMD_INDEX_RANK_ROWS: return hg_launch_index_rank_rows(c, cmd);
    case CMD_SIDE: return hg_launch_side(c, cmd);
    case CMD_CUBLAS: return hg_launch_cublas(c, cmd);
    case CMD_SPAN_ATTN: return hg_launch_span_attn(c, cmd);
    case CMD_ATTN_MERGE: return hg_launch_attn_merge(c, cmd, dynBase);
    case CMD_SPAN_ATTN_ROWS: return hg_launch_span_attn_rows(c, cmd);
    case CMD_APPEND_ROWS: return hg_launch_window_append_rows(c, cmd);
    case CMD_MEMSET: return (int)cudaMemsetAsync((void *)cmd.p[0], 0, (size_t)cmd.s[0] * (size_t)cmd.s[1], c->compute);
    default: return hg_launch_rowop(c, cmd, dynBase);
  }
}

static int upload_blob(HgCtx *c) {
  if (c->blobUsed) {
    cudaError_t e = cudaMemcpyAsync(c->blobDev, c->blobHost[c->blobCur], c->blobUsed, cudaMemcpyHostToDevice, c->compute);
    if (e != cudaSuccess) return (int)e;
  }
  return (int)cudaEventRecord(c->blobDone[c->blobCur], c->compute);
}

static int run_all(HgCtx *c) {
  for (int i = 0; i < c->ncmds; i++) {
    int r = hg_run_cmd(c, c->cmds[i], c->blobDev);
    if (r) return r;
  }
  return 0;
}

int hg_drain_at(HgCtx *c, const char *who) {
  if (c->stepMode != STEP_RECORDING) return 0;
  snprintf(c->lastDrain, sizeof c->lastDrain, "%s", who);
  c->stepMode = STEP_EAGER;  // first: the flush below must launch, not record
  c->stepDrained = 1;
  c->nDrains++;
  // Queued copies were recorded before the op that drains: they run after the commands.
  int r = upload_blob(c);
  if (!r) r = run_all(c);
  c->ncmds = 0;
  return r;
}

int hg_submit(HgCtx *c, const Cmd &cmd) {
  if (c->stepMode != STEP_RECORDING) return hg_run_cmd(c, cmd, NULL);
  if (c->ncmds == c->capCmds) {
    const int cap = c->capCmds ? 2 * c->capCmds : 1024;
    Cmd *grown = (Cmd *)realloc(c->cmds, (size_t)cap * sizeof(Cmd));
    if (!grown) {
      int r = hg_drain(c);
      return r ? r : hg_run_cmd(c, cmd, NULL);
    }
    c->cmds = grown;
    c->capCmds = cap;
  }
  c->cmds[c->ncmds++] = cmd;
  c->nRecorded++;
  return 0;
}

static void drop_graph(StepGraph &g) {
  if (g.exec) cudaGraphExecDestroy(g.exec);
  free(g.sig);
  g.exec = NULL;
  g.sig = NULL;
  g.n = 0;
}

static bool matches(const StepGraph &g, const Cmd *cmds, int n) {
  if (!g.exec || g.n != n) return false;
  for (int i = 0; i < n; i++)
    if (memcmp(&g.sig[i], &cmds[i], HG_CMD_SIG_BYTES) != 0) return false;
  return true;
}

// Captures the recorded commands into a graph (replacing the key's old one). On failure the
// commands have not run; the caller runs them eagerly.
static int capture(HgCtx *c, StepGraph &g) {
  drop_graph(g);
  cudaError_t e = cudaStreamBeginCapture(c->compute, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) return (int)e;
  int r = run_all(c);
  cudaGraph_t graph = NULL;
  e = cudaStreamEndCapture(c->compute, &graph);
  if (!r) r = (int)e;
  if (!r) r = (int)cudaGraphInstantiate(&g.exec, graph, 0);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // a failed capture leaves its error as the last one
  if (r) {
    g.exec = NULL;
    return r;
  }
  g.sig = (Cmd *)malloc((size_t)c->ncmds * sizeof(Cmd));
  if (!g.sig) { drop_graph(g); return (int)cudaErrorMemoryAllocation; }
  memcpy(g.sig, c->cmds, (size_t)c->ncmds * sizeof(Cmd));
  g.n = c->ncmds;
  return 0;
}

extern "C" {

// Starts a decode step under `key` (0 ≤ key < HG_MAX_GRAPH_KEYS).
HG_EXPORT int hg_cu_step_begin(HgCtx *c, int key) {
  if (key < 0 || key >= HG_MAX_GRAPH_KEYS) return (int)cudaErrorInvalidValue;
  HG_FLUSH(c);
  c->stepKey = key;
  c->stepDrained = 0;
  c->ncmds = 0;
  c->blobUsed = 0;
  if (c->skipSteps[key] > 0) {
    c->skipSteps[key]--;
    c->stepMode = STEP_EAGER;
    c->nEagerSteps++;
    return 0;
  }
  c->blobCur ^= 1;
  // The buffer's previous upload (two steps ago) must have run before it is rewritten: the host waits for the device here.
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  cudaError_t e = cudaEventSynchronize(c->blobDone[c->blobCur]);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  c->hostWaitNs += (long long)(t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
  if (e != cudaSuccess) return (int)e;
  c->stepMode = STEP_RECORDING;
  return 0;
}

// Ends the step: replays the key's graph, or captures a new one and launches it.
HG_EXPORT int hg_cu_step_end(HgCtx *c) {
  if (c->stepMode != STEP_RECORDING) {
    if (c->stepMode == STEP_EAGER && c->stepDrained) c->skipSteps[c->stepKey] = SKIP_AFTER_DRAIN;
    c->stepMode = STEP_NONE;
    return hg_flush_copies(c);
  }
  int r = hg_flush_copies(c);  // recorded: the step's last queued copies
  c->stepMode = STEP_NONE;
  if (r) return r;
  if (c->ncmds == 0) return 0;
  if ((r = upload_blob(c))) return r;
  StepGraph &g = c->graphs[c->stepKey];
  if (matches(g, c->cmds, c->ncmds)) {
    c->nReplays++;
  } else if ((r = capture(c, g))) {
    c->lastCaptureError = r;
    // Could not capture (an unsupported launch): run the step eagerly and stop trying for a while.
    c->skipSteps[c->stepKey] = SKIP_AFTER_DRAIN;
    r = run_all(c);
    c->ncmds = 0;
    return r;
  } else {
    c->nCaptures++;
  }
  c->ncmds = 0;
  const bool timed = c->nSeg < HG_SEG_TIMES;
  if (timed && (r = (int)cudaEventRecord(c->segEv[2 * c->nSeg], c->compute))) return r;
  if ((r = (int)cudaGraphLaunch(g.exec, c->compute))) return r;
  if (timed && (r = (int)cudaEventRecord(c->segEv[2 * c->nSeg + 1], c->compute))) return r;
  if (timed) c->nSeg++;
  return 0;
}


// counts[0..4] = graphs captured, replayed, steps drained, steps run eagerly, commands recorded.
// A profiler's capture range (ncu/nsys --profile-from-start off): what runs between on and off.
HG_EXPORT int hg_cu_profiler(HgCtx *c, int on) {
  HG_FLUSH(c);
  return (int)(on ? cudaProfilerStart() : cudaProfilerStop());
}

HG_EXPORT void hg_cu_step_stats(HgCtx *c, double *counts) {
  counts[0] = (double)c->nCaptures;
  counts[1] = (double)c->nReplays;
  counts[2] = (double)c->nDrains;
  counts[3] = (double)c->nEagerSteps;
  counts[4] = (double)c->nRecorded;
}

// The entry point that last drained a step, and the last capture error ("name:code").
HG_EXPORT void hg_cu_step_info(HgCtx *c, char *buf, int len) {
  if (buf && len > 0) snprintf(buf, (size_t)len, "%s:%d", c->lastDrain, c->lastCaptureError);
}

// Forgets one slot's graph and skip counter (the TypeScript side hands the slot to another key).
HG_EXPORT void hg_cu_step_forget(HgCtx *c, int key) {
  if (key < 0 || key >= HG_MAX_GRAPH_KEYS) return;
  drop_graph(c->graphs[key]);
  c->skipSteps[key] = 0;
}

// Forgets every captured graph (the next step of each key captures again).
HG_EXPORT void hg_cu_step_reset(HgCtx *c) {
  for (int k = 0; k < HG_MAX_GRAPH_KEYS; k++) {
    drop_graph(c->graphs[k]);
    c->skipSteps[k] = 0;
  }
}

// Plan the decode kernels (hg_decode_plan) as for a device of compute capability `major`, from 1
// up to this device's own: checks and benches run another device's kernels here (the one-warp
// GEMV on an H200). Returns the previous value, or -1 when refused. Captured graphs hold the
// old launches, so they are dropped.
HG_EXPORT int hg_cu_set_plan_major(HgCtx *c, int major) {
  int own = 0;
  if (cudaDeviceGetAttribute(&own, cudaDevAttrComputeCapabilityMajor, c->device) != cudaSuccess || major < 1 || major > own) return -1;
  const int old = c->planMajor;
  c->planMajor = major;
  if (major != old) hg_cu_step_reset(c);
  return old;
}

HG_EXPORT int hg_cu_get_plan_major(HgCtx *c) { return c->planMajor; }

}  // extern "C"

// The device's ms inside the recorded segments launched since the last call, and the host's ms
// blocked in hg_cu_step_begin; both restart. The stream must have run them (hg_link_times syncs first).
void hg_seg_times(HgCtx *c, double *segMs, double *hostWaitMs) {
  double sum = 0;
  for (int i = 0; i < c->nSeg; i++) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, c->segEv[2 * i], c->segEv[2 * i + 1]) == cudaSuccess) sum += ms;
  }
  cudaGetLastError();  // a pair not yet recorded is no error of the step
  *segMs = sum;
  *hostWaitMs = (double)c->hostWaitNs / 1e6;
  c->nSeg = 0;
  c->hostWaitNs = 0;
}

int hg_graph_init(HgCtx *c) {
  cudaDeviceGetAttribute(&c->planMajor, cudaDevAttrComputeCapabilityMajor, c->device);
  for (int i = 0; i < 2; i++) {
    cudaError_t e = cudaMallocHost((void **)&c->blobHost[i], HG_BLOB_BYTES);
    if (e != cudaSuccess) return (int)e;
    if ((e = cudaEventCreateWithFlags(&c->blobDone[i], cudaEventDisableTiming)) != cudaSuccess) return (int)e;
  }
  for (int i = 0; i < 2 * HG_SEG_TIMES; i++) {
    cudaError_t e = cudaEventCreate(&c->segEv[i]);
    if (e != cudaSuccess) return (int)e;
  }
  return 0;
}

void hg_graph_free(HgCtx *c) {
  hg_cu_step_reset(c);
  for (int i = 0; i < 2; i++) {
    if (c->blobHost[i]) cudaFreeHost(c->blobHost[i]);
    if (c->blobDone[i]) cudaEventDestroy(c->blobDone[i]);
    c->blobHost[i] = NULL;
    c->blobDone[i] = NULL;
  }
  for (int i = 0; i < 2 * HG_SEG_TIMES; i++) {
    if (c->segEv[i]) cudaEventDestroy(c->segEv[i]);
    c->segEv[i] = NULL;
  }
  c->nSeg = 0;
  free(c->cmds);
  c->cmds = NULL;
  c->capCmds = c->ncmds = 0;
}
