/* Compressed K rows (kq.h): encoding at eviction, query quantization, approximate scores.
 * The scores are integer dot products of byte codes with the query quantized per head (7 bits
 * against int8 codes, 8 bits against int4 ones, so that vpmaddubsw's pair sums never
 * saturate), scaled in f32 in a fixed order: the portable loop and the AVX2 one give the same
 * bits. Codes are stored offset (c + 128, c + 8) so they are the unsigned operand; the offset's
 * share, a per-query constant, is subtracted once per row. */
#include "kq.h"
#include "half.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#define KQ_X86 1
#endif

#define CH 32 /* channels per code block (and per int4 scale) */
enum { Q8_MAX = 63, Q4_MAX = 127 }; /* query steps: 2 * 255 * 63 and 2 * 15 * 127 fit in int16 */

static int64_t padded(int64_t d) { return (d + CH - 1) / CH * CH; }

int64_t hg_kq_row_bytes(int form, int64_t d) {
    if (d < 1) return 0;
    const int64_t dp = padded(d);
    return form == HG_KQ_INT8 ? dp + 4 : form == HG_KQ_INT4 ? dp / 2 + 4 + dp / CH : 0;
}

static inline float kval(const void *k, int kt, int64_t i) {
    return kt == 0 ? ((const float *)k)[i] : kt == 1 ? hg_f16_to_f32(((const uint16_t *)k)[i]) : hg_bf16_to_f32(((const uint16_t *)k)[i]);
}

/* round(x * inv) clamped to [-lim, lim], ties to even (adding 1.5 * 2^23 rounds in the default
 * mode, without a libm call); NaN -> 0 */
static inline int quant(float x, float inv, int lim) {
    float v = x * inv;
    v = v == v ? v : 0.0f; /* selects, not branches: the row loops vectorize */
    v = v > (float)lim ? (float)lim : v;
    v = v < (float)-lim ? (float)-lim : v;
    const float big = 12582912.0f; /* without -ffast-math the compiler keeps (v + big) - big */
    return (int)((v + big) - big);
}

static float absmax(const float *x, int64_t n) {
    float m = 0;
    for (int64_t i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        m = a > m ? a : m; /* NaN never wins */
    }
    return m;
}

/* int4: a row scale S (f32) and per 32 channels an 8-bit multiple e of it, so a block's step is
 * S * e and the score's integer sum takes the e's as the multipliers of vpmaddwd. */
__attribute__((target_clones("avx2", "default"))) static void encode_row(int form, const float *x, int64_t d, uint8_t *rec) {
    const int64_t dp = padded(d);
    const float m = absmax(x, d);
    if (form == HG_KQ_INT8) {
        const float s = m / 127.0f, inv = m > 0 ? 127.0f / m : 0.0f;
        for (int64_t i = 0; i < dp; i++) rec[i] = (uint8_t)((i < d ? quant(x[i], inv, 127) : 0) + 128);
        memcpy(rec + dp, &s, 4);
        return;
    }
    const float S = m / (7.0f * 255.0f);
    memcpy(rec + dp / 2, &S, 4);
    for (int64_t g = 0; g < dp / CH; g++) { /* byte i of a block: channel i low, channel 16 + i high */
        const int64_t c0 = g * CH, c1 = c0 + CH < d ? c0 + CH : d;
        const float mg = c0 < d ? absmax(x + c0, c1 - c0) : 0.0f;
        float ef = m > 0 ? ceilf(255.0f * mg / m) : 0.0f;
        ef = ef > 255.0f ? 255.0f : ef;
        const float step = S * ef, inv = step > 0 ? 1.0f / step : 0.0f;
        uint8_t nib[CH];
        for (int i = 0; i < CH; i++) nib[i] = (uint8_t)((c0 + i < d ? quant(x[c0 + i], inv, 7) : 0) + 8);
        for (int i = 0; i < CH / 2; i++) rec[g * (CH / 2) + i] = (uint8_t)(nib[i] | nib[CH / 2 + i] << 4);
        rec[dp / 2 + 4 + g] = (uint8_t)ef;
    }
}

