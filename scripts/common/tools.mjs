// Shared helpers of the root scripts. Plain Node ESM: these run before Bun exists.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { delimiter, dirname, isAbsolute, join } from "node:path";
import { fileURLToPath } from "node:url";

export const ROOT = fileURLToPath(new URL("../..", import.meta.url));
export const BUN_VERSION = "1.4.5";
/** Where Bun goes when a global npm install is not allowed (e.g. no write access). */
export const LOCAL_TOOLS = join(ROOT, ".cache", "tools");
/** The absolute path of the Bun set-up used, read by the ./hybridgen launcher and by findBun. */
export const BUN_PATH_FILE = join(ROOT, ".cache", "bun-path");

// Every child (turbo, bun, vitest) runs without telemetry, and without colour codes when the
// output is not a terminal (CI logs, pipes).
process.env.TURBO_TELEMETRY_DISABLED = "1";
process.env.DO_NOT_TRACK = "1";
if (!process.stdout.isTTY || !process.stderr.isTTY) {
  process.env.NO_COLOR = "1";
  delete process.env.FORCE_COLOR;
}

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

/**
 * Runs a command with inherited stdio like run(), and while it runs prints a line every
 * `everyS` seconds on stderr ("… build: 45 s"), so a long step is never
 * minutes of silence. Resolves to { code }.
 */
export function runWithProgress(label, cmd, args, options = {}, everyS = 20) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const child = spawn(cmd, args, { stdio: "inherit", cwd: ROOT, env: process.env, ...options });
    const timer = setInterval(() => process.stderr.write(`  … ${label}: ${Math.round((Date.now() - t0) / 1000)} s\n`), everyS * 1000);
    const done = (code) => {
      clearInterval(timer);
      resolve({ code });
    };
    child.once("error", () => done(127));
    child.once("exit", (code, signal) => done(code ?? (signal ? 128 : 1)));
  });
}

/** Runs a command and returns its trimmed stdout, or null when it cannot run or fails. */
export function capture(cmd, args, options = {}) {
  const r = spawnSync(cmd, args, { encoding: "utf8", cwd: ROOT, ...options });
  if (r.error || r.status !== 0) return null;
  return r.stdout.trim();
}

/** Candidate locations of a `bun` executable, most specific first. */
function bunCandidates() {
  const out = [];
  if (existsSync(BUN_PATH_FILE)) out.push(readFileSync(BUN_PATH_FILE, "utf8").trim());
  out.push(join(LOCAL_TOOLS, "bin", "bun"));
  const globalPrefix = capture("npm", ["prefix", "-g"]);
  if (globalPrefix) out.push(join(globalPrefix, "bin", "bun"));
  if (process.env.BUN_INSTALL) out.push(join(process.env.BUN_INSTALL, "bin", "bun"));
  if (process.env.HOME) out.push(join(process.env.HOME, ".bun", "bin", "bun"));
  return out;
}

/**
 * Finds a working Bun (PATH first, then the places the installer may have put it) and puts
 * its directory on PATH for every child process (turbo runs `bun` in each package).
 * Returns { bin, version, onPath } or null (onPath: found on the PATH it was started with).
 */
export function findBun() {
  const onPath = capture("bun", ["--version"]);
  if (onPath) return { bin: "bun", version: onPath, onPath: true };
  for (const bin of bunCandidates()) {
    if (!bin || !existsSync(bin)) continue;
    const version = capture(bin, ["--version"]);
    if (!version) continue;
    process.env.PATH = `${dirname(bin)}${delimiter}${process.env.PATH ?? ""}`;
    return { bin, version, onPath: false };
  }
  return null;
}

/** The absolute path of `bin` ("bun" on PATH resolved), or null. */
export function absoluteBin(bin) {
  if (isAbsolute(bin)) return bin;
  const found = capture("sh", ["-c", `command -v ${bin}`]);
  return found && isAbsolute(found) ? found : null;
}

/** Remembers the Bun set-up used for the ./hybridgen launcher (a new shell may not have it on PATH). */
export function recordBun(bin) {
  const path = absoluteBin(bin);
  if (!path) return null;
  mkdirSync(dirname(BUN_PATH_FILE), { recursive: true });
  writeFileSync(BUN_PATH_FILE, `${path}\n`);
  return path;
}
