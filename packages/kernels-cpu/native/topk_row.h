/* hg_sel_topk's selection for native callers that already hold a pool (or none): the CPU stage
 * selects its lists with it inside a job, where the stage's pool is busy. */
#ifndef HG_TOPK_ROW_H
#define HG_TOPK_ROW_H
#include <stdint.h>
#include "pool.h"

/* hg_sel_topk's result for x[0..n): avx2 picks the vector loops; pool NULL runs on the calling
 * thread (scratch is the thread's own). Returns the count, or -1 when scratch memory failed. */
int64_t hg_topk_row(const float *x, int64_t n, int64_t k, int32_t *out, int avx2, hg_pool *pool);
#endif
