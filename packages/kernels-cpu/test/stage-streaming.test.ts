import { describe, expect, it } from "vitest";
import { streamingSelection, type CpuStage, type CpuStageJob, type CpuStageWork, type DType, type Tensor } from "@hybridgen/spec";
import { BackendCpuStage, ReferenceBackend } from "@hybridgen/spec/kit";
import { createCpuBackend, NativeCpuStage } from "../src/index.js";
import { randn, rng, SEED, supportedIsas } from "./helpers.js";

function job(slot: 0 | 1, k: Tensor, v: Tensor, n: number, kmax: number, work: CpuStageWork, keys = false): CpuStageJob {
  return { slot, k, v, offloaded: n, kmax, scale: 0.125, work, keys, storeEpoch: 0 };
}

function run(stage: CpuStage, j: CpuStageJob): void {
  stage.submit(j);
  stage.wait();
}

/** Everything a job leaves in its slot, copied (the next job may reuse the slot). */
function snapshot(be: { read(t: Tensor, o?: number, n?: number): Float32Array }, stage: CpuStage, slot: 0 | 1, kvHeads: number, heads: number, d: number, keys: boolean) {
  const o = stage.output(slot), kmax = o.kmax, rows = kvHeads * kmax * d;
  return {
    ids: Array.from({ length: kvHeads }, (_, g) => Array.from(o.ids.subarray(g * kmax, g * kmax + o.counts[g]!))),
    logits: Float32Array.from(o.logits.subarray(0, heads * kmax)),
    values: rows ? be.read(o.values, 0, rows) : new Float32Array(0),
    keys: rows && keys ? be.read(o.keys!, 0, rows) : null,
  };
}

