/* The compact hierarchical page index (the spec's contracts/page-index.ts defines it): int8 or int4
 * per-channel bounds of K with a per-page scale, super-pages over the pages; the primitives
 * hg_index_fold / hg_index_pages and the CPU stage's HG_STAGE_INDEX kernel. */
#ifndef HG_SEL_INDEX_H
#define HG_SEL_INDEX_H
#include <stddef.h>
#include <stdint.h>
#include "cpu_stage.h"
#include "pool.h"

enum { HG_INDEX_INT8 = 1, HG_INDEX_INT4 = 2 };

/* An index's parts in its bytes (pageIndexLayout's offsets, 64-byte aligned). */
typedef struct {
    int form;
    int64_t kv_heads, d, page, super, page_cap, super_cap, code_bytes;
    uint8_t *page_codes, *super_codes; /* [kv_heads, cap, code_bytes] */
    float *page_scales, *super_scales; /* [kv_heads, cap] */
} hg_index;

#pragma GCC visibility push(default)
/* Bytes of an index (pageIndexLayout's `bytes`); 0 for a form that does not exist. */
int64_t hg_index_bytes(int form, int64_t kv_heads, int64_t d, int64_t page, int64_t super, int64_t page_cap);
/* The view of an index at base; returns 0, or -1 for a form that does not exist. */
int hg_index_view(hg_index *x, void *base, int form, int64_t kv_heads, int64_t d, int64_t page, int64_t super, int64_t page_cap);
/* indexFold: rows [from, to) of K [kv_heads, kcap, d] (HG_F32/F16/BF16) into the index at base, pages
 * they touch afresh, then their super-pages; a KV head per pool piece (the stage's idle pool). */
void hg_index_fold(void *base, int form, int64_t kv_heads, int64_t d, int64_t page, int64_t super, int64_t page_cap, const void *k, int ktype,
                   int64_t kcap, int64_t from, int64_t to, hg_stage *stage);
/* indexFold of n items (12 doubles each: base, form, kv_heads, d, page, super, page_cap, k, ktype, kcap,
 * from, to) — a batch's rows × layers: the small ones (a decode step's evicted rows) as one pool op, a
 * KV head of an item a piece; a large one (a first fold) over the pool alone, as hg_index_fold. */
void hg_index_fold_many(const double *items, int n, hg_stage *stage);
/* indexPages: the best min(want, ⌈n/page⌉) pages per KV head into out [kv_heads, that], by bound,
 * highest first, ties to the lower page; q is [kv_heads*group, d]. Returns the page summaries read
 * (all heads), or -2 when scratch memory failed. isa: 0 scalar, 1 AVX2, >= 2 AVX-512 page bounds. */
int64_t hg_index_pages(void *base, int form, int64_t kv_heads, int64_t d, int64_t page, int64_t super, int64_t page_cap, const float *q, int64_t group,
                       int64_t n, int64_t want, int32_t *out, int isa, hg_stage *stage);
#pragma GCC visibility pop

/* Pages a KV head's list is filled from for K = min(budget, n) of n rows: ⌈K / page⌉ + 1, at most ⌈n / page⌉ (indexSelection). */
static inline int64_t hg_index_want(int64_t budget, int64_t n, int64_t page) {
    const int64_t k = budget < n ? budget : n, count = (n + page - 1) / page, w = (k + page - 1) / page + 1;
    return k <= 0 ? 0 : w < count ? w : count;
}

/* The stage's index kernel: rows [pages_from, n) folded in, then budget ids per KV head into ids /
 * counts (indexSelection); with HG_STAGE_CHOSEN the best pages come after the query instead (no fold,
 * no search). *buf / *bytes: scratch kept between jobs. Returns 0, -2 when scratch failed, 1 for a
 * form that does not exist or a chosen page out of range (err says so). */
int64_t hg_index_select(hg_pool *pool, const hg_stage_job *j, int isa, char **buf, size_t *bytes, char *err, size_t errcap);
#endif
