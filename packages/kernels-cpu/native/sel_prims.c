/* Key primitives of pre-QKᵀ selectors (see sel_prims.h): a scalar form and an AVX2 form of
 * each loop, and an AVX-512 form of the page bounds, picked per call; rows are widened to f32
 * into a small buffer first, so every dtype shares one vector loop. With a pool, pieces of (KV head, run of tokens or pages) go
 * to its threads, each running the same serial loop on its piece: results are bit-identical.
 * Page summaries are bf16 rounded outward (min toward −∞, max toward +∞): Quest's bounds read
 * half the bytes of f32 summaries and still bound every q·k; bounds sum in f32 (bf16 widened on
 * load). Both forms round and fold alike (core's summarizePages), so summaries match bit for bit. */
#include "sel_prims.h"
#include "sel_loops.h"
#include "sel_pool.h"
#include <stdlib.h>
#include <string.h>
#include "half.h"
#include "hgcpu.h"
#if defined(__x86_64__)
#include <immintrin.h>
#define HG_SEL_X86 1
#endif

#define ROW_STACK 1024 /* rows up to this many channels are widened on the stack */

/* Folds channels [c, d) of one row (f32) into a page's bf16 min / max, as core's summarizePages:
 * the value rounded outward (toward −∞ for the min, +∞ for the max: truncation rounds toward 0,
 * so an inexact value on the far side of 0 moves one ulp away from it; a NaN stays a quiet NaN)
 * replaces the old one where it is below the min (above the max; a NaN or a tie keeps the old
 * bits), or outright on a page's first row. For a bf16 m, down(v) < m exactly when v < m (and
 * up(v) > m when v > m), so v is compared as it is. Branch-free, so the compiler vectorizes it. */
static void minmax_tail(uint16_t *restrict mn, uint16_t *restrict mx, const float *restrict row, int64_t c, int64_t d, int fresh) {
    const uint32_t all = fresh ? 0xffffu : 0;
    for (; c < d; c++) {
        const float v = row[c];
        const uint32_t u = hg_f32_bits(v), nan = (u & 0x7fffffffu) > 0x7f800000u, ulp = ((u & 0xffffu) != 0) & !nan, neg = u >> 31;
        const uint32_t base = (u >> 16) | (nan << 6), lo = base + (ulp & neg), hi = base + (ulp & (neg ^ 1));
        const uint32_t m = mn[c], M = mx[c];
        const uint32_t tl = all | (0u - (uint32_t)(v < hg_bf16_to_f32((uint16_t)m))), th = all | (0u - (uint32_t)(v > hg_bf16_to_f32((uint16_t)M)));
        mn[c] = (uint16_t)((lo & tl) | (m & ~tl));
        mx[c] = (uint16_t)((hi & th) | (M & ~th));
    }
}

/* Row `row` of K (element offset row*d) as f32 into dst (scalar widening). */
static void widen_scalar(float *dst, const void *k, int ktype, int64_t at, int64_t d) {
    if (ktype == HG_F32) {
        memcpy(dst, (const float *)k + at, (size_t)d * 4);
    } else if (ktype == HG_BF16) {
        const uint16_t *p = (const uint16_t *)k + at;
        for (int64_t c = 0; c < d; c++) dst[c] = hg_bf16_to_f32(p[c]);
    } else {
        const uint16_t *p = (const uint16_t *)k + at;
        for (int64_t c = 0; c < d; c++) dst[c] = hg_f16_to_f32(p[c]);
    }
}

static float dot_scalar(const float *a, const float *b, int64_t d) {
    float s = 0.0f;
    for (int64_t c = 0; c < d; c++) s += a[c] * b[c];
    return s;
}

#ifdef HG_SEL_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static void widen_avx2(float *dst, const void *k, int ktype, int64_t at, int64_t d) {
    int64_t c = 0;
    if (ktype == HG_F16) {
        const uint16_t *p = (const uint16_t *)k + at;
        for (; c + 8 <= d; c += 8) _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + c))));
        for (; c < d; c++) dst[c] = hg_f16_to_f32(p[c]);
    } else if (ktype == HG_BF16) {
        const uint16_t *p = (const uint16_t *)k + at;
        for (; c + 8 <= d; c += 8) {
            __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + c)));
            _mm256_storeu_ps(dst + c, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
        for (; c < d; c++) dst[c] = hg_bf16_to_f32(p[c]);
    } else {
        memcpy(dst, (const float *)k + at, (size_t)d * 4);
    }
}

