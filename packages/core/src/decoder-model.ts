/**
 * DecoderModel: what every decoder-only architecture here (llama.ts, opt.ts) shares around
 * its forward pass — load options, the KV cache and attention stage, the WeightLoader that
 * owns every tensor, the step loop that checks its input and cuts a prompt into prefill
 * blocks, logits readout, reset and close. An architecture file adds its weights, its
 * activation buffers and `runBlock` (one block of rows through every layer).
 *
 * Batched decode (batch-decoder.ts drives it): a model can hold several sequences, each a
 * KV cache with its attention stage (createSequence). The model's own sequence is bound by
 * default; prefill of another runs the ordinary path with that sequence bound (withSequence).
 * stepBatch runs one token of each of B sequences as ONE block of B rows through every layer
 * (the architecture's runBatch, every matmul with n = B), each row attending over its own cache.
 */
import { z } from "zod";
import {
  type Backend, type DType, type Tensor, check, fail, DEFAULT_SINK_TOKENS, GpuKvBudgetSchema, SinkTokensSchema, resolveGpuKvBudget,
} from "@hybridgen/spec";
import { Attention, type QueryProjector } from "./attention.js";
import type { ModelShape } from "./config.js";
import { BatchRows, hasDecodeAttention, type SequenceState } from "./batch-rows.js";
import { KvCache, kvCacheFootprint, type KvCacheOptions } from "./kv-cache.js";
import type { WeightSource } from "./model-files.js";
import { WeightLoader } from "./weight-loader.js";

const DTypeSchema = z.enum(["f32", "f16", "bf16"]);

/** Load options of every architecture. */
export const LlamaLoadOptionsSchema = z.object({
  /** Convert matmul/embedding weights to this dtype at load; default: as stored. */
  weightDtype: DTypeSchema.optional(),
  /** Positions the KV cache holds; default min(max_position_embeddings, 4096). */
  maxContext: z.number().int().positive().optional(),
  /** Rows per prefill block (batched matmuls). */
  prefillBlock: z.number().int().positive().default(64),
  /** Tokens kept resident in the (device) KV window, sinks included; older ones are offloaded.
   * Default: all; "auto" is resolveGpuKvBudget's (here, with no planner: all). */
  gpuKvBudget: GpuKvBudgetSchema.optional(),
  /** Eviction granularity of the KV window; default min(16, gpuKvBudget − sinkTokens). */
  kvEvictBlock: z.number().int().positive().optional(),
  /** The first positions stay in the KV window for good (attention sinks); only with a gpuKvBudget below the context. */
  sinkTokens: SinkTokensSchema.default(DEFAULT_SINK_TOKENS),
  /** Storage dtype of the KV cache. */
  kvDtype: DTypeSchema.default("f32"),
});
export type LlamaLoadOptions = z.input<typeof LlamaLoadOptionsSchema>;
export type ParsedLoadOptions = z.output<typeof LlamaLoadOptionsSchema>;

export const DEFAULT_MAX_CONTEXT = 4096;

/** The most sequences one batched decode step takes. */
export const MAX_BATCH = 32;

let modelCount = 0;
/** step()'s ids in a stepFed: a valid id (0) the embedding never reads. */
const FED_PLACEHOLDER = Int32Array.of(0);

/** Validated load options (a one-line error naming the bad option otherwise). */
export function parseLoadOptions(options: LlamaLoadOptions): ParsedLoadOptions {
  const parsed = LlamaLoadOptionsSchema.safeParse(options);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    fail(`invalid load option ${issue.path.join(".")}: ${issue.message}`);
  }
  return parsed.data;
}

/** The context a model is loaded with: the option, else min(max_position_embeddings, 4096). */
export function contextLength(opts: ParsedLoadOptions, shape: ModelShape): number {
  const maxContext = opts.maxContext ?? Math.min(shape.maxPositions, DEFAULT_MAX_CONTEXT);
  check(maxContext <= shape.maxPositions, `maxContext ${maxContext} exceeds the model's max_position_embeddings ${shape.maxPositions}`);
  return maxContext;
}

