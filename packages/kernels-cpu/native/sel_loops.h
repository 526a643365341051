/* The serial loops behind the key primitives (sel_prims.c), for native callers that split the
 * work themselves: the CPU stage's Quest kernel (sel_quest.c) runs them on its own pieces, so its
 * summaries (bf16, rounded outward), bounds and scores are bit-identical to the primitives'. isa: 0 scalar, 1 AVX2,
 * 2 AVX-512 (its page bounds, the same bits as AVX2's; the other loops run their AVX2 form). */
#ifndef HG_SEL_LOOPS_H
#define HG_SEL_LOOPS_H
#include <stdint.h>

void hg_sel_summarize_serial(const void *k, int ktype, int64_t kv_heads, int64_t cap, int64_t d, int64_t from, int64_t to,
                             int64_t page, int64_t page_cap, uint16_t *mn, uint16_t *mx, int isa);
void hg_sel_page_bounds_serial(const float *q, int64_t kv_heads, int64_t group, int64_t d, const uint16_t *mn, const uint16_t *mx,
                               int64_t page_cap, int64_t count, float *out, int isa);
void hg_sel_key_scores_serial(const float *q, int64_t kv_heads, int64_t group, const void *k, int ktype, int64_t cap, int64_t d,
                              int64_t from, int64_t to, float *out, int isa);
#endif
