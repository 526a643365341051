/* Prefill calibration's per-sample sums (the runtime's calibrator reads its stash once and hands
 * every sampled row here): for one KV head's group at one prompt row, the group's largest logit
 * under q and under q̃, each token's first K of the grid that holds it (a 16-bit bucket sort: sign,
 * exponent and 7 mantissa bits, ties broken by position), q̃'s token recall of the true top-K and
 * the attention mass the window plus K tokens capture, per grid K. The same arithmetic as
 * @hybridgen/core's sampleSums in the same order, so the doubles agree bit for bit; the samples
 * are independent, so they run in parallel on a short-lived pool. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "hgcpu.h"
#include "pool.h"

typedef struct {
    const float *data;
    int64_t width;
    int group;
    const int32_t *samples; /* [n][5]: logits row, q̃ logits row (-1: none), probs row, from, to */
    int64_t n;
    const int32_t *grid;
    int G, c;
    double *out; /* [n][4*(G+1)+2] */
    atomic_int failed;
} calib_job;

static void group_max(const float *data, int64_t width, int64_t row, int group, int64_t from, int64_t n, float *out) {
    memcpy(out, data + row * width + from, (size_t)n * sizeof(float));
    for (int r = 1; r < group; r++) {
        const float *x = data + (row + r) * width + from;
        for (int64_t j = 0; j < n; j++) out[j] = x[j] > out[j] ? x[j] : out[j];
    }
}

/* out[j] = the first grid index whose top-(c·K) holds token j (G when none does). */
static void bucket_ranks(const float *v, int64_t n, const int32_t *grid, int G, int c, uint32_t *hist, uint16_t *keys, uint8_t *entry, uint8_t *out) {
    memset(hist, 0, 65536 * sizeof(uint32_t));
    for (int64_t j = 0; j < n; j++) {
        uint32_t u;
        memcpy(&u, v + j, 4);
        uint32_t key = ((u & 0x80000000u) ? ~u : (u | 0x80000000u)) >> 16; /* unsigned order is float order */
        keys[j] = (uint16_t)key;
        hist[key]++;
    }
    uint32_t acc = 0;
    for (int key = 65535; key >= 0; key--) {
        uint32_t k = hist[key];
        hist[key] = acc;
        acc += k;
    }
    int64_t r = 0;
    for (int b = 0; b < G && r < n; b++) {
        int64_t end = (int64_t)grid[b] * c;
        if (end > n) end = n;
        for (; r < end; r++) entry[r] = (uint8_t)b;
    }
    for (; r < n; r++) entry[r] = (uint8_t)G;
    for (int64_t j = 0; j < n; j++) out[j] = entry[hist[keys[j]]++];
}

