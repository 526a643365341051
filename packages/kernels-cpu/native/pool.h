/* A persistent thread pool. The calling thread is worker 0; threads-1 pthreads wait for
 * work by spinning briefly, then sleeping on a condition variable. An op is published
 * once (function + argument + a bumped generation) and every worker runs fn(arg, ith, nth). */
#ifndef HG_POOL_H
#define HG_POOL_H
#include <stddef.h>
#include <stdint.h>

typedef struct hg_pool hg_pool;
typedef void (*hg_task_fn)(void *arg, int ith, int nth);

hg_pool *hg_pool_create(int threads);
void hg_pool_destroy(hg_pool *p);
int hg_pool_threads(const hg_pool *p);
/* Runs fn on all threads and returns when all are done. */
void hg_pool_run(hg_pool *p, hg_task_fn fn, void *arg);
/* Grow every thread's scratch to at least `bytes` (64-byte aligned). Call between runs,
 * from the calling thread; returns 0 when out of memory. */
int hg_pool_reserve(hg_pool *p, size_t bytes);
/* Thread ith's scratch (valid after hg_pool_reserve). */
float *hg_pool_scratch(hg_pool *p, int ith);

/* [*b, *e): thread ith's share of n items, boundaries rounded to multiples of `align`. */
static inline void hg_split(int64_t n, int64_t align, int ith, int nth, int64_t *b, int64_t *e) {
    int64_t blocks = (n + align - 1) / align;
    int64_t b0 = blocks * ith / nth, b1 = blocks * (ith + 1) / nth;
    *b = b0 * align < n ? b0 * align : n;
    *e = b1 * align < n ? b1 * align : n;
}

#endif
