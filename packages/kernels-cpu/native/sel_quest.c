/* Quest's page choice in a stage job: core's questSelection (contracts/quest-selection.ts) on
 * the loops of the key primitives (sel_loops.h), so a list equals the quest selector's select()
 * on the native primitives of the same ISA. Two phases on the stage's pool: pieces of (KV head,
 * run of whole pages) fold the rows evicted since the last job into their pages (a page has one
 * writer) and bound those pages; then a list per thread takes its best pages, the page that does
 * not fit by exact q·k, and writes its ids in ascending order. The summaries are bf16 rounded
 * outward (min toward −∞, max toward +∞; page-summaries.ts): the bounds, the job's main read,
 * take half the bytes of f32 ones and still bound every q·k. */
#include "sel_quest.h"
#include "sel_loops.h"
#include "topk_row.h"
#include "hgcpu.h"
#include <stdatomic.h>
#include <stdlib.h>

typedef struct {
    const hg_stage_job *j;
    float *bounds;  /* [kv_heads, count] */
    char *lists;    /* per list: best pages [want] int32, exact scores [page] f32, positions [page] int32 */
    int64_t count, want, k, group, chunks, list_bytes;
    int isa, avx2;
    atomic_int failed;
} quest_run;

/* Piece (KV head, run of whole pages): the new rows of its pages, then their bounds. */
static void bound_task(void *v, int part, int parts) {
    (void)parts;
    quest_run *r = v;
    const hg_stage_job *j = r->j;
    const int64_t g = part / r->chunks, P = j->page_size, d = j->head_dim, pc = j->page_cap;
    int64_t b, e;
    hg_split(r->count, 8, (int)(part % r->chunks), (int)r->chunks, &b, &e);
    if (b >= e) return;
    uint16_t *mn = (uint16_t *)(intptr_t)j->pages + g * pc * d, *mx = mn + j->kv_heads * pc * d;
    const int64_t s0 = b * P > j->pages_from ? b * P : j->pages_from, s1 = e * P < j->n ? e * P : j->n;
    if (s0 < s1) hg_sel_summarize_serial(hg_stage_k_head(j, g), (int)j->ktype, 1, j->kcap, d, s0, s1, P, pc, mn, mx, r->isa);
    if (r->k > 0)
        hg_sel_page_bounds_serial((const float *)(intptr_t)j->q + g * r->group * d, 1, r->group, d, mn + b * d, mx + b * d, pc, e - b,
                                  r->bounds + g * r->count + b, r->isa);
}

/* Pages by bound, highest first, ties by page index: quest-selection.ts's insertion sort, step for step. */
static void by_bound_desc(int32_t *pages, int64_t m, const float *bound) {
    for (int64_t i = 1; i < m; i++) {
        const int32_t p = pages[i];
        const float b = bound[p];
        int64_t at = i - 1;
        for (; at >= 0; at--) {
            const int32_t q = pages[at];
            const float c = bound[q];
            if (c > b || (c == b && q < p)) break;
            pages[at + 1] = q;
        }
        pages[at + 1] = p;
    }
}

static void ascending(int32_t *x, int64_t m) {
    for (int64_t i = 1; i < m; i++) {
        int32_t p = x[i];
        int64_t at = i - 1;
        for (; at >= 0 && x[at] > p; at--) x[at + 1] = x[at];
        x[at + 1] = p;
    }
}

