/** A config.json's model with dummy (random) weights, for benches and device checks of a shape without a download. */
import { describeModel, tensorSpecsOf } from "./architectures.js";
import type { DType } from "@hybridgen/spec";
import { ByteTokenizer } from "./byte-tokenizer.js";
import { DummyWeightSource } from "./dummy-weights.js";
import type { ModelFiles } from "./model-files.js";
import type { RandomFill } from "@hybridgen/spec/kit";

/**
 * ModelFiles of `json` with dummy weights in `dtype` drawn from `seed` (by `fill`, default the
 * TypeScript fill) and a byte tokenizer without EOS; `label` is its dir and names the config in errors.
 */
export function dummyModelFiles(json: Record<string, unknown>, dtype: DType, seed: number, fill?: RandomFill, label = "dummy"): ModelFiles {
  const { config, shape } = describeModel(json, `${label} config.json`);
  const weights = new DummyWeightSource(tensorSpecsOf(config, shape), { dtype, seed, fill });
  const close = (): void => {};
  return { dir: label, config, shape, weights, tokenizer: new ByteTokenizer(shape.vocabSize), chatTemplate: null, close, [Symbol.dispose]: close };
}
