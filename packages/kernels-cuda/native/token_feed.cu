// Greedy decode fed on the device (Backend.argmaxToFeed / embeddingFromFeed / feedResult): the
// step's argmax lands in a device int, the feed, which the next step's embedding reads when it
// runs; the pick is also copied to pinned host memory (two slots, each with an event) without
// waiting. So the host records and launches step t + 1 while the device still runs step t, and
// reads token t afterwards: the device does not sit idle while the host records a step.
#include "common.cuh"

Cmd hg_new_cmd(int kind);

// The feed: in the context's misc area, past the argmax result. Host slots: argmaxHost[4 + slot].
static int *feed(HgCtx *c) { return c->argmaxOut + 8; }

void hg_feed_free(HgCtx *c) {
  for (int i = 0; i < 2; i++) {
    if (c->feedDone[i]) cudaEventDestroy(c->feedDone[i]);
    c->feedDone[i] = NULL;
  }
  if (c->feedPicked) cudaEventDestroy(c->feedPicked);
  if (c->feedStream) {
    cudaStreamSynchronize(c->feedStream);  // its copy writes pinned memory freed after this
    cudaStreamDestroy(c->feedStream);
  }
  c->feedPicked = NULL;
  c->feedStream = NULL;
}

// The pick's 4-byte copy to the host slot on a stream of its own, after an event on
// the compute stream, so the next step's blob upload and graph need not wait behind a device-to-
// host copy. The host slot is only read after feedDone, which now follows that copy.
static cudaError_t copy_pick_aside(HgCtx *c, int slot, int *dev) {
  cudaError_t e = cudaSuccess;
  if (!c->feedStream && (e = cudaStreamCreateWithFlags(&c->feedStream, cudaStreamNonBlocking)) != cudaSuccess) return e;
  if (!c->feedPicked && (e = cudaEventCreateWithFlags(&c->feedPicked, cudaEventDisableTiming)) != cudaSuccess) return e;
  if ((e = cudaEventRecord(c->feedPicked, c->compute)) != cudaSuccess) return e;
  if ((e = cudaStreamWaitEvent(c->feedStream, c->feedPicked, 0)) != cudaSuccess) return e;
  if ((e = cudaMemcpyAsync(c->argmaxHost + 4 + slot, dev, sizeof(int), cudaMemcpyDeviceToHost, c->feedStream)) != cudaSuccess) return e;
  return cudaEventRecord(c->feedDone[slot], c->feedStream);
}

extern "C" {

// The argmax of x[0, n) into the feed, then (not waited for) into host slot `slot` (0 or 1).
HG_EXPORT int hg_cu_argmax_feed(HgCtx *c, const float *x, int n, int slot) {
  if (slot < 0 || slot > 1 || n <= 0) return (int)cudaErrorInvalidValue;
  HG_FLUSH(c);  // a step being recorded runs first
  if (!c->feedDone[slot]) {
    cudaError_t e = cudaEventCreateWithFlags(&c->feedDone[slot], cudaEventDisableTiming);
    if (e != cudaSuccess) return (int)e;
  }
  // The other slot's copy may still read the feed; the pick must not overwrite it first.
  if (c->feedDone[slot ^ 1]) {
    cudaError_t e = cudaStreamWaitEvent(c->compute, c->feedDone[slot ^ 1], 0);
    if (e != cudaSuccess) return (int)e;
  }
  int r = hg_launch_argmax(c, x, 1, n, feed(c));
  if (r) return r;
  return (int)copy_pick_aside(c, slot, feed(c));
}

// Waits for slot `slot`'s pick; *out = the token.
HG_EXPORT int hg_cu_feed_result(HgCtx *c, int slot, int *out) {
  if (slot < 0 || slot > 1 || !c->feedDone[slot]) return (int)cudaErrorInvalidValue;
  cudaError_t e = cudaEventSynchronize(c->feedDone[slot]);
  if (e != cudaSuccess) return (int)e;
  *out = c->argmaxHost[4 + slot];
  return 0;
}

// out[0, :dim] = table[feed] (the embedding op with the id read on the device; recordable).
HG_EXPORT int hg_cu_embedding_feed(HgCtx *c, float *out, const void *table, int dt, int dim) {
  HG_FLUSH_REC(c);
  Cmd m = hg_new_cmd(CMD_EMBED);
  m.p[0] = out; m.p[1] = table; m.p[2] = feed(c);
  m.s[0] = dt; m.s[1] = dim; m.s[2] = 1;
  return hg_submit(c, m);
}

}  // extern "C"