AVX2 static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* best of q_j·row over heads j < group (q rows d apart): four heads at a time, so the row's
 * vectors are loaded once per four dot products and four FMA chains run side by side. */
AVX2 static float group_dot_avx2(const float *q, int64_t group, const float *row, int64_t d) {
    float best = -__builtin_inff();
    int64_t d8 = d & ~(int64_t)7;
    for (int64_t j = 0; j < group; j += 4) {
        int64_t m = group - j < 4 ? group - j : 4;
        const float *q0 = q + j * d, *q1 = q0 + (m > 1 ? d : 0), *q2 = q0 + (m > 2 ? 2 * d : 0), *q3 = q0 + (m > 3 ? 3 * d : 0);
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t c = 0; c < d8; c += 8) {
            __m256 v = _mm256_loadu_ps(row + c);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + c), v, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + c), v, a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + c), v, a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + c), v, a3);
        }
        float t[4] = { hsum(a0), hsum(a1), hsum(a2), hsum(a3) };
        const float *qs[4] = { q0, q1, q2, q3 };
        for (int64_t i = 0; i < m; i++) {
            for (int64_t c = d8; c < d; c++) t[i] += qs[i][c] * row[c];
            if (t[i] > best) best = t[i];
        }
    }
    return best;
}

