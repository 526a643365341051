/**
 * Backend.attnPartial + attnMerge on the ReferenceBackend: one softmax over the spans' tokens ∪ the
 * given columns, equal to the materialised path (logits, softmax, attnAggregate) on random data;
 * the partial's own rows against a direct f64 computation; the edge cases (no spans, no columns,
 * a head whose columns are all −∞, nothing at all) and bad input.
 */
import { describe, expect, it } from "vitest";
import { ReferenceBackend } from "../src/index.js";
import { partialCases, relativeError, runPartialCase, testSeed } from "../src/testing/index.js";

const TOL = 1e-6; // both paths accumulate in f64; what differs is f32 storage of the partial

describe("ReferenceBackend attnPartial + attnMerge", () => {
  for (const c of partialCases(testSeed(4100))) {
    it(`equal the materialised softmax: ${c.dtype} ${c.heads}/${c.kvHeads} heads, d${c.headDim}, ${c.selected} selected`, () => {
      const r = runPartialCase(new ReferenceBackend(), c);
      expect(relativeError(r.flash, r.materialized)).toBeLessThan(TOL);
    });
  }

  it("partial rows: normalised output, max logit, sum of exponentials", () => {
    const be = new ReferenceBackend();
    const heads = 2, headDim = 3, q = be.alloc([1, heads * headDim]), k = be.alloc([1, 8, headDim]), v = be.alloc([1, 8, headDim]);
    be.write(q, Float32Array.of(1, 0, 0, 0, 1, 0));
    const kv = Float32Array.from({ length: 24 }, (_, i) => (i % 5) - 2);
    be.write(k, kv);
    be.write(v, kv.map((x) => x * 0.5));
    const part = be.alloc([heads, headDim + 2]);
    be.attnPartial(part, q, 0, k, v, Int32Array.of(6, 2, 1, 3), 1);
    const slots = [6, 7, 1, 2, 3];
    const p = be.read(part);
    for (let h = 0; h < heads; h++) {
      const logits = slots.map((s) => kv[s * 3 + h]);
      const m = Math.max(...logits);
      const w = logits.map((x) => Math.exp(x - m));
      const l = w.reduce((a, b) => a + b, 0);
      expect(p[h * 5 + 3]).toBeCloseTo(m, 6);
      expect(p[h * 5 + 4]).toBeCloseTo(l, 5);
      for (let d = 0; d < headDim; d++) expect(p[h * 5 + d]).toBeCloseTo(slots.reduce((a, s, j) => a + w[j] * kv[s * 3 + d] * 0.5, 0) / l, 5);
    }
  });

  it("edges: only columns, only spans, a head with nothing but −∞ columns, nothing at all", () => {
    const only = runPartialCase(new ReferenceBackend(), { heads: 4, kvHeads: 2, headDim: 8, dtype: "f32", cap: 40, spans: [], selected: 9, seed: 3 });
    expect(relativeError(only.flash, only.materialized)).toBeLessThan(TOL);
    expect(only.part.filter((_, i) => i % 10 === 9).every((l) => l === 0)).toBe(true); // l = 0 for every head
    const spansOnly = runPartialCase(new ReferenceBackend(), { heads: 4, kvHeads: 1, headDim: 8, dtype: "bf16", cap: 40, spans: [5, 11, 0, 0, 30, 7], selected: 0, seed: 4 });
    expect(relativeError(spansOnly.flash, spansOnly.materialized)).toBeLessThan(TOL);
    const padded = runPartialCase(new ReferenceBackend(), { heads: 4, kvHeads: 2, headDim: 8, dtype: "f32", cap: 40, spans: [0, 4, 20, 9], selected: 6, padded: 6, seed: 5 });
    expect(relativeError(padded.flash, padded.materialized)).toBeLessThan(TOL);

    const be = new ReferenceBackend();
    const q = be.alloc([1, 16]), k = be.alloc([2, 4, 8]), part = be.alloc([2, 10]), out = be.alloc([1, 16]), logits = be.alloc([2, 4]);
    be.write(out, new Float32Array(16).fill(7));
    be.write(logits, new Float32Array(8).fill(-Infinity));
    be.attnPartial(part, q, 0, k, k, new Int32Array(0), 1);
    expect(Array.from(be.read(part, 8, 2))).toEqual([-Infinity, 0]);
    be.attnMerge(out, 0, part, logits, 1, k, 0, 3);
    expect(Array.from(be.read(out))).toEqual(new Array(16).fill(0));
  });

  it("refuses bad spans, a mis-shaped partial and out-of-range columns", () => {
    const be = new ReferenceBackend();
    const q = be.alloc([1, 16]), k = be.alloc([2, 4, 8]), part = be.alloc([2, 10]), out = be.alloc([1, 16]), logits = be.alloc([2, 4]);
    expect(() => be.attnPartial(part, q, 0, k, k, Int32Array.of(0), 1)).toThrow(/pairs/);
    expect(() => be.attnPartial(part, q, 0, k, k, Int32Array.of(0, 1, 0, 1, 0, 1, 0, 1, 0, 1), 1)).toThrow(/at most 4/);
    expect(() => be.attnPartial(part, q, 0, k, k, Int32Array.of(2, 3), 1)).toThrow(/span start/);
    expect(() => be.attnPartial(be.alloc([2, 9]), q, 0, k, k, Int32Array.of(0, 1), 1)).toThrow(/part must be \[2, 10\]/);
    expect(() => be.attnPartial(part, q, 1, k, k, Int32Array.of(0, 1), 1)).toThrow(/qRow/);
    expect(() => be.attnMerge(out, 0, part, logits, 2, k, 0, 3)).toThrow(/column/);
    expect(() => be.attnMerge(out, 0, part, logits, 0, k, 2, 3)).toThrow(/start/);
    expect(() => be.attnMerge(out, 0, be.alloc([1, 10]), logits, 0, k, 0, 3)).toThrow(/part must be/);
  });
});