void hg_kq_encode(int form, const void *k, int ktype, int64_t kv_heads, int64_t cap, int64_t d, int64_t from, int64_t to, uint8_t *out) {
    const int64_t rb = hg_kq_row_bytes(form, d);
    if (rb == 0) return;
    float x[1024];
    if (d > 1024) return; /* callers check head_dim */
    for (int64_t g = 0; g < kv_heads; g++)
        for (int64_t r = from; r < to; r++) {
            const int64_t at = (g * cap + r) * d;
            if (ktype == 0) memcpy(x, (const float *)k + at, (size_t)d * 4);
            else if (ktype == 1) for (int64_t i = 0; i < d; i++) x[i] = hg_f16_to_f32(((const uint16_t *)k)[at + i]);
            else for (int64_t i = 0; i < d; i++) x[i] = hg_bf16_to_f32(((const uint16_t *)k)[at + i]);
            encode_row(form, x, d, out + (g * cap + r) * rb);
        }
}

/* ---- the query ------------------------------------------------------------------------- */
/* Layout of mem: p [heads + 4][dp] int8 (4 zero heads: a block of 4 past the group reads them),
 * t [heads + 4] f32, corr [heads + 4][groups] int32. */
int64_t hg_kq_query_bytes(int form, int64_t heads, int64_t d) {
    (void)form;
    const int64_t dp = padded(d);
    return (heads + 4) * (dp + 4 + 4 * (dp / CH)) + 64;
}

void hg_kq_pack_query(hg_kq_query *Q, int form, const float *q, int64_t heads, int64_t kv_heads, int64_t d, void *mem) {
    const int64_t dp = padded(d), G = dp / CH, H = heads + 4;
    *Q = (hg_kq_query){ form, d, dp, G, hg_kq_row_bytes(form, d), heads, kv_heads, heads / kv_heads, NULL, NULL, NULL };
    Q->p = mem;
    Q->t = (float *)((char *)mem + ((H * dp + 15) & ~(int64_t)15));
    Q->corr = (int32_t *)(Q->t + H);
    memset(Q->p, 0, (size_t)(H * dp));
    memset(Q->t, 0, (size_t)H * 4);
    memset(Q->corr, 0, (size_t)(H * G) * 4);
    const int lim = form == HG_KQ_INT8 ? Q8_MAX : Q4_MAX;
    for (int64_t h = 0; h < heads; h++) {
        const float m = absmax(q + h * d, d), inv = m > 0 ? (float)lim / m : 0.0f;
        Q->t[h] = m / (float)lim;
        for (int64_t i = 0; i < d; i++) Q->p[h * dp + i] = (int8_t)quant(q[h * d + i], inv, lim);
        for (int64_t i = 0; i < dp; i++) {
            if (form == HG_KQ_INT8) Q->corr[h * G] += 128 * Q->p[h * dp + i];
            else Q->corr[h * G + i / CH] += 8 * Q->p[h * dp + i];
        }
    }
}

/* ---- portable scores ------------------------------------------------------------------- */
static void rows_generic(const hg_kq_query *Q, const uint8_t *kq, int64_t cap, int64_t g, int64_t b, int64_t e, float *out) {
    const int64_t dp = Q->dp, G = Q->groups, h0 = g * Q->group, h1 = h0 + Q->group;
    for (int64_t r = b; r < e; r++) {
        const uint8_t *rec = kq + (g * cap + r) * Q->rb;
        float m = -INFINITY, s;
        for (int64_t h = h0; h < h1; h++) {
            const int8_t *p = Q->p + h * dp;
            float v;
            if (Q->form == HG_KQ_INT8) {
                int32_t dot = -Q->corr[h * G];
                for (int64_t i = 0; i < dp; i++) dot += rec[i] * p[i];
                v = Q->t[h] * (float)dot;
            } else {
                const uint8_t *e = rec + dp / 2 + 4;
                int32_t dot = 0;
                for (int64_t c = 0; c < G; c++) {
                    int32_t part = -Q->corr[h * G + c];
                    for (int i = 0; i < CH / 2; i++) {
                        const uint8_t x = rec[c * (CH / 2) + i];
                        part += (x & 15) * p[c * CH + i] + (x >> 4) * p[c * CH + CH / 2 + i];
                    }
                    dot += e[c] * part;
                }
                v = Q->t[h] * (float)dot;
            }
            m = v > m ? v : m;
        }
        memcpy(&s, rec + (Q->form == HG_KQ_INT8 ? dp : dp / 2), 4);
        out[r] = s * m;
    }
}

