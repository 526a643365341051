/* The thread pool selector primitives borrow: the CPU stage's, while no stage job runs. */
#ifndef HG_SEL_POOL_H
#define HG_SEL_POOL_H
#include "cpu_stage.h"
#include "pool.h"

/* Defined in cpu_stage.c (the stage's internals): its pool, or NULL while a job is running. */
hg_pool *hg_stage_idle_pool(hg_stage *s);
/* The stage's pool when it is idle; NULL (run on the calling thread) for no stage or a busy one. */
static inline hg_pool *hg_sel_pool(hg_stage *stage) { return stage ? hg_stage_idle_pool(stage) : NULL; }
/* hg_pool_run, or every piece on the calling thread when pool is NULL. */
static inline void hg_sel_pool_run(hg_pool *pool, hg_task_fn fn, void *arg, int parts) {
    if (pool) hg_pool_run(pool, fn, arg, parts);
    else for (int i = 0; i < parts; i++) fn(arg, i, parts);
}
#endif
