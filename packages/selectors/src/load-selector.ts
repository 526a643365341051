/**
 * Loads a selector plugin: a module path (relative to `cwd`) or a package name, optionally with
 * ":exportName". The module must export a factory made with defineSelector, as its default
 * export, under the name given, or as its only such export; it is then registered by its name.
 */
import { createRequire } from "node:module";
import { isAbsolute, join, resolve as resolvePath } from "node:path";
import { pathToFileURL } from "node:url";
import { HybridgenError } from "@hybridgen/spec";
import { isSelectorFactory } from "./define-selector.js";
import { registerSelector, selectorNames } from "./registry.js";

/** "PATH|PACKAGE[:export]" split into the module and the export it names (absent: the default). */
export function splitModuleRef(ref: string): { specifier: string; exportName?: string } {
  const m = /^(.+):([A-Za-z_$][\w$]*)$/.exec(ref);
  return m ? { specifier: m[1]!, exportName: m[2]! } : { specifier: ref };
}

const PATH_LIKE = /^(\.{1,2}[\\/]|[\\/]|~[\\/])|\.(c|m)?[jt]s$/;

/** The file a module reference resolves to from `cwd`, or a one-line error. */
function resolveModule(specifier: string, cwd: string, ref: string): string {
  if (PATH_LIKE.test(specifier)) {
    const home = process.env.HOME ?? "";
    const path = specifier.startsWith("~") ? join(home, specifier.slice(2)) : isAbsolute(specifier) ? specifier : resolvePath(cwd, specifier);
    try {
      return createRequire(join(cwd, "noop.js")).resolve(path);
    } catch {
      throw new HybridgenError(`selector "${ref}": no module at ${path}`);
    }
  }
  try {
    const bun = (globalThis as { Bun?: { resolveSync(id: string, from: string): string } }).Bun;
    return bun ? bun.resolveSync(specifier, cwd) : createRequire(join(cwd, "noop.js")).resolve(specifier);
  } catch {
    throw new HybridgenError(
      `unknown selector "${ref}": not a registered name (${selectorNames().join(", ")}) and no package "${specifier}" installed from ${cwd}`,
    );
  }
}

/** Imports the plugin, registers its selector and returns the registered name. */
export async function loadSelectorModule(ref: string, cwd: string): Promise<string> {
  const { specifier, exportName } = splitModuleRef(ref);
  const file = resolveModule(specifier, cwd, ref);
  let mod: Record<string, unknown>;
  try {
    mod = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (e) {
    throw new HybridgenError(`selector "${ref}": loading ${file} failed: ${(e instanceof Error ? e.message : String(e)).split("\n")[0]}`);
  }
  let key = exportName;
  if (key === undefined) {
    const marked = Object.keys(mod).filter((k) => k !== "default" && isSelectorFactory(mod[k]));
    if (isSelectorFactory(mod.default) || marked.length === 0) key = "default";
    else if (marked.length === 1) key = marked[0]!;
    else throw new HybridgenError(`selector "${ref}": the module exports several selectors (${marked.join(", ")}); name one, e.g. ${specifier}:${marked[0]}`);
  }
  if (!(key in mod)) throw new HybridgenError(`selector "${ref}": the module has no export "${key}"`);
  const factory = mod[key];
  if (!isSelectorFactory(factory)) {
    throw new HybridgenError(`selector "${ref}": export "${key}" is not a selector made with defineSelector (got ${factory === null ? "null" : typeof factory})`);
  }
  registerSelector(factory);
  return factory.selectorName;
}
