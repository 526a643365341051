/**
 * attnPartial + attnMerge on the CPU backend (every ISA, 1 and 2 threads): equal to the CPU
 * backend's own materialised path (logits, softmax, attnAggregate) and to the ReferenceBackend's
 * partial and merge, on core's random cases (GQA 1/4/8, f32 and bf16 K/V, odd spans of a wrapped
 * ring, −∞ columns); long spans cut into several pieces; the edges; bad input.
 */
import { describe, expect, it } from "vitest";
import { ReferenceBackend } from "@hybridgen/spec/kit";
import { partialCases, relativeError, runPartialCase, type PartialCase } from "@hybridgen/core/testing";
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
