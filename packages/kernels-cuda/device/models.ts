/** Dummy-weight models for the device checks: presets and small shapes, any weight dtype. */
import { ByteTokenizer, DummyWeightSource, describeModel, presetConfig, tensorSpecsOf, type DType, type ModelFiles, type RandomFill } from "@hybridgen/core";

/** stories15M's shape (llama2.c's 15M-parameter TinyStories model) as a Llama config. */
export const STORIES15M_SHAPE = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 288, intermediate_size: 768, num_hidden_layers: 6,
  num_attention_heads: 6, num_key_value_heads: 6, vocab_size: 32000, max_position_embeddings: 256, rms_norm_eps: 1e-5,
  rope_theta: 10000, tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2,
};

/** A preset's architecture at a smaller size (same family options: biases, tying, norms). */
export function shrunkPreset(name: string, overrides: Record<string, unknown>): Record<string, unknown> {
  return { ...presetConfig(name), ...overrides };
}

export function dummyFiles(json: Record<string, unknown>, dtype: DType, seed: number, fill?: RandomFill, label = "dummy"): ModelFiles {
  const { config, shape } = describeModel(json, `${label} config.json`);
  const weights = new DummyWeightSource(tensorSpecsOf(config, shape), { dtype, seed, fill });
  const close = (): void => {};
  return { dir: label, config, shape, weights, tokenizer: new ByteTokenizer(shape.vocabSize), chatTemplate: null, close, [Symbol.dispose]: close };
}