/* Eight bf16 as f32. */
AVX2 static inline __m256 bf16x8_load(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* Eight f32 whose low 16 bits are zero, stored as bf16. */
AVX2 static inline void bf16x8_store(uint16_t *p, __m256 v) {
    const __m256i w = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}

/* x rounded to bf16 toward −∞ (*lo) and toward +∞ (*hi), as f32: minmax_tail's rounding lane by lane. */
AVX2 static inline void bf16x8_outward(__m256 x, __m256 *lo, __m256 *hi) {
    const __m256i u = _mm256_castps_si256(x), t = _mm256_and_si256(u, _mm256_set1_epi32((int)0xffff0000u));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    /* 0x10000 (one bf16 ulp) where x is inexact and not NaN; a NaN only sets the quiet bit */
    const __m256i ulp = _mm256_andnot_si256(_mm256_or_si256(_mm256_cmpeq_epi32(t, u), nan), _mm256_set1_epi32(0x10000));
    const __m256i base = _mm256_or_si256(t, _mm256_and_si256(nan, _mm256_set1_epi32(0x400000))), neg = _mm256_srai_epi32(u, 31);
    *lo = _mm256_castsi256_ps(_mm256_add_epi32(base, _mm256_and_si256(neg, ulp)));
    *hi = _mm256_castsi256_ps(_mm256_add_epi32(base, _mm256_andnot_si256(neg, ulp)));
}

/* minmax_tail's fold eight channels at a time: min_ps(lo, old) is lo < old ? lo : old, as the
 * scalar fold (a NaN or an equal value keeps the old one). */
AVX2 static void minmax_avx2(uint16_t *mn, uint16_t *mx, const float *row, int64_t d, int fresh) {
    int64_t c = 0;
    for (; c + 8 <= d; c += 8) {
        __m256 lo, hi;
        bf16x8_outward(_mm256_loadu_ps(row + c), &lo, &hi);
        if (!fresh) {
            lo = _mm256_min_ps(lo, bf16x8_load(mn + c));
            hi = _mm256_max_ps(hi, bf16x8_load(mx + c));
        }
        bf16x8_store(mn + c, lo);
        bf16x8_store(mx + c, hi);
    }
    minmax_tail(mn, mx, row, c, d, fresh);
}

/* Quest's bounds of `count` pages (summaries d apart): out[p] = best over heads j < group of
 * sum_c max(q_jc*mn_c, q_jc*mx_c), written as q_jc times mx_c or mn_c by q's sign (the larger
 * product). The bf16 summaries are read 16 channels (32 bytes) a load and widened in one
 * operation each half, the even channels by a shift, the odd ones by a mask; q comes with each
 * 16-channel block's even channels first (split_pairs), channels past the last whole block in
 * place. Four heads at a time share the loads; each head sums the blocks at even and at odd
 * multiples of 16 channels in two chains (a cache line's two halves), added lane by lane at the
 * end, so the AVX-512 loop, which holds both chains in one register, gives the same bits. The
 * four heads' sums are reduced together. */
AVX2 static void pages_bound_avx2(const float *q, int64_t group, const uint16_t *mn, const uint16_t *mx, int64_t d, int64_t count, float *out) {
    const int64_t d16 = d & ~(int64_t)15;
    const __m256i top = _mm256_set1_epi32((int)0xffff0000u);
    for (int64_t p = 0; p < count; p++, mn += d, mx += d) {
        float best = -__builtin_inff();
        for (int64_t j = 0; j < group; j += 4) {
            const int64_t m = group - j < 4 ? group - j : 4;
            const float *q0 = q + j * d, *q1 = q0 + (m > 1 ? d : 0), *q2 = q0 + (m > 2 ? 2 * d : 0), *q3 = q0 + (m > 3 ? 3 * d : 0);
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
#define BLOCK(c, x0, x1, x2, x3)                                                                                                 \
    do {                                                                                                                         \
        const __m256i wl = _mm256_loadu_si256((const __m256i *)(mn + (c))), wh = _mm256_loadu_si256((const __m256i *)(mx + (c))); \
        const __m256 le = _mm256_castsi256_ps(_mm256_slli_epi32(wl, 16)), lo = _mm256_castsi256_ps(_mm256_and_si256(wl, top));  \
        const __m256 he = _mm256_castsi256_ps(_mm256_slli_epi32(wh, 16)), ho = _mm256_castsi256_ps(_mm256_and_si256(wh, top));  \
        __m256 v;                                                                                                                \
        v = _mm256_loadu_ps(q0 + (c)); x0 = _mm256_fmadd_ps(v, _mm256_blendv_ps(he, le, v), x0);                               \
        v = _mm256_loadu_ps(q0 + (c) + 8); x0 = _mm256_fmadd_ps(v, _mm256_blendv_ps(ho, lo, v), x0);                           \
        v = _mm256_loadu_ps(q1 + (c)); x1 = _mm256_fmadd_ps(v, _mm256_blendv_ps(he, le, v), x1);                               \
        v = _mm256_loadu_ps(q1 + (c) + 8); x1 = _mm256_fmadd_ps(v, _mm256_blendv_ps(ho, lo, v), x1);                           \
        v = _mm256_loadu_ps(q2 + (c)); x2 = _mm256_fmadd_ps(v, _mm256_blendv_ps(he, le, v), x2);                               \
        v = _mm256_loadu_ps(q2 + (c) + 8); x2 = _mm256_fmadd_ps(v, _mm256_blendv_ps(ho, lo, v), x2);                           \
        v = _mm256_loadu_ps(q3 + (c)); x3 = _mm256_fmadd_ps(v, _mm256_blendv_ps(he, le, v), x3);                               \
        v = _mm256_loadu_ps(q3 + (c) + 8); x3 = _mm256_fmadd_ps(v, _mm256_blendv_ps(ho, lo, v), x3);                           \
    } while (0)
            int64_t c = 0;
            for (; c + 32 <= d16; c += 32) {
                BLOCK(c, a0, a1, a2, a3);
                BLOCK(c + 16, b0, b1, b2, b3);
            }
            if (c < d16) BLOCK(c, a0, a1, a2, a3);
#undef BLOCK
            a0 = _mm256_add_ps(a0, b0);
            a1 = _mm256_add_ps(a1, b1);
            a2 = _mm256_add_ps(a2, b2);
            a3 = _mm256_add_ps(a3, b3);
            const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
            float t[4];
            _mm_storeu_ps(t, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1))); /* head i's sum in t[i] */
            const float *qs[4] = { q0, q1, q2, q3 };
            for (int64_t i = 0; i < m; i++) {
                for (int64_t c = d16; c < d; c++) {
                    float a = qs[i][c] * hg_bf16_to_f32(mn[c]), b = qs[i][c] * hg_bf16_to_f32(mx[c]);
                    t[i] += a > b ? a : b;
                }
                if (t[i] > best) best = t[i];
            }
        }
        out[p] = best;
    }
}

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

