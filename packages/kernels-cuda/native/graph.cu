// Decode-step graphs: record a step's launches as commands, replay a cached CUDA graph when the
// commands match the ones it was captured from, capture a new one when they do not. A decode
// step of an 8B model is ~420 launches of a few µs of host time each; one graph launch
// replaces them. The per-step values live in a device blob the kernels read (see common.cuh).
#include "common.cuh"
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

// A key whose step had to drain runs its next steps eagerly without recording (a step that
// reads or writes host memory mid-way, e.g. hybrid attention, would drain every time).
static const int SKIP_AFTER_DRAIN = 32;

long hg_blob_put(HgCtx *c, const void *data, size_t bytes) {
  const size_t off = (c->blobUsed + 15) & ~(size_t)15;
  if (off + bytes > HG_BLOB_BYTES) return -1;
  memcpy(c->blobHost[c->blobCur] + off, data, bytes);
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
  // The buffer's previous upload (two steps ago) must have run before it is rewritten.
  cudaError_t e = cudaEventSynchronize(c->blobDone[c->blobCur]);
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
  return (int)cudaGraphLaunch(g.exec, c->compute);
}

// counts[0..4] = graphs captured, replayed, steps drained, steps run eagerly, commands recorded.
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

// Decode tuning switches (benches compare them): 1 the split-K attention's token rows per lane
// and round (2 or 4), 8 the decode GEMV as a bulk-copy weight stream: its ring in KB (0
// off, 64, 128, 192; refused (stays 0) below sm_90), 9 decode attention as one clustered launch,
// the step's K/V append and RoPE folded in (0/1; on a GPU without clusters the split-K kernels
// still run). Codes 0 (programmatic launch), 4 and 5 (the k-split GEMV) and 7 (RoPE folded into
// it) are gone: every H200 run measured them slower (DEVICE-NOTES.md, sixth pass, pruning), and
// so are 2 (the split kernel's last block merges), 3 (the chunks' minimum length) and 6 (K/V by
// cp.async into shared-memory stages): slower in the fifth pass (sixth pass, decode attention);
// 10 (the qkv weight stream prefetching o_proj's weights into L2) and 11 (the split-K attention
// with a lane a token): no gain on the H200 (seventh pass); 12 (RoPE and the K/V append folded
// into the split-K attention): slower, its dependent loads of the position and the angle rows
// sat on every block's critical path (seventh pass); 13 the split-K attention's two kernels
// launched programmatically (0 off, 1, 2: a recorded step's RoPE and K/V append kernels too); 14
// the split-K attention folds a round's 4 token rows into its softmax together (0/1; with
// attnUnroll 4). 15 (the last split block merging: code 2 again, with the parallel merge) was
// written without a GPU and removed unmeasured (it repeated code 2's tickets and the merge).
// 16 (a recorded layer's four stream GEMVs as one launch with grid barriers), 17 (x staged a pass
// of loads at a time), 18 (SiLU·up slots of one 8 KB copy), 20 (L2 prefetch one ring ahead) and 21
// (the split-K attention a block an SM, the kernels after it launched at its start) are gone:
// slower or no gain on the H200 (ninth pass, call 1). 19: the stream GEMV's slot size in KB (8 or
// 16; 0, the default, chooses per GEMV). 22 (the stream GEMV's rows handed out at run time from a
// counter: slower in two forms, ninth pass calls 5 and 7) and 23 (x staged with loads in flight
// and the norm weights before the wait: a gain, now always on) are gone. 24 (the split-K
// attention's first round read before its wait, the append folded in) and 25 (its merge in one
// pass) were no gain or slower (tenth pass, call 1) and are gone. 26: the stream GEMV's norm scale
// applied to the dot products instead of to x in shared memory (0/1, on). 27 (the split-K
// attention prefetching the next stream GEMV's weights into L2) and 28 (the stream GEMV's second
// ring prefetched into L2 while the first waits) are gone: no gain and slower (tenth pass, call 2),
// and so is 29 (the stream GEMV's last rows handed out at run time: balanced, no faster; call 4).
// 30: 7 KB slots, as many as shared memory holds, for plain rows longer than 16 KB that are a
// multiple of 7 KB (8B's down) — tenth pass. 31: the split-K attention on tensor cores (0 the FMA
// block, 1, 2 twice the splits, 3 a tile loaded ahead, 4 that in one wave of blocks, 5 3's grid with
// 4's chunks: the default since the twelfth pass); 32: a recorded step's K/V append inside its RoPE
// kernel (0/1, on) — eleventh pass. 33 (the merge's loads in flight: no gain) and 34 (the
// tensor-core split kernel's last block merging, no merge kernel: 21.3 vs 8.2 µs a layer at 2K)
// are gone (eleventh pass, calls 2–3); so are attnMma 6–8 (one block an SM, or the kernel
// without the tile ahead, leaving room for o_proj's stream: no gain) and 35 (RoPE and the K/V
// append inside the qkv stream GEMV: 0.05–0.10 ms slower) — twelfth pass. 36: the argmax kernel's
// rows as float4s, 8 loads in flight a thread (0/1, on) — twelfth pass. 37: one long row's argmax
// over many blocks and one warp (0/1); 38: the greedy feed's copy to the host on a side stream
// (0/1) — thirteenth pass.
// Returns the switch's previous value, or -1 for an unknown switch or value. Captured
// graphs hold the old launches, so they are dropped.

