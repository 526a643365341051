/* The context behind hg_ctx: a thread pool, one ISA's kernel table, and a small
 * caller-side buffer for parameter vectors converted to f32. */
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
};

#endif
