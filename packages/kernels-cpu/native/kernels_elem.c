/* Row and elementwise kernels, conversions, argmax, the streaming-read baseline,
 * and this ISA's kernel table. */
#include "simd.h"
#include "kernels.h"

static void rmsnorm_row(float *out, const float *x, const float *w, int k, float eps) {
    vf a = vzero();
    int i = 0;
    for (; i + VW <= k; i += VW) { vf v = vld(x + i); a = vfma(v, v, a); }
    float ss = vhsum(a);
    for (; i < k; i++) ss += x[i] * x[i];
    float inv = 1.0f / sqrtf(ss / (float)k + eps);
    vf vi = vset1(inv);
    for (i = 0; i + VW <= k; i += VW) vst(out + i, vmul(vmul(vld(x + i), vi), vld(w + i)));
    for (; i < k; i++) out[i] = x[i] * inv * w[i];
}

static void layernorm_row(float *out, const float *x, const float *w, const float *b, int k, float eps) {
    vf a = vzero();
    int i = 0;
    for (; i + VW <= k; i += VW) a = vadd(a, vld(x + i));
    float sum = vhsum(a);
    for (; i < k; i++) sum += x[i];
    float mean = sum / (float)k;
    vf vm = vset1(mean);
    a = vzero();
    for (i = 0; i + VW <= k; i += VW) { vf dv = vsub(vld(x + i), vm); a = vfma(dv, dv, a); }
    float var = vhsum(a);
    for (; i < k; i++) var += (x[i] - mean) * (x[i] - mean);
    float inv = 1.0f / sqrtf(var / (float)k + eps);
    vf vi = vset1(inv);
    for (i = 0; i + VW <= k; i += VW)
        vst(out + i, vfma(vmul(vsub(vld(x + i), vm), vi), vld(w + i), vld(b + i)));
    for (; i < k; i++) out[i] = (x[i] - mean) * inv * w[i] + b[i];
}

