/**
 * Batched hybrid steps handed off on the device: in a step of B sequences each sequence's
 * HybridAttention queues its layers' stage jobs with done signals in a word of its own, the device
 * waits for each job (QueuedStage: it runs when the device reaches its wait, or as early as it may
 * for an eager stage) and reads its output in place, and the host waits for each sequence's stage
 * once, at the step's end. The logits equal the per-layer batched path's and each sequence's alone,
 * bit for bit, as sequences join and leave; a failing stage job is the step's error.
 */
import { describe, expect, it } from "vitest";
import { BatchDecoder, LlamaModel, ReferenceBackend, type Attention, type KvCache } from "@hybridgen/core";
import { HybridAttention, type HybridOptions } from "../src/index.js";
import { SendBatch } from "../src/hybrid/transport/send-batch.js";
import { HandOffBatch } from "../src/hybrid/transport/hand-off-batch.js";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { fixedScheduler, KERNEL_CASES, type KernelCase } from "./hybrid-helpers.js";
import { HandoffLink, QueuedStage } from "./handoff-link.js";
import { AddressBook, HostReference, StagedBackendCpuStage } from "@hybridgen/core/testing";
import { CheckedLink, Recorder } from "./recorder.js";

const CONTEXT = 40, LAYERS = 3, SLOTS = 3;
const { files } = tinyModel({ seed: testSeed(350), maxPositions: 64, heads: 4, kvHeads: 2, layers: LAYERS });

type Case = KernelCase;
const CASES = KERNEL_CASES;

/**
 * Continuous batching over 3 slots: sequence 1 leaves after 5 steps (2 rows for two steps), sequence
 * 3 is prefilled into its slot and joins at step 7, sequence 0 leaves after step 11 and sequence 2
 * decodes its last two steps alone (the batch-1 step). Every prompt is longer than the window.
 */
const SEQS = [
  { slot: 0, join: 0, prompt: 12, steps: 12 },
  { slot: 1, join: 0, prompt: 9, steps: 5 },
  { slot: 2, join: 0, prompt: 7, steps: 14 },
  { slot: 1, join: 7, prompt: 8, steps: 5 },
];
const STEPS = 14, ROW_STEPS = SEQS.reduce((n, s) => n + s.steps, 0);
/** Each sequence's prompt, then the tokens it is fed one a step (the same inputs on every path). */
const TOKENS = SEQS.map((s, i) => randomIds(testSeed(460 + i), s.prompt + s.steps));

/** How a run's stages hand off: null, the per-layer path; else queued stages (stage `eager` eager, `fail` failing at a job). */
interface Handoff {
  eager?: number;
  fail?: { stage: number; job: number };
  /** The link fetches rows ahead on its side stream (HandoffLink's RowFetch stand-in). */
  rowFetch?: boolean;
}

/** A model on a recording backend with its KV store in host memory; every sequence it makes gets its own HybridAttention and stage. */
class Rig {
  readonly be = new ReferenceBackend();
  readonly rec = new Recorder();
  readonly book = new AddressBook();
  readonly host = new HostReference(this.book);
  readonly link: CheckedLink;
  readonly model: LlamaModel;
  readonly hybrids: HybridAttention[] = [];
  readonly stages: StagedBackendCpuStage[] = [];

  constructor(private readonly c: Case, private readonly handoff: Handoff | null, private readonly options: HybridOptions = {}) {
    this.link = handoff
      ? new HandoffLink(this.be, this.host, this.book, this.rec, { rowFetch: handoff.rowFetch ?? false })
      : new CheckedLink(this.be, this.host, this.book, this.rec, false);
    this.model = LlamaModel.load(files, this.rec.wrap(this.be), { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: 6, sinkTokens: 1, kvEvictBlock: 2 });
    this.attach(this.model.attention, this.model.cache);
    this.model.setSequenceSetup((s) => this.attach(s.attention, s.cache));
  }

  private attach(attention: Attention, cache: KvCache): HybridAttention {
    cache.attachHostStore(this.host, this.link);
    const i = this.stages.length, h = this.handoff;
    const stage = h
      ? new QueuedStage(this.host, this.book, this.link as HandoffLink, { eager: h.eager === i, failAt: h.fail?.stage === i ? h.fail.job : undefined })
      : new StagedBackendCpuStage(this.host, this.book);
    this.stages.push(stage);
    const hybrid = HybridAttention.attach(
      { attention, projector: this.model, stage, selector: this.c.selector(), scheduler: fixedScheduler(this.c.k, this.c.timing) }, { logits: this.c.logits, ...this.options });
    this.hybrids.push(hybrid);
    return hybrid;
  }

