/* A tiny vector abstraction so every kernel is written once and compiled per ISA.
 * The build defines exactly one of HG_ISA_AVX512 / HG_ISA_AVX2 / HG_ISA_GENERIC and a
 * symbol suffix (HG_SUFFIX), so the three copies of each kernel link into one library.
 *   vf        a vector of VW floats
 *   vld/vst   unaligned f32 load/store; vld_f16 / vld_bf16 load VW halves widened to f32
 *   vfma(a,b,c) = a*b + c, vhsum = sum of lanes, vexp = e^x (about 2 ulp; 0 below -87.3) */
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