static int *decode_option(HgCtx *c, int which) {
  switch (which) {
    case 1: return &c->attnUnroll;
    case 8: return &c->gemvStream;
    case 9: return &c->attnCluster;
    case 13: return &c->attnPdl;
    case 14: return &c->attnGroup;
    case 19: return &c->gemvSlotKb;
    case 26: return &c->gemvNormFold;
    case 30: return &c->gemvFillRing;
    case 31: return &c->attnMma;
    case 32: return &c->ropeAppend;
    case 36: return &c->argmaxVec;
    case 37: return &c->argmaxSplit;
    case 38: return &c->feedSide;
    case 41: return &c->gemvGrid;
    default: return NULL;
  }
}

static bool decode_option_ok(int which, int v) {
  switch (which) {
    case 9: case 14: case 26: case 30: case 32: case 36: case 37: case 38: case 41: return v == 0 || v == 1;
    case 13: return v == 0 || v == 1 || v == 2;
    case 31: return v >= 0 && v <= 5;
    case 19: return v == 0 || v == 8 || v == 16;
    case 1: return v == 2 || v == 4;
    case 8: return v == 0 || v == 64 || v == 128 || v == 192;
    default: return false;
  }
}

HG_EXPORT int hg_cu_set_decode_option(HgCtx *c, int which, int value) {
  int *slot = decode_option(c, which);
  if (!slot || !decode_option_ok(which, value)) return -1;
  const int old = *slot;
  if (which == 8 && value) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device) != cudaSuccess || major < 9) value = 0;
  }
  *slot = value;
  if (*slot != old) hg_cu_step_reset(c);
  return old;
}

// A switch's value (-1 unknown).
HG_EXPORT int hg_cu_get_decode_option(HgCtx *c, int which) {
  const int *slot = decode_option(c, which);
  return slot ? *slot : -1;
}

}  // extern "C"

