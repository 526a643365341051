/* out[n, m] = x[n, k] . w[m, k]^T (+ bias[m]) for f32 / f16 / bf16 weights.
 * For one x row (decode) the weights are read strictly in memory order, row after row (two
 * accumulators each): a GEMV is bound by memory, and one sequential stream per thread is
 * what the hardware prefetchers follow best. Interleaving 4 rows to share x loads needed
 * software prefetching and still ran 5-10% slower, measured against a llama2.c-style
 * OpenMP GEMV in the same run. For several x rows (prefill) a tile of 4 weight rows x NX
 * x rows reuses every weight vector NX times from a register. */
#include "simd.h"
#include "kernels.h"

#if defined(HG_ISA_AVX512)
#define NX 4
#elif defined(HG_ISA_AVX2)
#define NX 3
#else
#define NX 2
#endif

#define DEFINE_MATMUL(T, WT, VLD, SLD)                                                           \
/* dot of one weight row with one x row */                                                    \
static float dot1_##T(const WT *w, const float *x, int k) {                                    \
    vf a0 = vzero(), a1 = vzero();                                                             \
    int i = 0;                                                                                 \
    for (; i + 2 * VW <= k; i += 2 * VW) {                                                     \
        a0 = vfma(VLD(w + i), vld(x + i), a0);                                                 \
        a1 = vfma(VLD(w + i + VW), vld(x + i + VW), a1);                                       \
    }                                                                                          \
    for (; i + VW <= k; i += VW) a0 = vfma(VLD(w + i), vld(x + i), a0);                        \
    float s = vhsum(vadd(a0, a1));                                                             \
    for (; i < k; i++) s += SLD(w + i) * x[i];                                                 \
    return s;                                                                                  \
}                                                                                              \
/* 4 weight rows . one x row -> r[0..3] */                                                     \
static void gemv4_##T(const WT *w, long ldw, const float *x, int k, float *r) {                \
    const WT *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;                     \
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();                                 \
    vf b0 = vzero(), b1 = vzero(), b2 = vzero(), b3 = vzero();                                 \
    int i = 0;                                                                                 \
    for (; i + 2 * VW <= k; i += 2 * VW) {                                                     \
        vf x0 = vld(x + i), x1 = vld(x + i + VW);                                              \
        a0 = vfma(VLD(w0 + i), x0, a0); b0 = vfma(VLD(w0 + i + VW), x1, b0);                   \
        a1 = vfma(VLD(w1 + i), x0, a1); b1 = vfma(VLD(w1 + i + VW), x1, b1);                   \
        a2 = vfma(VLD(w2 + i), x0, a2); b2 = vfma(VLD(w2 + i + VW), x1, b2);                   \
        a3 = vfma(VLD(w3 + i), x0, a3); b3 = vfma(VLD(w3 + i + VW), x1, b3);                   \
    }                                                                                          \
    for (; i + VW <= k; i += VW) {                                                             \
        vf x0 = vld(x + i);                                                                    \
        a0 = vfma(VLD(w0 + i), x0, a0); a1 = vfma(VLD(w1 + i), x0, a1);                        \
        a2 = vfma(VLD(w2 + i), x0, a2); a3 = vfma(VLD(w3 + i), x0, a3);                        \
    }                                                                                          \
    vhsum4(vadd(a0, b0), vadd(a1, b1), vadd(a2, b2), vadd(a3, b3), r);                         \
    for (; i < k; i++) {                                                                       \
        float xi = x[i];                                                                       \
        r[0] += SLD(w0 + i) * xi; r[1] += SLD(w1 + i) * xi;                                    \
        r[2] += SLD(w2 + i) * xi; r[3] += SLD(w3 + i) * xi;                                    \
    }                                                                                          \
}                                                                                              \
/* 4 weight rows x NX x rows -> r[xrow * 4 + wrow] */                                          \
static void gemm4_##T(const WT *w, long ldw, const float *x, long ldx, int k, float *r) {      \
    vf acc[NX][4];                                                                             \
    for (int j = 0; j < NX; j++)                                                               \
        for (int q = 0; q < 4; q++) acc[j][q] = vzero();                                       \
    int i = 0;                                                                                 \
    for (; i + VW <= k; i += VW) {                                                             \
        vf xv[NX];                                                                             \
        _Pragma("GCC unroll 4") for (int j = 0; j < NX; j++) xv[j] = vld(x + j * ldx + i);     \
        _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {                                  \
            vf wv = VLD(w + q * ldw + i);                                                      \
            _Pragma("GCC unroll 4") for (int j = 0; j < NX; j++) acc[j][q] = vfma(wv, xv[j], acc[j][q]); \
        }                                                                                      \
    }                                                                                          \
    for (int j = 0; j < NX; j++) {                                                             \
        vhsum4(acc[j][0], acc[j][1], acc[j][2], acc[j][3], r + j * 4);                         \
        for (int q = 0; q < 4; q++)                                                            \
            for (int t = i; t < k; t++) r[j * 4 + q] += SLD(w + q * ldw + t) * x[j * ldx + t]; \
    }                                                                                          \
}                                                                                              \
static void matmul_##T(const hg_matmul_args *a, long r0, long r1) {                            \
    const WT *w = (const WT *)a->w;                                                            \
    const int k = a->k, m = a->m, n = a->n;                                                    \
    float r[4 * NX];                                                                           \
    long row = r0;                                                                             \
    if (n == 1) /* decode: one sequential stream */                                            \
        for (; row < r1; row++) a->out[row] = dot1_##T(w + row * (long)k, a->x, k);            \
    for (; row + 4 <= r1; row += 4) {                                                          \
        const WT *wr = w + row * (long)k;                                                      \
        int i = 0;                                                                             \
        for (; i + NX <= n && n > 1; i += NX) {                                                \
            gemm4_##T(wr, k, a->x + (long)i * k, k, k, r);                                     \
            for (int j = 0; j < NX; j++)                                                       \
                for (int q = 0; q < 4; q++) a->out[(long)(i + j) * m + row + q] = r[j * 4 + q]; \
        }                                                                                      \
        for (; i < n; i++) {                                                                   \
            gemv4_##T(wr, k, a->x + (long)i * k, k, r);                                        \
            for (int q = 0; q < 4; q++) a->out[(long)i * m + row + q] = r[q];                  \
        }                                                                                      \
    }                                                                                          \
    for (; row < r1; row++)                                                                    \
        for (int i = 0; i < n; i++)                                                            \
            a->out[(long)i * m + row] = dot1_##T(w + row * (long)k, a->x + (long)i * k, k);    \
    if (a->bias)                                                                               \
        for (int i = 0; i < n; i++)                                                            \
            for (long c = r0; c < r1; c++) a->out[(long)i * m + c] += sld_any(a->bias, a->btype, c); \
}

DEFINE_MATMUL(f32, float, vld, sld_f32)
DEFINE_MATMUL(f16, uint16_t, vld_f16, sld_f16)
DEFINE_MATMUL(bf16, uint16_t, vld_bf16, sld_bf16)

void KFN(hg_k_matmul)(const hg_matmul_args *a, long r0, long r1) {
    if (a->wtype == 0) matmul_f32(a, r0, r1);
    else if (a->wtype == 1) matmul_f16(a, r0, r1);
    else matmul_bf16(a, r0, r1);
}
