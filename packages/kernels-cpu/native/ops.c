/* The exported ops: decide whether an op is worth the pool (small ones run on the calling
 * thread), split it into per-thread ranges and call the context's kernels. */
#include "ctx.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Below this many multiply-adds (or elements) an op runs on the calling thread:
 * waking the pool costs about a microsecond. */
#define PAR_MIN_WORK 24576
/* Boundaries of per-thread ranges fall on multiples of 16 floats (one cache line). */
#define LINE 16

/* How many pieces to cut an op of `work` into: 1 (run here) when small, else between one and
 * `per_thread` per thread, so a busy or descheduled thread leaves little for the others. */
static int parts_for(hg_ctx *c, int64_t work, int per_thread) {
    int t = hg_pool_threads(c->pool);
    if (t == 1 || work < PAR_MIN_WORK) return 1;
    int64_t p = work / (PAR_MIN_WORK / 2);
    return p < t ? t : p > per_thread * t ? per_thread * t : (int)p;
}
#define PIECES 4

/* Parameter vectors (norm weights, biases) as f32: used in place when already f32, else
 * converted into the context's buffer (slot 0 or 1). Returns NULL when out of memory. */
static const float *params_f32(hg_ctx *c, const void *p, int type, int k, int slot) {
    if (type == HG_F32) return (const float *)p;
    size_t need = (size_t)k * 2 * sizeof(float);
    if (c->params_bytes < need) {
        free(c->params);
        c->params = aligned_alloc(64, (need + 63) & ~(size_t)63);
        c->params_bytes = c->params ? need : 0;
        if (!c->params) return NULL;
    }
    float *dst = c->params + (size_t)slot * k;
    c->k->convert(dst, HG_F32, p, type, k);
    return dst;
}

/* ---- conversions -------------------------------------------------------------------- */
typedef struct { hg_ctx *c; void *dst; int dt; const void *src; int st; int64_t count; } convert_job;

static int type_bytes(int t) { return t == HG_F32 ? 4 : 2; }

static void convert_task(void *v, int ith, int nth) {
    convert_job *j = v;
    int64_t b, e;
    hg_split(j->count, 64, ith, nth, &b, &e);
    if (b < e)
        j->c->k->convert((char *)j->dst + b * type_bytes(j->dt), j->dt,
                         (const char *)j->src + b * type_bytes(j->st), j->st, e - b);
}

void hg_convert(hg_ctx *c, void *dst, int dst_type, const void *src, int src_type, int64_t count) {
    if (dst_type == src_type) {
        /* overlapping rows of one tensor: memmove, on this thread */
        size_t bytes = (size_t)count * type_bytes(dst_type);
        const char *d = dst, *s = src;
        if (d < s + bytes && s < d + bytes) { memmove(dst, src, bytes); return; }
    }
    convert_job j = {c, dst, dst_type, src, src_type, count};
    hg_pool_run(c->pool, convert_task, &j, parts_for(c, count / 4, PIECES));
}

void hg_embedding(hg_ctx *c, float *out, const void *table, int type, int cols, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++)
        hg_convert(c, out + (int64_t)i * cols, HG_F32,
                   (const char *)table + (int64_t)ids[i] * cols * type_bytes(type), type, cols);
}

/* ---- matmul ------------------------------------------------------------------------- */
typedef struct { hg_ctx *c; hg_matmul_args a; } matmul_job;

static void matmul_task(void *v, int ith, int nth) {
    matmul_job *j = v;
    int64_t b, e;
    hg_split(j->a.m, LINE, ith, nth, &b, &e);
    if (b < e) j->c->k->matmul(&j->a, (long)b, (long)e);
}

void hg_matmul(hg_ctx *c, float *out, const float *x, const void *w, int wtype,
               const void *bias, int btype, int n, int k, int m) {
    matmul_job j = {c, {out, x, w, bias, wtype, btype, n, k, m}};
    /* one piece per thread: a GEMV streams memory, and one long contiguous range per thread
     * keeps the prefetchers (hardware and ours) running, as an OpenMP static split does */
    hg_pool_run(c->pool, matmul_task, &j, parts_for(c, (int64_t)n * k * m, 1));
}

