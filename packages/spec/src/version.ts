/**
 * The version of these contracts. A plugin or backend says which one it was written for
 * (`spec: 1`), and the engine refuses one it does not implement instead of failing deep inside a
 * step; an implementation without the field predates it and is taken as version 1.
 */
import { fail } from "./errors.js";

export const SPEC_VERSION = 1;
export type SpecVersion = typeof SPEC_VERSION;

/** Checks `impl.spec` (absent, or SPEC_VERSION); `what` names the implementation in the error, e.g. `selector "quest"`. */
export function checkSpecVersion(what: string, impl: { readonly spec?: unknown }): void {
  const v = impl.spec;
  if (v === undefined || v === SPEC_VERSION) return;
  fail(`${what} was written for @hybridgen/spec version ${JSON.stringify(v)}; this engine implements version ${SPEC_VERSION}`);
}
