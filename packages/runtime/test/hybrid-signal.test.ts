/**
 * Hybrid attention over a link that sends the query signalled (HostTransfers.sendSignalled) and a
 * stage that waits for signals: the host does not fence the query; the job carries the signal
 * and the query lands only when the stage "waits" for it, so a host read of it before that (a JS
 * pre-QKᵀ selector) would see a stale one and the logits would differ.
 */
import { describe, expect, it } from "vitest";
import { BackendCpuStage, LlamaModel, ReferenceBackend, type ModelFiles } from "@hybridgen/core";
import { HybridAttention } from "../src/index.js";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { fixedScheduler, queryPreSelector, topKSelector, type HybridRunOptions } from "./hybrid-helpers.js";
import { AddressBook, HostReference, SignallingLink, StagedBackendCpuStage, WaitingStage } from "@hybridgen/core/testing";

const CONTEXT = 40;

function run(files: ModelFiles, tokens: number[], o: HybridRunOptions & { signals?: boolean }) {
  const be = new ReferenceBackend(), book = new AddressBook(), host = new HostReference(book);
  const link = new SignallingLink(be, host, book, o.signals === true);
  const model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: o.budget, sinkTokens: o.sinks ?? 0, kvEvictBlock: o.block });
  model.cache.attachHostStore(host, link);
  const stage = o.signals ? new WaitingStage(host, book, link) : new StagedBackendCpuStage(host, book);
  const hybrid = HybridAttention.attach(
    { attention: model.attention, projector: model, stage, selector: o.selector!, scheduler: o.scheduler ?? fixedScheduler(4, "post") },
    { logits: o.logits ?? "exact" });
  const out = [model.forward(Int32Array.from(tokens.slice(0, o.prompt)), 0)];
  for (let t = o.prompt; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]), t));
  hybrid.close();
  model.close();
  expect(be.liveTensors()).toBe(0);
  return { out, signalled: stage instanceof WaitingStage ? stage.signalledJobs : 0 };
}

describe("hybrid attention with a signalling link: the stage, not the host, waits for the query's copy", () => {
  const { files } = tinyModel({ seed: testSeed(330), maxPositions: 64, heads: 4, kvHeads: 2, layers: 3 });
  const tokens = randomIds(testSeed(430), CONTEXT);
  const base = { budget: 6, sinks: 1, block: 2, prompt: 12 };

  it("top-K in the stage and in JS after the logits, every logits mode: signalled jobs, the fenced path's logits", () => {
    for (const logits of ["exact", "speculative", "verified"] as const) {
      for (const kernel of [true, false]) {
        const o = { ...base, logits, selector: topKSelector(kernel), scheduler: fixedScheduler(3, "post") };
        const fenced = run(files, tokens, o), signalled = run(files, tokens, { ...o, signals: true });
        const label = `${logits}, ${kernel ? "stage" : "JS"} top-K`;
        expect(signalled.signalled, label).toBe(3 * (CONTEXT - base.prompt));
        signalled.out.forEach((l, i) => expect(maxAbsDiff(l, fenced.out[i]), `${label}, step ${i}`).toBe(0));
      }
    }
  });

  it("a JS pre-QKᵀ selector reads the query on the host: its jobs are fenced, not signalled, and the logits equal the fenced path's", () => {
    for (const logits of ["exact", "speculative"] as const) {
      const o = { ...base, logits, selector: queryPreSelector(), scheduler: fixedScheduler(3, "pre") };
      const fenced = run(files, tokens, o), signalled = run(files, tokens, { ...o, signals: true });
      expect(signalled.signalled, logits).toBe(0);
      signalled.out.forEach((l, i) => expect(maxAbsDiff(l, fenced.out[i]), `${logits}, step ${i}`).toBe(0));
    }
  });

  it("BackendCpuStage refuses a job with a signal (it runs on the calling thread)", () => {
    const be = new ReferenceBackend();
    const stage = new BackendCpuStage(be);
    stage.prepare({ heads: 2, kvHeads: 1, headDim: 4, storeCapacity: 8, dtype: "f32" });
    const k = be.alloc([1, 8, 4]), v = be.alloc([1, 8, 4]);
    expect(() => stage.submit({ slot: 0, k, v, offloaded: 8, kmax: 2, scale: 0.5, work: { kind: "topk", budget: 2, shared: false }, ready: { address: 64, value: 1 } }))
      .toThrow(/cannot wait for a device's signal/);
    stage.close();
    be.free(k);
    be.free(v);
  });
});
