import { describe, expect, it } from "vitest";
import { HybridgenError, ReferenceBackend, type DType } from "../src/index.js";
import { encodeFromF32, roundTo } from "@hybridgen/spec";
import { makeRng, maxAbsDiff, randomArray, testSeed } from "../src/testing/index.js";

// Tolerances: outputs are stored as f32, so a relative error of a few f32 ulps (1e-6) on
// values of order 1..10 is all the reference may differ from these f64 computations by.
const TOL = 1e-5;

function weightOf(be: ReferenceBackend, values: Float32Array, dtype: DType, shape: number[]) {
  return be.loadWeight(encodeFromF32(values, dtype), dtype, shape);
}

describe("ReferenceBackend ops vs straightforward f64", () => {
  const rng = makeRng(testSeed(11));

  for (const dtype of ["f32", "f16", "bf16"] as DType[]) {
    it(`matmul with ${dtype} weights, bias, n=1 and n=3`, () => {
      const be = new ReferenceBackend();
      const k = 37, m = 13, n = 3;
      const wv = randomArray(rng, m * k), xv = randomArray(rng, n * k), bv = randomArray(rng, m);
      const w = weightOf(be, wv, dtype, [m, k]);
      const bias = weightOf(be, bv, "f32", [m]);
      const x = be.alloc([n, k]);
      be.write(x, xv);
      for (const rowsUsed of [1, n]) {
        const out = be.alloc([n, m]);
        be.matmul(out, x, w, rowsUsed, bias);
        const want = new Float64Array(n * m);
        for (let i = 0; i < rowsUsed; i++)
          for (let j = 0; j < m; j++) {
            let s = bv[j];
            for (let c = 0; c < k; c++) s += xv[i * k + c] * roundTo(dtype, wv[j * k + c]);
            want[i * m + j] = s;
          }
        expect(maxAbsDiff(be.read(out), want)).toBeLessThan(TOL);
      }
    });
  }

  it("rmsNorm and layerNorm (out aliasing x)", () => {
    const be = new ReferenceBackend();
    const d = 29, n = 4;
    const xv = randomArray(rng, n * d, 3), wv = randomArray(rng, d), bv = randomArray(rng, d);
    const x = be.alloc([n, d]), w = weightOf(be, wv, "f32", [d]), b = weightOf(be, bv, "f32", [d]);
    be.write(x, xv);
    be.rmsNorm(x, x, w, n, 1e-5);
    const want = new Float64Array(n * d);
    for (let i = 0; i < n; i++) {
      let ss = 0;
      for (let c = 0; c < d; c++) ss += xv[i * d + c] ** 2;
      for (let c = 0; c < d; c++) want[i * d + c] = (xv[i * d + c] / Math.sqrt(ss / d + 1e-5)) * wv[c];
    }
    expect(maxAbsDiff(be.read(x), want)).toBeLessThan(TOL);

    const y = be.alloc([n, d]);
    be.write(y, xv);
    be.layerNorm(y, y, w, b, n, 1e-5);
    for (let i = 0; i < n; i++) {
      const row = Array.from(xv.subarray(i * d, (i + 1) * d));
      const mean = row.reduce((a, v) => a + v, 0) / d;
      const v = row.reduce((a, x) => a + (x - mean) ** 2, 0) / d;
      for (let c = 0; c < d; c++) want[i * d + c] = ((row[c] - mean) / Math.sqrt(v + 1e-5)) * wv[c] + bv[c];
    }
    expect(maxAbsDiff(be.read(y), want)).toBeLessThan(TOL);
  });

  it("rope rotates half-split pairs by position angles (partial rotary leaves the tail)", () => {
    const be = new ReferenceBackend();
    const heads = 3, headDim = 10, rot = 8, half = rot / 2, maxPos = 20, n = 3;
    const theta = 10000;
    const cosv = new Float32Array(maxPos * half), sinv = new Float32Array(maxPos * half);
    for (let p = 0; p < maxPos; p++)
      for (let j = 0; j < half; j++) {
        const ang = p * theta ** (-(2 * j) / rot);
        cosv[p * half + j] = Math.cos(ang);
        sinv[p * half + j] = Math.sin(ang);
      }
    const cos = weightOf(be, cosv, "f32", [maxPos, half]), sin = weightOf(be, sinv, "f32", [maxPos, half]);
    const xv = randomArray(rng, n * heads * headDim);
    const x = be.alloc([n, heads * headDim]);
    be.write(x, xv);
    const positions = Int32Array.from([0, 7, 19]);
    be.rope(x, n, positions, heads, headDim, cos, sin);
    // Independent formulation: complex multiplication of (x_j + i x_{j+half}) by e^{i·angle}.
    const want = Float64Array.from(xv);
    for (let i = 0; i < n; i++)
      for (let h = 0; h < heads; h++)
        for (let j = 0; j < half; j++) {
          const base = i * heads * headDim + h * headDim;
          const ang = positions[i] * Math.exp((-(2 * j) / rot) * Math.log(theta));
          const re = xv[base + j], im = xv[base + j + half];
          want[base + j] = re * Math.cos(ang) - im * Math.sin(ang);
          want[base + j + half] = re * Math.sin(ang) + im * Math.cos(ang);
        }
    expect(maxAbsDiff(be.read(x), want)).toBeLessThan(TOL);
  });

  it("siluMul, add, relu, gelu, softmax, argmax", () => {
    const be = new ReferenceBackend();
    const d = 17, n = 2;
    const gv = randomArray(rng, n * d, 4), uv = randomArray(rng, n * d, 4);
    const g = be.alloc([n, d]), u = be.alloc([n, d]);
    be.write(g, gv);
    be.write(u, uv);
    be.siluMul(g, g, u, n);
    expect(maxAbsDiff(be.read(g), gv.map((v, i) => (v / (1 + Math.exp(-v))) * uv[i]))).toBeLessThan(TOL);

    be.write(g, gv);
    be.add(g, g, u, 1); // only the first row
    const added = Float64Array.from(gv, (v, i) => (i < d ? v + uv[i] : v));
    expect(maxAbsDiff(be.read(g), added)).toBeLessThan(TOL);

    be.write(g, gv);
    be.relu(g, n);
    expect(maxAbsDiff(be.read(g), gv.map((v) => Math.max(0, v)))).toBe(0);

    // GELU against erf by Simpson integration of 2/√π·e^{-t²} (independent of the series).
    const erfNum = (x: number) => {
      const steps = 2000, h = x / steps;
      let s = 0;
      for (let i = 0; i <= steps; i++) s += (i === 0 || i === steps ? 1 : i % 2 ? 4 : 2) * Math.exp(-((i * h) ** 2));
      return ((s * h) / 3) * (2 / Math.sqrt(Math.PI));
    };
    be.write(g, gv);
    be.gelu(g, n);
    expect(maxAbsDiff(be.read(g), gv.map((v) => 0.5 * v * (1 + erfNum(v / Math.SQRT2))))).toBeLessThan(TOL);

    const sv = randomArray(rng, 3 * 9, 5);
    const s = be.alloc([3, 9]);
    be.write(s, sv);
    be.softmax(s, 2, 6);
    const got = be.read(s);
    for (let r = 0; r < 3; r++)
      for (let j = 0; j < 9; j++) {
        const i = r * 9 + j;
        if (r >= 2 || j >= 6) expect(got[i]).toBe(sv[i]); // untouched outside rows × cols
        else {
          let z = 0;
          for (let c = 0; c < 6; c++) z += Math.exp(sv[r * 9 + c]);
          expect(Math.abs(got[i] - Math.exp(sv[i]) / z)).toBeLessThan(1e-6);
        }
      }

    const a = be.alloc([2, 5]);
    be.write(a, Float32Array.from([1, 3, 3, 2, 0, -1, -2, -0.5, -0.5, -3]));
    expect(be.argmax(a, 0)).toBe(1);
    expect(be.argmax(a, 1)).toBe(2);
  });

  it("embedding gathers rows of a bf16 table as f32", () => {
    const be = new ReferenceBackend();
    const vocab = 11, d = 6;
    const tv = randomArray(rng, vocab * d);
    const table = weightOf(be, tv, "bf16", [vocab, d]);
    const out = be.alloc([4, d]);
    const ids = Int32Array.from([3, 10, 0, 3]);
    be.embedding(out, table, ids);
    const want = new Float64Array(4 * d);
    ids.forEach((id, i) => { for (let c = 0; c < d; c++) want[i * d + c] = roundTo("bf16", tv[id * d + c]); });
    expect(maxAbsDiff(be.read(out), want)).toBe(0);
  });

  for (const kvDtype of ["f32", "f16"] as DType[]) {
    it(`attention stages with GQA over ${kvDtype} K/V: segments at column offsets == one pass`, () => {
      const be = new ReferenceBackend();
      const heads = 4, kvHeads = 2, headDim = 5, cap = 12, width = 16, group = heads / kvHeads;
      const kv = randomArray(rng, kvHeads * cap * headDim), vv = randomArray(rng, kvHeads * cap * headDim);
      const qv = randomArray(rng, 2 * heads * headDim);
      const K = be.alloc([kvHeads, cap, headDim], kvDtype), V = be.alloc([kvHeads, cap, headDim], kvDtype);
      be.write(K, kv);
      be.write(V, vv);
      const q = be.alloc([2, heads * headDim]);
      be.write(q, qv);
      const scale = 1 / Math.sqrt(headDim);
      // Tokens: slots 2..5 (span), then gathered slots [9, 0, 7].
      const slots = Int32Array.from([9, 0, 7]);
      const order = [2, 3, 4, 5, 9, 0, 7];
      const logits = be.alloc([heads, width]);
      be.attnLogits(logits, 1, q, 1, K, 2, 4, scale);
      be.attnLogitsGather(logits, 5, q, 1, K, slots, scale);
      const got = be.read(logits);
      const wantP = new Float64Array(heads * order.length);
      for (let h = 0; h < heads; h++) {
        const g = Math.floor(h / group);
        order.forEach((slot, j) => {
          let dot = 0;
          for (let c = 0; c < headDim; c++)
            dot += qv[heads * headDim + h * headDim + c] * roundTo(kvDtype, kv[(g * cap + slot) * headDim + c]);
          expect(Math.abs(got[h * width + 1 + j] - dot * scale)).toBeLessThan(TOL);
          wantP[h * order.length + j] = dot * scale;
        });
        expect(got[h * width]).toBe(0); // column 0 untouched
      }
      // Softmax over columns [1, 8) of each row is done by hand: shift left by viewing from column 1.
      const probs = be.alloc([heads, width]);
      const pv = new Float32Array(heads * width);
      for (let h = 0; h < heads; h++) {
        let z = 0;
        for (let j = 0; j < order.length; j++) z += Math.exp(wantP[h * order.length + j]);
        for (let j = 0; j < order.length; j++) pv[h * width + 3 + j] = Math.exp(wantP[h * order.length + j]) / z;
      }
      be.write(probs, pv);
      const out = be.alloc([3, heads * headDim]);
      be.write(out, randomArray(rng, 3 * heads * headDim)); // garbage that `accumulate: false` must overwrite
      be.attnAggregate(out, 2, probs, 3, V, 2, 4, false);
      be.attnAggregateGather(out, 2, probs, 7, V, slots, true);
      const o = be.read(out);
      for (let h = 0; h < heads; h++) {
        const g = Math.floor(h / group);
        for (let c = 0; c < headDim; c++) {
          let s = 0;
          order.forEach((slot, j) => { s += pv[h * width + 3 + j] * roundTo(kvDtype, vv[(g * cap + slot) * headDim + c]); });
          expect(Math.abs(o[2 * heads * headDim + h * headDim + c] - s)).toBeLessThan(TOL);
        }
      }
    });
  }

  it("copyRows converts f32 → f16, views alias without copying", () => {
    const be = new ReferenceBackend();
    const src = be.alloc([4, 3]);
    const sv = randomArray(rng, 12);
    be.write(src, sv);
    const dst = be.alloc([2, 5, 3], "f16");
    be.copyRows(dst, 6, src, 1, 2);
    const got = be.read(dst, 18, 6);
    expect(Array.from(got)).toEqual(Array.from(sv.subarray(3, 9), (v) => roundTo("f16", v)));
    const v = be.view(src, 3, [3, 2]); // rows of width 2 over elements 3..8
    be.write(v, Float32Array.from([1, 2, 3, 4, 5, 6]));
    expect(Array.from(be.read(src, 3, 6))).toEqual([1, 2, 3, 4, 5, 6]);
    be.free(v);
    expect(be.liveTensors()).toBe(2);
  });
});

