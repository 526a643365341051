/**
 * OptModel: Meta's OPT (OPTForCausalLM) over any Backend.
 *
 *   x = project_in(embed(ids)) + positions[pos + 2]
 *   per layer (do_layer_norm_before = true, OPT-125m/1.3b/…):
 *     x += out_proj(attn(LN₁(x)))            x += fc2(relu(fc1(LN₂(x))))
 *   per layer (do_layer_norm_before = false, OPT-350m):
 *     x = LN₁(x + out_proj(attn(x)))         x = LN₂(x + fc2(relu(fc1(x))))
 *   logits = project_out(LN_final(x_last)) · embedᵀ     (LN_final only with pre-norm)
 *
 * Multi-head attention with biases on every projection; q/k/v are fused for decode steps as
 * in llama.ts, and attention itself is the shared Attention stage (KV cache, hybrid hook).
 * Load options, the KV cache and the step loop are DecoderModel's (decoder-model.ts).
 * Batched decode (runBatch) runs B sequences' tokens as B rows, each row attending over its
 * own sequence's cache (batch-rows.ts).
 */
import { type Backend, type DType, type Tensor, check, fail } from "@hybridgen/spec";
import type { ModelShape } from "./config.js";
import { DecoderModel, contextLength, parseLoadOptions, type LlamaLoadOptions, type ParsedLoadOptions } from "./decoder-model.js";
import type { ModelFiles, WeightSource, WeightView } from "./model-files.js";
import { OPT_POSITION_OFFSET, optEmbedDim, optHasFinalNorm, type OptConfigJson } from "./opt-config.js";
import { requireTensor } from "./weight-loader.js";

interface OptLayer {
  ln1w: Tensor; ln1b: Tensor;
  wqkv: Tensor; bqkv: Tensor; // [3·dim, dim], [3·dim]
  wq: Tensor; wk: Tensor; wv: Tensor; bq: Tensor; bk: Tensor; bv: Tensor; // views
  wo: Tensor; bo: Tensor;
  ln2w: Tensor; ln2b: Tensor;
  fc1: Tensor; b1: Tensor; fc2: Tensor; b2: Tensor;
}

interface OptActivations {
  x: Tensor; h: Tensor; h2: Tensor;
  emb: Tensor | null; // [B, embedDim] when project_in exists
  q: Tensor; k: Tensor; v: Tensor; kRows: Tensor; vRows: Tensor;
  qkv: Tensor; qkvQ: Tensor; qkvK: Tensor; qkvV: Tensor;
  att: Tensor; ff: Tensor;
  specH: Tensor;
  last: Tensor; lastEmb: Tensor | null; logits: Tensor;
  posIds: Int32Array;
  posOne: Int32Array; // posIds[0, 1): a decode step allocates nothing
}

/** Batched decode activations, [capacity, …] (q, k, v and att are BatchRows'). */
interface OptBatchActivations {
  x: Tensor; h: Tensor; h2: Tensor; ff: Tensor;
  emb: Tensor | null; // [capacity, embedDim] when project_in/out exist
  logits: Tensor; // [capacity, vocab]
  posIds: Int32Array;
}

/** Older OPT checkpoints name tensors `decoder.*` rather than `model.decoder.*`. */
function withDecoderAlias(src: WeightSource): WeightSource {
  return {
    get: (name: string): WeightView | undefined =>
      src.get(name) ?? (name.startsWith("model.decoder.") ? src.get(name.slice("model.".length)) : undefined),
    names: () => src.names(),
  };
}

export class OptModel extends DecoderModel {
  /** Width of the token embeddings (project_in/out map it to the hidden size when it differs). */
  readonly embedDim: number;
  private readonly layers: OptLayer[] = [];
  private embed!: Tensor;
  private posTable!: Tensor;
  private projIn: Tensor | null = null;
  private projOut: Tensor | null = null;
  private finalW: Tensor | null = null;
  private finalB: Tensor | null = null;
  private lmHead!: Tensor;
  private act!: OptActivations;
  private bact: OptBatchActivations | null = null;

