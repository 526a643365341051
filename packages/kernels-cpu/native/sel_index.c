/* The page index (sel_index.h; the spec's page-index.ts is the definition). A page's summary is made
 * from its rows in f32 with the definition's operations in its order, so the bytes match the spec's
 * bit for bit; bounds sum in f32 (the spec's in f64), so a choice may differ from the spec's only
 * between pages whose bounds tie within rounding. The search for a head's best pages keeps the
 * super-pages in a max-heap (built in linear time, popped only as far as the search goes) and
 * the pages kept in a min-heap of the worst kept, so a search that stops early costs little more
 * than the super-pages' bounds. */
#include "sel_index.h"
#include "sel_quest.h"
#include "sel_loops.h"
#include "sel_pool.h"
#include "sel_prims.h"
#include "topk_row.h"
#include "half.h"
#include "hgcpu.h"
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define HG_IDX_X86 1
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#endif

#define SLACK 1e-4f                       /* PAGE_INDEX_SLACK */
static const float WIDEN = 1.0f + 0x1p-16f; /* the scale's widening (exact in f32) */

static int64_t align64(int64_t x) { return (x + 63) & ~(int64_t)63; }

static int64_t code_bytes(int form, int64_t d) { return form == HG_INDEX_INT8 ? 2 * d : form == HG_INDEX_INT4 ? d : 0; }

int64_t hg_index_bytes(int form, int64_t kv_heads, int64_t d, int64_t page, int64_t super, int64_t page_cap) {
    const int64_t cb = code_bytes(form, d), sc = (page_cap + super - 1) / super;
    (void)page;
    if (!cb || super < 1) return 0;
    return align64(kv_heads * page_cap * cb) + align64(kv_heads * page_cap * 4) + align64(kv_heads * sc * cb) + align64(kv_heads * sc * 4);
}

int hg_index_view(hg_index *x, void *base, int form, int64_t kv_heads, int64_t d, int64_t page, int64_t super, int64_t page_cap) {
    const int64_t cb = code_bytes(form, d);
    if (!cb || super < 1 || page < 1) return -1;
    uint8_t *b = base;
    *x = (hg_index){.form = form, .kv_heads = kv_heads, .d = d, .page = page, .super = super, .page_cap = page_cap,
                    .super_cap = (page_cap + super - 1) / super, .code_bytes = cb};
    x->page_codes = b;
    x->page_scales = (float *)(b + align64(kv_heads * page_cap * cb));
    x->super_codes = (uint8_t *)x->page_scales + align64(kv_heads * page_cap * 4);
    x->super_scales = (float *)(x->super_codes + align64(kv_heads * x->super_cap * cb));
    return 0;
}

static inline int code_lo(const hg_index *x, const uint8_t *s, int64_t c) { return x->form == HG_INDEX_INT8 ? (int8_t)s[c] : (s[c] & 15) - 8; }
static inline int code_hi(const hg_index *x, const uint8_t *s, int64_t c) { return x->form == HG_INDEX_INT8 ? (int8_t)s[x->d + c] : (s[c] >> 4) - 8; }

/* page-index.ts's encode(), operation for operation in f32. */
static float encode(const hg_index *x, uint8_t *o, const float *mn, const float *mx) {
    const int64_t d = x->d;
    const int qmax = x->form == HG_INDEX_INT8 ? 127 : 7;
    float amax = 0.0f;
    int any = 0;
    for (int64_t c = 0; c < d; c++) {
        if (mn[c] <= mx[c]) {
            any = 1;
            const float a = fabsf(mn[c]), b = fabsf(mx[c]);
            if (a > amax) amax = a;
            if (b > amax) amax = b;
        }
    }
    float scale = 0.0f;
    if (any && amax > 0.0f) {
        const float s = amax / (float)qmax; /* two roundings, as the definition's */
        scale = s * WIDEN;
    }
    for (int64_t c = 0; c < d; c++) {
        int lo = 0, hi = 0;
        if (scale > 0.0f && mn[c] <= mx[c]) {
            lo = (int)floorf(mn[c] / scale);
            if ((float)lo * scale > mn[c]) lo--;
            hi = (int)ceilf(mx[c] / scale);
            if ((float)hi * scale < mx[c]) hi++;
            if (lo < -qmax) lo = -qmax;
            if (hi > qmax) hi = qmax;
        }
        if (x->form == HG_INDEX_INT8) {
            o[c] = (uint8_t)(int8_t)lo;
            o[d + c] = (uint8_t)(int8_t)hi;
        } else {
            o[c] = (uint8_t)((lo + 8) | ((hi + 8) << 4));
        }
    }
    return scale;
}

