// The page index's GPU top level (the spec's page-index.ts defines the index): every page's bound
// scale·Σ_c max(q_c·lo_c, q_c·hi_c), the max over a KV head's query heads, and each KV head's best
// `want` pages (highest bound first, ties to the lower page) without sorting every page: each
// block bounds a contiguous chunk of one head's pages into shared memory and keeps its chunk's best
// `want` (the head's best are among the union of its chunks' best), then one block a head picks the
// best `want` of those candidates. Bounds sum in f32, so a choice may differ from the definition's
// (f64) only between pages whose bounds tie within rounding. Self-contained (no backend context):
// page_index.cu exports it and apps/bench/device/index_rank.cu checks it against a host reference.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

namespace hg_index {

constexpr int THREADS = 256;
constexpr int CHUNK_MAX = 2048;     // pages a block bounds (its shared keys: 16 KiB)
constexpr int WANT_MAX = 256;       // pages a head may ask for
constexpr int GROUP_MAX = 16;       // query heads per KV head (8 at headDim 256: the block's shared q)
constexpr int CAND_MAX = 5000;      // candidates a head's last block picks from (its shared keys: 40 KiB)

// A (bound, page) pair as one orderable key: the larger key is the higher bound, then the lower page; 0 is below every pair.
__device__ __forceinline__ unsigned long long pack(float b, int32_t p) {
  uint32_t u = __float_as_uint(b);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)u << 32) | (uint32_t)(0xFFFFFFFFu - (uint32_t)p);
}
__device__ __forceinline__ int32_t page_of(unsigned long long k) { return (int32_t)(0xFFFFFFFFu - (uint32_t)k); }

