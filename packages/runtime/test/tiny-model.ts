/** The runtime tests' model: a tiny Llama (GQA: 4 heads over 2 KV heads), random f32 weights, 3 layers, 96-token context. */
import { dummyModelFiles, loadModel, type Backend, type ModelFiles, type TokenSelector } from "@hybridgen/core";
import { createHybridAttention } from "../src/index.js";

export const TINY_CONFIG = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 64, intermediate_size: 128, num_hidden_layers: 3,
  num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 256, max_position_embeddings: 96, rms_norm_eps: 1e-5,
  rope_theta: 10000, tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2,
};
export const CONTEXT = 96, PROMPT = 40, STEPS = 12;

/** The tiny model's files with dummy weights drawn from `seed`. */
export function tinyFiles(seed: number): ModelFiles {
  return dummyModelFiles(TINY_CONFIG, "f32", seed, undefined, "tiny");
}

/** `prompt` (PROMPT tokens), then STEPS steps fed with `feed` (greedy when absent): the logits of every forward, and the tokens fed. */
export function decodeTiny(model: { forward(tokens: Int32Array, pos: number): Float32Array }, prompt: Int32Array, feed?: number[]): { logits: Float32Array[]; tokens: number[] } {
  const logits = [Float32Array.from(model.forward(prompt, 0))];
  const tokens: number[] = [];
  for (let s = 0; s < STEPS; s++) {
    const last = logits[logits.length - 1]!;
    const tok = feed ? feed[s]! : last.indexOf(Math.max(...last));
    tokens.push(tok);
    logits.push(Float32Array.from(model.forward(Int32Array.of(tok), PROMPT + s)));
  }
  return { logits, tokens };
}

/**
 * `prompt` then greedy steps through hybrid attention with `selector` (pre-QKᵀ, fixed K 6, a window
 * of 16 with 2 sinks) on the tiny model of `seed`: tokens, logits, and the JS selection time.
 */
export async function decodePreTiny(backend: Backend, seed: number, prompt: Int32Array, selector: TokenSelector, logits: "exact" | "verified") {
  using model = loadModel(tinyFiles(seed), backend, { maxContext: CONTEXT, gpuKvBudget: 16, sinkTokens: 2 });
  using ha = await createHybridAttention(model, backend, { selector, scheduler: "fixed", k: 6, timing: "pre", logits });
  const { tokens, logits: out } = decodeTiny(model, prompt);
  return { tokens, logits: out, steps: ha.stats.steps, jsMs: ha.stats.cpuJsMs };
}