/* One page's bound for pages_bound_avx512 (inlined, so a head dim known at compile time unrolls its lines). */
AVX512 static inline __attribute__((always_inline)) float line_bound(const float *qd, const uint16_t *qm, const float *qt, int64_t group, const uint16_t *mn,
                                                                      const uint16_t *mx, int64_t d, int64_t d16) {
    const int64_t lines = (d16 + 31) / 32, qs = 32 * lines, ms = 2 * lines;
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    float best = -__builtin_inff();
    for (int64_t j = 0; j < group; j += 4) {
        const int64_t m = group - j < 4 ? group - j : 4, h1 = m > 1 ? 1 : 0, h2 = m > 2 ? 2 : 0, h3 = m > 3 ? 3 : 0;
        const float *q0 = qd + j * qs, *q1 = q0 + h1 * qs, *q2 = q0 + h2 * qs, *q3 = q0 + h3 * qs;
        const uint16_t *k0 = qm + j * ms, *k1 = k0 + h1 * ms, *k2 = k0 + h2 * ms, *k3 = k0 + h3 * ms;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#define HEAD(q, k, a, lanes)                                                                                                     \
    do {                                                                                                                         \
        a = _mm512_mask3_fmadd_ps(_mm512_loadu_ps((q) + 32 * l), _mm512_mask_blend_ps((k)[2 * l], he, le), a, lanes);          \
        a = _mm512_mask3_fmadd_ps(_mm512_loadu_ps((q) + 32 * l + 16), _mm512_mask_blend_ps((k)[2 * l + 1], ho, lo), a, lanes);  \
    } while (0)
#define LINE(wl, wh, lanes)                                                                                                      \
    do {                                                                                                                         \
        const __m512 le = _mm512_castsi512_ps(_mm512_slli_epi32(wl, 16)), lo = _mm512_castsi512_ps(_mm512_and_si512(wl, top));  \
        const __m512 he = _mm512_castsi512_ps(_mm512_slli_epi32(wh, 16)), ho = _mm512_castsi512_ps(_mm512_and_si512(wh, top));  \
        HEAD(q0, k0, a0, lanes);                                                                                                 \
        HEAD(q1, k1, a1, lanes);                                                                                                 \
        HEAD(q2, k2, a2, lanes);                                                                                                 \
        HEAD(q3, k3, a3, lanes);                                                                                                 \
    } while (0)
        int64_t l = 0;
        for (; 32 * l + 32 <= d16; l++) LINE(_mm512_loadu_si512(mn + 32 * l), _mm512_loadu_si512(mx + 32 * l), 0xffff);
        if (32 * l < d16)
            LINE(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(mn + 32 * l))),
                 _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(mx + 32 * l))), 0x00ff);
#undef LINE
#undef HEAD
        /* pages_bound_avx2's sums: its even-block chains plus its odd-block chains, then its reduction */
#define HALVES(a) _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1))
        const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(HALVES(a0), HALVES(a1)), _mm256_hadd_ps(HALVES(a2), HALVES(a3)));
#undef HALVES
        float t[4];
        _mm_storeu_ps(t, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
        for (int64_t i = 0; i < m; i++) {
            const float *qi = qt + (j + i) * d;
            for (int64_t c = d16; c < d; c++) {
                float a = qi[c] * hg_bf16_to_f32(mn[c]), b = qi[c] * hg_bf16_to_f32(mx[c]);
                t[i] += a > b ? a : b;
            }
            if (t[i] > best) best = t[i];
        }
    }
    return best;
}

/* pages_bound_avx2's bounds, bit for bit, a cache line of each summary (32 channels) a load: its
 * low half, the even block, feeds the low eight lanes, which are pages_bound_avx2's even-block
 * chain, its high half the high eight, the odd-block chain; a block past the last whole line
 * feeds the low lanes alone. Half the AVX2 loop's operations, and its order of reads: page after
 * page, one sequential stream a summary for the prefetchers. q is qd
 * [heads][lines][2][16] (a line's even channels, then its odd ones, low block first; a lone last
 * block in the low lanes) with the sign masks of those vectors in qm [heads][lines][2]: the blend
 * by a mask is one operation where blendv is two or three. Channels past the last whole block
 * come from qt, q's rows in place. */
AVX512 static void pages_bound_avx512(const float *qd, const uint16_t *qm, const float *qt, int64_t group, const uint16_t *mn, const uint16_t *mx,
                                      int64_t d, int64_t count, float *out) {
    const int64_t d16 = d & ~(int64_t)15;
    if (d == 128) /* Llama's and Qwen's head dim: four lines, unrolled */
        for (int64_t p = 0; p < count; p++, mn += 128, mx += 128) out[p] = line_bound(qd, qm, qt, group, mn, mx, 128, 128);
    else
        for (int64_t p = 0; p < count; p++, mn += d, mx += d) out[p] = line_bound(qd, qm, qt, group, mn, mx, d, d16);
}

