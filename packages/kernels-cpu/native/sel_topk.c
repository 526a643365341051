/* Native top-K of one f32 row for selectors (hg_sel_topk, see sel_prims.h). A small K of a long
 * row reads the row once: a strided sample's rank sets a threshold a few K values deep, the
 * values at or above it are collected in index order, and the exact K-th largest is found
 * among them; when the sample misjudges (fewer than K collected, NaN-heavy rows) or K is a
 * large part of the row, the radix select of cpu_stage.c over order-preserving integer keys
 * runs instead. With a pool the O(n) passes run a chunk of the row per thread; the later
 * radix rounds only see the few keys of one bin and stay on the calling thread. */
#include "sel_prims.h"
#include "sel_pool.h"
#include "topk_row.h"
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define BINS 2048
#define SMALL_BINS 256
#define TOPK_CHUNK 4096 /* fewest elements worth a chunk of their own */
#define SAMPLE 512      /* sampled values that set the threshold */
#define SCAN_CHUNK 32768 /* fewest elements per chunk of the collecting pass */
#if defined(__x86_64__)
#include <immintrin.h>
#define HG_TOPK_X86 1
#endif

/* Order-preserving key: a > b (as floats) iff key(a) > key(b); ±0 share a key; every NaN is 0,
 * below every number's key (no number maps to 0: ~u == 0 needs u == 0xffffffff, a NaN). */
static inline uint32_t tkey(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t neg = (uint32_t)((int32_t)u >> 31); /* branch-free, so the key loops vectorize */
    uint32_t k = u ^ (neg | 0x80000000u);              /* negative: ~u; else u with the top bit set */
    k += k == 0x7fffffffu;                             /* -0's key becomes +0's */
    return (u & 0x7fffffffu) > 0x7f800000u ? 0 : k;
}

/* The search narrowed to bin b (2^sh keys wide from lo, cut at hi): the keys inside it packed
 * into cand (branch-free), which becomes src; lo and hi become the bin's bounds. */
static inline void narrow_to_bin(const uint32_t **src, int64_t *m, uint32_t *lo, uint32_t *hi, int b, int sh, uint32_t *cand) {
    const uint32_t blo = *lo + ((uint32_t)b << sh), span = (1u << sh) - 1, bhi = *hi - blo < span ? *hi : blo + span;
    const uint32_t *in = *src;
    int64_t o = 0;
    for (int64_t j = 0; j < *m; j++) {
        const uint32_t x = in[j];
        cand[o] = x;
        o += (x - blo) <= (bhi - blo);
    }
    *src = cand;
    *m = o;
    *lo = blo;
    *hi = bhi;
}

/* The k-th largest of key[0..m) (1 <= k <= m), all in [lo, hi], as in cpu_stage.c: a
 * histogram over the keys' range, the bin holding it compacted into cand (in place once
 * src == cand), repeated on that bin's range. */
static uint32_t kth_largest(const uint32_t *src, int64_t m, int64_t need, uint32_t lo, uint32_t hi, uint32_t *cand) {
    static _Thread_local uint32_t hist[4][BINS];
    for (;;) {
        if (lo == hi) return lo;
        const uint32_t range = hi - lo, most = m <= 4 * SMALL_BINS ? SMALL_BINS : BINS; /* few keys: fewer bins to clear and scan */
        int sh = 0;
        while ((range >> sh) >= most) sh++;
        const int bins = (int)(range >> sh) + 1;
        for (int c = 0; c < 4; c++) memset(hist[c], 0, (size_t)bins * sizeof(uint32_t));
        int64_t i = 0;
        for (; i + 4 <= m; i += 4) {
            hist[0][(src[i] - lo) >> sh]++;
            hist[1][(src[i + 1] - lo) >> sh]++;
            hist[2][(src[i + 2] - lo) >> sh]++;
            hist[3][(src[i + 3] - lo) >> sh]++;
        }
        for (; i < m; i++) hist[0][(src[i] - lo) >> sh]++;
        int b = bins - 1;
        for (;; b--) {
            int64_t c = (int64_t)hist[0][b] + hist[1][b] + hist[2][b] + hist[3][b];
            if (need <= c || b == 0) break;
            need -= c;
        }
        if (sh == 0) return lo + (uint32_t)b;
        narrow_to_bin(&src, &m, &lo, &hi, b, sh, cand);
    }
}

/* Per chunk: its key range, then (first round) its histogram and compacted bin, then its
 * count above / equal to the threshold and where its ids go. */
typedef struct { uint32_t lo, hi; int64_t kept, above, equal, at, take; } chunk_stat;

