import { describe, expect, it } from "vitest";
import { z } from "zod";
import { HybridgenError, selectionForKvHead } from "@hybridgen/spec";
import { defineSelector } from "../src/index.js";
import { postInput, preInput, randomCase, rng } from "./helpers.js";

describe("defineSelector", () => {
  it("runs a well-behaved plugin and normalises its output (plain arrays, any order)", () => {
    const evens = defineSelector({
      name: "evens",
      timings: ["pre"],
      options: z.object({ stride: z.number().int().positive().default(2) }),
      select: ({ offloaded, k }, { stride }) => {
        const ids: number[] = [];
        for (let i = offloaded - 1; i >= 0 && ids.length < k; i--) if (i % stride === 0) ids.push(i);
        return { kind: "shared", ids };
      },
    });
    const c = { ...randomCase(rng(1)), offloaded: 50, k: 5 };
    const sel = evens({ stride: 3 });
    expect(Array.from(selectionForKvHead(sel.select(preInput(sel, c)), 0))).toEqual([36, 39, 42, 45, 48]);
  });

  it("names the plugin, layer and step when it returns garbage", () => {
    const c = { ...randomCase(rng(2)), offloaded: 40, k: 4 };
    const cases: [unknown, RegExp][] = [
      [{ kind: "shared", ids: [1, 2, 40] }, /selector "bad" at layer 3, step 17: ids has id 40 out of range \[0, 40\)/],
      [{ kind: "shared", ids: [5, 5] }, /selector "bad" at layer 3, step 17: ids has duplicate id 5/],
      [{ kind: "shared", ids: [1, 2, 3, 4, 5] }, /more than K = 4/],
      [{ kind: "perKvHead", ids: [] }, /selector "bad" at layer 3, step 17: not a selection/],
      [null, /selector "bad" at layer 3, step 17: not a selection/],
      [{ ids: [1] }, /not a selection/],
    ];
    for (const [garbage, re] of cases) {
      const bad = defineSelector({ name: "bad", timings: ["pre"], select: () => garbage as never });
      const sel = bad();
      expect(() => sel.select(preInput(sel, c))).toThrow(re);
    }
  });

  it("wraps a plugin that throws", () => {
    const boom = defineSelector({ name: "boom", timings: ["post"], select: () => { throw new TypeError("x is undefined"); } });
    const sel = boom();
    const c = randomCase(rng(3));
    expect(() => sel.select(postInput(sel, c))).toThrow(/selector "boom" failed at layer 3, step 17: x is undefined/);
  });

  it("rejects malformed definitions and options with one-line errors", () => {
    expect(() => defineSelector({ name: "Has Space", timings: ["pre"], select: () => ({ kind: "shared", ids: [] }) })).toThrow(/defineSelector\("Has Space"\): name: must be lower-case kebab-case/);
    expect(() => defineSelector({ name: "x", timings: [], select: () => ({ kind: "shared", ids: [] }) })).toThrow(/timings/);
    expect(() => defineSelector({ name: "x", timings: ["mid" as never], select: () => ({ kind: "shared", ids: [] }) })).toThrow(HybridgenError);
    expect(() => defineSelector({ name: "x", timings: ["pre"], select: 42 as never })).toThrow(/select: must be a function/);
    const noOpts = defineSelector({ name: "plain", timings: ["pre"], select: () => ({ kind: "shared", ids: [] }) });
    expect(() => noOpts({ k: 3 })).toThrow(/selector "plain" takes no options/);
  });

  it("checks the engine's input: head layout, logits rows, buffer lengths, K", () => {
    const sel = defineSelector({ name: "probe", timings: ["pre", "post"], select: () => ({ kind: "shared", ids: [] }) })();
    const c = randomCase(rng(4));
    const post = postInput(sel, c);
    expect(() => sel.select({ ...post, logits: post.logits.slice(1) })).toThrow(/selector "probe": bad input at layer 3, step 17: post-QKᵀ logits have/);
    expect(() => sel.select({ ...post, logits: post.logits.map((l) => l.subarray(0, c.offloaded - 1)) })).toThrow(/logits of head 0 hold/);
    expect(() => sel.select({ ...post, k: c.offloaded + 1 })).toThrow(/k=/);
    expect(() => sel.select({ ...post, query: new Float32Array(3) })).toThrow(/query has 3 values/);
    expect(() => sel.select({ ...post, layout: { ...c.layout, groupSize: c.layout.groupSize + 1 } })).toThrow(/head layout/);
    expect(() => sel.select({ ...post, positions: new Int32Array(0) })).toThrow(/positions has 0 entries/);
  });
});
