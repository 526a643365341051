/**
 * LlamaModel: the Llama architecture over any Backend, using only Backend ops.
 *
 *   x = embed(ids)
 *   per layer: h = rmsNorm(x) → [q;k;v] = h·Wqkvᵀ → RoPE(q, k) → append k, v to the KV cache
 *              → attention (store span, then window spans, one softmax) → x += att·Woᵀ
 *              h = rmsNorm(x) → [g;u] = h·Wguᵀ → x += (silu(g)·u)·Wdownᵀ
 *   logits = rmsNorm(x_last)·lm_headᵀ
 *
 * Speed: q/k/v and gate/up weights are concatenated at load, so a decode step runs one
 * matmul for each pair/triple; the parts of the fused outputs are views, so nothing is
 * copied. Prefill runs blocks of `prefillBlock` rows with the same weights seen as views
 * (one matmul per part, since rows of a fused output would be strided). Every activation
 * is preallocated: a decode step allocates nothing in JS.
 */
import { z } from "zod";
import type { Backend, DType, Tensor } from "./backend.js";
import { DTYPE_BYTES } from "./backend.js";
import type { LlamaConfigJson, ModelShape } from "./config.js";
import { check, fail } from "./errors.js";
import { convertBytes } from "./half-float.js";
import { Attention, type QueryProjector } from "./attention.js";
import { KvCache } from "./kv-cache.js";
import type { ModelFiles, WeightSource, WeightView } from "./model-files.js";

const DTypeSchema = z.enum(["f32", "f16", "bf16"]);

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

export const DEFAULT_MAX_CONTEXT = 4096;

interface LayerWeights {
  attnNorm: Tensor;
  wqkv: Tensor; // [(heads + 2·kvHeads)·headDim, hidden]
  bqkv: Tensor | null;
  wq: Tensor; wk: Tensor; wv: Tensor; // views of wqkv
  bq: Tensor | null; bk: Tensor | null; bv: Tensor | null;
  wo: Tensor;
  bo: Tensor | null;
  mlpNorm: Tensor;
  wgu: Tensor; // [2·intermediate, hidden]
  bgu: Tensor | null;
  wg: Tensor; wu: Tensor; // views of wgu
  bg: Tensor | null; bu: Tensor | null;
  wdown: Tensor;
  bdown: Tensor | null;
}

/** Preallocated activations, sized for a prefill block (decode uses row 0). */
interface Activations {
  x: Tensor; h: Tensor; h2: Tensor;
  q: Tensor; k: Tensor; v: Tensor;
  kRows: Tensor; vRows: Tensor; // k, v seen as [rows·kvHeads, headDim]
  qkv: Tensor; // decode: fused output [1, (heads + 2·kvHeads)·headDim]
  qkvQ: Tensor; qkvQK: Tensor; qkvK: Tensor; qkvV: Tensor;
  att: Tensor;
  gate: Tensor; up: Tensor;
  gu: Tensor; guG: Tensor; guU: Tensor; // decode: fused [1, 2·intermediate]
  specH: Tensor; // [1, hidden]: normed row for the speculative query
  last: Tensor;
  logits: Tensor;
  positions: Int32Array;
}

export class LlamaModel implements Disposable, QueryProjector {
  readonly maxContext: number;
  readonly prefillBlock: number;
  readonly weightDtype: DType;
  readonly cache: KvCache;
  /** The attention stage (KV append, full or hybrid attention). */
  readonly attention: Attention;

  private readonly owned: Tensor[] = [];
  private readonly views: Tensor[] = [];
  private readonly layers: LayerWeights[] = [];
  private embed!: Tensor;
  private finalNorm!: Tensor;
  private lmHead!: Tensor;
  private cos!: Tensor;
  private sin!: Tensor;
  private act!: Activations;
  private readonly specPos = new Int32Array(1);
  private closed = false;