static inline float key_at(const void *k, int ktype, int64_t i) {
    if (ktype == HG_F32) return ((const float *)k)[i];
    const uint16_t h = ((const uint16_t *)k)[i];
    return ktype == HG_BF16 ? hg_bf16_to_f32(h) : hg_f16_to_f32(h);
}

/* mn/mx of channels [c0, d) over rows [r0, r1) of K (row-major, d channels a row): `v < mn ? v : mn` row by row, as the definition. */
static void rows_minmax_from(const void *k, int ktype, int64_t d, int64_t c0, int64_t r0, int64_t r1, float *mn, float *mx) {
    for (int64_t slot = r0; slot < r1; slot++) {
        const int64_t row = slot * d;
        for (int64_t c = c0; c < d; c++) {
            const float v = key_at(k, ktype, row + c);
            if (v < mn[c]) mn[c] = v;
            if (v > mx[c]) mx[c] = v;
        }
    }
}

typedef void (*rows_minmax_fn)(const void *k, int ktype, int64_t d, int64_t r0, int64_t r1, float *mn, float *mx);

static void rows_minmax_scalar(const void *k, int ktype, int64_t d, int64_t r0, int64_t r1, float *mn, float *mx) {
    rows_minmax_from(k, ktype, d, 0, r0, r1, mn, mx);
}

