/**
 * Hybrid attention's window as a flash-decode partial (Backend.attnPartial + attnMerge): no window
 * logits are written (attnLogits never reads the window's K), and the logits equal the
 * materialised path's (a backend without the two ops) at every step, for exact, speculative and
 * verified top-K and for "all"; tracked scores (H2O-style selectors) keep the materialised path.
 */
import { describe, expect, it } from "vitest";
import { BackendCpuStage, LlamaModel, ReferenceBackend, type Backend, type ModelFiles, type Tensor, type TokenSelector } from "@hybridgen/core";
import { HybridAttention, type LogitsMode } from "../src/index.js";
import { maxAbsDiff, randomIds, testSeed, tinyModel, withMethods } from "@hybridgen/core/testing";
import { allSelector, fixedScheduler, topKSelector } from "./hybrid-helpers.js";

const CONTEXT = 40;

interface Counts {
  partial: number;
  windowLogits: number;
}

/** `be` counting attnPartial calls and attnLogits calls over a window K (one of `windowK`). */
function counting(be: ReferenceBackend, counts: Counts, windowK: Set<Tensor>, flash: boolean): Backend {
  return withMethods(be, {
    attnPartial: flash ? (...a: Parameters<NonNullable<Backend["attnPartial"]>>) => { counts.partial++; be.attnPartial(...a); } : undefined,
    attnMerge: flash ? be.attnMerge.bind(be) : undefined,
    attnLogits: (logits: Tensor, col: number, q: Tensor, row: number, k: Tensor, start: number, count: number, scale: number) => {
      if (windowK.has(k)) counts.windowLogits++;
      be.attnLogits(logits, col, q, row, k, start, count, scale);
    },
  });
}

function run(files: ModelFiles, tokens: number[], selector: TokenSelector, logits: LogitsMode, flash: boolean, trackScores = false) {
  const ref = new ReferenceBackend(), counts: Counts = { partial: 0, windowLogits: 0 };
  const windowK = new Set<Tensor>();
  const be = counting(ref, counts, windowK, flash);
  const model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: 9, sinkTokens: 2, kvEvictBlock: 2 });
  for (const k of model.cache.windowK) windowK.add(k);
  const hybrid = HybridAttention.attach(
    { attention: model.attention, projector: model, stage: new BackendCpuStage(ref), selector, scheduler: fixedScheduler(4, "post") },
    { logits, trackScores },
  );
  const out = [model.forward(Int32Array.from(tokens.slice(0, 12)), 0)];
  const before = { ...counts };
  for (let t = 12; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]), t));
  hybrid.close();
  model.close();
  expect(ref.liveTensors()).toBe(0);
  return { out, partial: counts.partial - before.partial, windowLogits: counts.windowLogits - before.windowLogits };
}

describe("hybrid attention: the window as a flash-decode partial", () => {
  const { files } = tinyModel({ seed: testSeed(4200), maxPositions: 64, heads: 4, kvHeads: 2, layers: 3 });
  const tokens = randomIds(testSeed(4201), CONTEXT);
  const cases: [string, () => TokenSelector, LogitsMode][] = [
    ["top-K exact", () => topKSelector(true), "exact"],
    ["top-K speculative", () => topKSelector(true), "speculative"],
    ["top-K verified", () => topKSelector(true), "verified"],
    ["all, verified", () => allSelector(true), "verified"],
  ];
  for (const [name, selector, logits] of cases) {
    it(`${name}: no window logits, the materialised path's logits within 1e-5`, () => {
      const flash = run(files, tokens, selector(), logits, true);
      const old = run(files, tokens, selector(), logits, false);
      expect(flash.partial).toBe(3 * (CONTEXT - 12)); // a partial per layer and decode step
      expect(flash.windowLogits).toBe(0);
      expect(old.windowLogits).toBeGreaterThan(0);
      flash.out.forEach((l, i) => expect(maxAbsDiff(l, old.out[i]), `step ${i}`).toBeLessThan(1e-5));
    });
  }

  it("tracked scores keep the materialised window logits (every window probability is accumulated)", () => {
    const tracked = run(files, tokens, topKSelector(true), "exact", true, true);
    expect(tracked.partial).toBe(0);
    expect(tracked.windowLogits).toBeGreaterThan(0);
  });
});
