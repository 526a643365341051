// The host link's state (host_copy.cu), shared with the rows fetched ahead (row_fetch.cu).
#pragma once
#include "common.cuh"

static const int HG_LINK_POOL = 2048;  // timeline events a step may record (more are not timed)

// The link's mapped host memory (one allocation), a 64-byte line each for what different
// parties write: the device (send), a CPU stage thread (stage), the device's waits (the rest).
struct HgLinkWords {
  alignas(64) unsigned send;   // hg_link_send_signalled's word
  alignas(64) unsigned stage;  // hg_link_stage_signal's word: the CPU stage raises it
  alignas(64) unsigned gaveUp; // a wait timed out (later waits return at once); hg_link_gave_up clears it
  unsigned gaveUpValue, gaveUpHeld;  // the value that wait wanted, what the word held
  unsigned long long timeoutNs;
  alignas(64) unsigned long long waitedNs;  // time the compute stream's waits took since hg_link_times last read it
};

// The device's clock (ns) for the link's waits.
__device__ __forceinline__ unsigned long long link_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Spins until the word reaches v (mod 2^32); past `limit` ns from t0 it records the give-up, and once
// one has (any thread's), it returns at once.
__device__ __forceinline__ void link_await_word(volatile unsigned *word, unsigned v, volatile HgLinkWords *w, unsigned long long t0, unsigned long long limit) {
  unsigned held = *word;
  while ((int)(held - v) < 0) {
    if (w->gaveUp) break;
    if (link_ns() - t0 >= limit) {
      w->gaveUpValue = v;
      w->gaveUpHeld = held;
      __threadfence_system();
      w->gaveUp = 1;
      break;
    }
    __nanosleep(128);
    held = *word;
  }
}

struct HgLink {
  HgCtx *c;
  cudaEvent_t order[3];  // untimed: compute marks for double buffering (2), copy done (1)
  int prev;              // which order[] holds the compute mark of the previous H2D, -1 none
  cudaEvent_t ev[HG_LINK_POOL];
  int kind[HG_LINK_POOL];
  int n;
  int open;  // between a resume and a pause mark: compute stalls count against T_gpu
  int rowwise;     // 2-D copies the driver refused and that ran row by row instead
  char why[256];   // the call that failed, with its arguments (hg_link_error)
  volatile HgLinkWords *words;  // mapped pinned host memory (NULL: the device cannot map it)
  HgLinkWords *wordsDev;        // its device address
  unsigned signals;             // the last value hg_link_send_signalled handed out
  unsigned stageSignals;        // the last value hg_link_stage_signal handed out
  cudaStream_t ahead;           // rows fetched ahead (row_fetch.cu): made by the first hg_fetch_create
};

// The device waits on stream s until the word reaches value (host_copy.cu's await kernel), its
// time not counted in waitedNs (a side stream's wait is not the compute stream's).
int hg_await_on(HgLink *l, cudaStream_t s, const void *word, int value);
// The hybrid step's row gather (host_gather.cu) on stream s; table = [counts | ids], read when it runs.
int hg_gather_rows_on(HgCtx *c, cudaStream_t s, void *dst, const void *src, const int *table, int groups, int kmax, long long cap, int pieces);
