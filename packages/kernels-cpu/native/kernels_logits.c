/* Attention logits q·Kᵀ over cached K stored as [kv_heads, cap, head_dim] in f32/f16/bf16.
 *
 * The floor: with a GQA group of g query heads each K element takes g FMAs, so two Zen 4 cores at
 * one 512-bit FMA per cycle score ~29 G elements/s for g = 4: about twice what DRAM delivers in
 * f32, about as much as it delivers in bf16. What it takes to get near that, measured:
 *  - A block is BH query heads x BT tokens with BH * BT = VW accumulators (4x4 on AVX-512): each
 *    K vector is loaded once and feeds BH FMAs; the query vectors come from L1 for every FMA
 *    (Zen 4 loads two a cycle, so this costs nothing next to the FMA).
 *  - The VW sums of a block are reduced together by one transposing add tree (vsum_lanes,
 *    ~1 shuffle per result instead of a horizontal sum per token).
 *  - K rows are read one after the other, front to back: a span is then one sequential stream
 *    that the hardware prefetcher follows. Reading a block's rows chunk by chunk side by side
 *    (4 interleaved streams) ran at 14 GB/s on one core against 32 for a plain read.
 *  - Row addresses and query pointers are computed in registers, never reloaded from a table in
 *    memory between a block's stores and the next block's loads (that made the CPU hold the next
 *    rows' loads until the stores were done: no misses in flight across blocks, 40% slower).
 *  - bf16 K is widened as even/odd halves (a shift and a mask, no lane shuffles) against a query
 *    packed the same way once per call; q stays f32, so nothing is rounded.
 *  - Rows ahead are prefetched into L2 (gathered rows are scattered; on a span it still keeps
 *    more misses in flight than the hardware prefetcher alone), spread over the tile's blocks.
 * Every (head, token) result is the same sum in the same order whatever the blocking, so the
 * logits do not depend on the thread count or on where a range starts. */
#include "simd.h"
#include "kernels.h"

#define ALWAYS static inline __attribute__((always_inline))
#define TILE 16
/* Software prefetch goes to L2 (prefetcht2): prefetcht0 holds an L1 miss buffer for the whole
 * DRAM latency and starves the demand loads (on Zen 4, a 16K-of-256K gather ran at 13 GB/s with
 * prefetcht0 and 30 with prefetcht2; a span lost 30% with prefetcht0 and gains 10-35% with
 * prefetcht2, on top of the hardware prefetcher). Distances in rows: gathered rows 32 ahead,
 * a span's 64 ahead. */
#define PF_L2 1
#define PF_GATHER 32
#define PF_SPAN 64

static inline int chunk_of(int kt) { return kt == 2 ? 2 * VW : VW; }

/* floats per packed query head: head_dim rounded up to the chunk */
static int qstride(int kt, int d) {
    int c = chunk_of(kt);
    return (d + c - 1) / c * c;
}

/* packed query heads per KV head: a group of 4k+3 gets a zero head so it runs as 4-head blocks */
static int qgroup(int g) { return g % 4 == 3 ? g + 1 : g; }

/* [kv_heads][qgroup(g)][qstride]: f32/f16 rows zero-padded to the chunk; bf16 rows hold, per chunk
 * of 2*VW dims, the even dims then the odd dims, matching vld_bf16_eo. */
