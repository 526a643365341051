/* One layer of the CPU stage at Llama-3.1-8B's heads (32 query, 8 KV, headDim 128, bf16) over N
 * offloaded rows, top-K per KV head plus the V gather, scoring the full rows or compressed
 * copies first (int8, int4) with c·K candidates rescored from the full rows. The forms' jobs
 * alternate round by round and each phase keeps its minimum (a busy machine only adds time):
 *   gcc -O2 -Ipackages/kernels-cpu/native apps/bench/src/cpu/stage-scoring.c -Lpackages/kernels-cpu/lib -lhgcpu -lm -Wl,-rpath,$PWD/packages/kernels-cpu/lib -o /tmp/stage-scoring
 *   /tmp/stage-scoring [N=28672] [threads=2] [K=256] [c=2,4] [rounds=9]
 * (after `bun run build`). "K MB" is what a job reads of K: the full rows, or the compressed
 * copies plus the rescored rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include "cpu_stage.h"
#include "kq.h"
#include "hgcpu.h"

int main(int argc, char **argv) {
    const int64_t N = argc > 1 ? atoll(argv[1]) : 28672, KV = 8, H = 32, D = 128;
    const int threads = argc > 2 ? atoi(argv[2]) : 2;
    const int64_t K = argc > 3 ? atoll(argv[3]) : 256;
    const char *cs = argc > 4 ? argv[4] : "2,4";
    const int rounds = argc > 5 ? atoi(argv[5]) : 9;
    int cl[8], nc = 0;
    for (const char *p = cs; *p && nc < 8; p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p)) cl[nc++] = atoi(p);
    uint16_t *k = hg_alloc((uint64_t)(KV * N * D * 2)), *v = hg_alloc((uint64_t)(KV * N * D * 2));
    uint32_t s = 1;
    for (int64_t i = 0; i < KV * N * D; i++) { /* bf16 of a rough normal: sum of two uniforms */
        s = s * 1103515245 + 12345;
        float a = (s >> 8) / 16777216.0f;
        s = s * 1103515245 + 12345;
        float f = a + (s >> 8) / 16777216.0f - 1.0f;
        uint32_t u;
        memcpy(&u, &f, 4);
        k[i] = (uint16_t)(u >> 16);
        v[i] = k[i];
    }
    float *q = malloc(H * D * 4), *all = hg_alloc((uint64_t)(H * N * 4)), *sel = malloc(H * K * 4);
    for (int i = 0; i < H * D; i++) q[i] = __builtin_sinf((float)i * 0.7f);
    int32_t *ids = malloc(KV * K * 4), counts[8];
    uint16_t *vst = malloc(KV * K * D * 2);
    uint8_t *kq[3] = { NULL, hg_alloc((uint64_t)(KV * N * hg_kq_row_bytes(HG_KQ_INT8, D))), hg_alloc((uint64_t)(KV * N * hg_kq_row_bytes(HG_KQ_INT4, D))) };
    hg_stage *st = hg_stage_create(threads, -1);
    /* configurations: full, then int8 and int4 for every c */
    int cfg_form[17], cfg_c[17], ncfg = 0;
    cfg_form[ncfg] = 0, cfg_c[ncfg++] = 0;
    for (int f = 1; f <= 2; f++)
        for (int i = 0; i < nc; i++) cfg_form[ncfg] = f, cfg_c[ncfg++] = cl[i];
    double best[17][5], encode_ms[3] = { 0, 0, 0 };
    int64_t same[17];
    int32_t *exact = malloc(KV * K * 4);
    for (int c = 0; c < ncfg; c++) for (int i = 0; i < 5; i++) best[c][i] = 1e30;
    for (int r = 0; r <= rounds; r++)
        for (int c = 0; c < ncfg; c++) {
            const int f = cfg_form[c];
            hg_stage_job j = { .flags = HG_STAGE_TOPK | HG_STAGE_GATHER, .q = (intptr_t)q, .k = (intptr_t)k, .ktype = 2, .kcap = N, .v = (intptr_t)v,
                               .vtype = 2, .vcap = N, .n = N, .heads = H, .kv_heads = KV, .head_dim = D, .all_logits = (intptr_t)all, .lstride = N,
                               .ids = (intptr_t)ids, .counts = (intptr_t)counts, .kmax = K, .budget = K, .sel_logits = (intptr_t)sel,
                               .vstage = (intptr_t)vst, .scale = 0.088, .kq = (intptr_t)kq[f], .kq_form = f, .kq_from = r == 0 ? 0 : N,
                               .cand = cfg_c[c] * K };
            if (hg_stage_run(st, &j) != 0) { fprintf(stderr, "job failed\n"); return 1; }
            double sp[6];
            hg_stage_last_split(st, sp);
            if (r == 0) { /* the first job encodes every row */
                if (f) encode_ms[f] = (sp[0] + sp[1]) / 1e6;
                if (c == 0) memcpy(exact, ids, KV * K * 4);
                int64_t hit = 0;
                for (int g = 0; g < KV; g++)
                    for (int a = 0, b = 0; a < K && b < K;) {
                        int32_t x = exact[g * K + a], y = ids[g * K + b];
                        if (x == y) hit++, a++, b++;
                        else if (x < y) a++;
                        else b++;
                    }
                same[c] = hit;
                continue;
            }
            double ph[5] = { (sp[0] + sp[1]) / 1e6, sp[2] / 1e6, sp[3] / 1e6, 0, 0 };
            ph[3] = ph[0] + ph[1] + ph[2];
            for (int i = 0; i < 4; i++) best[c][i] = ph[i] < best[c][i] ? ph[i] : best[c][i];
        }
    printf("N=%lld rows x 8 KV heads x 128 bf16, 32 query heads, top-%lld per KV head + V gather, %d stage threads, min of %d rounds\n",
           (long long)N, (long long)K, threads, rounds);
    printf("(encoding every row once: int8 %.2f ms, int4 %.2f ms; recall on these random rows is no guide, see apps/bench/src/eval/scoring-recall.ts)\n", encode_ms[1], encode_ms[2]);
    printf("| scoring | c | K MB read | score ms | top-K ms | gather ms | stage ms | vs full | recall here |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int c = 0; c < ncfg; c++) {
        const int f = cfg_form[c];
        const double mb = f == 0 ? KV * N * D * 2 / 1e6 : (KV * N * hg_kq_row_bytes(f, D) + KV * cfg_c[c] * K * D * 2) / 1e6;
        printf("| %s | %d | %.1f | %.3f | %.3f | %.3f | %.3f | %.2fx | %.3f |\n", f == 0 ? "full" : f == 1 ? "int8" : "int4", cfg_c[c], mb, best[c][0],
               best[c][1], best[c][2], best[c][3], best[0][3] / best[c][3], (double)same[c] / (KV * K));
    }
    return 0;
}
