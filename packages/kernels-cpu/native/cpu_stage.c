/* The hybrid CPU stage on threads of its own: a coordinator pthread that takes one job at a
 * time from JS, with an hg_ctx (its own thread pool and kernel table) for the parallel parts.
 * The logits reuse the ISA kernel of hg_attn_logits; top-K is a quickselect per KV head;
 * the V gather is row memcpy into the staging buffer the device reads. */
#include "cpu_stage.h"
#include "ctx.h"
#include <math.h>
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
enum { IDLE = 0, PENDING = 1, DONE = 2 };

struct hg_stage {
    hg_ctx *ctx;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t job_cv, done_cv;
    _Alignas(64) atomic_int state;
    atomic_int stop;
    int started;
    hg_stage_job job;
    int64_t result, last_ns, idle_spin_ns;
    float *scratch; /* per KV head: best[n] and a copy for quickselect */
    size_t scratch_bytes;
};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t esize(int64_t type) { return type == HG_F32 ? 4 : 2; }

/* ---- parallel pieces ------------------------------------------------------------------ */
typedef struct { hg_stage *s; const hg_stage_job *j; hg_logits_args a; const float *qp; int64_t qs; int chunks; } run_ctx;

/* Contiguous runs of the (KV head, token) space: long streams of one head's rows per piece. */
static void score_task(void *v, int part, int parts) {
    run_ctx *r = v;
    int64_t b, e;
    hg_split(r->a.count * r->a.kv_heads, 16, part, parts, &b, &e);
    if (b < e) r->s->ctx->k->attn_logits(&r->a, b, e);
}

/* Descending-rank selection: after it, a[r] holds the value of ascending rank r. */
static float select_rank(float *a, int64_t n, int64_t r) {
    int64_t lo = 0, hi = n - 1;
    while (hi > lo) {
        int64_t mid = lo + (hi - lo) / 2;
        float x = a[lo], y = a[mid], z = a[hi];
        float pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
        int64_t lt = lo, i = lo, gt = hi;
        while (i <= gt) {
            float t = a[i];
            if (t < pivot) { a[i] = a[lt]; a[lt++] = t; i++; }
            else if (t > pivot) { a[i] = a[gt]; a[gt--] = t; }
            else i++;
        }
        if (r < lt) hi = lt - 1;
        else if (r > gt) lo = gt + 1;
        else return pivot;
    }
    return a[r];
}

/* ids (ascending) of the `k` largest of best[0..n), ties to the lower index. */
static void top_k(float *best, float *tmp, int64_t n, int64_t k, int32_t *ids) {
    if (k >= n) {
        for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)i;
        return;
    }
    if (k <= 0) return;
    memcpy(tmp, best, (size_t)n * sizeof(float));
    float t = select_rank(tmp, n, n - k);
    int64_t above = 0;
    for (int64_t i = 0; i < n; i++) above += best[i] > t;
    int64_t ties = k - above, o = 0;
    for (int64_t i = 0; i < n && o < k; i++) {
        float v = best[i];
        if (v > t || (v == t && ties-- > 0)) ids[o++] = (int32_t)i;
    }
}

static void topk_task(void *v, int g, int parts) {
    (void)parts;
    run_ctx *r = v;
    const hg_stage_job *j = r->j;
    int64_t n = j->n, group = j->heads / j->kv_heads;
    int shared = (j->flags & HG_STAGE_SHARED) != 0;
    int64_t h0 = shared ? 0 : g * group, h1 = shared ? j->heads : (g + 1) * group;
    float *best = r->s->scratch + (size_t)g * 2 * n, *tmp = best + n;
    const float *L = (const float *)(intptr_t)j->all_logits;
    for (int64_t i = 0; i < n; i++) best[i] = -INFINITY;
    for (int64_t h = h0; h < h1; h++) {
        const float *row = L + h * j->lstride;
        for (int64_t i = 0; i < n; i++) {
            float x = row[i];
            if (x > best[i]) best[i] = x; /* NaN never wins: it ranks below every number */
        }
    }
    int32_t *ids = (int32_t *)(intptr_t)j->ids;
    int32_t *counts = (int32_t *)(intptr_t)j->counts;
    int64_t k = j->budget < n ? j->budget : n;
    top_k(best, tmp, n, k, ids + g * j->kmax);
    counts[g] = (int32_t)k;
    if (shared)
        for (int64_t h = 1; h < j->kv_heads; h++) {
            memcpy(ids + h * j->kmax, ids, (size_t)k * sizeof(int32_t));
            counts[h] = (int32_t)k;
        }
}

