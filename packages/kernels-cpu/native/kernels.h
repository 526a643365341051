/* The kernel table: one instance per ISA (kernels_*.c compiled three times with a
 * different HG_SUFFIX). Kernels work on a range of rows/items so ops.c can split an
 * op across the thread pool; argument structs carry everything else. */
#ifndef HG_KERNELS_H
#define HG_KERNELS_H
#include <stdint.h>

typedef struct {
    float *out; const float *x; const void *w; const void *bias;
    int wtype, btype, n, k, m;
} hg_matmul_args;

/* logits[h*lstride + j] = scale * q[h] . K[h/group, tok(j)] for j < count, tok(j) = slots ? slots[j] :
 * start + j. qp is the query packed by the same table's attn_qpack. */
typedef struct {
    float *logits; const float *qp; const void *k; const int32_t *slots;
    int64_t lstride, cap, start, count; int ktype, heads, kv_heads, head_dim; float scale;
} hg_logits_args;

typedef struct {
    float *out; const float *probs; const void *v; const int32_t *slots;
    int64_t pstride, cap, start; int vtype, heads, kv_heads, head_dim;
} hg_aggr_args;

typedef struct {
    /* rows [r0, r1) of matrix out[m] = w[m] . x over x rows 0..n-1 */
    void (*matmul)(const hg_matmul_args *a, long r0, long r1);
    /* items [f0, f1) of the (KV head, token) space, item f = kv_head * count + j */
    void (*attn_logits)(const hg_logits_args *a, int64_t f0, int64_t f1);
    /* floats of a packed query (per KV head: attn_qfloats(group, 1, ...)) */
    int64_t (*attn_qfloats)(int heads, int kv_heads, int head_dim, int ktype);
    /* q [heads, head_dim] -> dst: the layout the logits kernel reads */
    void (*attn_qpack)(float *dst, const float *q, int heads, int kv_heads, int head_dim, int ktype);
    /* acc[heads*head_dim] += contribution of tokens [j0, j1) */
    void (*attn_aggregate)(const hg_aggr_args *a, float *acc, int64_t j0, int64_t j1);
    void (*rmsnorm_row)(float *out, const float *x, const float *w, int k, float eps);
    void (*layernorm_row)(float *out, const float *x, const float *w, const float *b, int k, float eps);
    void (*silu_mul)(float *out, const float *gate, const float *up, int64_t count);
    void (*add)(float *out, const float *a, const float *b, int64_t count);
    void (*relu)(float *x, int64_t count);
    void (*softmax_row)(float *x, int cols);
    /* x[i] = e^(x[i] - m) for i < n (e^-inf = 0); returns their sum */
    float (*exp_sum)(float *x, int64_t n, float m);
    int64_t (*argmax)(const float *x, int64_t count);
    /* f32 <-> any dtype; same dtype is a plain copy */
    void (*convert)(void *dst, int dst_type, const void *src, int src_type, int64_t count);
    double (*stream_sum)(const float *p, int64_t count);
} hg_kernels;

extern const hg_kernels hg_kernels_generic;
#if defined(__x86_64__)
extern const hg_kernels hg_kernels_avx2;
extern const hg_kernels hg_kernels_avx512;
#endif

#endif
