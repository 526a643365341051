/**
 * What a newcomer meets in the root scripts, each in a scratch copy of the repository's files:
 * `npm test` before set-up, the ./hybridgen launcher without Bun on PATH, progress lines on a
 * long step, no telemetry and no colour codes when output is not a terminal.
 */
import { chmodSync, cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { runCommand } from "../src/run.js";
import { ROOT } from "../src/workspace-packages.js";

let copy: string;
const BARE_PATH = "/usr/bin:/bin";

beforeEach(() => {
  copy = mkdtempSync(join(tmpdir(), "hybridgen-scripts-"));
  cpSync(join(ROOT, "scripts"), join(copy, "scripts"), { recursive: true });
  cpSync(join(ROOT, "package.json"), join(copy, "package.json"));
  cpSync(join(ROOT, "hybridgen"), join(copy, "hybridgen"));
  cpSync(join(ROOT, "bun"), join(copy, "bun"));
});

afterEach(() => rmSync(copy, { recursive: true, force: true }));

/** A stand-in for Bun that logs how it was called. */
function fakeBun(dir: string): string {
  mkdirSync(dir, { recursive: true });
  const path = join(dir, "bun");
  writeFileSync(path, `#!/bin/sh\nif [ "$1" = "--version" ]; then echo 9.9.9; exit 0; fi\necho "fake bun: $*"\n`);
  chmodSync(path, 0o755);
  return path;
}

describe("root scripts for a newcomer", () => {
  it("npm test before set-up says to run npm run setup first", () => {
    fakeBun(join(copy, ".cache", "tools", "bin"));
    const r = runCommand("node", ["scripts/test.mjs"], copy, { env: { ...process.env, PATH: `${BARE_PATH}:${join(copy, ".cache", "tools", "bin")}` } });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain("error: the dependencies are not installed\nhint: run `npm run setup` first");
    expect(r.stderr).not.toMatch(/command not found/);
  });

  it("./hybridgen runs the CLI with the Bun set-up recorded, not the one on PATH", () => {
    const bun = fakeBun(join(copy, "elsewhere"));
    mkdirSync(join(copy, ".cache"), { recursive: true });
    writeFileSync(join(copy, ".cache", "bun-path"), `${bun}\n`);
    mkdirSync(join(copy, "apps", "cli", "dist"), { recursive: true });
    writeFileSync(join(copy, "apps", "cli", "dist", "hybridgen.js"), "");
    const r = runCommand(join(copy, "hybridgen"), ["generate", "--prompt", "a b"], tmpdir(), { env: { ...process.env, PATH: BARE_PATH } });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout.trim()).toBe(`fake bun: ${join(copy, "apps", "cli", "dist", "hybridgen.js")} generate --prompt a b`);
  });

  it("./hybridgen before set-up says to run npm run setup first", () => {
    const r = runCommand(join(copy, "hybridgen"), ["--version"], copy, { env: { ...process.env, PATH: BARE_PATH } });
    expect(r.status).toBe(1);
    expect(r.stderr.trim()).toBe(`error: ${join(copy, "apps", "cli", "dist", "hybridgen.js")} is not built: run npm run setup first`);
  });

  it("a long step prints a progress line while it is silent; children get no telemetry and no colour", () => {
    const tools = join(copy, "scripts", "common", "tools.mjs");
    const script =
      `const t = await import(${JSON.stringify(tools)});` +
      `await t.runWithProgress("waiting", "sh", ["-c", "sleep 2.3; echo NO_COLOR=$NO_COLOR TURBO_TELEMETRY_DISABLED=$TURBO_TELEMETRY_DISABLED DO_NOT_TRACK=$DO_NOT_TRACK"], {}, 1);`;
    const r = runCommand("node", ["--input-type=module", "-e", script], copy, { env: { ...process.env, FORCE_COLOR: "1" } });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stderr).toContain("  … waiting: 1 s\n  … waiting: 2 s\n");
    expect(r.stdout.trim()).toBe("NO_COLOR=1 TURBO_TELEMETRY_DISABLED=1 DO_NOT_TRACK=1");
  });

  it("set-up records the Bun it used for the launcher", () => {
    const tools = join(copy, "scripts", "common", "tools.mjs");
    const script = `const t = await import(${JSON.stringify(tools)}); console.log(t.recordBun(process.env.FAKE_BUN));`;
    const bun = fakeBun(join(copy, "bun-dir"));
    const r = runCommand("node", ["--input-type=module", "-e", script], copy, { env: { ...process.env, FAKE_BUN: bun } });
    expect(r.status, r.stderr).toBe(0);
    expect(readFileSync(join(copy, ".cache", "bun-path"), "utf8")).toBe(`${bun}\n`);
  });
});
