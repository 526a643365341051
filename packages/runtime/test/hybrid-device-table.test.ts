/**
 * A verified layer's table made on the device (HostTransfers.indexTable, HybridOptions.indexTables
 * "device"): where the device ranks the page index and the step is handed off, the verified layers' [counts | ids] tables come from
 * the device's own pages — no CPU stage job, no round trip — and the logits equal those of the
 * stage filling its lists from the same pages, bit for bit (pages of 5 rows, so lists end in a
 * partial page chosen by exact q̃·k), with rows gathered on the compute stream or fetched ahead; on a
 * backend with a side stream each layer's ranking and table go there, joined before a segment ends.
 */
import { describe, expect, it } from "vitest";
import { indexTable, LlamaModel, offloadedKeys, ReferenceBackend, referencePrimitives, type ModelFiles } from "@hybridgen/core";
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
 * A side stream as Backend.beginSide/endSide/joinSide promise it, checked as the ops run (the
 * recorder defers them with the rest of a segment): sections do not nest, each makes one table, and
 * a recorded segment never ends with side work not joined.
 */
function withSide(be: ReferenceBackend, rec: Recorder, link: HandoffLink) {
  const side = { open: false, unjoined: 0, sections: 0, joins: 0, tablesAtBegin: 0 };
  Object.assign(be, {
    beginSide: () => {
      if (side.open) throw new Error("beginSide inside a side section");
      side.open = true;
      side.sections++;
      side.tablesAtBegin = link.tablesMade;
    },
    endSide: () => {
      if (!side.open) throw new Error("endSide without beginSide");
      if (link.tablesMade !== side.tablesAtBegin + 1) throw new Error(`a side section made ${link.tablesMade - side.tablesAtBegin} tables, not one`);
      side.open = false;
      side.unjoined++;
    },
    joinSide: () => {
      if (side.open) throw new Error("joinSide inside a side section");
      if (side.unjoined) side.joins++;
      side.unjoined = 0;
    },
  });
  const end = rec.end.bind(rec);
  rec.end = () => {
    end();
    if (side.unjoined) throw new Error("a recorded segment ended with side work not joined: a capture refuses it");
  };
  return side;
}

function run(files: ModelFiles, tokens: number[], form: "int8" | "int4", o: { tables: boolean; rowFetch: boolean; eager: boolean; side?: boolean; indexTables?: "device" | "stage" }) {
  const be = new ReferenceBackend(), rec = new Recorder(), book = new AddressBook(), host = new HostReference(book);
  const ranked = addRanking(be);
  const link = new HandoffLink(be, host, book, rec, { rowFetch: o.rowFetch, indexTable: o.tables });
  const side = o.side ? withSide(be, rec, link) : null;
  const model = LlamaModel.load(files, rec.wrap(be), { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: 6, sinkTokens: 1, kvEvictBlock: 2 });
  model.cache.attachHostStore(host, link);
  const stage = new QueuedStage(host, book, link, { eager: o.eager });
  let jobs = 0;
  const submit = stage.submit.bind(stage);
  stage.submit = (job) => {
    jobs++;
    submit(job);
  };
  const selector = createSelector("index", { form, pageSize: 5, superPages: 2, placement: "device" });
  const hybrid = HybridAttention.attach({ attention: model.attention, projector: model, stage, selector, scheduler: fixedScheduler(K, "pre") }, { logits: "verified", indexTables: o.indexTables ?? "device" });
  expect(hybrid.deviceIndex).not.toBeNull();
  const out = [model.forward(Int32Array.from(tokens.slice(0, PROMPT)), 0)];
  for (let t = PROMPT; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]!), t));
  const handedOff = hybrid.stats.handedOffSteps;
  hybrid.close();
  model.close();
  expect(be.liveTensors()).toBe(0);
  return { out, handedOff, jobs, tables: link.tablesMade, ranked: ranked.n, fetches: link.fetches, side };
}