describe("ReferenceBackend's batched window ops", () => {
  const rng = makeRng(testSeed(12));
  it("appendKvRows writes what copyRows of each KV head's row writes (bf16 windows); attnPartialRows what each row's attnPartial writes", () => {
    const be = new ReferenceBackend();
    const kvHeads = 2, cap = 6, hd = 4, heads = 4;
    const win = () => be.alloc([kvHeads, cap, hd], "bf16");
    const k = [win(), win()], v = [win(), win()], k2 = [win(), win()], v2 = [win(), win()];
    const kNew = be.alloc([2, kvHeads * hd]), vNew = be.alloc([2, kvHeads * hd]);
    be.write(kNew, randomArray(rng, 2 * kvHeads * hd));
    be.write(vNew, randomArray(rng, 2 * kvHeads * hd));
    const rowOf = (t: typeof kNew, i: number) => be.view(t, i * kvHeads * hd, [kvHeads, hd]);
    be.appendKvRows([0, 1].map((i) => ({ k: k[i]!, v: v[i]!, slot: 3 + i, kNew: rowOf(kNew, i), vNew: rowOf(vNew, i) })));
    for (const i of [0, 1]) {
      for (let g = 0; g < kvHeads; g++) {
        be.copyRows(k2[i]!, g * cap + 3 + i, rowOf(kNew, i), g, 1);
        be.copyRows(v2[i]!, g * cap + 3 + i, rowOf(vNew, i), g, 1);
      }
      expect(Array.from(be.read(k[i]!))).toEqual(Array.from(be.read(k2[i]!)));
      expect(Array.from(be.read(v[i]!))).toEqual(Array.from(be.read(v2[i]!)));
    }
    expect(() => be.appendKvRows([{ k: k[0]!, v: v[0]!, slot: cap, kNew: rowOf(kNew, 0), vNew: rowOf(vNew, 0) }])).toThrow(/slot/);
    expect(() => be.appendKvRows([])).toThrow(/appendKvRows: 1 row or more is needed/);
    const q = be.alloc([2, heads * hd]);
    be.write(q, randomArray(rng, 2 * heads * hd));
    const parts = [be.alloc([heads, hd + 2]), be.alloc([heads, hd + 2])], alone = be.alloc([heads, hd + 2]);
    const spans = [Int32Array.of(0, 2, 4, 2), Int32Array.of(1, 5)];
    be.attnPartialRows([0, 1].map((i) => ({ part: parts[i]!, q, qRow: i, k: k[i]!, v: v[i]!, spans: spans[i]!, scale: 0.5 })));
    for (const i of [0, 1]) {
      be.attnPartial(alone, q, i, k[i]!, v[i]!, spans[i]!, 0.5);
      expect(Array.from(be.read(parts[i]!))).toEqual(Array.from(be.read(alone)));
    }
  });
});