int hg_pages_to_list(const hg_stage_job *j, int64_t g, int32_t *best, int64_t want, int64_t k, int64_t group, float *exact, int32_t *pos, int isa) {
    const int64_t P = j->page_size, n = j->n, d = j->head_dim;
    int64_t taken = 0, used = 0, partial = -1, left = 0;
    while (used < want && taken < k) {
        const int64_t from = best[used++] * P, to = from + P < n ? from + P : n;
        if (to - from <= k - taken) taken += to - from;
        else { partial = from / P; left = k - taken; taken = k; }
    }
    if (partial >= 0) {
        const int64_t from = partial * P, to = from + P < n ? from + P : n;
        hg_sel_key_scores_serial((const float *)(intptr_t)j->q + g * group * d, 1, group, hg_stage_k_head(j, g), (int)j->ktype, j->kcap, d, from,
                                 to, exact, isa);
        if (hg_topk_row(exact, to - from, left, pos, isa >= 1, NULL) < 0) return -1;
    }
    ascending(best, used); /* pages are disjoint runs of slots: in page order the ids ascend */
    int32_t *ids = (int32_t *)(intptr_t)j->ids + g * j->kmax;
    int64_t o = 0;
    for (int64_t i = 0; i < used; i++) {
        const int64_t from = best[i] * P, to = from + P < n ? from + P : n;
        if (best[i] == partial) for (int64_t t = 0; t < left; t++) ids[o++] = (int32_t)(from + pos[t]);
        else for (int64_t s = from; s < to; s++) ids[o++] = (int32_t)s;
    }
    ((int32_t *)(intptr_t)j->counts)[g] = (int32_t)o;
    return 0;
}

/* List g: the best `want` pages by bound, then hg_pages_to_list. */
static void choose_task(void *v, int g, int parts) {
    (void)parts;
    quest_run *r = v;
    const int64_t P = r->j->page_size;
    int32_t *best = (int32_t *)(r->lists + g * r->list_bytes), *pos = best + r->want + P;
    float *exact = (float *)(best + r->want);
    const float *row = r->bounds + g * r->count;
    if (hg_topk_row(row, r->count, r->want, best, r->avx2, NULL) < 0) { r->failed = 1; return; }
    by_bound_desc(best, r->want, row);
    if (hg_pages_to_list(r->j, g, best, r->want, r->k, r->group, exact, pos, r->isa) < 0) r->failed = 1;
}

int64_t hg_quest_select(hg_pool *pool, const hg_stage_job *j, int isa, char **buf, size_t *bytes) {
    const int threads = hg_pool_threads(pool);
    const int64_t P = j->page_size, k = j->budget < j->n ? j->budget : j->n, count = (j->n + P - 1) / P;
    quest_run r = {.j = j, .count = count, .k = k, .group = j->heads / j->kv_heads, .isa = isa, .avx2 = isa >= 1};
    r.want = (k + P - 1) / P + 1 < count ? (k + P - 1) / P + 1 : count;
    r.list_bytes = ((r.want + 2 * P) * 4 + 63) & ~(int64_t)63;
    const size_t bb = ((size_t)(j->kv_heads * count) * 4 + 63) & ~(size_t)63, need = bb + (size_t)(j->kv_heads * r.list_bytes);
    if (*bytes < need) {
        free(*buf);
        *buf = aligned_alloc(64, (need + 63) & ~(size_t)63);
        *bytes = *buf ? need : 0;
        if (!*buf) return -2;
    }
    r.bounds = (float *)*buf;
    r.lists = *buf + bb;
    atomic_init(&r.failed, 0);
    /* about 64 pages a piece at least (each reads 2·head_dim floats per query head), up to 4 per thread */
    const int64_t per = (4 * threads + j->kv_heads - 1) / j->kv_heads, most = (count + 63) / 64;
    r.chunks = per < most ? per : most;
    if (r.chunks < 1) r.chunks = 1;
    hg_pool_run(pool, bound_task, &r, (int)(j->kv_heads * r.chunks));
    if (k == 0) {
        for (int64_t g = 0; g < j->kv_heads; g++) ((int32_t *)(intptr_t)j->counts)[g] = 0;
        return 0;
    }
    hg_pool_run(pool, choose_task, &r, (int)j->kv_heads); /* a list per thread, as the stage's top-K */
    return atomic_load(&r.failed) ? -2 : 0;
}
