import { describe, expect, it } from "vitest";
import { BackendCpuStage, LlamaModel, ReferenceBackend, streamingSelection, type CpuStageJob, type CpuStageWork, type Tensor, type TokenSelector } from "@hybridgen/core";
import { HybridAttention, type LogitsMode } from "../src/index.js";
import { makeRng, randomArray, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { fixedScheduler, streamingSelector } from "./hybrid-helpers.js";

describe("streamingSelection", () => {
  it("is the sinks then the newest slots, ascending, K in all", () => {
    expect(Array.from(streamingSelection(10, 5, 2))).toEqual([0, 1, 7, 8, 9]);
    expect(Array.from(streamingSelection(10, 3, 4))).toEqual([0, 1, 2]);
    expect(Array.from(streamingSelection(10, 4, 0))).toEqual([6, 7, 8, 9]);
    expect(Array.from(streamingSelection(6, 6, 2))).toEqual([0, 1, 2, 3, 4, 5]);
    expect(Array.from(streamingSelection(6, 0, 2))).toEqual([]);
  });
});

describe("BackendCpuStage's streaming work", () => {
  it("stages streamingSelection's ids on every KV head, with a selected job's logits and V rows", () => {
    const r = makeRng(testSeed(711));
    using be = new ReferenceBackend();
    const heads = 6, kvHeads = 2, d = 5, cap = 90;
    using stage = new BackendCpuStage(be);
    stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: cap, dtype: "f32" });
    const K = be.alloc([kvHeads, cap, d]), V = be.alloc([kvHeads, cap, d]);
    be.write(K, randomArray(r, kvHeads * cap * d));
    be.write(V, randomArray(r, kvHeads * cap * d));
    const staged = (n: number, kmax: number, work: CpuStageWork) => {
      const job: CpuStageJob = { slot: 1, k: K, v: V, offloaded: n, kmax, scale: 0.3, work };
      stage.submit(job);
      stage.wait();
      const o = stage.output(1);
      return {
        ids: Array.from({ length: kvHeads }, (_, g) => Array.from(o.ids.subarray(g * kmax, g * kmax + o.counts[g]!))),
        logits: o.logits.slice(0, heads * kmax), values: kmax ? be.read(o.values, 0, kvHeads * kmax * d) : new Float32Array(0),
      };
    };
    for (const [n, budget, kmax, sinks] of [[3, 2, 2, 4], [9, 5, 7, 2], [10, 10, 10, 1], [37, 6, 6, 0], [61, 13, 20, 4], [61, 0, 3, 4]]) {
      stage.query(1).set(randomArray(r, heads * d));
      const ids = streamingSelection(n, budget, sinks), what = `n=${n} K=${budget} sinks=${sinks}`;
      const got = staged(n, kmax, { kind: "streaming", budget, sinks });
      expect(got.ids, what).toEqual(new Array(kvHeads).fill(Array.from(ids)));
      const want = staged(n, kmax, { kind: "selected", selection: { kind: "shared", ids } });
      expect(got, what).toEqual(want);
    }
    for (const t of [K, V] as Tensor[]) be.free(t);
  });
});

describe("hybrid decode with a streaming kernel on the portable stage", () => {
  it("gives select()'s logits bit for bit in every logits mode, with no JS selection time", () => {
    const { files } = tinyModel({ seed: testSeed(712), maxPositions: 64, heads: 4, kvHeads: 2, layers: 2 });
    const tokens = randomIds(testSeed(713), 40);
    const decode = (selector: TokenSelector, logits: LogitsMode) => {
      const be = new ReferenceBackend();
      const model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: 40, gpuKvBudget: 8, sinkTokens: 1, kvEvictBlock: 2 });
      const hybrid = HybridAttention.attach(
        { attention: model.attention, projector: model, stage: new BackendCpuStage(be), selector, scheduler: fixedScheduler(5, "pre") }, { logits });
      const out = [model.forward(Int32Array.from(tokens.slice(0, 10)), 0).slice()];
      for (let t = 10; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]!), t).slice());
      const js = hybrid.stats.cpuJsMs;
      hybrid.close();
      model.close();
      expect(be.liveTensors()).toBe(0);
      return { out, js };
    };
    for (const logits of ["exact", "speculative", "verified"] as const) {
      for (const sinks of [0, 2, 9]) {
        const a = decode(streamingSelector(sinks, true), logits), b = decode(streamingSelector(sinks, false), logits);
        a.out.forEach((l, i) => expect(l, `${logits} sinks=${sinks} forward ${i}`).toEqual(b.out[i]));
        expect(a.js).toBe(0);
        expect(b.js).toBeGreaterThan(0);
      }
    }
  });
});