  private constructor(
    readonly backend: Backend,
    readonly shape: ModelShape,
    opts: z.output<typeof LlamaLoadOptionsSchema>,
    maxContext: number,
    weightDtype: DType,
  ) {
    this.maxContext = maxContext;
    this.prefillBlock = Math.min(opts.prefillBlock, maxContext);
    this.weightDtype = weightDtype;
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

  /** Load weights from `files` onto `backend`. `files` must stay open until close(). */
  static load(files: ModelFiles, backend: Backend, options: LlamaLoadOptions = {}): LlamaModel {
    const parsed = LlamaLoadOptionsSchema.safeParse(options);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      fail(`invalid load option ${issue.path.join(".")}: ${issue.message}`);
    }
    const opts = parsed.data;
    const shape = files.shape;
    // Qwen2 is Llama with q/k/v biases (see qwen2.ts); OPT has its own model (opt.ts).
    check(shape.architecture === "llama" || shape.architecture === "qwen2", `LlamaModel cannot run the ${shape.architecture} architecture (use loadModel)`);
    check(shape.heads % shape.kvHeads === 0, `${shape.heads} attention heads is not a multiple of ${shape.kvHeads} KV heads`);
    check(shape.headDim % 2 === 0, `head_dim ${shape.headDim} must be even for rotary embeddings`);
    const maxContext = opts.maxContext ?? Math.min(shape.maxPositions, DEFAULT_MAX_CONTEXT);
    check(maxContext <= shape.maxPositions, `maxContext ${maxContext} exceeds the model's max_position_embeddings ${shape.maxPositions}`);
    const embedView = requireWeight(files.weights, "model.embed_tokens.weight", [shape.vocabSize, shape.hiddenSize]);
    const weightDtype = opts.weightDtype ?? embedView.dtype;
    const model = new LlamaModel(backend, shape, opts, maxContext, weightDtype);
    try {
      model.loadWeights(files.weights, files.config as LlamaConfigJson);
      model.allocActivations();
    } catch (e) {
      model.close();
      throw e;
    }
    return model;
  }

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
    return this.backend.read(this.act.logits, 0, this.shape.vocabSize);
  }

  /** Greedy choice on the backend, without reading the logits. */
  argmaxLogits(): number {
    this.checkOpen();
    return this.backend.argmax(this.act.logits, 0);
  }

  /** Forget the context (weights and buffers are kept). */
  reset(): void {
    this.checkOpen();
    this.cache.reset();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const t of this.views) this.backend.free(t);
    for (const t of this.owned) this.backend.free(t);
    this.views.length = 0;
    this.owned.length = 0;
    this.attention.close();
    this.cache.close();
  }

  [Symbol.dispose](): void {
    this.close();
  }

  // ---- the forward pass ---------------------------------------------------------------------

  private runBlock(ids: Int32Array, pos0: number, n: number): void {
    const be = this.backend, a = this.act, s = this.shape, eps = s.normEps;
    const decode = n === 1;
    for (let i = 0; i < n; i++) a.positions[i] = pos0 + i;
    const attn = this.attention;
    attn.beginBlock(n);
    be.embedding(a.x, this.embed, ids);
    for (let l = 0; l < s.layers; l++) {
      const w = this.layers[l];
      attn.layerInput(l, a.x);
      be.rmsNorm(a.h, a.x, w.attnNorm, n, eps);
      if (decode) {
        be.matmul(a.qkv, a.h, w.wqkv, 1, w.bqkv ?? undefined);
        be.rope(a.qkvQK, 1, a.positions, s.heads + s.kvHeads, s.headDim, this.cos, this.sin);
        attn.attend(l, a.qkvQ, a.qkvK, a.qkvV, a.att);
      } else {
        be.matmul(a.q, a.h, w.wq, n, w.bq ?? undefined);
        be.matmul(a.k, a.h, w.wk, n, w.bk ?? undefined);
        be.matmul(a.v, a.h, w.wv, n, w.bv ?? undefined);
        be.rope(a.q, n, a.positions, s.heads, s.headDim, this.cos, this.sin);
        be.rope(a.k, n, a.positions, s.kvHeads, s.headDim, this.cos, this.sin);
        attn.attend(l, a.q, a.kRows, a.vRows, a.att);
      }
      be.matmul(a.h2, a.att, w.wo, n, w.bo ?? undefined);
      be.add(a.x, a.x, a.h2, n);

      be.rmsNorm(a.h, a.x, w.mlpNorm, n, eps);
      if (decode) {
        be.matmul(a.gu, a.h, w.wgu, 1, w.bgu ?? undefined);
        be.siluMul(a.guG, a.guG, a.guU, 1);
        be.matmul(a.h2, a.guG, w.wdown, 1, w.bdown ?? undefined);
      } else {
        be.matmul(a.gate, a.h, w.wg, n, w.bg ?? undefined);
        be.matmul(a.up, a.h, w.wu, n, w.bu ?? undefined);
        be.siluMul(a.gate, a.gate, a.up, n);
        be.matmul(a.h2, a.gate, w.wdown, n, w.bdown ?? undefined);
      }
      be.add(a.x, a.x, a.h2, n);
    }
    // Only the last row's logits are needed.
    if (n > 1) be.copyRows(a.last, 0, a.x, n - 1, 1);
    be.rmsNorm(a.last, n > 1 ? a.last : a.x, this.finalNorm, 1, eps);
    be.matmul(a.logits, a.last, this.lmHead, 1);
    attn.endBlock();
  }

  /**
   * QueryProjector: q of `layer` from residual row x (row 0): RoPE(W_q · rmsNorm(x)) at `pos`.
   * The hybrid runtime calls it with layer l's input for layer l + 1 (speculative query).
   */
  projectQuery(layer: number, x: Tensor, pos: number, out: Tensor): void {
    this.checkOpen();
    if (!(Number.isInteger(layer) && layer >= 0 && layer < this.shape.layers)) fail(`projectQuery: layer ${layer} out of range [0, ${this.shape.layers})`);
    if (!(Number.isInteger(pos) && pos >= 0 && pos < this.maxContext)) fail(`projectQuery: position ${pos} out of range [0, ${this.maxContext})`);
    const be = this.backend, s = this.shape, w = this.layers[layer], a = this.act;
    be.rmsNorm(a.specH, x, w.attnNorm, 1, s.normEps);
    be.matmul(out, a.specH, w.wq, 1, w.bq ?? undefined);
    this.specPos[0] = pos;
    be.rope(out, 1, this.specPos, s.heads, s.headDim, this.cos, this.sin);
  }

  // ---- loading --------------------------------------------------------------------------------

  private loadWeights(src: WeightSource, config: LlamaConfigJson): void {
    const s = this.shape, hd = s.headDim, dim = s.hiddenSize, inter = s.intermediateSize;
    const qRows = s.heads * hd, kvRows = s.kvHeads * hd;
    // attention_bias puts biases on q, k, v and o; Qwen2 always has them on q, k, v only.
    const qwen2 = s.architecture === "qwen2";
    const qkvBias = qwen2 || config.attention_bias === true, oBias = !qwen2 && config.attention_bias === true;
    const mlpBias = config.mlp_bias === true;

    this.embed = this.matrix(src, "model.embed_tokens.weight", [s.vocabSize, dim]);
    for (let l = 0; l < s.layers; l++) {
      const p = `model.layers.${l}.`;
      const wqkv = this.fused(src, [`${p}self_attn.q_proj.weight`, `${p}self_attn.k_proj.weight`, `${p}self_attn.v_proj.weight`], [qRows, kvRows, kvRows], dim);
      const bqkv = qkvBias ? this.fusedBias(src, [`${p}self_attn.q_proj.bias`, `${p}self_attn.k_proj.bias`, `${p}self_attn.v_proj.bias`], [qRows, kvRows, kvRows]) : null;
      const wgu = this.fused(src, [`${p}mlp.gate_proj.weight`, `${p}mlp.up_proj.weight`], [inter, inter], dim);
      const bgu = mlpBias ? this.fusedBias(src, [`${p}mlp.gate_proj.bias`, `${p}mlp.up_proj.bias`], [inter, inter]) : null;
      this.layers.push({
        attnNorm: this.vector(src, `${p}input_layernorm.weight`, dim),
        wqkv, bqkv,
        wq: this.view(wqkv, 0, [qRows, dim]),
        wk: this.view(wqkv, qRows * dim, [kvRows, dim]),
        wv: this.view(wqkv, (qRows + kvRows) * dim, [kvRows, dim]),
        bq: bqkv && this.view(bqkv, 0, [qRows]),
        bk: bqkv && this.view(bqkv, qRows, [kvRows]),
        bv: bqkv && this.view(bqkv, qRows + kvRows, [kvRows]),
        wo: this.matrix(src, `${p}self_attn.o_proj.weight`, [dim, qRows]),
        bo: oBias ? this.vector(src, `${p}self_attn.o_proj.bias`, dim) : null,
        mlpNorm: this.vector(src, `${p}post_attention_layernorm.weight`, dim),
        wgu, bgu,
        wg: this.view(wgu, 0, [inter, dim]),
        wu: this.view(wgu, inter * dim, [inter, dim]),
        bg: bgu && this.view(bgu, 0, [inter]),
        bu: bgu && this.view(bgu, inter, [inter]),
        wdown: this.matrix(src, `${p}mlp.down_proj.weight`, [dim, inter]),
        bdown: mlpBias ? this.vector(src, `${p}mlp.down_proj.bias`, dim) : null,
      });
    }
    this.finalNorm = this.vector(src, "model.norm.weight", dim);
    this.lmHead = s.tieEmbeddings ? this.embed : this.matrix(src, "lm_head.weight", [s.vocabSize, dim]);
    this.loadRope(config);
  }

  /** cos/sin [maxContext, headDim/2] computed in f64, with Llama-3 / linear / dynamic scaling if configured. */
  private loadRope(config: LlamaConfigJson): void {
    const hd = this.shape.headDim, half = hd / 2, theta = this.shape.ropeTheta;
    const invFreq = new Float64Array(half);
    for (let j = 0; j < half; j++) invFreq[j] = theta ** (-(2 * j) / hd);
    let posScale = 1;
    const scaling = config.rope_scaling ?? config.rope_parameters ?? null;
    const kind = scaling?.rope_type ?? scaling?.type ?? "default";
    if (kind === "llama3") {
      const factor = scaling?.factor ?? 8, low = scaling?.low_freq_factor ?? 1, high = scaling?.high_freq_factor ?? 4;
      const oldCtx = scaling?.original_max_position_embeddings ?? 8192;
      for (let j = 0; j < half; j++) {
        const wavelen = (2 * Math.PI) / invFreq[j];
        if (wavelen > oldCtx / low) invFreq[j] /= factor;
        else if (wavelen >= oldCtx / high) {
          const smooth = (oldCtx / wavelen - low) / (high - low);
          invFreq[j] = (1 - smooth) * (invFreq[j] / factor) + smooth * invFreq[j];
        }
      }
    } else if (kind === "linear") {
      posScale = 1 / (scaling?.factor ?? 1);
    } else if (kind !== "default" && kind !== "dynamic") {
      // "dynamic" (NTK) only changes frequencies past max_position_embeddings, which the
      // context never exceeds (load checks maxContext against it), so it equals "default".
      fail(`unsupported rope scaling type "${kind}"`);
    }
    const cos = new Float32Array(this.maxContext * half), sin = new Float32Array(this.maxContext * half);
    for (let p = 0; p < this.maxContext; p++) {
      for (let j = 0; j < half; j++) {
        const angle = p * posScale * invFreq[j];
        cos[p * half + j] = Math.cos(angle);
        sin[p * half + j] = Math.sin(angle);
      }
    }
    this.cos = this.alloc([this.maxContext, half]);
    this.sin = this.alloc([this.maxContext, half]);
    this.backend.write(this.cos, cos);
    this.backend.write(this.sin, sin);
  }

  private allocActivations(): void {
    const s = this.shape, B = this.prefillBlock, dim = s.hiddenSize, hd = s.headDim, inter = s.intermediateSize;
    const qw = s.heads * hd, kvw = s.kvHeads * hd;
    const k = this.alloc([B, kvw]), v = this.alloc([B, kvw]);
    const qkv = this.alloc([1, qw + 2 * kvw]);
    const gu = this.alloc([1, 2 * inter]);
    this.act = {
      x: this.alloc([B, dim]), h: this.alloc([B, dim]), h2: this.alloc([B, dim]),
      q: this.alloc([B, qw]), k, v,
      kRows: this.view(k, 0, [B * s.kvHeads, hd]), vRows: this.view(v, 0, [B * s.kvHeads, hd]),
      qkv,
      qkvQ: this.view(qkv, 0, [1, qw]),
      qkvQK: this.view(qkv, 0, [1, qw + kvw]),
      qkvK: this.view(qkv, qw, [s.kvHeads, hd]),
      qkvV: this.view(qkv, qw + kvw, [s.kvHeads, hd]),
      att: this.alloc([B, qw]),
      gate: this.alloc([B, inter]), up: this.alloc([B, inter]),
      gu, guG: this.view(gu, 0, [1, inter]), guU: this.view(gu, inter, [1, inter]),
      specH: this.alloc([1, dim]),
      last: this.alloc([1, dim]),
      logits: this.alloc([1, s.vocabSize]),
      positions: new Int32Array(B),
    };
  }

  /** A matmul/embedding weight, converted to the weight dtype (in place when it already is). */
  private matrix(src: WeightSource, name: string, shape: number[]): Tensor {
    const w = requireWeight(src, name, shape);
    return this.own(this.backend.loadWeight(convertBytes(w.bytes, w.dtype, this.weightDtype), this.weightDtype, shape));
  }

  /** Row-wise concatenation of several weights with the same column count. */
  private fused(src: WeightSource, names: string[], rows: number[], cols: number): Tensor {
    const size = DTYPE_BYTES[this.weightDtype];
    const total = rows.reduce((a, r) => a + r, 0);
    const bytes = new Uint8Array(total * cols * size);
    let off = 0;
    names.forEach((name, i) => {
      const w = requireWeight(src, name, [rows[i], cols]);
      bytes.set(convertBytes(w.bytes, w.dtype, this.weightDtype), off);
      off += rows[i] * cols * size;
    });
    return this.own(this.backend.loadWeight(bytes, this.weightDtype, [total, cols]));
  }

  /** Norm weights and biases stay f32 (they are tiny and read by f32-only ops). */
  private vector(src: WeightSource, name: string, len: number): Tensor {
    const w = requireWeight(src, name, [len]);
    return this.own(this.backend.loadWeight(convertBytes(w.bytes, w.dtype, "f32"), "f32", [len]));
  }

  private fusedBias(src: WeightSource, names: string[], lens: number[]): Tensor {
    const total = lens.reduce((a, r) => a + r, 0);
    const bytes = new Uint8Array(total * 4);
    let off = 0;
    names.forEach((name, i) => {
      const w = requireWeight(src, name, [lens[i]]);
      bytes.set(convertBytes(w.bytes, w.dtype, "f32"), off);
      off += lens[i] * 4;
    });
    return this.own(this.backend.loadWeight(bytes, "f32", [total]));
  }

  private alloc(shape: number[]): Tensor {
    return this.own(this.backend.alloc(shape, "f32"));
  }

  private own(t: Tensor): Tensor {
    this.owned.push(t);
    return t;
  }

  private view(t: Tensor, offset: number, shape: number[]): Tensor {
    const v = this.backend.view(t, offset, shape);
    this.views.push(v);
    return v;
  }

  private checkOpen(): void {
    if (this.closed) fail("model used after close()");
  }
}

/** The stored tensor `name`, checked to exist with exactly `shape`. */
function requireWeight(src: WeightSource, name: string, shape: number[]): WeightView {
  const w = src.get(name);
  if (!w) fail(`missing tensor ${name} in the model weights`);
  if (w.shape.length !== shape.length || w.shape.some((d, i) => d !== shape[i])) {
    fail(`tensor ${name} has shape [${w.shape.join(", ")}], expected [${shape.join(", ")}]`);
  }
  return w;
}
