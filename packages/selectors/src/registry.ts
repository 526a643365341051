/**
 * The selector registry: name → factory, open to programs (registerSelector) and to plugins
 * loaded by module (load-selector.ts). The built-ins are registered through the same call when
 * the package loads; every lookup by name (`--selector NAME`, createSelector, the runtime) reads
 * this one table.
 */
import { HybridgenError, type TokenSelector } from "@hybridgen/spec";
import { isSelectorFactory, type SelectorFactory } from "./define-selector.js";
import { allTokens } from "./builtins/all-tokens.js";
import { exactTopK } from "./builtins/exact-topk.js";
import { h2o } from "./builtins/h2o.js";
import { infinigen } from "./builtins/infinigen.js";
import { keyformer } from "./builtins/keyformer.js";
import { quest } from "./builtins/quest.js";
import { pageIndexSelector } from "./builtins/page-index.js";
import { streamingLLM } from "./builtins/streaming.js";

type AnyFactory = SelectorFactory<any, any>;

const registry = new Map<string, AnyFactory>();
const builtins = new Set<string>();

export interface RegisterOptions {
  /** Replace a plugin already registered under the name (a built-in is never replaced). */
  readonly replace?: boolean;
}

/** Registers a selector made with defineSelector under its name; the same factory twice is a no-op. */
export function registerSelector(factory: AnyFactory, options: RegisterOptions = {}): void {
  if (!isSelectorFactory(factory)) {
    throw new HybridgenError(`registerSelector: expects a selector factory made with defineSelector, got ${describe(factory)}`);
  }
  const name = factory.selectorName;
  const held = registry.get(name);
  if (held === factory) return;
  if (held && builtins.has(name)) throw new HybridgenError(`registerSelector: "${name}" is a built-in selector's name; give the plugin another`);
  if (held && !options.replace) throw new HybridgenError(`registerSelector: a selector named "${name}" is registered already (pass { replace: true } to replace it)`);
  registry.set(name, factory);
}

/** Removes a plugin's registration; built-ins stay. Returns whether one was removed. */
export function unregisterSelector(name: string): boolean {
  if (builtins.has(name)) throw new HybridgenError(`unregisterSelector: "${name}" is a built-in selector`);
  return registry.delete(name);
}

/** The factory registered under `name`, or undefined. */
export function lookupSelector(name: string): AnyFactory | undefined {
  return registry.get(name);
}

/** Every registered name: the built-ins first, then plugins in registration order. */
export function selectorNames(): string[] {
  return [...registry.keys()];
}

export function isBuiltinSelector(name: string): boolean {
  return builtins.has(name);
}

/** A registered selector by name (`--selector topk`), with its options validated. */
export function createSelector(name: string, options?: unknown): TokenSelector<any> {
  const factory = registry.get(name);
  if (!factory) {
    throw new HybridgenError(`unknown selector "${name}" (registered: ${selectorNames().join(", ")}; a plugin is a module path or package, e.g. ./my-selector.ts)`);
  }
  return factory(options);
}

function describe(v: unknown): string {
  if (v === null) return "null";
  if (typeof v === "function") return `a function${v.name ? ` (${v.name})` : ""} without defineSelector's mark`;
  return typeof v === "object" ? "an object" : `${typeof v} ${JSON.stringify(v)}`;
}

for (const f of [exactTopK, streamingLLM, allTokens, h2o, quest, pageIndexSelector, infinigen, keyformer]) {
  registerSelector(f);
  builtins.add(f.selectorName);
}

/** The built-in selectors by the name users type. */
export const builtinSelectors: Readonly<Record<string, AnyFactory>> = Object.freeze(
  Object.fromEntries([...builtins].map((n) => [n, registry.get(n)!])),
);
