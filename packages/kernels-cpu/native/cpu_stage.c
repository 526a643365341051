/* The hybrid CPU stage on threads of its own: a coordinator pthread that takes JS's queued jobs
 * in order, with an hg_ctx (its own thread pool and kernel table) for the parallel parts.
 * The logits reuse the ISA kernel of hg_attn_logits; a top-K job's scoring also takes each token's
 * group max from a block of logits it just wrote (in L2), so the top-K phase reads only those
 * rows, all lists at once (hg_topk_rows, topk_row.h); the V gather is row memcpy into the staging
 * buffer the device reads.
 * Each job records how long its phases took; a wait reports their sums (hg_stage_last_split). */
#include "cpu_stage.h"
#include "ctx.h"
#include "topk_row.h"
#include "kq.h"
#include "sel_quest.h"
#include "sel_index.h"
#include "file_rows.h"
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void relax(void) { _mm_pause(); }
#else
static inline void relax(void) { }
#endif

/* How long the coordinator spins for the next job, and JS for the job's end, before sleeping
 * on a condition variable. Spinning saves a wake-up (~10-50 µs) per layer on a machine with
 * cores to spare, but on an oversubscribed one a spinning thread steals the core the other
 * side needs (measured: 2 cores shared with other work, 5 ms of spin made waits 30x longer),
 * so the default is to sleep at once. */
#define DEFAULT_IDLE_SPIN_NS 0
#define DEFAULT_READ_DEPTH 8
#define DEFAULT_READY_TIMEOUT_NS 10000000000LL

/* What one job runs on: a context (pool, kernels) and the job's scratch. The stage's own worker has
 * the stage's pool; a group's jobs run one a pool thread, each on a one-thread worker of its own. */
typedef struct {
    hg_stage *st;
    hg_ctx *ctx;
    int64_t cur[4]; /* the running job's phases: query pack, score, top-K, gather */
    float *scratch; /* top-K: each KV head's group max [kv_heads][n], the shared row [n], then the group max rows' sample [kv_heads][S] */
    size_t scratch_bytes;
    char *two; /* two-step: packed query, candidates, their exact logits and group max, positions */
    size_t two_bytes;
    char *quest; /* Quest: page bounds and each list's pages, scores and positions */
    size_t quest_bytes;
    char *index; /* the page index's per-list scratch */
    size_t index_bytes;
    hg_rows_io io; /* disk-tier rows of the job: segments, queued reads, failure */
    hg_readers *readers;
    char jerr[768]; /* the running job's failure */
} hg_worker;

/* A lane's jobs since its last wait (under mu): counts, first failure, summed busy ns, phases [0, 5) and reads. */
typedef struct {
    int64_t queued, finished, waited;
    int64_t rc, ns, split[5], reads[2], end_ns;
    atomic_int cancelled; /* a wait for a ready signal stops */
    char err[768];
} hg_lane;

