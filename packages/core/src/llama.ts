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
 * is preallocated: a decode step allocates nothing in JS. Load options, the KV cache and
 * the step loop are DecoderModel's (decoder-model.ts). A batched decode step (runBatch) runs
 * B sequences' tokens as B rows through the prefill-style ops (q, k, v apart, so RoPE sees
 * contiguous rows), each row attending over its own sequence's cache (batch-rows.ts).
 */
import { type Backend, type MatvecFusion, type Tensor, check, fail } from "@hybridgen/spec";
import type { LlamaConfigJson, ModelShape } from "./config.js";
import { DecoderModel, contextLength, parseLoadOptions, type LlamaLoadOptions } from "./decoder-model.js";
import type { ModelFiles } from "./model-files.js";
import { requireTensor } from "./weight-loader.js";

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

/** Decode-step fusions per layer, when the backend has matvec (see runFusedLayer). */
interface LayerFusions {
  qkv: MatvecFusion; // rmsNorm(x) · Wqkvᵀ
  o: MatvecFusion; // x += att · Woᵀ
  gu: MatvecFusion; // silu(g)·u of rmsNorm(x) · Wguᵀ
  down: MatvecFusion; // x += (silu(g)·u) · Wdownᵀ
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

/** Batched decode activations, [capacity, …] (q, k, v and att are BatchRows'). */
interface BatchActivations {
  /** [capacity, hidden]: the normed rows of the batch's query projections (BatchRows.bindQueries). */
  qh: Tensor;
  x: Tensor; h: Tensor; h2: Tensor;
  gate: Tensor; up: Tensor;
  logits: Tensor; // [capacity, vocab]
  /** Backend.matmulSplit's output lists, made once: [q, k, v], [gate, up], [x]. */
  split: { qkv: readonly Tensor[]; gu: readonly Tensor[]; x: readonly Tensor[] };
}

export class LlamaModel extends DecoderModel {
  private readonly layers: LayerWeights[] = [];
  private embed!: Tensor;
  private finalNorm!: Tensor;
  private lmHead!: Tensor;
  private cos!: Tensor;
  private sin!: Tensor;
  private act!: Activations;
  private bact: BatchActivations | null = null;
  /** Decode steps run 4 fused matvecs a layer when the backend has matvec (checked per step). */
  private fusions: LayerFusions[] = [];
  private headFusion!: MatvecFusion;
  private readonly specPos = new Int32Array(1);
  /** The running batched step's positions (projectQueries' RoPE). */
  private batchPositions: Int32Array = new Int32Array(0);

  /** Load weights from `files` onto `backend`. `files` must stay open until close(). */
  static load(files: ModelFiles, backend: Backend, options: LlamaLoadOptions = {}): LlamaModel {
    const opts = parseLoadOptions(options);
    const shape = files.shape;
    // Qwen2 is Llama with q/k/v biases (see qwen2.ts); OPT has its own model (opt.ts).
    check(shape.architecture === "llama" || shape.architecture === "qwen2", `LlamaModel cannot run the ${shape.architecture} architecture (use loadModel)`);
    check(shape.heads % shape.kvHeads === 0, `${shape.heads} attention heads is not a multiple of ${shape.kvHeads} KV heads`);
    check(shape.headDim % 2 === 0, `head_dim ${shape.headDim} must be even for rotary embeddings`);
    const maxContext = contextLength(opts, shape);
    const embedView = requireTensor(files.weights, "model.embed_tokens.weight", [shape.vocabSize, shape.hiddenSize]);
    const model = new LlamaModel(backend, shape, files.weights, opts, maxContext, opts.weightDtype ?? embedView.dtype);
    return model.loadOrClose(() => {
      model.loadWeights(files.config as LlamaConfigJson);
      model.allocActivations();
      model.prepareFusions();
    });
  }

  protected get logits(): Tensor {
    return this.act.logits;
  }

  // ---- the forward pass ---------------------------------------------------------------------

