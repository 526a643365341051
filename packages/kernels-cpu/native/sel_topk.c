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
#include <pthread.h>
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
        const uint32_t blo = lo + ((uint32_t)b << sh), span = (1u << sh) - 1;
        const uint32_t bhi = hi - blo < span ? hi : blo + span;
        int64_t o = 0;
        for (int64_t j = 0; j < m; j++) {
            uint32_t x = src[j];
            cand[o] = x;
            o += (x - blo) <= (bhi - blo);
        }
        src = cand;
        m = o;
        lo = blo;
        hi = bhi;
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
 * thread key frees it when the thread ends (a CPU stage's pool threads end with the stage). */
static _Thread_local void *scratch;
static _Thread_local size_t scratch_bytes;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static void scratch_free(void *p) { free(p); }
static void scratch_key_make(void) { pthread_key_create(&scratch_key, scratch_free); }

int64_t hg_sel_topk(const float *x, int64_t n, int64_t k, int32_t *out, int isa, hg_stage *stage) {
    static int best = -1; /* the CPU's, asked once */
    if (best < 0) best = hg_sel_best_isa();
    return hg_topk_row(x, n, k, out, isa < 0 ? best == 1 : isa == 1, hg_sel_pool(stage));
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
    if (scratch_bytes < need) {
        free(scratch);
        scratch = malloc(need);
        scratch_bytes = scratch ? need : 0;
        pthread_once(&scratch_once, scratch_key_make);
        pthread_setspecific(scratch_key, scratch);
        if (!scratch) return -1;
    }
    /* scratch: keys [n2], candidate keys [n2], collected indices [n2], then per chunk a histogram and stats */
    uint32_t *base = scratch;
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
