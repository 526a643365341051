/**
 * An error a user can act on: its message is one line that names the problem. The CLI
 * prints `error: <message>` for these and exits non-zero, without a stack trace.
 */
export class HybridgenError extends Error {
  constructor(message: string, readonly code: string = "EHYBRIDGEN") {
    super(message);
    this.name = "HybridgenError";
  }
}

export function fail(message: string, code?: string): never {
  throw new HybridgenError(message, code);
}

export function check(cond: unknown, message: string | (() => string)): asserts cond {
  if (!cond) fail(typeof message === "string" ? message : message());
}
