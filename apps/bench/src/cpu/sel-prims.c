/* Key primitives of the pre-QKᵀ selectors (native/sel_prims.c), scalar vs AVX2, at Llama-3.1-8B's
 * heads (32 query, 8 KV, headDim 128) over N offloaded bf16 rows, one thread, best of 10:
 *   gcc -O2 -Ipackages/kernels-cpu/native apps/bench/src/cpu/sel-prims.c -Lpackages/kernels-cpu/lib -lhgcpu -Wl,-rpath,$PWD/packages/kernels-cpu/lib -o /tmp/sel-prims && /tmp/sel-prims [N]
 * (after `bun run build`)
 * what each selector's step costs: keyScores over every row (what scoring all of them costs,
 * the post-QKᵀ baseline), over the packed 8 channels (infinigen), pageBounds over N/16 pages (quest). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "sel_prims.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

#define BEST(label, isa, bytes, call)                                                              \
    do {                                                                                           \
        double best = 1e30;                                                                        \
        for (int r = 0; r < 10; r++) {                                                             \
            double t0 = now_ms();                                                                  \
            call;                                                                                  \
            double t = now_ms() - t0;                                                              \
            if (t < best) best = t;                                                                \
        }                                                                                          \
        printf("  %-34s %-7s %8.3f ms  %6.2f GB/s\n", label, isa ? "avx2" : "scalar", best, (bytes) / best / 1e6); \
    } while (0)

int main(int argc, char **argv) {
    int64_t N = argc > 1 ? atoll(argv[1]) : 32768, KV = 8, G = 4, D = 128, R = 8, P = 16, pages = (N + P - 1) / P;
    uint16_t *k = malloc((size_t)(KV * N * D) * 2);
    float *packed = malloc((size_t)(KV * N * R) * 4), *out = malloc((size_t)(KV * N) * 4);
    uint16_t *mn = malloc((size_t)(KV * pages * D) * 2), *mx = malloc((size_t)(KV * pages * D) * 2); /* bf16 summaries */
    float q[32 * 128], qp[32 * 8];
    int32_t ch[8 * 8];
    uint32_t s = 1;
    for (int64_t i = 0; i < KV * N * D; i++) k[i] = (uint16_t)(0x3c00 + ((s = s * 1103515245u + 12345u) >> 24)) ^ (uint16_t)((i & 1) << 15);
    for (int i = 0; i < 32 * 128; i++) q[i] = (float)((i * 37) % 11) * 0.1f - 0.5f;
    for (int i = 0; i < 32 * 8; i++) qp[i] = q[i];
    for (int i = 0; i < 64; i++) ch[i] = (i * 13) % 128;
    hg_sel_gather(k, 2, KV, N, D, ch, R, 0, N, packed, N, NULL);
    hg_sel_summarize(k, 2, KV, N, D, 0, N, P, pages, mn, mx, 1, NULL);
    printf("N = %lld bf16 rows per KV head, %lld KV heads x group %lld x headDim %lld, best of 10:\n", (long long)N, (long long)KV, (long long)G, (long long)D);
    for (int isa = 0; isa < 2; isa++) {
        BEST("keyScores, every row (bf16)", isa, (double)KV * N * D * 2, hg_sel_key_scores(q, KV, G, k, 2, N, D, 0, N, out, isa, NULL));
        BEST("keyScores, 8 packed channels (f32)", isa, (double)KV * N * R * 4, hg_sel_key_scores(qp, KV, G, packed, 0, N, R, 0, N, out, isa, NULL));
        BEST("pageBounds, N/16 pages", isa, (double)KV * pages * D * 4, hg_sel_page_bounds(q, KV, G, D, mn, mx, pages, pages, out, isa, NULL));
        BEST("summarizePages, every row", isa, (double)KV * N * D * 2, hg_sel_summarize(k, 2, KV, N, D, 0, N, P, pages, mn, mx, isa, NULL));
    }
    return 0;
}
