/* Attention logits q·Kᵀ over cached K stored as [kv_heads, cap, head_dim] in f32/f16/bf16.
 *
 * The floor: with a GQA group of g query heads each K element takes g FMAs, so two cores at one
 * 512-bit FMA per cycle would score ~29 G elements/s for g = 4 — about twice what DRAM delivers
 * in f32 and about as much as it delivers in bf16. So the kernel keeps the FMA pipe busy and
 * spends little else:
 *  - A block is BH query heads x BT tokens with BH * BT = VW accumulators (4x4 on AVX-512):
 *    each K vector is loaded once and feeds BH FMAs.
 *  - The VW partial sums of a block are reduced together by one transposing add tree
 *    (vsum_lanes, ~1 shuffle per result instead of a horizontal sum per token).
 *  - bf16 K is widened as even/odd halves (a shift and a mask, no lane shuffles) against a query
 *    packed the same way once per call; q stays f32, so nothing is rounded.
 *  - K rows are read one after the other, front to back, so a span is one sequential stream
 *    that the hardware prefetcher follows; the query vectors come from L1 for every FMA (Zen 4
 *    loads two a cycle, so this costs nothing next to the FMA).
 *  - Tokens go in tiles of 16 rows: every head block of the group scores a tile from L1; for a
 *    gather, the rows PF_TOKENS ahead are prefetched, spread over the tile's blocks.
 * Every (head, token) result is the same sum in the same order whatever the blocking, so the
 * logits do not depend on the thread count or on where a range starts. */
#include "simd.h"
#include "kernels.h"

#define TILE 16
#ifndef PF_TOKENS
#define PF_TOKENS 32
#endif

static inline int chunk_of(int kt) { return kt == 2 ? 2 * VW : VW; }

static int qstride(int kt, int d) {
    int c = chunk_of(kt);
    return (d + c - 1) / c * c;
}

/* f32/f16: the head's row zero-padded to the chunk; bf16: per chunk of 2*VW dims, the even dims
 * then the odd dims, matching vld_bf16_eo. */
static void qpack(float *dst, const float *q, int heads, int d, int kt) {
    int s = qstride(kt, d);
    for (int h = 0; h < heads; h++) {
        float *o = dst + (int64_t)h * s;
        const float *x = q + (int64_t)h * d;
        if (kt != 2) {
            memcpy(o, x, (size_t)d * sizeof(float));
            memset(o + d, 0, (size_t)(s - d) * sizeof(float));
            continue;
        }
        for (int c = 0; c < s; c += 2 * VW)
            for (int l = 0; l < VW; l++) {
                int e = c + 2 * l;
                o[c + l] = e < d ? x[e] : 0.0f;
                o[c + VW + l] = e + 1 < d ? x[e + 1] : 0.0f;
            }
    }
}

/* acc[h*BT + t] += q_h . k over the chunk of row k at dim i; n = dims left in the chunk (a full
 * chunk, or the row's tail, read with masked/partial loads so nothing past the row is touched).
 * The query comes from L1 for every FMA: that keeps the K stream strictly sequential (below). */
static inline __attribute__((always_inline)) void step(const int kt, const int BH, vf *acc, int t, const float *const *qh,
                                                       const void *k, int i, int n) {
    const int BT = VW / BH, full = n == chunk_of(kt);
    vf k0, k1;
    if (kt == 0) k0 = full ? vld((const float *)k + i) : vld_part((const float *)k + i, n);
    else if (kt == 1) k0 = full ? vld_f16((const uint16_t *)k + i) : vld_f16_part((const uint16_t *)k + i, n);
    else if (full) vld_bf16_eo((const uint16_t *)k + i, &k0, &k1);
    else vld_bf16_eo_part((const uint16_t *)k + i, n, &k0, &k1);
#pragma GCC unroll 4
    for (int h = 0; h < BH; h++) {
        acc[h * BT + t] = vfma(vld(qh[h] + i), k0, acc[h * BT + t]);
        if (kt == 2) acc[h * BT + t] = vfma(vld(qh[h] + i + VW), k1, acc[h * BT + t]);
    }
}

/* lane h*BT + t of the result = q_h . k_t over the whole row. Rows are read one after the other,
 * front to back: the hardware prefetcher follows that as one sequential stream, where reading
 * the block's rows chunk by chunk side by side (4 interleaved streams) measured at less than
 * half the DRAM bandwidth on Zen 4 (14 vs 32 GB/s on one core). */
static inline __attribute__((always_inline)) vf score_block(const int kt, const int BH, const float *const *qh,
                                                            const void *const *kr, int d) {
    const int BT = VW / BH, ch = chunk_of(kt);
    vf acc[VW];
#pragma GCC unroll 16
    for (int i = 0; i < VW; i++) acc[i] = vzero();
#pragma GCC unroll 16
    for (int t = 0; t < BT; t++) {
        int i = 0;
        for (; i + ch <= d; i += ch) step(kt, BH, acc, t, qh, kr[t], i, ch);
        if (i < d) step(kt, BH, acc, t, qh, kr[t], i, d - i);
    }
    return vsum_lanes(acc);
}

static inline void prefetch_bytes(const char *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 3);
    __builtin_prefetch(p + bytes - 1, 0, 3); /* a row that is not line-aligned ends in one more line */
}

