/**
 * The hybrid options' flags take their bounds and spellings from the runtime's schema
 * (HYBRID_OPTION_FLAGS, parseHybridFlag): a bad value is the same one line from generate, bench
 * and eval, before any model loads (exit 2).
 */
import { describe, expect, it } from "vitest";
import { requireBuiltBin, runBin } from "./helpers.js";

describe("one schema for the hybrid flags", () => {
  it("a bad --k, --cpu-stage-threads or --mass-target is the same line from every command", () => {
    requireBuiltBin();
    const cases: [string, string[], string][] = [
      ["k", ["--k", "0"], "error: invalid value for --k: must be at least 1\n"],
      ["k", ["--k", "two"], 'error: invalid value for --k: "two" is not a non-negative integer\n'],
      ["cpu-stage-threads", ["--cpu-stage-threads", "300"], "error: invalid value for --cpu-stage-threads: must be ≤ 256\n"],
    ];
    const commands: Record<string, string[][]> = {
      k: [["generate", "--attention", "hybrid", "-p", "x"], ["bench"], ["eval", "--text", "story.txt"]],
      "cpu-stage-threads": [["generate", "--attention", "hybrid", "-p", "x"], ["bench"]],
    };
    for (const [flag, args, line] of cases) {
      for (const cmd of commands[flag]!) {
        const r = runBin([...cmd, ...args]);
        expect([r.code, r.stderr], `${cmd[0]} ${args.join(" ")}`).toEqual([2, line]);
      }
    }
    const mass = runBin(["generate", "--attention", "hybrid", "-p", "x", "--mass-target", "1.5"]);
    expect([mass.code, mass.stderr]).toEqual([2, "error: invalid value for --mass-target: must be at most 1\n"]);
  });
});