export abstract class DecoderModel implements Disposable, QueryProjector {
  readonly maxContext: number;
  readonly prefillBlock: number;
  /** Loads and owns every weight and activation buffer; close() frees them. */
  protected readonly w: WeightLoader;
  private closed = false;
  private readonly cacheOptions: KvCacheOptions;
  /** The model's own sequence, and the one forward/step/reset use now. */
  private readonly own: SequenceState;
  private bound: SequenceState;
  /** Sequences made by createSequence (closed with the model unless released first). */
  private readonly extra = new Set<SequenceState>();
  /** setSequenceSetup's function, and what it returned per sequence (closed with the sequence). */
  private setup: ((s: SequenceState) => Disposable) | null = null;
  private readonly setups = new Map<SequenceState, Disposable>();
  /** Batched decode buffers (reserveBatch); the rows of the last batched step. */
  protected batch: BatchRows | null = null;
  private batchSeqs: SequenceState[] = [];
  private readonly batchPos = new Int32Array(MAX_BATCH);
  /** Rows of the last stepBatch's logits (0: they are in the one-row logits of step()). */
  private lastBatchRows = 0;
  private readonly batchKey = `batch-${modelCount++}-`;
  private readonly batchKeys: string[] = [];
  /** stepFed: the step's token comes from the backend's feed, not from `ids`. */
  private fedStep = false;
  /** expectPrompt's length (0: none pending). */
  private promptEnd = 0;

  protected constructor(
    readonly backend: Backend,
    readonly shape: ModelShape,
    src: WeightSource,
    opts: ParsedLoadOptions,
    maxContext: number,
    readonly weightDtype: DType,
  ) {
    this.maxContext = maxContext;
    this.prefillBlock = Math.min(opts.prefillBlock, maxContext);
    this.w = new WeightLoader(backend, src, weightDtype);
    const window = resolveGpuKvBudget(opts.gpuKvBudget, { maxContext });
    const sinks = window < maxContext ? opts.sinkTokens : 0;
    this.cacheOptions = {
      layers: shape.layers, kvHeads: shape.kvHeads, headDim: shape.headDim, maxContext,
      dtype: opts.kvDtype, gpuKvBudget: window, sinkTokens: sinks,
      evictBlock: opts.kvEvictBlock ?? Math.max(1, Math.min(16, window - sinks)),
      maxAppend: this.prefillBlock,
    };
    this.own = this.bound = this.newSequenceState();
  }

  /** The bound sequence's KV cache (the model's own unless withSequence is running). */
  get cache(): KvCache {
    return this.bound.cache;
  }

  /** The bound sequence's attention stage (KV append, full or hybrid attention). */
  get attention(): Attention {
    return this.bound.attention;
  }

  /** The model's own sequence (what forward/step use outside withSequence). */
  get ownSequence(): SequenceState {
    return this.own;
  }

  /** KV options of a sequence holding `maxContext` positions (at most the model's): the model's window; its store and score rows sized to it. */
  private sequenceOptions(maxContext: number): KvCacheOptions {
    if (!(Number.isInteger(maxContext) && maxContext >= 1 && maxContext <= this.maxContext)) fail(`a sequence's context must be an integer in [1, ${this.maxContext}], got ${maxContext}`);
    return maxContext === this.maxContext ? this.cacheOptions : { ...this.cacheOptions, maxContext };
  }

  /**
   * Bytes a sequence of `maxContext` positions (createSequence({ maxContext })) takes: its KV
   * window and f32 score rows on the model's backend, its offloaded store (host tiers once placed)
   * and the scratch a prefill over a host store adds on the device.
   */
  sequenceBytes(maxContext: number): { readonly window: number; readonly scores: number; readonly store: number; readonly scratch: number; readonly storeCapacity: number } {
    return { ...kvCacheFootprint(this.sequenceOptions(maxContext)), scores: this.shape.heads * maxContext * 4 };
  }

  private newSequenceState(maxContext = this.maxContext): SequenceState {
    const cache = new KvCache(this.backend, this.sequenceOptions(maxContext));
    try {
      return { cache, attention: new Attention(this.backend, cache, this.shape) };
    } catch (e) {
      cache.close();
      throw e;
    }
  }

  // ---- several sequences (batched decode) ------------------------------------------------------

  /**
   * A new empty sequence with its own KV cache (the model's options; `maxContext`, at most the
   * model's, bounds its positions and sizes its store and score rows: a server sizes each request's).
   */
  createSequence(options: { readonly maxContext?: number } = {}): SequenceState {
    this.checkOpen();
    const s = this.newSequenceState(options.maxContext);
    this.extra.add(s);
    try {
      if (this.setup) this.setups.set(s, this.setup(s));
    } catch (e) {
      this.releaseSequence(s);
      throw e;
    }
    return s;
  }

  /**
   * Run `setup` on every sequence createSequence makes from now on (null: none), e.g. to attach
   * a decode attention of its own to each sequence of a batch (@hybridgen/runtime's
   * createBatchHybridAttention); what it returns is disposed when the sequence is released.
   */
  setSequenceSetup(setup: ((s: SequenceState) => Disposable) | null): void {
    this.checkOpen();
    this.setup = setup;
  }

