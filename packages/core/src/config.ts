import { z } from "zod";

/**
 * The subset of a Hugging Face `config.json` the Llama architecture reads. Unknown keys
 * pass through (real configs carry many). transformers 5 writes `rope_parameters`
 * instead of a top-level `rope_theta`; both are accepted.
 */
/**
 * Upper bounds of config.json's sizes, well above any released model's: a larger value is a
 * corrupt file, and would size loops and allocations before any weight is read.
 */
export const CONFIG_SIZE_LIMITS = {
  hidden: 1 << 17,
  intermediate: 1 << 20,
  layers: 1024,
  heads: 1024,
  headDim: 4096,
  vocab: 1 << 24,
  positions: 1 << 24,
} as const;

/** A positive integer size of config.json, at most `max`. */
export const configSize = (max: number) => z.number().int().positive().max(max, `must be at most ${max}`);

export const RopeScalingSchema = z
  .object({
    rope_type: z.string().optional(),
    type: z.string().optional(),
    factor: z.number().positive().optional(),
    rope_theta: z.number().positive().optional(),
    low_freq_factor: z.number().optional(),
    high_freq_factor: z.number().optional(),
    original_max_position_embeddings: configSize(CONFIG_SIZE_LIMITS.positions).optional(),
  })
  .passthrough();

export const LlamaConfigSchema = z
  .object({
    architectures: z.array(z.string()).optional(),
    model_type: z.literal("llama").or(z.string()).optional(),
    hidden_size: configSize(CONFIG_SIZE_LIMITS.hidden),
    intermediate_size: configSize(CONFIG_SIZE_LIMITS.intermediate),
    num_hidden_layers: configSize(CONFIG_SIZE_LIMITS.layers),
    num_attention_heads: configSize(CONFIG_SIZE_LIMITS.heads),
    num_key_value_heads: configSize(CONFIG_SIZE_LIMITS.heads).optional(),
    head_dim: configSize(CONFIG_SIZE_LIMITS.headDim).optional(),
    vocab_size: configSize(CONFIG_SIZE_LIMITS.vocab),
    max_position_embeddings: configSize(CONFIG_SIZE_LIMITS.positions),
    rms_norm_eps: z.number().positive().default(1e-6),
    rope_theta: z.number().positive().optional(),
    rope_parameters: RopeScalingSchema.nullable().optional(),
    rope_scaling: RopeScalingSchema.nullable().optional(),
    tie_word_embeddings: z.boolean().default(false),
    attention_bias: z.boolean().default(false),
    mlp_bias: z.boolean().default(false),
    bos_token_id: z.number().int().nullable().optional(),
    eos_token_id: z.union([z.number().int(), z.array(z.number().int())]).nullable().optional(),
    torch_dtype: z.string().optional(),
    dtype: z.string().optional(),
  })
  .passthrough()
  .refine((c) => c.num_attention_heads % (c.num_key_value_heads ?? c.num_attention_heads) === 0, {
    message: "num_attention_heads must be a multiple of num_key_value_heads",
    path: ["num_key_value_heads"],
  });

export type LlamaConfigJson = z.infer<typeof LlamaConfigSchema>;

/** The model families the engine implements (see architectures.ts). */
export type ArchitectureFamily = "llama" | "qwen2" | "opt";

/** The resolved numbers the engine runs with. */
export interface ModelShape {
  readonly architecture: ArchitectureFamily;
  readonly hiddenSize: number;
  readonly intermediateSize: number;
  readonly layers: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly vocabSize: number;
  readonly maxPositions: number;
  readonly normEps: number;
  /** 0 for architectures without rotary embeddings (OPT). */
  readonly ropeTheta: number;
  readonly tieEmbeddings: boolean;
  readonly bosTokenId: number | null;
  readonly eosTokenIds: readonly number[];
}

export function resolveLlamaShape(c: LlamaConfigJson, architecture: ArchitectureFamily = "llama"): ModelShape {
  const heads = c.num_attention_heads;
  const eos = c.eos_token_id;
  return {
    architecture,
    hiddenSize: c.hidden_size,
    intermediateSize: c.intermediate_size,
    layers: c.num_hidden_layers,
    heads,
    kvHeads: c.num_key_value_heads ?? heads,
    headDim: c.head_dim ?? c.hidden_size / heads,
    vocabSize: c.vocab_size,
    maxPositions: c.max_position_embeddings,
    normEps: c.rms_norm_eps,
    ropeTheta: c.rope_theta ?? c.rope_parameters?.rope_theta ?? 10000,
    tieEmbeddings: c.tie_word_embeddings,
    bosTokenId: c.bos_token_id ?? null,
    eosTokenIds: eos == null ? [] : Array.isArray(eos) ? eos : [eos],
  };
}
