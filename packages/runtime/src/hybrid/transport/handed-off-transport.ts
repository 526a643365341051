/**
 * The handed-off transport: mapped rows, and the device — not the host — waits for each layer's
 * CPU-stage job. Every layer's job is queued as soon as its query is sent; the device waits for the
 * job's done signal (a word of this staging's own) and reads its logits and [counts | ids] table
 * where the stage wrote them, so the host issues the whole step without waiting and collects the
 * jobs' times at the step's end. A step whose selection runs in JS (no stage kernel for its timing)
 * cannot be handed off: it runs as the mapped transport does.
 *
 * Rows fetched ahead (the option `fetchAhead`, where the link has a side stream): a layer's rows are
 * gathered on the side stream as soon as its job is done — the next layer's is queued right after
 * this layer's hand-off — so they cross the link during the layer before instead of inside the
 * layer; PCIe-bound gathers then overlap HBM-bound GEMVs. A batched step's rows fetch so too, as one
 * (HandOffBatch): each row's next layer joins at its attend, the batch's fetch goes once every row
 * merged, waits for every row's job and gathers them all; the next hand-off waits for it.
 */
import type { Attention } from "@hybridgen/core";
import { type HostSignal, type Tensor, fail } from "@hybridgen/spec";
import type { StepPlan } from "../step-plan.js";
import type { TransportChoice } from "./choose-transport.js";
import type { DeviceStaging } from "./device-staging.js";
import { HandOffBatch } from "./hand-off-batch.js";
import { MappedTransport } from "./mapped-transport.js";
import { SendBatch } from "./send-batch.js";
import type { StepDriver, TransportName } from "./step-transport.js";

export class HandedOffTransport extends MappedTransport {
  override readonly name: TransportName = "handed-off";
  private handOffStep = false;
  /** Per layer: its rows were fetched ahead this step. */
  private readonly fetched: boolean[];
  /** Per layer of a batched step: the row views of the hand-off it joined (prepareAttend), until its attend. */
  private readonly joined: ({ values: Tensor; keys: Tensor | null } | null)[];

  constructor(step: StepDriver, d: DeviceStaging, attention: Attention, choice: TransportChoice) {
    super(step, d, attention, choice);
    if (!d.pinDoneWord()) fail("hybrid attention: the host link does not map the done word a handed-off step waits on");
    if (choice.fetchAhead) d.fetchAhead();
    this.fetched = new Array(step.layers).fill(false);
    this.joined = new Array(step.layers).fill(null);
  }

  override planned(plan: StepPlan, rows: number): boolean {
    super.planned(plan, rows);
    this.fetched.fill(false);
    this.joined.fill(null);
    this.handOffStep = plan.work === "kernel";
    return this.handOffStep;
  }

  override jobLink(layer: number): { ready?: HostSignal; done?: HostSignal; deviceGather: boolean } {
    const link = super.jobLink(layer);
    return this.handOffStep ? { ...link, done: this.d.doneSignal() } : link;
  }

  /**
   * A row of a batched step, before any row attends: the window's share and the layer's hand-off
   * join the batch's (one attnPartialRows and one handOffRows a layer for every row, issued by the
   * first row's attend).
   */
  prepareAttend(layer: number, q: Tensor): void {
    if (!this.handOffStep || !this.batchStep || this.joined[layer]) return;
    // The rows' sends of the next layer's queries go before this layer's hand-off: the stage works on them meanwhile.
    if (this.choice.signals) SendBatch.of(this.d.link).flush(this.batchStep);
    const s = this.step, d = this.d, slot = (layer & 1) as 0 | 1, done = s.done(layer), rescore = s.rescore[layer]!, kmax = s.layerKmax(layer), keep = s.layerKeep(layer);
    if (!done) fail(`hybrid attention: layer ${layer}'s CPU stage was never submitted with a done signal`);
    // The window's partial goes with the batch's (one op for every row's, before the hand-offs); a materialised window is scored now.
    const partial = s.merge.partialRow(layer, q);
    if (!partial) s.merge.scoreWindow(layer, q, d.scores[slot]!, kmax);
    const up = d.handOffRows(slot, kmax, rescore);
    const verified = rescore ? d.batchRescore(slot, q, up.keys!, kmax, this.attention.scale) : null;
    const kept = keep > 0 ? d.keepRow(layer, slot, keep, s.layout.groupSize) : null;
    // Rows fetched ahead with the batch's at the layer before: the batch waits for them before the hand-offs, which gather none.
    HandOffBatch.of(d.link).join(this.batchStep, layer, d.batchHandOff(layer, slot, done, rescore, keep, this.fetched[layer]!), verified, kept, partial);
    this.joined[layer] = up;
  }