  /** Load an OPT checkpoint onto `backend` (same options as LlamaModel). `files` must stay open. */
  static load(files: ModelFiles, backend: Backend, options: LlamaLoadOptions = {}): OptModel {
    const opts = parseLoadOptions(options);
    const shape = files.shape;
    check(shape.architecture === "opt", `OptModel cannot run the ${shape.architecture} architecture (use loadModel)`);
    const config = files.config as OptConfigJson;
    const maxContext = contextLength(opts, shape);
    const src = withDecoderAlias(files.weights);
    const embedView = requireTensor(src, "model.decoder.embed_tokens.weight", [shape.vocabSize, optEmbedDim(config)]);
    const model = new OptModel(backend, shape, config, src, opts, maxContext, opts.weightDtype ?? embedView.dtype);
    return model.loadOrClose(() => {
      model.loadWeights();
      model.allocActivations();
    });
  }

  private constructor(
    backend: Backend,
    shape: ModelShape,
    readonly config: OptConfigJson,
    src: WeightSource,
    opts: ParsedLoadOptions,
    maxContext: number,
    weightDtype: DType,
  ) {
    super(backend, shape, src, opts, maxContext, weightDtype);
    this.embedDim = optEmbedDim(config);
  }

  protected get logits(): Tensor {
    return this.act.logits;
  }

  /** q of `layer` from residual row x (row 0), unscaled (attention scales). */
  protected computeQuery(layer: number, x: Tensor, _pos: number, out: Tensor): void {
    const L = this.layers[layer];
    this.backend.matmul(out, this.preNorm(this.act.specH, x, L.ln1w, L.ln1b, 1), L.wq, 1, L.bq);
  }

  // ---- the forward pass ---------------------------------------------------------------------

  /** n token embeddings into x (through project_in where the embedding is narrower). */
  private embedTokens(x: Tensor, emb: Tensor | null, ids: Int32Array, n: number): void {
    const be = this.backend;
    if (emb) {
      this.embedIds(emb, this.embed, ids);
      be.matmul(x, emb, this.projIn!, n);
    } else {
      this.embedIds(x, this.embed, ids);
    }
  }

  /** The input of a sublayer: LN(x) into `scratch` with pre-norm, else x itself (post-norm
   * normalizes after the residual add instead). */
  private preNorm(scratch: Tensor, x: Tensor, w: Tensor, b: Tensor, n: number): Tensor {
    if (!this.config.do_layer_norm_before) return x;
    this.backend.layerNorm(scratch, x, w, b, n, this.shape.normEps);
    return scratch;
  }

  /** The feed-forward half of a layer on n rows: x += fc2(act(fc1(LN₂ x))), or with post-norm
   * x = LN₂(x + fc2(act(fc1(x)))). h, h2, ff are scratch. */
  private feedForward(L: OptLayer, x: Tensor, h: Tensor, h2: Tensor, ff: Tensor, n: number): void {
    const be = this.backend;
    be.matmul(ff, this.preNorm(h, x, L.ln2w, L.ln2b, n), L.fc1, n, L.b1);
    if (this.config.activation_function === "relu") be.relu(ff, n);
    else be.gelu(ff, n);
    be.matmul(h2, ff, L.fc2, n, L.b2);
    be.add(x, x, h2, n);
    if (!this.config.do_layer_norm_before) be.layerNorm(x, x, L.ln2w, L.ln2b, n, this.shape.normEps);
  }

