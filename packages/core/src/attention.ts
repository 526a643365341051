/**
 * Attention: the KV-cache half of a transformer layer, shared by every architecture file.
 *
 * A model calls, per forward block of n tokens:
 *
 *   const pos0 = attn.beginBlock(n);                  // positions [pos0, pos0 + n) get KV slots
 *   per layer l:  attn.layerInput(l, x, n)            // hook: speculative query of layer l + 1
 *                 ... q, k, v projections, RoPE ...
 *                 attn.attend(l, q, kRows, vRows, out, n)  // append k, v; out[i] = attention of row i
 *   attn.endBlock();                                  // evict window overflow to the store
 *
 * Full attention (the default) scores the store span, then the window spans, each at its
 * position's column of a [heads, maxContext] scores row, applies one softmax and sums the
 * matching V spans. A DecodeAttention (@hybridgen/runtime's HybridAttention) may take over single-token decode steps.
 *
 * When the cache keeps its store in host memory (hybrid mode on a device backend), a block
 * that attends over offloaded rows on the device first brings the layer up (KvCache.
 * loadContiguous for attnCausal, else loadStore); decode steps leave the offloaded rows to the
 * hybrid runtime's CPU stage.
 *
 * Optional backend fast paths: a one-token block is bracketed by beginStep/endStep (a GPU
 * backend replays the whole step as one graph), and a block over a contiguous cache (prefill,
 * or a full-attention decode step) uses attnCausal (no n × n scores, one kernel for a decode
 * step) instead of the row-by-row stages.
 */
import { type Backend, type Tensor, fail } from "@hybridgen/spec";
import type { KvCache } from "./kv-cache.js";

export interface AttentionLayout {
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
}

/**
 * Computes the query of `layer` from a residual-stream row `x` (norm → W_q → RoPE at `pos`),
 * writing heads × headDim values to row 0 of `out`. Architectures provide it so the hybrid
 * runtime can compute the speculative query q̃ₗ₊₁ from layer l's input.
 */
export interface QueryProjector {
  projectQuery(layer: number, x: Tensor, pos: number, out: Tensor): void;
}

/**
 * A batched decode step (batch-rows.ts), shared by the decode attentions of its rows: each
 * sequence's runs between the others' on the same device, so nothing is recorded per sequence,
 * and the device's event timeline (one per backend) is read once for the whole step.
 */
export interface DecodeBatchStep {
  readonly rows: number;
  /** Counts the batch's steps: state the rows share for one step (a ranking done once for all) is told apart by it. */
  readonly serial: number;
  /** T_gpu / T_tx of the step, read by the first row that ends it; the other rows take the same. */
  times?: { readonly gpuMs: number; readonly txMs: number; readonly waitMs?: number; readonly segmentMs?: number; readonly hostWaitMs?: number };
  /**
   * The query of `layer` (RoPE(W_q·norm(x)) at the row's position) for the row whose residual row
   * is `x`, projected for every row of the step at once — one matmul reads W_q for the whole batch
   * where a row's own projection would read it once a row. Null where the architecture has none:
   * the row projects its own (QueryProjector).
   */
  query?(layer: number, x: Tensor): Tensor | null;
  /** query's tensor for row `row` of the step (the row's beginStep says which it is). */
  queryOfRow?(layer: number, row: number): Tensor | null;
}

/**
 * Watches the rows of a prompt's last prefill block (@hybridgen/runtime's PrefillCalibrator calibrates from them);
 * called only for a block Attention.markFinalBlock flagged, on top of full attention.
 */
export interface PrefillObserver {
  /** Layer l's input rows (n rows, positions pos0 …). */
  blockInput(layer: number, x: Tensor, n: number, pos0: number): void;
  /** Layer l's query rows, once its K rows are in the cache (rowLogits reads them). */
  blockQueries(layer: number, q: Tensor, n: number, pos0: number): void;
  /** The block's layers are done (before eviction). */
  blockEnd(pos0: number, n: number): void;
}

/** What several rows' decode attentions queue work in (a native stage the batch shares). */
export interface StepGroup {
  /** What was queued goes now. */
  flush(): void;
}

