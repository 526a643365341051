/**
 * BatchDecoder: B sequence slots over one model, for batched decode.
 *
 *   using dec = new BatchDecoder(model, 8);
 *   dec.prefill(slot, promptIds, 0);           // one sequence at a time (the ordinary path)
 *   const first = dec.argmax(slot);
 *   dec.step([0, 1, 2], Int32Array.of(a, b, c)); // one forward pass for all three slots
 *   const next = dec.argmax(1);                  // logits of slot 1's row
 *
 * Every slot owns a KV cache (its own length and positions); slot 0 is the model's own
 * sequence, so with one slot everything runs exactly as a single-sequence decode. Logits of a
 * slot can be read until the next prefill or step. With a decode attention (hybrid attention)
 * every slot needs its own: the model's setSequenceSetup gives one to each slot made here.
 */
import type { SequenceState } from "./batch-rows.js";
import { MAX_BATCH, type DecoderModel } from "./decoder-model.js";
import { fail } from "@hybridgen/spec";

/** What BatchDecoder needs of a model (DecoderModel has it). */
export type BatchModel = Pick<
  DecoderModel,
  "shape" | "maxContext" | "prefillBlock" | "attention" | "ownSequence" | "createSequence" | "releaseSequence" | "withSequence" | "reserveBatch" |
  "stepBatch" | "readBatchLogits" | "argmaxBatch" | "step" | "reset"
> & Partial<Pick<DecoderModel, "argmaxBatchRows">>;

export class BatchDecoder implements Disposable {
  private readonly slots: SequenceState[] = [];
  private readonly rowOfSlot: Int32Array;
  private readonly seqs: SequenceState[] = [];
  /** argmaxSlots' picks by row. */
  private picks = new Int32Array(0);
  private closed = false;

  /**
   * `sequenceContext`: positions each slot made here holds (default the model's context); a server
   * starts its slots small and renews each on its request's context.
   */
  constructor(
    readonly model: BatchModel,
    readonly capacity: number,
    options: { readonly sequenceContext?: number } = {},
  ) {
    if (!(Number.isInteger(capacity) && capacity >= 1 && capacity <= MAX_BATCH)) fail(`batch size ${capacity} out of range [1, ${MAX_BATCH}]`);
    this.rowOfSlot = new Int32Array(capacity).fill(-1);
    model.reserveBatch(capacity);
    this.slots.push(model.ownSequence);
    try {
      const sized = options.sequenceContext === undefined ? {} : { maxContext: options.sequenceContext };
      for (let i = 1; i < capacity; i++) this.slots.push(model.createSequence(sized));
      this.checkDecodeAttention();
    } catch (e) {
      this.close();
      throw e;
    }
  }

  /** `slot`'s sequence (its cache and attention stage: a decode attention is attached there). */
  sequence(slot: number): SequenceState {
    return this.slot(slot);
  }

  /**
   * A fresh sequence in `slot` (≥ 1): the old one's KV storage and decode attention (with its
   * offloaded store and disk files) are released and the model's sequence setup makes a new one,
   * so a long-running server frees what a finished request held; `maxContext` sizes the new one
   * (createSequence's). Slot 0 is the model's own sequence.
   */
  renew(slot: number, options: { readonly maxContext?: number } = {}): void {
    this.slot(slot);
    if (slot === 0) fail("batch decoder: slot 0 is the model's own sequence and cannot be renewed");
    this.model.releaseSequence(this.slots[slot]);
    this.rowOfSlot[slot] = -1;
    this.slots[slot] = this.model.createSequence(options);
  }

  /** Positions held by `slot`'s cache. */
  length(slot: number): number {
    return this.slot(slot).cache.length;
  }

  /**
   * Run prompt tokens `ids` of `slot` at positions [startPos, startPos + ids.length); startPos 0
   * starts a new sequence there (the slot's cache is reset). Logits of the last token: logits(slot).
   */
  prefill(slot: number, ids: Int32Array, startPos: number): void {
    const s = this.slot(slot);
    this.model.withSequence(s, () => {
      if (startPos === 0) this.model.reset();
      this.model.step(ids, startPos);
    });
    this.rowOfSlot.fill(-1);
    this.rowOfSlot[slot] = 0;
  }

  /** One decode step: ids[i] is the next token of slots[i] (distinct slots, 1 ≤ count ≤ capacity). */
  step(slots: readonly number[], ids: Int32Array): void {
    if (slots.length !== ids.length) fail(`batch step: ${ids.length} token ids for ${slots.length} slots`);
    this.seqs.length = 0;
    for (const s of slots) this.seqs.push(this.slot(s));
    this.model.stepBatch(ids, this.seqs);
    this.rowOfSlot.fill(-1);
    slots.forEach((s, row) => (this.rowOfSlot[s] = row));
  }

  /** Logits of `slot`'s last token (from the last prefill or step). */
  logits(slot: number): Float32Array {
    return this.model.readBatchLogits(this.row(slot));
  }

  /** Greedy next token of `slot`, chosen on the backend. */
  argmax(slot: number): number {
    return this.model.argmaxBatch(this.row(slot));
  }

  /**
   * Greedy next tokens of every slot of the last step: out[i] for slots[i], the same as
   * argmax(slots[i]), chosen on the backend in one call for all the step's rows.
   */
  argmaxSlots(slots: readonly number[], out: Int32Array): void {
    if (!(out instanceof Int32Array) || out.length < slots.length) fail(`batch decoder: out must be an Int32Array of at least ${slots.length} values`);
    let rows = 0;
    for (const s of slots) rows = Math.max(rows, this.row(s) + 1);
    if (rows === 0) return;
    if (this.picks.length < rows) this.picks = new Int32Array(this.capacity);
    if (this.model.argmaxBatchRows) this.model.argmaxBatchRows(rows, this.picks);
    else for (let r = 0; r < rows; r++) this.picks[r] = this.model.argmaxBatch(r);
    slots.forEach((s, i) => (out[i] = this.picks[this.row(s)]));
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const s of this.slots.slice(1)) this.model.releaseSequence(s);
  }

  [Symbol.dispose](): void {
    this.close();
  }

  /** A decode attention keeps per-sequence state: every slot has its own, or none has one. */
  private checkDecodeAttention(): void {
    const own = this.slots[0].attention.decodeAttention;
    this.slots.forEach((s, i) => {
      const d = s.attention.decodeAttention;
      if (!d !== !own) fail(`batched decode: slot ${i} has ${d ? "a" : "no"} decode attention and slot 0 has ${own ? "one" : "none"} (attach hybrid attention to every sequence: @hybridgen/runtime's createBatchHybridAttention)`);
      if (d && this.slots.findIndex((o) => o.attention.decodeAttention === d) !== i) fail(`batched decode: slot ${i} shares its decode attention with another slot (each sequence needs its own)`);
    });
  }

  private row(slot: number): number {
    this.slot(slot);
    const r = this.rowOfSlot[slot];
    if (r < 0) fail(`batch decoder: slot ${slot} has no logits (it was not in the last prefill or step)`);
    return r;
  }

  private slot(slot: number): SequenceState {
    if (this.closed) fail("batch decoder used after close()");
    if (!(Number.isInteger(slot) && slot >= 0 && slot < this.capacity)) fail(`batch decoder: slot ${slot} out of range [0, ${this.capacity})`);
    return this.slots[slot];
  }
}