/* ---- AVX2 ------------------------------------------------------------------------------ */
#ifdef KQ_X86
#define AVX2 __attribute__((target("avx2")))
/* The four full sums of a0..a3's int32 lanes, in order. */
AVX2 static inline __m128i sum4(__m256i a0, __m256i a1, __m256i a2, __m256i a3) {
    const __m256i x = _mm256_hadd_epi32(_mm256_hadd_epi32(a0, a1), _mm256_hadd_epi32(a2, a3));
    return _mm_add_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}

/* 4 query heads at a time (heads past the group read the zero heads; their results are dropped). */
AVX2 static void rows_int8_avx2(const hg_kq_query *Q, const uint8_t *kq, int64_t cap, int64_t g, int64_t b, int64_t e, float *out) {
    const int64_t dp = Q->dp, G = Q->groups, h0 = g * Q->group, h1 = h0 + Q->group, rb = Q->rb;
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *zero = Q->p + Q->heads * dp;
    for (int64_t r = b; r < e; r++) {
        const uint8_t *rec = kq + (g * cap + r) * rb;
        __builtin_prefetch(rec + 16 * rb, 0, 1);
        __builtin_prefetch(rec + 16 * rb + 64, 0, 1);
        __builtin_prefetch(rec + 16 * rb + rb - 1, 0, 1);
        float m = -INFINITY, v[4], s;
        for (int64_t h = h0; h < h1; h += 4) {
            const int8_t *p0 = Q->p + h * dp, *p1 = h + 1 < h1 ? p0 + dp : zero, *p2 = h + 2 < h1 ? p0 + 2 * dp : zero,
                         *p3 = h + 3 < h1 ? p0 + 3 * dp : zero;
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t i = 0; i < dp; i += CH) {
                const __m256i u = _mm256_loadu_si256((const __m256i *)(rec + i));
                a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p0 + i))), ones));
                a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p1 + i))), ones));
                a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p2 + i))), ones));
                a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p3 + i))), ones));
            }
            const __m128i corr = _mm_set_epi32(Q->corr[(h + 3) * G], Q->corr[(h + 2) * G], Q->corr[(h + 1) * G], Q->corr[h * G]);
            const __m128i dot = _mm_sub_epi32(sum4(a0, a1, a2, a3), corr);
            _mm_storeu_ps(v, _mm_mul_ps(_mm_loadu_ps(Q->t + h), _mm_cvtepi32_ps(dot)));
            for (int64_t j = 0; j < 4 && h + j < h1; j++) m = v[j] > m ? v[j] : m;
        }
        memcpy(&s, rec + dp, 4);
        out[r] = s * m;
    }
}