/* q rows (d floats each, `rows` of them) as pages_bound_avx512 reads them into qd and qm. */
AVX512 static void split_lines(float *qd, uint16_t *qm, const float *q, int64_t rows, int64_t d) {
    const int64_t d16 = d & ~(int64_t)15;
    for (int64_t r = 0; r < rows; r++, q += d)
        for (int64_t c = 0; c < d16; c += 32, qd += 32, qm += 2) {
            for (int64_t h = 0; h < 2; h++)
                for (int64_t i = 0; i < 8; i++) {
                    const int64_t ch = c + 16 * h + 2 * i, in = ch < d16;
                    qd[8 * h + i] = in ? q[ch] : 0.0f;
                    qd[16 + 8 * h + i] = in ? q[ch + 1] : 0.0f;
                }
            qm[0] = (uint16_t)_mm512_movepi32_mask(_mm512_castps_si512(_mm512_loadu_ps(qd)));
            qm[1] = (uint16_t)_mm512_movepi32_mask(_mm512_castps_si512(_mm512_loadu_ps(qd + 16)));
        }
}
#endif

static float bound_scalar(const float *q, const float *mn, const float *mx, int64_t d) {
    float s = 0.0f;
    for (int64_t c = 0; c < d; c++) {
        float a = q[c] * mn[c], b = q[c] * mx[c];
        s += a > b ? a : b;
    }
    return s;
}

#ifdef HG_SEL_X86
/* Narrow f32 rows (InfiniGen's packed channels, d < NARROW_D): eight rows a block, transposed
 * so each lane holds one row and every channel is one FMA per query head; a lane sums its
 * channels in order with FMA, as the scalar tail does, so a row's score never depends on
 * where a block starts. */
#define NARROW_D 32
AVX2 static void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20); r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20); r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31); r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31); r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* out[i] = max over heads j < group of q_j·rows[i] for i < n (rows d floats apart, d < NARROW_D). */
AVX2 static void narrow_scores_avx2(const float *q, int64_t group, const float *rows, int64_t n, int64_t d, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 col[NARROW_D];
        const float *b = rows + i * d;
        int64_t c = 0;
        for (; c + 8 <= d; c += 8) {
            for (int j = 0; j < 8; j++) col[c + j] = _mm256_loadu_ps(b + j * d + c);
            transpose8(col + c);
        }
        for (; c < d; c++)
            col[c] = _mm256_setr_ps(b[c], b[d + c], b[2 * d + c], b[3 * d + c], b[4 * d + c], b[5 * d + c], b[6 * d + c], b[7 * d + c]);
        __m256 best = _mm256_set1_ps(-__builtin_inff());
        for (int64_t j = 0; j < group; j++) {
            const float *qj = q + j * d;
            __m256 acc = _mm256_setzero_ps();
            for (int64_t cc = 0; cc < d; cc++) acc = _mm256_fmadd_ps(_mm256_broadcast_ss(qj + cc), col[cc], acc);
            best = _mm256_max_ps(acc, best); /* acc > best ? acc : best: a NaN never wins, as in the other loops */
        }
        _mm256_storeu_ps(out + i, best);
    }
    for (; i < n; i++) {
        const float *row = rows + i * d;
        float best = -__builtin_inff();
        for (int64_t j = 0; j < group; j++) {
            float acc = 0.0f;
            for (int64_t c = 0; c < d; c++) acc = __builtin_fmaf(q[j * d + c], row[c], acc);
            best = acc > best ? acc : best;
        }
        out[i] = best;
    }
}
#endif

int hg_sel_best_isa(void) {
#ifdef HG_SEL_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") || !__builtin_cpu_supports("f16c")) return 0;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                   __builtin_cpu_supports("avx512dq")
               ? 2
               : 1;
#else
    return 0;
#endif
}

/* The loop set an isa argument runs: 0 scalar, 1 AVX2, 2 AVX-512 (< 0: the CPU's best). */
static int sel_isa(int isa) {
    static int best = -1;
    if (isa >= 0) return isa;
    if (best < 0) best = hg_sel_best_isa();
    return best;
}

/* Loops without an AVX-512 form run their AVX2 one on an AVX-512 call. */
static int use_avx2(int isa) { return sel_isa(isa) >= 1; }

typedef void (*widen_fn)(float *, const void *, int, int64_t, int64_t);

/* A widening buffer of d floats: the stack for usual head sizes, else the heap (NULL: out of memory). */
static float *row_buffer(float *stack, int64_t d) {
    return d <= ROW_STACK ? stack : (float *)malloc((size_t)d * 4);
}

