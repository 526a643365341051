/**
 * The page index ranked on the device's side stream (Backend.beginSide/endSide/joinSide): where the
 * step is handed off and the query is sent signalled, each layer's ranking and its send go to the
 * side stream, beside the layer before's projections and window attention, and the compute stream
 * joins that stream before the recorded segment the section landed in ends. The logits are those of
 * the rankings in line, bit for bit, with rows gathered or fetched ahead, a lazy or an eager stage.
 */
import { describe, expect, it } from "vitest";
import { LlamaModel, ReferenceBackend, type Backend, type ModelFiles } from "@hybridgen/core";
import { createSelector } from "@hybridgen/selectors";
import { AddressBook, HostReference, maxAbsDiff, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { HybridAttention } from "../src/index.js";
import { fixedScheduler } from "./hybrid-helpers.js";
import { HandoffLink, QueuedStage } from "./handoff-link.js";
import { addRanking } from "./ranking-backend.js";
import { Recorder } from "./recorder.js";

const CONTEXT = 40, PROMPT = 12, LAYERS = 3, K = 3;
const STEPS = CONTEXT - PROMPT;

/**
 * A side stream as Backend.beginSide/endSide/joinSide promise it, checked in device order (the
 * recorder defers a segment's ops to its end, the link's with them): sections do not nest, each
 * holds one ranking and one send, no ranking or signalled send runs outside one, and a recorded
 * segment never ends with side work not joined.
 */
function withSide(be: ReferenceBackend, rec: Recorder, link: HandoffLink) {
  const side = { open: false, unjoined: 0, sections: 0, joins: 0, ranks: 0, sends: 0, outside: 0 };
  Object.assign(be, {
    beginSide: () => {
      if (side.open) throw new Error("beginSide inside a side section");
      side.open = true;
      side.sections++;
      side.ranks = side.sends = 0;
    },
    endSide: () => {
      if (!side.open) throw new Error("endSide without beginSide");
      if (side.ranks !== 1 || side.sends !== 1) throw new Error(`a side section held ${side.ranks} rankings and ${side.sends} sends, not one of each`);
      side.open = false;
      side.unjoined++;
    },
    joinSide: () => {
      if (side.open) throw new Error("joinSide inside a side section");
      if (side.unjoined) side.joins++;
      side.unjoined = 0;
    },
  });
  const dev = be as Backend, rank = dev.indexRank!.bind(dev);
  dev.indexRank = (...a: Parameters<NonNullable<Backend["indexRank"]>>) => {
    if (side.open) side.ranks++;
    else side.outside++;
    rank(...a);
  };
  const send = link.sendSignalled.bind(link);
  link.sendSignalled = (dst, src, bytes) => {
    rec.schedule(() => {
      if (side.open) side.sends++;
      else side.outside++;
    });
    return send(dst, src, bytes);
  };
  const end = rec.end.bind(rec);
  rec.end = () => {
    end();
    if (side.unjoined) throw new Error("a recorded segment ended with side work not joined: a capture refuses it");
  };
  return side;
}

function run(files: ModelFiles, tokens: number[], form: "int8" | "int4", o: { rowFetch: boolean; eager: boolean; side: boolean }) {
  const be = new ReferenceBackend(), rec = new Recorder(), book = new AddressBook(), host = new HostReference(book);
  const ranked = addRanking(be);
  const link = new HandoffLink(be, host, book, rec, { rowFetch: o.rowFetch });
  const side = o.side ? withSide(be, rec, link) : null;
  const model = LlamaModel.load(files, rec.wrap(be), { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: 6, sinkTokens: 1, kvEvictBlock: 2 });
  model.cache.attachHostStore(host, link);
  const stage = new QueuedStage(host, book, link, { eager: o.eager });
  const selector = createSelector("index", { form, pageSize: 5, superPages: 2, placement: "device" });
  const hybrid = HybridAttention.attach({ attention: model.attention, projector: model, stage, selector, scheduler: fixedScheduler(K, "pre") }, { logits: "verified" });
  expect(hybrid.deviceIndex).not.toBeNull();
  const out = [model.forward(Int32Array.from(tokens.slice(0, PROMPT)), 0)];
  for (let t = PROMPT; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]!), t));
  const handedOff = hybrid.stats.handedOffSteps, segments = rec.segments;
  hybrid.close();
  model.close();
  expect(be.liveTensors()).toBe(0);
  return { out, handedOff, segments, ranked: ranked.n, fetches: link.fetches, side };
}

describe("the page index ranked on the side stream", () => {
  const { files } = tinyModel({ seed: testSeed(351), maxPositions: 64, heads: 4, kvHeads: 2, layers: LAYERS });
  const tokens = randomIds(testSeed(451), CONTEXT);

  for (const form of ["int8", "int4"] as const) {
    it(`${form}: every layer's ranking and send in a section of its own, joined before its segment ends; the logits of the rankings in line`, () => {
      for (const rowFetch of [false, true]) {
        for (const eager of [false, true]) {
          const label = `${form} ${rowFetch ? "fetched ahead" : "gathered"} ${eager ? "eager" : "lazy"}`;
          const want = run(files, tokens, form, { rowFetch, eager, side: false }), got = run(files, tokens, form, { rowFetch, eager, side: true });
          expect(want.handedOff, label).toBe(STEPS);
          expect(got.handedOff, label).toBe(STEPS);
          expect(got.segments, label).toBeGreaterThan(0);
          expect(got.ranked, label).toBe(want.ranked);
          expect(got.ranked, label).toBe(STEPS * LAYERS);
          expect(got.fetches, label).toBe(want.fetches);
          const s = got.side!;
          expect(s.sections, label).toBe(STEPS * LAYERS);
          expect(s.outside, label).toBe(0);
          expect(s.joins, label).toBeGreaterThanOrEqual(STEPS);
          got.out.forEach((l, i) => expect(maxAbsDiff(l, want.out[i]!), `${label}, forward ${i}`).toBe(0));
        }
      }
    });
  }
});
