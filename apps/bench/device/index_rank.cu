// The page index's top level on the GPU (issue 33, item 2): packages/kernels-cuda/native/page_index.cuh
// (every page's bound from the int8 or int4 index, the spec's page-index.ts: codes lo/hi, one f32
// scale a page, bound = scale·Σ_c max(q·lo, q·hi), max over the group's query heads; then each KV
// head's best `want` pages by a chunked select, no sort; the index page-major), checked against a host f64 reference,
// then timed at Llama-3.1-8B's heads (32 query, 8 KV, headDim 128), pages of 16, per layer, beside
// the HBM floor of the index's bytes (a device-to-device copy's rate measured in the same run).
//   nvcc -O3 -std=c++17 -arch=native -o /tmp/index_rank apps/bench/device/index_rank.cu && /tmp/index_rank [N,...]
#include "../../../packages/kernels-cuda/native/page_index.cuh"
#include <cuda_runtime.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

constexpr int KV = 8, G = 4, D = 128, P = 16;

static uint32_t rs = 12345;
static uint32_t rnd() { return rs = rs * 1664525u + 1013904223u; }

// A random but valid index: lo <= hi per channel, positive scales.
static void fill(std::vector<uint8_t> &codes, std::vector<float> &scales, int form, int64_t pages) {
    const int64_t cb = form == 1 ? 2 * D : D;
    codes.assign((size_t)(KV * pages * cb), 0);
    scales.resize((size_t)(KV * pages));
    for (int64_t pg = 0; pg < KV * pages; pg++) {
        uint8_t *c = codes.data() + pg * cb;
        for (int ch = 0; ch < D; ch++) {
            const int qmax = form == 1 ? 127 : 7, a = (int)(rnd() >> 8) % (2 * qmax + 1) - qmax, b = (int)(rnd() >> 8) % (2 * qmax + 1) - qmax;
            const int lo = std::min(a, b), hi = std::max(a, b);
            if (form == 1) c[ch] = (uint8_t)(int8_t)lo, c[D + ch] = (uint8_t)(int8_t)hi;
            else c[ch] = (uint8_t)((lo + 8) | ((hi + 8) << 4));
        }
        scales[pg] = (0.5f + (rnd() >> 8) / 16777216.f) / (form == 1 ? 127.f : 7.f);
    }
}

static double ref_bound(const uint8_t *c, float sc, const float *q, int form, double *abs) {
    double best = -INFINITY;
    *abs = 0;
    for (int j = 0; j < G; j++) {
        double s = 0, a = 0;
        for (int ch = 0; ch < D; ch++) {
            const int lo = form == 1 ? (int8_t)c[ch] : (c[ch] & 15) - 8, hi = form == 1 ? (int8_t)c[D + ch] : (c[ch] >> 4) - 8;
            const double v = q[j * D + ch];
            s += v > 0 ? v * hi : v * lo;
            a += fabs(v) * std::max(std::abs(lo), std::abs(hi));
        }
        best = std::max(best, s * sc);
        *abs = std::max(*abs, a * sc);
    }
    return best;
}

