/** The benches take the runtime's hybrid flags (args.ts hybridArg): a bad value is the CLI's one line, exit 2, before any backend opens. */
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const run = (script: string, args: string[]) =>
  spawnSync(process.execPath, [fileURLToPath(new URL(`../src/${script}`, import.meta.url)), ...args], { encoding: "utf8", timeout: 60_000 });

describe("bench scripts' hybrid flags", () => {
  it("hybrid-modes --k 0 and calibrated-eval --mass-target 2 fail as the CLI does", () => {
    const k = run("hybrid-modes.ts", ["--backend", "cpu", "--k", "0"]);
    expect([k.status, k.stderr]).toEqual([2, "error: invalid value for --k: must be at least 1\n"]);
    const mass = run("eval/calibrated-eval.ts", ["--mass-target", "2"]);
    expect([mass.status, mass.stderr]).toEqual([2, "error: invalid value for --mass-target: must be at most 1\n"]);
  });
});
