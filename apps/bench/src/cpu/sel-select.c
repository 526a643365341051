/* One select() of infinigen (8 channels) and quest (pages of 16) at Llama-3.1-8B's heads (32
 * query, 8 KV, headDim 128) over N offloaded bf16 rows, K = 256, as the primitive calls the
 * selectors make (no JS), on the calling thread and on an idle CPU stage's pool of 1..16 threads:
 *   gcc -O2 -Ipackages/kernels-cpu/native apps/bench/src/cpu/sel-select.c -Lpackages/kernels-cpu/lib -lhgcpu -lm -Wl,-rpath,$PWD/packages/kernels-cpu/lib -o /tmp/sel-select && /tmp/sel-select [N]
 * (after `bun run build`); median of 40. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include "sel_prims.h"
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
    int64_t N = argc > 1 ? atoll(argv[1]) : 32768, K = 256, KV = 8, G = 4, D = 128, R = 8, cap = N + 64, page = 16;
    int reps = 40;
    uint16_t *k = malloc(KV * cap * D * 2);
    uint32_t s = 1;
    for (int64_t i = 0; i < KV * cap * D; i++) { s = s * 1103515245 + 12345; float f = ((s >> 8) / 16777216.0f - 0.5f) * 2; uint32_t u; memcpy(&u, &f, 4); k[i] = u >> 16; }
    float *q = malloc(KV * G * D * 4), *q8 = malloc(KV * G * R * 4);
    for (int i = 0; i < KV * G * D; i++) q[i] = __builtin_sinf(i);
    for (int i = 0; i < KV * G * R; i++) q8[i] = __builtin_cosf(i);
    int32_t ch[64];
    for (int i = 0; i < 64; i++) ch[i] = (i * 3) % 128;
    float *packed = malloc(KV * cap * R * 4), *sc = malloc(KV * N * 4);
    int64_t pcap = (cap + page - 1) / page, count = (N + page - 1) / page;
    uint16_t *mn = malloc(KV * pcap * D * 2), *mx = malloc(KV * pcap * D * 2); /* bf16 summaries */
    float *b = malloc(KV * count * 4), ex[16];
    int32_t *ids = malloc(K * 4 * KV);
    hg_sel_gather(k, 2, KV, cap, D, ch, R, 0, N - 1, packed, cap, NULL);
    hg_sel_summarize(k, 2, KV, cap, D, 0, N - 1, page, pcap, mn, mx, -1, NULL);
    int ths[] = {0, 1, 2, 4, 8, 16};
    printf("N=%lld (32 heads / 8 KV x 128, bf16, K=%lld): median ms of the primitive calls of one select()\n", (long long)N, (long long)K);
    for (unsigned t = 0; t < sizeof ths / sizeof *ths; t++) {
        hg_stage *st = ths[t] ? hg_stage_create(ths[t], -1) : NULL;
        double ti[64], tq[64], tsc[64], ttk[64], tpb[64];
        for (int r = 0; r < reps; r++) {
            double t0 = now();
            hg_sel_gather(k, 2, KV, cap, D, ch, R, N - 1, N, packed, cap, st);
            hg_sel_key_scores(q8, KV, G, packed, 0, cap, R, 0, N, sc, -1, st);
            double t1 = now();
            for (int g = 0; g < KV; g++) hg_sel_topk(sc + g * N, N, K, ids + g * K, -1, st);
            double t2 = now();
            hg_sel_summarize(k, 2, KV, cap, D, N - 1, N, page, pcap, mn, mx, -1, st);
            hg_sel_page_bounds(q, KV, G, D, mn, mx, pcap, count, b, -1, st);
            double t3 = now();
            for (int g = 0; g < KV; g++) {
                hg_sel_topk(b + g * count, count, K / page + 1, ids, -1, st);
                hg_sel_key_scores(q + g * G * D, 1, G, (const char *)k + g * cap * D * 2, 2, cap, D, ids[0] * page, ids[0] * page + page, ex, -1, st);
                hg_sel_topk(ex, page, 5, ids + 32, -1, st);
            }
            double t4 = now();
            tsc[r] = t1 - t0; ttk[r] = t2 - t1; ti[r] = t2 - t0; tpb[r] = t3 - t2; tq[r] = t4 - t2;
        }
        qsort(ti, reps, 8, cmpd); qsort(tq, reps, 8, cmpd); qsort(tsc, reps, 8, cmpd); qsort(ttk, reps, 8, cmpd); qsort(tpb, reps, 8, cmpd);
        printf("  threads %2d%s: infinigen %.3f (scores %.3f, 8 topK %.3f)  quest %.3f (bounds %.3f)\n", ths[t] ? ths[t] : 1, ths[t] ? " (stage pool)" : " (no stage) ",
               ti[reps / 2], tsc[reps / 2], ttk[reps / 2], tq[reps / 2], tpb[reps / 2]);
        if (st) hg_stage_destroy(st);
    }
    return 0;
}
