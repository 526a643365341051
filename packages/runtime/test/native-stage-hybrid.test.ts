/**
 * Hybrid attention on the CPU backend with kernels-cpu's native stage: 'all' reproduces full
 * attention in both logits modes, and the window as a flash partial gives the materialised
 * window's tokens and logits.
 */
import { describe, expect, it } from "vitest";
import type { Backend, Scheduler, TokenSelector } from "@hybridgen/spec";
import { LlamaModel } from "@hybridgen/core";
import { maxAbsDiff, relativeError, testSeed, tinyModel, withMethods } from "@hybridgen/core/testing";
import { createCpuBackend, NativeCpuStage } from "@hybridgen/kernels-cpu";
import { HybridAttention, type LogitsMode } from "../src/index.js";

describe("hybrid attention on the CPU backend with the native stage", () => {
  const fixed = (k: number, timing: "pre" | "post"): Scheduler => ({ name: "fixed", initial: () => ({ k, timing }), next: () => ({ k, timing }), reset() {} });
  const all: TokenSelector = {
    name: "all", timings: ["post"], needsScores: false, usesBudget: false, kernel: "all", initState: () => undefined,
    select: () => { throw new Error("the kernel runs it"); },
  };
  it("'all' + exact and 'all' + verified reproduce full attention (GQA, sinks, budget below the prompt) within 1e-4", () => {
    const { files } = tinyModel({ seed: testSeed(7), heads: 4, kvHeads: 2, maxPositions: 64 });
    const tokens = Array.from({ length: 40 }, (_, i) => (i * 7 + 3) % 50);
    const runModel = (hybrid: boolean, logits: "exact" | "verified" = "exact") => {
      using cpu = createCpuBackend({ threads: 1 });
      using model = LlamaModel.load(files, cpu, { prefillBlock: 8, maxContext: 48, ...(hybrid ? { gpuKvBudget: 6, sinkTokens: 2, kvEvictBlock: 2 } : {}) });
      const h = hybrid
        ? HybridAttention.attach({ attention: model.attention, projector: model, stage: new NativeCpuStage(cpu), selector: all, scheduler: fixed(4, "post") }, { logits })
        : null;
      const out = [model.forward(Int32Array.from(tokens.slice(0, 12)), 0)];
      for (let t = 12; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]), t));
      const steps = h?.stats.steps ?? 0;
      const st = h?.stats;
      const split = st ? { score: st.cpuScoreMs, select: st.cpuSelectMs, gather: st.cpuGatherMs, busy: st.cpuStageMs, summary: st.summary() } : null;
      h?.close();
      return { out, steps, split };
    };
    const full = runModel(false), hy = runModel(true);
    expect(hy.steps).toBe(tokens.length - 12);
    // The native stage's phases reach the stats: every job scored and selected, and they fit in its busy time.
    const sp = hy.split!;
    expect(sp.score).toBeGreaterThan(0);
    expect(sp.select).toBeGreaterThan(0);
    expect(sp.score + sp.select + sp.gather).toBeLessThanOrEqual(sp.busy + 1e-6);
    expect(sp.summary).toMatch(/CPU stage split per layer: score [\d.]+ ms, top-K [\d.]+ ms, gather [\d.]+ ms, hand-offs [\d.]+ ms/);
    hy.out.forEach((l, i) => expect(maxAbsDiff(l, full.out[i])).toBeLessThan(1e-4));
    const verified = runModel(true, "verified");
    expect(verified.steps).toBe(tokens.length - 12);
    verified.out.forEach((l, i) => expect(maxAbsDiff(l, full.out[i])).toBeLessThan(1e-4));
  });
});

describe("hybrid decode on the CPU backend: the window as a partial", () => {
  const fixed: Scheduler = { name: "fixed", initial: () => ({ k: 8, timing: "post" }), next: () => ({ k: 8, timing: "post" }), reset() {} };
  const topk: TokenSelector = {
    name: "topk", timings: ["post"], needsScores: false, usesBudget: true, kernel: "topk", initState: () => undefined,
    select: () => { throw new Error("the kernel runs it"); },
  };
  it.each(["exact", "verified"] as LogitsMode[])("top-K %s: the materialised window's greedy tokens, logits within 1e-5 (a 600-token window in pieces)", (logits) => {
    const { files } = tinyModel({ seed: testSeed(11), heads: 4, kvHeads: 2, layers: 2, maxPositions: 700 });
    const run = (flash: boolean) => {
      using cpu = createCpuBackend({ threads: 2 });
      const be: Backend = flash ? cpu : withMethods(cpu, { attnPartial: undefined, attnMerge: undefined });
      using model = LlamaModel.load(files, be, { prefillBlock: 64, maxContext: 680, gpuKvBudget: 600, sinkTokens: 4, kvEvictBlock: 8 });
      const h = HybridAttention.attach({ attention: model.attention, projector: model, stage: new NativeCpuStage(cpu), selector: topk, scheduler: fixed }, { logits });
      const prompt = Int32Array.from({ length: 640 }, (_, i) => (i * 13 + 5) % 50);
      const out = [model.forward(prompt, 0)];
      const tokens: number[] = [];
      for (let t = 640; t < 672; t++) {
        const last = out[out.length - 1];
        tokens.push(last.subarray(last.length - 50).reduce((b, v, i, a) => (v > a[b] ? i : b), 0));
        out.push(model.forward(Int32Array.of(tokens[tokens.length - 1]), t));
      }
      const steps = h.stats.steps;
      h.close();
      return { out: out.slice(1), tokens, steps };
    };
    const flash = run(true), old = run(false);
    expect(flash.steps).toBe(32);
    expect(flash.tokens).toEqual(old.tokens);
    flash.out.forEach((l, i) => expect(relativeError(l, old.out[i]), `step ${i}`).toBeLessThan(1e-5));
  });
});
