import { copyFileSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { DummyWeightSource, describeModel, tensorSpecsOf, writeSafetensors } from "@hybridgen/core";

/**
 * A small random-weight checkpoint of `config` in `dir` (f32 safetensors, config.json), with
 * stories15M's tokenizer.json (`tokenizerJson`) and any extra files (a tokenizer_config.json
 * with a chat template).
 */
export function writeTinyCheckpoint(dir: string, config: Record<string, unknown>, seed: number, tokenizerJson: string, extraFiles: Record<string, string> = {}): string {
  mkdirSync(dir, { recursive: true });
  const { config: parsed, shape } = describeModel(config, `${dir}/config.json`);
  const specs = tensorSpecsOf(parsed, shape);
  const weights = new DummyWeightSource(specs, { seed, dtype: "f32" });
  const tensors = specs.map((s) => {
    const w = weights.get(s.name)!;
    return { name: s.name, dtype: w.dtype, shape: w.shape, data: w.bytes.slice() };
  });
  writeSafetensors(join(dir, "model.safetensors"), tensors);
  writeFileSync(join(dir, "config.json"), JSON.stringify({ ...config, torch_dtype: "float32" }));
  copyFileSync(tokenizerJson, join(dir, "tokenizer.json"));
  for (const [name, text] of Object.entries(extraFiles)) writeFileSync(join(dir, name), text);
  return dir;
}
