/* Compressed copies of offloaded K rows and the approximate scores read from them (the first
 * step of the CPU stage's two-step selection; the best candidates are rescored from the full
 * rows). Forms: HG_KQ_INT8 (per row symmetric, codes c+128 in bytes, one f32 scale) and
 * HG_KQ_INT4 (per 32 channels symmetric, codes c+8 in nibbles, one f32 scale each). A record
 * per row, [kv_heads][cap][hg_kq_row_bytes]: the codes of head_dim rounded up to 32 channels
 * (zero codes past head_dim), then the scales. Approximate score of a row for a KV head: the
 * max over the group's query heads of the quantized dot product, as the portable reference in
 * the tests defines it bit for bit (integer sums, then f32 products in a fixed order). */
#ifndef HG_KQ_H
#define HG_KQ_H
#include <stdint.h>

enum { HG_KQ_FULL = 0, HG_KQ_INT8 = 1, HG_KQ_INT4 = 2 };

/* The query of one call, quantized per head: p (int8, padded dims), t (f32 step), corr (the
 * offset codes' share: [heads] for int8, [heads][groups] for int4). */
typedef struct {
    int form;
    int64_t d, dp, groups, rb, heads, kv_heads, group;
    int8_t *p;
    float *t;
    int32_t *corr;
} hg_kq_query;

#pragma GCC visibility push(default)
/* Bytes of one row's record (0 for an unknown form or d < 1). */
int64_t hg_kq_row_bytes(int form, int64_t d);
/* Records of rows [from, to) of every KV head of k ([kv_heads, cap, d] in ktype) into out. */
void hg_kq_encode(int form, const void *k, int ktype, int64_t kv_heads, int64_t cap, int64_t d, int64_t from, int64_t to, uint8_t *out);
/* out[g*n + j] = the approximate score of row j < n of KV head g (q [heads, d] f32). isa: 0
 * portable, 1 AVX2, 2 AVX-512, < 0 the best. Returns 0, or -1 when scratch memory failed. */
int64_t hg_kq_scores(int form, const float *q, int64_t heads, int64_t kv_heads, int64_t d, const uint8_t *kq, int64_t cap, int64_t n,
                     float *out, int isa);
#pragma GCC visibility pop

/* For the stage: bytes of a packed query, packing it into mem, and scoring rows [b, e) of KV head g. */
int64_t hg_kq_query_bytes(int form, int64_t heads, int64_t d);
void hg_kq_pack_query(hg_kq_query *Q, int form, const float *q, int64_t heads, int64_t kv_heads, int64_t d, void *mem);
void hg_kq_score_rows(const hg_kq_query *Q, const uint8_t *kq, int64_t cap, int64_t g, int64_t b, int64_t e, float *out, int isa);
/* The ISA an isa argument < 0 resolves to (0, 1 or 2). */
int hg_kq_best_isa(void);
#endif
