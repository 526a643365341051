/* Attention stages over cached K/V stored as [kv_heads, cap, head_dim] in f32/f16/bf16.
 * Logits: every K row is loaded once and scored against all query heads of its group
 * (GQA), 4 heads at a time with two accumulators each. Aggregate: V rows are folded into
 * the per-head accumulator 4 tokens per pass, so each accumulator load/store serves 4 FMAs. */
#include "simd.h"
#include "kernels.h"

static inline int64_t token_at(const int32_t *slots, int64_t start, int64_t j) {
    return slots ? (int64_t)slots[j] : start + j;
}

/* Fetch the row of the token PF_TOKENS ahead ourselves: gathered rows are scattered, so the
 * hardware prefetcher cannot guess them, and even on spans it keeps too few misses in
 * flight (a 16K-token f32 span ran at 18 GB/s without this, a random gather at 50). */
#define PF_TOKENS 16
static inline void prefetch_row(const void *base, const int32_t *slots, int64_t start, int64_t j, int64_t j1, int64_t row_bytes) {
    if (j + PF_TOKENS >= j1) return;
    const char *p = (const char *)base + token_at(slots, start, j + PF_TOKENS) * row_bytes;
    for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
}

#define DEFINE_ATTN(T, KT, VLD, SLD)                                                             \
static inline float dot_##T(const float *q, const KT *k, int d) {                             \
    vf a0 = vzero(), a1 = vzero();                                                             \
    int i = 0;                                                                                 \
    for (; i + 2 * VW <= d; i += 2 * VW) {                                                     \
        a0 = vfma(vld(q + i), VLD(k + i), a0);                                                 \
        a1 = vfma(vld(q + i + VW), VLD(k + i + VW), a1);                                       \
    }                                                                                          \
    for (; i + VW <= d; i += VW) a0 = vfma(vld(q + i), VLD(k + i), a0);                        \
    float s = vhsum(vadd(a0, a1));                                                             \
    for (; i < d; i++) s += q[i] * SLD(k + i);                                                 \
    return s;                                                                                  \
}                                                                                              \
/* 4 query heads (rows qs apart) . one K row -> r[0..3] */                                     \
static inline void dot4_##T(const float *q, int qs, const KT *k, int d, float *r) {           \
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();                                 \
    int i = 0;                                                                                 \
    for (; i + VW <= d; i += VW) {                                                             \
        vf k0 = VLD(k + i);                                                                    \
        a0 = vfma(vld(q + i), k0, a0); a1 = vfma(vld(q + qs + i), k0, a1);                     \
        a2 = vfma(vld(q + 2 * qs + i), k0, a2); a3 = vfma(vld(q + 3 * qs + i), k0, a3);        \
    }                                                                                          \
    vhsum4(a0, a1, a2, a3, r);                                                                 \
    for (; i < d; i++) {                                                                       \
        float kv = SLD(k + i);                                                                 \
        r[0] += q[i] * kv; r[1] += q[qs + i] * kv; r[2] += q[2 * qs + i] * kv; r[3] += q[3 * qs + i] * kv; \
    }                                                                                          \
}                                                                                              \
/* 4 query heads . two K rows -> r[0..3] (row k0), r[4..7] (row k1): each q vector loaded     \
 * once serves both tokens, 8 independent FMA chains. */                                      \
