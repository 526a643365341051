/** The validation tests' check that bad input is refused before native code: a one-line HybridgenError matching its pattern. */
import { expect } from "vitest";
import { HybridgenError } from "@hybridgen/spec";

/** Each call throws a one-line HybridgenError matching its pattern. */
export function expectOneLineErrors(cases: [() => unknown, RegExp][]): void {
  for (const [fn, re] of cases) {
    let err: unknown;
    try {
      fn();
    } catch (e) {
      err = e;
    }
    expect(err, String(re)).toBeInstanceOf(HybridgenError);
    expect((err as Error).message).toMatch(re);
    expect((err as Error).message).not.toContain("\n");
  }
}