  /** Free a sequence made by createSequence (its KV storage goes back to the backend). */
  releaseSequence(s: SequenceState): void {
    if (!this.extra.delete(s)) return;
    this.disposeSetup(s);
    s.attention.close();
    s.cache.close();
  }

  /** Run `f` with `s` bound: forward/step/reset/readLogits then act on s (prefill of one sequence). */
  withSequence<T>(s: SequenceState, f: () => T): T {
    this.checkOpen();
    this.checkSequence(s);
    const prev = this.bound;
    this.bound = s;
    try {
      return f();
    } finally {
      this.bound = prev;
    }
  }

  /**
   * Make stepBatch take up to `capacity` sequences (≤ MAX_BATCH). The batch buffers are made
   * once; a larger capacity later makes new ones (the smaller stay allocated until close, so
   * reserve the largest batch first).
   */
  reserveBatch(capacity: number): void {
    this.checkOpen();
    if (!(Number.isInteger(capacity) && capacity >= 1 && capacity <= MAX_BATCH)) fail(`batch size ${capacity} out of range [1, ${MAX_BATCH}]`);
    if (capacity === 1 || (this.batch && this.batch.capacity >= capacity)) return;
    this.batch = new BatchRows(this.backend, this.w, this.shape, capacity);
    this.allocBatch(capacity);
  }

  /** Largest batch stepBatch takes now (1 until reserveBatch). */
  get batchCapacity(): number {
    return this.batch?.capacity ?? 1;
  }

  /**
   * One decode step of B = ids.length sequences: ids[i] goes to the next position of seqs[i].
   * B = 1 is the ordinary step (fused decode paths included); B ≥ 2 runs the B rows as one
   * block (runBatch). Logits of row i: readBatchLogits(i) / argmaxBatch(i).
   */
  stepBatch(ids: Int32Array, seqs: readonly SequenceState[]): void {
    this.checkOpen();
    const B = ids.length;
    if (B !== seqs.length) fail(`stepBatch: ${B} token ids for ${seqs.length} sequences`);
    if (B === 1) {
      this.withSequence(seqs[0], () => this.step(ids, seqs[0].cache.length));
      return;
    }
    this.lastBatchRows = 0; // until the step completes, no row's logits are valid
    if (!this.batch) fail(`stepBatch: ${B} sequences but no batch buffers (call reserveBatch first)`);
    this.batch.checkRows(B);
    const vocab = this.shape.vocabSize;
    for (let i = 0; i < B; i++) {
      const s = seqs[i];
      this.checkSequence(s);
      for (let j = 0; j < i; j++) if (seqs[j] === s) fail(`stepBatch: sequence ${i} is also row ${j}`);
      if (s.cache.length + 1 > this.maxContext) fail(`context overflow: row ${i} holds ${s.cache.length} tokens, the context is ${this.maxContext}`);
      if (!(ids[i] >= 0 && ids[i] < vocab)) fail(`stepBatch: token id ${ids[i]} of row ${i} out of range [0, ${vocab})`);
    }
    this.batchSeqs.length = 0;
    for (let i = 0; i < B; i++) {
      this.batchSeqs.push(seqs[i]);
      this.batchPos[i] = seqs[i].cache.append(1);
    }
    const be = this.backend, positions = this.batchPos.subarray(0, B);
    // Decode attentions (hybrid) record a segment a layer (BatchRows); a step without them is one recording.
    const decode = hasDecodeAttention(seqs);
    // One recorded step per batch size: a GPU backend replays the graph of the last step of this B.
    const graphs = !decode && be.beginStep !== undefined && be.endStep !== undefined;
    if (graphs) be.beginStep!((this.batchKeys[B] ??= this.batchKey + B));
    try {
      if (decode) this.batch.beginStep(seqs, positions, B);
      this.runBatch(ids, positions, B);
      if (decode) this.batch.endStep(seqs, B);
    } finally {
      if (graphs) be.endStep!();
      if (decode) this.batch.closeSegment(); // a step that failed mid-layer: what was recorded runs
      for (let i = 0; i < B; i++) seqs[i].cache.evict();
    }
    this.lastBatchRows = B;
  }

  /** Logits of row `row` of the last stepBatch. */
  readBatchLogits(row: number): Float32Array {
    if (!this.batchRow("readBatchLogits", row)) return this.readLogits();
    const vocab = this.shape.vocabSize;
    return this.backend.read(this.batchLogits, row * vocab, vocab);
  }

