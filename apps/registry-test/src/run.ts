/** Runs a command to completion; throws one message with the command and its last output lines when it fails. */
import { spawnSync, type SpawnSyncOptions } from "node:child_process";

export interface RunResult {
  readonly stdout: string;
  readonly stderr: string;
  readonly status: number | null;
}

/** Runs `cmd args` in `cwd`; returns its output whatever the exit status. */
export function runCommand(cmd: string, args: readonly string[], cwd: string, options: SpawnSyncOptions = {}): RunResult {
  const r = spawnSync(cmd, args, { cwd, encoding: "utf8", timeout: 120_000, ...options });
  if (r.error) throw new Error(`\`${cmd} ${args.join(" ")}\` could not run in ${cwd}: ${r.error.message}`);
  return { stdout: String(r.stdout ?? ""), stderr: String(r.stderr ?? ""), status: r.status };
}

/** Runs `cmd args` in `cwd` and returns its trimmed stdout; a non-zero exit throws. */
export function sh(cmd: string, args: readonly string[], cwd: string, options: SpawnSyncOptions = {}): string {
  const r = runCommand(cmd, args, cwd, options);
  if (r.status !== 0) {
    const tail = `${r.stdout}${r.stderr}`.trim().split("\n").slice(-20).join("\n");
    throw new Error(`\`${cmd} ${args.join(" ")}\` exited ${r.status} in ${cwd}:\n${tail}`);
  }
  return r.stdout.trim();
}
