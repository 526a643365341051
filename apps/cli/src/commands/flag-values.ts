/** Flag value checks shared by bench and eval: every bad value is a one-line usage error. */
import { HybridgenError } from "@hybridgen/core";
import { parseHybridFlag, type HybridOptionFlag } from "@hybridgen/runtime";

export const usage = (msg: string): HybridgenError => new HybridgenError(msg, "EUSAGE");

export function integer(flag: string, raw: string | undefined, min: number, max = Number.MAX_SAFE_INTEGER): number | undefined {
  if (raw === undefined) return undefined;
  const t = raw.trim();
  if (!/^\d+$/.test(t) || !Number.isSafeInteger(Number(t)) || Number(t) < min || Number(t) > max) {
    throw usage(`invalid value for --${flag}: ${JSON.stringify(raw)} is not an integer in [${min}, ${max === Number.MAX_SAFE_INTEGER ? "∞" : max}]`);
  }
  return Number(t);
}

/** A runtime option's integer flag (--k, --cpu-stage-threads, …), bounds and message the runtime schema's. */
export function hybridInteger(flag: HybridOptionFlag, raw: string | undefined): number | undefined {
  return raw === undefined ? undefined : (parseHybridFlag(flag, raw)[1] as number);
}

export function list(flag: string, raw: string): string[] {
  const items = raw.split(",").map((s) => s.trim()).filter((s) => s.length > 0);
  if (items.length === 0) throw usage(`--${flag} needs at least one value (a comma-separated list)`);
  return [...new Set(items)];
}

/** A comma-separated list of integers ≥ min, ascending and distinct. */
export function integers(flag: string, raw: string | undefined, fallback: readonly number[], min: number): number[] {
  if (raw === undefined) return [...fallback];
  return [...new Set(list(flag, raw).map((s) => integer(flag, s, min)!))].sort((a, b) => a - b);
}

/** Attention configurations, comma-separated; a comma followed by KEY= continues a hybrid:KEY=VALUE,… spec. */
export function configList(flag: string, raw: string): string[] {
  const items = raw.split(/,(?![A-Za-z]+=)/).map((s) => s.trim()).filter((s) => s.length > 0);
  if (items.length === 0) throw usage(`--${flag} needs at least one value (a comma-separated list)`);
  return [...new Set(items)];
}