struct hg_stage {
    hg_worker main;
    hg_worker *solo;  /* a group's workers (the coordinator's), grown to the largest group */
    int nsolo;
    hg_worker *caller; /* hg_stage_run's on a stage of several lanes (another lane may hold the pool) */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t job_cv, done_cv;
    /* The queue: counters only grow; a job's entry is its number % cap. Jobs [taken, queued) wait,
     * [finished, taken) run. JS alone submits, so an entry is rewritten only after its job ended. */
    hg_stage_job *ring;
    int64_t *submit_at;
    int32_t *group; /* at a group's first entry: its jobs (1: a job alone) */
    int64_t cap;
    int lanes;
    hg_lane *lane;
    _Alignas(64) atomic_llong queued;
    _Alignas(64) atomic_llong finished;
    int64_t taken;  /* the coordinator's */
    atomic_int stop;
    int started;
    /* The last wait's (or run's): its result and sums; split[5] is wait's own hand-off. */
    int64_t result, last_ns, split[6], last_reads[2];
    char err[768];
    int64_t idle_spin_ns, ready_timeout_ns;
    int64_t prev_end_ns;    /* the coordinator's last job's end */
    int read_depth;
    int64_t groups[2]; /* groups of two jobs or more: run at once, one after another */
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t esize(int64_t type) { return type == HG_F32 ? 4 : 2; }

/* ---- parallel pieces ------------------------------------------------------------------ */
typedef struct {
    hg_worker *s; const hg_stage_job *j; hg_logits_args a; const float *qp; int64_t qs; int chunks;
    float *sample; int64_t ns; /* fused top-K: hg_topk_rows's sample, ns values a KV head */
    int64_t k; int avx2; atomic_int failed; /* two-step: the final K */
    hg_kq_query kq; int32_t *cand; float *exact, *cmax; int32_t *pos; int64_t nc; /* two-step */
    int file_rows; /* valid rows are read afterwards (disk tier): the pieces only zero the padding */
} run_ctx;

/* Contiguous runs of the (KV head, token) space: long streams of one head's rows per piece. */
static void score_task(void *v, int part, int parts) {
    run_ctx *r = v;
    int64_t b, e;
    hg_split(r->a.count * r->a.kv_heads, 16, part, parts, &b, &e);
    if (b < e) r->s->ctx->k->attn_logits(&r->a, b, e);
}

/* gm[i] = the max of the group's logits rows L + h*lstride at token i, for i in [b, e): NaN never
 * wins, -inf when every one is NaN (hg_topk_row ranks -inf above NaN). Token-outer, so each max
 * stays in a register across the heads (head-outer loads and stores gm once per head). */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static void group_max_avx2(const float *L, int64_t ls, int64_t group, float *gm, int64_t b, int64_t e) {
    int64_t i = b;
    for (; i + 8 <= e; i += 8) {
        __m256 m = _mm256_set1_ps(-INFINITY);
        for (int64_t h = 0; h < group; h++) m = _mm256_max_ps(_mm256_loadu_ps(L + h * ls + i), m); /* x > m ? x : m */
        _mm256_storeu_ps(gm + i, m);
    }
    for (; i < e; i++) {
        float m = -INFINITY;
        for (int64_t h = 0; h < group; h++) m = L[h * ls + i] > m ? L[h * ls + i] : m;
        gm[i] = m;
    }
}
#endif
static void group_max(const float *L, int64_t ls, int64_t group, float *gm, int64_t b, int64_t e, int avx2) {
#if defined(__x86_64__)
    if (avx2) {
        group_max_avx2(L, ls, group, gm, b, e);
        return;
    }
#endif
    (void)avx2;
    for (int64_t i = b; i < e; i++) {
        float m = -INFINITY;
        for (int64_t h = 0; h < group; h++) m = L[h * ls + i] > m ? L[h * ls + i] : m;
        gm[i] = m;
    }
}

/* Top-K's scoring: score_task's pieces, each block of up to GMAX_BLOCK tokens of a KV head scored
 * and then folded into its group max while its logits are still in L2 (a pass after all the
 * scoring reads heads x n x 4 bytes back from L3 or DRAM). Smaller blocks, for L1, cost more in
 * calls of the logits kernel than they save; its results do not depend on where a range starts,
 * so the logits are score_task's. */
#define GMAX_BLOCK 4096
static void score_gmax_task(void *v, int part, int parts) {
    run_ctx *r = v;
    const hg_stage_job *j = r->j;
    const int64_t n = j->n, group = j->heads / j->kv_heads;
    int64_t b, e;
    hg_split(n * j->kv_heads, 16, part, parts, &b, &e);
    for (int64_t f = b; f < e;) {
        const int64_t g = f / n, i0 = f - g * n, end = e - g * n < n ? e - g * n : n, i1 = i0 + GMAX_BLOCK < end ? i0 + GMAX_BLOCK : end;
        r->s->ctx->k->attn_logits(&r->a, f, g * n + i1);
        float *gm = r->s->scratch + g * n;
        group_max((const float *)(intptr_t)j->all_logits + g * group * j->lstride, j->lstride, group, gm, i0, i1, r->s->ctx->isa >= 1);
        /* the sample positions (2q+1)*n/(2S) in [i0, i1): the first q has (2q+1)*n >= 2S*i0 */
        const int64_t S = r->ns;
        for (int64_t q = 2 * S * i0 > n ? (2 * S * i0 - n + 2 * n - 1) / (2 * n) : 0, p; q < S && (p = (2 * q + 1) * n / (2 * S)) < i1; q++)
            r->sample[g * S + q] = gm[p];
        f = g * n + i1;
    }
}

/* ---- two-step top-K ------------------------------------------------------------------- */
/* Rows [kq_from, n) of KV head (part / chunks) into the compressed copy. */
static void encode_task(void *v, int part, int parts) {
    (void)parts;
    run_ctx *r = v;
    const hg_stage_job *j = r->j;
    const int64_t g = part / r->chunks;
    int64_t b, e;
    hg_split(j->n - j->kq_from, 1, part % r->chunks, r->chunks, &b, &e);
    const int64_t rb = hg_kq_row_bytes((int)j->kq_form, j->head_dim), row = j->head_dim * esize(j->ktype);
    const char *k = (const char *)(intptr_t)j->k + g * j->kcap * row;
    uint8_t *out = (uint8_t *)(intptr_t)j->kq + g * j->kcap * rb;
    /* a one-head view: rows of head g start at k, records at out */
    hg_kq_encode((int)j->kq_form, k, (int)j->ktype, 1, j->kcap, j->head_dim, j->kq_from + b, j->kq_from + e, out);
}

/* Approximate scores: contiguous runs of the (KV head, token) space, as score_task. */
static void approx_task(void *v, int part, int parts) {
    run_ctx *r = v;
    const hg_stage_job *j = r->j;
    const int64_t n = j->n;
    int64_t b, e;
    hg_split(n * j->kv_heads, 16, part, parts, &b, &e);
    for (int64_t g = b / n; g < j->kv_heads && g * n < e; g++) {
        const int64_t j0 = b - g * n > 0 ? b - g * n : 0, j1 = e - g * n < n ? e - g * n : n;
        hg_kq_score_rows(&r->kq, (const uint8_t *)(intptr_t)j->kq, j->kcap, g, j0, j1, r->s->scratch + g * n, r->s->ctx->isa);
    }
}

/* Exact logits of KV head g's candidates (the shared list for every head when shared), for the
 * group's heads, into exact[h][nc]; pieces over (KV head, chunk of candidates). */
static void rescore_task(void *v, int part, int parts) {
    (void)parts;
    run_ctx *r = v;
    const hg_stage_job *j = r->j;
    const int64_t g = part / r->chunks, group = j->heads / j->kv_heads, nc = r->nc;
    const int32_t *ids = r->cand + ((j->flags & HG_STAGE_SHARED) ? 0 : g * nc);
    int64_t b, e;
    hg_split(nc, 16, part % r->chunks, r->chunks, &b, &e);
    if (b >= e) return;
    hg_logits_args a = {
        r->exact + g * group * nc, r->qp + g * r->qs, hg_stage_k_head(j, g),
        ids, nc, j->kcap, 0, nc, (int)j->ktype, (int)group, 1, (int)j->head_dim, (float)j->scale,
    };
    r->s->ctx->k->attn_logits(&a, b, e);
}

/* List g: the group max (all heads when shared) of its candidates' exact logits, the top-K of
 * those (positions in the candidate list, for the gather's logits) and their ids. */
static void final_task(void *v, int g, int parts) {
    (void)parts;
    run_ctx *r = v;
    const hg_stage_job *j = r->j;
    const int shared = (j->flags & HG_STAGE_SHARED) != 0;
    const int64_t nc = r->nc, group = j->heads / j->kv_heads, h0 = shared ? 0 : g * group, h1 = shared ? j->heads : h0 + group;
    const int32_t *cand = r->cand + (size_t)g * nc;
    float *cm = r->cmax + (size_t)g * nc;
    for (int64_t i = 0; i < nc; i++) cm[i] = -INFINITY;
    for (int64_t h = h0; h < h1; h++) {
        const float *x = r->exact + h * nc;
        for (int64_t i = 0; i < nc; i++) cm[i] = x[i] > cm[i] ? x[i] : cm[i];
    }
    int32_t *pos = r->pos + (size_t)g * r->k, *ids = (int32_t *)(intptr_t)j->ids + g * j->kmax;
    if (hg_topk_row(cm, nc, r->k, pos, r->avx2, NULL) < 0) {
        r->failed = 1;
        return;
    }
    for (int64_t i = 0; i < r->k; i++) ids[i] = cand[pos[i]]; /* positions ascend, so do the ids */
}

static int64_t two_step(hg_worker *s, const hg_stage_job *j, run_ctx *r, int threads, int64_t *t) {
    int64_t t1;
#define LAP(i) (t1 = now_ns(), s->cur[i] += t1 - *t, *t = t1)
    const int shared = (j->flags & HG_STAGE_SHARED) != 0, lists = shared ? 1 : (int)j->kv_heads;
    const int64_t n = j->n, k = j->budget < n ? j->budget : n, nc = j->cand < k ? k : j->cand < n ? j->cand : n;
    const int64_t qb = (hg_kq_query_bytes((int)j->kq_form, j->heads, j->head_dim) + 63) & ~(int64_t)63;
    const size_t need = (size_t)qb + (size_t)lists * nc * 8 + (size_t)j->heads * nc * 4 + (size_t)lists * k * 4 + 256;
    if (s->two_bytes < need) {
        free(s->two);
        s->two = aligned_alloc(64, (need + 63) & ~(size_t)63);
        s->two_bytes = s->two ? need : 0;
        if (!s->two) return -2;
    }
    hg_kq_pack_query(&r->kq, (int)j->kq_form, (const float *)(intptr_t)j->q, j->heads, j->kv_heads, j->head_dim, s->two);
    r->cand = (int32_t *)(s->two + qb);
    r->cmax = (float *)(r->cand + (size_t)lists * nc);
    r->exact = r->cmax + (size_t)lists * nc;
    r->pos = (int32_t *)(r->exact + (size_t)j->heads * nc);
    r->nc = nc;
    LAP(0);
    if (j->kq_from < n) { /* rows evicted since the last job */
        const int64_t rows = n - j->kq_from, most = (rows + 63) / 64, per = (2 * threads + j->kv_heads - 1) / j->kv_heads;
        r->chunks = (int)(per < most ? per : most);
        hg_pool_run(s->ctx->pool, encode_task, r, (int)j->kv_heads * r->chunks);
    }
    hg_pool_run(s->ctx->pool, approx_task, r, n * j->kv_heads < 4096 ? 1 : 4 * threads);
    LAP(1);
    if (hg_topk_rows(s->scratch, shared ? j->kv_heads : 1, s->scratch + (size_t)j->kv_heads * n, NULL, lists, n, nc, r->cand, nc, r->avx2,
                     s->ctx->pool) < 0)
        return -2;
    LAP(2);
    {
        int64_t per = (4 * threads + j->kv_heads - 1) / j->kv_heads, most = (nc + 63) / 64;
        r->chunks = (int)(per < most ? per : most);
        if (r->chunks < 1) r->chunks = 1;
        hg_pool_run(s->ctx->pool, rescore_task, r, (int)j->kv_heads * r->chunks);
    }
    LAP(1);
    r->k = k;
    hg_pool_run(s->ctx->pool, final_task, r, lists);
    if (atomic_load(&r->failed)) return -2;
    int32_t *ids = (int32_t *)(intptr_t)j->ids, *counts = (int32_t *)(intptr_t)j->counts;
    for (int64_t g = 0; g < j->kv_heads; g++) {
        counts[g] = (int32_t)k;
        if (shared && g > 0) memcpy(ids + g * j->kmax, ids, (size_t)k * sizeof(int32_t));
    }
    LAP(2);
#undef LAP
    return 0;
}

/* Rows ids[b..e) of KV head g of a [kv_heads, cap, head_dim] store into dst's [kv_heads, kmax, head_dim];
 * rows past the list's count are zeros. */
static void gather_rows(const char *src, int64_t cap, int64_t type, char *dst, const hg_stage_job *j, int64_t g, const int32_t *ids,
                        int64_t b, int64_t e, int64_t cnt, int padding_only) {
    int64_t row = j->head_dim * esize(type), ve = e < cnt ? e : cnt;
    const char *S = src + g * cap * row;
    char *D = dst + g * j->kmax * row;
    if (padding_only) b = b > cnt ? b : cnt;
    for (int64_t i = b; i < e; i++) {
        if (i + 8 < ve) /* scattered rows: keep misses in flight ahead of the copies */
            for (int64_t o = 0; o < row; o += 64) __builtin_prefetch(S + (int64_t)ids[i + 8] * row + o, 0, 1);
        if (i < cnt) memcpy(D + i * row, S + (int64_t)ids[i] * row, (size_t)row);
        else memset(D + i * row, 0, (size_t)row);
    }
}

/* Pieces over (KV head, chunk of its list): selected logits and/or the V (and K) gather. */
static void selected_task(void *v, int part, int parts) {
    (void)parts;
    run_ctx *r = v;
    const hg_stage_job *j = r->j;
    int64_t g = part / r->chunks, c = part % r->chunks, group = j->heads / j->kv_heads, kmax = j->kmax;
    const int32_t *ids = (const int32_t *)(intptr_t)j->ids + g * kmax;
    int64_t cnt = ((const int32_t *)(intptr_t)j->counts)[g];
    int64_t b, e;
    hg_split(kmax, 16, (int)c, r->chunks, &b, &e);
    float *sel = (float *)(intptr_t)j->sel_logits;
    int64_t vb = b, ve = e < cnt ? e : cnt; /* valid part of this chunk */
    if (j->flags & HG_STAGE_SELECTED) {
        if (vb < ve) {
            hg_logits_args a = {
                sel + g * group * kmax, r->qp + g * r->qs,
                hg_stage_k_head(j, g),
                ids, kmax, j->kcap, 0, cnt, (int)j->ktype, (int)group, 1, (int)j->head_dim, (float)j->scale,
            };
            r->s->ctx->k->attn_logits(&a, vb, ve);
        }
    } else if (r->pos) { /* two-step: the rescored logits of the chosen candidates */
        const int32_t *pos = r->pos + ((j->flags & HG_STAGE_SHARED) ? 0 : g * r->k);
        for (int64_t h = g * group; h < (g + 1) * group; h++)
            for (int64_t i = vb; i < ve; i++) sel[h * kmax + i] = r->exact[h * r->nc + pos[i]];
    } else {
        const float *L = (const float *)(intptr_t)j->all_logits;
        for (int64_t h = g * group; h < (g + 1) * group; h++)
            for (int64_t i = vb; i < ve; i++) sel[h * kmax + i] = L[h * j->lstride + ids[i]];
    }
    for (int64_t h = g * group; h < (g + 1) * group; h++)
        for (int64_t i = (b > cnt ? b : cnt); i < e; i++) sel[h * kmax + i] = -INFINITY;
    if (j->flags & HG_STAGE_NO_ROWS) return; /* the device gathers the rows from the mapped store */
    gather_rows((const char *)(intptr_t)j->v, j->vcap, j->vtype, (char *)(intptr_t)j->vstage, j, g, ids, b, e, cnt, r->file_rows);
    if (j->flags & HG_STAGE_KEYS)
        gather_rows((const char *)(intptr_t)j->k, j->kcap, j->ktype, (char *)(intptr_t)j->kstage, j, g, ids, b, e, cnt, r->file_rows);
}

/* ---- disk-tier rows ---------------------------------------------------------------------- */
/* The registered file segments under the job's V (and K) store: nonzero when its rows must be read. */
static int file_rows_begin(hg_worker *s, const hg_stage_job *j) { /* s->io was emptied at run_job's start */
    if (s->st->read_depth <= 0 || (j->flags & HG_STAGE_NO_ROWS)) return 0;
    hg_rows_acquire(&s->io, (uintptr_t)j->v, (uint64_t)(j->kv_heads * j->vcap * j->head_dim * esize(j->vtype)));
    if (j->flags & HG_STAGE_KEYS) hg_rows_acquire(&s->io, (uintptr_t)j->k, (uint64_t)(j->kv_heads * j->kcap * j->head_dim * esize(j->ktype)));
    return s->io.nseg > 0;
}

static int queue_rows(hg_worker *s, const hg_stage_job *j, const char *src, int64_t cap, int64_t type, char *dst) {
    const int32_t *ids = (const int32_t *)(intptr_t)j->ids, *counts = (const int32_t *)(intptr_t)j->counts;
    const int64_t row = j->head_dim * esize(type);
    for (int64_t g = 0; g < j->kv_heads; g++)
        for (int64_t i = 0; i < counts[g]; i++)
            if (hg_rows_add(&s->io, dst + (g * j->kmax + i) * row, (uintptr_t)(src + (g * cap + ids[g * j->kmax + i]) * row), (uint64_t)row)) return -2;
    return 0;
}

/* The selected rows, read from the files where they live (memcpy elsewhere): 0, -2, or 1 (s->jerr). */
static int64_t read_rows(hg_worker *s, const hg_stage_job *j) {
    int64_t rc = queue_rows(s, j, (const char *)(intptr_t)j->v, j->vcap, j->vtype, (char *)(intptr_t)j->vstage);
    if (!rc && (j->flags & HG_STAGE_KEYS)) rc = queue_rows(s, j, (const char *)(intptr_t)j->k, j->kcap, j->ktype, (char *)(intptr_t)j->kstage);
    if (!rc && hg_rows_run(&s->io, s->ctx->pool, &s->readers, s->st->read_depth)) {
        hg_rows_error(&s->io, s->jerr, sizeof s->jerr);
        rc = 1;
    }
    hg_rows_release(&s->io);
    return rc;
}

/* ---- one job --------------------------------------------------------------------------- */
/* StreamingLLM's list, written here on the coordinator rather than by JS at submit: a queued job's
 * slot may still be read by the job before it (layers l and l + 2 share a slot). */
static void stream_select(const hg_stage_job *j) {
    int32_t *ids = (int32_t *)(intptr_t)j->ids, *counts = (int32_t *)(intptr_t)j->counts;
    const int64_t k = j->budget < j->n ? j->budget : j->n, s = j->sinks < k ? j->sinks : k, recent = k - s;
    for (int64_t i = 0; i < s; i++) ids[i] = (int32_t)i;
    for (int64_t i = 0; i < recent; i++) ids[s + i] = (int32_t)(j->n - recent + i);
    for (int64_t g = 0; g < j->kv_heads; g++) {
        counts[g] = (int32_t)k;
        if (g > 0) memcpy(ids + g * j->kmax, ids, (size_t)k * sizeof(int32_t));
    }
}

static int64_t check_ids(const hg_stage_job *j) {
    const int32_t *ids = (const int32_t *)(intptr_t)j->ids, *counts = (const int32_t *)(intptr_t)j->counts;
    for (int64_t g = 0; g < j->kv_heads; g++) {
        if (counts[g] < 0 || counts[g] > j->kmax) return -(3 + g * j->kmax);
        for (int64_t i = 0; i < counts[g]; i++) {
            int32_t id = ids[g * j->kmax + i];
            if (id < 0 || id >= j->n || (i > 0 && id <= ids[g * j->kmax + i - 1])) return -(3 + g * j->kmax + i);
        }
    }
    return 0;
}

static int64_t run_job(hg_worker *s, const hg_stage_job *j) {
    int threads = hg_pool_threads(s->ctx->pool);
    run_ctx r = {.s = s, .j = j, .chunks = 1};
    int64_t t = now_ns(), t1;
#define LAP(i) (t1 = now_ns(), s->cur[i] += t1 - t, t = t1)
    if (j->flags & (HG_STAGE_SCORE | HG_STAGE_TOPK | HG_STAGE_SELECTED)) { /* the query, packed once for the logits kernel */
        const hg_kernels *k = s->ctx->k;
        r.qs = k->attn_qfloats((int)(j->heads / j->kv_heads), 1, (int)j->head_dim, (int)j->ktype); /* per KV head */
        float *qp = hg_grow(&s->ctx->qpack, &s->ctx->qpack_bytes, (size_t)(j->kv_heads * r.qs) * sizeof(float));
        if (!qp) return -2;
        k->attn_qpack(qp, (const float *)(intptr_t)j->q, (int)j->heads, (int)j->kv_heads, (int)j->head_dim, (int)j->ktype);
        r.qp = qp;
        LAP(0);
    }
    const int topk = (j->flags & HG_STAGE_TOPK) != 0, shared = (j->flags & HG_STAGE_SHARED) != 0;
    if (topk) {
        r.ns = hg_topk_rows_sample(j->n);
        size_t need = ((size_t)(j->kv_heads + shared) * (size_t)j->n + (size_t)(j->kv_heads * r.ns)) * sizeof(float);
        if (s->scratch_bytes < need) {
            free(s->scratch);
            s->scratch = malloc(need);
            s->scratch_bytes = s->scratch ? need : 0;
            if (!s->scratch) return -2;
        }
        r.sample = s->scratch + (size_t)(j->kv_heads + shared) * (size_t)j->n;
    }
    if (topk && j->kq_form) {
        r.avx2 = s->ctx->isa >= 1;
        atomic_init(&r.failed, 0);
        int64_t rc = two_step(s, j, &r, threads, &t);
        if (rc) return rc;
    } else if (j->flags & (HG_STAGE_SCORE | HG_STAGE_TOPK)) {
        r.a = (hg_logits_args){(float *)(intptr_t)j->all_logits, r.qp, (const void *)(intptr_t)j->k, NULL, j->lstride, j->kcap, 0,
                               j->n, (int)j->ktype, (int)j->heads, (int)j->kv_heads, (int)j->head_dim, (float)j->scale};
        int64_t work = j->n * j->heads * j->head_dim;
        int parts = work < 32768 ? 1 : 4 * threads;
        hg_pool_run(s->ctx->pool, topk ? score_gmax_task : score_task, &r, parts);
        LAP(1);
    }
    if (topk && !j->kq_form) { /* the group max rows came with the scores */
        int32_t *ids = (int32_t *)(intptr_t)j->ids, *counts = (int32_t *)(intptr_t)j->counts;
        const int64_t k = j->budget < j->n ? j->budget : j->n;
        if (hg_topk_rows(s->scratch, shared ? j->kv_heads : 1, s->scratch + (size_t)j->kv_heads * j->n, r.sample, shared ? 1 : j->kv_heads, j->n, k,
                         ids, j->kmax, s->ctx->isa >= 1, s->ctx->pool) < 0)
            return -2;
        for (int64_t g = 0; g < j->kv_heads; g++) {
            counts[g] = (int32_t)k;
            if (shared && g > 0) memcpy(ids + g * j->kmax, ids, (size_t)k * sizeof(int32_t));
        }
        LAP(2);
    } else if (j->flags & HG_STAGE_QUEST) {
        int64_t rc = hg_quest_select(s->ctx->pool, j, s->ctx->isa, &s->quest, &s->quest_bytes);
        if (rc) return rc;
        LAP(2);
    } else if (j->flags & HG_STAGE_INDEX) {
        int64_t rc = hg_index_select(s->ctx->pool, j, s->ctx->isa, &s->index, &s->index_bytes, s->jerr, sizeof s->jerr);
        if (rc) return rc;
        LAP(2);
    } else if (j->flags & HG_STAGE_STREAM) {
        if (j->budget < 0 || j->budget > j->kmax || j->sinks < 0) {
            snprintf(s->jerr, sizeof s->jerr, "cpu stage: streaming budget %lld (width %lld) or sinks %lld out of range",
                     (long long)j->budget, (long long)j->kmax, (long long)j->sinks);
            return 1;
        }
        stream_select(j);
        LAP(2);
    } else if (!topk && (j->flags & (HG_STAGE_SELECTED | HG_STAGE_GATHER))) {
        int64_t bad = check_ids(j);
        if (bad) return bad;
    }
    if (j->flags & (HG_STAGE_SELECTED | HG_STAGE_GATHER)) {
        int64_t per = (4 * threads + j->kv_heads - 1) / j->kv_heads;
        int64_t most = (j->kmax + 15) / 16;
        r.chunks = (int)(per < most ? per : most);
        if (r.chunks < 1) r.chunks = 1;
        if (j->kmax * j->heads * j->head_dim < 16384) r.chunks = 1;
        r.file_rows = file_rows_begin(s, j);
        hg_pool_run(s->ctx->pool, selected_task, &r, (int)(j->kv_heads * r.chunks));
        if (r.file_rows) {
            int64_t rc = read_rows(s, j);
            if (rc) return rc;
        }
        /* without rows a selected job's phase is its selected logits: scoring, so gather stays ~0 */
        if ((j->flags & HG_STAGE_NO_ROWS) && (j->flags & HG_STAGE_SELECTED)) LAP(1);
        else LAP(3);
    }
#undef LAP
    return 0;
}

/* The job's ready signal: spin (a device's copy lands within a layer's time) until the word
 * reaches ready_value, modulo 2^32; 1 with the reason in s->jerr when it never does, or when a
 * queued job's lane is cancelled meanwhile. */
static int64_t await_ready(hg_worker *s, const hg_stage_job *j, int queued) {
    if (!j->ready) return 0;
    const volatile uint32_t *word = (const volatile uint32_t *)(intptr_t)j->ready;
    const uint32_t want = (uint32_t)j->ready_value;
    const int64_t t0 = now_ns();
    atomic_int *cancelled = &s->st->lane[j->lane].cancelled;
    while ((int32_t)(*word - want) < 0) {
        for (int i = 0; i < 16; i++) relax();
        if (queued && atomic_load_explicit(cancelled, memory_order_relaxed)) {
            snprintf(s->jerr, sizeof s->jerr, "cpu stage: cancelled");
            return 1;
        }
        if (now_ns() - t0 > s->st->ready_timeout_ns) {
            snprintf(s->jerr, sizeof s->jerr, "cpu stage: the device never signalled the query's copy (waited %.1f s for value %u, the word holds %u)",
                     (double)s->st->ready_timeout_ns / 1e9, want, *word);
            return 1;
        }
    }
    atomic_thread_fence(memory_order_acquire);
    return 0;
}

/* The job after its ready signal: its busy ns into *ns, its phases in s->cur. */
static int64_t timed(hg_worker *s, const hg_stage_job *j, int queued, int64_t *ns) {
    hg_rows_begin(&s->io); /* the job's read counters start at 0 */
    for (int i = 0; i < 4; i++) s->cur[i] = 0;
    *ns = 0;
    int64_t rc = await_ready(s, j, queued);
    if (rc) return rc;
    int64_t t0 = now_ns(); /* the wait for the device is not the stage's work */
    rc = run_job(s, j);
    *ns = now_ns() - t0;
    return rc;
}

/* The device may read the job's outputs once it sees the word: they are stored before it. */
static void raise_done(const hg_stage_job *j, int failed) {
    if (!j->done || ((j->flags & HG_STAGE_DONE_IF_FAILED) && !failed)) return;
    atomic_thread_fence(memory_order_release);
    *(volatile uint32_t *)(intptr_t)j->done = (uint32_t)j->done_value;
}

/* One queued job on worker w: run it (or skip it when its lane already failed), raise its done, add it up in its lane. */
static void run_queued(hg_stage *s, hg_worker *w, int64_t i, int64_t handoff) {
    const hg_stage_job *j = &s->ring[i];
    hg_lane *l = &s->lane[j->lane];
    pthread_mutex_lock(&s->mu);
    const int skip = l->rc != 0;
    pthread_mutex_unlock(&s->mu);
    int64_t ns = 0, rc = 0;
    if (!skip) rc = timed(w, j, 1, &ns);
    const int64_t end = now_ns();
    raise_done(j, skip || rc);
    pthread_mutex_lock(&s->mu);
    if (rc && !l->rc) {
        l->rc = rc;
        memcpy(l->err, w->jerr, sizeof l->err);
    }
    if (!skip) {
        l->ns += ns;
        for (int p = 0; p < 4; p++) l->split[p] += w->cur[p];
        l->split[4] += handoff > 0 ? handoff : 0;
        l->reads[0] += atomic_load(&w->io.reads);
        l->reads[1] += atomic_load(&w->io.bytes);
    }
    l->end_ns = end;
    l->finished++;
    atomic_store_explicit(&s->finished, atomic_load(&s->finished) + 1, memory_order_release);
    pthread_cond_broadcast(&s->done_cv);
    pthread_mutex_unlock(&s->mu);
}

static int worker_init(hg_worker *w, hg_stage *s, int threads, int isa) {
    memset(w, 0, sizeof *w);
    w->st = s;
    w->ctx = hg_create(threads, isa);
    return w->ctx ? 0 : -1;
}

static void worker_free(hg_worker *w) {
    if (!w->ctx) return;
    hg_destroy(w->ctx);
    free(w->scratch);
    free(w->two);
    free(w->quest);
    free(w->index);
    free(w->io.reqs);
    hg_readers_destroy(w->readers);
    w->ctx = NULL;
}

/* A group's jobs, one a piece: each on its own one-thread worker, its done raised as it ends. */
typedef struct {
    hg_stage *s;
    int64_t first, start;
} group_run;

static void group_task(void *v, int part, int parts) {
    (void)parts;
    group_run *g = v;
    hg_stage *s = g->s;
    const int64_t i = (g->first + part) % s->cap;
    run_queued(s, &s->solo[part], i, g->start - s->submit_at[i]);
}

/* A job's bytes read: its scoring's K rows, its selected rows (K for pre-QKᵀ logits; V, and K too, unless the device reads them). */
static double job_bytes(const hg_stage_job *j) {
    const double row = (double)(j->kv_heads * j->head_dim * esize(j->ktype));
    double b = (j->flags & (HG_STAGE_SCORE | HG_STAGE_TOPK)) ? (double)j->n * row : 0.0;
    if (j->flags & (HG_STAGE_SELECTED | HG_STAGE_GATHER)) {
        const int copies = (j->flags & HG_STAGE_NO_ROWS) ? 0 : 1 + ((j->flags & HG_STAGE_KEYS) != 0);
        b += (double)j->kmax * row * (copies + ((j->flags & HG_STAGE_SELECTED) != 0));
    }
    return b;
}

/* One thread's read rate and a job's fork-joins on the pool (its phases' ops), for choosing how a group runs. */
#define THREAD_BYTES_PER_S 4e9
#define POOL_JOB_S 40e-6

/* Whether the group's jobs [first, first + n) run at once, one a thread, rather than one after another on the
 * whole pool: the stage has helper threads, the lanes differ (a lane's jobs run in order), every job has a
 * worker, and by the jobs' bytes the longest job on one thread (in waves of the pool's threads) beats their
 * sum over the pool plus each job's fork-joins — many light jobs (a batch's chosen rows) at once, a few
 * heavy ones (top-K scans of long stores) each over every thread. */
static int group_parallel(hg_stage *s, int64_t first, int n) {
    const int threads = hg_pool_threads(s->main.ctx->pool);
    if (n < 2 || threads < 2) return 0;
    double most = 0.0, sum = 0.0;
    for (int a = 0; a < n; a++) {
        const hg_stage_job *j = &s->ring[(first + a) % s->cap];
        for (int b = 0; b < a; b++)
            if (j->lane == s->ring[(first + b) % s->cap].lane) return 0;
        const double t = job_bytes(j) / THREAD_BYTES_PER_S;
        sum += t;
        if (t > most) most = t;
    }
    if (most * (double)((n + threads - 1) / threads) > sum / threads + n * POOL_JOB_S) return 0;
    if (s->nsolo < n) {
        hg_worker *grown = realloc(s->solo, (size_t)n * sizeof *grown);
        if (!grown) return 0;
        s->solo = grown;
        for (; s->nsolo < n; s->nsolo++)
            if (worker_init(&s->solo[s->nsolo], s, 1, s->main.ctx->isa)) return 0;
    }
    return 1;
}

static void *coordinator(void *arg) {
    hg_stage *s = arg;
    for (;;) {
        int64_t t0 = now_ns();
        while (atomic_load_explicit(&s->queued, memory_order_acquire) == s->taken && !atomic_load(&s->stop)) {
            for (int i = 0; i < 64; i++) relax();
            if (now_ns() - t0 > s->idle_spin_ns) break;
        }
        pthread_mutex_lock(&s->mu);
        while (atomic_load(&s->queued) == s->taken && !atomic_load(&s->stop)) pthread_cond_wait(&s->job_cv, &s->mu);
        if (atomic_load(&s->queued) == s->taken) { /* stopped, nothing left */
            pthread_mutex_unlock(&s->mu);
            return NULL;
        }
        const int64_t first = s->taken;
        const int n = s->group[first % s->cap];
        s->taken += n;
        pthread_mutex_unlock(&s->mu);
        const int64_t start = now_ns();
        /* counted before the jobs run: a lane's wait returns as its job ends, the group may not have */
        if (group_parallel(s, first, n)) {
            s->groups[0]++;
            group_run g = {s, first, start};
            hg_pool_run(s->main.ctx->pool, group_task, &g, n);
            s->prev_end_ns = now_ns();
            continue;
        }
        if (n > 1) s->groups[1]++;
        for (int k = 0; k < n; k++) {
            const int64_t i = (first + k) % s->cap, at = now_ns();
            run_queued(s, &s->main, i, at - (s->submit_at[i] > s->prev_end_ns ? s->submit_at[i] : s->prev_end_ns));
            s->prev_end_ns = now_ns();
        }
    }
}

static void free_stage(hg_stage *s) {
    worker_free(&s->main);
    for (int i = 0; i < s->nsolo; i++) worker_free(&s->solo[i]);
    free(s->solo);
    if (s->caller) worker_free(s->caller);
    free(s->caller);
    free(s->ring);
    free(s->submit_at);
    free(s->group);
    free(s->lane);
    free(s);
}

hg_stage *hg_stage_create_lanes(int threads, int isa, int lanes) {
    if (lanes < 1 || lanes > HG_STAGE_LANES) return NULL;
    hg_stage *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->lanes = lanes;
    s->cap = (int64_t)HG_STAGE_QUEUE * lanes;
    s->ring = calloc((size_t)s->cap, sizeof *s->ring);
    s->submit_at = calloc((size_t)s->cap, sizeof *s->submit_at);
    s->group = calloc((size_t)s->cap, sizeof *s->group);
    s->lane = calloc((size_t)lanes, sizeof *s->lane);
    if (!s->ring || !s->submit_at || !s->group || !s->lane || worker_init(&s->main, s, threads > 0 ? threads : 1, isa)) {
        free_stage(s);
        return NULL;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->job_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    atomic_init(&s->queued, 0);
    atomic_init(&s->finished, 0);
    atomic_init(&s->stop, 0);
    for (int i = 0; i < lanes; i++) atomic_init(&s->lane[i].cancelled, 0);
    s->idle_spin_ns = DEFAULT_IDLE_SPIN_NS;
    s->read_depth = DEFAULT_READ_DEPTH;
    s->ready_timeout_ns = DEFAULT_READY_TIMEOUT_NS;
    if (pthread_create(&s->thread, NULL, coordinator, s) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->job_cv);
        pthread_cond_destroy(&s->done_cv);
        free_stage(s);
        return NULL;
    }
    s->started = 1;
    return s;
}

hg_stage *hg_stage_create(int threads, int isa) { return hg_stage_create_lanes(threads, isa, 1); }

void hg_stage_destroy(hg_stage *s) {
    if (!s) return;
    for (int l = 0; l < s->lanes; l++)
        if (s->lane[l].queued != s->lane[l].waited) {
            hg_stage_cancel_lane(s, l);
            hg_stage_wait_lane(s, l);
        }
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->stop, 1);
    pthread_cond_broadcast(&s->job_cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started) pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->job_cv);
    pthread_cond_destroy(&s->done_cv);
    free_stage(s);
}

