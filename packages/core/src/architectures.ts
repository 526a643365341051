/**
 * The architecture registry: config.json's `architectures` (else `model_type`) picks a
 * family, which validates the config with its zod schema, lists the tensors a checkpoint
 * holds, and loads the model that runs it.
 *
 *   using files = openModelDir(dir);
 *   using model = loadModel(files, backend, { maxContext: 2048 });
 */
import { type Backend, type DType, fail } from "@hybridgen/spec";
import type { Attention, QueryProjector } from "./attention.js";
import type { BatchModel } from "./batch-decoder.js";
import { LlamaConfigSchema, resolveLlamaShape, type ArchitectureFamily, type LlamaConfigJson, type ModelShape } from "./config.js";
import { parseConfigWith } from "./config-parse.js";
import type { GenerativeModel } from "./generate.js";
import type { KvCache } from "./kv-cache.js";
import type { SequenceState } from "./batch-rows.js";
import { llamaBiases, llamaTensorSpecs } from "./llama-family.js";
import type { LlamaLoadOptions } from "./decoder-model.js";
import { LlamaModel } from "./llama.js";
import type { ModelFiles } from "./model-files.js";
import { OptModel } from "./opt.js";
import { parseOptConfig, optTensorSpecs, type OptConfigJson } from "./opt-config.js";
import { parseQwen2Config, qwen2TensorSpecs } from "./qwen2.js";
import type { TensorSpec } from "./tensor-spec.js";

/** A loaded causal language model of any family (batched decode: BatchDecoder, generateBatch). */
export interface CausalLM extends GenerativeModel, QueryProjector, BatchModel, Disposable {
  readonly backend: Backend;
  readonly shape: ModelShape;
  readonly maxContext: number;
  readonly prefillBlock: number;
  readonly weightDtype: DType;
  readonly cache: KvCache;
  readonly attention: Attention;
  readonly length: number;
  forward(ids: Int32Array, startPos: number): Float32Array;
  /** Greedy decode fed on the device (DecoderModel.pickToFeed / stepFed / fedToken). */
  readonly feedsOnDevice: boolean;
  pickToFeed(slot: number): void;
  stepFed(startPos: number): void;
  fedToken(slot: number): number;
  /** A setup run on every sequence made from now on (a decode attention per sequence of a batch). */
  setSequenceSetup(setup: ((s: SequenceState) => Disposable) | null): void;
  /** Bytes a sequence of `maxContext` positions takes (DecoderModel.sequenceBytes). */
  sequenceBytes(maxContext: number): { readonly window: number; readonly scores: number; readonly store: number; readonly scratch: number; readonly storeCapacity: number };
  close(): void;
}

export type ModelConfigJson = LlamaConfigJson | OptConfigJson;

/** Load options are the same for every family. */
export type ModelLoadOptions = LlamaLoadOptions;

export interface ModelFamily {
  readonly family: ArchitectureFamily;
  /** Hugging Face class names in config.json's `architectures`. */
  readonly architectures: readonly string[];
  readonly modelTypes: readonly string[];
  parse(json: unknown, src: string): { config: ModelConfigJson; shape: ModelShape };
  tensors(config: ModelConfigJson, shape: ModelShape): TensorSpec[];
  load(files: ModelFiles, backend: Backend, options?: ModelLoadOptions): CausalLM;
}

export const MODEL_FAMILIES: readonly ModelFamily[] = [
  {
    family: "llama",
    architectures: ["LlamaForCausalLM"],
    modelTypes: ["llama"],
    parse: (json, src) => {
      const config = parseConfigWith(LlamaConfigSchema, json, src);
      return { config, shape: resolveLlamaShape(config, "llama") };
    },
    tensors: (config, shape) => llamaTensorSpecs(shape, llamaBiases(config as LlamaConfigJson)),
    load: (files, backend, options) => LlamaModel.load(files, backend, options),
  },
  {
    family: "qwen2",
    architectures: ["Qwen2ForCausalLM"],
    modelTypes: ["qwen2"],
    parse: parseQwen2Config,
    tensors: (_config, shape) => qwen2TensorSpecs(shape),
    load: (files, backend, options) => LlamaModel.load(files, backend, options),
  },
  {
    family: "opt",
    architectures: ["OPTForCausalLM"],
    modelTypes: ["opt"],
    parse: parseOptConfig,
    tensors: (config) => optTensorSpecs(config as OptConfigJson),
    load: (files, backend, options) => OptModel.load(files, backend, options),
  },
];

export const SUPPORTED_ARCHITECTURES: readonly string[] = MODEL_FAMILIES.flatMap((f) => f.architectures);

/** The family of a raw config.json: by `architectures[0]`, else by `model_type`. */
export function familyOf(json: unknown, src = "config.json"): ModelFamily {
  if (json === null || typeof json !== "object" || Array.isArray(json)) fail(`${src}: not a JSON object`);
  const { architectures, model_type } = json as { architectures?: unknown; model_type?: unknown };
  const supported = SUPPORTED_ARCHITECTURES.join(", ");
  if (Array.isArray(architectures) && architectures.length > 0) {
    const name = architectures[0];
    const f = MODEL_FAMILIES.find((x) => x.architectures.includes(name as string));
    if (!f) fail(`${src}: unsupported architecture ${JSON.stringify(name)} (supported: ${supported})`);
    return f;
  }
  if (typeof model_type === "string") {
    const f = MODEL_FAMILIES.find((x) => x.modelTypes.includes(model_type));
    if (!f) fail(`${src}: unsupported model_type ${JSON.stringify(model_type)} (supported: ${supported})`);
    return f;
  }
  fail(`${src}: no architectures or model_type to choose the architecture from (supported: ${supported})`);
}

/** Validate a raw config.json with its family's schema. */
export function describeModel(json: unknown, src = "config.json"): { family: ModelFamily; config: ModelConfigJson; shape: ModelShape } {
  const family = familyOf(json, src);
  const { config, shape } = family.parse(json, src);
  if (!Number.isInteger(shape.headDim)) fail(`${src}: hidden_size ${shape.hiddenSize} is not a multiple of num_attention_heads ${shape.heads}`);
  return { family, config, shape };
}

export function familyByName(family: ArchitectureFamily): ModelFamily {
  return MODEL_FAMILIES.find((f) => f.family === family) ?? fail(`unknown architecture family ${family}`);
}

/** The tensors a checkpoint of this config holds. */
export function tensorSpecsOf(config: ModelConfigJson, shape: ModelShape): TensorSpec[] {
  return familyByName(shape.architecture).tensors(config, shape);
}

/** Load the model of `files` (its family from files.shape.architecture) onto `backend`. */
export function loadModel(files: ModelFiles, backend: Backend, options: ModelLoadOptions = {}): CausalLM {
  return familyByName(files.shape.architecture).load(files, backend, options);
}
