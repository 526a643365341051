import { describe, expect, it } from "vitest";
import { selectionForKvHead, topKSelection } from "@hybridgen/core";
import { allTokens, exactTopK, streamingLLM } from "../src/index.js";
import { postInput, randomCase, rng } from "./helpers.js";

// The engine may run a selector's `kernel` in the CPU stage instead of calling select():
// both must choose the same slots.
describe("kernel hints equal select()", () => {
  it("topk / topk-shared / all match the stage kernel's semantics on random cases", () => {
    const r = rng(91);
    for (let t = 0; t < 40; t++) {
      const c = randomCase(r);
      for (const shared of [false, true]) {
        const sel = exactTopK({ shared });
        expect(sel.kernel).toBe(shared ? "topk-shared" : "topk");
        const got = sel.select(postInput(sel, c));
        const want = topKSelection(c.logits, c.offloaded, c.k, shared, c.layout);
        for (let g = 0; g < c.layout.kvHeads; g++) {
          expect(Array.from(selectionForKvHead(got, g))).toEqual(Array.from(selectionForKvHead(want, g)));
        }
      }
      const all = allTokens();
      expect(all.kernel).toBe("all");
      expect(Array.from(selectionForKvHead(all.select(postInput(all, c)), 0))).toEqual(Array.from({ length: c.offloaded }, (_, i) => i));
    }
    expect(streamingLLM().kernel).toBeUndefined();
  });
});
