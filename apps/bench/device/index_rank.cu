// The page index's top level on the GPU (issue 33, item 2): every page's bound from the int8 or
// int4 index (the spec's page-index.ts: codes lo/hi, one f32 scale a page; bound = scale·Σ_c max(q·lo, q·hi),
// max over the group's query heads) with one warp a page, then each KV head's best `want` pages
// (a segmented radix sort of bound/page pairs). Checked against a host f64 reference, then timed at
// Llama-3.1-8B's heads (32 query, 8 KV, headDim 128), pages of 16, per layer, beside the HBM floor
// of the index's bytes (a device-to-device copy's rate measured in the same run).
//   nvcc -O3 -arch=native -o /tmp/index_rank apps/bench/device/index_rank.cu && /tmp/index_rank [N,...]
#include <cub/cub.cuh>
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

// One warp a page: lane l holds channels 4l..4l+3 (D = 128), q split into its positive and negative parts.
template <int FORM>
__global__ void page_bounds(const uint8_t *__restrict__ codes, const float *__restrict__ scales, const float *__restrict__ q, int64_t pcap, int64_t count,
                            float *__restrict__ out) {
    const int g = blockIdx.y, lane = threadIdx.x & 31, warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, warps = (gridDim.x * blockDim.x) >> 5;
    constexpr int CB = FORM == 1 ? 2 * D : D;
    float qp[G][4], qn[G][4];
    for (int j = 0; j < G; j++)
        for (int i = 0; i < 4; i++) {
            const float v = q[(g * G + j) * D + lane * 4 + i];
            qp[j][i] = v > 0.f ? v : 0.f;
            qn[j][i] = v < 0.f ? v : 0.f;
        }
    const uint8_t *base = codes + (int64_t)g * pcap * CB;
    for (int64_t p = warp; p < count; p += warps) {
        float lo[4], hi[4];
        if (FORM == 1) {
            const uint32_t l = __ldg((const uint32_t *)(base + p * CB) + lane), h = __ldg((const uint32_t *)(base + p * CB + D) + lane);
            for (int i = 0; i < 4; i++) lo[i] = (float)(int8_t)(l >> (8 * i)), hi[i] = (float)(int8_t)(h >> (8 * i));
        } else {
            const uint32_t w = __ldg((const uint32_t *)(base + p * CB) + lane);
            for (int i = 0; i < 4; i++) lo[i] = (float)((int)((w >> (8 * i)) & 15) - 8), hi[i] = (float)((int)((w >> (8 * i + 4)) & 15) - 8);
        }
        float best = -INFINITY;
        for (int j = 0; j < G; j++) {
            float s = 0.f;
            for (int i = 0; i < 4; i++) s = fmaf(qp[j][i], hi[i], fmaf(qn[j][i], lo[i], s));
            for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            best = fmaxf(best, s);
        }
        if (lane == 0) out[(int64_t)g * count + p] = best * __ldg(scales + (int64_t)g * pcap + p);
    }
}