typedef struct {
    const float *x;
    int64_t n;
    int32_t *out, *idx; /* idx: the collecting pass's indices, a chunk's at its own start */
    float tf;           /* the collecting pass's threshold */
    uint32_t *key, *cand, *hist; /* hist: [chunks][BINS] */
    chunk_stat *st;
    int chunks, sh, bins, avx2; /* avx2: the vector loops run */
    uint32_t lo, blo, bhi, t;
} topk_run;

static float unkey(uint32_t k);
#ifdef HG_TOPK_X86
static int64_t collect_avx2(const float *x, int64_t b, int64_t e, float tf, int32_t *idx);
#endif

static void chunk_of(const topk_run *r, int part, int64_t *b, int64_t *e) { hg_split(r->n, 64, part, r->chunks, b, e); }

#ifdef HG_TOPK_X86
/* tkey of x[b..e) into key, eight at a time; its lowest and highest key through *lo / *hi. */
__attribute__((target("avx2"))) static void keys_avx2(const float *x, uint32_t *key, int64_t b, int64_t e, uint32_t *lo, uint32_t *hi) {
    const __m256i top = _mm256_set1_epi32((int)0x80000000u), mag = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    __m256i vlo = _mm256_set1_epi32(-1), vhi = _mm256_setzero_si256();
    int64_t i = b;
    for (; i + 8 <= e; i += 8) {
        __m256i u = _mm256_loadu_si256((const __m256i *)(x + i));
        __m256i k = _mm256_xor_si256(u, _mm256_or_si256(_mm256_srai_epi32(u, 31), top));
        k = _mm256_sub_epi32(k, _mm256_cmpeq_epi32(k, mag));                        /* -0 -> +0's key */
        k = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_and_si256(u, mag), inf), k); /* NaN -> 0 */
        _mm256_storeu_si256((__m256i *)(key + i), k);
        vlo = _mm256_min_epu32(vlo, k);
        vhi = _mm256_max_epu32(vhi, k);
    }
    uint32_t l[8], h[8], mn = *lo, mx = *hi;
    _mm256_storeu_si256((__m256i *)l, vlo);
    _mm256_storeu_si256((__m256i *)h, vhi);
    for (int j = 0; j < 8; j++) {
        mn = l[j] < mn ? l[j] : mn;
        mx = h[j] > mx ? h[j] : mx;
    }
    for (; i < e; i++) {
        uint32_t k = tkey(x[i]);
        key[i] = k;
        mn = k < mn ? k : mn;
        mx = k > mx ? k : mx;
    }
    *lo = mn;
    *hi = mx;
}
#endif

static void keys_part(void *v, int part, int parts) {
    (void)parts;
    topk_run *r = v;
    int64_t b, e;
    chunk_of(r, part, &b, &e);
    uint32_t lo = UINT32_MAX, hi = 0, *key = r->key;
    const float *x = r->x;
#ifdef HG_TOPK_X86
    if (r->avx2) keys_avx2(x, key, b, e, &lo, &hi);
    else
#endif
    for (int64_t i = b; i < e; i++) {
        uint32_t k = tkey(x[i]);
        key[i] = k;
        lo = k < lo ? k : lo;
        hi = k > hi ? k : hi;
    }
    r->st[part].lo = lo;
    r->st[part].hi = hi;
}

static void hist_part(void *v, int part, int parts) {
    (void)parts;
    topk_run *r = v;
    int64_t b, e;
    chunk_of(r, part, &b, &e);
    uint32_t *h = r->hist + (size_t)part * BINS;
    const uint32_t *key = r->key, lo = r->lo; /* locals: stores to h may alias r's fields */
    const int sh = r->sh;
    memset(h, 0, (size_t)r->bins * sizeof(uint32_t));
    for (int64_t i = b; i < e; i++) h[(key[i] - lo) >> sh]++;
}

/* The chunk's keys of the chosen bin, packed at the chunk's own start in cand. */
static void compact_part(void *v, int part, int parts) {
    (void)parts;
    topk_run *r = v;
    int64_t b, e;
    chunk_of(r, part, &b, &e);
    int64_t o = b;
    const uint32_t blo = r->blo, w = r->bhi - r->blo;
    for (int64_t i = b; i < e; i++) {
        uint32_t x = r->key[i];
        r->cand[o] = x;
        o += (x - blo) <= w;
    }
    r->st[part].kept = o - b;
}

