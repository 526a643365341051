/**
 * Hybrid attention on a backend that records decode steps (beginStep/endStep: CUDA graphs on a
 * GPU), through the Recorder of recorder.ts: a segment that encloses a host interaction fails the
 * run, and a segment that ends too late changes the logits.
 */
import { describe, expect, it } from "vitest";
import { LlamaModel, ReferenceBackend, type ModelFiles } from "@hybridgen/core";
import { HybridAttention } from "../src/index.js";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { fixedScheduler, streamingSelector, topKSelector } from "./hybrid-helpers.js";
import { AddressBook, HostReference, StagedBackendCpuStage, WaitingStage } from "@hybridgen/core/testing";
import { CheckedLink, Recorder } from "./recorder.js";

const CONTEXT = 40;
function run(files: ModelFiles, tokens: number[], logits: "exact" | "speculative" | "verified", selector: ReturnType<typeof topKSelector>, timing: "post" | "pre", record: boolean, signals = false) {
  const be = new ReferenceBackend();
  const rec = record ? new Recorder() : null;
  const device = rec ? rec.wrap(be) : be;
  const book = new AddressBook();
  const host = new HostReference(book);
  const link = new CheckedLink(be, host, book, rec, signals);
  const model = LlamaModel.load(files, device, { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: 6, sinkTokens: 1, kvEvictBlock: 2 });
  model.cache.attachHostStore(host, link);
  const hybrid = HybridAttention.attach(
    { attention: model.attention, projector: model, stage: signals ? new WaitingStage(host, book, link) : new StagedBackendCpuStage(host, book), selector, scheduler: fixedScheduler(3, timing) },
    { logits },
  );
  const out = [model.forward(Int32Array.from(tokens.slice(0, 12)), 0)];
  for (let t = 12; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]!), t));
  hybrid.close();
  model.close();
  expect(be.liveTensors()).toBe(0);
  return { out, segments: rec?.segments ?? 0, keys: rec?.keys.size ?? 0 };
}

describe("hybrid attention in recorded segments (a backend with beginStep/endStep)", () => {
  it("records one segment per layer and step, never around a host interaction, with the unrecorded logits", () => {
    const layers = 3;
    const { files } = tinyModel({ seed: testSeed(330), maxPositions: 64, heads: 4, kvHeads: 2, layers });
    const tokens = randomIds(testSeed(430), CONTEXT);
    const cases = [
      ["exact", topKSelector(true), "post"],
      ["speculative", topKSelector(true), "post"],
      ["verified", topKSelector(true), "post"],
      ["verified", topKSelector(false), "post"],
      ["verified", streamingSelector(1), "pre"],
    ] as const;
    for (const [logits, selector, timing] of cases) {
      const plain = run(files, tokens, logits, selector, timing, false);
      const recorded = run(files, tokens, logits, selector, timing, true);
      const decodeSteps = CONTEXT - 12;
      expect(recorded.segments, `${logits} ${timing}`).toBe(decodeSteps * layers);
      expect(recorded.keys).toBe(layers);
      recorded.out.forEach((l, i) => expect(maxAbsDiff(l, plain.out[i]!), `${logits} ${timing} step ${i}`).toBe(0));
    }
  });

  it("with signalled query sends, a layer's send is recorded in its segment and the stage waits for it after the segment runs", () => {
    const layers = 3;
    const { files } = tinyModel({ seed: testSeed(340), maxPositions: 64, heads: 4, kvHeads: 2, layers });
    const tokens = randomIds(testSeed(440), CONTEXT);
    for (const logits of ["exact", "speculative", "verified"] as const) {
      const plain = run(files, tokens, logits, topKSelector(true), "post", false);
      const recorded = run(files, tokens, logits, topKSelector(true), "post", true, true);
      expect(recorded.segments, logits).toBe((CONTEXT - 12) * layers);
      recorded.out.forEach((l, i) => expect(maxAbsDiff(l, plain.out[i]!), `${logits} step ${i}`).toBe(0));
    }
  });
});
