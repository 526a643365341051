/**
 * Opens a Hugging Face model directory: config.json (+ generation_config.json), the
 * safetensors weights (single file or sharded with model.safetensors.index.json), and
 * tokenizer.json (+ tokenizer_config.json). Weights are memory-mapped, never copied. The
 * architecture (Llama, Qwen2, OPT) is chosen from config.json by architectures.ts.
 */
import { existsSync, statSync } from "node:fs";
import { join } from "node:path";
import { describeModel, tensorSpecsOf } from "./architectures.js";
import { LlamaConfigSchema, type LlamaConfigJson, type ModelShape } from "./config.js";
import { parseConfigWith } from "./config-parse.js";
import { DummyWeightSource, type DummyWeightOptions } from "./dummy-weights.js";
import { fail } from "@hybridgen/spec";
import { readJsonFile } from "./json-file.js";
import { loadTokenizerFiles } from "./tokenizer-files.js";
import type { ModelFiles, WeightSource, WeightView } from "./model-files.js";
import { openSafetensors, type SafetensorsFile } from "./safetensors.js";

/** Validates a Llama config.json; the first problem becomes one line: file, key path, message, value. */
export function parseLlamaConfig(json: unknown, src = "config.json"): LlamaConfigJson {
  return parseConfigWith(LlamaConfigSchema, json, src);
}

/** Several safetensors shards behind one name → tensor lookup. */
class ShardedWeights implements WeightSource {
  constructor(
    private readonly map: ReadonlyMap<string, SafetensorsFile>,
  ) {}

  get(name: string): WeightView | undefined {
    return this.map.get(name)?.get(name);
  }

  names(): string[] {
    return [...this.map.keys()];
  }
}

/** Opens model.safetensors, or the shards listed in model.safetensors.index.json. */
function openWeights(dir: string): { weights: WeightSource; files: SafetensorsFile[] } {
  const single = join(dir, "model.safetensors");
  if (existsSync(single)) {
    const f = openSafetensors(single);
    return { weights: f, files: [f] };
  }
  const indexPath = join(dir, "model.safetensors.index.json");
  if (!existsSync(indexPath)) {
    const hint = existsSync(join(dir, "pytorch_model.bin")) ? " (PyTorch .bin checkpoints are not supported; convert to safetensors)" : "";
    fail(`${dir}: no model.safetensors or model.safetensors.index.json${hint}`);
  }
  const index = readJsonFile(indexPath);
  const weightMap = (index as { weight_map?: unknown })?.weight_map;
  if (weightMap === null || typeof weightMap !== "object" || Array.isArray(weightMap)) fail(`${indexPath}: no weight_map object`);

  const files = new Map<string, SafetensorsFile>();
  const byTensor = new Map<string, SafetensorsFile>();
  try {
    for (const [tensor, file] of Object.entries(weightMap as Record<string, unknown>)) {
      if (typeof file !== "string" || file.includes("/") || file.includes("\\")) fail(`${indexPath}: weight_map.${tensor} is not a file name in the directory`);
      let shard = files.get(file);
      if (!shard) {
        const p = join(dir, file);
        if (!existsSync(p)) fail(`${indexPath}: shard ${file} (holding ${tensor}) is missing from ${dir}`);
        shard = openSafetensors(p);
        files.set(file, shard);
      }
      if (!shard.tensors.has(tensor)) fail(`${indexPath}: tensor ${tensor} is not in its shard ${file}`);
      byTensor.set(tensor, shard);
    }
  } catch (e) {
    for (const f of files.values()) f.close();
    throw e;
  }
  return { weights: new ShardedWeights(byTensor), files: [...files.values()] };
}

export interface OpenModelDirOptions {
  /** Use deterministic random weights of the config's architecture instead of the
   * directory's safetensors (which then need not exist). */
  readonly dummyWeights?: DummyWeightOptions;
}

/** Opens `dir`; every missing or malformed file is a HybridgenError naming it. */
export function openModelDir(dir: string, options: OpenModelDirOptions = {}): ModelFiles {
  let isDir = false;
  try {
    isDir = statSync(dir).isDirectory();
  } catch {
    fail(`model directory ${dir} does not exist`);
  }
  if (!isDir) fail(`${dir} is not a directory`);
  const configPath = join(dir, "config.json");
  if (!existsSync(configPath)) fail(`${dir}: no config.json (not a Hugging Face model directory)`);
  const { config, shape: base } = describeModel(readJsonFile(configPath), configPath);

  // generation_config.json often lists extra stop ids (e.g. llama2.c: BOS ends a story).
  const eos = [...base.eosTokenIds];
  let bos = base.bosTokenId;
  const genPath = join(dir, "generation_config.json");
  if (existsSync(genPath)) {
    const gen = readJsonFile(genPath) as { eos_token_id?: unknown; bos_token_id?: unknown } | null;
    const g = gen?.eos_token_id;
    const list = g == null ? [] : Array.isArray(g) ? g : [g];
    for (const id of list) {
      if (!Number.isSafeInteger(id)) fail(`${genPath}: eos_token_id has a non-integer ${JSON.stringify(id)}`);
      if (!eos.includes(id as number)) eos.push(id as number);
    }
    if (bos === null && Number.isSafeInteger(gen?.bos_token_id)) bos = gen!.bos_token_id as number;
  }
  const { tokenizer, chatTemplate, eosId } = loadTokenizerFiles(dir, { bosId: bos, eosId: eos[0] });
  // tokenizer_config's eos_token ends a chat turn (<|im_end|>, <|eot_id|>): stop there too.
  if (eosId !== null && !eos.includes(eosId)) eos.push(eosId);
  for (const id of eos) if (id < 0 || id >= base.vocabSize) fail(`${dir}: eos token id ${id} is outside the vocab (${base.vocabSize})`);
  const shape: ModelShape = { ...base, bosTokenId: bos, eosTokenIds: eos };
  if (tokenizer.vocabSize > shape.vocabSize) {
    fail(`${dir}: tokenizer.json has ${tokenizer.vocabSize} tokens but config.json vocab_size is ${shape.vocabSize}`);
  }

  const { weights, files } = options.dummyWeights
    ? { weights: new DummyWeightSource(tensorSpecsOf(config, shape), options.dummyWeights), files: [] }
    : openWeights(dir);
  let closed = false;
  const close = (): void => {
    if (closed) return;
    closed = true;
    for (const f of files) f.close();
  };
  return { dir, config, shape, weights, tokenizer, chatTemplate, close, [Symbol.dispose]: close };
}
