/**
 * Model presets: the public config.json shapes of the models the paper evaluates (and two
 * small OPTs), kept as JSON files in presets/. With dummy weights they build the exact
 * architecture of the real model without downloading it, for benchmarking:
 *
 *   using files = openPreset("llama-3.2-1b", { fill: createNativeRandomFill() });
 */
import llama_3_1_8b from "./presets/llama-3.1-8b.json" with { type: "json" };
import llama_3_2_1b from "./presets/llama-3.2-1b.json" with { type: "json" };
import llama_3_2_3b from "./presets/llama-3.2-3b.json" with { type: "json" };
import opt_1_3b from "./presets/opt-1.3b.json" with { type: "json" };
import opt_125m from "./presets/opt-125m.json" with { type: "json" };
import opt_13b from "./presets/opt-13b.json" with { type: "json" };
import opt_2_7b from "./presets/opt-2.7b.json" with { type: "json" };
import opt_350m from "./presets/opt-350m.json" with { type: "json" };
import opt_6_7b from "./presets/opt-6.7b.json" with { type: "json" };
import qwen2_5_1_5b from "./presets/qwen2.5-1.5b.json" with { type: "json" };
import qwen2_5_14b from "./presets/qwen2.5-14b.json" with { type: "json" };
import qwen2_5_3b from "./presets/qwen2.5-3b.json" with { type: "json" };
import qwen2_5_7b from "./presets/qwen2.5-7b.json" with { type: "json" };
import { describeModel, tensorSpecsOf } from "./architectures.js";
import { ByteTokenizer } from "./byte-tokenizer.js";
import { DummyWeightSource, type DummyWeightOptions } from "./dummy-weights.js";
import { fail } from "@hybridgen/spec";
import type { ModelFiles } from "./model-files.js";

const PRESETS: Readonly<Record<string, unknown>> = {
  "opt-125m": opt_125m, "opt-350m": opt_350m, "opt-1.3b": opt_1_3b, "opt-2.7b": opt_2_7b, "opt-6.7b": opt_6_7b, "opt-13b": opt_13b,
  "llama-3.2-1b": llama_3_2_1b, "llama-3.2-3b": llama_3_2_3b, "llama-3.1-8b": llama_3_1_8b,
  "qwen2.5-1.5b": qwen2_5_1_5b, "qwen2.5-3b": qwen2_5_3b, "qwen2.5-7b": qwen2_5_7b, "qwen2.5-14b": qwen2_5_14b,
};

export const PRESET_NAMES: readonly string[] = Object.keys(PRESETS);

/** The prefix that names a preset where a model directory is expected. */
export const PRESET_PREFIX = "preset:";

/** A copy of preset `name`'s config.json, with `overrides` on top (the family's architecture at another size). */
export function presetConfig(name: string, overrides: Record<string, unknown> = {}): Record<string, unknown> {
  const c = PRESETS[name];
  if (!c) fail(`unknown preset ${JSON.stringify(name)} (presets: ${PRESET_NAMES.join(", ")})`);
  return { ...(structuredClone(c) as Record<string, unknown>), ...overrides };
}

/**
 * Preset `name` as ModelFiles with dummy weights (generated as the model loads them) and a
 * byte tokenizer (the text of random weights is meaningless anyway).
 */
export function openPreset(name: string, dummy: DummyWeightOptions = {}): ModelFiles {
  const json = presetConfig(name);
  const dir = `${PRESET_PREFIX}${name}`;
  const { config, shape } = describeModel(json, `${dir} config.json`);
  const weights = new DummyWeightSource(tensorSpecsOf(config, shape), dummy);
  const tokenizer = new ByteTokenizer(shape.vocabSize, null, shape.eosTokenIds[0] ?? null);
  const close = (): void => {};
  return { dir, config, shape, weights, tokenizer, chatTemplate: null, close, [Symbol.dispose]: close };
}
