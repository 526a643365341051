/**
 * A model's last prefill calibration, kept beside its hybrid profile
 * (`<cache>/profiles/<key>.calibration.json`, the profile's key): the next run starts from it
 * (its K and exact layers stand until that run's prompt calibrates afresh). A profile made by
 * `hybridgen profile-kmin` wins over it.
 */
import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";
import { z } from "zod";
import { fail } from "@hybridgen/spec";
import { readJsonFile } from "@hybridgen/core";
import type { CalibrationResult } from "./calibration.js";
import { hybridProfilePath } from "./profile.js";

const positiveInt = z.number().int().positive();
const fraction = z.number().min(0).max(1);

export const CachedCalibrationSchema = z.object({
  version: z.literal(1),
  k: positiveInt,
  exactLayers: z.array(z.number().int().nonnegative()),
  layerK: z.array(positiveInt).min(1),
  layerRecall: z.array(fraction),
  layerShare: z.array(fraction),
  massTarget: z.number().gt(0).max(1),
  candidates: positiveInt,
  tokens: positiveInt,
  offloaded: positiveInt,
  samples: positiveInt,
  ms: z.number().nonnegative(),
  createdAt: z.iso.datetime(),
});
export type CachedCalibration = z.infer<typeof CachedCalibrationSchema>;

export function hybridCalibrationPath(model: string, cacheDir?: string): string {
  return hybridProfilePath(model, cacheDir).replace(/\.json$/, ".calibration.json");
}

/** The cached calibration of `model`, or null when it has none; a malformed file is a one-line error naming it. */
export function readHybridCalibration(model: string, cacheDir?: string): CachedCalibration | null {
  const path = hybridCalibrationPath(model, cacheDir);
  if (!existsSync(path)) return null;
  const r = CachedCalibrationSchema.safeParse(readJsonFile(path, "a cached calibration"));
  if (!r.success) {
    const issue = r.error.issues[0]!;
    fail(`${path}: not a valid cached calibration (${issue.path.join(".")}: ${issue.message}); delete it to calibrate afresh`);
  }
  return r.data;
}

/** Keeps `c` as `model`'s calibration (temp file + rename); returns the path. */
export function writeHybridCalibration(model: string, c: CalibrationResult, cacheDir?: string): string {
  const path = hybridCalibrationPath(model, cacheDir);
  const entry = CachedCalibrationSchema.parse({
    version: 1, k: c.k, exactLayers: [...c.exactLayers], layerK: [...c.layerK], layerRecall: [...c.layerRecall], layerShare: [...c.layerShare],
    massTarget: c.massTarget, candidates: c.candidates, tokens: c.tokens, offloaded: c.offloaded, samples: c.samples, ms: c.ms, createdAt: new Date().toISOString(),
  });
  mkdirSync(dirname(path), { recursive: true });
  const tmp = `${path}.${process.pid}.${Date.now()}.tmp`;
  try {
    writeFileSync(tmp, `${JSON.stringify(entry, null, 2)}\n`);
    renameSync(tmp, path);
  } catch (e) {
    rmSync(tmp, { force: true });
    fail(`cannot write the cached calibration ${path}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`);
  }
  return path;
}
