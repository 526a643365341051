/* The baseline the engine's speed target is stated against: the plain GEMV of a
 * llama2.c-style run.c (one output row per iteration of an OpenMP parallel loop, the dot
 * product left to the compiler), built the way run.c's fast build is:
 * gcc -Ofast -march=native -fopenmp. apps/bench/src/cpu/ops.ts compiles it into bench-out/ and times it
 * on the same weights, in the same run, as CpuBackend.matmul. */
void omp_gemv(float *out, const float *x, const float *w, int k, int m) {
    #pragma omp parallel for
    for (int i = 0; i < m; i++) {
        float s = 0.0f;
        for (int j = 0; j < k; j++) s += w[(long)i * k + j] * x[j];
        out[i] = s;
    }
}