/* Pieces over (KV head, chunk of its list): selected logits and/or the V gather. */
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
                (const char *)(intptr_t)j->k + g * j->kcap * j->head_dim * esize(j->ktype),
                ids, kmax, j->kcap, 0, cnt, (int)j->ktype, (int)group, 1, (int)j->head_dim, (float)j->scale,
            };
            r->s->ctx->k->attn_logits(&a, vb, ve);
        }
    } else {
        const float *L = (const float *)(intptr_t)j->all_logits;
        for (int64_t h = g * group; h < (g + 1) * group; h++)
            for (int64_t i = vb; i < ve; i++) sel[h * kmax + i] = L[h * j->lstride + ids[i]];
    }
    for (int64_t h = g * group; h < (g + 1) * group; h++)
        for (int64_t i = (b > cnt ? b : cnt); i < e; i++) sel[h * kmax + i] = -INFINITY;
    int64_t row = j->head_dim * esize(j->vtype);
    const char *V = (const char *)(intptr_t)j->v + g * j->vcap * row;
    char *dst = (char *)(intptr_t)j->vstage + g * kmax * row;
    for (int64_t i = b; i < e; i++) {
        if (i < cnt) memcpy(dst + i * row, V + (int64_t)ids[i] * row, (size_t)row);
        else memset(dst + i * row, 0, (size_t)row);
    }
}

/* ---- one job --------------------------------------------------------------------------- */
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

static int64_t run_job(hg_stage *s, const hg_stage_job *j) {
    int threads = hg_pool_threads(s->ctx->pool);
    run_ctx r = {s, j, {0}, NULL, 0, 1};
    if (j->flags & (HG_STAGE_SCORE | HG_STAGE_SELECTED)) { /* the query, packed once for the logits kernel */
        const hg_kernels *k = s->ctx->k;
        r.qs = k->attn_qfloats((int)(j->heads / j->kv_heads), 1, (int)j->head_dim, (int)j->ktype); /* per KV head */
        float *qp = hg_grow(&s->ctx->qpack, &s->ctx->qpack_bytes, (size_t)(j->kv_heads * r.qs) * sizeof(float));
        if (!qp) return -2;
        k->attn_qpack(qp, (const float *)(intptr_t)j->q, (int)j->heads, (int)j->kv_heads, (int)j->head_dim, (int)j->ktype);
        r.qp = qp;
    }
    if (j->flags & HG_STAGE_SCORE) {
        r.a = (hg_logits_args){(float *)(intptr_t)j->all_logits, r.qp, (const void *)(intptr_t)j->k, NULL, j->lstride, j->kcap, 0,
                               j->n, (int)j->ktype, (int)j->heads, (int)j->kv_heads, (int)j->head_dim, (float)j->scale};
        int64_t work = j->n * j->heads * j->head_dim;
        int parts = work < 32768 ? 1 : 4 * threads;
        hg_pool_run(s->ctx->pool, score_task, &r, parts);
    }
    if (j->flags & HG_STAGE_TOPK) {
        size_t need = (size_t)j->kv_heads * 2 * (size_t)j->n * sizeof(float);
        if (s->scratch_bytes < need) {
            free(s->scratch);
            s->scratch = malloc(need);
            s->scratch_bytes = s->scratch ? need : 0;
            if (!s->scratch) return -2;
        }
        hg_pool_run(s->ctx->pool, topk_task, &r, (j->flags & HG_STAGE_SHARED) ? 1 : (int)j->kv_heads);
    } else if (j->flags & (HG_STAGE_SELECTED | HG_STAGE_GATHER)) {
        int64_t bad = check_ids(j);
        if (bad) return bad;
    }
    if (j->flags & (HG_STAGE_SELECTED | HG_STAGE_GATHER)) {
        int64_t per = (4 * threads + j->kv_heads - 1) / j->kv_heads;
        int64_t most = (j->kmax + 15) / 16;
        r.chunks = (int)(per < most ? per : most);
        if (r.chunks < 1) r.chunks = 1;
        if (j->kmax * j->heads * j->head_dim < 16384) r.chunks = 1;
        hg_pool_run(s->ctx->pool, selected_task, &r, (int)(j->kv_heads * r.chunks));
    }
    return 0;
}

