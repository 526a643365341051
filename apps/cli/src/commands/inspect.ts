/**
 * `hybridgen inspect <model>`: architecture, parameter count, weight bytes by dtype, KV bytes
 * per token, and the KV cache a --context × --batch needs — what decides where the cache goes.
 * Reads only the config (and the safetensors headers of a directory): no weights are loaded.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";
import {
  HybridgenError, PRESET_PREFIX, configDtype, describeModel, kvCacheBytes, modelInfo, openModelDir, presetConfig,
  type DType, type ModelInfo,
} from "@hybridgen/core";
import { hostMemoryBytes } from "../host-memory.js";
import type { CliIo } from "../io.js";
import { parseArgsError } from "../parse-args-error.js";

export const INSPECT_HELP = `Usage: hybridgen inspect <model> [options]

Prints what a model needs before loading it: architecture, parameters, weight bytes by
dtype, KV-cache bytes per token and for a whole context and batch.

  <model>                  a model directory (Hugging Face layout) or preset:<name>
      --context N          positions per sequence (default: the model's max_position_embeddings)
      --batch N            sequences (default 1)
      --kv-dtype D         KV storage dtype: f32, f16 or bf16 (default bf16)
      --json               one JSON object instead of text
  -h, --help               this help

Presets: opt-125m, opt-350m, opt-1.3b, opt-2.7b, opt-6.7b, opt-13b, llama-3.2-1b,
llama-3.2-3b, llama-3.1-8b, qwen2.5-1.5b, qwen2.5-3b, qwen2.5-7b, qwen2.5-14b
`;

const GiB = 2 ** 30;

/** 1536 → "1.50 KiB", with binary units. */
export function formatBytes(n: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) (n /= 1024), i++;
  return i === 0 ? `${n} B` : `${n.toFixed(2)} ${units[i]}`;
}

function positiveInt(flag: string, raw: string | undefined, fallback: number): number {
  if (raw === undefined) return fallback;
  if (!/^\d+$/.test(raw.trim()) || Number(raw) < 1 || !Number.isSafeInteger(Number(raw))) {
    throw new HybridgenError(`invalid value for ${flag}: ${JSON.stringify(raw)} is not a positive integer`, "EUSAGE");
  }
  return Number(raw);
}

export interface InspectReport extends ModelInfo {
  readonly model: string;
  readonly context: number;
  readonly batch: number;
  readonly kvDtype: DType;
  readonly kvCacheBytes: number;
  readonly hostMemoryBytes: number;
  /** Where the weight dtypes come from: the checkpoint's headers, or config.json's
   * torch_dtype (a preset, or a directory without weights). */
  readonly weightsFrom: "checkpoint" | "config";
}

/** config.json of a directory that has no weights (only its numbers are needed). */
function configOnly(dir: string): unknown {
  const path = join(dir, "config.json");
  try {
    return JSON.parse(readFileSync(path, "utf8"));
  } catch (e) {
    throw new HybridgenError(`${path}: cannot read it as JSON (${(e as Error).message.split("\n")[0]})`);
  }
}

export function inspectModel(model: string, opts: { context?: number; batch?: number; kvDtype?: DType } = {}): InspectReport {
  let info: ModelInfo;
  let weightsFrom: InspectReport["weightsFrom"] = "config";
  const hasWeights = (dir: string) => existsSync(join(dir, "model.safetensors")) || existsSync(join(dir, "model.safetensors.index.json"));
  if (model.startsWith(PRESET_PREFIX)) {
    const { config, shape } = describeModel(presetConfig(model.slice(PRESET_PREFIX.length)), `${model} config.json`);
    info = modelInfo(config, shape, undefined, configDtype(config) ?? "bf16");
  } else if (existsSync(join(model, "config.json")) && !hasWeights(model)) {
    const { config, shape } = describeModel(configOnly(model), join(model, "config.json"));
    info = modelInfo(config, shape, undefined, configDtype(config) ?? "bf16");
  } else {
    weightsFrom = "checkpoint";
    using files = openModelDir(model);
    info = modelInfo(files.config, files.shape, files.weights);
  }
  const context = opts.context ?? info.maxPositions;
  const batch = opts.batch ?? 1;
  const kvDtype = opts.kvDtype ?? "bf16";
  return { ...info, model, context, batch, kvDtype, kvCacheBytes: kvCacheBytes(info, kvDtype, context, batch), hostMemoryBytes: hostMemoryBytes(), weightsFrom };
}

export function formatInspect(r: InspectReport): string {
  const weights = Object.entries(r.weightBytes).map(([d, b]) => `${d} ${formatBytes(b!)}`).join(", ");
  const total = Object.values(r.weightBytes).reduce((a, b) => a + (b ?? 0), 0);
  const lines = [
    `model:          ${r.model}`,
    `architecture:   ${r.architecture} (${r.family}): ${r.layers} layers, hidden ${r.hiddenSize}, ${r.heads} heads / ${r.kvHeads} KV heads × ${r.headDim}, vocab ${r.vocabSize}, max positions ${r.maxPositions}`,
    `parameters:     ${(r.parameters / 1e9).toFixed(3)} B (${r.parameters.toLocaleString("en-US")}; tied embeddings: ${r.tiedEmbeddings ? "yes" : "no"})`,
    `weights:        ${weights}${Object.keys(r.weightBytes).length > 1 ? ` (total ${formatBytes(total)})` : ""}${r.weightsFrom === "config" ? " (dtype from config.json; no weights read)" : ""}`,
    `KV per token:   ${formatBytes(r.kvBytesPerToken.bf16)} in bf16/f16, ${formatBytes(r.kvBytesPerToken.f32)} in f32 (K + V, all layers)`,
    `KV cache:       ${formatBytes(r.kvCacheBytes)} for ${r.context} positions × batch ${r.batch} in ${r.kvDtype}`,
    `with weights:   ${formatBytes(r.kvCacheBytes + total)} (host memory here: ${(r.hostMemoryBytes / GiB).toFixed(1)} GiB in the memory tiers of hybridgen info)`,
  ];
  return `${lines.join("\n")}\n`;
}

export function runInspect(argv: readonly string[], io: CliIo): number {
  let parsed;
  try {
    parsed = parseArgs({
      args: [...argv],
      strict: true,
      allowPositionals: true,
      options: {
        context: { type: "string" },
        batch: { type: "string" },
        "kv-dtype": { type: "string" },
        json: { type: "boolean" },
        help: { type: "boolean", short: "h" },
      },
    });
  } catch (e) {
    throw parseArgsError(e, "hybridgen inspect");
  }
  const v = parsed.values;
  if (v.help) {
    io.stdout(INSPECT_HELP);
    return 0;
  }
  if (parsed.positionals.length !== 1) {
    throw new HybridgenError(`hybridgen inspect takes one model (a directory or preset:<name>), got ${parsed.positionals.length} (see hybridgen inspect --help)`, "EUSAGE");
  }
  const kvDtype = v["kv-dtype"] ?? "bf16";
  if (kvDtype !== "f32" && kvDtype !== "f16" && kvDtype !== "bf16") {
    throw new HybridgenError(`invalid value for --kv-dtype: must be one of f32, f16, bf16 (got ${JSON.stringify(kvDtype)})`, "EUSAGE");
  }
  const report = inspectModel(parsed.positionals[0]!, {
    context: v.context === undefined ? undefined : positiveInt("--context", v.context, 1),
    batch: positiveInt("--batch", v.batch, 1),
    kvDtype,
  });
  io.stdout(v.json ? `${JSON.stringify(report)}\n` : formatInspect(report));
  return 0;
}