#ifdef HG_IDX_X86
AVX2 static inline __m256 load8_avx2(const void *k, int ktype, int64_t i) {
    if (ktype == HG_F32) return _mm256_loadu_ps((const float *)k + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)k + i));
    if (ktype == HG_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* rows_minmax_scalar's results bit for bit: MINPS(v, m) is `v < m ? v : m` (NaN and ±0 alike), rows in the same order;
 * 32 channels a pass keep the eight running bounds in registers while the page's rows stream by. */
AVX2 static void rows_minmax_avx2(const void *k, int ktype, int64_t d, int64_t r0, int64_t r1, float *mn, float *mx) {
    int64_t c = 0;
    for (; c + 32 <= d; c += 32) {
        __m256 a0 = _mm256_loadu_ps(mn + c), a1 = _mm256_loadu_ps(mn + c + 8), a2 = _mm256_loadu_ps(mn + c + 16), a3 = _mm256_loadu_ps(mn + c + 24);
        __m256 b0 = _mm256_loadu_ps(mx + c), b1 = _mm256_loadu_ps(mx + c + 8), b2 = _mm256_loadu_ps(mx + c + 16), b3 = _mm256_loadu_ps(mx + c + 24);
        for (int64_t slot = r0; slot < r1; slot++) {
            const int64_t i = slot * d + c;
            const __m256 v0 = load8_avx2(k, ktype, i), v1 = load8_avx2(k, ktype, i + 8), v2 = load8_avx2(k, ktype, i + 16), v3 = load8_avx2(k, ktype, i + 24);
            a0 = _mm256_min_ps(v0, a0), a1 = _mm256_min_ps(v1, a1), a2 = _mm256_min_ps(v2, a2), a3 = _mm256_min_ps(v3, a3);
            b0 = _mm256_max_ps(v0, b0), b1 = _mm256_max_ps(v1, b1), b2 = _mm256_max_ps(v2, b2), b3 = _mm256_max_ps(v3, b3);
        }
        _mm256_storeu_ps(mn + c, a0), _mm256_storeu_ps(mn + c + 8, a1), _mm256_storeu_ps(mn + c + 16, a2), _mm256_storeu_ps(mn + c + 24, a3);
        _mm256_storeu_ps(mx + c, b0), _mm256_storeu_ps(mx + c + 8, b1), _mm256_storeu_ps(mx + c + 16, b2), _mm256_storeu_ps(mx + c + 24, b3);
    }
    for (; c + 8 <= d; c += 8) {
        __m256 a = _mm256_loadu_ps(mn + c), b = _mm256_loadu_ps(mx + c);
        for (int64_t slot = r0; slot < r1; slot++) {
            const __m256 v = load8_avx2(k, ktype, slot * d + c);
            a = _mm256_min_ps(v, a), b = _mm256_max_ps(v, b);
        }
        _mm256_storeu_ps(mn + c, a), _mm256_storeu_ps(mx + c, b);
    }
    rows_minmax_from(k, ktype, d, c, r0, r1, mn, mx);
}
#endif

/* The fold's min/max loop for this host: AVX2 where AVX2 and F16C are (checked once), else the definition. */
static rows_minmax_fn fold_minmax(void) {
#ifdef HG_IDX_X86
    static rows_minmax_fn known = NULL;
    if (!known) known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") ? rows_minmax_avx2 : rows_minmax_scalar;
    return known;
#else
    return rows_minmax_scalar;
#endif
}

/* Head g's pages over rows [from, to) afresh (their rows below `to`), then their super-pages. mn/mx: 2·d floats of scratch. */
static void fold_head(const hg_index *x, const void *k, int ktype, int64_t kcap, int64_t g, int64_t from, int64_t to, float *mn, float *mx) {
    const int64_t d = x->d, P = x->page, S = x->super, p0 = from / P, p1 = (to + P - 1) / P, s0 = p0 / S, s1 = (p1 + S - 1) / S;
    const void *kg = (const char *)k + g * kcap * d * (ktype == HG_F32 ? 4 : 2);
    const rows_minmax_fn minmax = fold_minmax();
    for (int64_t p = p0; p < p1; p++) {
        for (int64_t c = 0; c < d; c++) mn[c] = __builtin_inff(), mx[c] = -__builtin_inff();
        const int64_t end = (p + 1) * P < to ? (p + 1) * P : to;
        minmax(kg, ktype, d, p * P, end, mn, mx);
        x->page_scales[g * x->page_cap + p] = encode(x, x->page_codes + (g * x->page_cap + p) * x->code_bytes, mn, mx);
    }
    for (int64_t u = s0; u < s1; u++) {
        for (int64_t c = 0; c < d; c++) mn[c] = __builtin_inff(), mx[c] = -__builtin_inff();
        const int64_t end = (u + 1) * S < p1 ? (u + 1) * S : p1;
        for (int64_t p = u * S; p < end; p++) {
            const uint8_t *o = x->page_codes + (g * x->page_cap + p) * x->code_bytes;
            const float sc = x->page_scales[g * x->page_cap + p];
            for (int64_t c = 0; c < d; c++) {
                const float lo = (float)code_lo(x, o, c) * sc, hi = (float)code_hi(x, o, c) * sc;
                if (lo < mn[c]) mn[c] = lo;
                if (hi > mx[c]) mx[c] = hi;
            }
        }
        x->super_scales[g * x->super_cap + u] = encode(x, x->super_codes + (g * x->super_cap + u) * x->code_bytes, mn, mx);
    }
}

/* Bound of one summary for the group's heads (rows of q d apart): max_j sc·(Σ_c max(q·lo, q·hi) + add_j),
 * add NULL for none (a super-page's rounding slack otherwise). */
static float bound_scalar(const hg_index *x, const uint8_t *s, float sc, const float *q, int64_t group, const float *add) {
    const int64_t d = x->d;
    float best = -__builtin_inff();
    for (int64_t j = 0; j < group; j++, q += d) {
        float sum = 0.0f;
        for (int64_t c = 0; c < d; c++) {
            const float v = q[c], lo = (float)code_lo(x, s, c), hi = (float)code_hi(x, s, c);
            sum += v > 0.0f ? v * hi : v * lo;
        }
        const float b = sc * (sum + (add ? add[j] : 0.0f));
        if (b > best) best = b;
    }
    return best;
}

#ifdef HG_IDX_X86
/* bound_scalar's bound on eight lanes (AVX2) and on sixteen (AVX-512: half the instructions a page,
 * so the loop stays nearer the bytes it reads), from one definition. */
#define BOUND_NAME bound_avx2
#define BOUND_TARGET AVX2
#define BOUND_W 8
#include "sel_bound.h"
#define BOUND_NAME bound_avx512
#define BOUND_TARGET AVX512
#define BOUND_W 16
#include "sel_bound.h"
#endif

/* (bound, page) order: a is better than b (higher bound, or equal and lower page). */
static inline int better(float ab, int32_t ap, float bb, int32_t bp) { return ab > bb || (ab == bb && ap < bp); }

/* One search's scratch: a part of a head's super-pages and the pages it keeps. */
typedef struct {
    float *sb;       /* [supers] */
    int32_t *heap;   /* [supers]: super-pages, best on top */
    float *kb;       /* [want]: kept bounds, worst on top */
    int32_t *kp;     /* [want] */
    float *qp, *qn;  /* [group*d] */
    float *add;      /* [group]: the super-pages' slack */
    int64_t *meta;   /* [2]: pages kept, pages bounded (in the scratch: a merge reads them after the search) */
} part_scratch;

static size_t part_bytes(int64_t supers, int64_t want, int64_t group, int64_t d) {
    return (size_t)(64 + align64(supers * 4) * 2 + align64(want * 4) * 2 + align64(group * d * 4) * 2 + align64(group * 4));
}

static part_scratch part_at(char *b, int64_t supers, int64_t want, int64_t group, int64_t d) {
    part_scratch h;
    h.meta = (int64_t *)b, b += 64;
    h.sb = (float *)b, b += align64(supers * 4);
    h.heap = (int32_t *)b, b += align64(supers * 4);
    h.kb = (float *)b, b += align64(want * 4);
    h.kp = (int32_t *)b, b += align64(want * 4);
    h.qp = (float *)b, b += align64(group * d * 4);
    h.qn = (float *)b, b += align64(group * d * 4);
    h.add = (float *)b;
    return h;
}

static void super_sift(const float *sb, int32_t *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, t = i;
        if (l < n && better(sb[h[l]], h[l], sb[h[t]], h[t])) t = l;
        if (r < n && better(sb[h[r]], h[r], sb[h[t]], h[t])) t = r;
        if (t == i) return;
        int32_t v = h[i]; h[i] = h[t]; h[t] = v;
        i = t;
    }
}