describe("ReferenceBackend input validation", () => {
  const expectErr = (fn: () => unknown, re: RegExp) => {
    let err: unknown;
    try { fn(); } catch (e) { err = e; }
    expect(err).toBeInstanceOf(HybridgenError);
    expect((err as Error).message).toMatch(re);
    expect((err as Error).message).not.toContain("\n");
  };

  it("rejects foreign, freed and closed-backend tensors, double free, stale views", () => {
    const a = new ReferenceBackend(), b = new ReferenceBackend();
    const t = a.alloc([2, 2]);
    expectErr(() => b.read(t), /does not belong/);
    const v = a.view(t, 0, [4]);
    a.free(t);
    expectErr(() => a.read(t), /after free/);
    expectErr(() => a.read(v), /after free/);
    expectErr(() => a.free(t), /double free/);
    const u = a.alloc([1]);
    a.close();
    expectErr(() => a.read(u), /after close/);
    expectErr(() => a.alloc([1]), /after close/);
  });

  it("rejects bad shapes, byte counts, ids, slots, rows and widths", () => {
    const be = new ReferenceBackend();
    expectErr(() => be.alloc([2, 0]), /bad shape/);
    expectErr(() => be.loadWeight(new Uint8Array(10), "f32", [3]), /10 bytes/);
    const table = be.alloc([5, 4]), out = be.alloc([2, 4]);
    expectErr(() => be.embedding(out, table, Int32Array.from([5])), /token id 5 out of range/);
    expectErr(() => be.embedding(out, table, Int32Array.from([1, 2, 3])), /3 rows requested/);
    const w = be.alloc([3, 5]);
    expectErr(() => be.matmul(be.alloc([1, 3]), out, w, 1), /x rows have 4 values, expected 5/);
    expectErr(() => be.matmul(be.alloc([1, 3]), be.alloc([1, 5]), w, 2), /2 rows requested/);
    const K = be.alloc([2, 6, 4]), logits = be.alloc([4, 8]), q = be.alloc([1, 16]);
    expectErr(() => be.attnLogits(logits, 0, q, 0, K, 3, 4, 1), /start 3 out of range/);
    expectErr(() => be.attnLogits(logits, 6, q, 0, K, 0, 3, 1), /column 6 out of range/);
    expectErr(() => be.attnLogitsGather(logits, 0, q, 0, K, Int32Array.from([1, 6]), 1), /slot 6 out of range/);
    expectErr(() => be.attnLogits(logits, 0, q, 1, K, 0, 1, 1), /qRow 1 out of range/);
    expectErr(() => be.copyRows(K, 0, w, 0, 1), /row widths differ/);
    expectErr(() => be.copyRows(be.alloc([2, 4], "bf16"), 0, be.alloc([2, 4], "f16"), 0, 1), /cannot copy f16 rows into bf16/);
    expectErr(() => be.copyRows(K, 11, table, 0, 2), /dstRow 11 out of range/);
    expectErr(() => be.view(table, 18, [3]), /offset 18 out of range/);
    expectErr(() => be.matmul(out, out, be.alloc([4, 4], "f16"), 1, be.alloc([3])), /bias has 3 values/);
  });
});
