import { spawn, spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";

/** The built bin: the tests run what users run. `bun run build` (turbo) builds it first. */
export const BIN = fileURLToPath(new URL("../dist/hybridgen.js", import.meta.url));

/** A backend module for `--device PATH` ("one-thread": kernels-cpu's backend on one thread): the runtime's plugin fixture, kept in one place. */
export const ONE_THREAD_BACKEND = fileURLToPath(new URL("../../../packages/runtime/test/fixtures/backend-plugin.ts", import.meta.url));

export function requireBuiltBin(): void {
  if (!existsSync(BIN)) throw new Error(`${BIN} is missing: build the CLI first (cd apps/cli && bunx tsup)`);
}

export interface RunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

const childEnv = (env: Record<string, string> = {}) => {
  const e: Record<string, string | undefined> = { ...process.env, ...env };
  delete e.HYBRIDGEN_DEBUG; // the tests check what users see by default
  return e;
};

/** Runs the bin (through its #! line) to completion. */
export function runBin(args: string[], options: { input?: string | Uint8Array; env?: Record<string, string> } = {}): RunResult {
  const r = spawnSync(BIN, args, { input: options.input ?? "", env: childEnv(options.env), timeout: 120_000 });
  if (r.error) throw r.error;
  return { code: r.status, signal: r.signal, stdout: r.stdout.toString("utf8"), stderr: r.stderr.toString("utf8") };
}

/**
 * Runs the bin and calls `onStdout` with the stdout collected so far after every chunk;
 * `onStdout` may signal the child. Resolves when the child exits.
 */
export function runBinStreaming(
  args: string[],
  onStdout: (soFar: string, child: ReturnType<typeof spawn>) => void,
): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(BIN, args, { env: childEnv(), stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout!.setEncoding("utf8").on("data", (d: string) => {
      stdout += d;
      onStdout(stdout, child);
    });
    child.stderr!.setEncoding("utf8").on("data", (d: string) => (stderr += d));
    child.on("error", reject);
    child.on("close", (code, signal) => resolve({ code, signal, stdout, stderr }));
  });
}

/** Seeded PRNG (core's mulberry32) so "random" test inputs are reproducible. */
export { seededRandom as rng } from "@hybridgen/core";
