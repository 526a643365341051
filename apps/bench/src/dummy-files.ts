/** Model files of a config with dummy (random) weights, for benchmarks of a preset's shape. */
import { ByteTokenizer, DummyWeightSource, describeModel, tensorSpecsOf, type DType, type ModelFiles, type RandomFill } from "@hybridgen/core";

export function dummyFiles(json: Record<string, unknown>, dtype: DType, seed: number, fill?: RandomFill, label = "dummy"): ModelFiles {
  const { config, shape } = describeModel(json, `${label} config.json`);
  const weights = new DummyWeightSource(tensorSpecsOf(config, shape), { dtype, seed, fill });
  const close = (): void => {};
  return { dir: label, config, shape, weights, tokenizer: new ByteTokenizer(shape.vocabSize), chatTemplate: null, close, [Symbol.dispose]: close };
}
