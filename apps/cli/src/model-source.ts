/**
 * What `--model` names: a Hugging Face model directory, or `preset:<name>` (the exact
 * architecture of a released model, for benchmarking without its weights). With
 * `--dummy-weights` the weights are deterministic random values (bf16 unless --dtype says
 * otherwise), generated natively as the model loads them; a preset needs it.
 */
import { HybridgenError, PRESET_PREFIX, openModelDir, openPreset, type DType, type DummyWeightOptions, type ModelFiles } from "@hybridgen/core";

export interface ModelSourceOptions {
  /** Dummy weights instead of the checkpoint's; `dtype` is their stored dtype. */
  readonly dummyWeights?: boolean;
  readonly dtype?: DType;
  /** Seed of the dummy weights (default 0). */
  readonly weightSeed?: number;
  readonly threads?: number;
}

export const isPreset = (model: string): boolean => model.startsWith(PRESET_PREFIX);

/** Dummy-weight options with the native fill (loaded lazily: flag errors need no native code). */
async function dummyOptions(o: ModelSourceOptions): Promise<DummyWeightOptions> {
  const { createNativeRandomFill } = await import("@hybridgen/kernels-cpu");
  return { dtype: o.dtype ?? "bf16", seed: o.weightSeed ?? 0, fill: createNativeRandomFill(o.threads) };
}

/** Opens `model` for loading. */
export async function openModelSource(model: string, o: ModelSourceOptions = {}): Promise<ModelFiles> {
  if (isPreset(model)) {
    const name = model.slice(PRESET_PREFIX.length);
    if (!o.dummyWeights) {
      throw new HybridgenError(`${model} is a preset without weights: add --dummy-weights to run it with random ones`, "EUSAGE");
    }
    return openPreset(name, await dummyOptions(o));
  }
  return o.dummyWeights ? openModelDir(model, { dummyWeights: await dummyOptions(o) }) : openModelDir(model);
}