__attribute__((target_clones("avx2", "default"))) static void count_part(void *v, int part, int parts) {
    (void)parts;
    topk_run *r = v;
    int64_t b, e, above = 0, equal = 0;
    chunk_of(r, part, &b, &e);
    const uint32_t t = r->t, *key = r->key;
    for (int64_t i = b; i < e; i++) {
        above += key[i] > t;
        equal += key[i] == t;
    }
    r->st[part].above = above;
    r->st[part].equal = equal;
}

static void emit_part(void *v, int part, int parts) {
    (void)parts;
    topk_run *r = v;
    int64_t b, e, o = r->st[part].at, take = r->st[part].take;
    chunk_of(r, part, &b, &e);
    const int64_t end = o + r->st[part].above + take; /* this chunk's slots of out */
#ifdef HG_TOPK_X86
    /* every tie of the chunk is kept and no NaN is: exactly the values >= t's float, so the
     * vector collect writes them (it writes exactly end - o ids then) */
    if (take == r->st[part].equal && r->t != 0 && r->avx2 && e - b >= 64) {
        collect_avx2(r->x, b, e, unkey(r->t), r->out + o);
        return;
    }
#endif
    const uint32_t t = r->t, *key = r->key;
    int32_t *out = r->out;
    for (int64_t i = b; i < e && o < end; i++) { /* branch-free: a selected id is written, then kept */
        const uint32_t k = key[i];
        const int64_t tie = (k == t) & (take > 0);
        out[o] = (int32_t)i;
        o += (k > t) | tie;
        take -= tie;
    }
}

/* The float a key stands for (NaN's key 0 is never asked for). */
static float unkey(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

#ifdef HG_TOPK_X86
__attribute__((target("avx2"))) static int64_t collect_avx2(const float *x, int64_t b, int64_t e, float tf, int32_t *idx) {
    const __m256 t = _mm256_set1_ps(tf);
    int64_t i = b, o = 0;
    for (; i + 8 <= e; i += 8) {
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), t, _CMP_GE_OQ)); /* NaN: false */
        while (m) {
            idx[o++] = (int32_t)(i + __builtin_ctz(m));
            m &= m - 1;
        }
    }
    for (; i < e; i++)
        if (x[i] >= tf) idx[o++] = (int32_t)i; /* writes only what it keeps: idx may be exactly that long */
    return o;
}
#endif

/* Indices of x[b..e) >= tf, ascending, at idx + b; the chunk's count in kept. */
static void collect_part(void *v, int part, int parts) {
    (void)parts;
    topk_run *r = v;
    int64_t b, e, o = 0;
    hg_split(r->n, 64, part, r->chunks, &b, &e);
    int32_t *idx = r->idx + b;
#ifdef HG_TOPK_X86
    if (r->avx2) o = collect_avx2(r->x, b, e, r->tf, idx);
    else
#endif
    for (int64_t i = b; i < e; i++) {
        idx[o] = (int32_t)i;
        o += r->x[i] >= r->tf;
    }
    r->st[part].kept = o;
}

/* The sampled path; 0 when it does not apply or misjudged (the radix path runs then). */
static int64_t topk_sampled(topk_run *r, int64_t k, hg_pool *pool, int threads) {
    const int64_t n = r->n;
    if (n < 8 * SAMPLE || 4 * k > n) return 0;
    const int64_t rank = ((3 * k + 128) * SAMPLE + n - 1) / n; /* about 3K + 128 values expected above */
    if (rank >= SAMPLE / 2) return 0;
    uint32_t *sk = r->key, lo = UINT32_MAX, hi = 0;
    for (int64_t j = 0; j < SAMPLE; j++) {
        uint32_t kk = tkey(r->x[(2 * j + 1) * n / (2 * SAMPLE)]);
        sk[j] = kk;
        lo = kk < lo ? kk : lo;
        hi = kk > hi ? kk : hi;
    }
    const uint32_t t0 = kth_largest(sk, SAMPLE, rank, lo, hi, r->cand);
    if (t0 == 0) return 0; /* NaN-deep: the threshold would take everything */
    r->tf = unkey(t0);
    int64_t most = n / SCAN_CHUNK;
    r->chunks = threads < most ? threads : (int)(most > 0 ? most : 1);
    hg_sel_pool_run(pool, collect_part, r, r->chunks);
    int64_t m = 0;
    for (int p = 0; p < r->chunks; p++) {
        int64_t b0, e0;
        hg_split(n, 64, p, r->chunks, &b0, &e0);
        memmove(r->idx + m, r->idx + b0, (size_t)r->st[p].kept * sizeof(int32_t));
        m += r->st[p].kept;
    }
    if (m < k) return 0;
    uint32_t *key = r->key;
    lo = UINT32_MAX;
    hi = 0;
    for (int64_t j = 0; j < m; j++) {
        uint32_t kk = tkey(r->x[r->idx[j]]);
        key[j] = kk;
        lo = kk < lo ? kk : lo;
        hi = kk > hi ? kk : hi;
    }
    const uint32_t t = kth_largest(key, m, k, lo, hi, r->cand);
    int64_t above = 0, o = 0;
    for (int64_t j = 0; j < m; j++) above += key[j] > t;
    int64_t ties = k - above;
    for (int64_t j = 0; j < m && o < k; j++)
        if (key[j] > t || (key[j] == t && ties-- > 0)) r->out[o++] = r->idx[j];
    return k;
}

