/**
 * DecoderModel: what every decoder-only architecture here (llama.ts, opt.ts) shares around
 * its forward pass — load options, the KV cache and attention stage, the WeightLoader that
 * owns every tensor, the step loop that checks its input and cuts a prompt into prefill
 * blocks, logits readout, reset and close. An architecture file adds its weights, its
 * activation buffers and `runBlock` (one block of rows through every layer).
 */
import { z } from "zod";
import type { Backend, DType, Tensor } from "./backend.js";
import { Attention, type QueryProjector } from "./attention.js";
import type { ModelShape } from "./config.js";
import { check, fail } from "./errors.js";
import { KvCache } from "./kv-cache.js";
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
  /** Tokens kept resident in the KV window; older ones are offloaded. Default: all. */
  kvWindow: z.number().int().positive().optional(),
  /** Eviction granularity of the KV window; default min(16, kvWindow − kvSinks). */
  kvEvictBlock: z.number().int().positive().optional(),
  /** The first positions stay in the KV window for good (attention sinks); only with kvWindow. */
  kvSinks: z.number().int().nonnegative().default(0),
  /** Storage dtype of the KV cache. */
  kvDtype: DTypeSchema.default("f32"),
});
export type LlamaLoadOptions = z.input<typeof LlamaLoadOptionsSchema>;
export type ParsedLoadOptions = z.output<typeof LlamaLoadOptionsSchema>;

export const DEFAULT_MAX_CONTEXT = 4096;

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
  readonly cache: KvCache;
  /** The attention stage (KV append, full or hybrid attention). */
  readonly attention: Attention;
  /** Loads and owns every weight and activation buffer; close() frees them. */
  protected readonly w: WeightLoader;
  private closed = false;

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
    const window = opts.kvWindow;
    const sinks = window === undefined ? 0 : opts.kvSinks;
    this.cache = new KvCache(backend, {
      layers: shape.layers, kvHeads: shape.kvHeads, headDim: shape.headDim, maxContext,
      dtype: opts.kvDtype, windowBudget: window, sinkTokens: sinks,
      evictBlock: opts.kvEvictBlock ?? Math.max(1, Math.min(16, (window ?? 16) - sinks)),
      maxAppend: this.prefillBlock,
    });
    try {
      this.attention = new Attention(backend, this.cache, shape);
    } catch (e) {
      this.cache.close();
      throw e;
    }
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
    for (let off = 0; off < n; off += block) {
      const rows = Math.min(block, n - off);
      this.runBlock(rows === n ? ids : ids.subarray(off, off + rows), startPos + off, rows);
    }
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
    this.attention.close();
    this.cache.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  protected checkOpen(): void {
    if (this.closed) fail("model used after close()");
  }
}