static void kept_sift(float *kb, int32_t *kp, int64_t n, int64_t i) {
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, t = i;
        if (l < n && better(kb[t], kp[t], kb[l], kp[l])) t = l;
        if (r < n && better(kb[t], kp[t], kb[r], kp[r])) t = r;
        if (t == i) return;
        float b = kb[i]; kb[i] = kb[t]; kb[t] = b;
        int32_t p = kp[i]; kp[i] = kp[t]; kp[t] = p;
        i = t;
    }
}

/* Keeps (b, p) among the best w of the kept heap. */
static void keep(part_scratch *h, int64_t w, float b, int32_t p) {
    if (h->meta[0] < w) {
        int64_t i = h->meta[0]++;
        h->kb[i] = b, h->kp[i] = p;
        while (i > 0) { /* sift up: the worst kept on top */
            const int64_t up = (i - 1) / 2;
            if (!better(h->kb[up], h->kp[up], h->kb[i], h->kp[i])) break;
            float tb = h->kb[i]; h->kb[i] = h->kb[up]; h->kb[up] = tb;
            int32_t tp = h->kp[i]; h->kp[i] = h->kp[up]; h->kp[up] = tp;
            i = up;
        }
    } else if (better(b, p, h->kb[0], h->kp[0])) {
        h->kb[0] = b, h->kp[0] = p;
        kept_sift(h->kb, h->kp, h->meta[0], 0);
    }
}

