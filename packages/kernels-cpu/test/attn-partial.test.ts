/**
 * attnPartial + attnMerge on the CPU backend (every ISA, 1 and 2 threads): equal to the CPU
 * backend's own materialised path (logits, softmax, attnAggregate) and to the ReferenceBackend's
 * partial and merge, on core's random cases (GQA 1/4/8, f32 and bf16 K/V, odd spans of a wrapped
 * ring, −∞ columns); long spans cut into several pieces; the edges; bad input; hybrid decode with
 * the window as a partial gives the materialised window's tokens and logits.
 */
import { describe, expect, it } from "vitest";
import { type Backend, type Scheduler, type TokenSelector } from "@hybridgen/spec";
import { ReferenceBackend } from "@hybridgen/spec/kit";
import { HybridAttention, LlamaModel, type LogitsMode } from "@hybridgen/core";
import { partialCases, relativeError, runPartialCase, tinyModel, withMethods, type PartialCase } from "@hybridgen/core/testing";
import { NativeCpuStage, createCpuBackend } from "../src/index.js";
import { CONFIGS, SEED, backend } from "./helpers.js";

// f32 accumulation in a different order than the f64 reference, over ≤ 3 000 tokens.
const TOL = 2e-5;

describe.each(CONFIGS)("attnPartial + attnMerge isa=$isa threads=$threads", (cfg) => {
  const check = (c: PartialCase) => {
    using be = backend(cfg);
    const cpu = runPartialCase(be, c);
    const ref = runPartialCase(new ReferenceBackend(), c);
    const what = `seed ${SEED}: ${JSON.stringify(c)}`;
    expect(relativeError(cpu.flash, cpu.materialized), `vs materialised, ${what}`).toBeLessThan(TOL);
    expect(relativeError(cpu.flash, ref.flash), `vs reference, ${what}`).toBeLessThan(TOL);
    expect(relativeError(cpu.part, ref.part), `partial vs reference, ${what}`).toBeLessThan(TOL);
  };

  it("equal the materialised softmax and the reference (GQA 1/4/8, f32 and bf16, odd spans)", () => {
    for (const c of partialCases(SEED % 100000)) check(c);
  });

  it("long spans in several pieces, head dims off the vector width", () => {
    check({ heads: 8, kvHeads: 2, headDim: 37, dtype: "bf16", cap: 3000, spans: [0, 4, 1700, 1300, 4, 1203], selected: 300, padded: 100, seed: SEED + 1, qScale: 4 });
    check({ heads: 6, kvHeads: 3, headDim: 20, dtype: "f16", cap: 2100, spans: [11, 2049], selected: 1, seed: SEED + 2 });
  });

  it("edges: no spans, no columns, a head with only −∞ columns", () => {
    check({ heads: 4, kvHeads: 2, headDim: 8, dtype: "f32", cap: 40, spans: [], selected: 9, seed: SEED + 3 });
    check({ heads: 4, kvHeads: 1, headDim: 8, dtype: "bf16", cap: 40, spans: [5, 11, 0, 0, 30, 7], selected: 0, seed: SEED + 4 });
    check({ heads: 4, kvHeads: 2, headDim: 8, dtype: "f32", cap: 40, spans: [0, 4, 20, 9], selected: 6, padded: 6, seed: SEED + 5 });
  });
});

describe("attnPartial / attnMerge bad input", () => {
  it("is a one-line error before native code", () => {
    using be = backend(CONFIGS[0]);
    const q = be.alloc([1, 16]), k = be.alloc([2, 4, 8]), part = be.alloc([2, 10]), out = be.alloc([1, 16]), logits = be.alloc([2, 4]);
    expect(() => be.attnPartial(part, q, 0, k, k, Int32Array.of(0), 1)).toThrow(/attnPartial: spans must be/);
    expect(() => be.attnPartial(part, q, 0, k, k, Int32Array.of(2, 3), 1)).toThrow(/attnPartial: tokens 2\.\.5 exceed the cache capacity 4/);
    expect(() => be.attnPartial(be.alloc([2, 9]), q, 0, k, k, Int32Array.of(0, 1), 1)).toThrow(/part .* must be \[2, 10\]/);
    expect(() => be.attnPartial(part, q, 0, k, be.alloc([2, 4, 8], "bf16"), Int32Array.of(0, 1), 1)).toThrow(/shape and dtype of k/);
    expect(() => be.attnMerge(out, 0, part, logits, 2, k, 0, 3)).toThrow(/attnMerge: columns 2\.\.5 exceed logits width 4/);
    expect(() => be.attnMerge(out, 0, part, logits, 0, k, 2, 3)).toThrow(/attnMerge: tokens 2\.\.5 exceed/);
    expect(() => be.attnMerge(part, 0, part, logits, 0, k, 0, 3)).toThrow(/attnMerge: out rows have/);
  });
});

describe("hybrid decode on the CPU backend: the window as a partial", () => {
  const fixed: Scheduler = { name: "fixed", initial: () => ({ k: 8, timing: "post" }), next: () => ({ k: 8, timing: "post" }), reset() {} };
  const topk: TokenSelector = {
    name: "topk", timings: ["post"], needsScores: false, usesBudget: true, kernel: "topk", initState: () => undefined,
    select: () => { throw new Error("the kernel runs it"); },
  };
  it.each(["exact", "verified"] as LogitsMode[])("top-K %s: the materialised window's greedy tokens, logits within 1e-5 (a 600-token window in pieces)", (logits) => {
    const { files } = tinyModel({ seed: 11 + (SEED % 1000), heads: 4, kvHeads: 2, layers: 2, maxPositions: 700 });
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
