/** The error a bad-input test expects: a HybridgenError whose message is one line. */
import { expect } from "vitest";
import { HybridgenError } from "../src/index.js";

/** Runs `fn`, expects it to throw a one-line HybridgenError, returns the message. */
export function errorMessage(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(HybridgenError);
    expect((e as Error).message).not.toContain("\n");
    return (e as Error).message;
  }
  throw new Error("expected an error");
}
