/**
 * The hybrid profile of a model (`hybridgen profile-kmin`): the smallest K per selector whose
 * top-1 agreement with full attention meets a tolerance (the paper's K_min, Fig. 14), and the
 * layers whose speculative query q̃ (projected from the previous layer's input) recalls the
 * true top-K too poorly to choose tokens for them. Stored under the hybridgen cache, keyed by
 * the model directory's real path and config.json content (or the preset name), where
 * `generate` reads its default K and per-layer policy.
 */
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, realpathSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { z } from "zod";
import { fail } from "@hybridgen/spec";
import { readJsonFile } from "@hybridgen/core";
import { PRESET_PREFIX } from "@hybridgen/core";
import { defaultCacheDir } from "@hybridgen/core";

const fraction = z.number().min(0).max(1);
const positiveInt = z.number().int().positive();

export const HybridProfileSchema = z
  .object({
    version: z.literal(1),
    /** What it was measured on: the model directory's real path, or preset:NAME. */
    model: z.string().min(1),
    /** Top-1 agreement with full attention that K_min must reach. */
    tolerance: z.number().gt(0).max(1),
    /** The selector `kMin` is for (the default one, topk, when it was measured). */
    selector: z.string().min(1),
    /** K_min of `selector`; the largest K measured when none reached the tolerance. */
    kMin: positiveInt,
    perSelector: z.record(
      z.string().min(1),
      z.object({
        kMin: positiveInt.nullable(),
        /** [K, top-1 agreement, mean KL(full ‖ hybrid)] in ascending K. */
        agreement: z.array(z.tuple([positiveInt, fraction, z.number().min(0)])).min(1),
      }),
    ),
    /** Layers whose selection must wait for the true query (recallMetric's recall below recallThreshold). */
    exactLayers: z.array(z.number().int().nonnegative()),
    /** Per layer, the share of the true top-recallK that q̃'s top candidates·recallK holds (layer 0: 1, q̃₀ is exact). */
    layerRecall: z.array(fraction).min(1),
    /** Per layer, the share of the true top-recallK's attention mass that q̃'s choice holds. */
    layerMassRecall: z.array(fraction).min(1),
    /** q̃ chose candidates·K tokens in the recall (verified logits' candidate multiplier). */
    candidates: positiveInt,
    /** Which recall decides exactLayers: "tokens" (layerRecall) or "mass" (layerMassRecall). */
    recallMetric: z.enum(["tokens", "mass"]),
    recallK: positiveInt,
    recallThreshold: fraction,
    /** Measurement conditions: the device window (sinks included), its sinks, decode steps compared. */
    gpuKvBudget: positiveInt,
    sinkTokens: z.number().int().nonnegative(),
    steps: positiveInt,
    createdAt: z.iso.datetime(),
  })
  .refine((p) => p.exactLayers.every((l) => l < p.layerRecall.length), { message: "exactLayers names a layer beyond layerRecall", path: ["exactLayers"] })
  .refine((p) => p.layerMassRecall.length === p.layerRecall.length, { message: "layerMassRecall and layerRecall differ in length", path: ["layerMassRecall"] });
export type HybridProfile = z.infer<typeof HybridProfileSchema>;

/** The file name (without .json) a model's profile is kept under. */
export function hybridProfileKey(model: string): string {
  if (model.startsWith(PRESET_PREFIX)) return `preset-${safeName(model.slice(PRESET_PREFIX.length))}`;
  let real: string;
  try {
    real = realpathSync(model);
  } catch {
    fail(`${model}: no such model directory`);
  }
  const configPath = join(real, "config.json");
  let config: Buffer;
  try {
    config = readFileSync(configPath);
  } catch (e) {
    fail(`${configPath}: cannot read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  // A changed config (other weights copied over the same directory) is another model.
  const hash = createHash("sha256").update(real).update("\0").update(config).digest("hex").slice(0, 16);
  return `${safeName(basename(real))}-${hash}`;
}

const safeName = (s: string) => s.replace(/[^A-Za-z0-9._-]/g, "_") || "model";

/** Where the profile of `model` (a directory or preset:NAME) lives: `<cache>/profiles/<key>.json`. */
export function hybridProfilePath(model: string, cacheDir?: string): string {
  return join(cacheDir && cacheDir.length > 0 ? cacheDir : defaultCacheDir(), "profiles", `${hybridProfileKey(model)}.json`);
}

/** The stored profile of `model`, or null when it has none; a malformed file is a one-line error naming it. */
export function readHybridProfile(model: string, cacheDir?: string): HybridProfile | null {
  const path = hybridProfilePath(model, cacheDir);
  if (!existsSync(path)) return null;
  return parseHybridProfile(readJsonFile(path, "a hybrid profile"), path);
}

/** Validates a parsed profile; `source` names it in the error. */
export function parseHybridProfile(json: unknown, source: string): HybridProfile {
  const r = HybridProfileSchema.safeParse(json);
  if (!r.success) {
    const issue = r.error.issues[0]!;
    const where = issue.path.length > 0 ? `${issue.path.join(".")}: ` : "";
    fail(`${source}: not a valid hybrid profile (${where}${issue.message}); run hybridgen profile-kmin again`);
  }
  return r.data;
}

/** Writes the profile of `model` atomically (temp file + rename) and returns its path. */
export function writeHybridProfile(model: string, profile: HybridProfile, cacheDir?: string): string {
  const path = hybridProfilePath(model, cacheDir);
  const checked = parseHybridProfile(profile, `the profile of ${model}`);
  mkdirSync(dirname(path), { recursive: true });
  const tmp = `${path}.${process.pid}.${Date.now()}.tmp`;
  try {
    writeFileSync(tmp, `${JSON.stringify(checked, null, 2)}\n`);
    renameSync(tmp, path);
  } catch (e) {
    rmSync(tmp, { force: true });
    fail(`cannot write the hybrid profile ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  return path;
}