/* Scratch of the calling thread, grown as rows grow (selectors call top-K once per KV head); a
 * thread key frees it when the thread ends (a CPU stage's pool threads end with the stage).
 * One buffer for hg_sel_topk's single rows, one for hg_topk_rows' lists. */
typedef struct { void *p; size_t bytes; } scratch_buf;
static _Thread_local scratch_buf row_scratch, rows_scratch;
static pthread_key_t row_key, rows_key;
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;
static void scratch_free(void *p) { free(p); }
static void keys_make(void) {
    pthread_key_create(&row_key, scratch_free);
    pthread_key_create(&rows_key, scratch_free);
}

/* s grown to `need` bytes (old contents dropped) and registered with `key`; NULL when out of memory. */
static void *scratch_grow(scratch_buf *s, size_t need, pthread_key_t *key) {
    if (s->bytes >= need) return s->p;
    free(s->p);
    s->p = malloc(need);
    s->bytes = s->p ? need : 0;
    pthread_once(&keys_once, keys_make);
    pthread_setspecific(*key, s->p);
    return s->p;
}

int64_t hg_sel_topk(const float *x, int64_t n, int64_t k, int32_t *out, int isa, hg_stage *stage) {
    static int best = -1; /* the CPU's, asked once */
    if (best < 0) best = hg_sel_best_isa();
    return hg_topk_row(x, n, k, out, (isa < 0 ? best : isa) >= 1, hg_sel_pool(stage));
}

int64_t hg_sel_topk_rows(const float *src, int64_t nsrc, float *maxrow, int64_t lists, int64_t n, int64_t k, int32_t *out, int64_t ostride,
                         int isa, hg_stage *stage) {
    static int best = -1;
    if (best < 0) best = hg_sel_best_isa();
    return hg_topk_rows(src, nsrc, maxrow, NULL, lists, n, k, out, ostride, (isa < 0 ? best : isa) >= 1, hg_sel_pool(stage));
}

