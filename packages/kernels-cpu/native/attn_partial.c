/* Flash-decode attention of one query row over spans of cached K/V (hybrid attention's window)
 * and its merge with more tokens whose logits are given (the selected offloaded ones). Pieces of
 * the spans' tokens each keep an online softmax per query head: a tile's logits by the logits
 * kernel (they stay in L1), the tile's maximum and exponentials, its V rows folded in by the
 * aggregation kernel; the pieces' states are then merged into the partial [heads, head_dim + 2]
 * (normalised output, max, sum). K and V are read once and no row of logits is written. */
#include "ctx.h"
#include <math.h>
#include <string.h>

#define TILE 64      /* tokens scored, exponentiated and folded in at a time */
#define MAX_SPANS 4  /* core's ATTN_PARTIAL_MAX_SPANS */
#define MIN_PIECE 256 /* tokens below which another piece costs more than it saves */

/* One piece's online-softmax state: acc [heads][head_dim] (unnormalised), m and l [heads]. */
typedef struct { float *acc, *m, *l; } piece_state;

typedef struct {
    hg_ctx *c;
    const float *qp;
    const void *k, *v;
    int type, heads, kv_heads, head_dim;
    int64_t cap;
    float scale;
    int nspans;
    int64_t starts[MAX_SPANS], offs[MAX_SPANS + 1]; /* span s: slots starts[s].., tokens offs[s]..offs[s+1] */
    float *mem;  /* per piece: acc, m, l, then a tile of logits [heads][TILE] */
    int64_t piece_floats;
} partial_job;

static piece_state piece_at(float *base, int heads, int head_dim) {
    piece_state s = {base, base + (int64_t)heads * head_dim, base + (int64_t)heads * head_dim + heads};
    return s;
}

static void state_init(piece_state s, int heads, int head_dim) {
    memset(s.acc, 0, (size_t)heads * head_dim * sizeof(float));
    for (int h = 0; h < heads; h++) { s.m[h] = -INFINITY; s.l[h] = 0.0f; }
}

/* Rescales head h's state to the new maximum mx (exp of −∞ − mx is 0: an empty state stays 0). */
static void state_rescale(piece_state s, int h, int head_dim, float mx) {
    if (s.m[h] == mx) return;
    const float cr = s.m[h] == -INFINITY ? 0.0f : expf(s.m[h] - mx);
    float *a = s.acc + (int64_t)h * head_dim;
    for (int d = 0; d < head_dim; d++) a[d] *= cr;
    s.l[h] *= cr;
    s.m[h] = mx;
}

/* Tokens [slot, slot + n) of the cache into the state: logits, per-head maxima and weights, V. */
static void fold_tile(const partial_job *j, piece_state s, float *tile, int64_t slot, int64_t n) {
    const hg_kernels *k = j->c->k;
    const int H = j->heads, D = j->head_dim;
    hg_logits_args la = {tile, j->qp, j->k, NULL, TILE, j->cap, slot, n, j->type, H, j->kv_heads, D, j->scale};
    k->attn_logits(&la, 0, (int64_t)j->kv_heads * n);
    for (int h = 0; h < H; h++) {
        float *row = tile + (int64_t)h * TILE, mx = s.m[h];
        for (int64_t t = 0; t < n; t++) mx = row[t] > mx ? row[t] : mx;
        if (mx == -INFINITY) { memset(row, 0, (size_t)n * sizeof(float)); continue; } /* no weight, no NaN into p·V */
        state_rescale(s, h, D, mx);
        s.l[h] += k->exp_sum(row, n, mx);
    }
    hg_aggr_args aa = {NULL, tile, j->v, NULL, TILE, j->cap, slot, j->type, H, j->kv_heads, D};
    k->attn_aggregate(&aa, s.acc, 0, n);
}

static void partial_task(void *arg, int part, int parts) {
    partial_job *j = arg;
    float *base = j->mem + part * j->piece_floats;
    piece_state s = piece_at(base, j->heads, j->head_dim);
    float *tile = base + (int64_t)j->heads * (j->head_dim + 2);
    state_init(s, j->heads, j->head_dim);
    int64_t b, e;
    hg_split(j->offs[j->nspans], TILE, part, parts, &b, &e);
    for (int sp = 0; sp < j->nspans; sp++) {
        const int64_t lo = b > j->offs[sp] ? b : j->offs[sp], hi = e < j->offs[sp + 1] ? e : j->offs[sp + 1];
        for (int64_t t = lo; t < hi; t += TILE)
            fold_tile(j, s, tile, j->starts[sp] + (t - j->offs[sp]), hi - t < TILE ? hi - t : TILE);
    }
}