__device__ __forceinline__ unsigned long long warp_max(unsigned long long v) {
  for (int o = 16; o; o >>= 1) {
    const unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

__device__ __forceinline__ int warp_sum(int v) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// block_top's shared state: a pass's digit counts, the chosen keys, and the select's progress.
struct TopScratch {
  unsigned int hist[256];
  unsigned long long sel[WANT_MAX];
  unsigned long long prefix;  // the digits of the want-th best key found so far
  int need, shift, done, nonzero, taken;
};

// The best `want` keys of keys[0, n) (shared; the nonzero ones distinct), best first, into out,
// zeros past the nonzero keys. A radix select from the top byte finds the want-th best key T (a
// pass counts the keys still in play by their next byte; it ends early once a byte's keys are all
// taken), the keys ≥ T are gathered, and each one's place is the count of those above it: a few
// barriers a pass, not two a key as picking the block's max `want` times took.
__device__ void block_top(const unsigned long long *keys, int n, int want, unsigned long long *out, TopScratch &s) {
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;
  if (tid == 0) s.nonzero = 0, s.taken = 0, s.prefix = 0, s.done = 0, s.shift = 0;
  __syncthreads();
  int nz = 0;
  for (int i = tid; i < n; i += nt) nz += keys[i] != 0;
  nz = warp_sum(nz);
  if (lane == 0 && nz) atomicAdd(&s.nonzero, nz);
  __syncthreads();
  const int m = s.nonzero < want ? s.nonzero : want;
  unsigned long long T = 1;  // every nonzero key when there are no more than want
  if (m < s.nonzero) {
    if (tid == 0) s.need = m;
    for (int shift = 56;; shift -= 8) {
      for (int i = tid; i < 256; i += nt) s.hist[i] = 0;
      __syncthreads();
      const unsigned long long pre = s.prefix;
      for (int i = tid; i < n; i += nt) {
        const unsigned long long k = keys[i];
        if (k != 0 && (shift == 56 || (k >> (shift + 8)) == pre)) atomicAdd(&s.hist[(k >> shift) & 255], 1u);
      }
      __syncthreads();
      if (tid < 32) {  // lane l sums bins 255 − 8l down to 248 − 8l; the first lane whose running sum reaches need holds the byte
        int own = 0;
        for (int b = 0; b < 8; b++) own += (int)s.hist[255 - 8 * lane - b];
        int run = own;
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_up_sync(0xffffffffu, run, o);
          if (lane >= o) run += v;
        }
        const int need = s.need;
        const unsigned hit = __ballot_sync(0xffffffffu, run >= need);
        if (lane == __ffs(hit) - 1) {
          int left = need - (run - own), d = 255 - 8 * lane;
          for (int b = 0; b < 7 && (int)s.hist[d] < left; b++) left -= (int)s.hist[d--];
          s.prefix = (pre << 8) | (unsigned)d;
          s.need = left;
          if ((int)s.hist[d] == left || shift == 0) s.done = 1, s.shift = shift;  // distinct keys: the last byte's bin holds one
        }
      }
      __syncthreads();
      if (s.done) break;
    }
    T = s.prefix << s.shift;
  }
  for (int i = tid; i < n; i += nt) {
    const unsigned long long k = keys[i];
    if (k != 0 && k >= T) s.sel[atomicAdd(&s.taken, 1)] = k;
  }
  __syncthreads();
  for (int i = tid; i < m; i += nt) {
    const unsigned long long k = s.sel[i];
    int r = 0;
    for (int j = 0; j < m; j++) r += s.sel[j] > k;
    out[r] = k;
  }
  for (int i = m + tid; i < want; i += nt) out[i] = 0;
}

// One index of a batched ranking (RankArgs.rows): its page level (scales at the shape's scales
// offset), its query, its output [kvHeads, want], its candidates' scratch, its page count and want.
struct RankRow {
  const uint8_t *codes;
  const float *q;
  int32_t *out;
  unsigned long long *cand;
  int count, want, pad[2];
};
static_assert(sizeof(RankRow) == 48, "RankRow is 12 ints of the host's table");

// Grid (chunks, kvHeads[, rows]): block (c, g) bounds pages [c·chunk, min(count, (c+1)·chunk)) of head g,
// lanes of D/8 a page (8 channels each), and writes that chunk's best `want` keys (0 past its pages).
// The index is page-major (the spec's DeviceIndexShape): codes [pcap, kvHeads, CB], scales [pcap, kvHeads].
// With `rows`, block z ranks rows[z]'s index (its count and want, ≤ the launch's `want`, the candidates' stride).
template <int FORM, int D>
__global__ void __launch_bounds__(THREADS) chunk_best(const uint8_t *__restrict__ codes, const float *__restrict__ scales, const float *__restrict__ q, int group,
                                                        int64_t pcap, int count_val, const int *count_dyn, int chunk, int want, unsigned long long *__restrict__ cand,
                                                        const RankRow *__restrict__ rows, int64_t scales_off) {
  constexpr int L = D / 8, CB = FORM == 1 ? 2 * D : D;
  const int stride = want;
  if (rows) {
    const RankRow &r = rows[blockIdx.z];
    codes = r.codes, scales = (const float *)(r.codes + scales_off), q = r.q, cand = r.cand;
    count_dyn = &r.count, want = r.want;
  }
  __shared__ float qp[(D == 256 ? 8 : GROUP_MAX) * D], qn[(D == 256 ? 8 : GROUP_MAX) * D];
  __shared__ unsigned long long keys[CHUNK_MAX];
  __shared__ TopScratch top;
  const int g = blockIdx.y, tid = threadIdx.x;
  for (int i = tid; i < group * D; i += THREADS) {
    const float v = q[(int64_t)g * group * D + i];
    qp[i] = v > 0.f ? v : 0.f;
    qn[i] = v < 0.f ? v : 0.f;
  }
  __syncthreads();
  const int64_t count = count_dyn ? *count_dyn : count_val, p0 = (int64_t)blockIdx.x * chunk;
  const int n = (int)(count - p0 < 0 ? 0 : count - p0 < chunk ? count - p0 : chunk);
  const int sub = tid % L, slot = tid / L, per = THREADS / L;
  const int64_t kv = gridDim.y;
  const uint8_t *base = codes + (int64_t)g * CB;
  const float *sc = scales + g;
  for (int i = slot; i - slot < n; i += per) {  // every lane of a page's group runs the same trips (the shuffles need them all)
    const bool live = i < n;
    const int64_t p = p0 + (live ? i : 0);
    float lo[8], hi[8];
    if (FORM == 1) {
      const uint2 l = __ldg((const uint2 *)(base + p * kv * CB) + sub), h = __ldg((const uint2 *)(base + p * kv * CB + D) + sub);
      for (int k = 0; k < 4; k++) {
        lo[k] = (float)(int8_t)(l.x >> (8 * k)), lo[4 + k] = (float)(int8_t)(l.y >> (8 * k));
        hi[k] = (float)(int8_t)(h.x >> (8 * k)), hi[4 + k] = (float)(int8_t)(h.y >> (8 * k));
      }
    } else {
      const uint2 w = __ldg((const uint2 *)(base + p * kv * CB) + sub);
      for (int k = 0; k < 4; k++) {
        lo[k] = (float)((int)((w.x >> (8 * k)) & 15) - 8), hi[k] = (float)((int)((w.x >> (8 * k + 4)) & 15) - 8);
        lo[4 + k] = (float)((int)((w.y >> (8 * k)) & 15) - 8), hi[4 + k] = (float)((int)((w.y >> (8 * k + 4)) & 15) - 8);
      }
    }
    float best = __int_as_float(0xff800000);
    for (int j = 0; j < group; j++) {
      const float4 *pp = (const float4 *)(qp + j * D + sub * 8), *pn = (const float4 *)(qn + j * D + sub * 8);
      const float4 a = pp[0], b = pp[1], c = pn[0], d = pn[1];
      float s = a.x * hi[0];
      s = fmaf(a.y, hi[1], s), s = fmaf(a.z, hi[2], s), s = fmaf(a.w, hi[3], s);
      s = fmaf(b.x, hi[4], s), s = fmaf(b.y, hi[5], s), s = fmaf(b.z, hi[6], s), s = fmaf(b.w, hi[7], s);
      s = fmaf(c.x, lo[0], s), s = fmaf(c.y, lo[1], s), s = fmaf(c.z, lo[2], s), s = fmaf(c.w, lo[3], s);
      s = fmaf(d.x, lo[4], s), s = fmaf(d.y, lo[5], s), s = fmaf(d.z, lo[6], s), s = fmaf(d.w, lo[7], s);
      for (int o = L / 2; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o, L);
      best = fmaxf(best, s);
    }
    if (live && sub == 0) keys[i] = pack(best * __ldg(sc + p * kv), (int32_t)p);
  }
  __syncthreads();
  unsigned long long *mine = cand + ((int64_t)g * gridDim.x + blockIdx.x) * stride;
  block_top(keys, n, want, mine, top);
  for (int i = want + tid; i < stride; i += THREADS) mine[i] = 0;  // a row that wants fewer leaves no stale candidates
}

// One block a head: the best `want` of its chunks' candidates, as pages, best first. With `rows`,
// block y takes rows[y]'s candidates, want and output (its scratch laid out at the launch's want).
__global__ void __launch_bounds__(1024) head_best(unsigned long long *cand, int per_head, int want, int32_t *out, const RankRow *__restrict__ rows) {
  extern __shared__ unsigned long long dyn[];
  __shared__ TopScratch top;
  const int g = blockIdx.x;
  if (rows) {
    const RankRow &r = rows[blockIdx.y];
    cand = r.cand, want = r.want, out = r.out;
  }
  unsigned long long *keys = dyn, *best = dyn + per_head;
  for (int i = threadIdx.x; i < per_head; i += blockDim.x) keys[i] = cand[(int64_t)g * per_head + i];
  __syncthreads();
  block_top(keys, per_head, want, best, top);
  __syncthreads();
  for (int i = threadIdx.x; i < want; i += blockDim.x) out[(int64_t)g * want + i] = page_of(best[i]);
}

// How rank() covers an index of `pcap` pages a head (its grid is fixed for the capacity, so a
// recorded step replays it whatever the count): `chunk` pages a block, about four blocks an SM over
// all heads, at least 256, and few enough chunks that a head leaves at most CAND_MAX candidates.
struct Plan {
  int chunk = 0, chunks = 0, per_head = 0;
  size_t scratch = 0, head_smem = 0;
  bool ok = false;
};

inline Plan plan(int form, int kv_heads, int group, int d, int64_t pcap, int want, int sms) {
  Plan r;
  if ((form != 1 && form != 2) || (d != 64 && d != 128 && d != 256) || group < 1 || group > (d == 256 ? 8 : GROUP_MAX) || want < 1 || want > WANT_MAX ||
      kv_heads < 1 || pcap < 1 || sms < 1)
    return r;
  int64_t c = (pcap * kv_heads + 4 * (int64_t)sms - 1) / (4 * (int64_t)sms);
  const int64_t chunks_max = CAND_MAX / want, least = (pcap + chunks_max - 1) / chunks_max;
  if (c < least) c = least;
  c = (c + 255) / 256 * 256;
  if (c > CHUNK_MAX) return r;
  r.chunk = (int)c;
  r.chunks = (int)((pcap + c - 1) / c);
  r.per_head = r.chunks * want;
  r.scratch = (size_t)r.per_head * kv_heads * 8;
  r.head_smem = (size_t)(r.per_head + want) * 8;
  r.ok = true;
  return r;
}

// What a ranking takes: one index (codes, scales, q, out, scratch; its page count count_val, or
// count_dyn's value when given), or with `rows` (device) n indexes of one shape, each with its own
// count and want (≤ the plan's: every row's scratch holds the plan's candidates), scales at scales_off.
struct RankArgs {
  const uint8_t *codes = nullptr;
  const float *scales = nullptr, *q = nullptr;
  int32_t *out = nullptr;
  void *scratch = nullptr;
  int count_val = 0;
  const int *count_dyn = nullptr;
  const RankRow *rows = nullptr;
  int n = 1;
  int64_t scales_off = 0;
};

// Each KV head's best `want` pages among its first count into out [kv_heads, want], best first; −1
// past the count's pages. With a launcher (the backend's) or <<<>>>.
template <typename Launch>
inline cudaError_t rank_with(const Plan &pl, Launch launch, int form, int kv_heads, int group, int d, int64_t pcap, int want, const RankArgs &a) {
  if (!pl.ok || a.n < 1) return cudaErrorInvalidValue;
  const dim3 grid((unsigned)pl.chunks, (unsigned)kv_heads, (unsigned)a.n);
  unsigned long long *cand = (unsigned long long *)a.scratch;
  cudaError_t e;
#define HG_INDEX_LAUNCH(F, DD) e = launch(chunk_best<F, DD>, grid, dim3(THREADS), 0, a.codes, a.scales, a.q, group, pcap, a.count_val, a.count_dyn, pl.chunk, want, cand, a.rows, a.scales_off)
  if (form == 1) {
    if (d == 64) HG_INDEX_LAUNCH(1, 64); else if (d == 128) HG_INDEX_LAUNCH(1, 128); else HG_INDEX_LAUNCH(1, 256);
  } else {
    if (d == 64) HG_INDEX_LAUNCH(2, 64); else if (d == 128) HG_INDEX_LAUNCH(2, 128); else HG_INDEX_LAUNCH(2, 256);
  }
#undef HG_INDEX_LAUNCH
  if (e != cudaSuccess) return e;
  return launch(head_best, dim3((unsigned)kv_heads, (unsigned)a.n), dim3(1024), pl.head_smem, cand, pl.per_head, want, a.out, a.rows);
}

}  // namespace hg_index
