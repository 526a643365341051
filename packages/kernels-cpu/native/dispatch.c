/* CPU feature detection and the choice of kernel table. */
#include "ctx.h"
#include <stdlib.h>
#include <unistd.h>

int hg_cpu_features(void) {
    int f = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    /* __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0). */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))
        f |= HG_FEAT_AVX2;
    if ((f & HG_FEAT_AVX2) && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        f |= HG_FEAT_AVX512;
    if ((f & HG_FEAT_AVX512) && __builtin_cpu_supports("avx512bf16")) f |= HG_FEAT_AVX512BF16;
#endif
    return f;
}

int hg_best_isa(void) {
    int f = hg_cpu_features();
    if (f & HG_FEAT_AVX512) return HG_ISA_AVX512;
    if (f & HG_FEAT_AVX2) return HG_ISA_AVX2;
    return HG_ISA_GENERIC;
}

int hg_online_cpus(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static const hg_kernels *table_for(int isa) {
    int f = hg_cpu_features();
    switch (isa) {
    case HG_ISA_GENERIC: return &hg_kernels_generic;
#if defined(__x86_64__)
    case HG_ISA_AVX2: return (f & HG_FEAT_AVX2) ? &hg_kernels_avx2 : NULL;
    case HG_ISA_AVX512: return (f & HG_FEAT_AVX512) ? &hg_kernels_avx512 : NULL;
#endif
    default: return NULL;
    }
}

hg_ctx *hg_create(int threads, int isa) {
    if (isa < 0) isa = hg_best_isa();
    const hg_kernels *k = table_for(isa);
    if (!k) return NULL;
    hg_ctx *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->pool = hg_pool_create(threads > 0 ? threads : hg_online_cpus());
    if (!c->pool) { free(c); return NULL; }
    c->k = k;
    c->isa = isa;
    return c;
}

void hg_destroy(hg_ctx *c) {
    if (!c) return;
    hg_pool_destroy(c->pool);
    free(c->params);
    free(c->scratch);
    free(c->qpack);
    free(c);
}

int hg_ctx_isa(const hg_ctx *c) { return c->isa; }
int hg_ctx_threads(const hg_ctx *c) { return hg_pool_threads(c->pool); }

float *hg_grow(float **buf, size_t *have, size_t bytes) {
    if (*have >= bytes) return *buf;
    free(*buf);
    *buf = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    *have = *buf ? bytes : 0;
    return *buf;
}
