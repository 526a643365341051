import { describe, expect, it } from "vitest";
import { selectionForKvHead, stageKernel, streamingSelection } from "@hybridgen/spec";
import { topKSelection } from "@hybridgen/spec/kit";
import { allTokens, defineSelector, exactTopK, pairSelectors, quest, streamingLLM } from "../src/index.js";
import { postInput, preInput, randomCase, rng } from "./helpers.js";

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
  });

  it("streaming declares its sinks as a pre-QKᵀ kernel whose list is select()'s on random cases", () => {
    const r = rng(92);
    expect(streamingLLM().kernel).toEqual({ name: "streaming", sinks: 4 });
    for (let t = 0; t < 40; t++) {
      const c = randomCase(r);
      for (const sinks of [0, 1, 4, 1000]) {
        const sel = streamingLLM({ sinks });
        expect(sel.kernel).toEqual({ name: "streaming", sinks });
        const got = sel.select(preInput(sel, c));
        expect(got.kind).toBe("shared");
        expect(Array.from(selectionForKvHead(got, 0))).toEqual(Array.from(streamingSelection(c.offloaded, c.k, sinks)));
      }
    }
    expect(stageKernel(streamingLLM(), "post")).toBeUndefined();
    expect(streamingLLM({ sinks: 2 ** 40 }).kernel).toEqual({ name: "streaming", sinks: 0x7fffffff });
  });

  it("quest declares its pages as a pre-QKᵀ kernel; a pair keeps each half's kernel of its own timing", () => {
    expect(quest({ pageSize: 8 }).kernel).toEqual({ name: "quest", pageSize: 8 });
    const both = pairSelectors({ post: exactTopK(), pre: quest() });
    expect(both.kernel).toEqual(["topk", { name: "quest", pageSize: 16 }]);
    expect(stageKernel(both, "post")).toBe("topk");
    expect(stageKernel(both, "pre")).toEqual({ name: "quest", pageSize: 16 });
    const topkStreaming = pairSelectors({ post: exactTopK(), pre: streamingLLM({ sinks: 2 }) });
    expect(topkStreaming.kernel).toEqual(["topk", { name: "streaming", sinks: 2 }]);
    expect(stageKernel(topkStreaming, "post")).toBe("topk");
    expect(stageKernel(topkStreaming, "pre")).toEqual({ name: "streaming", sinks: 2 });
    expect(pairSelectors({ post: allTokens(), pre: quest({ pageSize: 4 }) }).kernel).toEqual({ name: "quest", pageSize: 4 }); // "all" would choose pre too
    expect(stageKernel(allTokens(), "pre")).toBe("all");
    expect(stageKernel(quest(), "post")).toBeUndefined();
  });

  it("defineSelector checks a kernel, also one made from options", () => {
    const select = () => ({ kind: "shared" as const, ids: new Int32Array(0) });
    expect(() => defineSelector({ name: "q", timings: ["pre"], kernel: { name: "quest", pageSize: 0 } as never, select })).toThrow(/defineSelector\("q"\): kernel/);
    const bad = defineSelector({ name: "q", timings: ["pre"], kernel: () => ({ name: "pages" }) as never, select });
    expect(() => bad()).toThrow(/selector "q": kernel\(options\) gave \{"name":"pages"\}, not a selector kernel/);
  });
});
