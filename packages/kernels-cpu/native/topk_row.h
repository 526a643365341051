/* hg_sel_topk's selection for native callers that already hold a pool (or none): the CPU stage
 * selects its lists with it inside a job, where the stage's pool is busy. */
#ifndef HG_TOPK_ROW_H
#define HG_TOPK_ROW_H
#include <stdint.h>
#include "pool.h"

/* hg_sel_topk's result for x[0..n): avx2 picks the vector loops; pool NULL runs on the calling
 * thread (scratch is the thread's own). Returns the count, or -1 when scratch memory failed. */
int64_t hg_topk_row(const float *x, int64_t n, int64_t k, int32_t *out, int avx2, hg_pool *pool);

/* hg_topk_row's result (min(k, n) ids, ascending) for each of `lists` rows of n values, into
 * out + l*ostride. List l's row is src + l*n when nsrc is 1; else the max of the nsrc rows
 * src + (l*nsrc + q)*n (NaN never wins; -inf where all are NaN), which is also written to
 * maxrow + l*n when 0 < k < n. The lists run together: a threshold per list from a strided
 * sample, one pass over all their values split evenly over the pool collecting those at or above
 * it, then a list per thread picks the exact K among those; a row the sample misjudges, or a K too
 * large for sampling, goes through hg_topk_row. sample: NULL, or the values of the nsrc*lists
 * source rows at positions (2j+1)*n / (2S), j < S = hg_topk_rows_sample(n), as [lists*nsrc][S]
 * (a caller that writes the rows can copy them then, sparing a cache miss each). Returns 0, or -1
 * when scratch memory failed. */
int64_t hg_topk_rows(const float *src, int64_t nsrc, float *maxrow, const float *sample, int64_t lists, int64_t n, int64_t k, int32_t *out,
                     int64_t ostride, int avx2, hg_pool *pool);
/* S, the sample's size for rows of n values. */
int64_t hg_topk_rows_sample(int64_t n);
#endif
