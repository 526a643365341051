/**
 * Qwen2ForCausalLM (Qwen2, Qwen2.5): the Llama architecture with biases on the q, k and v
 * projections (none on o or the MLP), run by LlamaModel. Sliding-window attention is read
 * from the config and rejected when enabled, since the engine attends to the whole context.
 */
import { z } from "zod";
import { LlamaConfigSchema, resolveLlamaShape, type LlamaConfigJson, type ModelShape } from "./config.js";
import { parseConfigWith } from "./config-parse.js";
import { fail } from "@hybridgen/spec";
import { llamaTensorSpecs } from "./llama-family.js";
import type { TensorSpec } from "./tensor-spec.js";

/** The keys Qwen2 adds to a Llama config. */
export const Qwen2ExtraSchema = z
  .object({
    use_sliding_window: z.boolean().default(false),
    sliding_window: z.number().int().positive().nullable().optional(),
    max_window_layers: z.number().int().nonnegative().optional(),
  })
  .passthrough();

export type Qwen2ConfigJson = LlamaConfigJson & z.output<typeof Qwen2ExtraSchema>;

export function parseQwen2Config(json: unknown, src: string): { config: Qwen2ConfigJson; shape: ModelShape } {
  const base = parseConfigWith(LlamaConfigSchema, json, src);
  const extra = parseConfigWith(Qwen2ExtraSchema, json, src);
  if (extra.use_sliding_window) {
    fail(`${src}: use_sliding_window: sliding-window attention is not supported (got true; window ${extra.sliding_window ?? "unset"})`);
  }
  // Qwen2 has no attention_bias key: its q/k/v biases are part of the architecture.
  if (base.attention_bias || base.mlp_bias) fail(`${src}: attention_bias/mlp_bias are not Qwen2 keys (got ${JSON.stringify({ attention_bias: base.attention_bias, mlp_bias: base.mlp_bias })})`);
  const config = { ...base, ...extra } as Qwen2ConfigJson;
  return { config, shape: resolveLlamaShape(config, "qwen2") };
}

export function qwen2TensorSpecs(shape: ModelShape): TensorSpec[] {
  return llamaTensorSpecs(shape, { qkv: true, o: false, mlp: false });
}
