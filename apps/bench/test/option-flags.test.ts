/** The benches take the runtime's hybrid flags (args.ts hybridArg, hybridList): a bad value is the CLI's one line, exit 2, before any backend opens. */
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

  it("stage-split's sweep over --scoring and its --rescore-factor, selector-bench's --k and --cpu-stage-threads, hybrid-modes' --row-path: the runtime's bounds", () => {
    const cases: [string, string[], string][] = [
      ["hybrid-modes.ts", ["--backend", "cpu", "--row-path", "sideways"], "error: invalid value for --row-path: must be auto, mapped or staged\n"],
      ["scale-run.ts", ["--backend", "cpu", "--window", "most"], "error: invalid value for --window: must be auto, least or a positive token count (got most)\n"],
      ["cpu/stage-split.ts", ["--scoring", "full,int9"], "error: invalid value for --scoring: must be full, int8 or int4\n"],
      ["cpu/stage-split.ts", ["--rescore-factor", "0"], "error: invalid value for --rescore-factor: must be at least 1\n"],
      ["selectors/selector-bench.ts", ["--k", "-1"], 'error: invalid value for --k: "-1" is not a non-negative integer\n'],
      ["selectors/selector-bench.ts", ["--cpu-stage-threads", "x"], 'error: invalid value for --cpu-stage-threads: "x" is not a non-negative integer\n'],
    ];
    for (const [script, args, line] of cases) {
      const r = run(script, args);
      expect([r.status, r.stderr], `${script} ${args.join(" ")}`).toEqual([2, line]);
    }
  });
});
