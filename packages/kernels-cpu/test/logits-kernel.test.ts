import { describe, expect, it } from "vitest";
import type { DType } from "@hybridgen/spec";
import { createCpuBackend, NativeCpuStage } from "../src/index.js";
import { refLogits } from "./reference.js";
import { SEED, backend, encode, expectClose, randn, rng, supportedIsas } from "./helpers.js";

// The logits kernel's own code paths (native/kernels_logits.c): the compile-time head dims 64 and
// 128 next to run-time ones (130 leaves a tail on every ISA), span and gather instances, full
// 16-row tiles and a short last tile, 4-head blocks, the 2- and 1-head blocks of a remainder and the
// zero head that pads a group of 4k+3 (g = 7, 3), and gathers long enough to prefetch.
// Tolerance: 1e-5 * sum |terms| + 1e-6, as in attention.test.ts.
const LAYOUTS = [
  { heads: 32, kvHeads: 8, d: 128 }, // Llama-3-8B: g = 4
  { heads: 14, kvHeads: 2, d: 128 }, // g = 7: a 4-head block and a padded one
  { heads: 6, kvHeads: 3, d: 64 }, // g = 2
  { heads: 3, kvHeads: 3, d: 128 }, // g = 1
  { heads: 12, kvHeads: 4, d: 130 }, // g = 3, a run-time head dim with a tail
];
const DTYPES: DType[] = ["f32", "f16", "bf16"];

describe.each(supportedIsas())(`logits kernel isa=%s (seed ${SEED})`, (isa) => {
  it.each(DTYPES)("span and gather over every block shape, %s K", (dtype) => {
    using be = backend({ isa, threads: 2 });
    let seed = 5;
    for (const { heads, kvHeads, d } of LAYOUTS) {
      const r = rng(seed++ * 7919 + dtype.length);
      const cap = 120;
      const k = encode(randn(r, kvHeads * cap * d), dtype);
      const q = randn(r, heads * d);
      const kt = be.loadWeight(k.bytes, dtype, [kvHeads, cap, d]);
      const qt = be.alloc([1, heads * d]);
      be.write(qt, q);
      const scale = 1 / Math.sqrt(d);
      const width = 100;
      const tol = (mag: Float64Array) => mag.map((a) => 1e-5 * a + 1e-6);
      const check = (got: Float32Array, col: number, count: number, toks: number[], what: string) => {
        const ref = refLogits(q, k.decoded, heads, kvHeads, d, cap, toks, scale);
        const sel = new Float64Array(heads * count);
        for (let h = 0; h < heads; h++) for (let j = 0; j < count; j++) sel[h * count + j] = got[h * width + col + j];
        expectClose(sel, ref.out, tol(ref.mag), `${what} ${dtype} h=${heads}/${kvHeads} d=${d}`);
      };
      // 83 tokens = 5 full tiles + 3, starting off a tile boundary
      const lt = be.alloc([heads, width]);
      be.attnLogits(lt, 9, qt, 0, kt, 29, 83, scale);
      check(be.read(lt), 9, 83, Array.from({ length: 83 }, (_, j) => 29 + j), "span");
      // a gather longer than the prefetch distance, with repeats
      const slots = Int32Array.from({ length: 90 }, () => Math.floor(r() * cap));
      slots[40] = slots[41];
      const gt = be.alloc([heads, width]);
      be.attnLogitsGather(gt, 3, qt, 0, kt, slots, scale);
      check(be.read(gt), 3, 90, [...slots], "gather");
      for (const t of [lt, gt, qt]) be.free(t);
    }
  });

  it("every logit is the same bits whatever the thread count or where a range starts", () => {
    const { heads, kvHeads, d } = { heads: 14, kvHeads: 2, d: 128 };
    const r = rng(77);
    const cap = 300;
    for (const dtype of DTYPES) {
      const k = encode(randn(r, kvHeads * cap * d), dtype);
      const q = randn(r, heads * d);
      const runs: Float32Array[] = [];
      for (const threads of [1, 2, 3]) {
        using be = createCpuBackend({ isa, threads });
        const kt = be.loadWeight(k.bytes, dtype, [kvHeads, cap, d]);
        const qt = be.alloc([1, heads * d]);
        be.write(qt, q);
        const whole = be.alloc([heads, cap]);
        be.attnLogits(whole, 0, qt, 0, kt, 0, cap, 0.1);
        runs.push(be.read(whole));
        // the same span in three pieces whose tiles start elsewhere
        const parts = be.alloc([heads, cap]);
        for (const [s, n] of [[0, 7], [7, 150], [157, 143]]) be.attnLogits(parts, s, qt, 0, kt, s, n, 0.1);
        runs.push(be.read(parts));
      }
      for (const x of runs.slice(1)) expect(Buffer.from(x.buffer).equals(Buffer.from(runs[0].buffer)), `${isa} ${dtype}`).toBe(true);
    }
  });
});

describe(`native stage with a padded group (g = 3) and head dim 128 (seed ${SEED})`, () => {
  it("selected (pre-QKᵀ) logits per KV head equal the reference", () => {
    const heads = 6, kvHeads = 2, headDim = 128, cap = 200, n = 180, kmax = 50;
    const r = rng(31);
    for (const dtype of DTYPES) {
      using cpu = createCpuBackend({ threads: 2 });
      using stage = new NativeCpuStage(cpu, { threads: 2 });
      stage.prepare({ heads, kvHeads, headDim, storeCapacity: cap, dtype });
      const k = encode(randn(r, kvHeads * cap * headDim), dtype);
      const K = cpu.loadWeight(k.bytes, dtype, [kvHeads, cap, headDim]);
      const V = cpu.alloc([kvHeads, cap, headDim], dtype);
      const q = randn(r, heads * headDim);
      stage.query(0).set(q);
      const ids = [0, 1].map((g) => Int32Array.from(new Set(Array.from({ length: g ? 37 : kmax }, () => Math.floor(r() * n)))).sort());
      stage.submit({ slot: 0, k: K, v: V, offloaded: n, kmax, scale: 0.09, work: { kind: "selected", selection: { kind: "perKvHead", ids } } });
      stage.wait();
      const out = stage.output(0);
      for (let g = 0; g < kvHeads; g++) {
        const list = [...ids[g]];
        const ref = refLogits(q, k.decoded, heads, kvHeads, headDim, cap, list, 0.09);
        for (let h = g * 3; h < g * 3 + 3; h++) {
          const got = Array.from(out.logits.subarray(h * kmax, h * kmax + list.length));
          const want = Array.from(ref.out.subarray(h * list.length, (h + 1) * list.length));
          expectClose(got, want, Array.from(ref.mag.subarray(h * list.length, (h + 1) * list.length), (a) => 1e-5 * a + 1e-6), `stage ${dtype} head ${h}`);
        }
      }
      cpu.free(K);
      cpu.free(V);
    }
  });
});
