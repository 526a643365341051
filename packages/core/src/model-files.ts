import type { DType } from "@hybridgen/spec";
import type { LlamaConfigJson, ModelShape } from "./config.js";
import type { ChatRenderer } from "./chat-template.js";
import type { OptConfigJson } from "./opt-config.js";
import type { Tokenizer } from "./tokenizer.js";

/** One stored tensor: raw little-endian bytes (usually a view into an mmap). */
export interface WeightView {
  readonly dtype: DType;
  readonly shape: readonly number[];
  readonly bytes: Uint8Array;
}

/** Named tensors of a checkpoint (HF names, e.g. `model.layers.0.self_attn.q_proj.weight`). */
export interface WeightSource {
  get(name: string): WeightView | undefined;
  names(): string[];
}

/** A model directory opened for loading: config, weights (mapped, not copied), tokenizer. */
export interface ModelFiles {
  readonly dir: string;
  /** The parsed config.json of the model's family (shape.architecture tells which). */
  readonly config: LlamaConfigJson | OptConfigJson;
  readonly shape: ModelShape;
  readonly weights: WeightSource;
  readonly tokenizer: Tokenizer;
  /** The chat template of tokenizer_config.json / chat_template.jinja, when the model has one. */
  readonly chatTemplate?: ChatRenderer | null;
  /** Unmaps the weight files; tensors loaded in place from them must be freed first. */
  close(): void;
  [Symbol.dispose](): void;
}