/* As int8, a block of 32 channels at a time: vpmaddwd multiplies the pair sums by the block's e. */
AVX2 static void rows_int4_avx2(const hg_kq_query *Q, const uint8_t *kq, int64_t cap, int64_t g, int64_t b, int64_t e, float *out) {
    const int64_t dp = Q->dp, G = Q->groups, h0 = g * Q->group, h1 = h0 + Q->group, rb = Q->rb;
    const __m256i low = _mm256_set1_epi8(15);
    const int8_t *zero = Q->p + Q->heads * dp;
    const int32_t *zc = Q->corr + Q->heads * G;
    for (int64_t r = b; r < e; r++) {
        const uint8_t *rec = kq + (g * cap + r) * rb, *ev = rec + dp / 2 + 4;
        __builtin_prefetch(rec + 16 * rb, 0, 1);
        __builtin_prefetch(rec + 16 * rb + rb - 1, 0, 1);
        float m = -INFINITY, v[4], s;
        for (int64_t h = h0; h < h1; h += 4) {
            const int8_t *p[4];
            const int32_t *cr[4];
            for (int j = 0; j < 4; j++) {
                p[j] = h + j < h1 ? Q->p + (h + j) * dp : zero;
                cr[j] = h + j < h1 ? Q->corr + (h + j) * G : zc;
            }
            __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
            int32_t c0 = 0, c1 = 0, c2 = 0, c3 = 0;
            for (int64_t c = 0; c < G; c++) {
                const __m128i x = _mm_loadu_si128((const __m128i *)(rec + c * (CH / 2)));
                const __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), low), w = _mm256_set1_epi16(ev[c]);
                a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p[0] + c * CH))), w));
                a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p[1] + c * CH))), w));
                a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p[2] + c * CH))), w));
                a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p[3] + c * CH))), w));
                c0 += ev[c] * cr[0][c];
                c1 += ev[c] * cr[1][c];
                c2 += ev[c] * cr[2][c];
                c3 += ev[c] * cr[3][c];
            }
            const __m128i dot = _mm_sub_epi32(sum4(a0, a1, a2, a3), _mm_set_epi32(c3, c2, c1, c0));
            _mm_storeu_ps(v, _mm_mul_ps(_mm_loadu_ps(Q->t + h), _mm_cvtepi32_ps(dot)));
            for (int64_t j = 0; j < 4 && h + j < h1; j++) m = v[j] > m ? v[j] : m;
        }
        memcpy(&s, rec + dp / 2, 4);
        out[r] = s * m;
    }
}

/* ---- AVX-512: the AVX2 kernels with 64-byte chunks (two 32-channel blocks), a 32-byte tail
 * as in AVX2, the 512-bit sums folded to 256 bits before the same sum4 ---------------------- */
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2")))
AVX512 static inline __m256i fold(__m512i a) { return _mm256_add_epi32(_mm512_castsi512_si256(a), _mm512_extracti64x4_epi64(a, 1)); }

AVX512 static void rows_int8_avx512(const hg_kq_query *Q, const uint8_t *kq, int64_t cap, int64_t g, int64_t b, int64_t e, float *out) {
    const int64_t dp = Q->dp, G = Q->groups, h0 = g * Q->group, h1 = h0 + Q->group, rb = Q->rb;
    const __m512i ones = _mm512_set1_epi16(1);
    const int8_t *zero = Q->p + Q->heads * dp;
    for (int64_t r = b; r < e; r++) {
        const uint8_t *rec = kq + (g * cap + r) * rb;
        __builtin_prefetch(rec + 16 * rb, 0, 1);
        __builtin_prefetch(rec + 16 * rb + 64, 0, 1);
        __builtin_prefetch(rec + 16 * rb + rb - 1, 0, 1);
        float m = -INFINITY, v[4], s;
        for (int64_t h = h0; h < h1; h += 4) {
            const int8_t *p0 = Q->p + h * dp, *p1 = h + 1 < h1 ? p0 + dp : zero, *p2 = h + 2 < h1 ? p0 + 2 * dp : zero,
                         *p3 = h + 3 < h1 ? p0 + 3 * dp : zero;
            __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
            int64_t i = 0;
            for (; i + 2 * CH <= dp; i += 2 * CH) {
                const __m512i u = _mm512_loadu_si512(rec + i);
                a0 = _mm512_add_epi32(a0, _mm512_madd_epi16(_mm512_maddubs_epi16(u, _mm512_loadu_si512(p0 + i)), ones));
                a1 = _mm512_add_epi32(a1, _mm512_madd_epi16(_mm512_maddubs_epi16(u, _mm512_loadu_si512(p1 + i)), ones));
                a2 = _mm512_add_epi32(a2, _mm512_madd_epi16(_mm512_maddubs_epi16(u, _mm512_loadu_si512(p2 + i)), ones));
                a3 = _mm512_add_epi32(a3, _mm512_madd_epi16(_mm512_maddubs_epi16(u, _mm512_loadu_si512(p3 + i)), ones));
            }
            __m256i b0 = fold(a0), b1 = fold(a1), b2 = fold(a2), b3 = fold(a3);
            if (i < dp) {
                const __m256i u = _mm256_loadu_si256((const __m256i *)(rec + i)), o = _mm512_castsi512_si256(ones);
                b0 = _mm256_add_epi32(b0, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p0 + i))), o));
                b1 = _mm256_add_epi32(b1, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p1 + i))), o));
                b2 = _mm256_add_epi32(b2, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p2 + i))), o));
                b3 = _mm256_add_epi32(b3, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p3 + i))), o));
            }
            const __m128i corr = _mm_set_epi32(Q->corr[(h + 3) * G], Q->corr[(h + 2) * G], Q->corr[(h + 1) * G], Q->corr[h * G]);
            const __m128i dot = _mm_sub_epi32(sum4(b0, b1, b2, b3), corr);
            _mm_storeu_ps(v, _mm_mul_ps(_mm_loadu_ps(Q->t + h), _mm_cvtepi32_ps(dot)));
            for (int64_t j = 0; j < 4 && h + j < h1; j++) m = v[j] > m ? v[j] : m;
        }
        memcpy(&s, rec + dp, 4);
        out[r] = s * m;
    }
}