  get waits(): number[] {
    return this.stages.map((s) => (s instanceof QueuedStage ? s.waits : 0));
  }

  close(): void {
    this.hybrids[0]!.close();
    this.model.close();
    expect(this.be.liveTensors()).toBe(0);
  }
}

/** SEQS decoded through a BatchDecoder: per sequence, the logits after its prompt and after every step. */
function batched(r: Rig): Float32Array[][] {
  const out = SEQS.map(() => [] as Float32Array[]);
  using dec = new BatchDecoder(r.model, SLOTS);
  for (let t = 0; t < STEPS; t++) {
    SEQS.forEach((s, i) => {
      if (s.join !== t) return;
      dec.prefill(s.slot, Int32Array.from(TOKENS[i]!.slice(0, s.prompt)), 0);
      out[i]!.push(dec.logits(s.slot));
    });
    const rows = SEQS.map((s, i) => ({ s, i })).filter(({ s }) => s.join <= t && t < s.join + s.steps);
    dec.step(rows.map(({ s }) => s.slot), Int32Array.from(rows, ({ s, i }) => TOKENS[i]![s.prompt + t - s.join]!));
    for (const { s, i } of rows) out[i]!.push(dec.logits(s.slot));
  }
  return out;
}

/** Sequence i decoded on its own (the batch-1 step, handed off when `handoff` is). */
function alone(c: Case, handoff: Handoff | null, i: number, options: HybridOptions = {}): Float32Array[] {
  const r = new Rig(c, handoff, options), s = SEQS[i]!, ids = TOKENS[i]!;
  const out = [r.model.forward(Int32Array.from(ids.slice(0, s.prompt)), 0)];
  for (let p = s.prompt; p < ids.length; p++) out.push(r.model.forward(Int32Array.of(ids[p]!), p));
  if (handoff) expect(r.hybrids[0]!.stats.handedOffSteps).toBe(s.steps);
  r.close();
  return out;
}

function expectSame(got: Float32Array[][], want: Float32Array[][], label: string): void {
  got.forEach((rows, i) => {
    expect(rows.length, `${label}, sequence ${i}`).toBe(want[i]!.length);
    rows.forEach((l, s) => expect(maxAbsDiff(l, want[i]![s]!), `${label}, sequence ${i}, step ${s}`).toBe(0));
  });
}

