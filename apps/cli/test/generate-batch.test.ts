// `hybridgen generate --prompts FILE --batch N`: the batched results equal one run per prompt
// (stories15M, greedy and seeded sampling; hybrid attention per sequence too), JSONL output and
// the totals line, and the one-line errors of the flags and of a malformed prompts file.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { parsePromptsJsonl } from "../src/read-prompts-jsonl.js";
import { bufferedIo, runCli } from "../src/index.js";
import { requireBuiltBin, runBin } from "./helpers.js";
import { stories15M } from "./model-fixture.js";

let model = "";
let tmp = "";
beforeAll(async () => {
  requireBuiltBin();
  model = await stories15M();
  tmp = mkdtempSync(join(tmpdir(), "hybridgen-batch-test-"));
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const TOTALS_LINE = /^prompts: 3, batch: 3 \| prompt: \d+ tokens, [\d.]+ tok\/s \| generated: (\d+) tokens, [\d.]+ tok\/s \(all sequences\) in \d+ decode steps \| device: (cpu|cuda)\/.+$/;

function file(name: string, text: string): string {
  const p = join(tmp, name);
  writeFileSync(p, text);
  return p;
}

describe("generate --prompts on stories15M", () => {
  it("3 prompts decoded together equal three single runs (greedy and seeded sampling)", () => {
    const prompts = [
      { prompt: "Once upon a time", max_tokens: 48 },
      { prompt: "The little dog" },
      { prompt: "Lily and Tom went to the park. They", max_tokens: 24, temperature: 0.8, seed: 5 },
    ];
    const path = file("three.jsonl", `${prompts.map((p) => JSON.stringify(p)).join("\n")}\n`);
    const r = runBin(["generate", "--model", model, "--prompts", path, "--batch", "3", "--temperature", "0", "--max-tokens", "32", "--threads", "1"]);
    expect(r.stderr).not.toMatch(/error/);
    expect(r.code).toBe(0);
    const lines = r.stdout.trimEnd().split("\n").map((l) => JSON.parse(l));
    expect(lines.map((l) => l.index).sort()).toEqual([0, 1, 2]);
    const byIndex = [...lines].sort((a, b) => a.index - b.index);
    const totals = r.stderr.trimEnd().split("\n").at(-1)!;
    expect(totals).toMatch(TOTALS_LINE);
    expect(Number(TOTALS_LINE.exec(totals)![1])).toBe(byIndex.reduce((a, l) => a + l.generatedTokens, 0));

    prompts.forEach((p, i) => {
      const single = runBin([
        "generate", "--model", model, "--prompt", p.prompt, "--json", "--threads", "1",
        "--max-tokens", String(p.max_tokens ?? 32), "--temperature", String(p.temperature ?? 0), ...(p.seed === undefined ? [] : ["--seed", String(p.seed)]),
      ]);
      expect(single.code).toBe(0);
      const one = JSON.parse(single.stdout);
      expect(byIndex[i]).toMatchObject({ index: i, line: i + 1, prompt: p.prompt, text: one.text, tokens: one.tokens, finishReason: one.finishReason });
      expect(byIndex[i].text.length).toBeGreaterThan(20);
    });
  });

  it("--batch 1 runs the prompts one after another with the same results", () => {
    const path = file("two.jsonl", '{"prompt": "Once upon a time"}\n{"prompt": "Once upon a time", "max_tokens": 5}\n');
    const r = runBin(["generate", "--model", model, "--prompts", path, "--temperature", "0", "--max-tokens", "16", "--threads", "1"]);
    expect(r.code).toBe(0);
    const [a, b] = r.stdout.trimEnd().split("\n").map((l) => JSON.parse(l));
    expect([a.index, b.index]).toEqual([0, 1]);
    expect(a.tokens.slice(0, 5)).toEqual(b.tokens);
    expect(r.stderr.trimEnd().split("\n").at(-1)).toMatch(/^prompts: 2, batch: 1 \| /);
  });
});

describe("generate --prompts --batch 2 --attention hybrid (CPU backend)", () => {
  it("3 prompts through 2 slots, each with its own window and top-K stage: the tokens of one hybrid run per prompt; stats per slot", () => {
    const prompts = [{ prompt: "Once upon a time", max_tokens: 30 }, { prompt: "The little dog", max_tokens: 12 }, { prompt: "Lily and Tom went to the park." }];
    const path = file("hybrid.jsonl", `${prompts.map((p) => JSON.stringify(p)).join("\n")}\n`);
    const flags = ["--attention", "hybrid", "--gpu-kv-budget", "12", "--sink-tokens", "4", "--k", "4", "--device", "cpu", "--threads", "1", "--temperature", "0"];
    const r = runBin(["generate", "--model", model, "--prompts", path, "--batch", "2", "--max-tokens", "20", ...flags]);
    expect(r.stderr).not.toMatch(/error/);
    expect(r.code).toBe(0);
    const byIndex = r.stdout.trimEnd().split("\n").map((l) => JSON.parse(l)).sort((a, b) => a.index - b.index);
    prompts.forEach((p, i) => {
      const one = JSON.parse(runBin(["generate", "--model", model, "--prompt", p.prompt, "--json", "--max-tokens", String(p.max_tokens ?? 20), ...flags]).stdout);
      expect(byIndex[i].tokens, p.prompt).toEqual(one.tokens);
    });
    expect(r.stderr).toMatch(/^hybrid: selector topk, fixed scheduler \(K 4 post, from the flags\)/m);
    for (const slot of [0, 1]) expect(r.stderr).toMatch(new RegExp(`^slot ${slot} hybrid: \\d+ tokens offloaded, mean rows selected per KV head [\\d.]+, per layer`, "m"));
    expect(r.stderr.trimEnd().split("\n").find((l) => l.startsWith("prompts:"))).toMatch(/^prompts: 3, batch: 2 \| /);
  });
});

describe("generate --prompts: bad input", () => {
  const errorOf = async (args: string[]): Promise<string> => {
    const io = bufferedIo();
    expect(await runCli(["generate", ...args], io)).toBe(2);
    expect(io.out).toBe("");
    return io.err;
  };

  it("flag errors", async () => {
    expect(await errorOf(["--batch", "4", "-p", "x"])).toBe("error: --batch needs --prompts FILE (a JSONL file of prompts)\n");
    expect(await errorOf(["--prompts", "a.jsonl", "--batch", "33"])).toBe('error: invalid value for --batch: must be ≤ 32 (got 33)\n');
    expect(await errorOf(["--prompts", "a.jsonl", "--batch", "0"])).toBe('error: invalid value for --batch: must be at least 1 (got 0)\n');
    expect(await errorOf(["--prompts", "a.jsonl", "-p", "x"])).toBe("error: give either --prompts or --prompt/--prompt-file, not both\n");
    const ok = file("ok.jsonl", '{"prompt": "x"}\n');
    expect(await errorOf(["--prompts", ok, "--batch", "2", "--attention", "hybrid", "--gpu-kv-budget", "16", "--kv-disk", join(tmp, "missing")])).toBe(
      `error: --kv-disk ${join(tmp, "missing")}: no such directory\n`,
    );
    expect(await errorOf(["--prompts", join(tmp, "missing.jsonl")])).toBe(`error: cannot read prompts file ${join(tmp, "missing.jsonl")}: no such file\n`);
  });

  it("a malformed line is named", async () => {
    const bad = file("bad.jsonl", '{"prompt": "a"}\n\n{"prompt": "b", "max_tokens": 0}\n');
    expect(await errorOf(["--prompts", bad])).toBe(`error: ${bad} line 3: "max_tokens" must be at least 1 (got 0)\n`);
    expect(() => parsePromptsJsonl('{"prompt": "a"}\n{"prompt": "b",}', "p.jsonl")).toThrow(/^p\.jsonl line 2: not valid JSON \(/);
    expect(() => parsePromptsJsonl('["a"]', "p.jsonl")).toThrow('p.jsonl line 1: expected a JSON object like {"prompt": "..."}');
    expect(() => parsePromptsJsonl('{"text": "a"}', "p.jsonl")).toThrow('p.jsonl line 1: unknown key "text" (keys: prompt, max_tokens, temperature, seed)');
    expect(() => parsePromptsJsonl('{"max_tokens": 3}', "p.jsonl")).toThrow('p.jsonl line 1: "prompt" is missing');
    expect(() => parsePromptsJsonl('{"prompt": 7}', "p.jsonl")).toThrow('p.jsonl line 1: "prompt" must be a string (got 7)');
    expect(() => parsePromptsJsonl('{"prompt": "a", "seed": -1}', "p.jsonl")).toThrow('p.jsonl line 1: "seed" must be ≥ 0 (got -1)');
    expect(() => parsePromptsJsonl("\n  \n", "p.jsonl")).toThrow('p.jsonl holds no prompts (one JSON object a line, {"prompt": "..."})');
    expect(parsePromptsJsonl('{"prompt": "a", "temperature": 0.5}\r\n\r\n{"prompt": "b"}', "p.jsonl")).toEqual([
      { prompt: "a", temperature: 0.5, line: 1 },
      { prompt: "b", line: 3 },
    ]);
  });

  it("a prompt longer than the context names its line, before any weight is loaded", () => {
    const long = file("long.jsonl", `{"prompt": "a"}\n{"prompt": ${JSON.stringify("word ".repeat(60))}}\n`);
    const r = runBin(["generate", "--model", model, "--prompts", long, "--context", "32"]);
    expect(r.code).toBe(2);
    expect(r.stderr.trimEnd()).toMatch(new RegExp(`^error: ${long.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")} line 2: the prompt is \\d+ tokens but the context holds 32 \\(raise it with --context, up to 256\\)$`));
  });
});
