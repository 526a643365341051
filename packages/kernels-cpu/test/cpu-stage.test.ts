import { describe, expect, it } from "vitest";
import { type Backend, type CpuStage, type CpuStageJob, type CpuStageWork, type DType, type Scheduler, type Selection, type Tensor, type TokenSelector } from "@hybridgen/spec";
import { BackendCpuStage, ReferenceBackend, topKSelection } from "@hybridgen/spec/kit";
import { cpuFeatures, createCpuBackend, NativeCpuStage, type Isa } from "../src/index.js";
import { randn, rng, SEED } from "./helpers.js";

const heads = 8, kvHeads = 2, headDim = 64, cap = 700;

/** The same random store K/V on a backend. */
function store(be: Backend, dtype: DType, k: Float32Array, v: Float32Array) {
  const K = be.alloc([kvHeads, cap, headDim], dtype), V = be.alloc([kvHeads, cap, headDim], dtype);
  be.write(K, k);
  be.write(V, v);
  return { K, V };
}

function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    if (a[i] === b[i]) continue; // equal infinities
    m = Math.max(m, Math.abs(a[i] - b[i]));
  }
  return m;
}

/** Runs one job on a stage (submit → wait, and the JS gather for "score"). */
function runJob(stage: CpuStage, job: CpuStageJob, jsSelection?: Selection) {
  stage.submit(job);
  stage.wait();
  if (job.work.kind === "score" && jsSelection) stage.gather(job, jsSelection);
}

function randomSelection(r: () => number, n: number, kmax: number): Selection {
  // Per-KV-head lists of different lengths (the short ones are padded with −∞).
  const ids = Array.from({ length: kvHeads }, (_, g) => {
    const len = g === 0 ? kmax : Math.floor(r() * kmax);
    const set = new Set<number>();
    while (set.size < len) set.add(Math.floor(r() * n));
    return Int32Array.from([...set].sort((a, b) => a - b));
  });
  return { kind: "perKvHead", ids };
}