describe("batched hybrid steps handed off on the device (a done word per sequence, one host wait per sequence a step)", () => {
  it("top-K, Quest and streaming kernels in every logits mode, sequences joining and leaving: the per-layer path's logits and each sequence's alone", () => {
    for (const c of CASES) {
      const label = `${c.selector().name} ${c.logits}`;
      const plain = new Rig(c, null), want = batched(plain);
      expect(plain.hybrids.map((h) => h.stats.handedOffSteps), label).toEqual([0, 0, 0]);
      plain.close();

      // Slot 1's stage runs its jobs as early as it may, the others as late: on a done word they shared, its values would release their waits early.
      const r = new Rig(c, { eager: 1 });
      let mergeRows = 0, partialRows = 0, appendRows = 0;
      const mergeOne = r.be.attnMergeRows.bind(r.be), partialOne = r.be.attnPartialRows.bind(r.be), appendOne = r.be.appendKvRows.bind(r.be);
      r.be.attnMergeRows = (rows) => {
        mergeRows++;
        mergeOne(rows);
      };
      r.be.attnPartialRows = (rows) => {
        partialRows++;
        partialOne(rows);
      };
      r.be.appendKvRows = (rows) => {
        appendRows++;
        appendOne(rows);
      };
      const got = batched(r);
      const steps = r.hybrids.map((h) => h.stats.steps);
      expect(steps, label).toEqual([12, 10, 14]);
      r.hybrids.forEach((h, i) => {
        expect(h.stats.handedOffSteps, `${label}, slot ${i}`).toBe(steps[i]);
        expect(h.stats.summary(), `${label}, slot ${i}`).toContain(`${steps[i]} of ${steps[i]} steps handed off`);
      });
      expect(r.waits, label).toEqual(steps); // the host waits for a sequence's stage once a step
      expect((r.link as HandoffLink).awaited, label).toBe(ROW_STEPS * LAYERS); // the device, once a layer of every row
      // The rows' hand-offs as one op a layer of each batched step (sequence 2's last two steps run alone, a hand-off each layer).
      expect((r.link as HandoffLink).handOffCalls, label).toBe((STEPS - 2) * LAYERS);
      // And their merges with the windows' partials as one Backend.attnMergeRows a layer of each batched step.
      expect(mergeRows, label).toBe((STEPS - 2) * LAYERS);
      // The windows' partials as one Backend.attnPartialRows, and the rows' new K/V as one appendKvRows, a layer of each batched step.
      expect(partialRows, label).toBe((STEPS - 2) * LAYERS);
      expect(appendRows, label).toBe((STEPS - 2) * LAYERS);
      // Verified layers (all but layer 0, whose q̃ is its query) score every row's K rows in one rescoreRows (sequence 2's lone steps: its own).
      expect((r.link as HandoffLink).rescoreCalls, label).toBe(c.logits === "verified" ? STEPS * (LAYERS - 1) : 0);
      // Query sends: a row's own on layer 0 (its job goes at once), then one op a layer for the rows' q̃ of the next; exact layers send each row's true query alone.
      expect(SendBatch.of(r.link).calls, label).toBe(c.logits === "exact" ? (ROW_STEPS - 2) * LAYERS : ROW_STEPS - 2 + (STEPS - 2) * (LAYERS - 1));
      r.close();

      expectSame(got, want, `${label}, handed off vs per layer`);
      expectSame(got, SEQS.map((_, i) => alone(c, { eager: 0 }, i)), `${label}, batched vs alone`);
    }
  });

  it("a link that fetches rows ahead: a batched step fetches every layer but the first ahead as one fetch of every row (waits for every row's job, then gathers them all), the next hand-off waits for it; a sequence's steps alone fetch their own; the same logits in every logits mode", () => {
    for (const c of CASES) {
      const label = `${c.selector().name} ${c.logits}`;
      const plain = new Rig(c, { eager: 1 }), want = batched(plain);
      plain.close();
      const r = new Rig(c, { eager: 1, rowFetch: true }), got = batched(r);
      const link = r.link as HandoffLink, steps = r.hybrids.map((h) => h.stats.handedOffSteps);
      expect(steps, label).toEqual([12, 10, 14]);
      // The longest sequence's last steps run alone (plain one-row steps): every layer fetched by its own RowFetch.
      const alone = (n: number) => Math.max(0, n - Math.max(...steps.filter((m) => m !== n))) * LAYERS;
      expect(link.rowFetches.slice(0, 3).map((f) => [f.fetches, f.readies, f.releases]), label).toEqual(steps.map((n) => [alone(n), alone(n), alone(n)]));
      // The batch's: one fetch a layer after the first of each batched step whose jobs go ahead on q̃ (exact layers' wait for their true query).
      const batchedFetches = c.logits === "exact" ? 0 : (STEPS - 2) * (LAYERS - 1);
      const batchFetch = link.rowFetches[3]!;
      expect([batchFetch.fetches, batchFetch.readies, batchFetch.releases, batchFetch.superseded], label).toEqual([batchedFetches, batchedFetches, batchedFetches, 0]);
      expect(HandOffBatch.of(link).fetchCalls, label).toBe(batchedFetches);
      r.close();
      expectSame(got, want, `${label}, fetched ahead vs gathered in the layer`);
    }
  });

  it("verified layers that keep K of their 4·K candidates (keep 1): one keepRows a layer of each batched step, each sequence's logits alone bit for bit, rows fetched ahead alike, and not every candidate's", () => {
    for (const c of CASES.filter((x) => x.logits === "verified")) {
      const label = c.selector().name;
      const r = new Rig(c, { eager: 1 }, { keep: 1 }), got = batched(r), link = r.link as HandoffLink;
      expect(r.hybrids.map((h) => h.stats.handedOffSteps), label).toEqual([12, 10, 14]);
      // Layers 1 and 2 verify: one keepRows and one rescoreRows each a batched step, and each of sequence 2's last two steps alone.
      expect(link.keepCalls, label).toBe((STEPS - 2) * (LAYERS - 1) + 2 * (LAYERS - 1));
      expect(link.rescoreCalls, label).toBe(STEPS * (LAYERS - 1));
      r.close();
      expectSame(got, SEQS.map((_, i) => alone(c, { eager: 0 }, i, { keep: 1 })), `${label}, keep 1: batched vs alone`);
      expectSame(SEQS.map((_, i) => alone(c, { eager: 0, rowFetch: true }, i, { keep: 1 })), got, `${label}, keep 1: fetched ahead vs gathered in the layer`);
      // A batched step's K rows fetched ahead (the kept V rows come after the rescoring): the same bits.
      const ahead = new Rig(c, { eager: 1, rowFetch: true }, { keep: 1 });
      expectSame(batched(ahead), got, `${label}, keep 1: batched with the K rows fetched ahead vs gathered in the layer`);
      expect(HandOffBatch.of(ahead.link).fetchCalls, label).toBe((STEPS - 2) * (LAYERS - 1));
      ahead.close();
      const every = new Rig(c, { eager: 1 }), all = batched(every);
      every.close();
      const differs = got.some((rows, i) => rows.some((l, s) => maxAbsDiff(l, all[i]![s]!) > 0));
      expect(differs, `${label}: keeping K of 4·K candidates changes some logits`).toBe(true);
      // keep = candidates keeps every candidate: the same bits as without the option.
      const four = new Rig(c, { eager: 1 }, { keep: 4 });
      expectSame(batched(four), all, `${label}, keep 4 vs every candidate`);
      expect((four.link as HandoffLink).keepCalls, label).toBe(0);
      four.close();
    }
  });

  it("keep on a link without the hand-off keeps in each layer (the device's keepRows, or the host where the stage's tables are not mapped): the hand-off's kept logits; keep refuses logits that are not verified and more than the candidates", () => {
    const c = CASES.find((x) => x.logits === "verified")!;
    const handed = new Rig(c, { eager: 1 }, { keep: 1 }), want = batched(handed);
    handed.close();
    const plain = new Rig(c, null, { keep: 1 }), got = batched(plain);
    expect(plain.hybrids.map((h) => h.stats.handedOffSteps)).toEqual([0, 0, 0]);
    plain.close();
    got.forEach((rows, i) => rows.forEach((l, t) => expect(maxAbsDiff(l, want[i]![t]!), `sequence ${i}, step ${t}`).toBeLessThan(1e-5)));
    expect(() => new Rig({ ...c, logits: "speculative" }, { eager: 0 }, { keep: 1 })).toThrow("invalid hybrid option keep 1 needs verified logits and at most the candidates (4); logits are speculative");
    expect(() => new Rig(c, { eager: 0 }, { keep: 5 })).toThrow("invalid hybrid option keep 5 needs verified logits and at most the candidates (4); logits are verified");
  });

  it("a stage job that fails in one sequence is the batched step's error, after every sequence's jobs were collected; the next step runs", () => {
    const r = new Rig(CASES[2]!, { fail: { stage: 1, job: 7 } }); // stage 1's job of layer 1 in the third step
    const dec = new BatchDecoder(r.model, SLOTS);
    const slots = [0, 1, 2], ids = (t: number) => Int32Array.from(slots, (i) => TOKENS[i]![SEQS[i]!.prompt + t]!);
    slots.forEach((i) => dec.prefill(i, Int32Array.from(TOKENS[i]!.slice(0, SEQS[i]!.prompt)), 0));
    dec.step(slots, ids(0));
    dec.step(slots, ids(1));
    expect(() => dec.step(slots, ids(2))).toThrow("stage job 7 failed");
    expect(r.hybrids.map((h) => h.stats.handedOffSteps)).toEqual([3, 2, 3]); // the failed row's step is not counted
    expect(r.waits).toEqual([3, 3, 3]);
    dec.step(slots, ids(3));
    expect(r.hybrids.map((h) => h.stats.handedOffSteps)).toEqual([4, 3, 4]);
    expect((r.link as HandoffLink).awaited).toBe(4 * SLOTS * LAYERS);
    dec.close();
    r.close();
  });
});
