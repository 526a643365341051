import { describe, expect, it } from "vitest";
import type { DType } from "@hybridgen/spec";
import { CONFIGS, backend, encode, expectClose, randn, rng } from "./helpers.js";
import { refGelu, refLayerNorm, refRmsNorm, refRope, refSilu, refSoftmax } from "./reference.js";

// Row counts and widths straddle the vector widths and the threading threshold (work >= 24576).
const ROWS = [
  { n: 1, k: 37 },
  { n: 3, k: 289 },
  { n: 97, k: 301 },
];
const rel = (want: Float64Array, r: number, a: number) => want.map((v) => r * Math.abs(v) + a);

describe.each(CONFIGS)("row ops isa=$isa threads=$threads", (cfg) => {
  it.each(["f32", "f16", "bf16"] as DType[])("rmsNorm and layerNorm (%s parameters), in place and not", (dtype) => {
    // Tolerance 1e-5 relative + 1e-6: sum of squares in f32 then a few roundings per element.
    using be = backend(cfg);
    let seed = 3;
    for (const { n, k } of ROWS) {
      const r = rng(seed++);
      const x = randn(r, n * k, 3);
      const w = encode(randn(r, k), dtype);
      const b = encode(randn(r, k), dtype);
      const wt = be.loadWeight(w.bytes, dtype, [k]);
      const bt = be.loadWeight(b.bytes, dtype, [k]);
      const xt = be.alloc([n, k]);
      const ot = be.alloc([n, k]);
      be.write(xt, x);
      be.rmsNorm(ot, xt, wt, n, 1e-5);
      let want = refRmsNorm(x, w.decoded, n, k, 1e-5);
      expectClose(be.read(ot), want, rel(want, 1e-5, 1e-6), `rmsNorm n=${n} k=${k}`);
      be.rmsNorm(xt, xt, wt, n, 1e-5);
      expectClose(be.read(xt), want, rel(want, 1e-5, 1e-6), `rmsNorm in place n=${n} k=${k}`);
      be.write(xt, x);
      be.layerNorm(ot, xt, wt, bt, n, 1e-5);
      want = refLayerNorm(x, w.decoded, b.decoded, n, k, 1e-5);
      expectClose(be.read(ot), want, rel(want, 1e-5, 1e-5), `layerNorm n=${n} k=${k}`);
      be.layerNorm(xt, xt, wt, bt, n, 1e-5);
      expectClose(be.read(xt), want, rel(want, 1e-5, 1e-5), `layerNorm in place n=${n} k=${k}`);
    }
  });

  it("rope: full and partial rotary, positions from the tables", () => {
    // Tolerance 1e-6 absolute: two products and a sum per element, values of order 1.
    using be = backend(cfg);
    const r = rng(5);
    for (const { n, heads, hd, half } of [
      { n: 1, heads: 6, hd: 48, half: 24 },
      { n: 9, heads: 3, hd: 38, half: 19 },
      { n: 70, heads: 8, hd: 64, half: 16 },
    ]) {
      const maxPos = 100;
      const cos = new Float32Array(maxPos * half);
      const sin = new Float32Array(maxPos * half);
      for (let p = 0; p < maxPos; p++)
        for (let j = 0; j < half; j++) {
          const angle = p / 10000 ** (j / half);
          cos[p * half + j] = Math.cos(angle);
          sin[p * half + j] = Math.sin(angle);
        }
      const ct = be.alloc([maxPos, half]);
      const st = be.alloc([maxPos, half]);
      be.write(ct, cos);
      be.write(st, sin);
      const x = randn(r, n * heads * hd);
      const xt = be.alloc([n, heads * hd]);
      be.write(xt, x);
      const pos = Int32Array.from({ length: n }, () => Math.floor(r() * maxPos));
      be.rope(xt, n, pos, heads, hd, ct, st);
      expectClose(be.read(xt), refRope(x, n, pos, heads, hd, cos, sin, half), 1e-6, `rope n=${n} heads=${heads} hd=${hd} rot=${2 * half}`);
    }
  });

  it("siluMul, relu, gelu, add (with aliasing)", () => {
    using be = backend(cfg);
    let seed = 9;
    for (const { n, k } of ROWS) {
      const r = rng(seed++);
      const g = randn(r, n * k, 8);
      const u = randn(r, n * k, 2);
      const gt = be.alloc([n, k]);
      const ut = be.alloc([n, k]);
      const ot = be.alloc([n, k]);
      be.write(gt, g);
      be.write(ut, u);
      // silu: vector exp is within ~2 ulp -> 4e-6 relative + 1e-7
      let want = Float64Array.from(g, (v, i) => refSilu(v) * u[i]);
      be.siluMul(ot, gt, ut, n);
      expectClose(be.read(ot), want, rel(want, 4e-6, 1e-7), `siluMul n=${n} k=${k}`);
      be.siluMul(gt, gt, ut, n);
      expectClose(be.read(gt), want, rel(want, 4e-6, 1e-7), `siluMul aliasing gate n=${n} k=${k}`);
      // add: one rounding
      be.write(gt, g);
      want = Float64Array.from(g, (v, i) => v + u[i]);
      be.add(ot, gt, ut, n);
      expectClose(be.read(ot), want, rel(want, 1.2e-7, 0), `add n=${n} k=${k}`);
      be.add(ut, gt, ut, n);
      expectClose(be.read(ut), want, rel(want, 1.2e-7, 0), `add aliasing b n=${n} k=${k}`);
      // relu: exact
      be.relu(gt, n);
      expectClose(be.read(gt), Float64Array.from(g, (v) => Math.max(v, 0)), 0, `relu n=${n}`);
      // gelu with erf: erff is within a few ulp -> 2e-6 relative + 1e-7
      be.write(gt, g);
      be.gelu(gt, n);
      want = Float64Array.from(g, refGelu);
      expectClose(be.read(gt), want, rel(want, 2e-6, 1e-7), `gelu n=${n} k=${k}`);
    }
  });

  it("softmax over the first cols columns; argmax takes the first maximum", () => {
    // softmax: 4e-6 relative + 1e-9 (vector exp, one f32 sum per row).
    using be = backend(cfg);
    const r = rng(13);
    for (const { rows, stride, cols } of [
      { rows: 1, stride: 40, cols: 37 },
      { rows: 6, stride: 300, cols: 289 },
      { rows: 32, stride: 1030, cols: 1025 },
    ]) {
      const x = randn(r, rows * stride, 10);
      const xt = be.alloc([rows, stride]);
      be.write(xt, x);
      be.softmax(xt, rows, cols);
      const want = refSoftmax(x, rows, stride, cols);
      expectClose(be.read(xt), want, rel(want, 4e-6, 1e-9), `softmax rows=${rows} cols=${cols}`);
    }
    for (const cols of [1, 7, 37, 32000]) {
      const x = randn(r, 3 * cols);
      const row = 1;
      const pick = Math.floor(r() * cols);
      x[cols + pick] = 5;
      if (pick + 1 < cols) x[cols + cols - 1] = 5; // a later tie must lose
      const xt = be.alloc([3, cols]);
      be.write(xt, x);
      expect(be.argmax(xt, row), `argmax cols=${cols}`).toBe(pick);
    }
  });

  it.each(["f32", "f16", "bf16"] as DType[])("embedding from a %s table", (dtype) => {
    using be = backend(cfg);
    const r = rng(17);
    const vocab = 1000;
    const dim = 37;
    const t = encode(randn(r, vocab * dim), dtype);
    const tt = be.loadWeight(t.bytes, dtype, [vocab, dim]);
    const ids = Int32Array.from({ length: 11 }, () => Math.floor(r() * vocab));
    ids[10] = vocab - 1;
    const ot = be.alloc([12, dim]);
    be.embedding(ot, tt, ids);
    const want = new Float64Array(11 * dim);
    ids.forEach((id, i) => want.set(t.decoded.subarray(id * dim, (id + 1) * dim), i * dim));
    expectClose(be.read(ot, 0, 11 * dim), want, 0, `embedding ${dtype}`);
  });
});