void hg_sel_summarize_serial(const void *k, int ktype, int64_t kv_heads, int64_t cap, int64_t d, int64_t from, int64_t to,
                      int64_t page, int64_t page_cap, uint16_t *mn, uint16_t *mx, int isa) {
    float stack[ROW_STACK], *row = row_buffer(stack, d);
    if (!row) return;
    int v = use_avx2(isa);
    widen_fn widen = widen_scalar;
#ifdef HG_SEL_X86
    if (v) widen = widen_avx2;
#endif
    for (int64_t g = 0; g < kv_heads; g++) {
        for (int64_t s = from; s < to; s++) {
            widen(row, k, ktype, (g * cap + s) * d, d);
            int64_t at = (g * page_cap + s / page) * d;
            int fresh = s % page == 0;
#ifdef HG_SEL_X86
            if (v) { minmax_avx2(mn + at, mx + at, row, d, fresh); continue; }
#endif
            minmax_tail(mn + at, mx + at, row, 0, d, fresh);
        }
    }
    if (row != stack) free(row);
}

/* rows of q (d floats each) into dst with each 16-channel block's even channels first, then its
 * odd ones: the order pages_bound_avx2 widens bf16 pairs in; the channels past the last block stay. */
static void split_pairs(float *dst, const float *q, int64_t rows, int64_t d) {
    const int64_t d16 = d & ~(int64_t)15;
    for (int64_t r = 0; r < rows; r++, q += d, dst += d) {
        for (int64_t c = 0; c < d16; c += 16)
            for (int64_t i = 0; i < 8; i++) {
                dst[c + i] = q[c + 2 * i];
                dst[c + 8 + i] = q[c + 2 * i + 1];
            }
        for (int64_t c = d16; c < d; c++) dst[c] = q[c];
    }
}

void hg_sel_page_bounds_serial(const float *q, int64_t kv_heads, int64_t group, int64_t d, const uint16_t *mn, const uint16_t *mx,
                        int64_t page_cap, int64_t count, float *out, int isa) {
    const int v = use_avx2(isa);
#ifdef HG_SEL_X86
    if (sel_isa(isa) == 2 && d >= 16) {
        /* one KV head's q for pages_bound_avx512: qd (32 floats a head and cache line), then qm (2 masks a head and line) */
        const int64_t lines = ((d & ~(int64_t)15) + 31) / 32, fl = group * 32 * lines, need = fl + group * lines;
        float stack[4 * ROW_STACK], *buf = need <= 4 * ROW_STACK ? stack : (float *)malloc((size_t)need * 4);
        if (!buf) return;
        uint16_t *qm = (uint16_t *)(buf + fl);
        for (int64_t g = 0; g < kv_heads; g++) {
            split_lines(buf, qm, q + g * group * d, group, d);
            pages_bound_avx512(buf, qm, q + g * group * d, group, mn + g * page_cap * d, mx + g * page_cap * d, d, count, out + g * count);
        }
        if (buf != stack) free(buf);
        return;
    }
#endif
    /* scratch: the AVX2 loop's q of one KV head in split_pairs order, or the scalar loop's page
     * summaries widened once for the group */
    const int64_t need = v ? group * d : 2 * d;
    float stack[2 * ROW_STACK], *buf = need <= 2 * ROW_STACK ? stack : (float *)malloc((size_t)need * 4);
    if (!buf) return;
    for (int64_t g = 0; g < kv_heads; g++) {
#ifdef HG_SEL_X86
        if (v) {
            split_pairs(buf, q + g * group * d, group, d);
            pages_bound_avx2(buf, group, mn + g * page_cap * d, mx + g * page_cap * d, d, count, out + g * count);
            continue;
        }
#endif
        float *lo = buf, *hi = buf + d;
        for (int64_t p = 0; p < count; p++) {
            const int64_t at = (g * page_cap + p) * d;
            for (int64_t c = 0; c < d; c++) {
                lo[c] = hg_bf16_to_f32(mn[at + c]);
                hi[c] = hg_bf16_to_f32(mx[at + c]);
            }
            float best = -__builtin_inff();
            for (int64_t j = 0; j < group; j++) {
                float b = bound_scalar(q + (g * group + j) * d, lo, hi, d);
                if (b > best) best = b;
            }
            out[g * count + p] = best;
        }
    }
    if (buf != stack) free(buf);
}