int hg_attn_partial(hg_ctx *c, float *part, const float *q, const void *k, const void *v, int type,
                    int heads, int kv_heads, int head_dim, int64_t cap, const int32_t *spans, int nspans, float scale) {
    if (nspans < 0 || nspans > MAX_SPANS) return 0;
    partial_job j = {.c = c, .k = k, .v = v, .type = type, .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim,
                     .cap = cap, .scale = scale, .nspans = nspans};
    j.offs[0] = 0;
    for (int s = 0; s < nspans; s++) {
        j.starts[s] = spans[2 * s];
        j.offs[s + 1] = j.offs[s] + spans[2 * s + 1];
    }
    const int64_t total = j.offs[nspans];
    j.qp = hg_qpack(c, q, heads, kv_heads, head_dim, type);
    if (!j.qp) return 0;
    int parts = (int)(total / MIN_PIECE), threads = hg_pool_threads(c->pool);
    parts = parts < 1 ? 1 : parts > 2 * threads ? 2 * threads : parts;
    j.piece_floats = ((int64_t)heads * (head_dim + 2 + TILE) + 15) & ~(int64_t)15;
    j.mem = hg_grow(&c->scratch, &c->scratch_bytes, (size_t)parts * j.piece_floats * sizeof(float));
    if (!j.mem) return 0;
    hg_pool_run(c->pool, partial_task, &j, parts);
    /* The pieces' states into one: out = Σ e^(m_p − M) acc_p / Σ e^(m_p − M) l_p. */
    const int W = head_dim + 2;
    for (int h = 0; h < heads; h++) {
        float mx = -INFINITY, l = 0.0f, *o = part + (int64_t)h * W;
        for (int p = 0; p < parts; p++) {
            const float m = piece_at(j.mem + p * j.piece_floats, heads, head_dim).m[h];
            mx = m > mx ? m : mx;
        }
        memset(o, 0, (size_t)head_dim * sizeof(float));
        for (int p = 0; p < parts && mx != -INFINITY; p++) {
            piece_state s = piece_at(j.mem + p * j.piece_floats, heads, head_dim);
            if (s.l[h] == 0.0f) continue;
            const float w = expf(s.m[h] - mx), *a = s.acc + (int64_t)h * head_dim;
            for (int d = 0; d < head_dim; d++) o[d] += w * a[d];
            l += w * s.l[h];
        }
        if (l > 0.0f)
            for (int d = 0; d < head_dim; d++) o[d] /= l;
        o[head_dim] = l > 0.0f ? mx : -INFINITY;
        o[head_dim + 1] = l;
    }
    return 1;
}

/* ---- the merge ------------------------------------------------------------------------- */

typedef struct {
    const hg_kernels *k;
    hg_aggr_args a;
    float *accs; /* per piece: [heads][head_dim] */
    int64_t count;
} merge_job;

static void merge_task(void *arg, int part, int parts) {
    merge_job *j = arg;
    const int64_t size = (int64_t)j->a.heads * j->a.head_dim;
    float *acc = j->accs + part * size;
    memset(acc, 0, (size_t)size * sizeof(float));
    int64_t b, e;
    hg_split(j->count, 4, part, parts, &b, &e);
    if (b < e) j->k->attn_aggregate(&j->a, acc, b, e);
}

int hg_attn_merge(hg_ctx *c, float *out, const float *part, const float *logits, int lstride, const void *v, int vtype,
                  int heads, int kv_heads, int head_dim, int64_t cap, int64_t start, int64_t count) {
    const int W = head_dim + 2;
    const int64_t size = (int64_t)heads * head_dim;
    int parts = (int)(count / (MIN_PIECE / 4)), threads = hg_pool_threads(c->pool);
    parts = parts < 1 ? 1 : parts > threads ? threads : parts;
    /* scratch: the columns' weights [heads][count], each head's partial weight and denominator, the pieces' sums */
    float *probs = hg_grow(&c->scratch, &c->scratch_bytes, ((size_t)heads * count + 2 * (size_t)heads + (size_t)parts * size) * sizeof(float));
    if (!probs) return 0;
    float *sw = probs + (int64_t)heads * count, *den = sw + heads, *accs = den + heads;
    for (int h = 0; h < heads; h++) {
        const float *pw = part + (int64_t)h * W, *row = logits + (int64_t)h * lstride;
        float *p = probs + (int64_t)h * count, mx = pw[head_dim + 1] > 0.0f ? pw[head_dim] : -INFINITY;
        for (int64_t j = 0; j < count; j++) mx = row[j] > mx ? row[j] : mx;
        if (mx == -INFINITY) { /* nothing attended: out is 0 */
            memset(p, 0, (size_t)count * sizeof(float));
            sw[h] = den[h] = 0.0f;
            continue;
        }
        memcpy(p, row, (size_t)count * sizeof(float));
        sw[h] = pw[head_dim + 1] > 0.0f ? pw[head_dim + 1] * expf(pw[head_dim] - mx) : 0.0f;
        den[h] = sw[h] + (count ? c->k->exp_sum(p, count, mx) : 0.0f);
    }
    if (count > 0) {
        merge_job j = {c->k, {NULL, probs, v, NULL, count, cap, start, vtype, heads, kv_heads, head_dim}, accs, count};
        hg_pool_run(c->pool, merge_task, &j, parts);
    } else {
        parts = 0;
    }
    for (int h = 0; h < heads; h++) {
        float *o = out + (int64_t)h * head_dim;
        const float *pw = part + (int64_t)h * W;
        if (den[h] == 0.0f) { memset(o, 0, (size_t)head_dim * sizeof(float)); continue; }
        const float inv = 1.0f / den[h];
        for (int d = 0; d < head_dim; d++) {
            float a = sw[h] * pw[d];
            for (int p = 0; p < parts; p++) a += accs[p * size + (int64_t)h * head_dim + d];
            o[d] = a * inv;
        }
    }
    return 1;
}
