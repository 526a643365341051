// What a plugin may and may not do: option keys it does not declare, ids that are not slots,
// and writes into its input, which must never reach the engine's buffers.
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { referencePrimitives, selectionForKvHead } from "@hybridgen/spec";
import { defineSelector, exactTopK } from "../src/index.js";
import { postInput, preInput, randomCase, refTopK, rng } from "./helpers.js";

const strided = defineSelector({
  name: "strided-contract",
  timings: ["pre"],
  options: z.object({ stride: z.number().int().positive().default(8) }),
  select: ({ offloaded, k }, { stride }) => {
    const ids: number[] = [];
    for (let slot = offloaded - 1; slot >= 0 && ids.length < k; slot -= stride) ids.push(slot);
    return { kind: "shared", ids };
  },
});

describe("plugin options", () => {
  it("an unknown key is an error naming it and the keys the selector takes", () => {
    expect(() => strided({ strde: 4 })).toThrow('selector "strided-contract" options: unknown key "strde" (it takes stride)');
    expect(() => exactTopK({ shared: true, k: 3 })).toThrow('selector "topk" options: unknown key "k" (it takes shared)');
    expect(strided({ stride: 4 }).name).toBe("strided-contract");
  });

  it("a schema that lets unknown keys through (loose) still may; one under a default is still checked", () => {
    const loose = defineSelector({ name: "loose", timings: ["pre"], options: z.object({ a: z.number().default(1) }).loose(), select: () => ({ kind: "shared", ids: [] }) });
    expect(() => loose({ a: 2, extra: true })).not.toThrow();
    const wrapped = defineSelector({ name: "wrapped", timings: ["pre"], options: z.object({ a: z.number() }).default({ a: 1 }), select: () => ({ kind: "shared", ids: [] }) });
    expect(() => wrapped({ b: 1 })).toThrow('selector "wrapped" options: unknown key "b" (it takes a)');
  });
});

describe("plugin schemas", () => {
  it("a schema from another copy of zod is taken by its safeParse; something else is refused", () => {
    // What another zod's object schema looks like from here: not an instance of this zod's classes.
    const foreign = { safeParse: (v: unknown) => ({ success: true as const, data: { ...(v as object), seen: true } }) };
    const sel = defineSelector({ name: "foreign-zod", timings: ["pre"], options: foreign as never, select: (_i, o) => ({ kind: "shared", ids: (o as { seen?: boolean }).seen ? [] : [0] }) });
    const built = sel({ any: 1 });
    const c = { ...randomCase(rng(14)), offloaded: 10, k: 2 };
    expect(Array.from(selectionForKvHead(built.select(preInput(built, c)), 0))).toEqual([]); // its parsed options reached select()
    expect(() => defineSelector({ name: "not-zod", timings: ["pre"], options: { parse: () => 1 } as never, select: () => ({ kind: "shared", ids: [] }) }))
      .toThrow('defineSelector("not-zod"): options: must be a zod schema (an object with safeParse)');
  });
});

