import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { requireBuiltBin, runBin } from "./helpers.js";
import { PROMPT, STORY_PREFIX, greedyStory, stories15M } from "./model-fixture.js";

let model = "";
let tmp = "";
beforeAll(async () => {
  requireBuiltBin();
  model = await stories15M();
  tmp = mkdtempSync(join(tmpdir(), "hybridgen-gen-test-"));
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const TIMINGS_LINE = /^prompt: \d+ tokens, [\d.]+ tok\/s \| generated: \d+ tokens, [\d.]+ tok\/s \| finish: \w+ \| device: (cpu|cuda)\/.+$/;

describe("hybridgen generate on stories15M", () => {
  it("greedy 'Once upon a time' prints llama2.c's story exactly (the headline check)", () => {
    // The default model (no --model): what `npm run setup` runs.
    const r = runBin(["generate", "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "256"]);
    expect(r.stderr).not.toMatch(/error/);
    expect(r.code).toBe(0);
    expect(r.stdout.startsWith(STORY_PREFIX)).toBe(true);
    expect(r.stdout).toBe(greedyStory());
    const lines = r.stderr.trimEnd().split("\n");
    expect(lines.at(-1)).toMatch(TIMINGS_LINE);
    expect(lines.some((l) => l.startsWith("loaded "))).toBe(true);
  });

  it("offloading old KV positions (--gpu-kv-budget, --sink-tokens) leaves the greedy story unchanged", () => {
    // Offloaded positions are still attended exactly (logits concatenated in position order,
    // one softmax), so only summation order differs: far below the story's 0.01 logit margin.
    for (const kv of [["--gpu-kv-budget", "17"], ["--gpu-kv-budget", "64", "--sink-tokens", "4"]]) {
      const r = runBin(["generate", "--model", model, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "256", ...kv]);
      expect(r.stderr).toMatch(/KV window/);
      expect(r.code).toBe(0);
      expect(r.stdout).toBe(greedyStory());
    }
  });

  it("is the same story at f16 and bf16 weights for the first sentences", () => {
    for (const dtype of ["f16", "bf16"]) {
      const r = runBin(["generate", "--model", model, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "40", "--dtype", dtype]);
      expect(r.code).toBe(0);
      // Rounding the weights may flip a late near-tie, not the opening.
      expect(r.stdout.startsWith(STORY_PREFIX.slice(0, 60))).toBe(true);
    }
  });

  it("--json prints one result object matching the streamed text", () => {
    const r = runBin(["generate", "--model", model, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "256", "--json", "--threads", "1"]);
    expect(r.code).toBe(0);
    expect(r.stdout.trimEnd().split("\n")).toHaveLength(1);
    const out = JSON.parse(r.stdout);
    expect(out.prompt).toBe(PROMPT);
    expect(PROMPT + out.text + "\n").toBe(greedyStory());
    expect(out.generatedTokens).toBe(out.tokens.length);
    expect(out.threads).toBe(1);
    expect(["eos", "length", "context"]).toContain(out.finishReason);
    expect(out.timings.tokensPerSec).toBeGreaterThan(0);
  });

  it("reads the prompt from stdin and from --prompt-file", () => {
    const want = greedyStory().slice(0, 80);
    const fromStdin = runBin(["generate", "--model", model, "--temperature", "0", "--max-tokens", "24"], { input: PROMPT });
    expect(fromStdin.code).toBe(0);
    expect(fromStdin.stdout.slice(0, 80)).toBe(want);
    const file = join(tmp, "prompt.txt");
    writeFileSync(file, PROMPT);
    const fromFile = runBin(["generate", "--model", model, "--prompt-file", file, "--temperature", "0", "--max-tokens", "24"]);
    expect(fromFile.code).toBe(0);
    expect(fromFile.stdout).toBe(fromStdin.stdout);
  });

  it("--max-tokens bounds the output and --stop ends it before the stop text", () => {
    const short = runBin(["generate", "--model", model, "--prompt", PROMPT, "--temperature", "0", "--max-tokens", "5", "--json"]);
    const out = JSON.parse(short.stdout);
    expect(out.generatedTokens).toBe(5);
    expect(out.finishReason).toBe("length");
    expect(greedyStory().startsWith(PROMPT + out.text)).toBe(true);

    const stopped = runBin(["generate", "--model", model, "--prompt", PROMPT, "--temperature", "0", "--stop", "Lily", "--stop", "zebra"]);
    expect(stopped.code).toBe(0);
    expect(stopped.stdout).toBe("Once upon a time, there was a little girl named \n");
    expect(stopped.stderr).toMatch(/finish: stop/);
  });

  it("sampling is reproducible for a seed and changes with it", () => {
    const args = (seed: string) => ["generate", "--model", model, "--prompt", PROMPT, "--temperature", "1", "--top-p", "0.9", "--seed", seed, "--max-tokens", "60"];
    const a = runBin(args("42"));
    const b = runBin(args("42"));
    const c = runBin(args("43"));
    expect(a.code).toBe(0);
    expect(a.stdout).toBe(b.stdout);
    expect(a.stdout).not.toBe(c.stdout);
    expect(a.stdout.startsWith(PROMPT)).toBe(true);
  });
});