int64_t hg_topk_row(const float *x, int64_t n, int64_t k, int32_t *out, int avx2, hg_pool *pool) {
    if (k > n) k = n;
    if (k <= 0) return 0;
    if (k == n) {
        for (int64_t i = 0; i < n; i++) out[i] = (int32_t)i;
        return k;
    }
    int threads = pool ? hg_pool_threads(pool) : 1;
    int64_t most = n / TOPK_CHUNK;
    int chunks = threads < most ? threads : (int)(most > 0 ? most : 1);
    const int64_t n2 = (n + 1) & ~(int64_t)1; /* keeps the chunk stats 8-byte aligned */
    size_t need = (size_t)n2 * 3 * sizeof(uint32_t) + (size_t)chunks * (BINS * sizeof(uint32_t) + sizeof(chunk_stat));
    if (!scratch_grow(&row_scratch, need, &row_key)) return -1;
    /* scratch: keys [n2], candidate keys [n2], collected indices [n2], then per chunk a histogram and stats */
    uint32_t *base = row_scratch.p;
    topk_run r = { .x = x, .n = n, .out = out, .idx = (int32_t *)(base + 2 * n2), .key = base, .cand = base + n2, .hist = base + 3 * n2, .chunks = chunks };
    r.st = (chunk_stat *)(r.hist + (size_t)chunks * BINS);
    r.avx2 = avx2;
    if (topk_sampled(&r, k, pool, threads)) return k;
    r.chunks = chunks;
    hg_sel_pool_run(pool, keys_part, &r, chunks);
    uint32_t lo = UINT32_MAX, hi = 0;
    for (int c = 0; c < chunks; c++) {
        lo = r.st[c].lo < lo ? r.st[c].lo : lo;
        hi = r.st[c].hi > hi ? r.st[c].hi : hi;
    }
    if (lo == hi) {
        r.t = lo;
    } else {
        /* the first round, chunk-parallel; later rounds see one bin's keys */
        const uint32_t range = hi - lo, most = n <= 4 * SMALL_BINS ? SMALL_BINS : BINS;
        while ((range >> r.sh) >= most) r.sh++;
        r.bins = (int)(range >> r.sh) + 1;
        r.lo = lo;
        hg_sel_pool_run(pool, hist_part, &r, chunks);
        int64_t left = k;
        int b = r.bins - 1;
        for (;; b--) {
            int64_t c = 0;
            for (int p = 0; p < chunks; p++) c += r.hist[(size_t)p * BINS + b];
            if (left <= c || b == 0) break;
            left -= c;
        }
        if (r.sh == 0) {
            r.t = lo + (uint32_t)b;
        } else {
            r.blo = lo + ((uint32_t)b << r.sh);
            const uint32_t span = (1u << r.sh) - 1;
            r.bhi = hi - r.blo < span ? hi : r.blo + span;
            hg_sel_pool_run(pool, compact_part, &r, chunks);
            int64_t m = 0;
            for (int p = 0; p < chunks; p++) {
                int64_t b0, e0;
                chunk_of(&r, p, &b0, &e0);
                memmove(r.cand + m, r.cand + b0, (size_t)r.st[p].kept * sizeof(uint32_t));
                m += r.st[p].kept;
            }
            r.t = kth_largest(r.cand, m, left, r.blo, r.bhi, r.cand);
        }
    }
    hg_sel_pool_run(pool, count_part, &r, chunks);
    int64_t above = 0, at = 0;
    for (int c = 0; c < chunks; c++) above += r.st[c].above;
    int64_t ties = k - above;
    for (int c = 0; c < chunks; c++) {
        int64_t take = r.st[c].equal < ties ? r.st[c].equal : ties;
        ties -= take;
        r.st[c].take = take;
        r.st[c].at = at;
        at += r.st[c].above + take;
    }
    hg_sel_pool_run(pool, emit_part, &r, chunks);
    return k;
}

/* ---- several rows at once: the CPU stage's lists ---------------------------------------------- */
#define ROWS_SAMPLE_MIN 512  /* a list's sample: n / 64 values, within these bounds */
#define ROWS_SAMPLE_MAX 2048
#define ROWS_PART 8192       /* fewest loads worth a piece of the collecting pass */

typedef struct {
    const float *src, *sample; /* sample: [lists*nsrc][S] values at the sample positions, or NULL */
    float *maxrow;
    int64_t nsrc, lists, n, k, ostride, *cnt; /* cnt: [lists][parts] values each piece collected */
    int32_t *out, *idx; /* idx and val: a list's collected ids and values at its own [l*n, (l+1)*n) */
    float *val, *thr;   /* thr: each list's collecting threshold (NaN: collect nothing) */
    uint32_t *key, *cand;
    unsigned char *redo; /* lists whose sampled threshold misjudged */
    int parts, avx2, sampled;
    atomic_int failed;
} rows_run;

static int64_t rows_sample(int64_t n) { return n / 64 < ROWS_SAMPLE_MIN ? ROWS_SAMPLE_MIN : n / 64 > ROWS_SAMPLE_MAX ? ROWS_SAMPLE_MAX : n / 64; }
int64_t hg_topk_rows_sample(int64_t n) { return rows_sample(n); }
/* The sample's rank whose value leaves at least K of the row at or above it but for a chance of
 * ~1e-5 (a Poisson tail: mu = K*S/n samples expected among the top K, 4 sigma and 4 more above it). */
static int64_t rows_rank(int64_t n, int64_t k) {
    const double mu = (double)k * (double)rows_sample(n) / (double)n;
    return (int64_t)ceil(mu + 4 * sqrt(mu) + 4);
}

/* List l's value at i: its row's, or the max over its source rows (NaN never wins; -inf when every one is NaN). */
static inline float rows_value(const rows_run *r, int64_t l, int64_t i) {
    const float *s = r->src + l * r->nsrc * r->n + i;
    if (r->nsrc == 1) return *s;
    float m = -INFINITY;
    for (int64_t q = 0; q < r->nsrc; q++) m = s[q * r->n] > m ? s[q * r->n] : m;
    return m;
}

static inline const float *rows_row(const rows_run *r, int64_t l) { return r->nsrc == 1 ? r->src + l * r->n : r->maxrow + l * r->n; }

/* kth_largest for the few thousand keys the rows path ranks (a sample, a list's candidates): one
 * 256-bin histogram a round, which costs less to clear and scan than kth_largest's 4 x 2048. */
