/* The CPU stage's top-K phase of two builds of the library side by side (score + top-K per KV
 * head, no gather), at Llama-3.1-8B's heads (32 query, 8 KV, headDim 128, bf16) over N offloaded
 * rows, K = 256; the two libraries' jobs alternate and each phase's minimum over the rounds is
 * kept (a busy machine only adds time):
 *   gcc -O2 -Ipackages/kernels-cpu/native apps/bench/src/cpu/stage-topk.c -ldl -lm -o /tmp/stage-topk && /tmp/stage-topk OLD.so NEW.so [N] [threads] [rounds]
 * OLD.so: e.g. `git worktree add /tmp/old <commit>` and `node scripts/build-native.mjs` in its packages/kernels-cpu. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "cpu_stage.h"

typedef struct {
    hg_stage *(*create)(int, int);
    int64_t (*run)(hg_stage *, const hg_stage_job *);
    void (*split)(const hg_stage *, double *);
    hg_stage *st;
} lib_t;

static lib_t open_lib(const char *path, int threads) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); exit(1); }
    lib_t l = { dlsym(h, "hg_stage_create"), dlsym(h, "hg_stage_run"), dlsym(h, "hg_stage_last_split"), NULL };
    if (!l.create || !l.run || !l.split) { fprintf(stderr, "%s: missing stage symbols\n", path); exit(1); }
    l.st = l.create(threads, -1);
    return l;
}

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: stage-topk OLD.so NEW.so [N] [threads] [rounds]\n"); return 2; }
    const int64_t N = argc > 3 ? atoll(argv[3]) : 28704, KV = 8, H = 32, D = 128, K = 256;
    const int threads = argc > 4 ? atoi(argv[4]) : 2, rounds = argc > 5 ? atoi(argv[5]) : 15;
    uint16_t *k = malloc((size_t)(KV * N * D * 2));
    uint32_t s = 1;
    for (int64_t i = 0; i < KV * N * D; i++) { /* bf16 of uniform [-1, 1) */
        s = s * 1103515245 + 12345;
        float f = ((s >> 8) / 16777216.0f - 0.5f) * 2;
        uint32_t u;
        memcpy(&u, &f, 4);
        k[i] = (uint16_t)(u >> 16);
    }
    float *q = malloc(H * D * 4), *all = malloc((size_t)(H * N * 4));
    for (int i = 0; i < H * D; i++) q[i] = __builtin_sinf((float)i);
    int32_t *ids[2] = { malloc(KV * K * 4), malloc(KV * K * 4) }, counts[8];
    lib_t lib[2] = { open_lib(argv[1], threads), open_lib(argv[2], threads) };
    double best[2][3];
    for (int l = 0; l < 2; l++) best[l][0] = best[l][1] = best[l][2] = 1e30;
    for (int r = 0; r < rounds; r++)
        for (int l = 0; l < 2; l++) {
            hg_stage_job j = { .flags = HG_STAGE_SCORE | HG_STAGE_TOPK, .q = (intptr_t)q, .k = (intptr_t)k, .ktype = 2, .kcap = N,
                               .n = N, .heads = H, .kv_heads = KV, .head_dim = D, .all_logits = (intptr_t)all, .lstride = N,
                               .ids = (intptr_t)ids[l], .counts = (intptr_t)counts, .kmax = K, .budget = K, .scale = 0.088 };
            usleep(3000); /* the other library's pool workers spin ~0.5 ms after a job: let them sleep first */
            if (lib[l].run(lib[l].st, &j) != 0) { fprintf(stderr, "job failed\n"); return 1; }
            double sp[6];
            lib[l].split(lib[l].st, sp);
            double ph[3] = { (sp[0] + sp[1]) / 1e6, sp[2] / 1e6, (sp[0] + sp[1] + sp[2]) / 1e6 };
            for (int i = 0; i < 3; i++) best[l][i] = ph[i] < best[l][i] ? ph[i] : best[l][i];
        }
    int same = memcmp(ids[0], ids[1], KV * K * 4) == 0;
    printf("N=%lld, %d threads, min of %d: score ms old %.3f new %.3f | top-K ms old %.3f new %.3f (%.1fx) | both %.3f -> %.3f | same ids: %s\n",
           (long long)N, threads, rounds, best[0][0], best[1][0], best[0][1], best[1][1], best[0][1] / best[1][1], best[0][2], best[1][2],
           same ? "yes" : "NO");
    return same ? 0 : 1;
}
