/**
 * Hybrid attention inside the engine's own loops: generate fed on the device gives the host round
 * trip's tokens, and a KvCache restore starts the hybrid per-sequence state over.
 */
import { describe, expect, it } from "vitest";
import type { Scheduler, TokenSelector } from "@hybridgen/spec";
import { BackendCpuStage, ReferenceBackend } from "@hybridgen/spec/kit";
import { generateText, LlamaModel } from "@hybridgen/core";
import { randomIds, testSeed, tinyModel, withMethods } from "@hybridgen/core/testing";
import { HybridAttention } from "../src/index.js";
import { fixedScheduler, topKSelector } from "./hybrid-helpers.js";

/** The reference backend without the token-feed ops: generate takes the host round trip. */
const withoutFeed = (be: ReferenceBackend) => withMethods(be, { argmaxToFeed: undefined, embeddingFromFeed: undefined, feedResult: undefined });

describe("generate fed on the device with hybrid attention", () => {
  it("gives the host round trip's tokens with an offloading cache and a top-K selector, exact and speculative logits", async () => {
    const { files } = tinyModel({ seed: testSeed(39), eos: 9999 });
    const prompt = [1, 5, 9, 14, 22, 3, 8, 17, 11, 6, 2, 30];
    const tokensOf = async (feed: boolean, logits: "exact" | "speculative") => {
      const be = new ReferenceBackend();
      const runBe = feed ? be : withoutFeed(be);
      using model = LlamaModel.load(files, runBe, { prefillBlock: 5, maxContext: 40, gpuKvBudget: 8, kvEvictBlock: 2 });
      using hybrid = HybridAttention.attach(
        { attention: model.attention, projector: model, stage: new BackendCpuStage(be), selector: topKSelector(false), scheduler: fixedScheduler(3, "post") },
        { logits },
      );
      expect(model.feedsOnDevice).toBe(feed);
      const r = await generateText(model, files.tokenizer, prompt, { maxTokens: 14, sampling: { temperature: 0 } });
      expect(hybrid.stats.steps).toBeGreaterThan(0);
      return r.tokens;
    };
    for (const logits of ["exact", "speculative"] as const) {
      const fed = await tokensOf(true, logits);
      expect(fed).toHaveLength(14);
      expect(fed).toEqual(await tokensOf(false, logits));
    }
  });
});

describe("hybrid attention across a KvCache restore", () => {
  it("a live hybrid attention starts its per-sequence state over after restore() (the same logits as a fresh one)", () => {
    const { files } = tinyModel({ seed: testSeed(910), maxPositions: 64, heads: 4, kvHeads: 2 });
    const tokens = randomIds(testSeed(911), 40);
    const be = new ReferenceBackend();
    const model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: 48, gpuKvBudget: 8, sinkTokens: 2, kvEvictBlock: 3 });
    const scheduler: Scheduler = { name: "fixed", initial: () => ({ k: 3, timing: "post" }), next: () => ({ k: 3, timing: "post" }), reset() {} };
    let inits = 0;
    const counting: TokenSelector<number> = {
      name: "first-k", timings: ["post"], needsScores: false, usesBudget: true,
      initState: () => ++inits,
      select: (input) => ({ kind: "shared", ids: Int32Array.from({ length: input.k }, (_, i) => i) }),
    };
    model.forward(Int32Array.from(tokens.slice(0, 20)), 0);
    using cp = model.cache.checkpoint();
    using h = HybridAttention.attach({ attention: model.attention, projector: model, stage: new BackendCpuStage(be), selector: counting, scheduler }, { logits: "exact" });
    const before = inits;
    const decode = () => tokens.slice(20, 30).map((t, i) => Array.from(model.forward(Int32Array.of(t), 20 + i)));
    const first = decode();
    expect(inits).toBe(before); // no restore yet: the states live on
    model.cache.restore(cp);
    const again = decode();
    expect(inits).toBe(before + model.cache.layers); // one fresh state per layer after the restore
    again.forEach((l, i) => expect(l).toEqual(first[i]));
    h.close();
    model.close();
  });
});

describe("hybrid attention on a stage a batch shares", () => {
  it("a step of its own joins the shared stage as a step of one lane, once a step it plans jobs, before its first submit; a step with nothing offloaded joins nothing", () => {
    const { files } = tinyModel({ seed: testSeed(920), maxPositions: 64, heads: 4, kvHeads: 2 });
    const be = new ReferenceBackend();
    using model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: 40, gpuKvBudget: 8, kvEvictBlock: 2 });
    const stage = new BackendCpuStage(be), events: string[] = [];
    const submit = stage.submit.bind(stage);
    stage.submit = (job) => {
      events.push("submit");
      submit(job);
    };
    // The group goes by itself once the step's lanes have a job: a job held for a flush no caller makes hangs a handed-off step.
    const stageGroup = { join: (step: { serial: number } | null) => void events.push(step === null ? "join" : "join batched"), flush: () => void events.push("flush"), groupCounts: () => ({ atOnce: 0, inTurn: 0 }) };
    using h = HybridAttention.attach({ attention: model.attention, projector: model, stage, selector: topKSelector(true), scheduler: fixedScheduler(3, "post"), stageGroup }, { logits: "speculative" });
    const tokens = Int32Array.from(randomIds(testSeed(921), 24));
    model.forward(tokens.subarray(0, 4), 0);
    for (let p = 4; p < 8; p++) model.forward(tokens.subarray(p, p + 1), p); // within the window: nothing offloaded
    expect(events).toEqual([]);
    model.forward(tokens.subarray(8, 16), 8);
    for (let p = 16; p < 24; p++) model.forward(tokens.subarray(p, p + 1), p);
    expect(h.stats.steps).toBeGreaterThanOrEqual(8);
    const step = ["join", ...Array<string>(model.cache.layers).fill("submit")];
    expect(events).toEqual(Array.from({ length: h.stats.steps }, () => step).flat());
  });
});