static uint32_t kth_few(const uint32_t *src, int64_t m, int64_t need, uint32_t lo, uint32_t hi, uint32_t *cand) {
    uint32_t hist[256];
    for (;;) {
        if (lo == hi) return lo;
        int sh = 0;
        while (((hi - lo) >> sh) >= 256) sh++;
        const int bins = (int)((hi - lo) >> sh) + 1;
        memset(hist, 0, (size_t)bins * sizeof(uint32_t));
        for (int64_t j = 0; j < m; j++) hist[(src[j] - lo) >> sh]++;
        int b = bins - 1;
        for (; b > 0 && need > hist[b]; b--) need -= hist[b];
        if (sh == 0) return lo + (uint32_t)b;
        narrow_to_bin(&src, &m, &lo, &hi, b, sh, cand);
    }
}

/* List l's collecting threshold from a strided sample of its values (the same positions in every
 * list: the caller's copy, else read here, one cache miss each); NaN (collect nothing, the list is
 * redone) when the sample is NaN-deep. */
static void rows_threshold_part(void *v, int l, int parts) {
    (void)parts;
    rows_run *r = v;
    uint32_t sk[2 * ROWS_SAMPLE_MAX], lo = UINT32_MAX, hi = 0;
    const int64_t n = r->n, S = rows_sample(n);
    for (int64_t j = 0; j < S; j++) {
        float x = -INFINITY;
        if (!r->sample) x = rows_value(r, l, (2 * j + 1) * n / (2 * S));
        else if (r->nsrc == 1) x = r->sample[l * S + j];
        else
            for (int64_t q = 0; q < r->nsrc; q++) x = r->sample[(l * r->nsrc + q) * S + j] > x ? r->sample[(l * r->nsrc + q) * S + j] : x;
        const uint32_t kk = tkey(x);
        sk[j] = kk;
        lo = kk < lo ? kk : lo;
        hi = kk > hi ? kk : hi;
    }
    const uint32_t t0 = kth_few(sk, S, rows_rank(n, r->k), lo, hi, sk + S);
    r->thr[l] = t0 == 0 ? NAN : unkey(t0);
}

#ifdef HG_TOPK_X86
/* pack_lut[m]: the lanes of the set bits of m, lowest first, a byte each: the permutation that
 * packs a vector's kept lanes to its front (no branch per kept value). */
static uint64_t pack_lut[256];
__attribute__((constructor)) static void pack_lut_init(void) {
    for (int m = 0; m < 256; m++) {
        uint64_t w = 0;
        for (int b = 0, o = 0; b < 8; b++)
            if (m >> b & 1) w |= (uint64_t)b << (8 * o++);
        pack_lut[m] = w;
    }
}

/* Ids and values >= tf of x[b..e) (the max of nsrc rows n apart, written to mx, when nsrc > 1:
 * _mm256_max_ps(x, m) is x > m ? x : m, so a NaN never wins) into idx / val; returns the count.
 * A block writes 8 lanes at its count: never past its own slots, as the count lags the index. */
__attribute__((target("avx2"))) static int64_t pack_ge_avx2(const float *x, int64_t nsrc, int64_t n, float *mx, int64_t b, int64_t e, float tf,
                                                            int32_t *idx, float *val) {
    const __m256 t = _mm256_set1_ps(tf), ninf = _mm256_set1_ps(-INFINITY);
    int64_t i = b, o = 0;
    for (; i + 8 <= e; i += 8) {
        __m256 m = _mm256_loadu_ps(x + i);
        if (nsrc > 1) {
            m = _mm256_max_ps(m, ninf);
            for (int64_t q = 1; q < nsrc; q++) m = _mm256_max_ps(_mm256_loadu_ps(x + q * n + i), m);
            _mm256_storeu_ps(mx + i, m);
        }
        const unsigned bits = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(m, t, _CMP_GE_OQ)); /* NaN: never */
        const __m256i p = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&pack_lut[bits]));
        _mm256_storeu_si256((__m256i *)(idx + o), _mm256_add_epi32(p, _mm256_set1_epi32((int)i)));
        _mm256_storeu_ps(val + o, _mm256_permutevar8x32_ps(m, p));
        o += __builtin_popcount(bits);
    }
    for (; i < e; i++) {
        float m = x[i];
        if (nsrc > 1) {
            m = m > -INFINITY ? m : -INFINITY;
            for (int64_t q = 1; q < nsrc; q++) m = x[q * n + i] > m ? x[q * n + i] : m;
            mx[i] = m;
        }
        idx[o] = (int32_t)i;
        val[o] = m;
        o += m >= tf;
    }
    return o;
}
#endif

