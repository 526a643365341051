/* Key primitives of pre-QKᵀ token selectors (Quest page summaries, InfiniGen partial keys):
 * the native side of SelectorPrimitives' summarizePages / pageBounds / keyScores /
 * gatherChannels, same semantics as core's reference implementations. K is
 * [kv_heads, cap, d] in f32/f16/bf16 (HG_F32/HG_F16/HG_BF16); queries and outputs are f32, page
 * summaries bf16 (rounded outward).
 * isa: 0 scalar, 1 AVX2 (+FMA, F16C), 2 AVX-512 F/BW/VL/DQ (page bounds; AVX2 elsewhere, and the
 * bounds are AVX2's bits), < 0 the best the CPU runs. stage: NULL runs on the
 * caller's thread; a CPU stage lends its thread pool while no job of its own runs (a selector
 * runs between stage jobs), else the call stays on the caller's thread. Results do not depend
 * on the thread count. Arguments are checked by the caller. */
#ifndef HG_SEL_PRIMS_H
#define HG_SEL_PRIMS_H
#include <stdint.h>
#include "cpu_stage.h"

#pragma GCC visibility push(default)
/* The ISA an isa argument < 0 resolves to (0, 1 or 2). */
int hg_sel_best_isa(void);
/* Folds rows [from, to) into page summaries mn/mx [kv_heads, page_cap, d], bf16 bit patterns rounded
 * outward (mn toward −∞, mx toward +∞: half f32's bytes, still a bound); a row at a page start resets its page. */
void hg_sel_summarize(const void *k, int ktype, int64_t kv_heads, int64_t cap, int64_t d, int64_t from, int64_t to,
                      int64_t page, int64_t page_cap, uint16_t *mn, uint16_t *mx, int isa, hg_stage *stage);
/* out[g*count + p] = max over the group's heads of sum_c max(q*mn, q*mx), summed in f32. q is [kv_heads*group, d]. */
void hg_sel_page_bounds(const float *q, int64_t kv_heads, int64_t group, int64_t d, const uint16_t *mn, const uint16_t *mx,
                        int64_t page_cap, int64_t count, float *out, int isa, hg_stage *stage);
/* out[g*(to-from) + slot-from] = max over the group's heads of q·K[g, slot]. */
void hg_sel_key_scores(const float *q, int64_t kv_heads, int64_t group, const void *k, int ktype, int64_t cap, int64_t d,
                       int64_t from, int64_t to, float *out, int isa, hg_stage *stage);
/* out[(g*out_cap + slot)*r + i] = K[g, slot, ch[g*r + i]] as f32, slots [from, to). */
void hg_sel_gather(const void *k, int ktype, int64_t kv_heads, int64_t cap, int64_t d, const int32_t *ch, int64_t r,
                   int64_t from, int64_t to, float *out, int64_t out_cap, hg_stage *stage);
/* Indices (ascending) of the k largest of x[0..n) into out: ties to the lower index, every NaN
 * below every number, -0 equal to +0, k clamped to [0, n]. Returns the count, or -1 when
 * scratch memory failed. */
int64_t hg_sel_topk(const float *x, int64_t n, int64_t k, int32_t *out, int isa, hg_stage *stage);
/* hg_sel_topk of each of `lists` rows, all at once (the CPU stage's top-K, topk_row.h's hg_topk_rows):
 * list l's row is src + l*n when nsrc is 1, else the max of the nsrc rows src + (l*nsrc + q)*n (NaN never
 * wins, -inf where all are NaN), written to maxrow + l*n when 0 < k < n. Its ids go to out + l*ostride.
 * Returns 0, or -1 when scratch memory failed. */
int64_t hg_sel_topk_rows(const float *src, int64_t nsrc, float *maxrow, int64_t lists, int64_t n, int64_t k, int32_t *out, int64_t ostride,
                         int isa, hg_stage *stage);
#pragma GCC visibility pop
#endif
