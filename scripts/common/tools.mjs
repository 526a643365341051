// Shared helpers of the root scripts. Plain Node ESM: these run before Bun exists.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { delimiter, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = fileURLToPath(new URL("../..", import.meta.url));
export const BUN_VERSION = "1.4.5";
/** Where Bun goes when a global npm install is not allowed (e.g. no write access). */
export const LOCAL_TOOLS = join(ROOT, ".cache", "tools");

const bold = (s) => (process.stderr.isTTY ? `\x1b[1m${s}\x1b[0m` : s);

/** A step banner on stderr, so the user sees where a failure happened. */
export function banner(text) {
  process.stderr.write(`\n${bold(`==> ${text}`)}\n`);
}

/** Stops the script with one clear line (and a hint) instead of a stack trace. */
export function die(message, hint) {
  process.stderr.write(`\nerror: ${message}\n${hint ? `hint: ${hint}\n` : ""}`);
  process.exit(1);
}

/** Runs a command with inherited stdio; returns its exit code (never throws). */
export function run(cmd, args, options = {}) {
  const r = spawnSync(cmd, args, { stdio: "inherit", cwd: ROOT, env: process.env, ...options });
  if (r.error) return { code: 127, error: r.error };
  return { code: r.status ?? (r.signal ? 128 : 1), signal: r.signal };
}

/** Runs a command and returns its trimmed stdout, or null when it cannot run or fails. */
export function capture(cmd, args, options = {}) {
  const r = spawnSync(cmd, args, { encoding: "utf8", cwd: ROOT, ...options });
  if (r.error || r.status !== 0) return null;
  return r.stdout.trim();
}

/** Candidate locations of a `bun` executable, most specific first. */
function bunCandidates() {
  const out = [join(LOCAL_TOOLS, "bin", "bun")];
  const globalPrefix = capture("npm", ["prefix", "-g"]);
  if (globalPrefix) out.push(join(globalPrefix, "bin", "bun"));
  if (process.env.BUN_INSTALL) out.push(join(process.env.BUN_INSTALL, "bin", "bun"));
  if (process.env.HOME) out.push(join(process.env.HOME, ".bun", "bin", "bun"));
  return out;
}

/**
 * Finds a working Bun (PATH first, then the places the installer may have put it) and puts
 * its directory on PATH for every child process (turbo runs `bun` in each package).
 * Returns { bin, version } or null.
 */
export function findBun() {
  const onPath = capture("bun", ["--version"]);
  if (onPath) return { bin: "bun", version: onPath };
  for (const bin of bunCandidates()) {
    if (!existsSync(bin)) continue;
    const version = capture(bin, ["--version"]);
    if (!version) continue;
    process.env.PATH = `${dirname(bin)}${delimiter}${process.env.PATH ?? ""}`;
    return { bin, version };
  }
  return null;
}