static int64_t timed(hg_stage *s, const hg_stage_job *j) {
    int64_t t0 = now_ns();
    int64_t rc = run_job(s, j);
    s->last_ns = now_ns() - t0;
    return rc;
}

static void *coordinator(void *arg) {
    hg_stage *s = arg;
    for (;;) {
        int64_t t0 = now_ns();
        while (atomic_load_explicit(&s->state, memory_order_acquire) != PENDING && !atomic_load(&s->stop)) {
            for (int i = 0; i < 64; i++) relax();
            if (now_ns() - t0 > s->idle_spin_ns) break;
        }
        pthread_mutex_lock(&s->mu);
        while (atomic_load(&s->state) != PENDING && !s->stop) pthread_cond_wait(&s->job_cv, &s->mu);
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop) return NULL;
        s->result = timed(s, &s->job);
        pthread_mutex_lock(&s->mu);
        atomic_store_explicit(&s->state, DONE, memory_order_release);
        pthread_cond_broadcast(&s->done_cv);
        pthread_mutex_unlock(&s->mu);
    }
}

hg_stage *hg_stage_create(int threads, int isa) {
    hg_stage *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->ctx = hg_create(threads > 0 ? threads : 1, isa);
    if (!s->ctx) { free(s); return NULL; }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->job_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    atomic_init(&s->state, IDLE);
    s->idle_spin_ns = DEFAULT_IDLE_SPIN_NS;
    if (pthread_create(&s->thread, NULL, coordinator, s) != 0) {
        hg_destroy(s->ctx);
        free(s);
        return NULL;
    }
    s->started = 1;
    return s;
}

void hg_stage_destroy(hg_stage *s) {
    if (!s) return;
    if (atomic_load(&s->state) == PENDING) hg_stage_wait(s);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->job_cv);
    pthread_mutex_unlock(&s->mu);
    if (s->started) pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->job_cv);
    pthread_cond_destroy(&s->done_cv);
    hg_destroy(s->ctx);
    free(s->scratch);
    free(s);
}

int hg_stage_threads(const hg_stage *s) { return hg_pool_threads(s->ctx->pool); }

int hg_stage_submit(hg_stage *s, const hg_stage_job *job) {
    if (atomic_load(&s->state) == PENDING) return -1;
    pthread_mutex_lock(&s->mu);
    s->job = *job;
    atomic_store_explicit(&s->state, PENDING, memory_order_release);
    pthread_cond_signal(&s->job_cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

int64_t hg_stage_run(hg_stage *s, const hg_stage_job *job) {
    if (atomic_load(&s->state) == PENDING) return -1;
    return timed(s, job);
}

int64_t hg_stage_wait(hg_stage *s) {
    int st = atomic_load_explicit(&s->state, memory_order_acquire);
    if (st == IDLE) return -1;
    int64_t t0 = s->idle_spin_ns > 0 ? now_ns() : 0;
    while (s->idle_spin_ns > 0 && atomic_load_explicit(&s->state, memory_order_acquire) != DONE) {
        for (int i = 0; i < 64; i++) relax();
        if (now_ns() - t0 > s->idle_spin_ns) break;
    }
    pthread_mutex_lock(&s->mu);
    while (atomic_load(&s->state) != DONE) pthread_cond_wait(&s->done_cv, &s->mu);
    atomic_store(&s->state, IDLE);
    pthread_mutex_unlock(&s->mu);
    return s->result;
}

int64_t hg_stage_last_ns(const hg_stage *s) { return s->last_ns; }

void hg_stage_set_idle_spin(hg_stage *s, int64_t ns) { s->idle_spin_ns = ns < 0 ? 0 : ns; }