/* Two blocks' nibbles (32 bytes) as 64 codes: block c's low then high nibbles, then block c + 1's. */
AVX512 static inline __m512i nibbles2(const uint8_t *x) {
    const __m128i x0 = _mm_loadu_si128((const __m128i *)x), x1 = _mm_loadu_si128((const __m128i *)(x + CH / 2));
    const __m256i w0 = _mm256_set_m128i(_mm_srli_epi16(x0, 4), x0), w1 = _mm256_set_m128i(_mm_srli_epi16(x1, 4), x1);
    return _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1), _mm512_set1_epi8(15));
}

AVX512 static void rows_int4_avx512(const hg_kq_query *Q, const uint8_t *kq, int64_t cap, int64_t g, int64_t b, int64_t e, float *out) {
    const int64_t dp = Q->dp, G = Q->groups, h0 = g * Q->group, h1 = h0 + Q->group, rb = Q->rb;
    const __m256i low = _mm256_set1_epi8(15);
    const int8_t *zero = Q->p + Q->heads * dp;
    const int32_t *zc = Q->corr + Q->heads * G;
    for (int64_t r = b; r < e; r++) {
        const uint8_t *rec = kq + (g * cap + r) * rb, *ev = rec + dp / 2 + 4;
        __builtin_prefetch(rec + 16 * rb, 0, 1);
        __builtin_prefetch(rec + 16 * rb + rb - 1, 0, 1);
        float m = -INFINITY, v[4], s;
        for (int64_t h = h0; h < h1; h += 4) {
            const int8_t *p[4];
            const int32_t *cr[4];
            for (int j = 0; j < 4; j++) {
                p[j] = h + j < h1 ? Q->p + (h + j) * dp : zero;
                cr[j] = h + j < h1 ? Q->corr + (h + j) * G : zc;
            }
            __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
            int32_t c0 = 0, c1 = 0, c2 = 0, c3 = 0;
            int64_t c = 0;
            for (; c + 2 <= G; c += 2) {
                const __m512i u = nibbles2(rec + c * (CH / 2));
                const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(ev[c])), _mm256_set1_epi16(ev[c + 1]), 1);
                a0 = _mm512_add_epi32(a0, _mm512_madd_epi16(_mm512_maddubs_epi16(u, _mm512_loadu_si512(p[0] + c * CH)), w));
                a1 = _mm512_add_epi32(a1, _mm512_madd_epi16(_mm512_maddubs_epi16(u, _mm512_loadu_si512(p[1] + c * CH)), w));
                a2 = _mm512_add_epi32(a2, _mm512_madd_epi16(_mm512_maddubs_epi16(u, _mm512_loadu_si512(p[2] + c * CH)), w));
                a3 = _mm512_add_epi32(a3, _mm512_madd_epi16(_mm512_maddubs_epi16(u, _mm512_loadu_si512(p[3] + c * CH)), w));
                for (int64_t cc = c; cc < c + 2; cc++) {
                    c0 += ev[cc] * cr[0][cc];
                    c1 += ev[cc] * cr[1][cc];
                    c2 += ev[cc] * cr[2][cc];
                    c3 += ev[cc] * cr[3][cc];
                }
            }
            __m256i b0 = fold(a0), b1 = fold(a1), b2 = fold(a2), b3 = fold(a3);
            if (c < G) {
                const __m128i x = _mm_loadu_si128((const __m128i *)(rec + c * (CH / 2)));
                const __m256i u = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), low), w = _mm256_set1_epi16(ev[c]);
                b0 = _mm256_add_epi32(b0, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p[0] + c * CH))), w));
                b1 = _mm256_add_epi32(b1, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p[1] + c * CH))), w));
                b2 = _mm256_add_epi32(b2, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p[2] + c * CH))), w));
                b3 = _mm256_add_epi32(b3, _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_loadu_si256((const __m256i *)(p[3] + c * CH))), w));
                c0 += ev[c] * cr[0][c];
                c1 += ev[c] * cr[1][c];
                c2 += ev[c] * cr[2][c];
                c3 += ev[c] * cr[3][c];
            }
            const __m128i dot = _mm_sub_epi32(sum4(b0, b1, b2, b3), _mm_set_epi32(c3, c2, c1, c0));
            _mm_storeu_ps(v, _mm_mul_ps(_mm_loadu_ps(Q->t + h), _mm_cvtepi32_ps(dot)));
            for (int64_t j = 0; j < 4 && h + j < h1; j++) m = v[j] > m ? v[j] : m;
        }
        memcpy(&s, rec + dp / 2, 4);
        out[r] = s * m;
    }
}
#endif

