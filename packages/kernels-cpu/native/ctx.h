/* The context behind hg_ctx: a thread pool, one ISA's kernel table, and caller-side
 * buffers (parameter vectors converted to f32, partial sums). */
#ifndef HG_CTX_H
#define HG_CTX_H
#include "hgcpu.h"
#include "kernels.h"
#include "pool.h"

struct hg_ctx {
    hg_pool *pool;
    const hg_kernels *k;
    int isa;
    float *params;
    size_t params_bytes;
    float *scratch;    /* per-piece partial sums of attention aggregation */
    size_t scratch_bytes;
};

#endif
