/* The page index's bound loop (bound_scalar's bound), written once on GCC's vector extensions and
 * compiled once per ISA: sel_index.c includes this with BOUND_NAME, BOUND_TARGET (a target
 * attribute) and BOUND_W (f32 lanes a register: 8 for AVX2, 16 for AVX-512) defined. Codes are
 * widened BOUND_W channels a load, q split into its positive and negative parts (qp, qn:
 * [group][d]) so each channel is two multiply-adds and no select per head, the two into separate
 * sums (one chain a head waited on the FMA's latency); four heads at a time. */
BOUND_TARGET static float BOUND_NAME(const hg_index *x, const uint8_t *s, float sc, const float *qp, const float *qn, const float *q, int64_t group, const float *add) {
    typedef float vf __attribute__((vector_size(4 * BOUND_W)));
    typedef int32_t vi __attribute__((vector_size(4 * BOUND_W)));
    typedef int8_t vb __attribute__((vector_size(BOUND_W)));
    typedef uint8_t vu __attribute__((vector_size(BOUND_W)));
    const int64_t d = x->d, dw = d & ~(int64_t)(BOUND_W - 1);
    float best = -__builtin_inff();
    for (int64_t j = 0; j < group; j += 4) {
        const int64_t m = group - j < 4 ? group - j : 4;
        vf a[4] = {{0}}, b[4] = {{0}};
        for (int64_t c = 0; c < dw; c += BOUND_W) {
            vf lo, hi;
            if (x->form == HG_INDEX_INT8) {
                vb l8, h8;
                memcpy(&l8, s + c, sizeof l8);
                memcpy(&h8, s + d + c, sizeof h8);
                lo = __builtin_convertvector(l8, vf);
                hi = __builtin_convertvector(h8, vf);
            } else {
                vu w8;
                memcpy(&w8, s + c, sizeof w8);
                const vi w = __builtin_convertvector(w8, vi);
                lo = __builtin_convertvector((w & 15) - 8, vf);
                hi = __builtin_convertvector((w >> 4) - 8, vf);
            }
            for (int64_t i = 0; i < m; i++) {
                vf p, n;
                memcpy(&p, qp + (j + i) * d + c, sizeof p);
                memcpy(&n, qn + (j + i) * d + c, sizeof n);
                a[i] += p * hi;
                b[i] += n * lo;
            }
        }
        for (int64_t i = 0; i < m; i++) {
            const vf t = a[i] + b[i];
            float sum = 0.0f;
            for (int l = 0; l < BOUND_W; l++) sum += t[l];
            const float *qi = q + (j + i) * d;
            for (int64_t c = dw; c < d; c++) sum += qi[c] > 0.0f ? qi[c] * (float)code_hi(x, s, c) : qi[c] * (float)code_lo(x, s, c);
            const float bd = sc * (sum + (add ? add[j + i] : 0.0f));
            if (bd > best) best = bd;
        }
    }
    return best;
}
#undef BOUND_NAME
#undef BOUND_TARGET
#undef BOUND_W