  protected runBlock(ids: Int32Array, pos0: number, n: number): void {
    const be = this.backend, a = this.act, s = this.shape, eps = s.normEps;
    const pre = this.config.do_layer_norm_before, decode = n === 1;
    const attn = this.attention;
    attn.beginBlock(n);
    this.embedTokens(a.x, a.emb, ids, n);
    for (let i = 0; i < n; i++) a.posIds[i] = pos0 + i + OPT_POSITION_OFFSET;
    be.embedding(a.h, this.posTable, n === 1 ? a.posOne : n === a.posIds.length ? a.posIds : a.posIds.subarray(0, n));
    be.add(a.x, a.x, a.h, n);

    for (let l = 0; l < s.layers; l++) {
      const L = this.layers[l];
      attn.layerInput(l, a.x);
      const src = this.preNorm(a.h, a.x, L.ln1w, L.ln1b, n);
      if (decode) {
        be.matmul(a.qkv, src, L.wqkv, 1, L.bqkv);
        attn.attend(l, a.qkvQ, a.qkvK, a.qkvV, a.att);
      } else {
        be.matmul(a.q, src, L.wq, n, L.bq);
        be.matmul(a.k, src, L.wk, n, L.bk);
        be.matmul(a.v, src, L.wv, n, L.bv);
        attn.attend(l, a.q, a.kRows, a.vRows, a.att);
      }
      be.matmul(a.h2, a.att, L.wo, n, L.bo);
      be.add(a.x, a.x, a.h2, n);
      if (!pre) be.layerNorm(a.x, a.x, L.ln1w, L.ln1b, n, eps);
      this.feedForward(L, a.x, a.h, a.h2, a.ff, n);
    }
    be.copyRows(a.last, 0, a.x, n - 1, 1);
    if (this.finalW) be.layerNorm(a.last, a.last, this.finalW, this.finalB!, 1, eps);
    if (a.lastEmb) be.matmul(a.lastEmb, a.last, this.projOut!, 1);
    be.matmul(a.logits, a.lastEmb ?? a.last, this.lmHead, 1);
    attn.endBlock();
  }

  protected get batchLogits(): Tensor {
    return this.bact?.logits ?? fail("batched decode: no batch buffers (reserveBatch first)");
  }

  protected allocBatch(capacity: number): void {
    const w = this.w, s = this.shape, dim = s.hiddenSize, emb = this.embedDim;
    this.bact = {
      x: w.alloc([capacity, dim]), h: w.alloc([capacity, dim]), h2: w.alloc([capacity, dim]),
      ff: w.alloc([capacity, s.intermediateSize]),
      emb: emb !== dim ? w.alloc([capacity, emb]) : null,
      logits: w.alloc([capacity, s.vocabSize]),
      posIds: new Int32Array(capacity),
    };
    this.batch!.bindResidual(this.bact.x, dim);
  }

  /** B sequences' next tokens as one block: every matmul has n = B rows; attention per row. */
  protected runBatch(ids: Int32Array, positions: Int32Array, B: number): void {
    const be = this.backend, a = this.bact!, r = this.batch!, s = this.shape, eps = s.normEps, seqs = this.batchSequences;
    const pre = this.config.do_layer_norm_before;
    this.embedTokens(a.x, a.emb, ids, B);
    for (let i = 0; i < B; i++) a.posIds[i] = positions[i] + OPT_POSITION_OFFSET;
    be.embedding(a.h, this.posTable, a.posIds.subarray(0, B));
    be.add(a.x, a.x, a.h, B);
    for (let l = 0; l < s.layers; l++) {
      const L = this.layers[l];
      r.layerInput(l, seqs, B);
      const src = this.preNorm(a.h, a.x, L.ln1w, L.ln1b, B);
      be.matmul(r.q, src, L.wq, B, L.bq);
      be.matmul(r.k, src, L.wk, B, L.bk);
      be.matmul(r.v, src, L.wv, B, L.bv);
      r.attend(l, seqs, positions, B);
      be.matmul(a.h2, r.att, L.wo, B, L.bo);
      be.add(a.x, a.x, a.h2, B);
      if (!pre) be.layerNorm(a.x, a.x, L.ln1w, L.ln1b, B, eps);
      this.feedForward(L, a.x, a.h, a.h2, a.ff, B);
    }
    let last = a.x;
    if (this.finalW) {
      be.layerNorm(a.h, a.x, this.finalW, this.finalB!, B, eps);
      last = a.h;
    }
    if (a.emb) {
      be.matmul(a.emb, last, this.projOut!, B);
      last = a.emb;
    }
    be.matmul(a.logits, last, this.lmHead, B);
  }

  // ---- loading --------------------------------------------------------------------------------

