/** The portable definition of native/kq.c in TypeScript: records, query quantization and the
 * approximate group-max scores, f32 step by f32 step (the native code must match it bit for bit). */
const f = Math.fround;
const CH = 32;
const padded = (d: number) => Math.ceil(d / CH) * CH;

/** round(x·inv) clamped to ±lim, ties to even (as the native adds and subtracts 1.5·2^23); NaN → 0. */
function quant(x: number, inv: number, lim: number): number {
  let v = f(x * inv);
  if (Number.isNaN(v)) return 0;
  v = v > lim ? lim : v < -lim ? -lim : v;
  return f(f(v + 12582912) - 12582912);
}

function absmax(x: ArrayLike<number>, from: number, to: number): number {
  let m = 0;
  for (let i = from; i < to; i++) {
    const a = Math.abs(x[i]);
    if (a > m) m = a;
  }
  return m;
}

export function refRowBytes(form: "int8" | "int4", d: number): number {
  const dp = padded(d);
  return form === "int8" ? dp + 4 : dp / 2 + 4 + dp / CH;
}

/** Records of rows [0, n) of K values ([kvHeads, n, d], already rounded to the store dtype). */
export function refEncode(form: "int8" | "int4", k: ArrayLike<number>, kvHeads: number, n: number, d: number): Uint8Array {
  const rb = refRowBytes(form, d), dp = padded(d), out = new Uint8Array(kvHeads * n * rb), dv = new DataView(out.buffer);
  for (let row = 0; row < kvHeads * n; row++) {
    const at = row * d, o = row * rb, m = absmax(k, at, at + d);
    if (form === "int8") {
      const s = f(m / 127), inv = m > 0 ? f(127 / m) : 0;
      for (let i = 0; i < dp; i++) out[o + i] = (i < d ? quant(k[at + i], inv, 127) : 0) + 128;
      dv.setFloat32(o + dp, s, true);
      continue;
    }
    const S = f(m / 1785);
    dv.setFloat32(o + dp / 2, S, true);
    for (let g = 0; g < dp / CH; g++) {
      const c0 = g * CH, c1 = Math.min(c0 + CH, d);
      const mg = c0 < d ? absmax(k, at + c0, at + c1) : 0;
      const e = m > 0 ? Math.min(255, Math.ceil(f(f(255 * mg) / m))) : 0;
      const step = f(S * e), inv = step > 0 ? f(1 / step) : 0;
      const nib = Array.from({ length: CH }, (_, i) => (c0 + i < d ? quant(k[at + c0 + i], inv, 7) : 0) + 8);
      for (let i = 0; i < CH / 2; i++) out[o + g * (CH / 2) + i] = nib[i] | (nib[CH / 2 + i] << 4);
      out[o + dp / 2 + 4 + g] = e;
    }
  }
  return out;
}

/** scores[g·n + j]: the max over KV head g's query heads of the quantized dot product with row j. */
export function refScores(form: "int8" | "int4", q: Float32Array, heads: number, kvHeads: number, d: number, rec: Uint8Array, n: number): Float32Array {
  const dp = padded(d), G = dp / CH, lim = form === "int8" ? 63 : 127, rb = refRowBytes(form, d), group = heads / kvHeads;
  const p: number[][] = [], t: number[] = [], corr: number[][] = [];
  for (let h = 0; h < heads; h++) {
    const m = absmax(q, h * d, (h + 1) * d), inv = m > 0 ? f(lim / m) : 0;
    t.push(f(m / lim));
    const ph = Array.from({ length: dp }, (_, i) => (i < d ? quant(q[h * d + i], inv, lim) : 0));
    p.push(ph);
    const c = new Array<number>(G).fill(0);
    for (let i = 0; i < dp; i++) c[form === "int8" ? 0 : Math.floor(i / CH)] += (form === "int8" ? 128 : 8) * ph[i];
    corr.push(c);
  }
  const dv = new DataView(rec.buffer, rec.byteOffset, rec.byteLength), out = new Float32Array(kvHeads * n);
  for (let g = 0; g < kvHeads; g++)
    for (let j = 0; j < n; j++) {
      const o = (g * n + j) * rb;
      let best = -Infinity;
      for (let h = g * group; h < (g + 1) * group; h++) {
        let dot = 0;
        if (form === "int8") {
          dot = -corr[h][0];
          for (let i = 0; i < dp; i++) dot += rec[o + i] * p[h][i];
        } else {
          for (let c = 0; c < G; c++) {
            let part = -corr[h][c];
            for (let i = 0; i < CH / 2; i++) {
              const x = rec[o + c * (CH / 2) + i];
              part += (x & 15) * p[h][c * CH + i] + (x >> 4) * p[h][c * CH + CH / 2 + i];
            }
            dot += rec[o + dp / 2 + 4 + c] * part;
          }
        }
        const v = f(t[h] * f(dot));
        if (v > best) best = v;
      }
      out[g * n + j] = f(dv.getFloat32(o + (form === "int8" ? dp : dp / 2), true) * best);
    }
  return out;
}