/** Takes over the attention of decode steps (one token); see @hybridgen/runtime's HybridAttention. */
export interface DecodeAttention {
  /** A new sequence starts (position 0 is being appended): reset per-sequence state. */
  newSequence(): void;
  /** Called once per decode step before layer 0, with the KV slot already appended; `batch` when the step is one row of a batched step. */
  beginStep(pos: number, batch?: DecodeBatchStep, row?: number): void;
  /** Layer l's input row is ready (residual stream before the layer's norm). */
  layerInput(layer: number, x: Tensor): void;
  /** Batched steps call it for every row before any row's attend(), so every sequence's CPU work of the layer is under way before one is waited on. */
  prepareAttend?(layer: number, q: Tensor): void;
  /** The new token's k, v are in the window; write the attention of q (row 0) to out row 0. */
  attend(layer: number, q: Tensor, out: Tensor): void;
  /** The CPU stage the batch's rows share: a batched step flushes each such stage once after each pass over the rows (layer inputs, prepareAttend, attend), so what the rows queued goes as one group. */
  readonly stageGroup?: StepGroup | null;
  /** The step's layers are done (before eviction). */
  endStep(): void;
  /**
   * After beginStep: a batched step may record this row's device work with the other rows' (no
   * layer waits on the host: the device waits for the CPU stage, the host only issues).
   */
  readonly batchRecordable?: boolean;
}

let attentionCount = 0;

export class Attention implements Disposable {
  readonly scale: number;
  /** beginStep key: one per attention stage (so per model), as the steps' ops differ by model. */
  private readonly stepKey = `decode-${attentionCount++}`;
  private stepOpen = false;
  /** [heads, maxContext]: one row per head, column = position. */
  readonly scores: Tensor;
  private pos0 = 0;
  private n = 0;
  private decode: DecodeAttention | null = null;
  private observer: PrefillObserver | null = null;
  /** The model flagged the next block as a prompt's last (markFinalBlock); `observing`: this block is. */
  private finalBlock = false;
  private observing = false;
  /** The K rows this block's attention read at slot = start + position (null: the cache's spans). */
  private blockK: { k: Tensor; start: number } | null = null;
  private closed = false;

  constructor(
    readonly backend: Backend,
    readonly cache: KvCache,
    readonly layout: AttentionLayout,
  ) {
    if (layout.heads % layout.kvHeads !== 0) fail(`${layout.heads} attention heads is not a multiple of ${layout.kvHeads} KV heads`);
    if (cache.kvHeads !== layout.kvHeads || cache.headDim !== layout.headDim) {
      fail(`attention: KV cache layout ${cache.kvHeads}×${cache.headDim} does not match the model's ${layout.kvHeads}×${layout.headDim}`);
    }
    this.scale = 1 / Math.sqrt(layout.headDim);
    this.scores = backend.alloc([layout.heads, cache.maxContext]);
  }

  /** Route decode steps through `d` (null: back to full attention). */
  setDecodeAttention(d: DecodeAttention | null): void {
    this.decode = d;
  }

  get decodeAttention(): DecodeAttention | null {
    return this.decode;
  }

  /** Show each prompt's last prefill block to `o` (null: none). */
  setPrefillObserver(o: PrefillObserver | null): void {
    this.observer = o;
  }

  get prefillObserver(): PrefillObserver | null {
    return this.observer;
  }

  /** The model's step loop: whether the next block ends a prompt (a one-row block after it does not count). */
  markFinalBlock(final: boolean): void {
    this.finalBlock = final;
  }

  /** Appends n positions to the cache; returns the first. */
  beginBlock(n: number): number {
    this.checkOpen();
    this.closeStep(); // a block that threw before endBlock
    this.pos0 = this.cache.append(n);
    this.n = n;
    this.observing = n > 1 && this.finalBlock && this.observer !== null;
    this.finalBlock = false;
    if (this.pos0 === 0 && this.decode) this.decode.newSequence();
    if (n === 1 && this.decode) this.decode.beginStep(this.pos0);
    // Hybrid steps talk to the host mid-step: only full-attention decode steps are recorded.
    if (n === 1 && !this.decode && this.backend.beginStep && this.backend.endStep) {
      this.backend.beginStep(this.stepKey);
      this.stepOpen = true;
    }
    return this.pos0;
  }

  /** Layer `layer`'s input rows are in x (hook for speculative queries; decode only). */
  layerInput(layer: number, x: Tensor): void {
    if (this.n === 1 && this.decode) this.decode.layerInput(layer, x);
    else if (this.observing) this.observer!.blockInput(layer, x, this.n, this.pos0);
  }

  /**
   * Write the block's k, v rows of `layer` into the cache (token-major rows of width headDim:
   * row i·kvHeads + g is KV head g of token i) and write the attention of every q row to
   * the same row of `out` (rows heads × headDim).
   */
  attend(layer: number, q: Tensor, kRows: Tensor, vRows: Tensor, out: Tensor): void {
    const n = this.n, pos0 = this.pos0;
    this.cache.writeRows(layer, kRows, vRows, pos0, n);
    if (n === 1 && this.decode) {
      this.decode.attend(layer, q, out);
      return;
    }
    this.attendBlock(layer, q, n, pos0, out);
    if (this.observing) {
      this.observer!.blockQueries(layer, q, n, pos0);
      this.blockK = null;
    }
  }