  private loadWeights(): void {
    const w = this.w, s = this.shape, c = this.config, dim = s.hiddenSize, ffn = s.intermediateSize, emb = this.embedDim;
    const d = "model.decoder.";
    this.embed = w.matrix(`${d}embed_tokens.weight`, [s.vocabSize, emb]);
    // Position rows are added to f32 activations through embedding(): any dtype works.
    this.posTable = w.matrix(`${d}embed_positions.weight`, [s.maxPositions + OPT_POSITION_OFFSET, dim]);
    if (emb !== dim) {
      this.projIn = w.matrix(`${d}project_in.weight`, [dim, emb]);
      this.projOut = w.matrix(`${d}project_out.weight`, [emb, dim]);
    }
    for (let l = 0; l < s.layers; l++) {
      const p = `${d}layers.${l}.`;
      const names = ["q_proj", "k_proj", "v_proj"].map((x) => `${p}self_attn.${x}`);
      const wqkv = w.fused(names.map((x) => `${x}.weight`), [dim, dim, dim], dim);
      const bqkv = w.fusedVector(names.map((x) => `${x}.bias`), [dim, dim, dim]);
      this.layers.push({
        ln1w: w.vector(`${p}self_attn_layer_norm.weight`, dim),
        ln1b: w.vector(`${p}self_attn_layer_norm.bias`, dim),
        wqkv, bqkv,
        wq: w.view(wqkv, 0, [dim, dim]), wk: w.view(wqkv, dim * dim, [dim, dim]), wv: w.view(wqkv, 2 * dim * dim, [dim, dim]),
        bq: w.view(bqkv, 0, [dim]), bk: w.view(bqkv, dim, [dim]), bv: w.view(bqkv, 2 * dim, [dim]),
        wo: w.matrix(`${p}self_attn.out_proj.weight`, [dim, dim]),
        bo: w.vector(`${p}self_attn.out_proj.bias`, dim),
        ln2w: w.vector(`${p}final_layer_norm.weight`, dim),
        ln2b: w.vector(`${p}final_layer_norm.bias`, dim),
        fc1: w.matrix(`${p}fc1.weight`, [ffn, dim]), b1: w.vector(`${p}fc1.bias`, ffn),
        fc2: w.matrix(`${p}fc2.weight`, [dim, ffn]), b2: w.vector(`${p}fc2.bias`, dim),
      });
    }
    if (optHasFinalNorm(c)) {
      this.finalW = w.vector(`${d}final_layer_norm.weight`, dim);
      this.finalB = w.vector(`${d}final_layer_norm.bias`, dim);
    }
    this.lmHead = s.tieEmbeddings ? this.embed : w.matrix("lm_head.weight", [s.vocabSize, emb]);
  }

  private allocActivations(): void {
    const w = this.w, s = this.shape, B = this.prefillBlock, dim = s.hiddenSize, hd = s.headDim, emb = this.embedDim;
    const k = w.alloc([B, dim]), v = w.alloc([B, dim]), qkv = w.alloc([1, 3 * dim]);
    const posIds = new Int32Array(B);
    this.act = {
      x: w.alloc([B, dim]), h: w.alloc([B, dim]), h2: w.alloc([B, dim]),
      emb: emb !== dim ? w.alloc([B, emb]) : null,
      q: w.alloc([B, dim]), k, v,
      kRows: w.view(k, 0, [B * s.heads, hd]), vRows: w.view(v, 0, [B * s.heads, hd]),
      qkv, qkvQ: w.view(qkv, 0, [1, dim]), qkvK: w.view(qkv, dim, [s.heads, hd]), qkvV: w.view(qkv, 2 * dim, [s.heads, hd]),
      att: w.alloc([B, dim]), ff: w.alloc([B, s.intermediateSize]),
      specH: w.alloc([1, dim]),
      last: w.alloc([1, dim]), lastEmb: emb !== dim ? w.alloc([1, emb]) : null,
      logits: w.alloc([1, s.vocabSize]),
      posIds,
      posOne: posIds.subarray(0, 1),
    };
  }

}
