/** `--name value` flags of the bench scripts. */
import { parseHybridFlag, type HybridOptionFlag } from "@hybridgen/runtime";

export function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1]! : fallback;
}

/** A comma-separated flag as a list (empty entries dropped). */
export function list(name: string, fallback: string): string[] {
  return arg(name, fallback).split(",").filter((x) => x !== "");
}

/**
 * A runtime option's flag (--k, --mass-target, …) parsed and bounded by the runtime's schema, so a
 * bench takes the values the CLI does; a bad one is the CLI's one line (exit 2). `fallback`: the bench's own default.
 */
export function hybridArg(flag: HybridOptionFlag, fallback: number): number {
  const i = process.argv.indexOf(`--${flag}`);
  if (i < 0 || i + 1 >= process.argv.length) return fallback;
  try {
    return parseHybridFlag(flag, process.argv[i + 1]!)[1] as number;
  } catch (e) {
    process.stderr.write(`error: ${(e as Error).message}\n`);
    process.exit(2);
  }
}

/** A sweep over a runtime option (--scoring full,int8): each comma-separated value parsed and bounded as hybridArg's one. */
export function hybridList(flag: HybridOptionFlag, fallback: string): unknown[] {
  const i = process.argv.indexOf(`--${flag}`);
  const text = i > 0 && i + 1 < process.argv.length ? process.argv[i + 1]! : fallback;
  try {
    return text.split(",").filter((x) => x !== "").map((v) => parseHybridFlag(flag, v)[1]);
  } catch (e) {
    process.stderr.write(`error: ${(e as Error).message}\n`);
    process.exit(2);
  }
}
