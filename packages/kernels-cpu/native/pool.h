/* A persistent thread pool. The calling thread works too; threads-1 pthreads wait for work
 * by spinning briefly, then sleeping on a condition variable. An op is published once as
 * `parts` pieces that every thread claims one at a time from an atomic ticket, so a worker
 * the OS has descheduled (busy machine) simply claims nothing while the others finish:
 * an op never waits for a thread that has not started. */
#ifndef HG_POOL_H
#define HG_POOL_H
#include <stddef.h>
#include <stdint.h>

typedef struct hg_pool hg_pool;
/* Runs piece `part` of `parts`. */
typedef void (*hg_task_fn)(void *arg, int part, int parts);

hg_pool *hg_pool_create(int threads);
void hg_pool_destroy(hg_pool *p);
int hg_pool_threads(const hg_pool *p);
/* Runs fn(arg, i, parts) for every i < parts across the pool; returns when all are done. */
void hg_pool_run(hg_pool *p, hg_task_fn fn, void *arg, int parts);

/* [*b, *e): piece `part` of n items, boundaries rounded to multiples of `align`. */
static inline void hg_split(int64_t n, int64_t align, int part, int parts, int64_t *b, int64_t *e) {
    int64_t blocks = (n + align - 1) / align;
    int64_t b0 = blocks * part / parts, b1 = blocks * (part + 1) / parts;
    *b = b0 * align < n ? b0 * align : n;
    *e = b1 * align < n ? b1 * align : n;
}

#endif
