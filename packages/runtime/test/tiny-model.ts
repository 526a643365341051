/** The runtime tests' model: a tiny Llama (GQA: 4 heads over 2 KV heads), random f32 weights, 3 layers, 96-token context. */
import { ByteTokenizer, DummyWeightSource, describeModel, tensorSpecsOf, type ModelFiles } from "@hybridgen/core";

export const TINY_CONFIG = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 64, intermediate_size: 128, num_hidden_layers: 3,
  num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 256, max_position_embeddings: 96, rms_norm_eps: 1e-5,
  rope_theta: 10000, tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2,
};
export const CONTEXT = 96, PROMPT = 40, STEPS = 12;

/** The tiny model's files with dummy weights drawn from `seed`. */
export function tinyFiles(seed: number): ModelFiles {
  const { config, shape } = describeModel(TINY_CONFIG, "tiny config.json");
  const weights = new DummyWeightSource(tensorSpecsOf(config, shape), { dtype: "f32", seed });
  const close = (): void => {};
  return { dir: "tiny", config, shape, weights, tokenizer: new ByteTokenizer(shape.vocabSize), chatTemplate: null, close, [Symbol.dispose]: close };
}
