/**
 * Rows fetched ahead (HostTransfers.rowFetch): a handed-off layer's selected rows are gathered on
 * a side stream (StandInRowFetch: each fetch runs as soon as its job is done, reading the table and
 * host rows as they are then) and the layer waits for them (ready) and frees the slot after its
 * merge (release). The logits equal the compute-stream gathers' bit for bit, one fetch and one
 * ready a layer a step (a batched step's rows: batch-hybrid-handoff.test.ts); the stand-in throws on misuse.
 */
import { describe, expect, it } from "vitest";
import { LlamaModel, ReferenceBackend, type HostSignal, type ModelFiles, type RowFetchGather } from "@hybridgen/core";
import { HybridAttention } from "../src/index.js";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { fixedScheduler, KERNEL_CASES, type KernelCase } from "./hybrid-helpers.js";
import { HandoffLink, QueuedStage, StandInRowFetch } from "./handoff-link.js";
import { AddressBook, HostReference } from "@hybridgen/core/testing";
import { Recorder } from "./recorder.js";

const CONTEXT = 40, PROMPT = 12, LAYERS = 3;
const STEPS = CONTEXT - PROMPT;

type Case = KernelCase;
const CASES = KERNEL_CASES;

/** One sequence decoded handed off, through a link with or without rowFetch, its stage eager or lazy. */
function run(files: ModelFiles, tokens: number[], c: Case, o: { rowFetch: boolean; eager: boolean }) {
  const be = new ReferenceBackend(), rec = new Recorder(), book = new AddressBook(), host = new HostReference(book);
  const link = new HandoffLink(be, host, book, rec, { rowFetch: o.rowFetch });
  const model = LlamaModel.load(files, rec.wrap(be), { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: 6, sinkTokens: 1, kvEvictBlock: 2 });
  model.cache.attachHostStore(host, link);
  const stage = new QueuedStage(host, book, link, { eager: o.eager });
  const hybrid = HybridAttention.attach(
    { attention: model.attention, projector: model, stage, selector: c.selector(), scheduler: fixedScheduler(c.k, c.timing) }, { logits: c.logits });
  const out = [model.forward(Int32Array.from(tokens.slice(0, PROMPT)), 0)];
  for (let t = PROMPT; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]!), t));
  const handedOff = hybrid.stats.handedOffSteps;
  hybrid.close();
  model.close();
  expect(be.liveTensors()).toBe(0);
  return {
    out, handedOff, awaited: link.awaited, fetches: link.fetches, readies: link.readies, rowFetches: link.rowFetches.length,
    superseded: link.rowFetches.reduce((n, f) => n + f.superseded, 0), closed: link.rowFetches.every((f) => f.closed),
  };
}

describe("rows fetched ahead on a side stream (RowFetch)", () => {
  const { files } = tinyModel({ seed: testSeed(350), maxPositions: 64, heads: 4, kvHeads: 2, layers: LAYERS });
  const tokens = randomIds(testSeed(450), CONTEXT);

  /** Each case decoded with an eager and a lazy stage, with rowFetch and without: the same logits, a fetch and a ready a layer a step. */
  function expectFetchedAhead(cases: Case[]): void {
    for (const c of cases) {
      for (const eager of [false, true]) {
        const label = `${c.selector().name} ${c.logits} ${eager ? "eager" : "lazy"}`;
        const want = run(files, tokens, c, { rowFetch: false, eager }), got = run(files, tokens, c, { rowFetch: true, eager });
        expect(want.fetches, label).toBe(0);
        expect(got.handedOff, label).toBe(STEPS);
        expect(got.rowFetches, label).toBe(1);
        expect(got.fetches, label).toBe(STEPS * LAYERS);
        expect(got.readies, label).toBe(STEPS * LAYERS);
        expect(got.awaited, label).toBe(STEPS * LAYERS);
        expect(got.superseded, label).toBe(0);
        expect(got.closed, label).toBe(true);
        got.out.forEach((l, i) => expect(maxAbsDiff(l, want.out[i]!), `${label}, step ${i}`).toBe(0));
      }
    }
  }

  it("exact logits (each layer fetched just before its segment), top-K, Quest and streaming kernels, eager and lazy stages", () => {
    expectFetchedAhead(CASES.filter((c) => c.logits === "exact"));
  });

  it("speculative and verified logits (the next layer fetched during this one), top-K, Quest and streaming kernels, eager and lazy stages", () => {
    expectFetchedAhead(CASES.filter((c) => c.logits !== "exact"));
  });
});

// ---- the stand-in itself ----------------------------------------------------------------------

const GROUPS = 2, CAP = 4, WIDTH = 3, KMAX = 2;

/** A RowFetch on a bare HandoffLink, a host store [GROUPS, CAP, WIDTH] of row values 100·g + row, and a [counts | ids] table. */
function bare() {
  const be = new ReferenceBackend(), rec = new Recorder(), book = new AddressBook(), host = new HostReference(book);
  const link = new HandoffLink(be, host, book, rec, { rowFetch: true });
  const rf = link.rowFetch!() as StandInRowFetch;
  const store = host.alloc([GROUPS * CAP, WIDTH]);
  for (let g = 0; g < GROUPS; g++) for (let r = 0; r < CAP; r++) host.write(store, new Float32Array(WIDTH).fill(100 * g + r), (g * CAP + r) * WIDTH);
  const table = Int32Array.of(KMAX, KMAX, 0, 1, 2, 3); // counts, then ids [GROUPS, KMAX]
  const tableRegion = book.add({ kind: "ints", data: () => table }, table.length * 4);
  const dst = [be.alloc([GROUPS * KMAX, WIDTH]), be.alloc([GROUPS * KMAX, WIDTH])];
  const gathers = (slot: 0 | 1): RowFetchGather[] => [
    { dst: dst[slot]!, src: host.hostRegion(store), rows: { groups: GROUPS, cap: CAP, rowBytes: WIDTH * 4, kmax: KMAX }, table: tableRegion },
  ];
  /** The first element of each gathered row of a slot. */
  const rows = (slot: 0 | 1) => Array.from({ length: GROUPS * KMAX }, (_, i) => be.read(dst[slot]!, i * WIDTH, 1)[0]!);
  let value = 0;
  const signal = (): HostSignal => ({ address: 0x40, value: ++value });
  return { be, rec, link, rf, table, gathers, rows, signal, raise: (s: HostSignal) => link.raise(s) };
}

