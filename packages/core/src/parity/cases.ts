/**
 * The parity cases: small random-weight checkpoints (weights from a seed through the
 * deterministic fill, f32) covering what differs between the families. make-checkpoints.ts
 * writes them for make_refs.py (Hugging Face transformers), parity.test.ts rebuilds them in
 * memory and compares the engine with the committed references.
 */
import { describeModel, tensorSpecsOf, type ModelConfigJson } from "../architectures.js";
import type { ModelShape } from "../config.js";
import { DummyWeightSource } from "../dummy-weights.js";
import type { TensorSpec } from "../tensor-spec.js";

export const PROMPT_TOKENS = 64;
export const DECODE_STEPS = 16;

export interface ParityCase {
  readonly name: string;
  readonly seed: number;
  readonly covers: string;
  readonly config: Record<string, unknown>;
}

export const PARITY_CASES: readonly ParityCase[] = [
  {
    name: "llama-gqa",
    seed: 11,
    covers: "GQA 8 heads / 2 KV heads, untied lm_head",
    config: {
      architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 128, intermediate_size: 256, num_hidden_layers: 2,
      num_attention_heads: 8, num_key_value_heads: 2, vocab_size: 128, max_position_embeddings: 256, rms_norm_eps: 1e-5,
      rope_theta: 10000, tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2,
    },
  },
  {
    name: "llama3-scaled-bias-tied",
    seed: 12,
    covers: "Llama-3 rope scaling, attention_bias + mlp_bias, head_dim != hidden/heads, MQA, tied",
    config: {
      architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 64, intermediate_size: 160, num_hidden_layers: 3,
      num_attention_heads: 4, num_key_value_heads: 1, head_dim: 32, vocab_size: 128, max_position_embeddings: 256, rms_norm_eps: 1e-5,
      rope_theta: 500000, rope_scaling: { rope_type: "llama3", factor: 8, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 64 },
      attention_bias: true, mlp_bias: true, tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2,
    },
  },
  {
    name: "llama-linear-rope",
    seed: 13,
    covers: "linear rope scaling, 6 heads / 3 KV heads",
    config: {
      architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 96, intermediate_size: 192, num_hidden_layers: 2,
      num_attention_heads: 6, num_key_value_heads: 3, vocab_size: 128, max_position_embeddings: 256, rms_norm_eps: 1e-6,
      rope_theta: 10000, rope_scaling: { rope_type: "linear", factor: 2 }, tie_word_embeddings: false,
    },
  },
  {
    name: "qwen2-tied",
    seed: 21,
    covers: "q/k/v biases, GQA, tied embeddings, sliding window present but off",
    config: {
      architectures: ["Qwen2ForCausalLM"], model_type: "qwen2", hidden_size: 128, intermediate_size: 256, num_hidden_layers: 2,
      num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 128, max_position_embeddings: 256, rms_norm_eps: 1e-6,
      rope_theta: 1000000, tie_word_embeddings: true, use_sliding_window: false, sliding_window: 4096, max_window_layers: 2,
      bos_token_id: 0, eos_token_id: 1,
    },
  },
  {
    name: "qwen2-untied",
    seed: 22,
    covers: "q/k/v biases, 8 heads / 4 KV heads of dim 8, untied",
    config: {
      architectures: ["Qwen2ForCausalLM"], model_type: "qwen2", hidden_size: 64, intermediate_size: 192, num_hidden_layers: 3,
      num_attention_heads: 8, num_key_value_heads: 4, vocab_size: 128, max_position_embeddings: 256, rms_norm_eps: 1e-6,
      rope_theta: 1000000, tie_word_embeddings: false, use_sliding_window: false,
    },
  },
  {
    name: "opt-prenorm",
    seed: 31,
    covers: "OPT pre-LayerNorm (do_layer_norm_before true), final LayerNorm, tied",
    config: {
      architectures: ["OPTForCausalLM"], model_type: "opt", hidden_size: 128, ffn_dim: 256, num_hidden_layers: 2,
      num_attention_heads: 4, vocab_size: 128, max_position_embeddings: 128, do_layer_norm_before: true,
      word_embed_proj_dim: 128, activation_function: "relu", bos_token_id: 2, eos_token_id: 2, pad_token_id: 1,
    },
  },
  {
    name: "opt-350m-style",
    seed: 32,
    covers: "OPT post-LayerNorm (do_layer_norm_before false, no final LayerNorm), word_embed_proj_dim 64 != hidden 128 (project_in/out)",
    config: {
      architectures: ["OPTForCausalLM"], model_type: "opt", hidden_size: 128, ffn_dim: 384, num_hidden_layers: 3,
      num_attention_heads: 4, vocab_size: 128, max_position_embeddings: 128, do_layer_norm_before: false,
      word_embed_proj_dim: 64, activation_function: "relu", bos_token_id: 2, eos_token_id: 2, pad_token_id: 1,
    },
  },
  {
    name: "opt-untied-gelu",
    seed: 33,
    covers: "OPT with an untied lm_head and GELU",
    config: {
      architectures: ["OPTForCausalLM"], model_type: "opt", hidden_size: 64, ffn_dim: 128, num_hidden_layers: 2,
      num_attention_heads: 2, vocab_size: 128, max_position_embeddings: 128, do_layer_norm_before: true,
      activation_function: "gelu", tie_word_embeddings: false,
    },
  },
];

/** The case's prompt: PROMPT_TOKENS ids from its seed (xorshift32). */
export function promptIds(c: ParityCase): number[] {
  const vocab = c.config.vocab_size as number;
  let x = (c.seed * 2654435761) >>> 0 || 1;
  const ids: number[] = [];
  for (let i = 0; i < PROMPT_TOKENS; i++) {
    x ^= x << 13; x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5; x >>>= 0;
    ids.push(x % vocab);
  }
  return ids;
}

/** The checkpoint of a case: parsed config, shape, tensor list and the (lazy) weights. */
export function parityCheckpoint(c: ParityCase): { config: ModelConfigJson; shape: ModelShape; specs: TensorSpec[]; weights: DummyWeightSource } {
  const { config, shape } = describeModel(c.config, `${c.name}/config.json`);
  const specs = tensorSpecsOf(config, shape);
  return { config, shape, specs, weights: new DummyWeightSource(specs, { seed: c.seed, dtype: "f32" }) };
}