int hg_graph_init(HgCtx *c) {
  c->attnUnroll = 4;  // 4 rows a round: 32K 6.61 vs 6.92 ms a step, 8K 5.40 vs 5.43, 2K 4.72 vs 4.70 (sixth pass, final call)
  // The weight stream on sm_90+ (needs cp.async.bulk): 4.71 vs 4.89 ms a step (8B, 2K, fed; sixth pass).
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, c->device);
  c->gemvStream = major >= 9 ? 128 : 0;
  c->attnCluster = 0;        // the split-K kernels + merge until the clustered kernel is measured
  // The attention's kernels, and a recorded step's RoPE and K/V append before them, launched
  // programmatically: RoPE + append + attention 13.9 vs 14.8 (attention kernels only) vs 15.4 µs
  // (plain) a layer at 2K, 8B decode 4.54–4.58 vs 4.58 vs 4.63 ms; same bits (seventh pass, calls 9, 11).
  c->attnPdl = 2;
  // A round's 4 token rows folded into the softmax together: 8B decode 4.53 vs 4.57 / 4.99 vs 5.09 /
  // 5.87 vs 6.07 ms at 2K / 8K / 32K (eighth pass, call 1; call 2: 4.79 vs 4.87 / 5.30 vs 5.31 / 6.15
  // vs 6.35 on a slower machine); attention in a graph 11.0 vs 11.5 µs a layer at 2K, 50.9 vs 55.6 at 32K.
  c->attnGroup = 1;
  // Slots of 16 KB where a row fills them (SiLU·up, down), 8 KB elsewhere: 8B decode 4.52 vs 4.94 /
  // 4.93 vs 5.40 / 5.87 vs 6.22 ms at 2K / 8K / 32K with 16 KB everywhere against 8 KB everywhere
  // (ninth pass, call 1), where 16 KB lost at qkv and o_proj (14.9 vs 13.8, 10.5 vs 10.0 µs).
  c->gemvSlotKb = 0;
  // The norm's scale on the dot products, x·nw staged in one pass: 8B decode 4.39 vs 4.41 / 4.82–4.83
  // vs 4.82–4.85 / 5.69–5.73 vs 5.74–5.76 ms at 2K / 8K / 32K over two calls, a layer's GEMVs 113.0–113.3
  // vs 113.4–113.7 µs in a graph (tenth pass, calls 1–2); −0.02 / +0.02 ms at 2K in calls 3 and 6:
  // a few hundredths at most, inside the machines' noise. Rounding-level differences only.
  c->gemvNormFold = 1;
  // 7 KB slots, three a warp, for 8B's down (28 KB rows): down 30.6 vs 32.4 µs in a graph, a layer's
  // GEMVs 109.8 vs 111.6, 8B decode 4.28 vs 4.33 / 4.75 vs 4.77 / 5.66 vs 5.65 ms (tenth pass, call 5); same bits.
  c->gemvFillRing = 1;
  // The split-K attention on tensor cores: attention in a graph 8.2 vs 10.4 / 18.0 vs 22.5 / 47.3 vs
  // 50.9 µs a layer at 2K / 8K / 32K, 8B decode 4.20 vs 4.26 / 4.58 vs 4.75 / 5.66 vs 5.62 ms
  // (eleventh pass, call 1); twice the splits (2): 8.2 / 20.3 / 48.9 µs, 4.21 / 4.68 / 5.62 ms. A
  // tile loaded ahead (3): 8.1 / 17.8 / 43.6 vs 8.4 / 18.1 / 47.5 µs, 4.25 / 4.65 / 5.52 vs 4.27 /
  // 4.65 / 5.74 ms, the FMA block 4.29 / 4.83 / 5.71 (call 4). That with half the splits (4, one
  // wave of its 2-a-SM blocks): 8.2 / 14.7 / 38.8 vs 8.2 / 17.8 / 43.7 µs, 4.28 / 4.52 / 5.35 vs 4.23 /
  // 4.64 / 5.51 ms (call 6; at 2K both run the same 32 chunks of 64 tokens).
  // 3's grid (4 blocks' worth an SM, recorded for the capacity) with 4's chunks (5): the same live
  // blocks as 3 at 2K, as 4 from 8K (twelfth pass; DEVICE-NOTES.md).
  c->attnMma = 5;
  // The K/V append inside the RoPE kernel: RoPE + append + attention in a graph 10.3 vs 10.5 / 20.2
  // vs 20.6 / 49.7 vs 50.2 µs a layer at 2K / 8K / 32K, 8B decode 4.26 vs 4.29 / 4.65 vs 4.63 / 5.71 vs
  // 5.73 ms (eleventh pass, call 3); same bits, one kernel a layer less.
  c->ropeAppend = 1;
  // The greedy pick between two steps (outside their graphs) with 8 float4 loads in flight a thread
  // instead of one float: 8B decode 4.26 / 4.48 / 5.30 vs 4.26 / 4.52 / 5.34 ms (twelfth pass, call 6).
  c->argmaxVec = 1;
  // The greedy pick over all SMs, then one warp, and its 4-byte copy to the host on a side stream:
  // 8B decode 4.127 / 4.136 / 4.138 vs 4.146 / 4.143 / 4.146 ms at 2K in one run, alternating
  // (thirteenth pass; the pick between steps 16 -> 7 µs).
  c->argmaxSplit = 1;
  c->feedSide = 1;
  // Stream GEMV grids that split the rows evenly (8B: 128 blocks on 132 SMs): 8B decode 4.167–4.173
  // vs 4.212–4.216 ms at 2K, 4.399 vs 4.439 at 8K, 5.273 vs 5.311 at 32K (thirteenth pass, call 10).
  c->gemvGrid = 1;
  for (int i = 0; i < 2; i++) {
    cudaError_t e = cudaMallocHost((void **)&c->blobHost[i], HG_BLOB_BYTES);
    if (e != cudaSuccess) return (int)e;
    if ((e = cudaEventCreateWithFlags(&c->blobDone[i], cudaEventDisableTiming)) != cudaSuccess) return (int)e;
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
  free(c->cmds);
  c->cmds = NULL;
  c->capCmds = c->ncmds = 0;
}