int main(int argc, char **argv) {
    const char *list = argc > 1 ? argv[1] : "32768,131000,1500000";
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    // HBM rate: a 1 GiB device-to-device copy (read + write bytes) in this run.
    void *a, *b;
    const size_t big = 1ull << 30;
    CK(cudaMalloc(&a, big));
    CK(cudaMalloc(&b, big));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaMemcpy(b, a, big, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e0));
    for (int r = 0; r < 10; r++) CK(cudaMemcpy(b, a, big, cudaMemcpyDeviceToDevice));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    const double hbm = 2.0 * big * 10 / (ms / 1e3);
    CK(cudaFree(a));
    CK(cudaFree(b));
    printf("%s, %d SMs; device-to-device copy %.0f GB/s (read + write)\n", prop.name, prop.multiProcessorCount, hbm / 1e9);
    printf("| N | form | want | index bytes / layer | floor (bytes ÷ copy rate) | rank ms / layer | × floor | 32 layers | check |\n");
    printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
    std::vector<float> q(KV * G * D);
    for (auto &v : q) v = ((rnd() >> 8) / 16777216.f) * 2 - 1;
    float *dq;
    CK(cudaMalloc(&dq, q.size() * 4));
    CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    int failed = 0;
    for (const char *c = list; *c;) {
        const int64_t N = atoll(c), pages = (N + P - 1) / P;
        while (*c && *c != ',') c++;
        if (*c == ',') c++;
        for (int form = 1; form <= 2; form++) {
            std::vector<uint8_t> codes;
            std::vector<float> scales;
            fill(codes, scales, form, pages);
            // every 97th page of head 0 repeats page 0 (equal bounds: the tie goes to the lower page)
            const int64_t cb = form == 1 ? 2 * D : D;
            for (int64_t p = 97; p < pages; p += 97) memcpy(codes.data() + p * cb, codes.data(), cb), scales[p] = scales[0];
            uint8_t *dc;
            float *ds;
            int32_t *dout;
            void *dtmp;
            CK(cudaMalloc(&dc, codes.size()));
            CK(cudaMalloc(&ds, scales.size() * 4));
            // the device holds it page-major (codes [pages, KV, cb], scales [pages, KV])
            std::vector<uint8_t> pm(codes.size());
            std::vector<float> spm(scales.size());
            for (int g = 0; g < KV; g++)
                for (int64_t p = 0; p < pages; p++) memcpy(pm.data() + (p * KV + g) * cb, codes.data() + (g * pages + p) * cb, cb), spm[p * KV + g] = scales[g * pages + p];
            CK(cudaMemcpy(dc, pm.data(), pm.size(), cudaMemcpyHostToDevice));
            CK(cudaMemcpy(ds, spm.data(), spm.size() * 4, cudaMemcpyHostToDevice));
            // reference bounds of every head (f64), and the scale of each bound's rounding
            std::vector<double> ref(KV * pages), tol(KV * pages);
            for (int g = 0; g < KV; g++)
                for (int64_t p = 0; p < pages; p++) ref[g * pages + p] = ref_bound(codes.data() + (g * pages + p) * cb, scales[g * pages + p], q.data() + g * G * D, form, &tol[g * pages + p]);
            for (int want : {256 / P + 1, 4 * 256 / P + 1}) {
                const hg_index::Plan pl = hg_index::plan(form, KV, G, D, pages, want, prop.multiProcessorCount);
                if (!pl.ok) { printf("| %lld | int%d | %d | no plan |\n", (long long)N, form == 1 ? 8 : 4, want); failed++; continue; }
                CK(cudaMalloc(&dtmp, pl.scratch));
                CK(cudaMalloc(&dout, KV * want * 4));
                auto launch = [](auto kernel, dim3 g, dim3 b, size_t sm, auto... args) { kernel<<<g, b, sm>>>(args...); return cudaGetLastError(); };
                hg_index::RankArgs a;
                a.codes = dc, a.scales = ds, a.q = dq, a.out = dout, a.scratch = dtmp, a.count_val = (int)pages;
                auto rank = [&]() { return hg_index::rank_with(pl, launch, form, KV, G, D, pages, want, a); };
                CK(rank());
                CK(cudaDeviceSynchronize());
                std::vector<int32_t> got(KV * want);
                CK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
                // check: each head's i-th page has the reference's i-th best bound (within f32 rounding), pages distinct, ties in page order
                int bad = 0;
                for (int g = 0; g < KV; g++) {
                    std::vector<int64_t> order(pages);
                    for (int64_t p = 0; p < pages; p++) order[p] = p;
                    const double *r = ref.data() + g * pages;
                    std::partial_sort(order.begin(), order.begin() + want, order.end(), [&](int64_t x, int64_t y) { return r[x] > r[y] || (r[x] == r[y] && x < y); });
                    std::vector<char> seen(pages, 0);
                    for (int i = 0; i < want; i++) {
                        const int32_t p = got[g * want + i];
                        if (p < 0 || p >= pages || seen[p]) { bad++; continue; }
                        seen[p] = 1;
                        const int64_t e = order[i];
                        if (fabs(r[p] - r[e]) > 1e-5 * std::max(tol[g * pages + p], tol[g * pages + e])) bad++;
                        else if (r[p] == r[e] && p != e && i + 1 < want && got[g * want + i + 1] < p && r[got[g * want + i + 1]] == r[p]) bad++;
                    }
                }
                failed += bad != 0;
                const int reps = 20;
                CK(cudaEventRecord(e0));
                for (int x = 0; x < reps; x++) rank();
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float rms;
                CK(cudaEventElapsedTime(&rms, e0, e1));
                rms /= reps;
                const double bytes = (double)KV * pages * (cb + 4), floor_ms = bytes / hbm * 1e3;
                printf("| %lld | int%d | %d | %.1f MB | %.4f | %.4f | %.1f | %.2f ms | %s (%d pages off) |\n", (long long)N, form == 1 ? 8 : 4, want, bytes / 1e6, floor_ms, rms,
                       rms / floor_ms, 32 * rms, bad ? "FAILED" : "ok", bad);
                CK(cudaFree(dout));
                CK(cudaFree(dtmp));
            }
            CK(cudaFree(dc));
            CK(cudaFree(ds));
        }
    }
    printf("%s\n", failed ? "index rank: FAILED" : "index rank: ALL PASS");
    return failed ? 1 : 0;
}
