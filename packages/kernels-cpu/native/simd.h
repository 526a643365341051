/* A tiny vector abstraction so every kernel is written once and compiled per ISA.
 * The build defines exactly one of HG_ISA_AVX512 / HG_ISA_AVX2 / HG_ISA_GENERIC and a
 * symbol suffix (HG_SUFFIX), so the three copies of each kernel link into one library.
 *   vf        a vector of VW floats
 *   vld/vst   unaligned f32 load/store; vld_f16 / vld_bf16 load VW halves widened to f32
 *   vfma(a,b,c) = a*b + c, vhsum = sum of lanes, vexp = e^x (about 2 ulp; 0 below -87.3)
 *   vld_part / vld_f16_part  the first n < VW elements, the rest zero (never reads past p + n)
 *   vld_bf16_eo   2*VW bf16 widened as two vectors: even elements, odd elements (shift and mask,
 *                 no lane shuffles: the dot-product kernels pair them with a query split the same way)
 *   vst_lanes(p, v, l, n)    lanes l .. l+n-1 of v to p[0 .. n) (n <= VW - l)
 *   vsum_lanes(a) one vector whose lane i is vhsum(a[i]) for VW vectors a[0..VW), bit for bit:
 *                 the same halving tree, done for VW sums at once (a transposing add tree) */
#ifndef HG_SIMD_H
#define HG_SIMD_H
#include <stdint.h>
#include <string.h>
#include <math.h>
#include "half.h"

#define HG_CAT2(a, b) a##b
#define HG_CAT(a, b) HG_CAT2(a, b)
#define KFN(name) HG_CAT(name, HG_SUFFIX)

#if defined(HG_ISA_AVX512)
#include <immintrin.h>
#define VW 16
typedef __m512 vf;
static inline vf vld(const float *p) { return _mm512_loadu_ps(p); }
static inline void vst(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vld_f16(const uint16_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
static inline vf vld_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
static inline void vst_f16(uint16_t *p, vf v) { _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm512_min_ps(a, b); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vhsum(vf v) { return _mm512_reduce_add_ps(v); }
static inline float vhmax(vf v) { return _mm512_reduce_max_ps(v); }
/* r[i] = sum of lanes of a, b, c, d: fold to 256 bits, then the AVX2 transpose-add. */
static inline __m256 fold256(vf v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); }
static inline void vhsum4(vf a, vf b, vf c, vf d, float *r) {
    __m256 ab = _mm256_hadd_ps(fold256(a), fold256(b)), cd = _mm256_hadd_ps(fold256(c), fold256(d));
    __m256 abcd = _mm256_hadd_ps(ab, cd);
    _mm_storeu_ps(r, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}
static inline vf vld_part(const float *p, int n) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
static inline void vst_lanes(float *p, vf v, int l, int n) {
    if (n == 4 && (l & 3) == 0) { /* a 128-bit lane: the 4x4 blocks' common case */
        switch (l >> 2) {
        case 0: _mm_storeu_ps(p, _mm512_castps512_ps128(v)); return;
        case 1: _mm_storeu_ps(p, _mm512_extractf32x4_ps(v, 1)); return;
        case 2: _mm_storeu_ps(p, _mm512_extractf32x4_ps(v, 2)); return;
        default: _mm_storeu_ps(p, _mm512_extractf32x4_ps(v, 3)); return;
        }
    }
    vf r = _mm512_permutexvar_ps(_mm512_add_epi32(_mm512_set1_epi32(l), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)), v);
    _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), r);
}
static inline vf vld_f16_part(const uint16_t *p, int n) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)((1u << n) - 1), p));
}
static inline void bf16_eo(__m512i x, vf *e, vf *o) {
    *e = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    *o = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}
static inline void vld_bf16_eo(const uint16_t *p, vf *e, vf *o) { bf16_eo(_mm512_loadu_si512(p), e, o); }
static inline void vld_bf16_eo_part(const uint16_t *p, int n, vf *e, vf *o) {
    bf16_eo(_mm512_maskz_loadu_epi16((__mmask32)((1u << n) - 1), p), e, o);
}
/* One level of the transposing add tree: in each pair of w-lane blocks, the low block gets
 * the pair's sum from a, the high block the pair's sum from b (blend + one shuffle + add). */