static void qpack(float *dst, const float *q, int heads, int kv_heads, int d, int kt) {
    const int g = heads / kv_heads, gp = qgroup(g), s = qstride(kt, d);
    for (int kh = 0; kh < kv_heads; kh++)
        for (int h = 0; h < gp; h++) {
            float *o = dst + ((int64_t)kh * gp + h) * s;
            if (h >= g) {
                memset(o, 0, (size_t)s * sizeof(float));
                continue;
            }
            const float *x = q + ((int64_t)kh * g + h) * d;
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

/* acc[h*BT + t] += q_h . k over the chunk at dim i (q_h = q + h*qs); n = dims left in the chunk:
 * a full chunk, or the row's tail, read with masked/partial loads so nothing past the row is
 * touched. */
ALWAYS void step(const int kt, const int BH, vf *acc, int t, const float *q, int qs, const void *k, int i, int n) {
    const int BT = VW / BH, full = n == chunk_of(kt);
    vf k0, k1;
    if (kt == 0) k0 = full ? vld((const float *)k + i) : vld_part((const float *)k + i, n);
    else if (kt == 1) k0 = full ? vld_f16((const uint16_t *)k + i) : vld_f16_part((const uint16_t *)k + i, n);
    else if (full) vld_bf16_eo((const uint16_t *)k + i, &k0, &k1);
    else vld_bf16_eo_part((const uint16_t *)k + i, n, &k0, &k1);
#pragma GCC unroll 4
    for (int h = 0; h < BH; h++) {
        acc[h * BT + t] = vfma(vld(q + h * qs + i), k0, acc[h * BT + t]);
        if (kt == 2) acc[h * BT + t] = vfma(vld(q + h * qs + i + VW), k1, acc[h * BT + t]);
    }
}

/* Rows t0 .. t0+BT-1 of a tile of m rows (a block past the end repeats the last row): row t is
 * kb + t*rb for a span (kb = the tile's first row), kb + sl[t]*rb for a gather. Lane h*BT + t of
 * the result is q_h . row(t0 + t). */
ALWAYS vf score_block(const int kt, const int BH, const int gather, const int d, const float *qb, int qs,
                      const char *kb, const int32_t *sl, int64_t rb, int t0, int m) {
    const int BT = VW / BH, ch = chunk_of(kt);
    vf acc[VW];
#pragma GCC unroll 16
    for (int i = 0; i < VW; i++) acc[i] = vzero();
#pragma GCC unroll 16
    for (int t = 0; t < BT; t++) {
        int tt = t0 + t < m ? t0 + t : m - 1;
        const char *k = kb + (gather ? (int64_t)sl[tt] : tt) * rb;
        /* An opaque copy of the query pointer: without it GCC keeps every query vector of a row in
         * a register across the block's rows, runs out, and spills them and the accumulators
         * (25-35% slower); with it, it keeps about half and reads the rest from L1 with each FMA,
         * which measured faster than reading all of them (20%) or pinning a fixed share. */
        const float *q = qb;
        __asm__("" : "+r"(q));
        int i = 0;
        for (; i + ch <= d; i += ch) step(kt, BH, acc, t, q, qs, k, i, ch);
        if (i < d) step(kt, BH, acc, t, q, qs, k, i, d - i);
    }
    return vsum_lanes(acc);
}

static inline void prefetch_bytes(const char *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, PF_L2);
    __builtin_prefetch(p + bytes - 1, 0, PF_L2); /* a row that is not line-aligned ends in one more line */
}

/* nh <= BH heads (query rows qb + h*qs) x a tile of m rows -> lg + h*lstride + t. The first head
 * block of a tile also prefetches, a share per block: a gather's rows kb + psl[t]*rb for t < npf,
 * a span's rows PF_SPAN ahead (when npf is not 0). */
ALWAYS void score_tile(const int kt, const int BH, const int gather, const int d, const float *qb, int qs, int nh,
                       const char *kb, const int32_t *sl, int64_t rb, int m, float *lg, int64_t lstride, vf scale,
                       const int32_t *psl, int npf) {
    const int BT = VW / BH;
    for (int t0 = 0; t0 < m; t0 += BT) {
        if (gather)
            for (int t = t0; t < t0 + BT && t < npf; t++) prefetch_bytes(kb + (int64_t)psl[t] * rb, rb);
        else /* past the span's end too: a prefetch never faults, and a branch here cost 10% */
            for (int64_t o = 0; o < BT * rb; o += 64) __builtin_prefetch((const char *)((uintptr_t)kb + (PF_SPAN + t0) * rb + o), 0, PF_L2);
        vf r = vmul(score_block(kt, BH, gather, d, qb, qs, kb, sl, rb, t0, m), scale);
        if (t0 + BT <= m)
            for (int h = 0; h < nh; h++) vst_lanes(lg + h * lstride + t0, r, h * BT, BT);
        else
            for (int h = 0; h < nh; h++) vst_lanes(lg + h * lstride + t0, r, h * BT, m - t0);
    }
}

/* Every head of the group over one tile: 4-head blocks, then a 2- or 1-head block (a group of
 * 4k+3 runs its last block on the zero head that qpack added). */
ALWAYS void score_group(const int kt, const int gather, const int d, int g, const float *qg, int qs,
                        const char *kb, const int32_t *sl, int64_t rb, int m, float *lg, int64_t lstride, vf scale,
                        const int32_t *psl, int npf) {
    int h = 0;
    for (; h + 4 <= g; h += 4, npf = 0)
        score_tile(kt, 4, gather, d, qg + h * qs, qs, 4, kb, sl, rb, m, lg + h * lstride, lstride, scale, psl, npf);
    if (g - h == 3)
        score_tile(kt, 4, gather, d, qg + h * qs, qs, 3, kb, sl, rb, m, lg + h * lstride, lstride, scale, psl, npf);
    else if (g - h == 2)
        score_tile(kt, 2, gather, d, qg + h * qs, qs, 2, kb, sl, rb, m, lg + h * lstride, lstride, scale, psl, npf);
    else if (g - h == 1)
        score_tile(kt, 1, gather, d, qg + h * qs, qs, 1, kb, sl, rb, m, lg + h * lstride, lstride, scale, psl, npf);
}

/* KV head kh, tokens [j0, j1): full tiles with the tile size a constant, then the tail. */
ALWAYS void logits_head(const int kt, const int dk, const int gather, const hg_logits_args *a, int kh, int64_t j0, int64_t j1) {
    const int d = dk ? dk : a->head_dim, g = a->heads / a->kv_heads, qs = qstride(kt, d);
    const int64_t rb = (int64_t)d * (kt == 0 ? 4 : 2), lstride = a->lstride;
    const char *kbase = (const char *)a->k + (int64_t)kh * a->cap * rb;
    const float *qg = a->qp + (int64_t)kh * qgroup(g) * qs;
    float *lg = a->logits + (int64_t)kh * g * lstride;
    const vf scale = vset1(a->scale);
    for (int64_t j = j0; j < j1; j += TILE) {
        const char *kb = gather ? kbase : kbase + (a->start + j) * rb;
        const int32_t *sl = gather ? a->slots + j : NULL;
        int64_t ahead = j1 - (j + PF_GATHER);
        int npf = !gather ? 1 : ahead <= 0 ? 0 : ahead < TILE ? (int)ahead : TILE;
        const int32_t *psl = gather ? sl + PF_GATHER : NULL;
        if (j + TILE <= j1) score_group(kt, gather, d, g, qg, qs, kb, sl, rb, TILE, lg + j, lstride, scale, psl, npf);
        else score_group(kt, gather, d, g, qg, qs, kb, sl, rb, (int)(j1 - j), lg + j, lstride, scale, psl, npf);
    }
}

/* One instance per K dtype, span or gather, and common head dim (a compile-time row length
 * unrolls the row loop: ~1.8x faster in L2 than a loop over a run-time head_dim). */
#define LOGITS_HEAD(T, KT)                                                                          \
static void logits_head_##T(const hg_logits_args *a, int kh, int64_t j0, int64_t j1) {             \
    const int gather = a->slots != NULL;                                                           \
    switch (a->head_dim * 2 + gather) {                                                            \
    case 128: logits_head(KT, 64, 0, a, kh, j0, j1); break;                                        \
    case 129: logits_head(KT, 64, 1, a, kh, j0, j1); break;                                        \
    case 256: logits_head(KT, 128, 0, a, kh, j0, j1); break;                                       \
    case 257: logits_head(KT, 128, 1, a, kh, j0, j1); break;                                       \
    default:                                                                                       \
        if (gather) logits_head(KT, 0, 1, a, kh, j0, j1);                                          \
        else logits_head(KT, 0, 0, a, kh, j0, j1);                                                 \
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

int64_t KFN(hg_k_attn_qfloats)(int heads, int kv_heads, int head_dim, int ktype) {
    return (int64_t)kv_heads * qgroup(heads / kv_heads) * qstride(ktype, head_dim);
}

void KFN(hg_k_attn_qpack)(float *dst, const float *q, int heads, int kv_heads, int head_dim, int ktype) {
    qpack(dst, q, heads, kv_heads, head_dim, ktype);
}
