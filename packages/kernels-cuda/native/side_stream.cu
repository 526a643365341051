// A second stream for work the compute stream does not wait for at once (Backend.beginSide /
// endSide / joinSide): a layer's page ranking made a layer ahead on q̃, and its signalled send to
// the CPU stage, run beside the layer before's projections and window attention instead of in line
// with them. Recordable: the fork and the join are events inside the step, so a captured graph holds
// both streams' work (the join must come before the recorded step ends: capture refuses an unjoined stream).
#include "common.cuh"

Cmd hg_new_cmd(int kind);  // rowops.cu

enum { SIDE_BEGIN = 0, SIDE_END = 1, SIDE_JOIN = 2 };

// CMD_SIDE: s[0] SIDE_BEGIN (the side stream waits for the compute stream's work so far; kernels
// launched through hg_stream go to it), SIDE_END (back to the compute stream; the side's work so far
// recorded), SIDE_JOIN (the compute stream waits for that work, when any was recorded since the last join).
int hg_launch_side(HgCtx *c, const Cmd &m) {
  cudaError_t e = cudaSuccess;
  if (m.s[0] == SIDE_BEGIN) {
    e = cudaEventRecord(c->sideFork, c->compute);
    if (!e) e = cudaStreamWaitEvent(c->side, c->sideFork, 0);
    if (!e) c->onSide = 1;
  } else if (m.s[0] == SIDE_END) {
    c->onSide = 0;
    e = cudaEventRecord(c->sideDone, c->side);
    if (!e) c->sideOpen = 1;
  } else if (c->sideOpen) {
    e = cudaStreamWaitEvent(c->compute, c->sideDone, 0);
    if (!e) c->sideOpen = 0;
  }
  return (int)e;
}

void hg_side_free(HgCtx *c) {
  if (!c->side) return;
  cudaStreamSynchronize(c->side);
  cudaEventDestroy(c->sideFork);
  cudaEventDestroy(c->sideDone);
  cudaStreamDestroy(c->side);
  c->side = NULL;
}

extern "C" {

// Queues (or records) a side-stream op: 0 begin, 1 end, 2 join (see CMD_SIDE). The stream and its
// events are made at the first call, outside any capture.
HG_EXPORT int hg_cu_side(HgCtx *c, int op) {
  if (op < SIDE_BEGIN || op > SIDE_JOIN) return (int)cudaErrorInvalidValue;
  if (!c->side) {
    cudaError_t e = cudaStreamCreateWithFlags(&c->side, cudaStreamNonBlocking);
    if (!e) e = cudaEventCreateWithFlags(&c->sideFork, cudaEventDisableTiming);
    if (!e) e = cudaEventCreateWithFlags(&c->sideDone, cudaEventDisableTiming);
    if (e) {
      if (c->sideFork) cudaEventDestroy(c->sideFork);
      if (c->side) cudaStreamDestroy(c->side);
      c->side = NULL;
      c->sideFork = NULL;
      return (int)e;
    }
  }
  HG_FLUSH_REC(c);
  Cmd m = hg_new_cmd(CMD_SIDE);
  m.s[0] = op;
  return hg_submit(c, m);
}

}  // extern "C"
