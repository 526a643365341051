/* Attention aggregation over cached V stored as [kv_heads, cap, head_dim] in f32/f16/bf16
 * (the logits are in kernels_logits.c): V rows are folded into the per-head accumulator
 * 4 tokens per pass, so each accumulator load/store serves 4 FMAs. */
#include "simd.h"
#include "kernels.h"

static inline int64_t token_at(const int32_t *slots, int64_t start, int64_t j) {
    return slots ? (int64_t)slots[j] : start + j;
}

/* Fetch the row of the token PF_TOKENS ahead ourselves: gathered rows are scattered, so the
 * hardware prefetcher cannot guess them, and even on spans it keeps too few misses in flight. */
#define PF_TOKENS 16
static inline void prefetch_row(const void *base, const int32_t *slots, int64_t start, int64_t j, int64_t j1, int64_t row_bytes) {
    if (j + PF_TOKENS >= j1) return;
    const char *p = (const char *)base + token_at(slots, start, j + PF_TOKENS) * row_bytes;
    for (int64_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
}

#define DEFINE_AGGR(T, KT, VLD, SLD)                                                             \
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

DEFINE_AGGR(f32, float, vld, sld_f32)
DEFINE_AGGR(f16, uint16_t, vld_f16, sld_f16)
DEFINE_AGGR(bf16, uint16_t, vld_bf16, sld_bf16)

void KFN(hg_k_attn_aggregate)(const hg_aggr_args *a, float *acc, int64_t j0, int64_t j1) {
    if (a->vtype == 0) aggregate_f32(a, acc, j0, j1);
    else if (a->vtype == 1) aggregate_f16(a, acc, j0, j1);
    else aggregate_bf16(a, acc, j0, j1);
}
