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
    float *qpack;      /* the query of attention logits, packed for the kernel */
    size_t qpack_bytes;
};

/* A buffer of at least `bytes` in *buf (grown, 64-byte aligned); NULL when out of memory. */
float *hg_grow(float **buf, size_t *have, size_t bytes);
/* q [heads, head_dim] packed for the table's attention logits kernel, in c->qpack; NULL when out of memory. */
const float *hg_qpack(hg_ctx *c, const float *q, int heads, int kv_heads, int head_dim, int ktype);

#endif
