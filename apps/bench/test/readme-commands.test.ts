/**
 * Every command of every README's shell blocks runs as a newcomer would type it (from a directory
 * that links the checkout's top level; `hybridgen` is the checkout's launcher), at a smaller size
 * where apps/bench/src/readme/commands.ts says so, and exits 0; where a README documents the
 * output, the run must show it. Skipped, each named with its reason: commands that need a GPU, the
 * network or a user's model directory, and CI's own two commands.
 */
import { spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { COMMAND_FILES, planCommand } from "../src/readme/commands.js";
import { readmePaths, readText, shellCommands } from "../src/readme/readmes.js";

const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
let dir = "";

/** The fenced block of `readme` whose first line is `first`, without its fences. */
function block(readme: string, first: string): string {
  const text = readText(ROOT, readme);
  const at = text.indexOf(`\n${first}\n`);
  if (at < 0) throw new Error(`${readme} has no block starting with ${first}`);
  return text.slice(at + 1, text.indexOf("\n```", at));
}

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "hg-readme-"));
  for (const entry of readdirSync(ROOT)) if (entry !== ".git") symlinkSync(join(ROOT, entry), join(dir, entry));
  for (const f of COMMAND_FILES) writeFileSync(join(dir, f.name), f.text ?? block(f.fromBlockOf!, f.block!));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

for (const readme of readmePaths(ROOT)) {
  const commands = shellCommands(readme, readText(ROOT, readme)).map(planCommand);
  if (commands.length === 0) continue;
  describe(readme, () => {
    for (const c of commands) {
      const title = `${c.readme}:${c.line} ${c.text.split("\n")[0]}`;
      if (c.skip) {
        it.skip(`[${c.skip}] ${title}`, () => {});
        continue;
      }
      it(title, () => {
        const r = spawnSync("sh", ["-c", c.run!], { cwd: dir, encoding: "utf8", timeout: 180_000, env: { ...process.env, NO_COLOR: "1" } });
        expect(r.status, `${c.run}\n${r.stderr}`).toBe(0);
        const e = c.expect;
        if (!e) return;
        expect(readText(ROOT, e.readme).replace(/\s+/g, " "), `${e.readme} no longer documents this output`).toContain(e.documented);
        if (e.stdoutFile) expect(r.stdout).toBe(readFileSync(join(ROOT, e.stdoutFile), "utf8"));
        expect(e.check?.({ stdout: r.stdout, stderr: r.stderr })).toBeUndefined();
      });
    }
  });
}