describe(`NativeCpuStage equals BackendCpuStage on the reference backend (seed ${SEED})`, () => {
  for (const dtype of ["f32", "f16", "bf16"] as DType[]) {
    it(`${dtype} store: score, top-K (per KV head and shared), pre-QKᵀ selected, gather after a JS selection; K rows staged on slot 1`, () => {
      const r = rng(11 + dtype.length);
      const kData = randn(r, kvHeads * cap * headDim), vData = randn(r, kvHeads * cap * headDim);
      const q = randn(r, heads * headDim);
      using cpu = createCpuBackend({ threads: 2 });
      const ref = new ReferenceBackend();
      const native = new NativeCpuStage(cpu, { threads: 2 });
      const portable = new BackendCpuStage(ref);
      const shape = { heads, kvHeads, headDim, storeCapacity: cap, dtype, stageKeys: true };
      native.prepare(shape);
      portable.prepare(shape);
      const a = store(cpu, dtype, kData, vData), b = store(ref, dtype, kData, vData);
      const n = 613, kmax = 37, scale = 1 / Math.sqrt(headDim);
      const works: [CpuStageWork, number][] = [
        [{ kind: "topk", budget: kmax, shared: false }, kmax],
        [{ kind: "topk", budget: kmax, shared: true }, kmax],
        [{ kind: "topk", budget: n, shared: true }, n], // "all"
        [{ kind: "selected", selection: randomSelection(r, n, kmax) }, kmax],
        [{ kind: "score" }, kmax],
      ];
      for (const [work, width] of works) {
        for (const slot of [0, 1] as const) {
          native.query(slot).set(q);
          portable.query(slot).set(q);
          const js = work.kind === "score" ? randomSelection(r, n, width) : undefined;
          const job = (k: Tensor, v: Tensor): CpuStageJob => ({ slot, k, v, offloaded: n, kmax: width, scale, work, keys: slot === 1 });
          runJob(native, job(a.K, a.V), js);
          if (work.kind === "topk") {
            // The native top-K must be exactly the top-K of the native logits...
            const want = topKSelection(native.allLogits(), n, work.budget, work.shared, { heads, kvHeads });
            const got = native.output(slot);
            for (let g = 0; g < kvHeads; g++) {
              const w = want.kind === "shared" ? want.ids : want.ids[g];
              expect(got.counts[g]).toBe(w.length);
              expect(Array.from(got.ids.subarray(g * width, g * width + w.length))).toEqual(Array.from(w));
            }
          }
          runJob(portable, job(b.K, b.V), js);
          const x = native.output(slot), y = portable.output(slot);
          expect(x.kmax).toBe(width);
          // ...and the logits (f32 SIMD vs f64 reference) and staged V equal the portable stage's.
          expect(maxDiff(x.logits.subarray(0, heads * width), y.logits.subarray(0, heads * width))).toBeLessThan(2e-5);
          expect(Array.from(x.counts)).toEqual(Array.from(y.counts));
          const xv = cpu.read(x.values, 0, kvHeads * width * headDim), yv = ref.read(y.values, 0, kvHeads * width * headDim);
          for (let g = 0; g < kvHeads; g++) {
            const used = x.counts[g] * headDim, base = g * width * headDim;
            expect(maxDiff(xv.subarray(base, base + used), yv.subarray(base, base + used))).toBe(0); // exact copies
            expect(xv.subarray(base + used, base + width * headDim).every((z) => z === 0)).toBe(true);
          }
          expect(x.keys === null).toBe(slot === 0);
          expect(y.keys === null).toBe(slot === 0);
          if (x.keys && y.keys) {
            const xk = cpu.read(x.keys, 0, kvHeads * width * headDim), yk = ref.read(y.keys, 0, kvHeads * width * headDim);
            for (let g = 0; g < kvHeads; g++) {
              const used = x.counts[g] * headDim, base = g * width * headDim;
              expect(maxDiff(xk.subarray(base, base + used), yk.subarray(base, base + used))).toBe(0); // exact copies of K rows
              const stored = cpu.read(a.K, 0, kvHeads * cap * headDim); // the store's rounding of kData
              const want = Float32Array.from({ length: used }, (_, i) => stored[(g * cap + x.ids[g * width + Math.floor(i / headDim)]) * headDim + (i % headDim)]);
              expect(maxDiff(xk.subarray(base, base + used), want)).toBe(0); // the rows of the selected ids
              expect(xk.subarray(base + used, base + width * headDim).every((z) => z === 0)).toBe(true);
            }
          }
          if (work.kind === "score") {
            const xs = native.allLogits(), ys = portable.allLogits();
            for (let h = 0; h < heads; h++) expect(maxDiff(xs[h].subarray(0, n), ys[h].subarray(0, n))).toBeLessThan(2e-5);
          }
        }
      }
      native.close();
      portable.close();
      for (const t of [a.K, a.V]) cpu.free(t);
      for (const t of [b.K, b.V]) ref.free(t);
      expect(ref.liveTensors()).toBe(0);
    });
  }

  // every kernel set this CPU runs: the group max of a GQA group of 4 comes from the logits kernel's registers
  const f = cpuFeatures(), isas = ["generic", ...(f.avx2 ? ["avx2"] : []), ...(f.avx512 ? ["avx512"] : [])] as Isa[];
  for (const isa of isas) it(`${isa}: top-K over thousands of tokens in parallel chunks, with heavy ties and ±0, equals the TypeScript top-K; the split adds up`, () => {
    const r = rng(31);
    const big = 5003, d = 16;
    using cpu = createCpuBackend({ threads: 2, isa });
    using stage = new NativeCpuStage(cpu, { threads: 2 });
    stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: big, dtype: "f32" });
    // K rows repeat with period 7 (equal logits: ties across far-apart tokens), every 5th row is
    // zero (logit ±0 next to the negative and positive ones).
    const base = randn(r, kvHeads * 7 * d), k = new Float32Array(kvHeads * big * d);
    for (let g = 0; g < kvHeads; g++)
      for (let t = 0; t < big; t++)
        if (t % 5 !== 0) k.set(base.subarray((g * 7 + (t % 7)) * d, (g * 7 + (t % 7) + 1) * d), (g * big + t) * d);
    const K = cpu.alloc([kvHeads, big, d]), V = cpu.alloc([kvHeads, big, d]);
    cpu.write(K, k);
    cpu.write(V, randn(r, kvHeads * big * d));
    const queries = [randn(r, heads * d), new Float32Array(heads * d), randn(r, heads * d).map((x) => -Math.abs(x))];
    for (const q of queries) {
      for (const [budget, shared] of [[1, false], [37, false], [700, true], [4999, false], [big, true]] as const) {
        stage.query(1).set(q);
        stage.submit({ slot: 1, k: K, v: V, offloaded: big, kmax: budget, scale: 0.25, work: { kind: "topk", budget, shared } });
        const busy = stage.wait();
        const split = stage.lastSplit();
        expect(split.scoreMs + split.selectMs + split.gatherMs).toBeLessThanOrEqual(busy + 1e-6);
        expect(split.selectMs).toBeGreaterThan(0);
        expect(split.handoffMs).toBeGreaterThanOrEqual(0);
        const want = topKSelection(stage.allLogits(), big, budget, shared, { heads, kvHeads });
        const got = stage.output(1);
        for (let g = 0; g < kvHeads; g++) {
          const w = want.kind === "shared" ? want.ids : want.ids[g];
          expect(got.counts[g]).toBe(w.length);
          expect(Array.from(got.ids.subarray(g * budget, g * budget + w.length)), `budget ${budget} shared ${shared}`).toEqual(Array.from(w));
        }
      }
    }
    cpu.free(K);
    cpu.free(V);
  });

  it("JS keeps running while the stage works, and results are the same as a synchronous run", () => {
    const r = rng(21);
    using cpu = createCpuBackend({ threads: 1 });
    using stage = new NativeCpuStage(cpu, { threads: 1 });
    stage.prepare({ heads, kvHeads, headDim, storeCapacity: cap, dtype: "bf16" });
    const s = store(cpu, "bf16", randn(r, kvHeads * cap * headDim), randn(r, kvHeads * cap * headDim));
    stage.query(0).set(randn(r, heads * headDim));
    const job: CpuStageJob = { slot: 0, k: s.K, v: s.V, offloaded: cap, kmax: 16, scale: 0.125, work: { kind: "topk", budget: 16, shared: false } };
    stage.submit(job);
    let jsWork = 0;
    for (let i = 0; i < 1000; i++) jsWork += Math.sqrt(i); // the "device stage" meanwhile
    stage.submit(job); // queues behind the first
    stage.wait();
    const first = Array.from(stage.output(0).ids.subarray(0, 32));
    stage.submit(job);
    stage.wait();
    expect(Array.from(stage.output(0).ids.subarray(0, 32))).toEqual(first);
    expect(jsWork).toBeGreaterThan(0);
    cpu.free(s.K);
    cpu.free(s.V);
  });
});

