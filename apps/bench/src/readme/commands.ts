/**
 * What the README-command test does with each command of a README's shell blocks: run it (from
 * a scratch directory that links the repository's top level, so files a command writes stay
 * there), sometimes at a smaller size, and check the output a README documents; or skip it, for
 * one of the reasons a CI machine cannot meet (a GPU, the network, a user's model directory) or
 * because it is CI itself.
 */
import type { ReadmeCommand } from "./readmes.js";

export type SkipReason = "needs a GPU" | "needs the network (the npm registry)" | "needs a user's model directory" | "is CI's own command (.ci/run)";

export interface CommandRule {
  /** Which commands the rule covers: a README (relative path, or any) and a pattern of the command's text. */
  readonly readme?: string;
  readonly match: RegExp;
  readonly skip?: SkipReason;
  /** Replacements that make the run cheap (tiny token counts, fewer configurations); each says what it shrinks. */
  readonly shrink?: readonly (readonly [from: string, to: string])[];
  /** What the README documents of the command's output, checked on the run. */
  readonly expect?: Expectation;
}

export interface Expectation {
  /** The README and the text in it that documents the output (the check fails if the README no longer says it). */
  readonly readme: string;
  readonly documented: string;
  /** stdout equals this file of the repository. */
  readonly stdoutFile?: string;
  /** Any other check of the run's output: what differs from the documented output, or undefined. */
  readonly check?: (out: { stdout: string; stderr: string }) => string | undefined;
}

/** Files a README's commands presume in the directory they run from: written from a README's fenced block that starts with the comment `// NAME`, or given here. */
export const COMMAND_FILES: readonly { readonly name: string; readonly fromBlockOf?: string; readonly block?: string; readonly text?: string }[] = [
  { name: "strided.ts", fromBlockOf: "packages/selectors/README.md", block: "// strided.ts" },
  { name: "my-selector.ts", fromBlockOf: "packages/selectors/README.md", block: "// strided.ts" },
  { name: "prompt.txt", text: "Tom had a red kite. It flew over the park.\n" },
];

/** "; scheduler: K 8 → N (range 8–M)" with K growing from kMin 8: the figure N is the machine's (its stage times decide it). */
function kGrowsFrom8({ stderr }: { stderr: string }): string | undefined {
  const m = /; scheduler: K 8 → (\d+) \(range 8–(\d+)\), (post|pre)/.exec(stderr);
  if (!m) return `no "; scheduler: K 8 → N (range 8–M)" in the stats line: ${stderr.split("\n").find((l) => l.includes("scheduler:")) ?? "(none)"}`;
  return Number(m[2]) > 8 ? undefined : `K never grew from kMin 8: ${m[0]}`;
}

const STORY = "apps/cli/test/fixtures/stories15M-greedy-256.txt";

/** First match wins; a command no rule matches is run as written. */
export const COMMAND_RULES: readonly CommandRule[] = [
  { match: /^npm (run setup|test)\b/, skip: "is CI's own command (.ci/run)" },
  { match: /^(bun add|bunx) /, skip: "needs the network (the npm registry)" },
  { match: /~\/models\/|\.\.\/shared\/models\//, skip: "needs a user's model directory" },
  { readme: "packages/kernels-cuda/README.md", match: /./, skip: "needs a GPU" },
  { match: /hybridgen bench --model preset:llama-3\.1-8b/, skip: "needs a GPU" },
  { match: /hybridgen bench --workload 8x131072/, skip: "needs a GPU" },
  { match: /hybridgen bench --workload 8x240/, shrink: [["--workload 8x240", "--workload 3x120"], ["--steps 16 --warmup 4", "--steps 3 --warmup 1"]] },
  {
    match: /^\.\/hybridgen generate --prompt "Once upon a time" --temperature 0 --max-tokens 256$|^hybridgen generate --prompt "Once upon a time" --temperature 0 --max-tokens 256$/,
    expect: { readme: "README.md", documented: "prints llama2.c's stories15M story for this prompt", stdoutFile: STORY },
  },
  {
    match: /generate -p "Once upon a time" -t 0 --gpu-kv-budget 64 --sink-tokens 4$/,
    expect: { readme: "README.md", documented: "offloaded and still attended exactly: same greedy story", stdoutFile: STORY },
  },
  {
    match: /--scheduler feedback --k-min 8 --json$/,
    expect: { readme: "apps/cli/README.md", documented: "`; scheduler: K 8 → 192 (range 8–192), post, 0 timing switches`", check: kGrowsFrom8 },
  },
  { match: /hybridgen generate --model preset:llama-3\.2-1b --dummy-weights/, shrink: [["-n 32", "-n 2"]] },
  {
    match: /hybridgen eval --text /,
    shrink: [["--ks 4,8,16,32", "--ks 8"], ["--k 8 ", "--k 8 --configs full,hybridgen-post --tokens 24 --limit 2 "]],
  },
  { match: /hybridgen bench --device cpu/, shrink: [["--contexts 96,160", "--contexts 96"], ["--batch 1,2", "--batch 1 --configs full,hybridgen-post"], ["--steps 6", "--steps 2"]] },
  { match: /^hybridgen profile-kmin|^\.\/hybridgen profile-kmin/, shrink: [["profile-kmin", "profile-kmin --tokens 48 --ks 8,16 --no-write"]] },
  { match: /^\/tmp\/stage-scoring /, shrink: [["28672 15 256 2,4 9", "2048 2 64 2 1"], ["126976 15 256 2,4 5", "4096 2 64 4 1"]] },
  { match: /stage-split\.ts /, shrink: [["--tokens 28672 --threads 15", "--tokens 2048 --threads 2 --layers 1 --rounds 1"]] },
];

export interface PlannedCommand extends ReadmeCommand {
  readonly skip?: SkipReason;
  /** The command the test runs (the README's, shrunk where a rule says so; `hybridgen` as the checkout's launcher). */
  readonly run?: string;
  readonly expect?: Expectation;
}

/** The plan for one README command. */
export function planCommand(c: ReadmeCommand): PlannedCommand {
  const rule = COMMAND_RULES.find((r) => (r.readme === undefined || r.readme === c.readme) && r.match.test(c.text));
  if (rule?.skip) return { ...c, skip: rule.skip };
  let run = c.text;
  for (const [from, to] of rule?.shrink ?? []) {
    if (!run.includes(from)) throw new Error(`${c.readme}:${c.line}: the shrink "${from}" no longer matches the command (update apps/bench/src/readme/commands.ts)`);
    run = run.replace(from, to);
  }
  // The installed command's name, as the README of a published package writes it, is this checkout's launcher.
  run = run.replace(/(^|\|\s*)hybridgen /g, "$1./hybridgen ");
  return { ...c, run, expect: rule?.expect };
}
