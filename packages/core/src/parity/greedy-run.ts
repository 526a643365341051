/** One dummy-weight model's prefill and greedy decode on a backend: what cross-backend checks compare. */
import { loadModel } from "../architectures.js";
import type { Backend, DType } from "@hybridgen/spec";
import { dummyModelFiles } from "../dummy-model.js";
import type { RandomFill } from "@hybridgen/spec/kit";

export interface GreedyRun {
  /** Logits after the prompt's last position. */
  readonly first: Float32Array;
  /** The greedy tokens fed, one per step. */
  readonly tokens: number[];
  /** Each decode step's logits. */
  readonly logits: Float32Array[];
}

/**
 * `json` with dummy weights in `dtype` (seed 7) on `backend`: prefill `prompt` (blocks of 64),
 * then `steps` greedy decode steps, with the KV cache in f32 for f32 weights, else bf16.
 */
export function greedyDummyRun(backend: Backend, json: Record<string, unknown>, dtype: DType, prompt: Int32Array, steps: number, fill?: RandomFill): GreedyRun {
  using files = dummyModelFiles(json, dtype, 7, fill);
  using model = loadModel(files, backend, { maxContext: prompt.length + steps + 1, prefillBlock: 64, kvDtype: dtype === "f32" ? "f32" : "bf16" });
  const first = model.forward(prompt, 0);
  const tokens: number[] = [];
  const logits: Float32Array[] = [];
  let tok = model.argmaxLogits();
  for (let s = 0; s < steps; s++) {
    tokens.push(tok);
    logits.push(model.forward(Int32Array.of(tok), prompt.length + s));
    tok = model.argmaxLogits();
  }
  return { first, tokens, logits };
}