/* Heads h0 .. h0+nh-1 (nh <= BH; a short block repeats its last head) of a tile of m rows
 * (rows[m..TILE) repeat the last row), written to columns j .. j+m-1. Each block also
 * prefetches its share of the npf rows pf[] (a later tile): spread out, not in one burst. */
static inline __attribute__((always_inline)) void score_tile(const int kt, const int BH, const int d, const hg_logits_args *a,
                                                             const float *qg, int qs, int h0, int nh,
                                                             const void *const *rows, int m, float *lg, int64_t j,
                                                             const char *const *pf, int npf, int64_t rb) {
    const int BT = VW / BH;
    const float *qh[4];
    for (int h = 0; h < BH; h++) qh[h] = qg + (int64_t)(h0 + (h < nh ? h : nh - 1)) * qs;
    const vf scale = vset1(a->scale);
    for (int t0 = 0; t0 < m; t0 += BT) {
        for (int t = t0; t < t0 + BT && t < npf; t++) prefetch_bytes(pf[t], rb);
        _Alignas(64) float out[VW];
        vst(out, vmul(score_block(kt, BH, qh, rows + t0, d), scale));
        int mt = m - t0 < BT ? m - t0 : BT;
        for (int h = 0; h < nh; h++) {
            float *dst = lg + (int64_t)(h0 + h) * a->lstride + j + t0;
            if (mt == BT) memcpy(dst, out + h * BT, BT * sizeof(float));
            else for (int t = 0; t < mt; t++) dst[t] = out[h * BT + t];
        }
    }
}

/* KV head kh, tokens [j0, j1). */
static inline __attribute__((always_inline)) void logits_head(const int kt, const int dk, const hg_logits_args *a, int kh,
                                                              int64_t j0, int64_t j1) {
    const int d = dk ? dk : a->head_dim, g = a->heads / a->kv_heads, qs = qstride(kt, d);
    const int64_t rb = (int64_t)d * (kt == 0 ? 4 : 2);
    const char *kbase = (const char *)a->k + (int64_t)kh * a->cap * rb;
    const float *qg = a->qp + (int64_t)kh * g * qs;
    float *lg = a->logits + (int64_t)kh * g * a->lstride;
    const int32_t *slots = a->slots;
    for (int64_t j = j0; j < j1; j += TILE) {
        int m = j1 - j < TILE ? (int)(j1 - j) : TILE;
        const void *rows[TILE];
        const char *pf[TILE];
        for (int t = 0; t < TILE; t++) {
            int64_t jj = j + (t < m ? t : m - 1);
            rows[t] = kbase + (slots ? (int64_t)slots[jj] : a->start + jj) * rb;
        }
        /* gathered rows are scattered: fetch the rows PF_TOKENS ahead ourselves (a span is one
         * sequential stream, which the hardware prefetcher follows better without help) */
        int64_t p0 = j + PF_TOKENS;
        int npf = !slots || p0 >= j1 ? 0 : j1 - p0 < TILE ? (int)(j1 - p0) : TILE;
        for (int t = 0; t < npf; t++) pf[t] = kbase + (int64_t)slots[p0 + t] * rb;
        int h = 0;
        for (; h + 4 <= g; h += 4, npf = 0) score_tile(kt, 4, d, a, qg, qs, h, 4, rows, m, lg, j, pf, npf, rb);
        if (g - h == 3) score_tile(kt, 4, d, a, qg, qs, h, 3, rows, m, lg, j, pf, npf, rb);
        else if (g - h == 2) score_tile(kt, 2, d, a, qg, qs, h, 2, rows, m, lg, j, pf, npf, rb);
        else if (g - h == 1) score_tile(kt, 1, d, a, qg, qs, h, 1, rows, m, lg, j, pf, npf, rb);
    }
}

/* One instance per K dtype, and per common head dim (a compile-time row length unrolls the
 * row loop: measured ~1.8x faster in L2 than a loop over a run-time head_dim). */
#define LOGITS_HEAD(T, KT)                                                                          \
static void logits_head_##T(const hg_logits_args *a, int kh, int64_t j0, int64_t j1) {             \
    switch (a->head_dim) {                                                                         \
    case 64: logits_head(KT, 64, a, kh, j0, j1); break;                                            \
    case 128: logits_head(KT, 128, a, kh, j0, j1); break;                                          \
    default: logits_head(KT, 0, a, kh, j0, j1);                                                    \
    }                                                                                              \
}
LOGITS_HEAD(f32, 0)
LOGITS_HEAD(f16, 1)
LOGITS_HEAD(bf16, 2)

void KFN(hg_k_attn_logits)(const hg_logits_args *a, int64_t f0, int64_t f1) {
    void (*fn)(const hg_logits_args *, int, int64_t, int64_t) =
        a->ktype == 0 ? logits_head_f32 : a->ktype == 1 ? logits_head_f16 : logits_head_bf16;
    const int64_t n = a->count;
    if (n <= 0) return;
    for (int64_t kh = f0 / n; kh < a->kv_heads && kh * n < f1; kh++) {
        int64_t j0 = f0 - kh * n, j1 = f1 - kh * n;
        fn(a, (int)kh, j0 > 0 ? j0 : 0, j1 < n ? j1 : n);
    }
}

int KFN(hg_k_attn_qstride)(int ktype, int head_dim) { return qstride(ktype, head_dim); }

void KFN(hg_k_attn_qpack)(float *dst, const float *q, int heads, int head_dim, int ktype) {
    qpack(dst, q, heads, head_dim, ktype);
}