describe(`the stage's StreamingLLM kernel (seed ${SEED})`, () => {
  for (const isa of supportedIsas()) {
    it(`${isa}: ids are streamingSelection's on every KV head; logits, V and K rows equal a "selected" job's with those ids`, () => {
      const r = rng(301);
      using cpu = createCpuBackend({ threads: 2, isa });
      const cases: [DType, number, number, number][] = [["f32", 2, 1, 20], ["bf16", 3, 4, 36], ["f16", 2, 8, 13], ["bf16", 1, 4, 64]]; // dtype, kvHeads, group, headDim
      for (const [dtype, kvHeads, group, d] of cases) {
        const cap = 257, heads = kvHeads * group;
        using stage = new NativeCpuStage(cpu, { threads: 2 });
        stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: cap, dtype, stageKeys: true });
        const K = cpu.alloc([kvHeads, cap, d], dtype), V = cpu.alloc([kvHeads, cap, d], dtype);
        cpu.write(K, randn(r, kvHeads * cap * d));
        cpu.write(V, randn(r, kvHeads * cap * d));
        for (const n of [1, 3, 40, 256]) {
          for (const budget of new Set([0, 1, Math.min(n, 4), Math.min(n, 5), Math.floor(n / 2), n])) {
            for (const sinks of [0, 1, 4, 300]) {
              for (const kmax of new Set([budget, Math.min(n, budget + 3)])) {
                const q = randn(r, heads * d), slot = ((budget + sinks) & 1) as 0 | 1, keys = slot === 1, what = `${isa} ${dtype} kv=${kvHeads} G=${group} n=${n} K=${budget} sinks=${sinks} width=${kmax}`;
                stage.query(slot).set(q);
                run(stage, job(slot, K, V, n, kmax, { kind: "streaming", budget, sinks }, keys));
                const got = snapshot(cpu, stage, slot, kvHeads, heads, d, keys);
                const ids = streamingSelection(n, budget, sinks);
                expect(got.ids, what).toEqual(new Array(kvHeads).fill(Array.from(ids)));
                run(stage, job(slot, K, V, n, kmax, { kind: "selected", selection: { kind: "shared", ids } }, keys));
                const want = snapshot(cpu, stage, slot, kvHeads, heads, d, keys);
                expect(got.logits, what).toEqual(want.logits);
                expect(got.values, what).toEqual(want.values);
                expect(got.keys, what).toEqual(want.keys);
              }
            }
          }
        }
        cpu.free(K);
        cpu.free(V);
      }
    });

    it(`${isa}: the native stage's streaming job equals BackendCpuStage's (ids, logits, V rows)`, () => {
      const r = rng(302);
      using cpu = createCpuBackend({ threads: 2, isa });
      const ref = new ReferenceBackend();
      for (const dtype of ["f32", "bf16", "f16"] as DType[]) {
        const kvHeads = 2, group = 4, heads = kvHeads * group, d = 24, cap = 300;
        using native = new NativeCpuStage(cpu, { threads: 2 });
        const portable = new BackendCpuStage(ref);
        const shape = { heads, kvHeads, headDim: d, storeCapacity: cap, dtype };
        native.prepare(shape);
        portable.prepare(shape);
        const kData = randn(r, kvHeads * cap * d), vData = randn(r, kvHeads * cap * d);
        const a = { K: cpu.alloc([kvHeads, cap, d], dtype), V: cpu.alloc([kvHeads, cap, d], dtype) };
        const b = { K: ref.alloc([kvHeads, cap, d], dtype), V: ref.alloc([kvHeads, cap, d], dtype) };
        for (const [be, s] of [[cpu, a], [ref, b]] as const) {
          be.write(s.K, kData);
          be.write(s.V, vData);
        }
        for (const [n, budget, sinks] of [[41, 10, 4], [200, 37, 0], [299, 64, 64], [299, 0, 4], [7, 7, 9]] as const) {
          const q = randn(r, heads * d);
          for (const slot of [0, 1] as const) {
            native.query(slot).set(q);
            portable.query(slot).set(q);
            const work: CpuStageWork = { kind: "streaming", budget, sinks };
            run(native, job(slot, a.K, a.V, n, budget, work));
            run(portable, job(slot, b.K, b.V, n, budget, work));
            const x = snapshot(cpu, native, slot, kvHeads, heads, d, false), y = snapshot(ref, portable, slot, kvHeads, heads, d, false);
            const what = `${dtype} n=${n} K=${budget} sinks=${sinks} slot ${slot}`;
            expect(x.ids, what).toEqual(y.ids);
            expect(y.ids, what).toEqual(new Array(kvHeads).fill(Array.from(streamingSelection(n, budget, sinks))));
            for (let i = 0; i < x.logits.length; i++) {
              if (x.logits[i] !== y.logits[i]) expect(Math.abs(x.logits[i]! - y.logits[i]!), `${what} logit ${i}`).toBeLessThan(2e-5);
            }
            expect(x.values, what).toEqual(y.values);
          }
        }
        portable.close();
        for (const t of [a.K, a.V]) cpu.free(t);
        for (const t of [b.K, b.V]) ref.free(t);
      }
      expect(ref.liveTensors()).toBe(0);
    });
  }

  it("streaming jobs queue behind other jobs of the same slot: each writes its ids when it runs", () => {
    using cpu = createCpuBackend({ threads: 2 });
    using stage = new NativeCpuStage(cpu, { threads: 2 });
    const kvHeads = 2, heads = 4, d = 16, cap = 100;
    stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: cap, dtype: "f32" });
    const K = cpu.alloc([kvHeads, cap, d]), V = cpu.alloc([kvHeads, cap, d]);
    cpu.write(K, randn(rng(303), kvHeads * cap * d));
    stage.query(0).set(randn(rng(304), heads * d));
    stage.submit(job(0, K, V, 90, 12, { kind: "streaming", budget: 12, sinks: 4 }));
    stage.submit(job(0, K, V, 60, 8, { kind: "topk", budget: 8, shared: false }));
    stage.submit(job(0, K, V, 80, 10, { kind: "streaming", budget: 9, sinks: 2 }));
    stage.wait();
    const o = stage.output(0);
    for (let g = 0; g < kvHeads; g++) expect(Array.from(o.ids.subarray(g * 10, g * 10 + o.counts[g]!))).toEqual(Array.from(streamingSelection(80, 9, 2)));
    cpu.free(K);
    cpu.free(V);
  });

  it("bad streaming jobs are one-line errors before anything reaches C", () => {
    using cpu = createCpuBackend({ threads: 1 });
    using stage = new NativeCpuStage(cpu);
    stage.prepare({ heads: 2, kvHeads: 1, headDim: 8, storeCapacity: 20, dtype: "f32" });
    const K = cpu.alloc([1, 20, 8]), V = cpu.alloc([1, 20, 8]);
    expect(() => stage.submit(job(0, K, V, 10, 3, { kind: "streaming", budget: 4, sinks: 1 }))).toThrow(/streaming budget 4 out of range \[0, 3\]/);
    expect(() => stage.submit(job(0, K, V, 10, 4, { kind: "streaming", budget: 4, sinks: -1 }))).toThrow(/streaming sinks must be a non-negative 32-bit integer, got -1/);
    expect(() => stage.submit(job(0, K, V, 10, 4, { kind: "streaming", budget: 4, sinks: 1.5 }))).toThrow(/streaming sinks/);
    cpu.free(K);
    cpu.free(V);
  });
});