  private attendBlock(layer: number, q: Tensor, n: number, pos0: number, out: Tensor): void {
    const c = this.cache;
    // One contiguous run of window slots from position 0 (sinks then an unwrapped ring count):
    // the backend's causal kernel (also a decode step's).
    if (this.backend.attnCausal && this.contiguousFromZero(pos0 + n)) {
      this.backend.attnCausal(out, q, n, c.spanK(0, layer), c.spanV(0, layer), c.spanSlot[0], pos0, this.scale);
      if (this.observing) this.blockK = { k: c.spanK(0, layer), start: c.spanSlot[0] };
      return;
    }
    // A store in host memory comes up for this layer: with the causal kernel, the whole cache
    // laid out at slot = position; otherwise the store alone, for the spans (no-ops without one).
    const whole = this.backend.attnCausal ? c.loadContiguous(layer) : null;
    if (whole) {
      this.backend.attnCausal!(out, q, n, whole.k, whole.v, 0, pos0, this.scale);
      if (this.observing) this.blockK = { k: whole.k, start: 0 };
      return;
    }
    c.loadStore(layer);
    for (let i = 0; i < n; i++) this.attendFull(layer, q, i, pos0 + i, out);
  }

  /**
   * Inside PrefillObserver.blockQueries: logits of query row `row` of `q` (position `pos`) over
   * positions [0, pos] of `layer`, written at columns 0 … pos of `scores` ([heads, ≥ pos + 1]).
   */
  rowLogits(layer: number, q: Tensor, row: number, pos: number, scores: Tensor): void {
    const be = this.backend, c = this.cache, total = pos + 1;
    if (this.blockK) {
      be.attnLogits(scores, 0, q, row, this.blockK.k, this.blockK.start, total, this.scale);
      return;
    }
    for (let s = 0; s < c.spanCount; s++) {
      const p = c.spanPos[s];
      if (p >= total) continue;
      be.attnLogits(scores, p, q, row, c.spanK(s, layer), c.spanSlot[s], Math.min(c.spanLen[s], total - p), this.scale);
    }
  }

  /** Whether positions [0, total) sit in consecutive window slots (spans adjoining in slots and positions). */
  private contiguousFromZero(total: number): boolean {
    const c = this.cache;
    if (c.spanCount === 0 || c.spanPos[0] !== 0 || c.spanRegion[0] !== 1) return false;
    let end = c.spanLen[0];
    for (let s = 1; s < c.spanCount; s++) {
      if (c.spanRegion[s] !== 1 || c.spanPos[s] !== end || c.spanSlot[s] !== c.spanSlot[0] + end) return false;
      end += c.spanLen[s];
    }
    return end === total;
  }

  /** Ends the block: the decode hook sees the step end, then the window overflow is evicted. */
  endBlock(): void {
    this.closeStep();
    if (this.n === 1 && this.decode) this.decode.endStep();
    if (this.observing) {
      this.observing = false;
      this.observer!.blockEnd(this.pos0, this.n);
    }
    this.cache.evict();
    this.n = 0;
  }

  private closeStep(): void {
    if (!this.stepOpen) return;
    this.stepOpen = false;
    this.backend.endStep?.();
  }

  /**
   * Exact attention of query row `row` (position `pos`) over positions [0, pos]: logits of
   * every cached span at its position's column, one softmax, the V spans summed into out[row].
   */
  attendFull(layer: number, q: Tensor, row: number, pos: number, out: Tensor): void {
    const be = this.backend, c = this.cache, scores = this.scores, scale = this.scale;
    const total = pos + 1;
    for (let s = 0; s < c.spanCount; s++) {
      const p = c.spanPos[s];
      if (p >= total) continue;
      be.attnLogits(scores, p, q, row, c.spanK(s, layer), c.spanSlot[s], Math.min(c.spanLen[s], total - p), scale);
    }
    be.softmax(scores, this.layout.heads, total);
    let first = true;
    for (let s = 0; s < c.spanCount; s++) {
      const p = c.spanPos[s];
      if (p >= total) continue;
      be.attnAggregate(out, row, scores, p, c.spanV(s, layer), c.spanSlot[s], Math.min(c.spanLen[s], total - p), !first);
      first = false;
    }
  }

  close(): void {
    if (this.closed) return;
    this.closeStep();
    this.closed = true;
    this.backend.free(this.scores);
  }

  [Symbol.dispose](): void {
    this.close();
  }

  private checkOpen(): void {
    if (this.closed) fail("attention used after close()");
  }
}