  /** Greedy choice of row `row` of the last stepBatch, on the backend. */
  argmaxBatch(row: number): number {
    if (!this.batchRow("argmaxBatch", row)) return this.argmaxLogits();
    return this.backend.argmax(this.batchLogits, row);
  }

  /** Checks `row` against the last stepBatch: true for a row of the batch buffers, false for
   * row 0 of a step that ran as a plain one-row step (its logits are the single-step ones). */
  private batchRow(op: string, row: number): boolean {
    this.checkOpen();
    if (this.lastBatchRows === 0) {
      if (row !== 0) fail(`${op}: row ${row} of a one-row step`);
      return false;
    }
    if (!(Number.isInteger(row) && row >= 0 && row < this.lastBatchRows)) fail(`${op}: row ${row} out of range [0, ${this.lastBatchRows})`);
    return true;
  }

  /**
   * Greedy choices of rows 0..n−1 of the last stepBatch into out[0..n): one backend call where
   * the backend has argmaxRows, else argmaxBatch row by row.
   */
  argmaxBatchRows(n: number, out: Int32Array): void {
    this.checkOpen();
    const rows = Math.max(1, this.lastBatchRows);
    if (!(Number.isInteger(n) && n >= 1 && n <= rows)) fail(`argmaxBatchRows: ${n} rows, the last step has ${rows}`);
    if (!(out instanceof Int32Array) || out.length < n) fail(`argmaxBatchRows: out must be an Int32Array of at least ${n} values`);
    if (this.lastBatchRows === 0 || !this.backend.argmaxRows) {
      for (let i = 0; i < n; i++) out[i] = this.argmaxBatch(i);
      return;
    }
    this.backend.argmaxRows(this.batchLogits, n, out);
  }

  /** The architecture's batch activations for `capacity` rows (after this.batch is made). */
  protected allocBatch(_capacity: number): void {
    fail(`batched decode is not supported for ${this.shape.architecture} yet`);
  }

  /**
   * One token of each of B sequences through every layer as one block of B rows; row i is at
   * positions[i] of sequence i (already appended). Attention: this.batch.attend(l, …, B).
   * Writes [B, vocab] logits to batchLogits.
   */
  protected runBatch(_ids: Int32Array, _positions: Int32Array, _B: number): void {
    fail(`batched decode is not supported for ${this.shape.architecture} yet`);
  }

  /** The [capacity, vocab] logits runBatch writes. */
  protected get batchLogits(): Tensor {
    return fail(`batched decode is not supported for ${this.shape.architecture} yet`);
  }

  /** Sequences of the running batched step, row by row (for runBatch's attention). */
  protected get batchSequences(): readonly SequenceState[] {
    return this.batchSeqs;
  }

  private disposeSetup(s: SequenceState): void {
    const d = this.setups.get(s);
    this.setups.delete(s);
    d?.[Symbol.dispose]();
  }

  private checkSequence(s: SequenceState): void {
    if (s !== this.own && !this.extra.has(s)) fail("sequence is not one of this model's (released, or made by another model)");
  }

  /** Runs `load` (weights, activations); on failure frees what it loaded and rethrows. */
  protected loadOrClose(load: () => void): this {
    try {
      load();
    } catch (e) {
      this.close();
      throw e;
    }
    return this;
  }

  /** Runs rows of `ids` at positions [pos0, pos0 + n) through every layer; logits of the last row. */
  protected abstract runBlock(ids: Int32Array, pos0: number, n: number): void;

  /** The [1, vocab] logits buffer runBlock writes. */
  protected abstract get logits(): Tensor;

  /** QueryProjector's work, after projectQuery checked its arguments. */
  protected abstract computeQuery(layer: number, x: Tensor, pos: number, out: Tensor): void;

  /** Positions in the KV cache. */
  get length(): number {
    return this.cache.length;
  }

  /**
   * Run `ids` at positions [startPos, startPos + ids.length) (startPos must equal `length`),
   * appending to the KV cache, and return the logits of the last token.
   */
  forward(ids: Int32Array, startPos: number): Float32Array {
    this.step(ids, startPos);
    return this.readLogits();
  }

