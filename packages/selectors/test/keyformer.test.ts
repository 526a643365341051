import { describe, expect, it } from "vitest";
import { selectionForKvHead } from "@hybridgen/spec";
import { createSelector, GUMBEL_TABLE, gumbelIndex, gumbelTable, keyformer, keyformerTau, KeyformerOptionsSchema } from "../src/index.js";
import { postInput, preInput, randomCase, refTopK, rng } from "./helpers.js";

/** Plain reference: Gumbel noise from the same table entries, scores summed over steps. */
function reference(c: ReturnType<typeof randomCase>, steps: number, opts: Record<string, number>) {
  const o = KeyformerOptionsSchema.parse(opts);
  const table = gumbelTable(o.seed, 3); // layer 3, as helpers' base()
  const acc = Array.from({ length: c.layout.kvHeads }, () => new Array<number>(c.offloaded).fill(0));
  for (let s = 0; s < steps; s++) {
    const tau = o.tauStart + (o.tauEnd - o.tauStart) * Math.min(1, s / o.tauSteps);
    for (let h = 0; h < c.layout.heads; h++) {
      const g = Math.floor(h / c.layout.groupSize);
      const x = Array.from({ length: c.offloaded }, (_, j) => (c.logits[h]![j]! + o.noise * table[gumbelIndex(s, h, j)]!) / tau);
      const m = Math.max(...x);
      const e = x.map((v) => Math.exp(v - m));
      const sum = e.reduce((a, b) => a + b, 0);
      for (let j = 0; j < c.offloaded; j++) acc[g]![j]! += e[j]! / sum;
    }
  }
  return acc.map((a) => Float32Array.from(a));
}

describe("keyformer (accumulated Gumbel-softmax scores, post-QKᵀ)", () => {
  it("recent share plus the older tokens with the highest accumulated score, per KV head, over steps", () => {
    const r = rng(123);
    for (let t = 0; t < 30; t++) {
      const c = randomCase(r);
      c.offloaded = Math.min(c.offloaded, 400);
      c.k = Math.min(c.k, c.offloaded);
      const opts = { recentFraction: r(), seed: t, tauSteps: 3 };
      const sel = keyformer(opts);
      const input = postInput(sel, c);
      const steps = 1 + Math.floor(r() * 4);
      let out = sel.select(input);
      for (let s = 1; s < steps; s++) out = sel.select(input);
      const acc = reference(c, steps, opts);
      const recent = Math.min(c.k, Math.floor(c.k * opts.recentFraction));
      const older = c.offloaded - recent;
      for (let g = 0; g < c.layout.kvHeads; g++) {
        const want = [...refTopK(acc[g]!, c.k - recent, older), ...Array.from({ length: recent }, (_, i) => older + i)];
        expect(Array.from(selectionForKvHead(out, g)), `trial ${t} head ${g}`).toEqual(want);
      }
    }
  });

  it("without noise and recent share it is top-K of the softmax scores (one step)", () => {
    const c = randomCase(rng(7));
    const sel = keyformer({ noise: 0, recentFraction: 0 });
    const out = sel.select(postInput(sel, c));
    for (let g = 0; g < c.layout.kvHeads; g++) {
      const sum = Array.from({ length: c.offloaded }, (_, j) => {
        let s = 0;
        for (let h = g * c.layout.groupSize; h < (g + 1) * c.layout.groupSize; h++) {
          const row = c.logits[h]!.subarray(0, c.offloaded);
          const m = Math.max(...row);
          const z = row.reduce((a, v) => a + Math.exp(v - m), 0);
          s += Math.exp(row[j]! - m) / z;
        }
        return s;
      });
      expect(Array.from(selectionForKvHead(out, g))).toEqual(refTopK(sum, c.k, c.offloaded));
    }
  });

  it("the noise changes the choice with the seed; the same seed reproduces it", () => {
    const c = { ...randomCase(rng(11)), offloaded: 500, k: 20 };
    const pick = (seed: number) => {
      const sel = keyformer({ seed, recentFraction: 0 });
      return Array.from(selectionForKvHead(sel.select(postInput(sel, c)), 0));
    };
    expect(pick(1)).toEqual(pick(1));
    expect(pick(1)).not.toEqual(pick(2));
  });

  it("the noise table holds standard Gumbel samples; a head's tokens read distinct entries", () => {
    const t = gumbelTable(0, 0);
    const mean = t.reduce((a, x) => a + x, 0) / t.length;
    expect(mean).toBeCloseTo(0.5772, 1); // the Euler–Mascheroni constant
    const seen = new Set(Array.from({ length: GUMBEL_TABLE }, (_, j) => gumbelIndex(5, 2, j)));
    expect(seen.size).toBe(GUMBEL_TABLE);
  });

  it("τ rises linearly to tauEnd; refuses pre-QKᵀ; is a built-in; bad options name themselves", () => {
    const o = KeyformerOptionsSchema.parse({ tauStart: 1, tauEnd: 3, tauSteps: 4 });
    expect([0, 2, 4, 9].map((s) => keyformerTau(o, s))).toEqual([1, 2, 3, 3]);
    const c = randomCase(rng(1));
    const sel = createSelector("keyformer");
    expect(sel.timings).toEqual(["post"]);
    expect(() => sel.select(preInput(sel, c))).toThrow(/selector "keyformer" cannot run pre-QKᵀ selection/);
    expect(() => keyformer({ tauEnd: 0 })).toThrow(/selector "keyformer" options: tauEnd/);
  });
});