describe("NativeCpuStage bad input", () => {
  it("foreign, freed or mismatched tensors and bad ids are one-line errors, never a native access", () => {
    using cpu = createCpuBackend({ threads: 1 });
    using stage = new NativeCpuStage(cpu);
    stage.prepare({ heads, kvHeads, headDim, storeCapacity: cap, dtype: "f32" });
    const K = cpu.alloc([kvHeads, cap, headDim]), V = cpu.alloc([kvHeads, cap, headDim]);
    const job: CpuStageJob = { slot: 0, k: K, v: V, offloaded: 10, kmax: 4, scale: 0.1, work: { kind: "score" } };
    const ref = new ReferenceBackend();
    const foreign = ref.alloc([kvHeads, cap, headDim]);
    expect(() => stage.submit({ ...job, k: foreign })).toThrow(/store K is not a tensor of this CpuBackend/);
    const half = cpu.alloc([kvHeads, cap, headDim], "bf16");
    expect(() => stage.submit({ ...job, v: half })).toThrow(/store V is bf16, the stage was prepared for f32/);
    const wrong = cpu.alloc([kvHeads + 1, cap, headDim]);
    expect(() => stage.submit({ ...job, k: wrong })).toThrow(/mismatched head layout/);
    expect(() => stage.submit({ ...job, work: { kind: "selected", selection: { kind: "shared", ids: Int32Array.of(3, 10) } } }))
      .toThrow(/slot 10, out of range \[0, 10\)/);
    expect(() => stage.submit({ ...job, work: { kind: "selected", selection: { kind: "shared", ids: Int32Array.of(1, 2, 3, 4, 5) } } }))
      .toThrow(/more than the step's width 4/);
    expect(() => stage.submit({ ...job, work: { kind: "selected", selection: { kind: "shared", ids: Int32Array.of(5, 5) } } }))
      .toThrow(/slot 5, out of range \[0, 10\) or not strictly ascending/);
    expect(() => stage.wait()).toThrow(/without a submitted job/);
    cpu.free(half);
    expect(() => stage.submit({ ...job, v: half })).toThrow(/was freed/);
    for (const t of [K, V, wrong]) cpu.free(t);
    ref.free(foreign);
    stage.close();
    expect(() => stage.query(0)).toThrow(/after close/);
  });
});