  /** forward() without reading the logits back: they stay on the backend for argmaxLogits(). */
  step(ids: Int32Array, startPos: number): void {
    this.checkOpen();
    this.lastBatchRows = 0;
    const n = ids.length;
    // `if` rather than check(): a template message would be built on every decode step.
    if (n < 1) fail("forward: no tokens");
    if (startPos !== this.cache.length) {
      fail(`forward: startPos ${startPos} must equal the cached length ${this.cache.length} (reset() to start over)`);
    }
    if (startPos + n > this.maxContext) fail(`context overflow: ${startPos} + ${n} tokens exceed the context of ${this.maxContext}`);
    const vocab = this.shape.vocabSize;
    for (let i = 0; i < n; i++) {
      if (!(ids[i] >= 0 && ids[i] < vocab)) fail(`forward: token id ${ids[i]} out of range [0, ${vocab})`);
    }
    const block = this.prefillBlock;
    // The prompt ends at expectPrompt's length, or else with this call.
    const end = Math.max(startPos + n, this.promptEnd);
    for (let off = 0; off < n; off += block) {
      const rows = Math.min(block, n - off);
      // A prompt's last block of several rows (a one-row block after it runs as a decode step).
      this.attention.markFinalBlock(rows > 1 && end - (startPos + off + rows) <= 1);
      this.runBlock(rows === n ? ids : ids.subarray(off, off + rows), startPos + off, rows);
    }
    if (startPos + n >= this.promptEnd) this.promptEnd = 0;
  }

  /**
   * The prompt about to be prefilled is `tokens` long, though it comes in several calls
   * (generate's blocks): its last block, not each call's, is the one a prefill observer sees.
   */
  expectPrompt(tokens: number): void {
    this.promptEnd = tokens;
  }

  // ---- greedy decode fed on the device (Backend.argmaxToFeed) ----------------------------------
  // The host records and launches step t + 1 while the device still runs step t: the step embeds
  // the token the device picked, and the host reads that token afterwards (generate does this).

  /** Whether the backend can feed greedy picks to the next step on the device. */
  get feedsOnDevice(): boolean {
    const be = this.backend;
    return be.argmaxToFeed !== undefined && be.embeddingFromFeed !== undefined && be.feedResult !== undefined;
  }

  /** Greedy pick of the last step's logits into the feed and, without waiting, host slot `slot`. */
  pickToFeed(slot: number): void {
    this.checkOpen();
    if (!this.feedsOnDevice) fail("pickToFeed: the backend cannot feed tokens on the device");
    this.backend.argmaxToFeed!(this.logits, 0, slot);
  }

  /** step() of one token at `startPos`: the token the last pickToFeed picked, read on the device. */
  stepFed(startPos: number): void {
    if (!this.feedsOnDevice) fail("stepFed: the backend cannot feed tokens on the device");
    this.fedStep = true;
    try {
      this.step(FED_PLACEHOLDER, startPos);
    } finally {
      this.fedStep = false;
    }
  }

  /** The token pickToFeed(slot) picked (waits for it). */
  fedToken(slot: number): number {
    this.checkOpen();
    if (!this.feedsOnDevice) fail("fedToken: the backend cannot feed tokens on the device");
    return this.backend.feedResult!(slot);
  }

  /** Token embeddings of a block: `ids`, or in a stepFed the device's pick. */
  protected embedIds(out: Tensor, table: Tensor, ids: Int32Array): void {
    if (this.fedStep) this.backend.embeddingFromFeed!(out, table);
    else this.backend.embedding(out, table, ids);
  }

  /** Logits of the last token of the last forward/step. */
  readLogits(): Float32Array {
    this.checkOpen();
    return this.backend.read(this.logits, 0, this.shape.vocabSize);
  }

  /** Greedy choice on the backend, without reading the logits. */
  argmaxLogits(): number {
    this.checkOpen();
    return this.backend.argmax(this.logits, 0);
  }

  /**
   * QueryProjector: q of `layer` from residual row x (row 0) at `pos`. The hybrid runtime
   * calls it with layer l's input for layer l + 1 (speculative query).
   */
  projectQuery(layer: number, x: Tensor, pos: number, out: Tensor): void {
    this.checkOpen();
    if (!(Number.isInteger(layer) && layer >= 0 && layer < this.shape.layers)) fail(`projectQuery: layer ${layer} out of range [0, ${this.shape.layers})`);
    if (!(Number.isInteger(pos) && pos >= 0 && pos < this.maxContext)) fail(`projectQuery: position ${pos} out of range [0, ${this.maxContext})`);
    this.computeQuery(layer, x, pos, out);
  }

  /** Forget the context (weights and buffers are kept). */
  reset(): void {
    this.checkOpen();
    this.cache.reset();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.w.close();
    for (const s of [this.own, ...this.extra]) {
      this.disposeSetup(s);
      s.attention.close();
      s.cache.close();
    }
    this.extra.clear();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  protected checkOpen(): void {
    if (this.closed) fail("model used after close()");
  }
}