describe("contract violations name the value", () => {
  const c = { ...randomCase(rng(11)), offloaded: 40, k: 4 };
  const cases: [unknown, string][] = [
    [{ kind: "shared", ids: [1, 2.5] }, "ids[1] is 2.5, not an integer slot"],
    [{ kind: "shared", ids: [NaN] }, "ids[0] is NaN, not an integer slot"],
    [{ kind: "shared", ids: ["3"] }, 'ids[0] is "3", not an integer slot'],
    [{ kind: "shared", ids: [undefined] }, "ids[0] is undefined, not an integer slot"],
    [{ kind: "shared", ids: new Float64Array([1, 0.5]) }, "ids[1] is 0.5, not an integer slot"],
    [{ kind: "shared", ids: [2 ** 32] }, "ids has id 4294967296 out of range [0, 40)"],
    [{ kind: "shared", ids: [-1] }, "ids has id -1 out of range [0, 40)"],
    [{ kind: "shared", ids: [1, 2, 3, 4, 5] }, "ids holds 5 ids, more than K = 4"],
    [{ kind: "perKvHead", ids: [[1], [7.25]] }, "KV head 1[0] is 7.25, not an integer slot"],
    [{ kind: "shared", ids: "0,1" }, "not a selection at ids"],
  ];
  for (const [garbage, msg] of cases) {
    it(`${JSON.stringify(garbage, (_k, v) => (typeof v === "number" && !Number.isFinite(v) ? String(v) : v))} → ${msg}`, () => {
      const layout = { ...c.layout, kvHeads: 2, groupSize: 1, heads: 2 };
      const cc = { ...c, layout, query: new Float32Array(2 * layout.headDim), logits: c.logits.slice(0, 2) };
      const sel = defineSelector({ name: "bad-ids", timings: ["pre"], select: () => garbage as never })();
      expect(() => sel.select(preInput(sel, cc))).toThrow(`selector "bad-ids" at layer 3, step 17: ${msg}`);
    });
  }
});

describe("a plugin's input is its own", () => {
  it("writes into logits, query, positions and scores leave the engine's arrays as they were; the rest is frozen", () => {
    const seen: { logits?: readonly Float32Array[]; frozen?: boolean } = {};
    const vandal = defineSelector({
      name: "vandal",
      timings: ["post"],
      needsScores: true,
      select: (input) => {
        if (input.timing !== "post") throw new Error("post only");
        // Chose first, from what the engine handed…
        const best = referencePrimitives.maxRows(input.logits, input.offloaded);
        const ids = input.primitives.topK(best, input.k, input.offloaded);
        // …then scribble over everything within reach.
        for (const row of input.logits) row.fill(1e9);
        input.query.fill(-7);
        input.positions.fill(0);
        for (const row of input.scores!.perKvHead) row.fill(3);
        seen.logits = input.logits;
        seen.frozen = Object.isFrozen(input.primitives) && Object.isFrozen(input.layout) && Object.isFrozen(input) && Object.isFrozen(input.logits);
        return { kind: "shared", ids };
      },
    });
    const r = rng(12);
    for (let trial = 0; trial < 20; trial++) {
      const c = randomCase(r);
      const sel = vandal();
      const input = postInput(sel, c);
      const before = { logits: input.logits.map((l) => l.slice()), query: input.query.slice(), positions: input.positions.slice(), scores: c.scores.perKvHead.map((s) => s.slice()) };
      const got = sel.select(input);
      expect(input.logits.map((l) => Array.from(l))).toEqual(before.logits.map((l) => Array.from(l)));
      expect(Array.from(input.query)).toEqual(Array.from(before.query));
      expect(Array.from(input.positions)).toEqual(Array.from(before.positions));
      expect(c.scores.perKvHead.map((s) => Array.from(s))).toEqual(before.scores.map((s) => Array.from(s)));
      expect(seen.frozen).toBe(true);
      expect(seen.logits![0]).not.toBe(input.logits[0]);
      // The copy held the engine's values: the plugin chose the true top-K of the group maxima.
      const max = Array.from({ length: c.offloaded }, (_, j) => Math.max(...before.logits.map((l) => l[j]!)));
      expect(Array.from(selectionForKvHead(got, 0))).toEqual(refTopK(max, c.k, c.offloaded));
    }
  });

  it("a plugin cannot replace a primitive the engine shares with the built-ins", () => {
    const thief = defineSelector({
      name: "thief",
      timings: ["pre"],
      select: (input) => {
        (input.primitives as { topK: unknown }).topK = () => new Int32Array(0);
        return { kind: "shared", ids: [] };
      },
    })();
    const c = randomCase(rng(13));
    const input = preInput(thief, c);
    const topK = input.primitives.topK;
    expect(() => thief.select(input)).toThrow(/^selector "thief" failed at layer 3, step 17: /);
    expect(input.primitives.topK).toBe(topK);
  });
});