void hg_sel_key_scores_serial(const float *q, int64_t kv_heads, int64_t group, const void *k, int ktype, int64_t cap, int64_t d,
                       int64_t from, int64_t to, float *out, int isa) {
    float stack[ROW_STACK], *row = row_buffer(stack, d);
    if (!row) return;
    int v = use_avx2(isa);
    (void)v;
    int64_t n = to - from;
#ifdef HG_SEL_X86
    if (v && ktype == HG_F32 && d < NARROW_D) {
        for (int64_t g = 0; g < kv_heads; g++)
            narrow_scores_avx2(q + g * group * d, group, (const float *)k + (g * cap + from) * d, n, d, out + g * n);
        if (row != stack) free(row);
        return;
    }
#endif
    for (int64_t g = 0; g < kv_heads; g++) {
        for (int64_t s = from; s < to; s++) {
            const float *kr = row;
            int64_t at = (g * cap + s) * d;
            if (ktype == HG_F32) kr = (const float *)k + at; /* f32 rows are read in place */
#ifdef HG_SEL_X86
            else if (v) widen_avx2(row, k, ktype, at, d);
#endif
            else widen_scalar(row, k, ktype, at, d);
            const float *qg = q + g * group * d;
#ifdef HG_SEL_X86
            if (v) { out[g * n + s - from] = group_dot_avx2(qg, group, kr, d); continue; }
#endif
            float best = -__builtin_inff();
            for (int64_t j = 0; j < group; j++) {
                float t = dot_scalar(qg + j * d, kr, d);
                if (t > best) best = t;
            }
            out[g * n + s - from] = best;
        }
    }
    if (row != stack) free(row);
}

static void gather_serial(const void *k, int ktype, int64_t kv_heads, int64_t cap, int64_t d, const int32_t *ch, int64_t r,
                   int64_t from, int64_t to, float *out, int64_t out_cap) {
    for (int64_t g = 0; g < kv_heads; g++) {
        const int32_t *cg = ch + g * r;
        for (int64_t s = from; s < to; s++) {
            int64_t at = (g * cap + s) * d;
            float *o = out + (g * out_cap + s) * r;
            if (ktype == HG_F32) {
                const float *p = (const float *)k + at;
                for (int64_t i = 0; i < r; i++) o[i] = p[cg[i]];
            } else {
                const uint16_t *p = (const uint16_t *)k + at;
                if (ktype == HG_BF16) for (int64_t i = 0; i < r; i++) o[i] = hg_bf16_to_f32(p[cg[i]]);
                else for (int64_t i = 0; i < r; i++) o[i] = hg_f16_to_f32(p[cg[i]]);
            }
        }
    }
}

/* ---- pieces on the pool ---------------------------------------------------------------- */
#define PIECE_ROWS 512 /* fewest rows (or pages) per piece, so a piece outweighs its hand-off */

enum { OP_SUMMARIZE, OP_BOUNDS, OP_SCORES, OP_GATHER };

typedef struct {
    int op, isa, ktype;
    const void *k;
    const float *q;
    const uint16_t *mn_c, *mx_c;
    uint16_t *mn, *mx;
    float *out;
    const int32_t *ch;
    int64_t kv_heads, cap, d, from, to, page, page_cap, group, count, r, out_cap, chunks;
} sel_run;

static inline int64_t kesize(int ktype) { return ktype == HG_F32 ? 4 : 2; }

static void sel_part(void *v, int part, int parts) {
    (void)parts;
    const sel_run *a = v;
    const int64_t g = part / a->chunks, c = part % a->chunks, d = a->d;
    const void *kg = a->k ? (const char *)a->k + g * a->cap * d * kesize(a->ktype) : NULL;
    int64_t b, e;
    switch (a->op) {
    case OP_SUMMARIZE: { /* whole pages per piece: a page's summary has one writer */
        const int64_t p0 = a->from / a->page, p1 = (a->to + a->page - 1) / a->page;
        hg_split(p1 - p0, 1, (int)c, (int)a->chunks, &b, &e);
        int64_t s0 = (p0 + b) * a->page, s1 = (p0 + e) * a->page;
        s0 = s0 > a->from ? s0 : a->from;
        s1 = s1 < a->to ? s1 : a->to;
        if (s0 < s1)
            hg_sel_summarize_serial(kg, a->ktype, 1, a->cap, d, s0, s1, a->page, a->page_cap, a->mn + g * a->page_cap * d, a->mx + g * a->page_cap * d, a->isa);
        break;
    }
    case OP_BOUNDS:
        hg_split(a->count, 16, (int)c, (int)a->chunks, &b, &e);
        if (b < e)
            hg_sel_page_bounds_serial(a->q + g * a->group * d, 1, a->group, d, a->mn_c + (g * a->page_cap + b) * d, a->mx_c + (g * a->page_cap + b) * d,
                               a->page_cap, e - b, a->out + g * a->count + b, a->isa);
        break;
    case OP_SCORES:
        hg_split(a->to - a->from, 16, (int)c, (int)a->chunks, &b, &e);
        if (b < e)
            hg_sel_key_scores_serial(a->q + g * a->group * d, 1, a->group, kg, a->ktype, a->cap, d, a->from + b, a->from + e,
                              a->out + g * (a->to - a->from) + b, a->isa);
        break;
    default:
        hg_split(a->to - a->from, 16, (int)c, (int)a->chunks, &b, &e);
        if (b < e) gather_serial(kg, a->ktype, 1, a->cap, d, a->ch + g * a->r, a->r, a->from + b, a->from + e, a->out + g * a->out_cap * a->r, a->out_cap);
        break;
    }
}