/* ---- norms -------------------------------------------------------------------------- */
typedef struct { hg_ctx *c; float *out; const float *x, *w, *b; int n, k; float eps; } norm_job;

static void norm_task(void *v, int ith, int nth) {
    norm_job *j = v;
    int64_t r0, r1;
    hg_split(j->n, 1, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        if (j->b) j->c->k->layernorm_row(j->out + r * j->k, j->x + r * j->k, j->w, j->b, j->k, j->eps);
        else j->c->k->rmsnorm_row(j->out + r * j->k, j->x + r * j->k, j->w, j->k, j->eps);
    }
}

int hg_rmsnorm(hg_ctx *c, float *out, const float *x, const void *w, int wtype, int n, int k, float eps) {
    norm_job j = {c, out, x, params_f32(c, w, wtype, k, 0), NULL, n, k, eps};
    if (!j.w) return 0;
    hg_pool_run(c->pool, norm_task, &j, n > 1 ? parts_for(c, (int64_t)n * k, PIECES) : 1);
    return 1;
}

int hg_layernorm(hg_ctx *c, float *out, const float *x, const void *w, int wtype,
                 const void *b, int btype, int n, int k, float eps) {
    norm_job j = {c, out, x, params_f32(c, w, wtype, k, 0), params_f32(c, b, btype, k, 1), n, k, eps};
    if (!j.w || !j.b) return 0;
    hg_pool_run(c->pool, norm_task, &j, n > 1 ? parts_for(c, (int64_t)n * k, PIECES) : 1);
    return 1;
}

/* ---- rope --------------------------------------------------------------------------- */
typedef struct { float *x; int n, stride; const int32_t *pos; int heads, hd; const float *cos_t, *sin_t; int half; } rope_job;

static void rope_task(void *v, int ith, int nth) {
    rope_job *j = v;
    int64_t r0, r1;
    hg_split(j->n, 1, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *cs = j->cos_t + (int64_t)j->pos[r] * j->half;
        const float *sn = j->sin_t + (int64_t)j->pos[r] * j->half;
        for (int h = 0; h < j->heads; h++) {
            float *a = j->x + r * j->stride + (int64_t)h * j->hd, *b = a + j->half;
            for (int i = 0; i < j->half; i++) {
                float x0 = a[i], x1 = b[i];
                a[i] = x0 * cs[i] - x1 * sn[i];
                b[i] = x1 * cs[i] + x0 * sn[i];
            }
        }
    }
}

void hg_rope(hg_ctx *c, float *x, int n, int row_stride, const int32_t *pos, int heads, int head_dim,
             const float *cos_t, const float *sin_t, int half) {
    rope_job j = {x, n, row_stride, pos, heads, head_dim, cos_t, sin_t, half};
    hg_pool_run(c->pool, rope_task, &j, n > 1 ? parts_for(c, (int64_t)n * heads * head_dim, PIECES) : 1);
}

/* ---- elementwise -------------------------------------------------------------------- */
enum { EW_SILU_MUL, EW_ADD, EW_RELU, EW_GELU };
typedef struct { hg_ctx *c; int op; float *out; const float *a, *b; int64_t count; } ew_job;

