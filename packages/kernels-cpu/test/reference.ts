/** Plain f64 reference implementations of every op (the oracle for the kernels). */

/** out[i, j] = sum_t x[i, t] w[j, t] (+ b[j]); also returns sum_t |x w| per element (error scale). */
export function refMatmul(x: ArrayLike<number>, w: ArrayLike<number>, n: number, k: number, m: number, bias?: ArrayLike<number>) {
  const out = new Float64Array(n * m);
  const mag = new Float64Array(n * m);
  for (let i = 0; i < n; i++)
    for (let j = 0; j < m; j++) {
      let s = bias ? bias[j] : 0;
      let a = bias ? Math.abs(bias[j]) : 0;
      for (let t = 0; t < k; t++) {
        const p = x[i * k + t] * w[j * k + t];
        s += p;
        a += Math.abs(p);
      }
      out[i * m + j] = s;
      mag[i * m + j] = a;
    }
  return { out, mag };
}

export function refRmsNorm(x: ArrayLike<number>, w: ArrayLike<number>, n: number, k: number, eps: number): Float64Array {
  const out = new Float64Array(n * k);
  for (let i = 0; i < n; i++) {
    let ss = 0;
    for (let j = 0; j < k; j++) ss += x[i * k + j] ** 2;
    const inv = 1 / Math.sqrt(ss / k + eps);
    for (let j = 0; j < k; j++) out[i * k + j] = x[i * k + j] * inv * w[j];
  }
  return out;
}

export function refLayerNorm(x: ArrayLike<number>, w: ArrayLike<number>, b: ArrayLike<number>, n: number, k: number, eps: number): Float64Array {
  const out = new Float64Array(n * k);
  for (let i = 0; i < n; i++) {
    let mean = 0;
    for (let j = 0; j < k; j++) mean += x[i * k + j];
    mean /= k;
    let v = 0;
    for (let j = 0; j < k; j++) v += (x[i * k + j] - mean) ** 2;
    const inv = 1 / Math.sqrt(v / k + eps);
    for (let j = 0; j < k; j++) out[i * k + j] = (x[i * k + j] - mean) * inv * w[j] + b[j];
  }
  return out;
}

/** Half-split rotary embedding over the first 2*half dims of every head. */
export function refRope(x: ArrayLike<number>, n: number, pos: Int32Array, heads: number, hd: number, cos: ArrayLike<number>, sin: ArrayLike<number>, half: number): Float64Array {
  const out = Float64Array.from(x);
  for (let i = 0; i < n; i++)
    for (let h = 0; h < heads; h++) {
      const base = i * heads * hd + h * hd;
      for (let j = 0; j < half; j++) {
        const c = cos[pos[i] * half + j];
        const s = sin[pos[i] * half + j];
        const a = x[base + j];
        const b = x[base + j + half];
        out[base + j] = a * c - b * s;
        out[base + j + half] = b * c + a * s;
      }
    }
  return out;
}

/** erf by Abramowitz-Stegun 7.1.26 is too coarse; use a series/continued fraction to ~1e-15. */
export function erf(x: number): number {
  const ax = Math.abs(x);
  if (ax < 2.5) {
    // Taylor series: erf x = 2/sqrt(pi) sum (-1)^n x^(2n+1) / (n! (2n+1))
    let term = ax;
    let sum = ax;
    for (let n = 1; n < 100; n++) {
      term *= (-ax * ax) / n;
      const t = term / (2 * n + 1);
      sum += t;
      if (Math.abs(t) < 1e-17) break;
    }
    return Math.sign(x) * (2 / Math.sqrt(Math.PI)) * sum;
  }
  // erfc continued fraction (Lentz) for large |x|
  let f = ax;
  let c = ax;
  let d = 0;
  for (let i = 1; i < 200; i++) {
    const an = i / 2;
    d = ax + an * d;
    d = 1 / d;
    c = ax + an / c;
    const delta = c * d;
    f *= delta;
    if (Math.abs(delta - 1) < 1e-16) break;
  }
  const erfc = Math.exp(-ax * ax) / Math.sqrt(Math.PI) / f;
  return Math.sign(x) * (1 - erfc);
}

export const refSilu = (g: number) => g / (1 + Math.exp(-g));
export const refGelu = (x: number) => 0.5 * x * (1 + erf(x / Math.SQRT2));

export function refSoftmax(x: ArrayLike<number>, rows: number, stride: number, cols: number): Float64Array {
  const out = Float64Array.from(x);
  for (let r = 0; r < rows; r++) {
    let mx = -Infinity;
    for (let j = 0; j < cols; j++) mx = Math.max(mx, x[r * stride + j]);
    let s = 0;
    for (let j = 0; j < cols; j++) s += Math.exp(x[r * stride + j] - mx);
    for (let j = 0; j < cols; j++) out[r * stride + j] = Math.exp(x[r * stride + j] - mx) / s;
  }
  return out;
}

/** logits[h, j] = scale q[h] . K[h / g, tok(j)]; K is [kvHeads, cap, d]. Returns values and error scale. */
export function refLogits(q: ArrayLike<number>, k: ArrayLike<number>, heads: number, kvHeads: number, d: number, cap: number, toks: number[], scale: number) {
  const g = heads / kvHeads;
  const out = new Float64Array(heads * toks.length);
  const mag = new Float64Array(heads * toks.length);
  for (let h = 0; h < heads; h++)
    for (let j = 0; j < toks.length; j++) {
      const kb = (Math.floor(h / g) * cap + toks[j]) * d;
      let s = 0;
      let a = 0;
      for (let i = 0; i < d; i++) {
        const p = q[h * d + i] * k[kb + i];
        s += p;
        a += Math.abs(p);
      }
      out[h * toks.length + j] = scale * s;
      mag[h * toks.length + j] = Math.abs(scale) * a;
    }
  return { out, mag };
}

/** out[h] = sum_j p[h, j] V[h / g, tok(j)]. Returns values and error scale. */
export function refAggregate(p: ArrayLike<number>, pstride: number, v: ArrayLike<number>, heads: number, kvHeads: number, d: number, cap: number, toks: number[]) {
  const g = heads / kvHeads;
  const out = new Float64Array(heads * d);
  const mag = new Float64Array(heads * d);
  for (let h = 0; h < heads; h++)
    for (let j = 0; j < toks.length; j++) {
      const vb = (Math.floor(h / g) * cap + toks[j]) * d;
      for (let i = 0; i < d; i++) {
        const t = p[h * pstride + j] * v[vb + i];
        out[h * d + i] += t;
        mag[h * d + i] += Math.abs(t);
      }
    }
  return { out, mag };
}