static inline void dot4x2_##T(const float *q, int qs, const KT *k0p, const KT *k1p, int d, float *r) { \
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();                                 \
    vf b0 = vzero(), b1 = vzero(), b2 = vzero(), b3 = vzero();                                 \
    int i = 0;                                                                                 \
    for (; i + VW <= d; i += VW) {                                                             \
        vf k0 = VLD(k0p + i), k1 = VLD(k1p + i), qv;                                           \
        qv = vld(q + i);          a0 = vfma(qv, k0, a0); b0 = vfma(qv, k1, b0);                \
        qv = vld(q + qs + i);     a1 = vfma(qv, k0, a1); b1 = vfma(qv, k1, b1);                \
        qv = vld(q + 2 * qs + i); a2 = vfma(qv, k0, a2); b2 = vfma(qv, k1, b2);                \
        qv = vld(q + 3 * qs + i); a3 = vfma(qv, k0, a3); b3 = vfma(qv, k1, b3);                \
    }                                                                                          \
    vhsum4(a0, a1, a2, a3, r);                                                                 \
    vhsum4(b0, b1, b2, b3, r + 4);                                                             \
    for (; i < d; i++) {                                                                       \
        float x0 = SLD(k0p + i), x1 = SLD(k1p + i);                                            \
        for (int h = 0; h < 4; h++) { r[h] += q[h * qs + i] * x0; r[4 + h] += q[h * qs + i] * x1; } \
    }                                                                                          \
}                                                                                              \
/* one query head . four K rows -> r[0..3]: one q load serves four tokens, one reduction */ \
static inline void dot1x4_##T(const float *q, const KT *k0, const KT *k1, const KT *k2, const KT *k3, int d, float *r) { \
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();                                 \
    int i = 0;                                                                                 \
    for (; i + VW <= d; i += VW) {                                                             \
        vf qv = vld(q + i);                                                                    \
        a0 = vfma(qv, VLD(k0 + i), a0); a1 = vfma(qv, VLD(k1 + i), a1);                        \
        a2 = vfma(qv, VLD(k2 + i), a2); a3 = vfma(qv, VLD(k3 + i), a3);                        \
    }                                                                                          \
    vhsum4(a0, a1, a2, a3, r);                                                                 \
    for (; i < d; i++) {                                                                       \
        r[0] += q[i] * SLD(k0 + i); r[1] += q[i] * SLD(k1 + i);                                \
        r[2] += q[i] * SLD(k2 + i); r[3] += q[i] * SLD(k3 + i);                                \
    }                                                                                          \
}                                                                                              \
static void logits_##T(const hg_logits_args *a, int64_t j0, int64_t j1) {                      \
    const int d = a->head_dim, g = a->heads / a->kv_heads;                                     \
    const KT *K = (const KT *)a->k;                                                            \
    float r[16];                                                                               \
    for (int kh = 0; kh < a->kv_heads; kh++) {                                                 \
        const KT *kbase = K + (int64_t)kh * a->cap * d;                                        \
        const float *qg = a->q + (int64_t)kh * g * d;                                          \
        float *lg = a->logits + (int64_t)kh * g * a->lstride;                                  \
        int64_t j = j0;                                                                        \
        for (; j + 4 <= j1; j += 4) { /* four tokens: 4-head x 2-token blocks, then 1 x 4 */    \
            for (int t = 0; t < 4; t++)                                                        \
                prefetch_row(kbase, a->slots, a->start, j + t, j1, (int64_t)d * sizeof(KT));   \
            const KT *k0 = kbase + token_at(a->slots, a->start, j) * d;                        \
            const KT *k1 = kbase + token_at(a->slots, a->start, j + 1) * d;                    \
            const KT *k2 = kbase + token_at(a->slots, a->start, j + 2) * d;                    \
            const KT *k3 = kbase + token_at(a->slots, a->start, j + 3) * d;                    \
            int h = 0;                                                                         \
            for (; h + 4 <= g; h += 4) {                                                       \
                dot4x2_##T(qg + (int64_t)h * d, d, k0, k1, d, r);                              \
                dot4x2_##T(qg + (int64_t)h * d, d, k2, k3, d, r + 8);                          \
                for (int t = 0; t < 4; t++) {                                                  \
                    float *l = lg + (int64_t)(h + t) * a->lstride + j;                         \
                    l[0] = a->scale * r[t]; l[1] = a->scale * r[4 + t];                        \
                    l[2] = a->scale * r[8 + t]; l[3] = a->scale * r[12 + t];                   \
                }                                                                              \
            }                                                                                  \
            for (; h < g; h++) {                                                               \
                dot1x4_##T(qg + (int64_t)h * d, k0, k1, k2, k3, d, r);                         \
                float *l = lg + (int64_t)h * a->lstride + j;                                   \
                for (int t = 0; t < 4; t++) l[t] = a->scale * r[t];                            \
            }                                                                                  \
        }                                                                                      \
        for (; j < j1; j++) {                                                                  \
            prefetch_row(kbase, a->slots, a->start, j, j1, (int64_t)d * sizeof(KT));                     \
            const KT *krow = kbase + token_at(a->slots, a->start, j) * d;                      \
            int h = 0;                                                                         \
            for (; h + 4 <= g; h += 4) {                                                       \
                dot4_##T(qg + (int64_t)h * d, d, krow, d, r);                                  \
                for (int t = 0; t < 4; t++) lg[(int64_t)(h + t) * a->lstride + j] = a->scale * r[t]; \
            }                                                                                  \
            for (; h < g; h++)                                                                 \
                lg[(int64_t)h * a->lstride + j] = a->scale * dot_##T(qg + (int64_t)h * d, krow, d); \
        }                                                                                      \
    }                                                                                          \
}                                                                                              \
static void aggregate_##T(const hg_aggr_args *a, float *acc, int64_t j0, int64_t j1) {         \
    const int d = a->head_dim, g = a->heads / a->kv_heads;                                     \
    const KT *V = (const KT *)a->v;                                                            \
    for (int kh = 0; kh < a->kv_heads; kh++) {                                                 \
        const KT *vbase = V + (int64_t)kh * a->cap * d;                                        \
        int64_t j = j0;                                                                        \
        for (; j + 4 <= j1; j += 4) {                                                          \
            for (int t = 0; t < 4; t++) prefetch_row(vbase, a->slots, a->start, j + t, j1, (int64_t)d * sizeof(KT)); \
            const KT *v0 = vbase + token_at(a->slots, a->start, j) * d;                        \
            const KT *v1 = vbase + token_at(a->slots, a->start, j + 1) * d;                    \
            const KT *v2 = vbase + token_at(a->slots, a->start, j + 2) * d;                    \
            const KT *v3 = vbase + token_at(a->slots, a->start, j + 3) * d;                    \
            for (int h = kh * g; h < (kh + 1) * g; h++) {                                      \
                const float *p = a->probs + (int64_t)h * a->pstride + j;                       \
                float *o = acc + (int64_t)h * d;                                               \
                vf p0 = vset1(p[0]), p1 = vset1(p[1]), p2 = vset1(p[2]), p3 = vset1(p[3]);     \
                int i = 0;                                                                     \
                for (; i + VW <= d; i += VW) {                                                 \
                    vf s = vfma(p0, VLD(v0 + i), vld(o + i));                                  \
                    s = vfma(p1, VLD(v1 + i), s);                                              \
                    s = vfma(p2, VLD(v2 + i), s);                                              \
                    vst(o + i, vfma(p3, VLD(v3 + i), s));                                      \
                }                                                                              \
                for (; i < d; i++)                                                             \
                    o[i] += p[0] * SLD(v0 + i) + p[1] * SLD(v1 + i) + p[2] * SLD(v2 + i) + p[3] * SLD(v3 + i); \
            }                                                                                  \
        }                                                                                      \
        for (; j < j1; j++) {                                                                  \
            const KT *v0 = vbase + token_at(a->slots, a->start, j) * d;                        \
            for (int h = kh * g; h < (kh + 1) * g; h++) {                                      \
                vf p0 = vset1(a->probs[(int64_t)h * a->pstride + j]);                          \
                float *o = acc + (int64_t)h * d;                                               \
                int i = 0;                                                                     \
                for (; i + VW <= d; i += VW) vst(o + i, vfma(p0, VLD(v0 + i), vld(o + i)));     \
                for (; i < d; i++) o[i] += a->probs[(int64_t)h * a->pstride + j] * SLD(v0 + i); \
            }                                                                                  \
        }                                                                                      \
    }                                                                                          \
}

DEFINE_ATTN(f32, float, vld, sld_f32)
DEFINE_ATTN(f16, uint16_t, vld_f16, sld_f16)
DEFINE_ATTN(bf16, uint16_t, vld_bf16, sld_bf16)

void KFN(hg_k_attn_logits)(const hg_logits_args *a, int64_t j0, int64_t j1) {
    if (a->ktype == 0) logits_f32(a, j0, j1);
    else if (a->ktype == 1) logits_f16(a, j0, j1);
    else logits_bf16(a, j0, j1);
}

void KFN(hg_k_attn_aggregate)(const hg_aggr_args *a, float *acc, int64_t j0, int64_t j1) {
    if (a->vtype == 0) aggregate_f32(a, acc, j0, j1);
    else if (a->vtype == 1) aggregate_f16(a, acc, j0, j1);
    else aggregate_bf16(a, acc, j0, j1);
}
