import { describe, it } from "vitest";
import type { DType } from "@hybridgen/spec";
import { CONFIGS, backend, encode, expectClose, randn, rng } from "./helpers.js";
import { refAggregate, refLogits } from "./reference.js";

// Tolerance: 1e-5 * sum |terms| + 1e-6 (f32 accumulation over head_dim or tokens; see matmul).
const DTYPES: DType[] = ["f32", "f16", "bf16"];
// Group sizes 3, 8, 5 (a 4-head block + remainder), 1, 4; head dims on and off the vector
// widths (4/8/16) so vector bodies, the single-vector step and scalar tails all run.
const LAYOUTS = [
  { heads: 6, kvHeads: 2, d: 37 },
  { heads: 8, kvHeads: 1, d: 64 },
  { heads: 10, kvHeads: 2, d: 37 },
  { heads: 4, kvHeads: 4, d: 20 },
  { heads: 12, kvHeads: 3, d: 24 },
];

function span(start: number, count: number): number[] {
  return Array.from({ length: count }, (_, j) => start + j);
}

describe.each(CONFIGS)("attention isa=$isa threads=$threads", (cfg) => {
  it.each(DTYPES)("logits over a span and a gathered set, %s K", (dtype) => {
    using be = backend(cfg);
    let seed = 11;
    for (const { heads, kvHeads, d } of LAYOUTS) {
      const r = rng(seed++ * 104729 + dtype.length);
      const cap = 301;
      const k = encode(randn(r, kvHeads * cap * d), dtype);
      const q = randn(r, 2 * heads * d);
      const kt = be.alloc([kvHeads, cap, d], dtype);
      be.copyRows(kt, 0, be.loadWeight(k.bytes, dtype, [kvHeads * cap, d]), 0, kvHeads * cap);
      const qt = be.alloc([2, heads * d]);
      be.write(qt, q);
      const width = 260;
      const scale = 1 / Math.sqrt(d);
      for (const [start, count, outCol] of [[17, 211, 5], [0, 3, 0], [290, 11, 249]]) {
        const lt = be.alloc([heads, width]);
        be.attnLogits(lt, outCol, qt, 1, kt, start, count, scale);
        const ref = refLogits(q.subarray(heads * d), k.decoded, heads, kvHeads, d, cap, span(start, count), scale);
        const got = be.read(lt);
        const sel = new Float64Array(heads * count);
        for (let h = 0; h < heads; h++) for (let j = 0; j < count; j++) sel[h * count + j] = got[h * width + outCol + j];
        expectClose(sel, ref.out, ref.mag.map((a) => 1e-5 * a + 1e-6), `attnLogits ${dtype} h=${heads}/${kvHeads} d=${d} start=${start}`);
        // columns outside [outCol, outCol + count) stay zero
        let outside = 0;
        for (let h = 0; h < heads; h++) for (let c = 0; c < width; c++) if ((c < outCol || c >= outCol + count) && got[h * width + c] !== 0) outside++;
        expectClose([outside], [0], 0, "attnLogits writes only its columns");
      }
      const slots = Int32Array.from({ length: 150 }, () => Math.floor(r() * cap));
      slots[3] = slots[4]; // repeats are allowed
      const lt = be.alloc([heads, 160]);
      be.attnLogitsGather(lt, 7, qt, 0, kt, slots, scale);
      const ref = refLogits(q, k.decoded, heads, kvHeads, d, cap, [...slots], scale);
      const got = be.read(lt);
      const sel = new Float64Array(heads * slots.length);
      for (let h = 0; h < heads; h++) for (let j = 0; j < slots.length; j++) sel[h * slots.length + j] = got[h * 160 + 7 + j];
      expectClose(sel, ref.out, ref.mag.map((a) => 1e-5 * a + 1e-6), `attnLogitsGather ${dtype} h=${heads}/${kvHeads} d=${d}`);
    }
  });

  it.each(DTYPES)("aggregate over a span and a gathered set, overwrite and accumulate, %s V", (dtype) => {
    using be = backend(cfg);
    let seed = 23;
    for (const { heads, kvHeads, d } of LAYOUTS) {
      const r = rng(seed++ * 15485863 + dtype.length);
      const cap = 301;
      const v = encode(randn(r, kvHeads * cap * d), dtype);
      const vt = be.loadWeight(v.bytes, dtype, [kvHeads, cap, d]);
      const width = 270;
      const probs = Float32Array.from(randn(r, heads * width), (x) => Math.abs(x) / 50);
      const pt = be.alloc([heads, width]);
      be.write(pt, probs);
      const ot = be.alloc([3, heads * d]);
      for (const [start, count, probCol] of [[13, 233, 30], [0, 5, 0], [295, 6, 264]]) {
        for (const accumulate of [false, true]) {
          const init = randn(r, heads * d);
          be.write(ot, init, 2 * heads * d);
          be.attnAggregate(ot, 2, pt, probCol, vt, start, count, accumulate);
          const shifted = probs.subarray(probCol);
          const ref = refAggregate(shifted, width, v.decoded, heads, kvHeads, d, cap, span(start, count));
          const want = ref.out.map((x, i) => x + (accumulate ? init[i] : 0));
          const tol = ref.mag.map((a, i) => 1e-5 * (a + (accumulate ? Math.abs(init[i]) : 0)) + 1e-6);
          expectClose(be.read(ot, 2 * heads * d, heads * d), want, tol, `attnAggregate ${dtype} h=${heads}/${kvHeads} start=${start} acc=${accumulate}`);
        }
      }
      const slots = Int32Array.from({ length: 97 }, () => Math.floor(r() * cap));
      for (const accumulate of [false, true]) {
        const init = randn(r, heads * d);
        be.write(ot, init, 0);
        be.attnAggregateGather(ot, 0, pt, 11, vt, slots, accumulate);
        const ref = refAggregate(probs.subarray(11), width, v.decoded, heads, kvHeads, d, cap, [...slots]);
        const want = ref.out.map((x, i) => x + (accumulate ? init[i] : 0));
        const tol = ref.mag.map((a, i) => 1e-5 * (a + (accumulate ? Math.abs(init[i]) : 0)) + 1e-6);
        expectClose(be.read(ot, 0, heads * d), want, tol, `attnAggregateGather ${dtype} h=${heads}/${kvHeads} acc=${accumulate}`);
      }
    }
  });
});
