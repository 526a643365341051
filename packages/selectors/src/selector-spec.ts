/**
 * What `--selector` (and the runtime's `selector` option) may name: a registered selector
 * ("topk"), a module that exports one ("./my-selector.ts", "my-selector-package",
 * "./selectors.ts:strided" for a named export), or POST+PRE, two of those joined by "+"
 * (pairSelectors). loadSelectorSpec() imports the modules and registers their selectors;
 * selectorFromSpec() then builds the TokenSelector from registered names alone (no I/O).
 */
import { existsSync } from "node:fs";
import { resolve as resolvePath } from "node:path";
import { HybridgenError, type TokenSelector } from "@hybridgen/spec";
import { loadSelectorModule, splitModuleRef } from "./load-selector.js";
import { pairSelectors } from "./pair-selectors.js";
import { createSelector, lookupSelector } from "./registry.js";

/** The parts of a spec: one, or the post and pre halves of a pair. A file path that holds a "+" stays whole. */
export function specParts(spec: string, cwd: string = process.cwd()): string[] {
  if (spec.length === 0) throw new HybridgenError("selector: the name is empty");
  if (lookupSelector(spec) || !spec.includes("+") || existsSync(resolvePath(cwd, splitModuleRef(spec).specifier))) return [spec];
  const parts = spec.split("+");
  if (parts.length !== 2 || !parts[0] || !parts[1]) throw new HybridgenError(`selector "${spec}": a pair is POST+PRE, e.g. topk+streaming`);
  return parts;
}

/** Whether every part of `spec` is a registered name (selectorFromSpec needs no loading). */
export function isRegisteredSpec(spec: string): boolean {
  return specParts(spec).every((p) => lookupSelector(p) !== undefined);
}

/**
 * Loads the modules a spec names (relative paths and packages resolve from `cwd`), registers
 * their selectors, and returns the spec by registered names ("./x.ts+streaming" → "x+streaming").
 */
export async function loadSelectorSpec(spec: string, options: { cwd?: string } = {}): Promise<string> {
  const cwd = options.cwd ?? process.cwd();
  const names: string[] = [];
  for (const part of specParts(spec, cwd)) names.push(lookupSelector(part) ? part : await loadSelectorModule(part, cwd));
  return names.join("+");
}

/** The TokenSelector a spec of registered names stands for; `options` go to a single selector's factory. */
export function selectorFromSpec(spec: string, options?: unknown): TokenSelector<any> {
  const parts = specParts(spec);
  if (parts.length === 1) return createSelector(parts[0]!, options);
  if (options !== undefined) throw new HybridgenError(`selector "${spec}": options apply to one selector, not a pair (build the pair with pairSelectors)`);
  return pairSelectors({ post: createSelector(parts[0]!), pre: createSelector(parts[1]!) });
}
