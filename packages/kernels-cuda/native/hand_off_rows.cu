// The hand-offs of a batched step's rows as one op (hg_link_hand_off_rows): the device waits until
// every row's stage has raised its done word, then one launch copies every row's logits and
// gathers every row's K and V rows from mapped host memory. A layer of B rows is two kernels
// instead of B waits, B copies and B–2B gathers. The rows' words, values and addresses go with the
// step's blob when recording, so a replay takes the new values (and new widths) without a capture.
#include "common.cuh"
#include "host_link.cuh"
#include "gather_rows.cuh"
#include <stdlib.h>
#include <string.h>

struct HoWait {
  unsigned long long word;  // device address of the 32-bit word
  unsigned value, pad[3];
};
struct HoGather {  // gather_rows_kernel's arguments
  unsigned long long dst, src, table;
  long long cap;
  int groups, kmax, pieces, pad;
};
struct HoRead {  // a 2-D copy of 4-byte pieces (the stage's logits)
  unsigned long long dst, src;
  int pieces, rows, dstPitch, srcPitch;
};

// Every row's word reaches its value (mod 2^32), a thread a row, as hg_link_await_signal's kernel
// does it for one: past the link's timeout a wait records the give-up and returns, later ones at
// once. The time until the last row is ready counts as the compute stream's wait.
__global__ void await_rows_kernel(const HoWait *__restrict__ waits, int n, volatile HgLinkWords *w) {
  __shared__ unsigned long long t0;
  if (threadIdx.x == 0) t0 = link_ns();
  __syncthreads();
  const unsigned long long limit = w->timeoutNs;
  for (int i = threadIdx.x; i < n; i += blockDim.x) link_await_word((volatile unsigned *)waits[i].word, waits[i].value, w, t0, limit);
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) w->waitedNs = w->waitedNs + (link_ns() - t0);
}

// blockIdx.y < nGathers: that gather (as gather_rows_kernel: table = [counts | ids], zero rows past
// a count or for an id outside the store), over blockIdx.x's chunks; else read y − nGathers.
__global__ void __launch_bounds__(GATHER_THREADS) hand_off_copies_kernel(const HoGather *__restrict__ gathers, int nGathers, const HoRead *__restrict__ reads) {
  __shared__ long long rowAt[GATHER_CHUNK];
  if ((int)blockIdx.y >= nGathers) {
    const HoRead r = reads[blockIdx.y - nGathers];
    const long long total = (long long)r.rows * r.pieces;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
      const long long row = i / r.pieces;
      const int p = (int)(i - row * r.pieces);
      ((unsigned *)(r.dst + row * r.dstPitch))[p] = ((const unsigned *)(r.src + row * r.srcPitch))[p];
    }
    return;
  }
  const HoGather g = gathers[blockIdx.y];
  gather_rows_chunks((uint4 *)g.dst, (const uint4 *)g.src, (const int32_t *)g.table, g.groups, g.kmax, g.cap, g.pieces, rowAt);
}

// A batched step's verified logits (hg_link_rescore_rows): row r's scores [heads, width] from its
// column get scale · q·k over its gathered K rows [kvHeads, cap, headDim], −∞ past each KV head's
// count in its mapped [counts | ids] table — what attnLogits then padColumnsAt write, a warp a token
// summing as attn_logits_kernel does, so the same bits.
struct HoRescore {
  unsigned long long scores, q, keys, table;  // scores at the row's first column; table mapped
  int width, cap, kmax, pad;
  float scale, pad2[3];
};

constexpr int RS_WARPS = 8, RS_TOKENS = 8;

template <int KT>
__global__ void __launch_bounds__(256) rescore_rows_kernel(const HoRescore *__restrict__ rows, int group, int headDim) {
  const HoRescore r = rows[blockIdx.z];
  const int g = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n = min(max(((const volatile int *)r.table)[g], 0), r.kmax);
  float *logits = (float *)r.scores;
  const float *q = (const float *)r.q;
  for (int j0 = blockIdx.x * RS_WARPS * RS_TOKENS; j0 < r.kmax; j0 += gridDim.x * RS_WARPS * RS_TOKENS)
    for (int t = 0; t < RS_TOKENS; t++) {
      const int j = j0 + t * RS_WARPS + warp;
      if (j >= r.kmax) break;
      const size_t kBase = ((size_t)g * r.cap + j) * headDim;
      for (int hh = 0; hh < group; hh++) {
        const int h = g * group + hh;
        if (j >= n) {
          if (lane == 0) logits[(size_t)h * r.width + j] = -INFINITY;
          continue;
        }
        const float *qh = q + (size_t)h * headDim;
        float s = 0.f;
        for (int d = lane; d < headDim; d += 32) s += qh[d] * ld<KT>((const void *)r.keys, kBase + d);
        s = warp_sum(s);
        if (lane == 0) logits[(size_t)h * r.width + j] = r.scale * s;
      }
    }
}