static inline vf comb8(vf a, vf b) { return _mm512_add_ps(_mm512_mask_blend_ps(0xFF00, a, b), _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 3, 2))); }
static inline vf comb4(vf a, vf b) {
    const __m512i idx = _mm512_setr_epi32(4, 5, 6, 7, 16, 17, 18, 19, 12, 13, 14, 15, 24, 25, 26, 27);
    return _mm512_add_ps(_mm512_mask_blend_ps(0xF0F0, a, b), _mm512_permutex2var_ps(a, idx, b));
}
static inline vf comb2(vf a, vf b) { return _mm512_add_ps(_mm512_mask_blend_ps(0xCCCC, a, b), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 3, 2))); }
static inline vf comb1(vf a, vf b) {
    return _mm512_add_ps(_mm512_mask_blend_ps(0xAAAA, a, b), _mm512_permute_ps(_mm512_mask_blend_ps(0x5555, a, b), _MM_SHUFFLE(2, 3, 0, 1)));
}
/* lanes l and l+8, then +4, +2, +1: the tree of _mm512_reduce_add_ps */
static inline vf vsum_lanes(const vf *a) {
    vf c8[8], c4[4], c2[2];
    for (int i = 0; i < 8; i++) c8[i] = comb8(a[i], a[i + 8]);
    for (int i = 0; i < 4; i++) c4[i] = comb4(c8[i], c8[i + 4]);
    for (int i = 0; i < 2; i++) c2[i] = comb2(c4[i], c4[i + 2]);
    return comb1(c2[0], c2[1]);
}
static inline vf vround(vf v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* 2^n for integral n in [-126, 127] */
static inline vf vpow2i(vf n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
}
/* lanes where x < lim become 0 */
static inline vf vzero_below(vf v, vf x, float lim) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, vset1(lim), _CMP_GE_OQ) | _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), v);
}