/* Head g's best w pages of rows [0, n) among super-pages [u0, u1) into h's kept heap: the pruned search. */
static void search_part(const hg_index *x, const float *q, int64_t group, int64_t g, int64_t n, int64_t w, int64_t u0, int64_t u1, part_scratch *h, int isa) {
    const int64_t d = x->d, P = x->page, S = x->super, count = (n + P - 1) / P, supers = u1 - u0;
    const float qmax = x->form == HG_INDEX_INT8 ? 127.0f : 7.0f;
    h->meta[0] = h->meta[1] = 0;
    if (w <= 0 || supers <= 0) return;
    for (int64_t j = 0; j < group; j++) {
        float a = 0.0f;
        for (int64_t c = 0; c < d; c++) {
            const float v = q[j * d + c];
            h->qp[j * d + c] = v > 0.0f ? v : 0.0f, h->qn[j * d + c] = v < 0.0f ? v : 0.0f;
            a += fabsf(v);
        }
        h->add[j] = SLACK * qmax * a;
    }
    for (int64_t i = 0; i < supers; i++) {
        const int64_t u = u0 + i;
        const uint8_t *c = x->super_codes + (g * x->super_cap + u) * x->code_bytes;
        const float sc = x->super_scales[g * x->super_cap + u];
#ifdef HG_IDX_X86
        if (isa >= 2) h->sb[i] = bound_avx512(x, c, sc, h->qp, h->qn, q, group, h->add);
        else if (isa >= 1) h->sb[i] = bound_avx2(x, c, sc, h->qp, h->qn, q, group, h->add);
        else
#endif
            h->sb[i] = bound_scalar(x, c, sc, q, group, h->add);
        h->heap[i] = (int32_t)i;
    }
    for (int64_t i = supers / 2 - 1; i >= 0; i--) super_sift(h->sb, h->heap, supers, i);
    int64_t left = supers;
    while (left > 0) {
        const int32_t i = h->heap[0];
        if (h->meta[0] == w && h->sb[i] < h->kb[0]) break;
        h->heap[0] = h->heap[--left];
        super_sift(h->sb, h->heap, left, 0);
        const int64_t u = u0 + i, end = (u + 1) * S < count ? (u + 1) * S : count;
        for (int64_t p = u * S; p < end; p++) {
            const uint8_t *c = x->page_codes + (g * x->page_cap + p) * x->code_bytes;
            const float sc = x->page_scales[g * x->page_cap + p];
            float b;
#ifdef HG_IDX_X86
            if (isa >= 2) b = bound_avx512(x, c, sc, h->qp, h->qn, q, group, NULL);
            else if (isa >= 1) b = bound_avx2(x, c, sc, h->qp, h->qn, q, group, NULL);
            else
#endif
                b = bound_scalar(x, c, sc, q, group, NULL);
            h->meta[1]++;
            keep(h, w, b, (int32_t)p);
        }
    }
}

/* The best w of the parts' kept pages into out, best first (the flat choice: each page the best w
 * over all holds is among its part's best w); returns the pages the parts bounded. */
static int64_t merge_parts(part_scratch *parts, int64_t nparts, int64_t w, int32_t *out) {
    part_scratch *m = &parts[0];
    int64_t read = m->meta[1];
    for (int64_t i = 1; i < nparts; i++) {
        read += parts[i].meta[1];
        for (int64_t t = 0; t < parts[i].meta[0]; t++) keep(m, w, parts[i].kb[t], parts[i].kp[t]);
    }
    for (int64_t k = m->meta[0]; k > 0; k--) { /* best first: pop the worst to the back */
        out[k - 1] = m->kp[0];
        m->kb[0] = m->kb[k - 1], m->kp[0] = m->kp[k - 1];
        kept_sift(m->kb, m->kp, k - 1, 0);
    }
    return read;
}

/* Parts a head's super-pages are split into: about two pieces a thread over the KV heads. */
static int64_t parts_for(int threads, int64_t kv_heads, int64_t supers) {
    int64_t p = (2 * (int64_t)threads + kv_heads - 1) / kv_heads;
    if (p > supers) p = supers;
    if (p > 64) p = 64;
    return p < 1 ? 1 : p;
}

/* Super-pages [u0, u1) of part `part` of `parts` over `supers`. */
static void part_range(int64_t supers, int64_t part, int64_t parts, int64_t *u0, int64_t *u1) {
    *u0 = supers * part / parts;
    *u1 = supers * (part + 1) / parts;
}

/* ---- primitives ---------------------------------------------------------------------------- */

typedef struct {
    const hg_index *x;
    const void *k;
    int ktype;
    int64_t kcap, from, to;
    const float *q;
    int64_t group, n, w, parts, supers;
    char *scratch;
    size_t per;
    int isa;
} prim_run;