// A batched step's kept candidates (hg_link_keep_rows): block (g, r) keeps row r's KV head g's `keep`
// best scored columns by the largest logit of the group's heads (ties to the lower column, -0 as +0:
// spec's keptColumns), makes the rest of its kmax columns -inf on every head of the group, and
// gathers the kept columns' V rows from mapped host memory by the table's ids, zero rows elsewhere.
// The keep-th largest key comes from a radix select (a byte a pass), so no column is sorted.
struct HoKeep {
  unsigned long long scores, dst, src, table;  // scores at the row's first column; src and table mapped
  long long cap;
  int width, keep, groups, kmax, group, pieces;
};

// A span of KEEP_PER · KEEP_THREADS columns at a time: its kept ids in one round trip, its kept rows' pieces
// KEEP_UNROLL a thread in flight.
constexpr int KEEP_THREADS = 256, KEEP_PER = 4, KEEP_SPAN = KEEP_THREADS * KEEP_PER, KEEP_UNROLL = 8;

__device__ __forceinline__ unsigned keep_key(const float *s, int width, int g, int group, int j) {
  float m = -INFINITY;
  for (int hh = 0; hh < group; hh++) m = fmaxf(m, s[(size_t)(g * group + hh) * width + j]);
  if (m == 0.f) m = 0.f;  // -0 ranks as +0
  const unsigned u = __float_as_uint(m);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(KEEP_THREADS) keep_rows_kernel(const HoKeep *__restrict__ rows) {
  const HoKeep R = rows[blockIdx.y];
  const int g = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (g >= R.groups) return;
  __shared__ unsigned hist[256];
  __shared__ unsigned prefix, mask;
  __shared__ int remaining, carry, listed, listed0, warpTies[KEEP_THREADS / 32], warpKept[KEEP_THREADS / 32];
  __shared__ long long rowAt[KEEP_SPAN];
  __shared__ int keptRow[KEEP_SPAN];  // the span's kept rows (span-relative), in column order
  const int *table = (const int *)R.table;
  const int n = min(max(((const volatile int *)table)[g], 0), R.kmax);
  float *s = (float *)R.scores;
  const bool all = R.keep >= n;
  if (tid == 0) { prefix = 0; mask = 0; remaining = R.keep; carry = 0; listed = 0; listed0 = 0; }
  __syncthreads();
  if (!all) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      hist[tid] = 0;  // KEEP_THREADS == 256 bins
      __syncthreads();
      const unsigned p = prefix, m = mask;
      for (int j = tid; j < n; j += KEEP_THREADS) {
        const unsigned k = keep_key(s, R.width, g, R.group, j);
        if ((k & m) == p) atomicAdd(&hist[(k >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        int cum = 0;
        for (int b = 255; b >= 0; b--) {
          if (cum + (int)hist[b] >= remaining) {
            prefix |= (unsigned)b << shift;
            remaining -= cum;
            break;
          }
          cum += (int)hist[b];
        }
        mask |= 255u << shift;
      }
      __syncthreads();
    }
  }
  const unsigned T = prefix;
  const int ties = remaining;  // of the columns whose key is T, the first `ties` are kept
  const uint4 *src = (const uint4 *)R.src;
  uint4 *dst = (uint4 *)R.dst + (size_t)g * R.kmax * R.pieces;
  const unsigned below = (1u << lane) - 1u;
  for (int c0 = 0; c0 < R.kmax; c0 += KEEP_SPAN) {
    // Which columns of the span stay, in column order (tie ranks carried across its parts), then every kept column's
    // id read at once — one round trip to host memory — and its place in the span's list of kept rows.
    bool kept[KEEP_PER];
    int slot[KEEP_PER];
#pragma unroll
    for (int u = 0; u < KEEP_PER; u++) {
      const int j = c0 + u * KEEP_THREADS + tid;
      const bool in = j < n;
      const unsigned k = in && !all ? keep_key(s, R.width, g, R.group, j) : 0u;
      const bool tie = in && !all && k == T;
      const unsigned tb = __ballot_sync(0xffffffffu, tie);
      if (lane == 0) warpTies[warp] = __popc(tb);
      __syncthreads();
      int rank = carry + __popc(tb & below);
      for (int w = 0; w < warp; w++) rank += warpTies[w];
      kept[u] = in && (all || k > T || (tie && rank < ties));
      const unsigned kb = __ballot_sync(0xffffffffu, kept[u]);
      if (lane == 0) warpKept[warp] = __popc(kb);
      __syncthreads();
      slot[u] = listed - listed0 + __popc(kb & below);  // span-relative
      for (int w = 0; w < warp; w++) slot[u] += warpKept[w];
      __syncthreads();
      if (tid == 0)
        for (int w = 0; w < KEEP_THREADS / 32; w++) {
          carry += warpTies[w];
          listed += warpKept[w];
        }
      __syncthreads();  // the counts are read before the next part rewrites them
    }
    int id[KEEP_PER];
#pragma unroll
    for (int u = 0; u < KEEP_PER; u++) id[u] = kept[u] ? table[R.groups + (size_t)g * R.kmax + c0 + u * KEEP_THREADS + tid] : -1;
#pragma unroll
    for (int u = 0; u < KEEP_PER; u++) {
      const int r = u * KEEP_THREADS + tid, j = c0 + r;
      if (j >= R.kmax) continue;
      const bool valid = kept[u] && id[u] >= 0 && id[u] < R.cap;
      rowAt[r] = valid ? (long long)g * R.cap + id[u] : -1;
      if (kept[u]) keptRow[slot[u]] = r;
      else
        for (int hh = 0; hh < R.group; hh++) s[(size_t)(g * R.group + hh) * R.width + j] = -INFINITY;
    }
    __syncthreads();
    const int m = min(KEEP_SPAN, R.kmax - c0), nk = listed - listed0;
    // Zero rows where no kept row lands (device stores only), then the kept rows' pieces, all in flight together.
    for (int p = tid; p < m * R.pieces; p += KEEP_THREADS)
      if (rowAt[p / R.pieces] < 0) dst[(size_t)c0 * R.pieces + p] = make_uint4(0, 0, 0, 0);
    const int total = nk * R.pieces;
    for (int base = 0; base < total; base += KEEP_THREADS * KEEP_UNROLL) {
      uint4 v[KEEP_UNROLL];
#pragma unroll
      for (int u = 0; u < KEEP_UNROLL; u++) {
        const int p = base + u * KEEP_THREADS + tid;
        if (p < total) {
          const long long a = rowAt[keptRow[p / R.pieces]];
          v[u] = a >= 0 ? src[a * R.pieces + p % R.pieces] : make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int u = 0; u < KEEP_UNROLL; u++) {
        const int p = base + u * KEEP_THREADS + tid;
        if (p < total) dst[((size_t)c0 + keptRow[p / R.pieces]) * R.pieces + p % R.pieces] = v[u];
      }
    }
    __syncthreads();  // the next span rewrites rowAt, keptRow and the warp counts
    if (tid == 0) listed0 = listed;
    __syncthreads();
  }
}

// A batched step's query sends (hg_link_send_rows): block r copies row r's 16-byte pieces into its
// mapped host buffer; the value goes into the link's send word by the kernel after it (stream
// order), once every block's stores were fenced system-wide.
struct HoSend {
  unsigned long long src, dst;
  int pieces, pad[3];
};

__global__ void send_rows_kernel(const HoSend *__restrict__ sends) {
  const HoSend r = sends[blockIdx.x];
  const uint4 *src = (const uint4 *)r.src;
  uint4 *dst = (uint4 *)r.dst;
  for (int i = threadIdx.x; i < r.pieces; i += blockDim.x) dst[i] = src[i];
  __threadfence_system();
}

__global__ void raise_word_kernel(volatile unsigned *word, const int *value, int valueNow) {
  __threadfence_system();
  *word = value ? (unsigned)*value : (unsigned)valueNow;
}

Cmd hg_new_cmd(int kind);

// CMD_SEND_ROWS: p[0] the sends (HoSend [s[0]]), p[1] the send word, p[2] the value in the step's
// blob when recording (NULL: d[0]).
int hg_launch_send_rows(HgCtx *c, const Cmd &m) {
  send_rows_kernel<<<(unsigned)m.s[0], 256, 0, c->compute>>>((const HoSend *)m.p[0]);
  int r = hg_launched();
  if (r) return r;
  raise_word_kernel<<<1, 1, 0, c->compute>>>((volatile unsigned *)m.p[1], (const int *)m.p[2], m.d[0]);
  return hg_launched();
}

// CMD_RESCORE_ROWS: p[0] the rows (HoRescore [s[4]], the step's blob when recording); s[0] K dtype,
// s[1] heads, s[2] kvHeads, s[3] headDim, s[4] rows, s[5] token blocks a row.
int hg_launch_rescore_rows(HgCtx *c, const Cmd &m) {
  const int group = m.s[1] / m.s[2];
  HG_DISPATCH_DT(m.s[0], K, (rescore_rows_kernel<K><<<dim3((unsigned)m.s[5], (unsigned)m.s[2], (unsigned)m.s[4]), 256, 0, c->compute>>>((const HoRescore *)m.p[0], group, m.s[3])));
  return hg_launched();
}

// CMD_KEEP_ROWS: p[0] the rows (HoKeep [s[0]], the step's blob when recording); s[1] the most KV heads a row.
int hg_launch_keep_rows(HgCtx *c, const Cmd &m) {
  keep_rows_kernel<<<dim3((unsigned)m.s[1], (unsigned)m.s[0]), KEEP_THREADS, 0, c->compute>>>((const HoKeep *)m.p[0]);
  return hg_launched();
}

// CMD_HAND_OFF_ROWS: p[0] the waits, p[1] the gathers, p[2] the reads (one table: the step's blob
// when recording); p[3] the link's words; s[0] rows, s[1] gathers, s[2] reads, s[3] blocks a copy.
int hg_launch_hand_off_rows(HgCtx *c, const Cmd &m) {
  const int n = m.s[0], threads = n >= 1024 ? 1024 : (n + 31) / 32 * 32;
  await_rows_kernel<<<1, threads, 0, c->compute>>>((const HoWait *)m.p[0], n, (volatile HgLinkWords *)m.p[3]);
  int r = hg_launched();
  if (r || m.s[1] + m.s[2] == 0) return r;
  hand_off_copies_kernel<<<dim3((unsigned)m.s[3], (unsigned)(m.s[1] + m.s[2])), GATHER_THREADS, 0, c->compute>>>((const HoGather *)m.p[1], m.s[1], (const HoRead *)m.p[2]);
  return hg_launched();
}

extern "C" {

// On the compute stream, recordable: rows (n × 8 doubles: the word's device address, the value,
// then the logits read's device dst, mapped src, width bytes, rows, dst pitch, src pitch — width 0:
// no read) and gathers (m × 7 doubles: dst, mapped src, mapped table, groups, kmax, cap, row bytes),
// all checked by TypeScript (src/host-link.ts). The device waits for every row's word, then runs
// every read and gather.
HG_EXPORT int hg_link_hand_off_rows(HgLink *l, const double *rows, int n, const double *gathers, int m) {
  if (!l->words) return (int)cudaErrorNotSupported;
  if (n < 1 || n > 4096 || m < 0 || m > 8 * n || !rows || (m && !gathers)) return (int)cudaErrorInvalidValue;
  int reads = 0;
  for (int i = 0; i < n; i++) {
    const double *r = rows + 8 * i;
    if (!r[0] || (unsigned long long)r[0] % 4 || r[1] < 0 || r[1] > 4294967295.0) return (int)cudaErrorInvalidValue;
    if (r[4] > 0) {
      if ((unsigned long long)r[4] % 4 || r[5] < 1 || (r[5] > 1 && (r[6] < r[4] || r[7] < r[4])) || !r[2] || !r[3]) return (int)cudaErrorInvalidValue;
      reads++;
    }
  }
  for (int i = 0; i < m; i++) {
    const double *g = gathers + 7 * i;
    if (!g[0] || !g[1] || !g[2] || (unsigned long long)g[2] % 4 || g[3] < 1 || g[4] < 1 || g[5] < g[4] || g[6] < 16 || (long long)g[6] % 16) return (int)cudaErrorInvalidValue;
  }
  HgCtx *c = l->c;
  HG_FLUSH_REC(c);
  const size_t waitBytes = (size_t)n * sizeof(HoWait), gatherAt = (waitBytes + 15) & ~(size_t)15;
  const size_t readAt = gatherAt + (((size_t)m * sizeof(HoGather) + 15) & ~(size_t)15), bytes = readAt + (size_t)(reads ? reads : 1) * sizeof(HoRead);
  char *host = (char *)calloc(1, bytes);
  if (!host) return (int)cudaErrorMemoryAllocation;
  HoWait *w = (HoWait *)host;
  HoGather *g = (HoGather *)(host + gatherAt);
  HoRead *rd = (HoRead *)(host + readAt);
  for (int i = 0, k = 0; i < n; i++) {
    const double *r = rows + 8 * i;
    w[i].word = (unsigned long long)r[0];
    w[i].value = (unsigned)r[1];
    if (r[4] > 0) {
      rd[k].dst = (unsigned long long)r[2];
      rd[k].src = (unsigned long long)r[3];
      rd[k].pieces = (int)r[4] / 4;
      rd[k].rows = (int)r[5];
      rd[k].dstPitch = r[5] > 1 ? (int)r[6] : (int)r[4];
      rd[k].srcPitch = r[5] > 1 ? (int)r[7] : (int)r[4];
      k++;
    }
  }
  for (int i = 0; i < m; i++) {
    const double *s = gathers + 7 * i;
    g[i].dst = (unsigned long long)s[0];
    g[i].src = (unsigned long long)s[1];
    g[i].table = (unsigned long long)s[2];
    g[i].groups = (int)s[3];
    g[i].kmax = (int)s[4];
    g[i].cap = (long long)s[5];
    g[i].pieces = (int)s[6] / 16;
  }
  int *dev = NULL;
  const int e = hg_upload_ints(c, (const int *)host, bytes / sizeof(int), &dev);
  free(host);
  if (e) return e;
  const int copies = m + reads, half = c->numSMs > 1 ? c->numSMs / 2 : 1;
  Cmd cmd = hg_new_cmd(CMD_HAND_OFF_ROWS);
  cmd.p[0] = dev; cmd.p[1] = (const char *)dev + gatherAt; cmd.p[2] = (const char *)dev + readAt; cmd.p[3] = (const void *)l->wordsDev;
  cmd.s[0] = n; cmd.s[1] = m; cmd.s[2] = reads; cmd.s[3] = copies ? (half + copies - 1) / copies : 1;
  return hg_submit(c, cmd);
}

// On the compute stream, recordable: n sends (3 doubles each: src device address, dst device address
// of mapped host memory, bytes — a multiple of 16), then the next value into the link's send word (one
// value for all of them, as hg_link_send_signalled hands out): out[0] = the value, out[1] = the word's
// host address.
HG_EXPORT int hg_link_send_rows(HgLink *l, const double *sends, int n, double *out) {
  if (!l->words) return (int)cudaErrorNotSupported;
  if (n < 1 || n > 4096 || !sends) return (int)cudaErrorInvalidValue;
  HgCtx *c = l->c;
  HG_FLUSH_REC(c);
  HoSend *t = (HoSend *)calloc((size_t)n, sizeof(HoSend));
  if (!t) return (int)cudaErrorMemoryAllocation;
  for (int i = 0; i < n; i++) {
    const double *s = sends + 3 * i;
    if (!s[0] || !s[1] || s[2] < 16 || (long long)s[2] % 16 || s[2] / 16 > 0x7fffffff) {
      free(t);
      return (int)cudaErrorInvalidValue;
    }
    t[i].src = (unsigned long long)s[0]; t[i].dst = (unsigned long long)s[1]; t[i].pieces = (int)(s[2] / 16);
  }
  int *dev = NULL;
  int e = hg_upload_ints(c, (const int *)t, (size_t)n * sizeof(HoSend) / sizeof(int), &dev);
  free(t);
  if (e) return e;
  const int value = (int)++l->signals;
  int *val = NULL;
  if (hg_recording(c) && (e = hg_upload_ints(c, &value, 1, &val))) return e;
  Cmd m = hg_new_cmd(CMD_SEND_ROWS);
  m.p[0] = dev; m.p[1] = (const void *)&l->wordsDev->send; m.p[2] = val;
  m.s[0] = n; m.d[0] = value;
  const int r = hg_submit(c, m);
  if (r) return r;
  out[0] = (double)(unsigned)value;
  out[1] = (double)(uintptr_t)&l->words->send;
  return 0;
}

// On the compute stream, recordable: n rows of verified logits (8 doubles a row: the scores' device
// address at the row's first column, their row width, q, the gathered K rows, their cap, kmax, the
// mapped table, the scale), K of dtype kt [kvHeads, cap, headDim], checked by TypeScript.
HG_EXPORT int hg_link_rescore_rows(HgLink *l, const double *rows, int n, int kt, int heads, int kvHeads, int headDim) {
  if (n < 1 || n > 4096 || !rows || kvHeads < 1 || heads % kvHeads || headDim < 1) return (int)cudaErrorInvalidValue;
  HgCtx *c = l->c;
  HG_FLUSH_REC(c);
  HoRescore *t = (HoRescore *)calloc((size_t)n, sizeof(HoRescore));
  if (!t) return (int)cudaErrorMemoryAllocation;
  int most = 1;
  for (int i = 0; i < n; i++) {
    const double *r = rows + 8 * i;
    if (!r[0] || !r[2] || !r[3] || !r[6] || (unsigned long long)r[6] % 4 || r[1] < r[5] || r[5] < 1 || r[5] > r[4]) {
      free(t);
      return (int)cudaErrorInvalidValue;
    }
    t[i].scores = (unsigned long long)r[0]; t[i].width = (int)r[1]; t[i].q = (unsigned long long)r[2]; t[i].keys = (unsigned long long)r[3];
    t[i].cap = (int)r[4]; t[i].kmax = (int)r[5]; t[i].table = (unsigned long long)r[6]; t[i].scale = (float)r[7];
    if (t[i].cap > most) most = t[i].cap;
  }
  int *dev = NULL;
  const int e = hg_upload_ints(c, (const int *)t, (size_t)n * sizeof(HoRescore) / sizeof(int), &dev);
  free(t);
  if (e) return e;
  // Token blocks for the widest row's cap (a recorded grid; blocks past a row's kmax return at once).
  const int per = RS_WARPS * RS_TOKENS, byRows = (8 * c->numSMs + kvHeads * n - 1) / (kvHeads * n);
  int gx = (most + per - 1) / per;
  if (gx > byRows) gx = byRows;
  if (gx < 1) gx = 1;
  Cmd m = hg_new_cmd(CMD_RESCORE_ROWS);
  m.p[0] = dev;
  m.s[0] = kt; m.s[1] = heads; m.s[2] = kvHeads; m.s[3] = headDim; m.s[4] = n; m.s[5] = gx;
  return hg_submit(c, m);
}

// On the compute stream, recordable: n rows of kept candidates (11 doubles a row: the scores' device
// address at the row's first column, their row width, keep, the V rows' device dst, mapped src and
// mapped table, KV heads, kmax, cap, row bytes, query heads a KV head), checked by TypeScript.
HG_EXPORT int hg_link_keep_rows(HgLink *l, const double *rows, int n) {
  if (n < 1 || n > 4096 || !rows) return (int)cudaErrorInvalidValue;
  HgCtx *c = l->c;
  HG_FLUSH_REC(c);
  HoKeep *t = (HoKeep *)calloc((size_t)n, sizeof(HoKeep));
  if (!t) return (int)cudaErrorMemoryAllocation;
  int most = 1;
  for (int i = 0; i < n; i++) {
    const double *r = rows + 11 * i;
    if (!r[0] || !r[3] || !r[4] || !r[5] || (unsigned long long)r[5] % 4 || r[2] < 1 || r[6] < 1 || r[7] < 1 || r[8] < r[7] || r[9] < 16 || (long long)r[9] % 16 || r[10] < 1 || r[1] < r[7]) {
      free(t);
      return (int)cudaErrorInvalidValue;
    }
    t[i].scores = (unsigned long long)r[0]; t[i].width = (int)r[1]; t[i].keep = (int)r[2]; t[i].dst = (unsigned long long)r[3];
    t[i].src = (unsigned long long)r[4]; t[i].table = (unsigned long long)r[5]; t[i].groups = (int)r[6]; t[i].kmax = (int)r[7];
    t[i].cap = (long long)r[8]; t[i].pieces = (int)(r[9] / 16); t[i].group = (int)r[10];
    if (t[i].groups > most) most = t[i].groups;
  }
  int *dev = NULL;
  const int e = hg_upload_ints(c, (const int *)t, (size_t)n * sizeof(HoKeep) / sizeof(int), &dev);
  free(t);
  if (e) return e;
  Cmd m = hg_new_cmd(CMD_KEEP_ROWS);
  m.p[0] = dev;
  m.s[0] = n; m.s[1] = most;
  return hg_submit(c, m);
}

}  // extern "C"
