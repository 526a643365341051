import { describe, expect, it } from "vitest";
import { offloadedKeys, pageSummaries, type CpuStageJob, type DType } from "@hybridgen/spec";
import { createCpuBackend, NativeCpuStage, nativeSelectorPrimitives, storeKeys, type CpuTensor } from "../src/index.js";
import { randn, rng, SEED } from "./helpers.js";

describe("selector primitives on a CPU stage's pool", () => {
  it("give the calling thread's results bit for bit (pieces run the same loops)", () => {
    const r = rng(93);
    using be = createCpuBackend({ threads: 1 });
    using stage = new NativeCpuStage(be, { threads: 3 });
    const serial = nativeSelectorPrimitives(), P = stage.primitives;
    for (const [dtype, d, kvHeads, G, cap, page] of [["bf16", 67, 3, 4, 2100, 16], ["f16", 128, 2, 2, 1500, 7], ["f32", 13, 5, 1, 3000, 1]] as [DType, number, number, number, number, number][]) {
      const what = `${dtype} d=${d} kv=${kvHeads} G=${G} page=${page} seed ${SEED}`;
      const t = be.alloc([kvHeads, cap, d], dtype) as CpuTensor;
      be.write(t, randn(r, kvHeads * cap * d, 2));
      const keys = storeKeys(t);
      const from = 5 + Math.floor(r() * 40), to = cap - Math.floor(r() * 40);
      const a = pageSummaries(kvHeads, d, cap, page), b = pageSummaries(kvHeads, d, cap, page);
      for (const [x, y] of [[0, from], [from, to]] as const) {
        serial.summarizePages(keys, x, y, a);
        P.summarizePages(keys, x, y, b);
      }
      expect(b.min, what).toEqual(a.min);
      expect(b.max, what).toEqual(a.max);
      const q = randn(r, kvHeads * G * d), count = Math.ceil(to / page);
      expect(P.pageBounds(q, G, b, count), what).toEqual(serial.pageBounds(q, G, a, count));
      expect(P.keyScores(q, G, keys, from, to), what).toEqual(serial.keyScores(q, G, keys, from, to));
      const rr = Math.min(d, 8), ch = Int32Array.from({ length: kvHeads * rr }, () => Math.floor(r() * d));
      const pa = offloadedKeys("f32", kvHeads, cap, rr), pb = offloadedKeys("f32", kvHeads, cap, rr);
      serial.gatherChannels(keys, ch, from, to, pa);
      P.gatherChannels(keys, ch, from, to, pb);
      expect(pb.data, what).toEqual(pa.data);
    }
  });

  it("while a stage job runs they stay on the calling thread, and neither side's results change", () => {
    const r = rng(94);
    using be = createCpuBackend({ threads: 1 });
    using stage = new NativeCpuStage(be, { threads: 3 });
    const heads = 8, kvHeads = 2, d = 64, cap = 12000;
    stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: cap, dtype: "f32" });
    const K = be.alloc([kvHeads, cap, d], "f32"), V = be.alloc([kvHeads, cap, d], "f32");
    be.write(K, randn(r, kvHeads * cap * d));
    be.write(V, randn(r, kvHeads * cap * d));
    stage.query(0).set(randn(r, heads * d));
    const job: CpuStageJob = { slot: 0, k: K, v: V, offloaded: cap, kmax: 64, scale: 0.125, work: { kind: "topk", budget: 64, shared: false } };
    const keys = storeKeys(K as CpuTensor), q = randn(r, heads * d), x = randn(r, 50000);
    const serial = nativeSelectorPrimitives(), wantScores = serial.keyScores(q, 4, keys, 0, cap), wantTop = serial.topK(x, 300);
    stage.submit(job);
    for (let i = 0; i < 3; i++) {
      expect(stage.primitives.keyScores(q, 4, keys, 0, cap)).toEqual(wantScores);
      expect(stage.primitives.topK(x, 300)).toEqual(wantTop);
    }
    stage.wait();
    const ids = Array.from(stage.output(0).ids.subarray(0, 2 * 64));
    stage.submit(job);
    stage.wait();
    expect(Array.from(stage.output(0).ids.subarray(0, 2 * 64)), `seed ${SEED}`).toEqual(ids);
    be.free(K);
    be.free(V);
  });

  it("run on the calling thread once the stage is closed", () => {
    using be = createCpuBackend({ threads: 1 });
    const stage = new NativeCpuStage(be, { threads: 2 });
    const P = stage.primitives;
    stage.close();
    const x = Float32Array.from({ length: 9000 }, (_, i) => Math.sin(i));
    expect(P.topK(x, 50)).toEqual(nativeSelectorPrimitives().topK(x, 50));
  });
});
