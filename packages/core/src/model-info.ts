/**
 * What `hybridgen inspect` reports: architecture, parameter count, weight bytes by dtype,
 * KV bytes per token, and the KV cache a context and batch need — the numbers for
 * deciding where the cache goes.
 */
import { DTYPE_BYTES, type DType, kvBytesPerToken } from "@hybridgen/spec";
import { tensorSpecsOf, type ModelConfigJson } from "./architectures.js";
import type { ModelShape } from "./config.js";
import type { WeightSource } from "./model-files.js";
import { optEmbedDim, type OptConfigJson } from "./opt-config.js";
import { elementCount } from "./tensor-spec.js";

export interface ModelInfo {
  /** config.json's architectures[0] (or the family when absent). */
  readonly architecture: string;
  readonly family: ModelShape["architecture"];
  readonly layers: number;
  readonly hiddenSize: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly vocabSize: number;
  readonly maxPositions: number;
  readonly tiedEmbeddings: boolean;
  /** Parameters the engine loads (tied embeddings counted once). */
  readonly parameters: number;
  /** Bytes of those parameters as stored, by stored dtype. */
  readonly weightBytes: Readonly<Partial<Record<DType, number>>>;
  /** K + V bytes one token adds over all layers, per KV storage dtype (kvCacheBytes(shape, …)
   * of @hybridgen/spec's contracts/memory.ts gives a whole context). */
  readonly kvBytesPerToken: Readonly<Record<DType, number>>;
  /** Device bytes one row of the batched decode step takes (reserveBatch: BatchRows' q, k, v, att and the family's f32 activations, logits included). */
  readonly batchRowBytes: number;
}

/** reserveBatch's device bytes a row: BatchRows' q/k/v/att (and Llama's batched queries) and the architecture's batch activations (LlamaModel's and OptModel's allocBatch), all f32. */
export function batchRowBytes(config: ModelConfigJson, shape: ModelShape): number {
  const dim = shape.hiddenSize, inter = shape.intermediateSize, qw = shape.heads * shape.headDim, kvw = shape.kvHeads * shape.headDim;
  const rows = 2 * qw + 2 * kvw;
  if (shape.architecture === "opt") {
    const emb = optEmbedDim(config as OptConfigJson);
    return 4 * (rows + 3 * dim + inter + (emb !== dim ? emb : 0) + shape.vocabSize); // x h h2, ff, the projection's rows, logits
  }
  return 4 * (rows + 2 * qw + 4 * dim + 2 * inter + shape.vocabSize); // BatchRows' two batched-query buffers; x h h2 and the queries' normed rows, gate up, logits
}

/**
 * Numbers of a model from its config; weight bytes from the stored dtypes of `weights`
 * when given, else from `assumeDtype` (what dummy weights or the config's torch_dtype say).
 */
export function modelInfo(config: ModelConfigJson, shape: ModelShape, weights?: WeightSource, assumeDtype: DType = "bf16"): ModelInfo {
  const specs = tensorSpecsOf(config, shape);
  const weightBytes: Partial<Record<DType, number>> = {};
  let parameters = 0;
  for (const s of specs) {
    const n = elementCount(s);
    parameters += n;
    const dtype = weights?.get(s.name)?.dtype ?? assumeDtype;
    weightBytes[dtype] = (weightBytes[dtype] ?? 0) + n * DTYPE_BYTES[dtype];
  }
  return {
    architecture: config.architectures?.[0] ?? shape.architecture,
    family: shape.architecture,
    layers: shape.layers,
    hiddenSize: shape.hiddenSize,
    heads: shape.heads,
    kvHeads: shape.kvHeads,
    headDim: shape.headDim,
    vocabSize: shape.vocabSize,
    maxPositions: shape.maxPositions,
    tiedEmbeddings: shape.tieEmbeddings,
    parameters,
    weightBytes,
    kvBytesPerToken: { f32: kvBytesPerToken(shape, "f32").total, f16: kvBytesPerToken(shape, "f16").total, bf16: kvBytesPerToken(shape, "bf16").total },
    batchRowBytes: batchRowBytes(config, shape),
  };
}

/** The dtype a config says its weights are stored in (torch_dtype / dtype), if one the engine reads. */
export function configDtype(config: ModelConfigJson): DType | null {
  const t = (config as { torch_dtype?: string; dtype?: string }).torch_dtype ?? (config as { dtype?: string }).dtype;
  return t === "float32" ? "f32" : t === "float16" ? "f16" : t === "bfloat16" ? "bf16" : null;
}
