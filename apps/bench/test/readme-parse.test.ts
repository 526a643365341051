/**
 * How the README checks read a README: the commands of its shell blocks (continuation lines
 * joined, trailing comments dropped, here-documents kept whole, other fences ignored), and the
 * plan the command test makes of each (skip reasons, shrinks that must still match, `hybridgen`
 * as the checkout's launcher).
 */
import { describe, expect, it } from "vitest";
import { planCommand } from "../src/readme/commands.js";
import { markdownTables, shellCommands } from "../src/readme/readmes.js";

const README = [
  "# x", "", "```sh",
  "./hybridgen generate -p \"a # b\" -t 0   # greedy",
  "# a comment line", "",
  "hybridgen plan --model preset:llama-3.1-8b \\", "  --context 4096",
  "cat > p.jsonl <<'JSONL'", "{\"prompt\": \"x\"}", "JSONL",
  "echo hi | hybridgen generate --json | jq .text",
  "```", "", "```ts", "hybridgen generate --not-a-command", "```", "",
  "| a | b |", "| --- | ---: |", "| x | 1 |", "",
  "```bash", "bun add @hybridgen/core", "./hybridgen generate --model ~/models/X -p hi", "```",
].join("\n");

describe("README parsing", () => {
  it("shell blocks become commands with their start lines", () => {
    expect(shellCommands("R.md", README).map((c) => [c.line, c.text])).toEqual([
      [4, './hybridgen generate -p "a # b" -t 0'],
      [7, "hybridgen plan --model preset:llama-3.1-8b --context 4096"],
      [9, "cat > p.jsonl <<'JSONL'\n{\"prompt\": \"x\"}\nJSONL"],
      [12, "echo hi | hybridgen generate --json | jq .text"],
      [24, "bun add @hybridgen/core"],
      [25, "./hybridgen generate --model ~/models/X -p hi"],
    ]);
  });

  it("tables outside fences, with their header line", () => {
    expect(markdownTables("R.md", README).map((t) => [t.line, t.rows.length])).toEqual([[19, 3]]);
  });

  it("the plan: skips with their reason, the launcher for the installed name, shrinks that must match", () => {
    const plans = shellCommands("R.md", README).map(planCommand);
    expect(plans.map((p) => p.skip ?? p.run)).toEqual([
      './hybridgen generate -p "a # b" -t 0',
      "./hybridgen plan --model preset:llama-3.1-8b --context 4096",
      "cat > p.jsonl <<'JSONL'\n{\"prompt\": \"x\"}\nJSONL",
      "echo hi | ./hybridgen generate --json | jq .text",
      "needs the network (the npm registry)",
      "needs a user's model directory",
    ]);
    expect(() => planCommand({ readme: "R.md", line: 1, text: "hybridgen generate --model preset:llama-3.2-1b --dummy-weights -p x -n 8" })).toThrow(
      'R.md:1: the shrink "-n 32" no longer matches the command (update apps/bench/src/readme/commands.ts)',
    );
  });
});
