/* Public C API of libhgcpu: what the TypeScript side calls through bun:ffi.
 * Every op takes the context (thread pool + the kernel table of one ISA) first.
 * Pointers and sizes are validated by the caller; functions that take index arrays
 * (slots) re-check them here because scanning in C is cheaper than in JS. */
#ifndef HGCPU_H
#define HGCPU_H
#include <stddef.h>
#include <stdint.h>

enum { HG_F32 = 0, HG_F16 = 1, HG_BF16 = 2 };
enum { HG_ISA_GENERIC = 0, HG_ISA_AVX2 = 1, HG_ISA_AVX512 = 2 };
/* bits returned by hg_cpu_features() */
enum { HG_FEAT_AVX2 = 1, HG_FEAT_AVX512 = 2, HG_FEAT_AVX512BF16 = 4 };

typedef struct hg_ctx hg_ctx;

/* Only these symbols are exported (the build uses -fvisibility=hidden). */
#pragma GCC visibility push(default)

int hg_cpu_features(void);
int hg_best_isa(void);
int hg_online_cpus(void);
/* isa < 0 picks the best the CPU supports; returns NULL if the ISA is unsupported. */
hg_ctx *hg_create(int threads, int isa);
void hg_destroy(hg_ctx *c);
int hg_ctx_isa(const hg_ctx *c);
int hg_ctx_threads(const hg_ctx *c);

/* 64-byte aligned, zero-filled native memory (large blocks are lazily zeroed mmaps). */
void *hg_alloc(uint64_t bytes);
void hg_free(void *p, uint64_t bytes);

void hg_convert(hg_ctx *c, void *dst, int dst_type, const void *src, int src_type, int64_t count);
void hg_embedding(hg_ctx *c, float *out, const void *table, int type, int cols, const int32_t *ids, int n);
void hg_matmul(hg_ctx *c, float *out, const float *x, const void *w, int wtype,
               const void *bias, int btype, int n, int k, int m);
int hg_rmsnorm(hg_ctx *c, float *out, const float *x, const void *w, int wtype, int n, int k, float eps);
int hg_layernorm(hg_ctx *c, float *out, const float *x, const void *w, int wtype,
                  const void *b, int btype, int n, int k, float eps);
void hg_rope(hg_ctx *c, float *x, int n, int row_stride, const int32_t *pos, int heads, int head_dim,
             const float *cos_t, const float *sin_t, int half);
void hg_silu_mul(hg_ctx *c, float *out, const float *gate, const float *up, int64_t count);
void hg_relu(hg_ctx *c, float *x, int64_t count);
void hg_gelu(hg_ctx *c, float *x, int64_t count);
void hg_add(hg_ctx *c, float *out, const float *a, const float *b, int64_t count);
void hg_softmax(hg_ctx *c, float *x, int rows, int stride, int cols);
int64_t hg_argmax(hg_ctx *c, const float *x, int64_t count);
/* Returns -1 on success, else the index of the first slot outside [0, cap). */
int64_t hg_check_slots(const int32_t *slots, int64_t count, int64_t cap);
/* Ops returning int give 0 when scratch memory could not be allocated, else 1. */
/* logits[h*lstride + j] = scale * q[h] . K[h/group, tok(j)] for j < count. */
int hg_attn_logits(hg_ctx *c, float *logits, int lstride, const float *q, const void *k, int ktype,
                    int heads, int kv_heads, int head_dim, int64_t cap,
                    int64_t start, const int32_t *slots, int64_t count, float scale);
/* out[h] (+)= sum_j probs[h*pstride + j] * V[h/group, tok(j)]. */
int hg_attn_aggregate(hg_ctx *c, float *out, const float *probs, int pstride, const void *v, int vtype,
                       int heads, int kv_heads, int head_dim, int64_t cap,
                       int64_t start, const int32_t *slots, int64_t count, int accumulate);
/* Flash-decode partial of q [heads, head_dim] over nspans (<= 4) spans of K/V [kv_heads, cap, head_dim]
 * (spans: start, count pairs) into part [heads][head_dim + 2]: normalised output, max logit, sum of
 * e^(logit - max); no token: 0, -inf, 0. */
int hg_attn_partial(hg_ctx *c, float *part, const float *q, const void *k, const void *v, int type,
                    int heads, int kv_heads, int head_dim, int64_t cap, const int32_t *spans, int nspans, float scale);
/* out [heads, head_dim] = one softmax over part's tokens and logits[h*lstride + j], j < count, applied
 * to their V rows (the columns' rows: V[h/group, start + j]); nothing attended: 0. */
int hg_attn_merge(hg_ctx *c, float *out, const float *part, const float *logits, int lstride, const void *v, int vtype,
                  int heads, int kv_heads, int head_dim, int64_t cap, int64_t start, int64_t count);
/* Multithreaded streaming read of `bytes` (multiple of 4) as floats: the bandwidth baseline. */
double hg_stream_sum(hg_ctx *c, const void *p, uint64_t bytes);
/* Runs one op on every pool thread; returns the number of distinct OS threads that ran it. */
int hg_pool_probe(hg_ctx *c);

#pragma GCC visibility pop
#endif