  protected runBlock(ids: Int32Array, pos0: number, n: number): void {
    const be = this.backend, a = this.act, s = this.shape, eps = s.normEps;
    const decode = n === 1;
    for (let i = 0; i < n; i++) a.positions[i] = pos0 + i;
    const attn = this.attention;
    attn.beginBlock(n);
    this.embedIds(a.x, this.embed, ids);
    const fused = decode && be.matvec ? this.fusions : null;
    for (let l = 0; l < s.layers; l++) {
      const w = this.layers[l];
      attn.layerInput(l, a.x);
      if (fused) {
        this.runFusedLayer(l, fused[l]);
        continue;
      }
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
    if (fused) {
      be.matvec!(a.logits, a.x, this.lmHead, this.headFusion);
    } else {
      if (n > 1) be.copyRows(a.last, 0, a.x, n - 1, 1);
      be.rmsNorm(a.last, n > 1 ? a.last : a.x, this.finalNorm, 1, eps);
      be.matmul(a.logits, a.last, this.lmHead, 1);
    }
    attn.endBlock();
  }

  protected get batchLogits(): Tensor {
    return this.bact?.logits ?? fail("batched decode: no batch buffers (reserveBatch first)");
  }

  protected allocBatch(capacity: number): void {
    const w = this.w, s = this.shape, dim = s.hiddenSize, inter = s.intermediateSize, r = this.batch!;
    const x = w.alloc([capacity, dim]), gate = w.alloc([capacity, inter]), up = w.alloc([capacity, inter]);
    this.bact = {
      x, qh: w.alloc([capacity, dim]), h: w.alloc([capacity, dim]), h2: w.alloc([capacity, dim]),
      gate, up,
      logits: w.alloc([capacity, s.vocabSize]),
      split: { qkv: [r.q, r.k, r.v], gu: [gate, up], x: [x] },
    };
    r.bindResidual(x, dim);
    r.bindQueries((layer, B, out) => this.projectQueries(layer, B, out));
  }

  /** Layer's queries of the batch's first B residual rows, each at its row's position: computeQuery for all rows in one matmul. */
  private projectQueries(layer: number, B: number, out: Tensor): void {
    const be = this.backend, s = this.shape, w = this.layers[layer], a = this.bact!;
    be.rmsNorm(a.qh, a.x, w.attnNorm, B, s.normEps);
    be.matmul(out, a.qh, w.wq, B, w.bq ?? undefined);
    be.rope(out, B, this.batchPositions, s.heads, s.headDim, this.cos, this.sin);
  }

  /** B sequences' next tokens as one block: every matmul has n = B rows; attention per row. */
  protected runBatch(ids: Int32Array, positions: Int32Array, B: number): void {
    const be = this.backend, a = this.bact!, r = this.batch!, s = this.shape, eps = s.normEps, seqs = this.batchSequences;
    // Backend.matmulSplit, where the backend takes it: q/k/v and gate/up as one matmul each over
    // the fused weights, the residual adds in o's and down's epilogues (4 launches a layer, not 9).
    const split = be.matmulSplit ? a.split : null;
    r.setPositions(positions, B);
    this.batchPositions = positions;
    be.embedding(a.x, this.embed, ids);
    for (let l = 0; l < s.layers; l++) {
      const w = this.layers[l];
      r.layerInput(l, seqs, B);
      be.rmsNorm(a.h, a.x, w.attnNorm, B, eps);
      if (!split || !be.matmulSplit!(split.qkv, a.h, w.wqkv, B, w.bqkv ?? undefined, false)) {
        be.matmul(r.q, a.h, w.wq, B, w.bq ?? undefined);
        be.matmul(r.k, a.h, w.wk, B, w.bk ?? undefined);
        be.matmul(r.v, a.h, w.wv, B, w.bv ?? undefined);
      }
      r.ropeQK(be, this.cos, this.sin);
      r.attend(l, seqs, positions, B);
      if (!split || !be.matmulSplit!(split.x, r.att, w.wo, B, w.bo ?? undefined, true)) {
        be.matmul(a.h2, r.att, w.wo, B, w.bo ?? undefined);
        be.add(a.x, a.x, a.h2, B);
      }

      be.rmsNorm(a.h, a.x, w.mlpNorm, B, eps);
      if (!split || !be.matmulSplit!(split.gu, a.h, w.wgu, B, w.bgu ?? undefined, false)) {
        be.matmul(a.gate, a.h, w.wg, B, w.bg ?? undefined);
        be.matmul(a.up, a.h, w.wu, B, w.bu ?? undefined);
      }
      be.siluMul(a.gate, a.gate, a.up, B);
      if (!split || !be.matmulSplit!(split.x, a.gate, w.wdown, B, w.bdown ?? undefined, true)) {
        be.matmul(a.h2, a.gate, w.wdown, B, w.bdown ?? undefined);
        be.add(a.x, a.x, a.h2, B);
      }
    }
    be.rmsNorm(a.h, a.x, this.finalNorm, B, eps);
    be.matmul(a.logits, a.h, this.lmHead, B);
  }

  /** A decode step's layer through the backend's fused matvec: 4 matvecs, RoPE, attention. */
  private runFusedLayer(l: number, f: LayerFusions): void {
    const be = this.backend, a = this.act, s = this.shape, w = this.layers[l];
    be.matvec!(a.qkv, a.x, w.wqkv, f.qkv);
    be.rope(a.qkvQK, 1, a.positions, s.heads + s.kvHeads, s.headDim, this.cos, this.sin);
    this.attention.attend(l, a.qkvQ, a.qkvK, a.qkvV, a.att);
    be.matvec!(a.x, a.att, w.wo, f.o);
    be.matvec!(a.guG, a.x, w.wgu, f.gu);
    be.matvec!(a.x, a.guG, w.wdown, f.down);
  }

  private prepareFusions(): void {
    const eps = this.shape.normEps;
    this.fusions = this.layers.map((w) => ({
      qkv: { bias: w.bqkv ?? undefined, normWeight: w.attnNorm, normEps: eps },
      o: { bias: w.bo ?? undefined, accumulate: true },
      gu: { bias: w.bgu ?? undefined, normWeight: w.mlpNorm, normEps: eps, siluMul: true },
      down: { bias: w.bdown ?? undefined, accumulate: true },
    }));
    this.headFusion = { normWeight: this.finalNorm, normEps: eps };
  }

  /** q of `layer` from residual row x: RoPE(W_q · rmsNorm(x)) at `pos`. */
  protected computeQuery(layer: number, x: Tensor, pos: number, out: Tensor): void {
    const be = this.backend, s = this.shape, w = this.layers[layer], a = this.act;
    if (be.matvec) {
      // The decode step's fused norm + GEMV, as the layer's own q·kv projection runs (one kernel, not two).
      be.matvec(out, x, w.wq, { normWeight: w.attnNorm, normEps: s.normEps, bias: w.bq ?? undefined });
    } else {
      be.rmsNorm(a.specH, x, w.attnNorm, 1, s.normEps);
      be.matmul(out, a.specH, w.wq, 1, w.bq ?? undefined);
    }
    this.specPos[0] = pos;
    be.rope(out, 1, this.specPos, s.heads, s.headDim, this.cos, this.sin);
  }

  // ---- loading --------------------------------------------------------------------------------

  private loadWeights(config: LlamaConfigJson): void {
    const w = this.w, s = this.shape, hd = s.headDim, dim = s.hiddenSize, inter = s.intermediateSize;
    const qRows = s.heads * hd, kvRows = s.kvHeads * hd;
    // attention_bias puts biases on q, k, v and o; Qwen2 always has them on q, k, v only.
    const qwen2 = s.architecture === "qwen2";
    const qkvBias = qwen2 || config.attention_bias === true, oBias = !qwen2 && config.attention_bias === true;
    const mlpBias = config.mlp_bias === true;

    this.embed = w.matrix("model.embed_tokens.weight", [s.vocabSize, dim]);
    for (let l = 0; l < s.layers; l++) {
      const p = `model.layers.${l}.`;
      const wqkv = w.fused([`${p}self_attn.q_proj.weight`, `${p}self_attn.k_proj.weight`, `${p}self_attn.v_proj.weight`], [qRows, kvRows, kvRows], dim);
      const bqkv = qkvBias ? w.fusedVector([`${p}self_attn.q_proj.bias`, `${p}self_attn.k_proj.bias`, `${p}self_attn.v_proj.bias`], [qRows, kvRows, kvRows]) : null;
      const wgu = w.fused([`${p}mlp.gate_proj.weight`, `${p}mlp.up_proj.weight`], [inter, inter], dim);
      const bgu = mlpBias ? w.fusedVector([`${p}mlp.gate_proj.bias`, `${p}mlp.up_proj.bias`], [inter, inter]) : null;
      this.layers.push({
        attnNorm: w.vector(`${p}input_layernorm.weight`, dim),
        wqkv, bqkv,
        wq: w.view(wqkv, 0, [qRows, dim]),
        wk: w.view(wqkv, qRows * dim, [kvRows, dim]),
        wv: w.view(wqkv, (qRows + kvRows) * dim, [kvRows, dim]),
        bq: bqkv && w.view(bqkv, 0, [qRows]),
        bk: bqkv && w.view(bqkv, qRows, [kvRows]),
        bv: bqkv && w.view(bqkv, qRows + kvRows, [kvRows]),
        wo: w.matrix(`${p}self_attn.o_proj.weight`, [dim, qRows]),
        bo: oBias ? w.vector(`${p}self_attn.o_proj.bias`, dim) : null,
        mlpNorm: w.vector(`${p}post_attention_layernorm.weight`, dim),
        wgu, bgu,
        wg: w.view(wgu, 0, [inter, dim]),
        wu: w.view(wgu, inter * dim, [inter, dim]),
        bg: bgu && w.view(bgu, 0, [inter]),
        bu: bgu && w.view(bgu, inter, [inter]),
        wdown: w.matrix(`${p}mlp.down_proj.weight`, [dim, inter]),
        bdown: mlpBias ? w.vector(`${p}mlp.down_proj.bias`, dim) : null,
      });
    }
    this.finalNorm = w.vector("model.norm.weight", dim);
    this.lmHead = s.tieEmbeddings ? this.embed : w.matrix("lm_head.weight", [s.vocabSize, dim]);
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
    this.cos = this.w.alloc([this.maxContext, half]);
    this.sin = this.w.alloc([this.maxContext, half]);
    this.backend.write(this.cos, cos);
    this.backend.write(this.sin, sin);
  }

  /** Device bytes allocActivations takes for `shape` at `prefillBlock` rows (what a planner reserves beside the KV window). */
  static activationBytes(shape: Pick<ModelShape, "hiddenSize" | "intermediateSize" | "heads" | "kvHeads" | "headDim" | "vocabSize">, prefillBlock: number): number {
    const dim = shape.hiddenSize, inter = shape.intermediateSize, qw = shape.heads * shape.headDim, kvw = shape.kvHeads * shape.headDim;
    const perRow = 3 * dim + 2 * qw + 2 * kvw + 2 * inter; // x h h2, q att, k v, gate up
    return 4 * (prefillBlock * perRow + (qw + 2 * kvw) + 2 * inter + 2 * dim + shape.vocabSize);
  }

  private allocActivations(): void {
    const w = this.w, s = this.shape, B = this.prefillBlock, dim = s.hiddenSize, hd = s.headDim, inter = s.intermediateSize;
    const qw = s.heads * hd, kvw = s.kvHeads * hd;
    const k = w.alloc([B, kvw]), v = w.alloc([B, kvw]);
    const qkv = w.alloc([1, qw + 2 * kvw]);
    const gu = w.alloc([1, 2 * inter]);
    this.act = {
      x: w.alloc([B, dim]), h: w.alloc([B, dim]), h2: w.alloc([B, dim]),
      q: w.alloc([B, qw]), k, v,
      kRows: w.view(k, 0, [B * s.kvHeads, hd]), vRows: w.view(v, 0, [B * s.kvHeads, hd]),
      qkv,
      qkvQ: w.view(qkv, 0, [1, qw]),
      qkvQK: w.view(qkv, 0, [1, qw + kvw]),
      qkvK: w.view(qkv, qw, [s.kvHeads, hd]),
      qkvV: w.view(qkv, qw + kvw, [s.kvHeads, hd]),
      att: w.alloc([B, qw]),
      gate: w.alloc([B, inter]), up: w.alloc([B, inter]),
      gu, guG: w.view(gu, 0, [1, inter]), guU: w.view(gu, inter, [1, inter]),
      specH: w.alloc([1, dim]),
      last: w.alloc([1, dim]),
      logits: w.alloc([1, s.vocabSize]),
      positions: new Int32Array(B),
    };
  }
}