/* Runs the op over kv_heads x chunks pieces on the stage's idle pool; 0 when it should run
 * serially (no pool, one thread, or too little work). */
static int run_pieces(hg_stage *stage, sel_run *a, int64_t rows) {
    hg_pool *pool = hg_sel_pool(stage);
    if (!pool || hg_pool_threads(pool) < 2 || rows * a->kv_heads < 2 * PIECE_ROWS) return 0;
    const int64_t threads = hg_pool_threads(pool);
    int64_t per = (2 * threads + a->kv_heads - 1) / a->kv_heads, most = (rows + PIECE_ROWS - 1) / PIECE_ROWS;
    a->chunks = per < most ? per : most;
    if (a->chunks < 1) a->chunks = 1;
    hg_pool_run(pool, sel_part, a, (int)(a->kv_heads * a->chunks));
    return 1;
}

void hg_sel_summarize(const void *k, int ktype, int64_t kv_heads, int64_t cap, int64_t d, int64_t from, int64_t to,
                      int64_t page, int64_t page_cap, uint16_t *mn, uint16_t *mx, int isa, hg_stage *stage) {
    sel_run a = { .op = OP_SUMMARIZE, .isa = isa, .ktype = ktype, .k = k, .mn = mn, .mx = mx, .kv_heads = kv_heads, .cap = cap, .d = d,
                  .from = from, .to = to, .page = page, .page_cap = page_cap };
    if (!run_pieces(stage, &a, to - from)) hg_sel_summarize_serial(k, ktype, kv_heads, cap, d, from, to, page, page_cap, mn, mx, isa);
}

void hg_sel_page_bounds(const float *q, int64_t kv_heads, int64_t group, int64_t d, const uint16_t *mn, const uint16_t *mx,
                        int64_t page_cap, int64_t count, float *out, int isa, hg_stage *stage) {
    sel_run a = { .op = OP_BOUNDS, .isa = isa, .q = q, .mn_c = mn, .mx_c = mx, .out = out, .kv_heads = kv_heads, .d = d, .group = group,
                  .page_cap = page_cap, .count = count };
    if (!run_pieces(stage, &a, count)) hg_sel_page_bounds_serial(q, kv_heads, group, d, mn, mx, page_cap, count, out, isa);
}

void hg_sel_key_scores(const float *q, int64_t kv_heads, int64_t group, const void *k, int ktype, int64_t cap, int64_t d,
                       int64_t from, int64_t to, float *out, int isa, hg_stage *stage) {
    sel_run a = { .op = OP_SCORES, .isa = isa, .ktype = ktype, .k = k, .q = q, .out = out, .kv_heads = kv_heads, .cap = cap, .d = d,
                  .from = from, .to = to, .group = group };
    if (!run_pieces(stage, &a, to - from)) hg_sel_key_scores_serial(q, kv_heads, group, k, ktype, cap, d, from, to, out, isa);
}

void hg_sel_gather(const void *k, int ktype, int64_t kv_heads, int64_t cap, int64_t d, const int32_t *ch, int64_t r,
                   int64_t from, int64_t to, float *out, int64_t out_cap, hg_stage *stage) {
    sel_run a = { .op = OP_GATHER, .ktype = ktype, .k = k, .ch = ch, .out = out, .kv_heads = kv_heads, .cap = cap, .d = d, .from = from, .to = to,
                  .r = r, .out_cap = out_cap };
    if (!run_pieces(stage, &a, to - from)) gather_serial(k, ktype, kv_heads, cap, d, ch, r, from, to, out, out_cap);
}
