/**
 * The stage hand-off on the device: with a link that has HostTransfers' hand-off ops and a stage
 * with a queue, a step whose stage runs a kernel is handed off — every layer's job queued, the
 * device waiting for each (a stand-in that runs a job only when the device reaches its wait) and
 * reading the logits and [counts | ids] table where the stage wrote them — and the host waits for
 * the stage once a step. The logits equal the per-layer path's bit for bit.
 */
import { describe, expect, it } from "vitest";
import { LlamaModel, ReferenceBackend, type ModelFiles, type SelectionTiming, type TokenSelector } from "@hybridgen/core";
import { HybridAttention, type LogitsMode } from "../src/index.js";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { allSelector, fixedScheduler, questSelector, streamingSelector, topKSelector } from "./hybrid-helpers.js";
import { HandoffLink, QueuedStage, TrimmingStage } from "./handoff-link.js";
import { AddressBook, HostReference, StagedBackendCpuStage } from "@hybridgen/core/testing";
import { CheckedLink, Recorder } from "./recorder.js";

const CONTEXT = 40, PROMPT = 12, LAYERS = 3;

interface Case {
  logits: LogitsMode;
  selector: TokenSelector<never> | TokenSelector<unknown>;
  timing: SelectionTiming;
  k: number;
}

function run(files: ModelFiles, tokens: number[], c: Case, handoff: { depth: number } | null, trim = false) {
  const be = new ReferenceBackend(), rec = new Recorder(), book = new AddressBook(), host = new HostReference(book);
  const link = handoff ? new HandoffLink(be, host, book, rec) : new CheckedLink(be, host, book, rec, false);
  const model = LlamaModel.load(files, rec.wrap(be), { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: 6, sinkTokens: 1, kvEvictBlock: 2 });
  model.cache.attachHostStore(host, link);
  const stage = handoff ? new QueuedStage(host, book, link as HandoffLink, { depth: handoff.depth, trim }) : trim ? new TrimmingStage(host, book) : new StagedBackendCpuStage(host, book);
  const hybrid = HybridAttention.attach(
    { attention: model.attention, projector: model, stage, selector: c.selector as TokenSelector, scheduler: fixedScheduler(c.k, c.timing) },
    { logits: c.logits });
  const out = [model.forward(Int32Array.from(tokens.slice(0, PROMPT)), 0)];
  for (let t = PROMPT; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]!), t));
  const cpuStageMs = hybrid.stats.cpuStageMs, handedOff = hybrid.stats.handedOffSteps, summary = hybrid.stats.summary();
  expect(hybrid.stats.trace.every((t) => t.tWaitMs !== undefined && t.tWaitMs >= 0)).toBe(true); // each step's wait for the stage, for the scheduler and traces
  hybrid.close();
  model.close();
  expect(be.liveTensors()).toBe(0);
  return {
    out, cpuStageMs, handedOff, summary, segments: rec.segments,
    awaited: link instanceof HandoffLink ? link.awaited : 0,
    rescores: link instanceof HandoffLink ? link.rescoreCalls : 0,
    waits: stage instanceof QueuedStage ? stage.waits : 0,
    mostQueued: stage instanceof QueuedStage ? stage.mostQueued : 0,
  };
}

describe("hybrid attention handed off on the device (queued stage jobs, device-side waits and reads)", () => {
  const { files } = tinyModel({ seed: testSeed(350), maxPositions: 64, heads: 4, kvHeads: 2, layers: LAYERS });
  const tokens = randomIds(testSeed(450), CONTEXT);
  const steps = CONTEXT - PROMPT;

  it("top-K, Quest, streaming and all-tokens kernels in every logits mode: one host wait a step, a device wait a layer, the per-layer path's logits", () => {
    const cases: Case[] = [
      ...(["exact", "speculative", "verified"] as const).map((logits) => ({ logits, selector: topKSelector(true), timing: "post" as const, k: 3 })),
      { logits: "verified", selector: questSelector(2, true), timing: "pre", k: 4 },
      { logits: "speculative", selector: questSelector(2, true), timing: "pre", k: 4 },
      ...(["exact", "speculative", "verified"] as const).map((logits) => ({ logits, selector: streamingSelector(2, true), timing: "pre" as const, k: 4 })),
      { logits: "exact", selector: allSelector(true), timing: "post", k: 3 },
    ];
    for (const c of cases) {
      const label = `${c.selector.name} ${c.logits}`;
      const plain = run(files, tokens, c, null), handed = run(files, tokens, c, { depth: 64 });
      expect(handed.awaited, label).toBe(steps * LAYERS);
      // A verified layer's logits and their padding are one rescoreRows (layer 0's q̃ is its query: not rescored).
      expect(handed.rescores, label).toBe(c.logits === "verified" ? steps * (LAYERS - 1) : 0);
      expect(handed.waits, label).toBe(steps);
      expect(handed.handedOff, label).toBe(steps);
      expect(handed.summary, label).toContain(`${steps} of ${steps} steps handed off`);
      expect(handed.mostQueued, label).toBeGreaterThanOrEqual(2);
      expect(handed.segments, label).toBe(plain.segments);
      expect(handed.cpuStageMs, label).toBeGreaterThan(0);
      handed.out.forEach((l, i) => expect(maxAbsDiff(l, plain.out[i]!), `${label}, step ${i}`).toBe(0));
    }
  });

  it("verified logits of a list shorter than the step's width: the device pads its columns with −∞ by the table's counts", () => {
    for (const c of [{ logits: "verified", selector: topKSelector(true), timing: "post", k: 3 }, { logits: "exact", selector: topKSelector(true), timing: "post", k: 3 }] as Case[]) {
      const plain = run(files, tokens, c, null, true), handed = run(files, tokens, c, { depth: 64 }, true), full = run(files, tokens, c, null);
      expect(handed.awaited).toBe(steps * LAYERS);
      expect(Math.max(...handed.out.map((l, i) => maxAbsDiff(l, full.out[i]!)))).toBeGreaterThan(0); // the trimming shows
      handed.out.forEach((l, i) => expect(maxAbsDiff(l, plain.out[i]!), `${c.logits} step ${i}`).toBe(0));
    }
  });

  it("a JS selector, or a queue shorter than the layers, keeps the per-layer path (the host waits for every layer)", () => {
    const cases = [[topKSelector(false), 64, "post"], [topKSelector(true), LAYERS - 1, "post"], [streamingSelector(2, false), 64, "pre"]] as const;
    for (const [selector, depth, timing] of cases) {
      const c: Case = { logits: "verified", selector, timing, k: 3 };
      const plain = run(files, tokens, c, null), handed = run(files, tokens, c, { depth });
      expect(handed.awaited).toBe(0);
      expect(handed.handedOff).toBe(0);
      expect(handed.waits).toBe(steps * LAYERS);
      handed.out.forEach((l, i) => expect(maxAbsDiff(l, plain.out[i]!), `step ${i}`).toBe(0));
    }
  });
});