int hg_kq_best_isa(void) {
#ifdef KQ_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) return 2;
    return __builtin_cpu_supports("avx2") ? 1 : 0;
#else
    return 0;
#endif
}

void hg_kq_score_rows(const hg_kq_query *Q, const uint8_t *kq, int64_t cap, int64_t g, int64_t b, int64_t e, float *out, int isa) {
#ifdef KQ_X86
    if (isa >= 2 && Q->form == HG_KQ_INT8) return rows_int8_avx512(Q, kq, cap, g, b, e, out);
    if (isa >= 2 && Q->form == HG_KQ_INT4) return rows_int4_avx512(Q, kq, cap, g, b, e, out);
    if (isa >= 1 && Q->form == HG_KQ_INT8) return rows_int8_avx2(Q, kq, cap, g, b, e, out);
    if (isa >= 1 && Q->form == HG_KQ_INT4) return rows_int4_avx2(Q, kq, cap, g, b, e, out);
#endif
    (void)isa;
    rows_generic(Q, kq, cap, g, b, e, out);
}

int64_t hg_kq_scores(int form, const float *q, int64_t heads, int64_t kv_heads, int64_t d, const uint8_t *kq, int64_t cap, int64_t n,
                     float *out, int isa) {
    void *mem = aligned_alloc(64, (size_t)((hg_kq_query_bytes(form, heads, d) + 63) & ~63));
    if (!mem) return -1;
    hg_kq_query Q;
    hg_kq_pack_query(&Q, form, q, heads, kv_heads, d, mem);
    if (isa < 0) isa = hg_kq_best_isa();
    for (int64_t g = 0; g < kv_heads; g++) hg_kq_score_rows(&Q, kq, cap, g, 0, n, out + g * n, isa);
    free(mem);
    return 0;
}
