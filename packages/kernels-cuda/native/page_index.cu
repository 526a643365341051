// The page index's top level on the device (page_index.cuh): each KV head's best pages by their
// int8/int4 bounds, recordable in a decode step (the page count, which grows with the store, goes
// with the step's blob; the grid is the index capacity's, so a recorded step replays unchanged).
#include "common.cuh"
#include "page_index.cuh"

Cmd hg_new_cmd(int kind);                       // rowops.cu
int hg_put_dyn(HgCtx *c, Cmd &cmd, int count);  // rowops.cu

static int sm_count(const HgCtx *c) {
  int sms = 0;
  return cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c->device) == cudaSuccess ? sms : 0;
}

// CMD_INDEX_RANK: p[0] codes, p[1] scales, p[2] q, p[3] out, p[4] scratch; s[0] form, s[1] kvHeads,
// s[2] group, s[3] headDim, s[4] page capacity, s[5] want, s[6] SMs; d[0] the page count.
int hg_launch_index_rank(HgCtx *c, const Cmd &m, const char *dynBase) {
  const int *dyn = dynBase ? (const int *)(dynBase + m.dynOff) : NULL;
  const hg_index::Plan pl = hg_index::plan(m.s[0], m.s[1], m.s[2], m.s[3], m.s[4], m.s[5], m.s[6]);
  auto launch = [c](auto kernel, dim3 g, dim3 b, size_t smem, auto... args) { return (cudaError_t)hg_launch(c, kernel, g, b, smem, args...); };
  hg_index::RankArgs a;
  a.codes = (const uint8_t *)m.p[0], a.scales = (const float *)m.p[1], a.q = (const float *)m.p[2], a.out = (int32_t *)m.p[3], a.scratch = (void *)m.p[4];
  a.count_val = m.d[0], a.count_dyn = dyn;
  return (int)hg_index::rank_with(pl, launch, m.s[0], m.s[1], m.s[2], m.s[3], m.s[4], m.s[5], a);
}

// CMD_INDEX_RANK_ROWS: p[0] the rows' table (RankRow [s[7]], in the blob when recorded); s[0] form,
// s[1] kvHeads, s[2] group, s[3] headDim, s[4] page capacity, s[5] the plan's want, s[6] SMs, s[7]
// rows, s[8] the scales' byte offset in each index.
int hg_launch_index_rank_rows(HgCtx *c, const Cmd &m) {
  const hg_index::Plan pl = hg_index::plan(m.s[0], m.s[1], m.s[2], m.s[3], m.s[4], m.s[5], m.s[6]);
  auto launch = [c](auto kernel, dim3 g, dim3 b, size_t smem, auto... args) { return (cudaError_t)hg_launch(c, kernel, g, b, smem, args...); };
  hg_index::RankArgs a;
  a.rows = (const hg_index::RankRow *)m.p[0], a.n = m.s[7], a.scales_off = m.s[8];
  return (int)hg_index::rank_with(pl, launch, m.s[0], m.s[1], m.s[2], m.s[3], m.s[4], m.s[5], a);
}

extern "C" {

// Scratch bytes hg_cu_index_rank needs for an index of pageCap pages a head; 0 for a shape it does not run
// (form 1 int8 / 2 int4, headDim 64/128/256, group ≤ 16 (8 at headDim 256), want ≤ 256, few enough candidates).
HG_EXPORT int hg_cu_index_rank_scratch(HgCtx *c, int form, int kvHeads, int group, int headDim, int pageCap, int want) {
  const hg_index::Plan pl = hg_index::plan(form, kvHeads, group, headDim, pageCap, want, sm_count(c));
  return pl.ok && pl.scratch < (1u << 31) ? (int)pl.scratch : 0;
}

// out [kvHeads, want] int32: each KV head's best `want` of its first `count` pages by bound (q f32
// [kvHeads·group, headDim]; codes [pageCap, kvHeads, code bytes] / scales [pageCap, kvHeads] the
// index's page level, page-major), best first, ties to the lower page, −1 past the count.
// scratch: hg_cu_index_rank_scratch bytes.
HG_EXPORT int hg_cu_index_rank(HgCtx *c, int32_t *out, const uint8_t *codes, const float *scales, const float *q, void *scratch, int scratchBytes,
                               int form, int kvHeads, int group, int headDim, int pageCap, int count, int want) {
  const int sms = sm_count(c);
  const hg_index::Plan pl = hg_index::plan(form, kvHeads, group, headDim, pageCap, want, sms);
  if (!pl.ok || pl.scratch > (size_t)scratchBytes || scratchBytes < 0 || count < 0 || count > pageCap || !out || !codes || !scales || !q || !scratch) return (int)cudaErrorInvalidValue;
  HG_FLUSH_REC(c);
  Cmd m = hg_new_cmd(CMD_INDEX_RANK);
  m.p[0] = codes; m.p[1] = scales; m.p[2] = q; m.p[3] = out; m.p[4] = scratch;
  m.s[0] = form; m.s[1] = kvHeads; m.s[2] = group; m.s[3] = headDim; m.s[4] = pageCap; m.s[5] = want; m.s[6] = sms;
  m.d[0] = count;
  int r = hg_put_dyn(c, m, 1);
  return r ? r : hg_submit(c, m);
}

// hg_cu_index_rank for n indexes of one shape at once (one launch of each kernel): rows (host) holds
// n RankRows as 12 ints each — codes, q, out, scratch pointers, the page count and the want — whose
// wants are 1..want and whose scratch holds hg_cu_index_rank_scratch(…, want) bytes (the caller's check).
HG_EXPORT int hg_cu_index_rank_rows(HgCtx *c, const int *rows, int n, int form, int kvHeads, int group, int headDim, int pageCap, int scalesOffset, int want) {
  const int sms = sm_count(c);
  const hg_index::Plan pl = hg_index::plan(form, kvHeads, group, headDim, pageCap, want, sms);
  if (!pl.ok || n < 1 || !rows || scalesOffset < 0) return (int)cudaErrorInvalidValue;
  for (int i = 0; i < n; i++) {
    const hg_index::RankRow &r = ((const hg_index::RankRow *)rows)[i];
    if (!r.codes || !r.q || !r.out || !r.cand || r.count < 0 || r.count > pageCap || r.want < 1 || r.want > want) return (int)cudaErrorInvalidValue;
  }
  HG_FLUSH_REC(c);
  int *dev = NULL;
  int e = hg_upload_ints(c, rows, (size_t)n * (sizeof(hg_index::RankRow) / sizeof(int)), &dev);
  if (e) return e;
  Cmd m = hg_new_cmd(CMD_INDEX_RANK_ROWS);
  m.p[0] = dev;
  m.s[0] = form; m.s[1] = kvHeads; m.s[2] = group; m.s[3] = headDim; m.s[4] = pageCap; m.s[5] = want; m.s[6] = sms; m.s[7] = n; m.s[8] = scalesOffset;
  return hg_submit(c, m);
}

}  // extern "C"
