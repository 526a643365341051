/* The page index's choice (native/sel_index.c) against Quest's bf16 page bounds (native/sel_prims.c)
 * at Llama-3.1-8B's heads (32 query, 8 KV, headDim 128), pages of 16, on a CPU stage's pool of T
 * threads, best of 5, per layer (ISA of the index's bounds: -1 the best, 0 scalar, 1 AVX2, 2 AVX-512):
 *   gcc -O2 -Ipackages/kernels-cpu/native apps/bench/src/cpu/index-bounds.c -Lpackages/kernels-cpu/lib -lhgcpu -Wl,-rpath,$PWD/packages/kernels-cpu/lib -o /tmp/index-bounds && /tmp/index-bounds [T] [N,...] [ISA]
 * (after `bun run build`). The index of N rows tiles one folded from 32 768 random bf16 rows (the
 * super-pages tile with their pages, so every bound holds); Quest's summaries tile the same rows.
 * Prints the bytes each choice reads and the rate. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "sel_prims.h"
#include "sel_index.h"

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

enum { KV = 8, G = 4, D = 128, P = 16, BASE = 32768 };

/* Copies index `src` (page_cap sp) tiled into `dst` (page_cap dp). */
static void tile(const hg_index *s, const hg_index *d) {
    for (int64_t g = 0; g < KV; g++) {
        for (int64_t p = 0; p < d->page_cap; p++) {
            const int64_t from = p % s->page_cap;
            memcpy(d->page_codes + (g * d->page_cap + p) * d->code_bytes, s->page_codes + (g * s->page_cap + from) * s->code_bytes, (size_t)s->code_bytes);
            d->page_scales[g * d->page_cap + p] = s->page_scales[g * s->page_cap + from];
        }
        for (int64_t u = 0; u < d->super_cap; u++) {
            const int64_t from = u % s->super_cap;
            memcpy(d->super_codes + (g * d->super_cap + u) * d->code_bytes, s->super_codes + (g * s->super_cap + from) * s->code_bytes, (size_t)s->code_bytes);
            d->super_scales[g * d->super_cap + u] = s->super_scales[g * s->super_cap + from];
        }
    }
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 1;
    const char *list = argc > 2 ? argv[2] : "32768,131000,1500000";
    const int isa = argc > 3 ? atoi(argv[3]) : -1; /* the index's page bounds: 0 scalar, 1 AVX2, 2 AVX-512, -1 the best here */
    hg_stage *stage = hg_stage_create(threads, -1);
    if (!stage) return 1;
    uint16_t *k = malloc((size_t)KV * BASE * D * 2);
    uint32_t s = 1;
    for (int64_t i = 0; i < (int64_t)KV * BASE * D; i++) k[i] = (uint16_t)(0x3c00 + ((s = s * 1103515245u + 12345u) >> 24)) ^ (uint16_t)((i & 1) << 15);
    float q[KV * G * D];
    for (int i = 0; i < KV * G * D; i++) q[i] = (float)((i * 37) % 11) * 0.1f - 0.5f;
    printf("| N | choice | bytes read / layer | ms / layer | GB/s | pages bounded |\n| ---: | --- | ---: | ---: | ---: | ---: |\n");
    for (const char *c = list; *c;) {
        const int64_t N = atoll(c), pages = (N + P - 1) / P, want = 256 / P + 1;
        while (*c && *c != ',') c++;
        if (*c == ',') c++;
        /* Quest: bf16 min/max of the same rows, tiled */
        uint16_t *mn = malloc((size_t)KV * pages * D * 2), *mx = malloc((size_t)KV * pages * D * 2);
        const int64_t bp = BASE / P;
        uint16_t *bmn = malloc((size_t)KV * bp * D * 2), *bmx = malloc((size_t)KV * bp * D * 2);
        hg_sel_summarize(k, 2, KV, BASE, D, 0, BASE, P, bp, bmn, bmx, 1, NULL);
        for (int64_t g = 0; g < KV; g++)
            for (int64_t p = 0; p < pages; p++) {
                memcpy(mn + (g * pages + p) * D, bmn + (g * bp + p % bp) * D, D * 2);
                memcpy(mx + (g * pages + p) * D, bmx + (g * bp + p % bp) * D, D * 2);
            }
        float *out = malloc((size_t)KV * pages * 4);
        double best = 1e30;
        for (int r = 0; r < 5; r++) {
            double t0 = now_ms();
            hg_sel_page_bounds(q, KV, G, D, mn, mx, pages, pages, out, -1, stage);
            double t = now_ms() - t0;
            if (t < best) best = t;
        }
        double bytes = (double)KV * pages * D * 4;
        printf("| %lld | Quest bf16 bounds (every page) | %.1f MB | %.3f | %.1f | 100%% |\n", (long long)N, bytes / 1e6, best, bytes / best / 1e6);
        free(mn); free(mx); free(bmn); free(bmx); free(out);
        for (int form = 1; form <= 2; form++) {
            for (int64_t S = 2; S <= 16; S *= 8) {
                hg_index base, big;
                void *bb = aligned_alloc(64, (size_t)hg_index_bytes(form, KV, D, P, S, bp)), *gb = aligned_alloc(64, (size_t)hg_index_bytes(form, KV, D, P, S, pages));
                hg_index_view(&base, bb, form, KV, D, P, S, bp);
                hg_index_view(&big, gb, form, KV, D, P, S, pages);
                hg_index_fold(bb, form, KV, D, P, S, bp, k, 2, BASE, 0, BASE, stage);
                tile(&base, &big);
                int32_t ids[KV * 64];
                int64_t read = 0;
                best = 1e30;
                for (int r = 0; r < 5; r++) {
                    double t0 = now_ms();
                    read = hg_index_pages(gb, form, KV, D, P, S, pages, q, G, N, want, ids, isa, stage);
                    double t = now_ms() - t0;
                    if (t < best) best = t;
                }
                bytes = (double)(read + KV * big.super_cap) * (big.code_bytes + 4);
                printf("| %lld | index %s, super-pages of %lld | %.1f MB | %.3f | %.1f | %.1f%% |\n", (long long)N, form == 1 ? "int8" : "int4", (long long)S, bytes / 1e6, best,
                       bytes / best / 1e6, 100.0 * read / ((double)KV * pages));
                free(bb); free(gb);
            }
        }
    }
    hg_stage_destroy(stage);
    free(k);
    return 0;
}
