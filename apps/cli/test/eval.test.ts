/** `hybridgen eval` on the CPU backend with stories15M: text metrics, task accuracy, outputs, bad input. */
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { requireBuiltBin, runBin } from "./helpers.js";
import { stories15M } from "./model-fixture.js";

const dir = mkdtempSync(join(tmpdir(), "hybridgen-eval-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const text = join(dir, "story.txt"), tasks = join(dir, "tasks.jsonl");
beforeAll(async () => {
  requireBuiltBin();
  await stories15M();
  writeFileSync(text, "Once upon a time, there was a little girl named Lily. She had a red ball and a small dog named Max. Every day Lily and Max went to the park to play. " +
    "One day the ball rolled into the pond. Max jumped in the water and brought the ball back. Lily hugged Max and said he was the best dog in the world.\n");
  writeFileSync(tasks, [
    { context: "Once upon a time, there was a little girl named", answer: "Lily" },
    { context: "Tom was very hungry. His mom made him a sandwich. Tom sat at the table and", choices: [" ate the sandwich.", " ate the table."], answer: 0 },
    { context: "It was cold and snowy outside. Anna put on her warm coat and her", choices: [" swimsuit.", " mittens."], answer: 1 },
  ].map((t) => JSON.stringify(t)).join("\n"));
});

const BASE = ["--gpu-kv-budget", "20", "--sink-tokens", "2", "--ks", "2,8", "--prefix", "8", "--threads", "1"];
type Row = { config: string; k: number | null; perplexity: number; top1: number; kl: number; accuracy: number; items: number };

describe("hybridgen eval", () => {
  it("all-token configurations match full attention; a small K does not; tasks scored; eval.json and both figures written", () => {
    const out = join(dir, "run");
    const r = runBin(["eval", ...BASE, "--text", text, "--tasks", tasks, "--configs", "full,flexgen,moe-lightning,all-tokens,streamingllm,hybridgen-post", "--out", out]);
    expect(r.stderr).not.toContain("error");
    expect(r.code).toBe(0);
    for (const h of ["### Text", "### Tasks", "### Per method at K = 2"]) expect(r.stdout).toContain(h);
    const report = JSON.parse(readFileSync(join(out, "eval.json"), "utf8"));
    const text_: Row[] = report.text, full = text_.find((t) => t.config === "full")!;
    expect(text_.map((t) => `${t.config}@${t.k}`)).toEqual(["full@null", "flexgen@null", "moe-lightning@null", "all-tokens@null", "streamingllm@2", "streamingllm@8", "hybridgen-post@2", "hybridgen-post@8"]);
    expect(full.top1).toBe(1);
    expect(full.perplexity).toBeGreaterThan(1);
    for (const name of ["flexgen", "moe-lightning", "all-tokens"]) {
      const t = text_.find((x) => x.config === name)!;
      expect(t.top1, name).toBe(1);
      expect(t.kl, name).toBeLessThan(1e-6);
      expect(Math.abs(t.perplexity / full.perplexity - 1), name).toBeLessThan(1e-4);
    }
    const s2 = text_.find((t) => t.config === "streamingllm" && t.k === 2)!;
    expect(s2.kl).toBeGreaterThan(1e-3);
    expect(s2.top1).toBeLessThan(1);
    const acc: Row[] = report.tasks;
    expect(acc.every((t) => t.items === 3)).toBe(true);
    expect(acc.find((t) => t.config === "full")!.accuracy).toBe(1);
    for (const name of ["flexgen", "moe-lightning", "all-tokens"]) expect(acc.find((t) => t.config === name)!.accuracy, name).toBe(1);
    const post8 = acc.find((t) => t.config === "hybridgen-post" && t.k === 8) as Row & { meanLastK: number; preShare: number };
    expect([post8.meanLastK, post8.preShare]).toEqual([8, 0]);
    expect(r.stdout).toContain("| hybridgen-post | 8 | 8 / 0.0% |");
    for (const f of ["fig14-accuracy-vs-k.svg", "fig20-accuracy-per-method.svg"]) {
      const svg = readFileSync(join(out, f), "utf8");
      expect(svg.startsWith("<svg"), f).toBe(true);
      expect(svg, f).toContain("streamingllm");
    }
  });

  it("bad input: one error line, exit 2, nothing written", () => {
    const bad = join(dir, "bad.jsonl");
    writeFileSync(bad, `{"context": "a b", "answer": "c"}\n{"context": "x", "choices": [" a", " b"], "answer": 2}\n`);
    const cases: [string[], RegExp][] = [
      [[], /give --text FILE, --tasks FILE.jsonl or both/],
      [["--tasks", bad], /bad.jsonl line 2: "answer" is not the index of a choice/],
      [["--tasks", join(dir, "missing.jsonl")], /cannot read --tasks .*missing.jsonl: no such file/],
      [["--text", text, "--gpu-kv-budget", "4000"], /--gpu-kv-budget 4000 holds the whole context/],
      [["--text", text, "--configs", "keyformer,nope"], /unknown attention configuration "nope"/],
    ];
    for (const [args, want] of cases) {
      const r = runBin(["eval", "--ks", "2", "--out", join(dir, "bad-out"), ...args]);
      expect(r.code, args.join(" ")).toBe(2);
      const errors = r.stderr.trim().split("\n").filter((l) => l.startsWith("error:"));
      expect(errors.length, args.join(" ")).toBe(1);
      expect(errors[0]).toMatch(want);
    }
    expect(existsSync(join(dir, "bad-out"))).toBe(false);
  });
});
