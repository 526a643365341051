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
  const text = arg(flag, "");
  return text === "" ? fallback : (parsedOrExit(flag, [text])[0] as number);
}

/** Each text parsed by the runtime's schema for `flag`; a bad one is the CLI's one line (exit 2). */
function parsedOrExit(flag: HybridOptionFlag, texts: readonly string[]): unknown[] {
  try {
    return texts.map((v) => parseHybridFlag(flag, v)[1]);
  } catch (e) {
    process.stderr.write(`error: ${(e as Error).message}\n`);
    process.exit(2);
  }
}

/** A runtime option's flag of any kind (--row-path mapped) parsed by the runtime's schema; absent: `fallback`'s text parsed the same way. */
export function hybridValue(flag: HybridOptionFlag, fallback: string): unknown {
  return parsedOrExit(flag, [arg(flag, fallback)])[0];
}

/** A sweep over a runtime option (--scoring full,int8): each comma-separated value parsed and bounded as hybridValue's. */
export function hybridList(flag: HybridOptionFlag, fallback: string): unknown[] {
  return parsedOrExit(flag, arg(flag, fallback).split(",").filter((x) => x !== ""));
}
