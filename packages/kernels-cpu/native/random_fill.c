/* Deterministic random fill for dummy weights: the counter-based generator defined in
 * @hybridgen/core's random-fill.ts, bit for bit. Element i of a tensor with key K is
 *   x = lowbias32(K + i * 0x9E3779B9),  v = (float)(((x >> 8) - 2^23) * k + offset)
 * with the product exact in double (k is a float), so FMA contraction cannot change it.
 * The loop is compiled twice (AVX2 and baseline, chosen by the loader) and split across a
 * short-lived thread pool: a bf16 8B-parameter model fills in seconds. */
#include <stdint.h>
#include "hgcpu.h"
#include "half.h"
#include "pool.h"

typedef struct {
    void *dst;
    int type;
    int64_t count;
    uint32_t key;
    double k, offset;
} fill_job;

static inline uint32_t lowbias32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

static inline float fill_value(const fill_job *j, int64_t i) {
    uint32_t x = lowbias32(j->key + (uint32_t)i * 0x9e3779b9u);
    double a = (double)((int32_t)(x >> 8) - 8388608);
    return (float)(a * j->k + j->offset);
}

__attribute__((target_clones("avx2", "default")))
static void fill_f32(const fill_job *j, int64_t b, int64_t e) {
    float *d = j->dst;
    for (int64_t i = b; i < e; i++) d[i] = fill_value(j, i);
}

__attribute__((target_clones("avx2", "default")))
static void fill_bf16(const fill_job *j, int64_t b, int64_t e) {
    uint16_t *d = j->dst;
    for (int64_t i = b; i < e; i++) {
        uint32_t u = hg_f32_bits(fill_value(j, i)); /* finite by construction: no NaN case */
        d[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

static void fill_f16(const fill_job *j, int64_t b, int64_t e) {
    uint16_t *d = j->dst;
    for (int64_t i = b; i < e; i++) d[i] = hg_f32_to_f16(fill_value(j, i));
}

static void fill_task(void *v, int part, int parts) {
    const fill_job *j = v;
    int64_t b, e;
    hg_split(j->count, 64, part, parts, &b, &e);
    if (b >= e) return;
    if (j->type == HG_F32) fill_f32(j, b, e);
    else if (j->type == HG_BF16) fill_bf16(j, b, e);
    else fill_f16(j, b, e);
}

/* Fills count elements of type at dst. threads <= 1 runs on the caller's thread.
 * Returns 0 on success, -1 for an unknown type or a pool that could not start. */
__attribute__((visibility("default")))
int hg_random_fill(void *dst, int type, int64_t count, uint32_t key, float k, float offset, int threads) {
    if (type != HG_F32 && type != HG_F16 && type != HG_BF16) return -1;
    fill_job j = {dst, type, count, key, (double)k, (double)offset};
    if (threads <= 1 || count < (1 << 16)) {
        fill_task(&j, 0, 1);
        return 0;
    }
    hg_pool *p = hg_pool_create(threads);
    if (!p) return -1;
    hg_pool_run(p, fill_task, &j, threads * 4);
    hg_pool_destroy(p);
    return 0;
}