/* Piece (KV head, part): the part's rows of [from, to), cut at super-page boundaries so no two parts write one summary. */
static void fold_task(void *v, int piece, int pieces) {
    (void)pieces;
    prim_run *r = v;
    const int64_t g = piece / r->parts, span = r->x->page * r->x->super, first = r->from / span;
    int64_t u0, u1;
    part_range((r->to + span - 1) / span - first, piece % r->parts, r->parts, &u0, &u1);
    const int64_t from = (first + u0) * span > r->from ? (first + u0) * span : r->from, to = (first + u1) * span < r->to ? (first + u1) * span : r->to;
    if (from >= to) return;
    float on_stack[512];
    float *mn = r->x->d <= 256 ? on_stack : malloc((size_t)r->x->d * 8);
    if (!mn) return; /* the caller's index stays as it was: only an allocation of 2·d floats can fail here */
    fold_head(r->x, (const char *)r->k, r->ktype, r->kcap, g, from, to, mn, mn + r->x->d);
    if (mn != on_stack) free(mn);
}

void hg_index_fold(void *base, int form, int64_t kv_heads, int64_t d, int64_t page, int64_t super, int64_t page_cap, const void *k, int ktype,
                   int64_t kcap, int64_t from, int64_t to, hg_stage *stage) {
    hg_index x;
    if (hg_index_view(&x, base, form, kv_heads, d, page, super, page_cap) || to <= from) return;
    prim_run r = {.x = &x, .k = k, .ktype = ktype, .kcap = kcap, .from = from, .to = to, .parts = 1};
    /* A decode step folds a row or two: waking the pool would cost more than the heads' pages take here. */
    if ((to - from + page) * kv_heads * d < 65536) {
        for (int64_t g = 0; g < kv_heads; g++) fold_task(&r, (int)g, (int)kv_heads);
        return;
    }
    hg_pool *pool = hg_sel_pool(stage);
    /* A first fold of a long store: enough parts a head for every thread (the heads alone are fewer than a host's cores). */
    const int64_t span = page * super, supers = (to + span - 1) / span - from / span;
    r.parts = parts_for(pool ? hg_pool_threads(pool) : 1, kv_heads, supers);
    hg_sel_pool_run(pool, fold_task, &r, (int)(kv_heads * r.parts));
}

/* hg_index_fold_many's small folds as one pool op: piece → (item, KV head) by the items' first pieces. */
typedef struct {
    hg_index x;
    prim_run r;
} fold_item;
typedef struct {
    fold_item *items;
    int64_t *first;
    int n;
} fold_batch;

static void fold_many_task(void *v, int piece, int pieces) {
    (void)pieces;
    fold_batch *b = v;
    int lo = 0, hi = b->n - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (b->first[mid] <= piece) lo = mid;
        else hi = mid - 1;
    }
    fold_item *it = &b->items[lo];
    fold_task(&it->r, (int)(piece - b->first[lo]), (int)it->x.kv_heads);
}

void hg_index_fold_many(const double *items, int n, hg_stage *stage) {
    if (n <= 0) return;
    fold_batch b = {.items = malloc((size_t)n * sizeof(fold_item)), .first = malloc((size_t)(n + 1) * sizeof(int64_t)), .n = 0};
    const int ok = b.items && b.first;
    int64_t pieces = 0;
    for (int i = 0; i < n; i++) {
        const double *t = items + 12 * i;
        void *base = (void *)(uintptr_t)t[0];
        const int form = (int)t[1], ktype = (int)t[8];
        const int64_t kv = (int64_t)t[2], d = (int64_t)t[3], page = (int64_t)t[4], super = (int64_t)t[5], cap = (int64_t)t[6], kcap = (int64_t)t[9];
        const int64_t from = (int64_t)t[10], to = (int64_t)t[11];
        const void *k = (const void *)(uintptr_t)t[7];
        /* A large fold (a sequence's first) takes the pool alone; so does every fold when the batch's tables could not be made. */
        if (!ok || (to - from + page) * kv * d >= 65536) {
            hg_index_fold(base, form, kv, d, page, super, cap, k, ktype, kcap, from, to, stage);
            continue;
        }
        fold_item *it = &b.items[b.n];
        if (hg_index_view(&it->x, base, form, kv, d, page, super, cap) || to <= from) continue;
        it->r = (prim_run){.x = &it->x, .k = k, .ktype = ktype, .kcap = kcap, .from = from, .to = to, .parts = 1};
        b.first[b.n++] = pieces;
        pieces += kv;
    }
    if (b.n > 0) {
        b.first[b.n] = pieces;
        hg_sel_pool_run(hg_sel_pool(stage), fold_many_task, &b, (int)pieces);
    }
    free(b.items);
    free(b.first);
}