  /**
   * A handed-off layer: what is recorded so far starts running, and the device, not the host,
   * waits for the layer's job before its selected columns; the next layer's job is queued behind it.
   * A batched step's row joined the batch's hand-off already: the first row's attend issues it.
   */
  override attend(layer: number, q: Tensor, out: Tensor): void {
    const s = this.step, keep = s.layerKeep(layer);
    if (!this.handOffStep) return super.attend(layer, q, out);
    const d = this.d, slot = (layer & 1) as 0 | 1, scores = d.scores[slot]!, done = s.done(layer), rescore = s.rescore[layer]!;
    const kmax = s.layerKmax(layer);
    const joined = this.joined[layer];
    if (joined) {
      this.joined[layer] = null;
      const batch = HandOffBatch.of(d.link);
      batch.issue(this.attention.backend, this.batchStep!, layer);
      s.submitNext(layer);
      const merge = s.merge.mergeRow(layer, scores, d.col, joined.values, kmax, out);
      if (!merge) s.merge.softmaxAggregate(layer, scores, d.col, null, joined.values, kmax, out);
      // The next layer's rows join the batch's fetch (issued with the last row's merge), its job just queued.
      if (batch.fetchesAhead) this.joinFetch(batch, layer);
      batch.merge(this.attention.backend, this.batchStep!, layer, merge);
      return;
    }
    s.merge.scoreWindow(layer, q, scores, kmax);
    if (!done) fail(`hybrid attention: layer ${layer}'s CPU stage was never submitted with a done signal (nor its table made on the device)`);
    // A batch row that did not join the batch's hand-off gathers on the compute stream: on the link's one side stream its fetch would wait behind the other rows'.
    const fetch = d.fetchesAhead && !this.batch;
    this.closeSegment();
    const up = d.handOffRows(slot, kmax, rescore);
    if (fetch && !this.fetched[layer]) d.fetchRows(layer, slot, done, rescore, kmax, keep); // before the segment that waits for it
    this.openSegment(layer);
    d.handOff(layer, slot, done, rescore, fetch, keep);
    s.submitNext(layer);
    if (fetch) this.fetchNext(layer);
    this.rescored(slot, q, up.keys, rescore, kmax);
    if (keep > 0) d.link.keepRows!([d.keepRow(layer, slot, keep, s.layout.groupSize)]);
    s.merge.softmaxAggregate(layer, scores, d.col, null, up.values, kmax, out); // a handed-off step tracks no scores
    if (fetch) d.releaseRows(slot);
  }

  /** Verified logits of a handed-off layer: the true query against the gathered K rows, −∞ past each KV head's count (one op: the link's rescoreRows of one row). */
  private rescored(slot: 0 | 1, q: Tensor, keys: Tensor | null, rescore: boolean, kmax: number): void {
    if (!rescore) return;
    const d = this.d;
    d.link.rescoreRows!([d.batchRescore(slot, q, keys!, kmax, this.attention.scale)]);
  }

  /** A batch row's next layer's rows, fetched with the batch's as soon as every row's job is done (a layer whose job waits for its true query has none queued: its hand-off gathers). */
  private joinFetch(batch: HandOffBatch, layer: number): void {
    const s = this.step, next = layer + 1, done = next < s.layers ? s.done(next) : undefined;
    if (!done) return;
    batch.joinFetch(this.batchStep!, layer, { done, gathers: this.d.fetchGathers(next, (next & 1) as 0 | 1, s.rescore[next]!, s.layerKmax(next), s.layerKeep(next)) });
    this.fetched[next] = true;
  }

  /**
   * The next layer's rows, fetched ahead as soon as its job (just queued on q̃) is done: its slot was
   * freed by the layer before this one. Only the width is set here (this layer's segment records):
   * the next hand-off makes the row views, before its own segment.
   */
  private fetchNext(layer: number): void {
    const s = this.step, next = layer + 1, done = next < s.layers ? s.done(next) : undefined;
    if (!done) return;
    this.d.fetchRows(next, (next & 1) as 0 | 1, done, s.rescore[next]!, s.layerKmax(next), s.layerKeep(next));
    this.fetched[next] = true;
  }
}