describe("verified layers' tables made on the device from its ranked pages", () => {
  const { files } = tinyModel({ seed: testSeed(351), maxPositions: 64, heads: 4, kvHeads: 2, layers: LAYERS });
  const tokens = randomIds(testSeed(451), CONTEXT);

  for (const form of ["int8", "int4"] as const) {
    it(`${form}: the logits of the stage's lists from the same pages, one stage job a step (layer 0's), rows gathered or fetched ahead`, () => {
      for (const rowFetch of [false, true]) {
        for (const eager of [false, true]) {
          const label = `${form} ${rowFetch ? "fetched ahead" : "gathered"} ${eager ? "eager" : "lazy"}`;
          const want = run(files, tokens, form, { tables: false, rowFetch, eager }), got = run(files, tokens, form, { tables: true, rowFetch, eager });
          expect(want.tables, label).toBe(0);
          expect(want.jobs, label).toBe(STEPS * LAYERS);
          expect(got.handedOff, label).toBe(STEPS);
          expect(got.tables, label).toBe(STEPS * (LAYERS - 1));
          expect(got.jobs, label).toBe(STEPS);
          expect(got.ranked, label).toBe(want.ranked);
          expect(got.fetches, label).toBe(want.fetches);
          got.out.forEach((l, i) => expect(maxAbsDiff(l, want.out[i]!), `${label}, forward ${i}`).toBe(0));
          // On a backend with a side stream: each layer's ranking and table in a section of their own, joined (the same logits).
          const sided = run(files, tokens, form, { tables: true, rowFetch, eager, side: true });
          expect(sided.side!.sections, label).toBe(STEPS * (LAYERS - 1));
          expect(sided.side!.joins, label).toBeGreaterThanOrEqual(STEPS);
          sided.out.forEach((l, i) => expect(maxAbsDiff(l, want.out[i]!), `${label} on the side stream, forward ${i}`).toBe(0));
          // The default ("stage"): a link that makes tables is left unasked.
          const staged = run(files, tokens, form, { tables: true, rowFetch, eager, indexTables: "stage" });
          expect(staged.tables, label).toBe(0);
          expect(staged.jobs, label).toBe(STEPS * LAYERS);
          staged.out.forEach((l, i) => expect(maxAbsDiff(l, want.out[i]!), `${label} stage tables, forward ${i}`).toBe(0));
        }
      }
    });
  }
});

describe("indexTable (the definition a link's table meets)", () => {
  it("whole pages while they fit, the partial page by its best rows (max over the group, ties to the lower slot), ids ascending, counts first, −1 pages ending a list", () => {
    // 2 KV heads, group 2, headDim 2, 12 rows of which n = 11 offloaded, pages of 4 (the last one 3 rows).
    const kv = 2, group = 2, d = 2, cap = 12, n = 11, pageSize = 4;
    const k = offloadedKeys("f32", kv, cap, d, Float32Array.from({ length: kv * cap * d }, (_, i) => ((i * 7) % 5) - 2));
    const q = Float32Array.of(1, 0, 0, 1, -1, 0, 0, -1);
    // head 0: pages 2 (3 rows), then 0 (4 rows) then 1: budget 9 takes 2 of page 1's rows; head 1: page 1, then −1 ends it.
    const pages = Int32Array.of(2, 0, 1, 1, -1, 0);
    const t = indexTable(referencePrimitives, q, group, k, pages, 3, pageSize, n, 9, 10);
    expect([t[0], t[1]]).toEqual([9, 4]);
    const scores = (g: number, s: number) => Math.max(...[0, 1].map((j) => q[(g * group + j) * d]! * k.data[(g * cap + s) * d]! + q[(g * group + j) * d + 1]! * k.data[(g * cap + s) * d + 1]!));
    const page1 = [4, 5, 6, 7].sort((a, b) => scores(0, b) - scores(0, a) || a - b).slice(0, 2);
    expect(Array.from(t.subarray(kv, kv + 9))).toEqual([0, 1, 2, 3, ...page1.sort((a, b) => a - b), 8, 9, 10]);
    expect(Array.from(t.subarray(kv + 10, kv + 14))).toEqual([4, 5, 6, 7]);
    expect(() => indexTable(referencePrimitives, q, group, k, pages, 3, pageSize, n, 9, 8)).toThrow(/^page index: a list of 9 rows does not fit a table of 8 ids a KV head$/);
  });
});
