/** What every fuzzed reader must do with any input: load, or throw one HybridgenError line. */
import { expect } from "vitest";
import { HybridgenError } from "@hybridgen/spec";

/** Runs `load`; returns "ok", or "error" for a HybridgenError of one short line. Anything else fails the property. */
export function loadsOrOneLineError(load: () => unknown): "ok" | "error" {
  try {
    load();
    return "ok";
  } catch (e) {
    return oneLineError(e);
  }
}

/** Same as loadsOrOneLineError for async loaders. */
export async function loadsOrOneLineErrorAsync(load: () => Promise<unknown>): Promise<"ok" | "error"> {
  try {
    await load();
    return "ok";
  } catch (e) {
    return oneLineError(e);
  }
}

/** Both loaders' verdict on what a load threw: "error" for a HybridgenError of one short line, else the property fails. */
function oneLineError(e: unknown): "error" {
  if (!(e instanceof HybridgenError)) throw new Error(`not a HybridgenError: ${e instanceof Error ? `${e.name}: ${e.message}` : String(e)}`);
  expect(e.message, "one line").not.toMatch(/[\n\r]/);
  expect(e.message.length, "a readable line").toBeLessThan(1000);
  return "error";
}

/** Sets the value at `path` inside a deep copy of `root` (creating objects on the way). */
export function withValueAt(root: unknown, path: readonly string[], value: unknown): unknown {
  const copy = structuredClone(root) as Record<string, unknown>;
  if (path.length === 0) return value;
  let node: Record<string, unknown> = copy;
  for (const k of path.slice(0, -1)) {
    const next = node[k];
    node[k] = next !== null && typeof next === "object" ? next : {};
    node = node[k] as Record<string, unknown>;
  }
  node[path[path.length - 1]] = value;
  return copy;
}

/** Every key path of a JSON value (objects and arrays), for choosing what to mutate. */
export function keyPaths(value: unknown, prefix: string[] = [], out: string[][] = []): string[][] {
  if (value !== null && typeof value === "object") {
    for (const [k, v] of Object.entries(value)) {
      out.push([...prefix, k]);
      keyPaths(v, [...prefix, k], out);
    }
  }
  return out;
}
