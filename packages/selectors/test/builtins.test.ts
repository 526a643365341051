import { describe, expect, it } from "vitest";
import { selectionForKvHead } from "@hybridgen/spec";
import { allTokens, createSelector, exactTopK, h2o, pairSelectors, streamingLLM } from "../src/index.js";
import { postInput, preInput, randomCase, refTopK, rng } from "./helpers.js";

const TRIALS = 60;

describe("exactTopK (post-QKᵀ)", () => {
  it("per KV head: top-K of the max over the group's query heads, equal to a plain reference", () => {
    const r = rng(2024);
    for (let t = 0; t < TRIALS; t++) {
      const c = randomCase(r);
      const sel = exactTopK();
      const out = sel.select(postInput(sel, c));
      expect(out.kind).toBe("perKvHead");
      for (let g = 0; g < c.layout.kvHeads; g++) {
        const best = Array.from({ length: c.offloaded }, (_, j) => {
          let m = -Infinity;
          for (let h = g * c.layout.groupSize; h < (g + 1) * c.layout.groupSize; h++) m = Math.max(m, c.logits[h]![j]!);
          return m;
        });
        expect(Array.from(selectionForKvHead(out, g)), `trial ${t} head ${g}`).toEqual(refTopK(best, c.k, c.offloaded));
      }
    }
  });

  it("shared: one list from the max over every head", () => {
    const r = rng(77);
    for (let t = 0; t < TRIALS; t++) {
      const c = randomCase(r);
      const sel = exactTopK({ shared: true });
      const out = sel.select(postInput(sel, c));
      expect(out.kind).toBe("shared");
      const best = Array.from({ length: c.offloaded }, (_, j) => Math.max(...c.logits.map((row) => row[j]!)));
      expect(Array.from(selectionForKvHead(out, 0))).toEqual(refTopK(best, c.k, c.offloaded));
    }
  });

  it("keeps its scratch state across steps as the store grows (no stale values leak in)", () => {
    const r = rng(5);
    const c = randomCase(r);
    const sel = exactTopK();
    const input = postInput(sel, c);
    const small = { ...input, offloaded: Math.max(1, c.offloaded >> 1), k: Math.min(c.k, Math.max(1, c.offloaded >> 1)) };
    sel.select(input);
    const out = sel.select(small);
    const best = Array.from({ length: small.offloaded }, (_, j) => Math.max(...c.logits.slice(0, c.layout.groupSize).map((row) => row[j]!)));
    expect(Array.from(selectionForKvHead(out, 0))).toEqual(refTopK(best, small.k, small.offloaded));
  });

  it("refuses pre-QKᵀ, naming itself", () => {
    const c = randomCase(rng(1));
    const sel = exactTopK();
    expect(() => sel.select(preInput(sel, c))).toThrow(/selector "topk" cannot run pre-QKᵀ selection/);
  });
});

describe("streamingLLM (pre-QKᵀ positional)", () => {
  it("oldest sinks plus newest tokens, K in all, for every timing", () => {
    const r = rng(31);
    for (let t = 0; t < TRIALS; t++) {
      const c = randomCase(r);
      const sinks = Math.floor(r() * 8);
      const sel = streamingLLM({ sinks });
      const s = Math.min(sinks, c.k);
      const want = [...Array.from({ length: s }, (_, i) => i), ...Array.from({ length: c.k - s }, (_, i) => c.offloaded - (c.k - s) + i)];
      for (const input of [preInput(sel, c), postInput(sel, c)]) {
        const out = sel.select(input);
        expect(out.kind).toBe("shared");
        expect(Array.from(selectionForKvHead(out, 0))).toEqual(want);
      }
    }
  });
  it("defaults to 4 sinks and rejects negative sinks", () => {
    const c = { ...randomCase(rng(2)), offloaded: 100, k: 6 };
    const sel = streamingLLM();
    expect(Array.from(selectionForKvHead(sel.select(preInput(sel, c)), 0))).toEqual([0, 1, 2, 3, 98, 99]);
    expect(() => streamingLLM({ sinks: -1 })).toThrow(/selector "streaming" options: sinks/);
  });
});

describe("allTokens", () => {
  it("returns every offloaded slot whatever K is", () => {
    const r = rng(8);
    for (let t = 0; t < 10; t++) {
      const c = { ...randomCase(r) };
      c.k = Math.min(c.k, 3);
      const sel = allTokens();
      expect(sel.usesBudget).toBe(false);
      expect(Array.from(selectionForKvHead(sel.select(preInput(sel, c)), 0))).toEqual(Array.from({ length: c.offloaded }, (_, i) => i));
    }
  });
});

describe("h2o (accumulated scores)", () => {
  it("recent share plus heavy hitters among the older tokens, per KV head", () => {
    const r = rng(99);
    for (let t = 0; t < TRIALS; t++) {
      const c = randomCase(r);
      const frac = r();
      const sel = h2o({ recentFraction: frac });
      expect(sel.needsScores).toBe(true);
      const out = sel.select(preInput(sel, c));
      const recent = Math.min(c.k, Math.floor(c.k * frac));
      const older = c.offloaded - recent;
      for (let g = 0; g < c.layout.kvHeads; g++) {
        const want = [...refTopK(c.scores.perKvHead[g]!, c.k - recent, older), ...Array.from({ length: recent }, (_, i) => older + i)];
        expect(Array.from(selectionForKvHead(out, g))).toEqual(want);
      }
    }
  });
  it("fails clearly when the engine passes no scores", () => {
    const c = randomCase(rng(4));
    const sel = h2o();
    expect(() => sel.select({ ...preInput(sel, c), scores: undefined })).toThrow(/selector "h2o" needs accumulated scores/);
  });
});

describe("createSelector", () => {
  it("builds built-ins by name and lists them for an unknown name", () => {
    expect(createSelector("topk").timings).toEqual(["post"]);
    expect(createSelector("streaming", { sinks: 2 }).timings).toEqual(["pre", "post"]);
    expect(() => createSelector("nope")).toThrow(/unknown selector "nope" \(registered: topk, streaming, all, h2o, quest, index, infinigen, keyformer; a plugin is a module path or package/);
  });
});

describe("pairSelectors", () => {
  it("dispatches post to the score-based half and pre to the positional half, each with its own state", () => {
    const r = rng(61);
    const pair = pairSelectors({ post: exactTopK(), pre: streamingLLM({ sinks: 2 }) });
    expect(pair.name).toBe("topk+streaming");
    expect(pair.timings).toEqual(["pre", "post"]);
    for (let t = 0; t < 20; t++) {
      const c = randomCase(r);
      const post = pair.select(postInput(pair, c));
      const ref = exactTopK();
      expect(post).toEqual(ref.select(postInput(ref, c)));
      const pre = pair.select(preInput(pair, c));
      const refPre = streamingLLM({ sinks: 2 });
      expect(pre).toEqual(refPre.select(preInput(refPre, c)));
    }
  });
  it("refuses halves that cannot run their timing", () => {
    expect(() => pairSelectors({ post: exactTopK(), pre: exactTopK() })).toThrow(/selector "topk" cannot run pre-QKᵀ/);
  });
});