describe("StandInRowFetch", () => {
  it("a fetch runs at once when its done is reached, even inside a recorded segment; ready and release are recorded device ops", () => {
    const t = bare(), d = t.signal();
    t.raise(d);
    t.rec.begin("s");
    t.rf.fetch(0, d, t.gathers(0));
    expect(t.rows(0)).toEqual([0, 1, 102, 103]); // gathered before the segment ends: the side stream is not recorded
    t.rf.ready(0);
    t.rf.release(0);
    expect(t.rf.readies).toBe(0);
    t.rec.end();
    expect([t.rf.fetches, t.rf.readies, t.rf.releases]).toEqual([1, 1, 1]);
  });

  it("a fetch whose done is not reached waits, then gathers the table and rows as they are when it is raised", () => {
    const t = bare(), d = t.signal();
    t.rf.fetch(1, d, t.gathers(1));
    expect(t.rows(1)).toEqual([0, 0, 0, 0]);
    t.table.set([1, 2, 3, 0, 0, 1]); // the stage rewrites its table before raising done
    t.raise(d);
    expect(t.rows(1)).toEqual([3, 0, 100, 101]);
    t.rf.ready(1);
    t.rf.release(1);
  });

  it("the side stream runs its fetches in call order: a later fetch whose done is reached waits behind an earlier one's", () => {
    const t = bare(), d1 = t.signal(), d2 = t.signal();
    t.link.raise({ address: 0x80, value: 1 });
    t.rf.fetch(0, d1, t.gathers(0));
    t.rf.fetch(1, { address: 0x80, value: 1 }, t.gathers(1));
    expect(t.rows(1)).toEqual([0, 0, 0, 0]);
    t.raise(d2); // d2 ≥ d1 on the same word: both reached
    expect(t.rows(0)).toEqual([0, 1, 102, 103]);
    expect(t.rows(1)).toEqual([0, 1, 102, 103]);
  });

  it("ready without a fetch, or a second ready for one fetch, throws", () => {
    const t = bare();
    expect(() => t.rf.ready(0)).toThrow("ready(0) with no fetch(0) ever issued");
    const u = bare(), d = u.signal();
    u.raise(d);
    u.rf.fetch(0, d, u.gathers(0));
    u.rf.ready(0);
    u.rf.release(0);
    expect(() => u.rf.ready(0)).toThrow("no fetch(0) since the last ready(0)");
  });

  it("a ready whose fetch waits for a done no queued job raises would hang: it throws", () => {
    const t = bare(), d = t.signal();
    t.rf.fetch(0, d, t.gathers(0));
    t.rec.begin("s");
    t.rf.ready(0);
    expect(() => t.rec.end()).toThrow(/ready\(0\) waits for fetch 1 of slot 0.*it would hang/);
  });

  it("a fetch into a slot not released since its ready throws (it would refill rows in use, or the next ready would wait forever)", () => {
    const t = bare(), d1 = t.signal(), d2 = t.signal();
    t.raise(d2);
    t.rf.fetch(0, d1, t.gathers(0));
    t.rf.ready(0);
    expect(() => t.rf.fetch(0, d2, t.gathers(0))).toThrow("while slot 0 is in use");
  });

  it("a fetch while the slot's release is recorded but not launched throws: it would not wait for that release", () => {
    const t = bare(), d1 = t.signal(), d2 = t.signal();
    t.raise(d2);
    t.rf.fetch(0, d1, t.gathers(0));
    t.rec.begin("s");
    t.rf.ready(0);
    t.rf.release(0);
    expect(() => t.rf.fetch(0, d2, t.gathers(0))).toThrow("release(0) is recorded in a segment not launched yet");
  });

  it("a fetch before the ready recorded for the slot's previous fetch launched throws; a ready recorded before its own fetch takes it", () => {
    const t = bare(), d1 = t.signal(), d2 = t.signal();
    t.raise(d2);
    t.rf.fetch(0, d1, t.gathers(0));
    t.rec.begin("s");
    t.rf.ready(0);
    expect(() => t.rf.fetch(0, d2, t.gathers(0))).toThrow("that ready would take this fetch's rows instead");
    const u = bare(), e = u.signal();
    u.raise(e);
    u.rec.begin("s");
    u.rf.ready(1);
    u.rf.fetch(1, e, u.gathers(1)); // before the ready launches: the one it waits for
    u.rf.release(1);
    u.rec.end();
    expect([u.rf.readies, u.rf.releases]).toEqual([1, 1]);
  });

  it("a release without a ready, or a call after close(), throws; close() waits for the side stream", () => {
    const t = bare();
    expect(() => t.rf.release(1)).toThrow("release(1) without a ready(1)");
    const u = bare(), d = u.signal();
    u.rf.fetch(0, d, u.gathers(0));
    expect(() => u.rf.close()).toThrow("RowFetch.close() waits for fetch 1 of slot 0");
    expect(() => u.rf.fetch(1, d, u.gathers(1))).toThrow("RowFetch.fetch() after close()");
  });
});
