import { describe, expect, it } from "vitest";
import { BackendCpuStage, LlamaModel, questPages, questSelection, ReferenceBackend, referencePrimitives as P, selectionForKvHead, validateSelection, type CpuStageJob, type QuestPageState, type Tensor, type TokenSelector } from "@hybridgen/core";
import { HybridAttention } from "../src/index.js";
import { makeRng, randomArray, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { fixedScheduler, questSelector } from "./hybrid-helpers.js";

describe("BackendCpuStage's quest work", () => {
  it("equals questSelection on fresh summaries as the store grows, per store, and afresh in a new epoch", () => {
    const r = makeRng(testSeed(701));
    using be = new ReferenceBackend();
    const heads = 6, kvHeads = 2, d = 5, cap = 90, page = 4;
    using stage = new BackendCpuStage(be);
    stage.prepare({ heads, kvHeads, headDim: d, storeCapacity: cap, dtype: "f32" });
    const store = (): [Tensor, Tensor] => {
      const k = be.alloc([kvHeads, cap, d]), v = be.alloc([kvHeads, cap, d]);
      be.write(k, randomArray(r, kvHeads * cap * d));
      return [k, v];
    };
    const [K1, V1] = store(), [K2, V2] = store();
    const check = (K: Tensor, V: Tensor, n: number, budget: number, epoch: number) => {
      const q = randomArray(r, heads * d);
      stage.query(0).set(q);
      const job: CpuStageJob = { slot: 0, k: K, v: V, offloaded: n, kmax: budget, scale: 0.3, work: { kind: "quest", budget, pageSize: page }, storeEpoch: epoch };
      stage.submit(job);
      stage.wait();
      const keys = stage.offloadedKeys(K), want = questSelection(P, q, heads / kvHeads, keys, questPages(P, { pages: null, summarized: 0 }, keys, n, page), n, budget);
      const out = stage.output(0);
      for (let g = 0; g < kvHeads; g++) {
        expect(Array.from(out.ids.subarray(g * budget, g * budget + out.counts[g]!)), `n=${n} K=${budget}`).toEqual(Array.from(selectionForKvHead(want, g)));
      }
    };
    for (const [n, budget] of [[3, 2], [9, 5], [10, 10], [37, 6], [61, 13]]) {
      check(K1, V1, n, budget, 0);
      check(K2, V2, Math.max(1, n - 2), Math.min(budget, n - 2) || 1, 0);
    }
    be.write(K1, randomArray(r, kvHeads * cap * d)); // a restored checkpoint rewrote the rows
    check(K1, V1, 61, 13, 1);
    for (const t of [K1, V1, K2, V2]) be.free(t);
  });
});

describe("hybrid decode with a quest kernel on the portable stage", () => {
  it("gives select()'s logits, with no JS selection time", () => {
    const { files } = tinyModel({ seed: testSeed(702), maxPositions: 64, heads: 4, kvHeads: 2, layers: 2 });
    const tokens = randomIds(testSeed(703), 40);
    const decode = (selector: TokenSelector<QuestPageState>) => {
      const be = new ReferenceBackend();
      const model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: 40, gpuKvBudget: 8, sinkTokens: 1, kvEvictBlock: 2 });
      const hybrid = HybridAttention.attach(
        { attention: model.attention, projector: model, stage: new BackendCpuStage(be), selector, scheduler: fixedScheduler(5, "pre") }, { logits: "verified" });
      const out = [model.forward(Int32Array.from(tokens.slice(0, 10)), 0).slice()];
      for (let t = 10; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]!), t).slice());
      const js = hybrid.stats.cpuJsMs;
      hybrid.close();
      model.close();
      return { out, js };
    };
    const a = decode(questSelector(3, true)), b = decode(questSelector(3, false));
    a.out.forEach((l, i) => expect(l, `forward ${i}`).toEqual(b.out[i]));
    expect(a.js).toBe(0);
    expect(b.js).toBeGreaterThan(0);
  });
});