__global__ void page_ids(int32_t *ids, int64_t count) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < KV * count) ids[i] = (int32_t)(i % count);
}

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
    printf("| N | form | index bytes / layer | bounds ms / layer | their floor (bytes ÷ copy rate) | top-%d pages ms / layer | both, 32 layers | check |\n", 256 / P + 1);
    printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |\n");
    std::vector<float> q(KV * G * D);
    for (auto &v : q) v = ((rnd() >> 8) / 16777216.f) * 2 - 1;
    float *dq;
    CK(cudaMalloc(&dq, q.size() * 4));
    CK(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice));
    for (const char *c = list; *c;) {
        const int64_t N = atoll(c), pages = (N + P - 1) / P, want = 256 / P + 1;
        while (*c && *c != ',') c++;
        if (*c == ',') c++;
        for (int form = 1; form <= 2; form++) {
            std::vector<uint8_t> codes;
            std::vector<float> scales;
            fill(codes, scales, form, pages);
            const int64_t cb = form == 1 ? 2 * D : D;
            uint8_t *dc;
            float *ds, *dout, *dkeys;
            int32_t *dids, *dvals;
            int64_t *offs;
            CK(cudaMalloc(&dc, codes.size()));
            CK(cudaMalloc(&ds, scales.size() * 4));
            CK(cudaMalloc(&dout, KV * pages * 4));
            CK(cudaMalloc(&dkeys, KV * pages * 4));
            CK(cudaMalloc(&dids, KV * pages * 4));
            CK(cudaMalloc(&dvals, KV * pages * 4));
            CK(cudaMalloc(&offs, (KV + 1) * 8));
            std::vector<int64_t> ho(KV + 1);
            for (int g = 0; g <= KV; g++) ho[g] = g * pages;
            CK(cudaMemcpy(offs, ho.data(), ho.size() * 8, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(dc, codes.data(), codes.size(), cudaMemcpyHostToDevice));
            CK(cudaMemcpy(ds, scales.data(), scales.size() * 4, cudaMemcpyHostToDevice));
            const int threads = 256;
            const dim3 grid((unsigned)std::min<int64_t>((pages * 32 + threads - 1) / threads, prop.multiProcessorCount * 8 / KV + 1), KV);
            auto bounds = [&]() {
                if (form == 1) page_bounds<1><<<grid, threads>>>(dc, ds, dq, pages, pages, dout);
                else page_bounds<2><<<grid, threads>>>(dc, ds, dq, pages, pages, dout);
            };
            size_t tmp = 0;
            CK(cub::DeviceSegmentedRadixSort::SortPairsDescending(nullptr, tmp, dout, dkeys, dids, dvals, (int64_t)(KV * pages), KV, offs, offs + 1));
            void *dtmp;
            CK(cudaMalloc(&dtmp, tmp));
            auto rank = [&]() {
                page_ids<<<(unsigned)((KV * pages + 255) / 256), 256>>>(dids, pages);
                cub::DeviceSegmentedRadixSort::SortPairsDescending(dtmp, tmp, dout, dkeys, dids, dvals, (int64_t)(KV * pages), KV, offs, offs + 1);
            };
            bounds();
            rank();
            CK(cudaDeviceSynchronize());
            // check: every bound of heads 0 and KV-1 against the f64 reference; each head's best pages by the reference
            std::vector<float> got(KV * pages), keys(KV * pages);
            std::vector<int32_t> vals(KV * pages);
            CK(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(keys.data(), dkeys, keys.size() * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(vals.data(), dvals, vals.size() * 4, cudaMemcpyDeviceToHost));
            double worst = 0;
            int bad = 0;
            for (int g : {0, KV - 1}) {
                std::vector<std::pair<double, int64_t>> ref(pages);
                for (int64_t p = 0; p < pages; p++) {
                    double abs;
                    const double r = ref_bound(codes.data() + (g * pages + p) * cb, scales[g * pages + p], q.data() + g * G * D, form, &abs);
                    worst = std::max(worst, fabs(got[g * pages + p] - r) / std::max(abs, 1e-30));
                    ref[p] = {r, p};
                }
                std::partial_sort(ref.begin(), ref.begin() + want, ref.end(), [](auto &x, auto &y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
                for (int64_t i = 0; i < want; i++) {
                    const double mine = got[g * pages + vals[g * pages + i]];
                    if (fabs(mine - ref[i].first) > 1e-5 * std::max(1.0, fabs(ref[i].first))) bad++;
                }
            }
            const bool ok = worst <= 1e-5 && bad == 0;
            const int reps = 20;
            CK(cudaEventRecord(e0));
            for (int r = 0; r < reps; r++) bounds();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float bms;
            CK(cudaEventElapsedTime(&bms, e0, e1));
            CK(cudaEventRecord(e0));
            for (int r = 0; r < reps; r++) rank();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float rms;
            CK(cudaEventElapsedTime(&rms, e0, e1));
            bms /= reps;
            rms /= reps;
            const double bytes = (double)KV * pages * (cb + 4);
            printf("| %lld | int%d | %.1f MB | %.4f | %.4f | %.4f | %.2f ms | %s (bound error %.1e of Σ|q|·|code|·scale, %d top pages off) |\n", (long long)N, form == 1 ? 8 : 4, bytes / 1e6, bms,
                   bytes / hbm * 1e3, rms, 32 * (bms + rms), ok ? "ok" : "FAILED", worst, bad);
            for (void *x : {(void *)dc, (void *)ds, (void *)dout, (void *)dkeys, (void *)dids, (void *)dvals, (void *)offs, dtmp}) CK(cudaFree(x));
        }
    }
    return 0;
}