/* Piece `part` of the lists' flattened values: the ids and values at or above each list's
 * threshold, at the list's own offsets. */
static void rows_collect_part(void *v, int part, int parts) {
    rows_run *r = v;
    const int64_t n = r->n;
    int64_t b, e;
    hg_split(r->lists * n, 64, part, parts, &b, &e);
    for (int64_t l = b / n; l < r->lists && l * n < e; l++) {
        const int64_t i0 = b - l * n > 0 ? b - l * n : 0, i1 = e - l * n < n ? e - l * n : n;
        const float tf = r->thr[l], *x = r->src + l * r->nsrc * n;
        int32_t *idx = r->idx + l * n + i0;
        float *val = r->val + l * n + i0, *mx = r->nsrc > 1 ? r->maxrow + l * n : NULL;
        int64_t o = 0;
#ifdef HG_TOPK_X86
        if (r->avx2) o = pack_ge_avx2(x, r->nsrc, n, mx, i0, i1, tf, idx, val);
        else
#endif
        for (int64_t i = i0; i < i1; i++) { /* branch-free: written, then kept */
            const float m = rows_value(r, l, i);
            if (r->nsrc > 1) mx[i] = m;
            idx[o] = (int32_t)i;
            val[o] = m;
            o += m >= tf;
        }
        r->cnt[l * parts + part] = o;
    }
}

#ifdef HG_TOPK_X86
/* How many of val[0..m) are above tv and equal to it. */
__attribute__((target("avx2"))) static void count_avx2(const float *val, int64_t m, float tv, int64_t *above, int64_t *equal) {
    const __m256 t = _mm256_set1_ps(tv);
    int64_t j = 0, a = 0, q = 0;
    for (; j + 8 <= m; j += 8) {
        const __m256 x = _mm256_loadu_ps(val + j);
        a += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(x, t, _CMP_GT_OQ)));
        q += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(x, t, _CMP_EQ_OQ)));
    }
    for (; j < m; j++) {
        a += val[j] > tv;
        q += val[j] == tv;
    }
    *above = a;
    *equal = q;
}

/* ids[j] for val[j] >= tv, j < m, into out: the whole selection when no tie at tv is left out. */
__attribute__((target("avx2"))) static void emit_ge_avx2(const int32_t *ids, const float *val, int64_t m, float tv, int32_t *out, int64_t k) {
    const __m256 t = _mm256_set1_ps(tv);
    int64_t j = 0, o = 0;
    for (; j + 8 <= m && o + 8 <= k; j += 8) { /* 8 lanes land at o: only while they fit in out */
        const unsigned bits = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(val + j), t, _CMP_GE_OQ));
        const __m256i p = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)&pack_lut[bits]));
        _mm256_storeu_si256((__m256i *)(out + o), _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)(ids + j)), p));
        o += __builtin_popcount(bits);
    }
    for (; j < m && o < k; j++)
        if (val[j] >= tv) out[o++] = ids[j];
}
#endif

/* List l: its pieces' ids and values packed at the front of its range, the exact K-th largest
 * among them, and the K ids (ties to the lower id) in order; marked for redo when fewer than K
 * were collected. The values are all numbers (>= the threshold), so float compares rank them. */
static void rows_select_part(void *v, int part, int parts) {
    (void)parts;
    rows_run *r = v;
    const int64_t n = r->n, l = part, k = r->k;
    int32_t *ids = r->idx + l * n;
    float *val = r->val + l * n;
    int64_t m = 0;
    for (int p = 0; p < r->parts; p++) {
        const int64_t c = r->cnt[l * r->parts + p];
        if (!c) continue;
        int64_t b, e;
        hg_split(r->lists * n, 64, p, r->parts, &b, &e);
        const int64_t from = (b > l * n ? b : l * n) - l * n;
        if (from != m) {
            memmove(ids + m, ids + from, (size_t)c * sizeof(int32_t));
            memmove(val + m, val + from, (size_t)c * sizeof(float));
        }
        m += c;
    }
    if (m < k) {
        r->redo[l] = 1;
        return;
    }
    uint32_t *key = r->key + l * n, lo = UINT32_MAX, hi = 0;
    int64_t above = 0, equal = 0;
#ifdef HG_TOPK_X86
    if (r->avx2) keys_avx2(val, key, 0, m, &lo, &hi);
    else
#endif
    for (int64_t j = 0; j < m; j++) {
        const uint32_t kk = tkey(val[j]);
        key[j] = kk;
        lo = kk < lo ? kk : lo;
        hi = kk > hi ? kk : hi;
    }
    const float tv = unkey(kth_few(key, m, k, lo, hi, r->cand + l * n));
#ifdef HG_TOPK_X86
    if (r->avx2) count_avx2(val, m, tv, &above, &equal);
    else
#endif
    for (int64_t j = 0; j < m; j++) {
        above += val[j] > tv;
        equal += val[j] == tv;
    }
    int32_t *out = r->out + l * r->ostride;
    int64_t ties = k - above, o = 0;
#ifdef HG_TOPK_X86
    if (r->avx2 && ties == equal) {
        emit_ge_avx2(ids, val, m, tv, out, k);
        return;
    }
#endif
    for (int64_t j = 0; j < m && o < k; j++) { /* branch-free as emit_part: written, then kept */
        const int64_t tie = (val[j] == tv) & (ties > 0);
        out[o] = ids[j];
        o += (val[j] > tv) | tie;
        ties -= tie;
    }
}