static void calib_sample(const calib_job *J, int64_t s, uint8_t *scratch, int64_t cap) {
    const int32_t *d = J->samples + 5 * s;
    const int G = J->G, group = J->group;
    const int64_t from = d[3], n = (int64_t)d[4] - d[3];
    double *o = J->out + s * (4 * (G + 1) + 2);
    double *share = o, *vshare = o + (G + 1), *recall = o + 2 * (G + 1), *rcount = o + 3 * (G + 1);
    memset(o, 0, (size_t)(4 * (G + 1) + 2) * sizeof(double));
    if (n <= 0) return;
    uint32_t *hist = (uint32_t *)scratch;
    float *gq = (float *)(scratch + 65536 * 4), *gs = gq + cap;
    uint16_t *keys = (uint16_t *)(gs + cap);
    uint8_t *entry = (uint8_t *)(keys + cap), *bq = entry + cap, *bs = bq + cap;
    group_max(J->data, J->width, d[0], group, from, n, gq);
    group_max(J->data, J->width, d[1] < 0 ? d[0] : d[1], group, from, n, gs);
    bucket_ranks(gq, n, J->grid, G, 1, hist, keys, entry, bq);
    bucket_ranks(gs, n, J->grid, G, J->c, hist, keys, entry, bs);
    double hits[257] = {0};
    for (int64_t j = 0; j < n; j++) hits[bq[j] > bs[j] ? bq[j] : bs[j]] += 1;
    double cum = 0;
    for (int b = 0; b < G; b++) {
        cum += hits[b];
        if (J->grid[b] >= n) continue;
        double x = cum / J->grid[b];
        recall[b] += x < 1 ? x : 1;
        rcount[b] += 1;
    }
    /* Four interleaved sums per grid index (token j into lane j & 3), as the reference adds them. */
    double mq[4 * 257], ms[4 * 257];
    for (int h = 0; h < group; h++) {
        const float *p = J->data + ((int64_t)d[2] + h) * J->width + from;
        memset(mq, 0, sizeof(double) * 4 * (G + 1));
        memset(ms, 0, sizeof(double) * 4 * (G + 1));
        double off = 0;
        for (int64_t j = 0; j < n; j++) {
            double x = p[j];
            int lane = (int)(j & 3);
            off += x;
            mq[(bq[j] << 2) | lane] += x;
            ms[(bs[j] << 2) | lane] += x;
        }
        double a = 1 - off, v = 1 - off;
        for (int b = 0; b < G; b++) {
            a += mq[4 * b] + mq[4 * b + 1] + mq[4 * b + 2] + mq[4 * b + 3];
            v += ms[4 * b] + ms[4 * b + 1] + ms[4 * b + 2] + ms[4 * b + 3];
            int all = J->grid[b] >= n;
            share[b] += all ? 1 : (a < 1 ? a : 1);
            vshare[b] += all ? 1 : (v < 1 ? v : 1);
        }
    }
    o[4 * (G + 1)] = group;
    o[4 * (G + 1) + 1] = 1;
}

static void calib_task(void *v, int part, int parts) {
    calib_job *J = v;
    int64_t b, e;
    hg_split(J->n, 1, part, parts, &b, &e);
    if (b >= e) return;
    int64_t cap = 0;
    for (int64_t s = b; s < e; s++) {
        int64_t n = (int64_t)J->samples[5 * s + 4] - J->samples[5 * s + 3];
        if (n > cap) cap = n;
    }
    /* hist, two f32 rows, the keys, the rank → grid map and the two bucket rows */
    uint8_t *scratch = malloc(65536 * 4 + (size_t)cap * (4 + 4 + 2 + 1 + 1 + 1) + 64);
    if (!scratch) {
        atomic_store(&J->failed, 1);
        return;
    }
    for (int64_t s = b; s < e; s++) calib_sample(J, s, scratch, cap);
    free(scratch);
}

/* Sums of n samples into out ([n][4*(G+1)+2]: share, q̃'s candidates' share, recall, recall count
 * per grid K plus one bucket past it, then the query heads and 1). data holds `rows` rows of `width`
 * floats; each sample's rows (group of them from each first row) and [from, to) are checked here.
 * Returns 0, -1 for a bad argument, -2 when memory or threads failed. */
__attribute__((visibility("default")))
int hg_calib_sums(const float *data, int64_t rows, int64_t width, int group, const int32_t *samples, int64_t n,
                  const int32_t *grid, int G, int c, double *out, int threads) {
    if (group < 1 || G < 1 || G > 255 || c < 1 || n < 0 || width < 0 || rows < 0) return -1;
    for (int b = 0; b < G; b++) if (grid[b] < 1 || (b > 0 && grid[b] <= grid[b - 1])) return -1;
    for (int64_t s = 0; s < n; s++) {
        const int32_t *d = samples + 5 * s;
        for (int i = 0; i < 3; i++) {
            if (i == 1 && d[1] == -1) continue;
            if (d[i] < 0 || (int64_t)d[i] + group > rows) return -1;
        }
        if (d[3] < 0 || d[4] > width) return -1;
    }
    calib_job J = {data, width, group, samples, n, grid, G, c, out, 0};
    int parts = (int)(n < threads * 2 ? n : threads * 2);
    if (threads <= 1 || n < 2) {
        calib_task(&J, 0, 1);
    } else {
        hg_pool *p = hg_pool_create(threads < n ? threads : (int)n);
        if (!p) return -2;
        hg_pool_run(p, calib_task, &J, parts);
        hg_pool_destroy(p);
    }
    return atomic_load(&J.failed) ? -2 : 0;
}