static void silu_mul(float *out, const float *gate, const float *up, int64_t count) {
    vf one = vset1(1.0f);
    int64_t i = 0;
    for (; i + VW <= count; i += VW) {
        vf g = vld(gate + i);
        vst(out + i, vmul(vdiv(g, vadd(one, vexp(vsub(vzero(), g)))), vld(up + i)));
    }
    for (; i < count; i++) out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

static void add(float *out, const float *a, const float *b, int64_t count) {
    int64_t i = 0;
    for (; i + VW <= count; i += VW) vst(out + i, vadd(vld(a + i), vld(b + i)));
    for (; i < count; i++) out[i] = a[i] + b[i];
}

static void relu(float *x, int64_t count) {
    for (int64_t i = 0; i < count; i++) x[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

/* x[i] = e^(x[i] - m) for i < n (e^-inf = 0); returns their sum */
static float exp_sum(float *x, int64_t n, float m) {
    vf vm = vset1(m), vs = vzero();
    int64_t i = 0;
    for (; i + VW <= n; i += VW) {
        vf e = vexp(vsub(vld(x + i), vm));
        vst(x + i, e);
        vs = vadd(vs, e);
    }
    float sum = vhsum(vs);
    for (; i < n; i++) { x[i] = expf(x[i] - m); sum += x[i]; }
    return sum;
}

static void softmax_row(float *x, int cols) {
    vf vm = vset1(-INFINITY);
    int i = 0;
    for (; i + VW <= cols; i += VW) vm = vmax(vm, vld(x + i));
    float mx = vhmax(vm);
    for (; i < cols; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = exp_sum(x, cols, mx);
    vf vinv = vset1(1.0f / sum);
    for (i = 0; i + VW <= cols; i += VW) vst(x + i, vmul(vld(x + i), vinv));
    for (; i < cols; i++) x[i] *= 1.0f / sum;
}

/* First index of the maximum. A vector pass keeps the maximum of every block of 256; the
 * first block holding the overall maximum is then scanned, so no pass is scalar over the
 * whole row (a 32000-entry vocabulary takes ~2 us instead of ~18). */
#define AM_BLOCK 256
static int64_t argmax(const float *x, int64_t count) {
    float mx = -INFINITY;
    int64_t best_block = -1;
    for (int64_t b = 0; b < count; b += AM_BLOCK) {
        int64_t e = b + AM_BLOCK < count ? b + AM_BLOCK : count, i = b;
        vf vm = vset1(-INFINITY);
        for (; i + VW <= e; i += VW) vm = vmax(vm, vld(x + i));
        float bm = vhmax(vm);
        for (; i < e; i++) bm = x[i] > bm ? x[i] : bm;
        if (bm > mx) { mx = bm; best_block = b; } /* strict: the first block wins ties */
    }
    if (best_block < 0) return 0; /* all NaN or -inf */
    for (int64_t i = best_block; i < count; i++)
        if (x[i] == mx) return i;
    return 0;
}

static void convert(void *dst, int dt, const void *src, int st, int64_t count) {
    int64_t i = 0;
    if (dt == st) { memcpy(dst, src, (size_t)count * (dt == 0 ? 4 : 2)); return; }
    if (dt == 0) {                           /* f16/bf16 -> f32 */
        float *d = (float *)dst;
        for (; i + VW <= count; i += VW) vst(d + i, vld_any(src, st, i));
        for (; i < count; i++) d[i] = sld_any(src, st, i);
        return;
    }
    uint16_t *d = (uint16_t *)dst;
    if (st == 0 && dt == 1) {                /* f32 -> f16 */
        const float *s = (const float *)src;
        for (; i + VW <= count; i += VW) vst_f16(d + i, vld(s + i));
        for (; i < count; i++) d[i] = hg_f32_to_f16(s[i]);
        return;
    }
    for (; i < count; i++) {                 /* -> bf16, or between f16 and bf16 */
        float f = sld_any(src, st, i);
        d[i] = dt == 1 ? hg_f32_to_f16(f) : hg_f32_to_bf16(f);
    }
}

static double stream_sum(const float *p, int64_t count) {
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
    int64_t i = 0;
    for (; i + 4 * VW <= count; i += 4 * VW) {
        a0 = vadd(a0, vld(p + i));          a1 = vadd(a1, vld(p + i + VW));
        a2 = vadd(a2, vld(p + i + 2 * VW)); a3 = vadd(a3, vld(p + i + 3 * VW));
    }
    double s = (double)vhsum(vadd(vadd(a0, a1), vadd(a2, a3)));
    for (; i < count; i++) s += p[i];
    return s;
}

void KFN(hg_k_matmul)(const hg_matmul_args *a, long r0, long r1);
void KFN(hg_k_attn_logits)(const hg_logits_args *a, int64_t f0, int64_t f1);
int64_t KFN(hg_k_attn_qfloats)(int heads, int kv_heads, int head_dim, int ktype);
void KFN(hg_k_attn_qpack)(float *dst, const float *q, int heads, int kv_heads, int head_dim, int ktype);
void KFN(hg_k_attn_aggregate)(const hg_aggr_args *a, float *acc, int64_t j0, int64_t j1);

const hg_kernels KFN(hg_kernels) = {
    .matmul = KFN(hg_k_matmul),
    .attn_logits = KFN(hg_k_attn_logits),
    .attn_qfloats = KFN(hg_k_attn_qfloats),
    .attn_qpack = KFN(hg_k_attn_qpack),
    .attn_aggregate = KFN(hg_k_attn_aggregate),
    .rmsnorm_row = rmsnorm_row,
    .layernorm_row = layernorm_row,
    .silu_mul = silu_mul,
    .add = add,
    .relu = relu,
    .softmax_row = softmax_row,
    .exp_sum = exp_sum,
    .argmax = argmax,
    .convert = convert,
    .stream_sum = stream_sum,
};