static void search_task(void *v, int piece, int pieces) {
    (void)pieces;
    prim_run *r = v;
    const int64_t g = piece / r->parts, part = piece % r->parts;
    int64_t u0, u1;
    part_range(r->supers, part, r->parts, &u0, &u1);
    part_scratch h = part_at(r->scratch + (size_t)piece * r->per, u1 - u0, r->w, r->group, r->x->d);
    search_part(r->x, r->q + g * r->group * r->x->d, r->group, g, r->n, r->w, u0, u1, &h, r->isa);
}

int64_t hg_index_pages(void *base, int form, int64_t kv_heads, int64_t d, int64_t page, int64_t super, int64_t page_cap, const float *q, int64_t group,
                       int64_t n, int64_t want, int32_t *out, int isa, hg_stage *stage) {
    hg_index x;
    if (hg_index_view(&x, base, form, kv_heads, d, page, super, page_cap)) return 0;
    if (isa < 0) isa = hg_sel_best_isa();
    const int64_t count = (n + page - 1) / page, w = want < count ? want : count;
    if (w <= 0) return 0;
    hg_pool *pool = hg_sel_pool(stage);
    prim_run r = {.x = &x, .q = q, .group = group, .n = n, .w = w, .isa = isa, .supers = (count + super - 1) / super};
    r.parts = parts_for(pool ? hg_pool_threads(pool) : 1, kv_heads, r.supers);
    r.per = part_bytes(r.supers, w, group, d);
    r.scratch = aligned_alloc(64, r.per * (size_t)(kv_heads * r.parts));
    if (!r.scratch) return -2;
    hg_sel_pool_run(pool, search_task, &r, (int)(kv_heads * r.parts));
    int64_t read = 0;
    part_scratch parts[64];
    for (int64_t g = 0; g < kv_heads; g++) {
        for (int64_t i = 0; i < r.parts; i++) {
            int64_t u0, u1;
            part_range(r.supers, i, r.parts, &u0, &u1);
            parts[i] = part_at(r.scratch + (size_t)(g * r.parts + i) * r.per, u1 - u0, w, group, d);
        }
        read += merge_parts(parts, r.parts, w, out + g * w);
    }
    free(r.scratch);
    return read;
}

/* ---- the stage kernel ---------------------------------------------------------------------- */

typedef struct {
    const hg_stage_job *j;
    hg_index x;
    int64_t k, w, group, parts, supers;
    size_t per, list;
    char *scratch; /* per piece (KV head, part): part_scratch; then per list: best pages [w] int32, exact [page] f32, positions [page] int32, mn/mx [2d] f32 */
    int isa;
    atomic_int failed; /* 1: a chosen page out of range (bad_page), 2: scratch */
    int32_t bad_page;
} index_run;

static char *list_at(const index_run *r, int64_t g) { return r->scratch + r->per * (size_t)(r->j->kv_heads * r->parts) + r->list * (size_t)g; }

static void stage_fold_task(void *v, int g, int parts) {
    (void)parts;
    index_run *r = v;
    const hg_stage_job *j = r->j;
    float *mn = (float *)(list_at(r, g) + align64(r->w * 4) + 2 * align64(j->page_size * 4));
    fold_head(&r->x, hg_stage_k_head(j, 0), (int)j->ktype, j->kcap, g, j->pages_from, j->n, mn, mn + j->head_dim);
}

static void stage_search_task(void *v, int piece, int pieces) {
    (void)pieces;
    index_run *r = v;
    const hg_stage_job *j = r->j;
    const int64_t g = piece / r->parts, part = piece % r->parts;
    int64_t u0, u1;
    part_range(r->supers, part, r->parts, &u0, &u1);
    part_scratch h = part_at(r->scratch + (size_t)piece * r->per, u1 - u0, r->w, r->group, j->head_dim);
    search_part(&r->x, (const float *)(intptr_t)j->q + g * r->group * j->head_dim, r->group, g, j->n, r->w, u0, u1, &h, r->isa);
}