#elif defined(HG_ISA_AVX2)
#include <immintrin.h>
#define VW 8
typedef __m256 vf;
static inline vf vld(const float *p) { return _mm256_loadu_ps(p); }
static inline void vst(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vld_f16(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline vf vld_bf16(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
static inline void vst_f16(uint16_t *p, vf v) { _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT)); }
static inline vf vset1(float x) { return _mm256_set1_ps(x); }
static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
static inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
static inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vmin(vf a, vf b) { return _mm256_min_ps(a, b); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline float vhsum(vf v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline void vhsum4(vf a, vf b, vf c, vf d, float *r) {
    __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_storeu_ps(r, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}
static inline vf vld_part(const float *p, int n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane));
}
static inline void vst_lanes(float *p, vf v, int l, int n) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    vf r = _mm256_permutevar8x32_ps(v, _mm256_add_epi32(_mm256_set1_epi32(l), lane));
    _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane), r);
}
static inline vf vld_f16_part(const uint16_t *p, int n) {
    uint16_t t[8] = {0};
    memcpy(t, p, (size_t)n * 2);
    return vld_f16(t);
}
static inline void bf16_eo(__m256i x, vf *e, vf *o) {
    *e = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    *o = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)));
}
static inline void vld_bf16_eo(const uint16_t *p, vf *e, vf *o) { bf16_eo(_mm256_loadu_si256((const __m256i *)p), e, o); }
static inline void vld_bf16_eo_part(const uint16_t *p, int n, vf *e, vf *o) {
    uint16_t t[16] = {0};
    memcpy(t, p, (size_t)n * 2);
    vld_bf16_eo(t, e, o);
}
static inline vf comb4(vf a, vf b) { return _mm256_add_ps(_mm256_blend_ps(a, b, 0xF0), _mm256_permute2f128_ps(a, b, 0x21)); }
static inline vf comb2(vf a, vf b) { return _mm256_add_ps(_mm256_blend_ps(a, b, 0xCC), _mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 3, 2))); }
static inline vf comb1(vf a, vf b) {
    return _mm256_add_ps(_mm256_blend_ps(a, b, 0xAA), _mm256_permute_ps(_mm256_blend_ps(a, b, 0x55), _MM_SHUFFLE(2, 3, 0, 1)));
}
/* lanes l and l+4, then +2, +1: the tree of vhsum */
static inline vf vsum_lanes(const vf *a) {
    vf c4[4], c2[2];
    for (int i = 0; i < 4; i++) c4[i] = comb4(a[i], a[i + 4]);
    for (int i = 0; i < 2; i++) c2[i] = comb2(c4[i], c4[i + 2]);
    return comb1(c2[0], c2[1]);
}
static inline float vhmax(vf v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vf vround(vf v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
static inline vf vpow2i(vf n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline vf vzero_below(vf v, vf x, float lim) {
    return _mm256_and_ps(v, _mm256_cmp_ps(x, vset1(lim), _CMP_NLT_UQ)); /* keeps NaN lanes */
}

#elif defined(HG_ISA_GENERIC)
/* Portable fallback: GCC vector extensions, lowered to whatever the target has. */
#define VW 4
typedef float vf __attribute__((vector_size(16)));
static inline vf vld(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void vst(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf vld_f16(const uint16_t *p) {
    vf v = {hg_f16_to_f32(p[0]), hg_f16_to_f32(p[1]), hg_f16_to_f32(p[2]), hg_f16_to_f32(p[3])};
    return v;
}
static inline vf vld_bf16(const uint16_t *p) {
    vf v = {hg_bf16_to_f32(p[0]), hg_bf16_to_f32(p[1]), hg_bf16_to_f32(p[2]), hg_bf16_to_f32(p[3])};
    return v;
}
static inline void vst_f16(uint16_t *p, vf v) { for (int i = 0; i < 4; i++) p[i] = hg_f32_to_f16(v[i]); }
static inline vf vset1(float x) { vf v = {x, x, x, x}; return v; }
static inline vf vzero(void) { return vset1(0.0f); }
static inline vf vadd(vf a, vf b) { return a + b; }
static inline vf vsub(vf a, vf b) { return a - b; }
static inline vf vmul(vf a, vf b) { return a * b; }
static inline vf vdiv(vf a, vf b) { return a / b; }
static inline vf vmax(vf a, vf b) { vf r; for (int i = 0; i < 4; i++) r[i] = a[i] > b[i] ? a[i] : b[i]; return r; }
static inline vf vmin(vf a, vf b) { vf r; for (int i = 0; i < 4; i++) r[i] = a[i] < b[i] ? a[i] : b[i]; return r; }
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline float vhsum(vf v) { return (v[0] + v[1]) + (v[2] + v[3]); }
static inline float vhmax(vf v) { float a = v[0] > v[1] ? v[0] : v[1], b = v[2] > v[3] ? v[2] : v[3]; return a > b ? a : b; }
static inline void vhsum4(vf a, vf b, vf c, vf d, float *r) { r[0] = vhsum(a); r[1] = vhsum(b); r[2] = vhsum(c); r[3] = vhsum(d); }
static inline vf vld_part(const float *p, int n) { vf v = vzero(); for (int i = 0; i < n; i++) v[i] = p[i]; return v; }
static inline void vst_lanes(float *p, vf v, int l, int n) { for (int i = 0; i < n; i++) p[i] = v[l + i]; }
static inline vf vld_f16_part(const uint16_t *p, int n) { vf v = vzero(); for (int i = 0; i < n; i++) v[i] = hg_f16_to_f32(p[i]); return v; }
static inline void vld_bf16_eo_part(const uint16_t *p, int n, vf *e, vf *o) {
    vf a = vzero(), b = vzero();
    for (int i = 0; i < n; i++) {
        if (i & 1) b[i >> 1] = hg_bf16_to_f32(p[i]);
        else a[i >> 1] = hg_bf16_to_f32(p[i]);
    }
    *e = a;
    *o = b;
}
static inline void vld_bf16_eo(const uint16_t *p, vf *e, vf *o) { vld_bf16_eo_part(p, 8, e, o); }
static inline vf vsum_lanes(const vf *a) { vf r = {vhsum(a[0]), vhsum(a[1]), vhsum(a[2]), vhsum(a[3])}; return r; }
#else
#error "define one of HG_ISA_AVX512, HG_ISA_AVX2, HG_ISA_GENERIC"
#endif

#if defined(HG_ISA_GENERIC)
static inline vf vexp(vf x) { vf r; for (int i = 0; i < 4; i++) r[i] = expf(x[i]); return r; }
#else
/* e^x: x = n ln2 + r, |r| <= ln2/2, e^r by the Cephes expf polynomial, times 2^n. */
static inline vf vexp(vf x) {
    vf xc = vmax(vset1(-87.33f), vmin(vset1(88.37f), x)); /* x second: NaN passes through */
    vf n = vround(vmul(xc, vset1(1.44269504088896341f)));
    vf r = vfma(n, vset1(-0.693359375f), xc);
    r = vfma(n, vset1(2.12194440e-4f), r);
    vf p = vset1(1.9875691500e-4f);
    p = vfma(p, r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    p = vfma(p, vmul(r, r), vadd(r, vset1(1.0f)));
    return vzero_below(vmul(p, vpow2i(n)), x, -87.33f);
}
#endif

/* Load VW elements of a weight/storage row of any dtype as f32. */
static inline vf vld_any(const void *p, int type, long i) {
    if (type == 0) return vld((const float *)p + i);
    if (type == 1) return vld_f16((const uint16_t *)p + i);
    return vld_bf16((const uint16_t *)p + i);
}
static inline float sld_any(const void *p, int type, long i) {
    if (type == 0) return ((const float *)p)[i];
    if (type == 1) return hg_f16_to_f32(((const uint16_t *)p)[i]);
    return hg_bf16_to_f32(((const uint16_t *)p)[i]);
}
static inline float sld_f32(const float *p) { return *p; }
static inline float sld_f16(const uint16_t *p) { return hg_f16_to_f32(*p); }
static inline float sld_bf16(const uint16_t *p) { return hg_bf16_to_f32(*p); }

#endif