int hg_stage_threads(const hg_stage *s) { return hg_pool_threads(s->main.ctx->pool); }

int hg_stage_queue_depth(const hg_stage *s) {
    (void)s;
    return HG_STAGE_QUEUE;
}

int hg_stage_lanes(const hg_stage *s) { return s->lanes; }

void hg_stage_group_counts(const hg_stage *s, int64_t *out) {
    out[0] = s->groups[0];
    out[1] = s->groups[1];
}

static int busy(hg_stage *s) { return atomic_load_explicit(&s->queued, memory_order_acquire) != atomic_load_explicit(&s->finished, memory_order_acquire); }

/* Selector primitives (sel_pool.h) borrow the pool between jobs; queued or running jobs own it. */
hg_pool *hg_stage_idle_pool(hg_stage *s) { return busy(s) ? NULL : s->main.ctx->pool; }

int hg_stage_submit_group(hg_stage *s, const hg_stage_job *jobs, int n) {
    if (n < 1) return -1;
    int64_t per[HG_STAGE_LANES] = {0};
    for (int k = 0; k < n; k++) {
        if (jobs[k].lane < 0 || jobs[k].lane >= s->lanes) return -2;
        per[jobs[k].lane]++;
    }
    pthread_mutex_lock(&s->mu);
    const int64_t q = atomic_load(&s->queued);
    int full = q + n - atomic_load_explicit(&s->finished, memory_order_acquire) > s->cap;
    for (int l = 0; l < s->lanes && !full; l++) full = per[l] && s->lane[l].queued + per[l] - s->lane[l].finished > HG_STAGE_QUEUE;
    if (full) {
        pthread_mutex_unlock(&s->mu);
        return -1;
    }
    const int64_t now = now_ns();
    for (int k = 0; k < n; k++) {
        const int64_t i = (q + k) % s->cap;
        s->ring[i] = jobs[k];
        s->submit_at[i] = now;
        s->group[i] = k == 0 ? n : 0;
        s->lane[jobs[k].lane].queued++;
    }
    atomic_store_explicit(&s->queued, q + n, memory_order_release);
    pthread_cond_signal(&s->job_cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int hg_stage_submit(hg_stage *s, const hg_stage_job *job) { return hg_stage_submit_group(s, job, 1); }

int64_t hg_stage_run(hg_stage *s, const hg_stage_job *job) {
    if (job->lane < 0 || job->lane >= s->lanes) return -1;
    const hg_lane *l = &s->lane[job->lane];
    hg_worker *w = &s->main;
    if (s->lanes > 1) {
        pthread_mutex_lock(&s->mu);
        const int mine = l->queued != l->finished;
        pthread_mutex_unlock(&s->mu);
        if (mine) return -1;
        if (!s->caller) {
            s->caller = malloc(sizeof *s->caller);
            if (!s->caller || worker_init(s->caller, s, 1, s->main.ctx->isa)) {
                free(s->caller);
                s->caller = NULL;
                return -2;
            }
        }
        w = s->caller;
    } else if (busy(s)) {
        return -1;
    }
    int64_t ns;
    int64_t rc = timed(w, job, 0, &ns);
    raise_done(job, rc != 0);
    s->result = rc;
    s->last_ns = ns;
    for (int i = 0; i < 4; i++) s->split[i] = w->cur[i];
    s->split[4] = s->split[5] = 0;
    s->last_reads[0] = atomic_load(&w->io.reads);
    s->last_reads[1] = atomic_load(&w->io.bytes);
    if (rc) memcpy(s->err, w->jerr, sizeof s->err);
    return rc;
}

int64_t hg_stage_wait_lane(hg_stage *s, int lane) {
    if (lane < 0 || lane >= s->lanes) return -1;
    hg_lane *l = &s->lane[lane];
    pthread_mutex_lock(&s->mu);
    const int64_t q = l->queued; /* JS alone submits: no job of the lane comes meanwhile */
    pthread_mutex_unlock(&s->mu);
    if (q == l->waited) return -1;
    int64_t called = now_ns(), t0 = called;
    while (s->idle_spin_ns > 0) {
        pthread_mutex_lock(&s->mu);
        const int done = l->finished == q;
        pthread_mutex_unlock(&s->mu);
        if (done) break;
        for (int i = 0; i < 64; i++) relax();
        if (now_ns() - t0 > s->idle_spin_ns) break;
    }
    pthread_mutex_lock(&s->mu);
    while (l->finished != q) pthread_cond_wait(&s->done_cv, &s->mu);
    s->result = l->rc;
    s->last_ns = l->ns;
    for (int i = 0; i < 5; i++) s->split[i] = l->split[i];
    s->last_reads[0] = l->reads[0];
    s->last_reads[1] = l->reads[1];
    if (l->rc) memcpy(s->err, l->err, sizeof s->err);
    l->rc = l->ns = 0;
    memset(l->split, 0, sizeof l->split);
    memset(l->reads, 0, sizeof l->reads);
    l->waited = q;
    atomic_store(&l->cancelled, 0);
    const int64_t end = l->end_ns;
    pthread_mutex_unlock(&s->mu);
    int64_t back = now_ns(), from = end > called ? end : called;
    s->split[5] = back > from ? back - from : 0;
    return s->result;
}

int64_t hg_stage_wait(hg_stage *s) { return hg_stage_wait_lane(s, 0); }

void hg_stage_cancel_lane(hg_stage *s, int lane) {
    if (lane < 0 || lane >= s->lanes) return;
    hg_lane *l = &s->lane[lane];
    pthread_mutex_lock(&s->mu);
    if (l->queued != l->waited) {
        atomic_store(&l->cancelled, 1);
        if (!l->rc) {
            l->rc = 1;
            snprintf(l->err, sizeof l->err, "cpu stage: cancelled");
        }
    }
    pthread_mutex_unlock(&s->mu);
}

void hg_stage_cancel(hg_stage *s) { hg_stage_cancel_lane(s, 0); }

int64_t hg_stage_last_ns(const hg_stage *s) { return s->last_ns; }

void hg_stage_last_split(const hg_stage *s, double *out) {
    for (int i = 0; i < 6; i++) out[i] = (double)s->split[i];
}

void hg_stage_set_idle_spin(hg_stage *s, int64_t ns) { s->idle_spin_ns = ns < 0 ? 0 : ns; }

void hg_stage_set_ready_timeout(hg_stage *s, int64_t ns) { s->ready_timeout_ns = ns < 1 ? 1 : ns; }

void hg_stage_error(const hg_stage *s, char *buf, int64_t cap) {
    if (cap > 0) snprintf(buf, (size_t)cap, "%s", s->err);
}

void hg_stage_set_read_depth(hg_stage *s, int depth) { s->read_depth = depth < 0 ? 0 : depth > 256 ? 256 : depth; }

void hg_stage_last_reads(const hg_stage *s, int64_t *out) {
    out[0] = s->last_reads[0];
    out[1] = s->last_reads[1];
}

/* Name -> offset / value tables: a field or flag JS declares and this build lacks reads as -1. */
#define FIELD(f) { #f, (int64_t)offsetof(hg_stage_job, f) }
static const struct { const char *name; int64_t at; } job_fields[] = {
    FIELD(flags), FIELD(q), FIELD(k), FIELD(ktype), FIELD(kcap), FIELD(v), FIELD(vtype), FIELD(vcap), FIELD(n),
    FIELD(heads), FIELD(kv_heads), FIELD(head_dim), FIELD(all_logits), FIELD(lstride), FIELD(ids), FIELD(counts),
    FIELD(kmax), FIELD(budget), FIELD(sel_logits), FIELD(vstage), FIELD(kstage), FIELD(scale),
    FIELD(kq), FIELD(kq_form), FIELD(kq_from), FIELD(cand), FIELD(pages), FIELD(page_size), FIELD(page_cap), FIELD(pages_from),
    FIELD(ready), FIELD(ready_value), FIELD(done), FIELD(done_value), FIELD(sinks), FIELD(index_form), FIELD(super_pages), FIELD(lane),
};
#undef FIELD
#define FLAG(f) { #f, HG_STAGE_##f }
static const struct { const char *name; int64_t at; } job_flags[] = {
    FLAG(SCORE), FLAG(TOPK), FLAG(SELECTED), FLAG(GATHER), FLAG(SHARED), FLAG(KEYS), FLAG(QUEST), FLAG(NO_ROWS),
    FLAG(DONE_IF_FAILED), FLAG(STREAM), FLAG(INDEX), FLAG(CHOSEN),
};
#undef FLAG

int64_t hg_stage_job_size(void) { return (int64_t)sizeof(hg_stage_job); }

int64_t hg_stage_job_offset(const char *name) {
    for (size_t i = 0; i < sizeof job_fields / sizeof job_fields[0]; i++) if (strcmp(job_fields[i].name, name) == 0) return job_fields[i].at;
    return -1;
}

int64_t hg_stage_job_flag(const char *name) {
    for (size_t i = 0; i < sizeof job_flags / sizeof job_flags[0]; i++) if (strcmp(job_flags[i].name, name) == 0) return job_flags[i].at;
    return -1;
}