/* List g: the parts' best pages merged (or the device's), then Quest's filling of the list (indexSelection). */
static void stage_choose_task(void *v, int g, int pieces) {
    (void)pieces;
    index_run *r = v;
    const hg_stage_job *j = r->j;
    int32_t *best = (int32_t *)list_at(r, g);
    float *exact = (float *)((char *)best + align64(r->w * 4));
    int32_t *pos = (int32_t *)((char *)exact + align64(j->page_size * 4));
    if (j->flags & HG_STAGE_CHOSEN) {
        const int32_t *chosen = (const int32_t *)((const float *)(intptr_t)j->q + j->heads * j->head_dim) + g * r->w;
        const int64_t count = (j->n + j->page_size - 1) / j->page_size;
        for (int64_t i = 0; i < r->w; i++) {
            if (chosen[i] < 0 || chosen[i] >= count) {
                r->bad_page = chosen[i];
                r->failed = 1;
                return;
            }
            best[i] = chosen[i];
        }
    } else {
        part_scratch parts[64];
        for (int64_t i = 0; i < r->parts; i++) {
            int64_t u0, u1;
            part_range(r->supers, i, r->parts, &u0, &u1);
            parts[i] = part_at(r->scratch + (size_t)(g * r->parts + i) * r->per, u1 - u0, r->w, r->group, j->head_dim);
        }
        merge_parts(parts, r->parts, r->w, best);
    }
    if (hg_pages_to_list(j, g, best, r->w, r->k, r->group, exact, pos, r->isa) < 0) r->failed = 2;
}

int64_t hg_index_select(hg_pool *pool, const hg_stage_job *j, int isa, char **buf, size_t *bytes, char *err, size_t errcap) {
    index_run r = {.j = j, .isa = isa, .group = j->heads / j->kv_heads};
    if (hg_index_view(&r.x, (void *)(intptr_t)j->pages, (int)j->index_form, j->kv_heads, j->head_dim, j->page_size, j->super_pages, j->page_cap)) {
        snprintf(err, errcap, "cpu stage: page index form %lld does not exist (1 int8, 2 int4), or page size %lld / super-page %lld is not positive",
                 (long long)j->index_form, (long long)j->page_size, (long long)j->super_pages);
        return 1;
    }
    const int64_t P = j->page_size, count = (j->n + P - 1) / P, chosen = (j->flags & HG_STAGE_CHOSEN) != 0;
    r.k = j->budget < j->n ? j->budget : j->n;
    r.w = hg_index_want(j->budget, j->n, P);
    r.supers = (count + j->super_pages - 1) / j->super_pages;
    r.parts = parts_for(hg_pool_threads(pool), j->kv_heads, r.supers);
    r.per = part_bytes(r.supers, r.w, r.group, j->head_dim);
    r.list = (size_t)(align64(r.w * 4) + 2 * align64(P * 4) + align64(2 * j->head_dim * 4));
    const size_t need = (chosen ? 0 : r.per * (size_t)(j->kv_heads * r.parts)) + r.list * (size_t)j->kv_heads;
    if (chosen) r.parts = 0; /* list_at() then starts at the scratch */
    if (*bytes < need) {
        free(*buf);
        *buf = aligned_alloc(64, (need + 63) & ~(size_t)63);
        *bytes = *buf ? need : 0;
        if (!*buf) return -2;
    }
    r.scratch = *buf;
    atomic_init(&r.failed, 0);
    if (!chosen && j->pages_from < j->n) hg_pool_run(pool, stage_fold_task, &r, (int)j->kv_heads);
    if (r.k == 0) {
        for (int64_t g = 0; g < j->kv_heads; g++) ((int32_t *)(intptr_t)j->counts)[g] = 0;
        return 0;
    }
    if (!chosen) hg_pool_run(pool, stage_search_task, &r, (int)(j->kv_heads * r.parts));
    hg_pool_run(pool, stage_choose_task, &r, (int)j->kv_heads);
    const int failed = atomic_load(&r.failed);
    if (failed == 1) {
        snprintf(err, errcap, "cpu stage: the device's chosen page %d is out of range [0, %lld)", (int)r.bad_page, (long long)count);
        return 1;
    }
    return failed ? -2 : 0;
}