static void gelu_range(float *x, int64_t count) {
    for (int64_t i = 0; i < count; i++) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

static void ew_task(void *v, int ith, int nth) {
    ew_job *j = v;
    int64_t b, e;
    hg_split(j->count, LINE, ith, nth, &b, &e);
    if (b >= e) return;
    switch (j->op) {
    case EW_SILU_MUL: j->c->k->silu_mul(j->out + b, j->a + b, j->b + b, e - b); break;
    case EW_ADD: j->c->k->add(j->out + b, j->a + b, j->b + b, e - b); break;
    case EW_RELU: j->c->k->relu(j->out + b, e - b); break;
    case EW_GELU: gelu_range(j->out + b, e - b); break;
    }
}

static void elementwise(hg_ctx *c, int op, float *out, const float *a, const float *b, int64_t count) {
    ew_job j = {c, op, out, a, b, count};
    hg_pool_run(c->pool, ew_task, &j, parts_for(c, count, PIECES));
}

void hg_silu_mul(hg_ctx *c, float *out, const float *gate, const float *up, int64_t count) {
    elementwise(c, EW_SILU_MUL, out, gate, up, count);
}
void hg_add(hg_ctx *c, float *out, const float *a, const float *b, int64_t count) { elementwise(c, EW_ADD, out, a, b, count); }
void hg_relu(hg_ctx *c, float *x, int64_t count) { elementwise(c, EW_RELU, x, NULL, NULL, count); }
void hg_gelu(hg_ctx *c, float *x, int64_t count) { elementwise(c, EW_GELU, x, NULL, NULL, count); }

/* ---- softmax, argmax ---------------------------------------------------------------- */
typedef struct { hg_ctx *c; float *x; int rows, stride, cols; } softmax_job;

static void softmax_task(void *v, int ith, int nth) {
    softmax_job *j = v;
    int64_t r0, r1;
    hg_split(j->rows, 1, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) j->c->k->softmax_row(j->x + r * j->stride, j->cols);
}

void hg_softmax(hg_ctx *c, float *x, int rows, int stride, int cols) {
    softmax_job j = {c, x, rows, stride, cols};
    hg_pool_run(c->pool, softmax_task, &j, rows > 1 ? parts_for(c, (int64_t)rows * cols, PIECES) : 1);
}

int64_t hg_argmax(hg_ctx *c, const float *x, int64_t count) { return c->k->argmax(x, count); }

/* ---- attention ---------------------------------------------------------------------- */
int64_t hg_check_slots(const int32_t *slots, int64_t count, int64_t cap) {
    for (int64_t i = 0; i < count; i++)
        if (slots[i] < 0 || slots[i] >= cap) return i;
    return -1;
}

typedef struct { hg_ctx *c; hg_logits_args a; } logits_job;

/* Pieces are contiguous runs of the (KV head, token) space: each thread streams long runs of
 * one head's rows, and every piece is about the same size whatever the head count. */
static void logits_task(void *v, int ith, int nth) {
    logits_job *j = v;
    int64_t b, e;
    hg_split(j->a.count * j->a.kv_heads, LINE, ith, nth, &b, &e);
    if (b < e) j->c->k->attn_logits(&j->a, b, e);
}

const float *hg_qpack(hg_ctx *c, const float *q, int heads, int kv_heads, int head_dim, int ktype) {
    size_t qf = (size_t)c->k->attn_qfloats(heads, kv_heads, head_dim, ktype);
    float *qp = hg_grow(&c->qpack, &c->qpack_bytes, qf * sizeof(float));
    if (qp) c->k->attn_qpack(qp, q, heads, kv_heads, head_dim, ktype);
    return qp;
}

int hg_attn_logits(hg_ctx *c, float *logits, int lstride, const float *q, const void *k, int ktype,
                   int heads, int kv_heads, int head_dim, int64_t cap,
                   int64_t start, const int32_t *slots, int64_t count, float scale) {
    const float *qp = hg_qpack(c, q, heads, kv_heads, head_dim, ktype);
    if (!qp) return 0;
    logits_job j = {c, {logits, qp, k, slots, lstride, cap, start, count, ktype, heads, kv_heads, head_dim, scale}};
    hg_pool_run(c->pool, logits_task, &j, parts_for(c, count * heads * head_dim, PIECES));
    return 1;
}

typedef struct { hg_ctx *c; hg_aggr_args a; float *out, *partials; int64_t count; int accumulate, parts; } aggr_job;

/* Phase 1: piece i sums its token range into partial row set i. */
static void aggr_partial_task(void *v, int part, int parts) {
    aggr_job *j = v;
    int64_t b, e, size = (int64_t)j->a.heads * j->a.head_dim;
    float *acc = j->partials + part * size;
    memset(acc, 0, (size_t)size * sizeof(float));
    hg_split(j->count, 4, part, parts, &b, &e);
    if (b < e) j->c->k->attn_aggregate(&j->a, acc, b, e);
}

/* Phase 2: the partial sums are added into out, split by element. */
static void aggr_reduce_task(void *v, int part, int parts) {
    aggr_job *j = v;
    int64_t b, e, size = (int64_t)j->a.heads * j->a.head_dim;
    hg_split(size, LINE, part, parts, &b, &e);
    if (!j->accumulate) memset(j->out + b, 0, (size_t)(e - b) * sizeof(float));
    for (int t = 0; t < j->parts; t++) {
        const float *p = j->partials + t * size;
        for (int64_t i = b; i < e; i++) j->out[i] += p[i];
    }
}

int hg_attn_aggregate(hg_ctx *c, float *out, const float *probs, int pstride, const void *v, int vtype,
                      int heads, int kv_heads, int head_dim, int64_t cap,
                      int64_t start, const int32_t *slots, int64_t count, int accumulate) {
    aggr_job j = {c, {out, probs, v, slots, pstride, cap, start, vtype, heads, kv_heads, head_dim}, out, NULL, count, accumulate, 1};
    int64_t size = (int64_t)heads * head_dim;
    int parts = count >= 8 ? parts_for(c, count * size, PIECES) : 1;
    if (parts > hg_pool_threads(c->pool)) parts = hg_pool_threads(c->pool); /* one partial per thread is enough */
    if (parts == 1) {
        /* one piece: accumulate straight into out */
        if (!accumulate) memset(out, 0, (size_t)size * sizeof(float));
        c->k->attn_aggregate(&j.a, out, 0, count);
        return 1;
    }
    size_t need = (size_t)parts * size * sizeof(float);
    if (c->scratch_bytes < need) {
        free(c->scratch);
        c->scratch = aligned_alloc(64, (need + 63) & ~(size_t)63);
        c->scratch_bytes = c->scratch ? need : 0;
        if (!c->scratch) return 0;
    }
    j.partials = c->scratch;
    j.parts = parts;
    hg_pool_run(c->pool, aggr_partial_task, &j, parts);
    hg_pool_run(c->pool, aggr_reduce_task, &j, parts_for(c, size, 1) > 1 ? hg_pool_threads(c->pool) : 1);
    return 1;
}

/* ---- bandwidth baseline ------------------------------------------------------------- */
typedef struct { hg_ctx *c; const float *p; int64_t count; double sums[256]; } stream_job;

static void stream_task(void *v, int ith, int nth) {
    stream_job *j = v;
    int64_t b, e;
    hg_split(j->count, 1024, ith, nth, &b, &e);
    double s = b < e ? j->c->k->stream_sum(j->p + b, e - b) : 0.0;
    if (ith < 256) j->sums[ith] = s;
}

double hg_stream_sum(hg_ctx *c, const void *p, uint64_t bytes) {
    stream_job j;
    j.c = c; j.p = p; j.count = (int64_t)(bytes / 4);
    memset(j.sums, 0, sizeof j.sums);
    int parts = 4 * hg_pool_threads(c->pool);
    hg_pool_run(c->pool, stream_task, &j, parts < 256 ? parts : 256);
    double s = 0;
    for (int i = 0; i < 256; i++) s += j.sums[i];
    return s;
}

/* ---- diagnostics -------------------------------------------------------------------- */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
typedef struct { pthread_t ids[256]; atomic_int arrived; int n; } probe_job;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Each piece records its thread, then waits (up to 5 s) for all pieces to have started:
 * no thread can take two pieces unless another thread never showed up. */
static void probe_task(void *v, int part, int parts) {
    probe_job *j = v;
    (void)parts;
    j->ids[part] = pthread_self();
    atomic_fetch_add(&j->arrived, 1);
    double t0 = now_s();
    while (atomic_load(&j->arrived) < j->n && now_s() - t0 < 5.0) { }
}

/* Runs one op with a piece per thread; returns how many distinct OS threads ran it. */
int hg_pool_probe(hg_ctx *c) {
    probe_job j;
    int n = hg_pool_threads(c->pool) < 256 ? hg_pool_threads(c->pool) : 256, distinct = 0;
    atomic_init(&j.arrived, 0);
    j.n = n;
    hg_pool_run(c->pool, probe_task, &j, n);
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int t = 0; t < i; t++) seen |= pthread_equal(j.ids[t], j.ids[i]);
        distinct += !seen;
    }
    return distinct;
}