/* List l (redo[l] set, or every list when the sampled path does not apply) through hg_topk_row on one thread. */
static void rows_single_part(void *v, int part, int parts) {
    (void)parts;
    rows_run *r = v;
    if (r->redo[part] && hg_topk_row(rows_row(r, part), r->n, r->k, r->out + part * r->ostride, r->avx2, NULL) < 0) atomic_store(&r->failed, 1);
}

int64_t hg_topk_rows(const float *src, int64_t nsrc, float *maxrow, const float *sample, int64_t lists, int64_t n, int64_t k, int32_t *out,
                     int64_t ostride, int avx2, hg_pool *pool) {
    if (k > n) k = n;
    if (k <= 0 || lists <= 0) return 0;
    if (k == n) { /* every id, whatever the values (hg_topk_row's k == n) */
        for (int64_t l = 0; l < lists; l++)
            for (int64_t i = 0; i < n; i++) out[l * ostride + i] = (int32_t)i;
        return 0;
    }
    const int threads = pool ? hg_pool_threads(pool) : 1;
    const int sampled = n >= 8 * ROWS_SAMPLE_MIN && 4 * k <= n && rows_rank(n, k) < rows_sample(n) / 2;
    const int64_t loads = lists * n * nsrc, most = (loads + ROWS_PART - 1) / ROWS_PART;
    const int parts = (int)(threads < most ? threads : most);
    const size_t need = (size_t)lists * n * 16 + (size_t)lists * parts * sizeof(int64_t) + (size_t)lists * (sizeof(float) + 1) + 64;
    if (!scratch_grow(&rows_scratch, need, &rows_key)) return -1;
    /* scratch: per-piece counts [lists][parts]; ids, values, keys and candidate keys [lists][n]; thresholds, redo flags [lists] */
    rows_run r = { .src = src, .sample = sample, .maxrow = maxrow, .nsrc = nsrc, .lists = lists, .n = n, .k = k, .ostride = ostride, .out = out,
                   .parts = parts, .avx2 = avx2, .sampled = sampled };
    r.cnt = rows_scratch.p;
    r.idx = (int32_t *)(r.cnt + (size_t)lists * parts);
    r.val = (float *)(r.idx + (size_t)lists * n);
    r.key = (uint32_t *)(r.val + (size_t)lists * n);
    r.cand = r.key + (size_t)lists * n;
    r.thr = (float *)(r.cand + (size_t)lists * n);
    r.redo = (unsigned char *)(r.thr + lists);
    atomic_init(&r.failed, 0);
    memset(r.cnt, 0, (size_t)lists * parts * sizeof(int64_t));
    memset(r.redo, !sampled, (size_t)lists);
    if (sampled) hg_sel_pool_run(pool, rows_threshold_part, &r, (int)lists);
    else
        for (int64_t l = 0; l < lists; l++) r.thr[l] = NAN; /* only the max rows: collect nothing */
    if (sampled || nsrc > 1) hg_sel_pool_run(pool, rows_collect_part, &r, parts);
    if (sampled) hg_sel_pool_run(pool, rows_select_part, &r, (int)lists);
    int64_t redo = 0, last = 0;
    for (int64_t l = 0; l < lists; l++)
        if (r.redo[l]) redo++, last = l;
    if (redo == 1) { /* one list: hg_topk_row splits it over the pool */
        if (hg_topk_row(rows_row(&r, last), n, k, out + last * ostride, avx2, pool) < 0) return -1;
    } else if (redo > 1) {
        hg_sel_pool_run(pool, rows_single_part, &r, (int)lists);
    }
    return atomic_load(&r.failed) ? -1 : 0;
}
