/**
 * `hybridgen profile-kmin` on a tiny generated Llama: it sweeps K per selector, measures the
 * speculation recall per layer, and writes a profile that core's readHybridProfile returns;
 * every bad flag is one line and exit 2.
 */
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { DummyWeightSource, describeModel, tensorSpecsOf, writeSafetensors } from "@hybridgen/core";
import { HybridOptionsSchema, hybridProfilePath, readHybridProfile } from "@hybridgen/runtime";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bufferedIo } from "../src/io.js";
import { runCli } from "../src/run-cli.js";
import { requireBuiltBin, runBin } from "./helpers.js";
import { stories15M } from "./model-fixture.js";

const LLAMA = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 64, intermediate_size: 128, num_hidden_layers: 3,
  num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 32000, max_position_embeddings: 256, rms_norm_eps: 1e-5,
  rope_theta: 10000, tie_word_embeddings: true, bos_token_id: 1, eos_token_id: 2,
};

let tmp = "", dir = "", cache = "";
beforeAll(async () => {
  requireBuiltBin();
  tmp = mkdtempSync(join(tmpdir(), "hybridgen-profile-kmin-"));
  dir = join(tmp, "tiny-llama");
  cache = join(tmp, "cache");
  mkdirSync(dir);
  const { config, shape } = describeModel(LLAMA);
  const specs = tensorSpecsOf(config, shape);
  const w = new DummyWeightSource(specs, { seed: 3, dtype: "f32" });
  writeSafetensors(join(dir, "model.safetensors"), specs.map((s) => ({ name: s.name, dtype: "f32", shape: s.shape, data: w.get(s.name)!.bytes })));
  writeFileSync(join(dir, "config.json"), JSON.stringify(LLAMA));
  copyFileSync(join(await stories15M(), "tokenizer.json"), join(dir, "tokenizer.json"));
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

async function cli(args: string[]) {
  const io = bufferedIo({ env: { HYBRIDGEN_CACHE: cache } });
  const code = await runCli(args, io);
  return { code, out: io.out, err: io.err };
}

const BASE = ["profile-kmin", "--gpu-kv-budget", "16", "--sink-tokens", "2", "--ks", "4,8,200", "--tokens", "72"];

describe("hybridgen profile-kmin", () => {
  it("writes a profile that readHybridProfile returns, and prints the tables and its path", () => {
    const r = runBin([...BASE, "--model", dir, "--selectors", "topk,streaming,all"], { env: { HYBRIDGEN_CACHE: cache } });
    expect(r.code, r.stderr).toBe(0);
    const p = readHybridProfile(dir, cache)!;
    expect(p).not.toBeNull();
    expect(r.stdout).toContain(`profile: ${hybridProfilePath(dir, cache)}\n`);
    expect(p).toMatchObject({ version: 1, tolerance: 0.99, selector: "topk", gpuKvBudget: 16, sinkTokens: 2, recallThreshold: 0.9, recallMetric: "tokens" });
    expect(p.candidates).toBe(HybridOptionsSchema.parse({}).candidates); // what generate's verified logits choose
    // 72 tokens, a 16-token window: the first step past it evicts, then 72 − 16 − 1 steps have offloaded tokens.
    expect(p.steps).toBe(55);
    expect(Object.keys(p.perSelector)).toEqual(["topk", "streaming", "all"]);
    for (const s of Object.values(p.perSelector)) expect(s.agreement.map(([k]) => k)).toEqual([4, 8, 200]);
    // K = 200 holds every offloaded token (at most 72 − 16 + the eviction block): exact top-K is full attention.
    expect(p.perSelector.topk!.agreement[2]!.slice(1)).toEqual([1, expect.closeTo(0, 6)]);
    expect(p.perSelector.all!.agreement.every(([, top1]) => top1 === 1)).toBe(true);
    expect(p.perSelector.all!.kMin).toBe(4);
    const kMin = p.perSelector.topk!.kMin!;
    expect(p.kMin).toBe(kMin);
    expect(p.perSelector.topk!.agreement.find(([k]) => k === kMin)![1]).toBeGreaterThanOrEqual(0.99);
    expect(p.perSelector.topk!.agreement.filter(([k]) => k < kMin).every(([, top1]) => top1 < 0.99)).toBe(true);
    expect(p.recallK).toBe(kMin);
    expect(p.layerRecall).toHaveLength(3);
    expect(p.layerRecall[0]).toBe(1);
    expect(p.exactLayers).toEqual(p.layerRecall.flatMap((x, l) => (l > 0 && x < 0.9 ? [l] : [])));
    expect(r.stdout).toMatch(/^selector +timing +K=4 +K=8 +K=200 +K_min$/m);
    expect(r.stdout).toMatch(/^topk +post +[\d.]+% /m);
    expect(r.stdout).toMatch(/^layer +K=4 +K=8 +K=200\* +selection$/m);
    expect(r.stdout).toMatch(/^1 +[01]\.\d{3} \/ [01]\.\d{3} /m);
    expect(r.stderr).toMatch(/^streaming \(post\) K=8: top-1 [\d.]+%, mean KL /m);
  });

  it("--json --no-write: one object with the profile and the recall per layer and K, nothing written", async () => {
    const other = join(tmp, "cache-nowrite");
    const io = bufferedIo({ env: { HYBRIDGEN_CACHE: other } });
    const code = await runCli([...BASE, "--model", dir, "--selectors", "topk", "--recall-k", "6", "--recall-threshold", "1", "--recall-metric", "mass", "--candidates", "1", "--json", "--no-write"], io);
    expect(code, io.err).toBe(0);
    const j = JSON.parse(io.out);
    expect(j.path).toBeNull();
    expect(j.profile).toMatchObject({ recallK: 6, recallMetric: "mass", recallThreshold: 1, candidates: 1, selector: "topk" });
    expect(j.recall.ks).toEqual([4, 6, 8, 200]);
    expect(j.recall.tokens).toHaveLength(3);
    expect(j.profile.layerRecall).toEqual(j.recall.tokens.map((r: number[]) => r[1]));
    expect(j.profile.layerMassRecall).toEqual(j.recall.mass.map((r: number[]) => r[1]));
    // Threshold 1: every layer whose q̃ misses any attention mass selects exactly.
    expect(j.profile.exactLayers).toEqual([1, 2].filter((l) => j.profile.layerMassRecall[l] < 1));
    expect(j.profile.exactLayers.length).toBeGreaterThan(0);
    expect(readHybridProfile(dir, other)).toBeNull();
  });

  it("--selectors takes plugin modules (PATH:export) beside registered names; the profile keys them by name", async () => {
    // Inside the app, so the plugin's import of @hybridgen/selectors resolves as an installed one.
    const plugins = mkdtempSync(join(fileURLToPath(new URL(".", import.meta.url)), ".plugins-"));
    try {
      writeFileSync(join(plugins, "newest.ts"), `import { defineSelector } from "@hybridgen/selectors";
export const newest = defineSelector({
  name: "newest-k",
  timings: ["pre"],
  select: ({ offloaded, k }) => ({ kind: "shared", ids: Array.from({ length: k }, (_, i) => offloaded - 1 - i) }),
});
`);
      const io = bufferedIo({ env: { HYBRIDGEN_CACHE: join(tmp, "cache-plugin") } });
      const code = await runCli([...BASE, "--model", dir, "--selectors", `topk,${join(plugins, "newest.ts")}:newest`, "--json", "--no-write"], io);
      expect(code, io.err).toBe(0);
      const j = JSON.parse(io.out);
      expect(Object.keys(j.profile.perSelector).sort()).toEqual(["newest-k", "topk"]);
      // K = 200 covers every offloaded token: any selector then agrees with full attention.
      expect(j.profile.perSelector["newest-k"].agreement.at(-1)[1]).toBe(1);
    } finally {
      rmSync(plugins, { recursive: true, force: true });
    }
  });

  it("has its help", async () => {
    expect((await cli(["profile-kmin", "--help"])).out).toMatch(/^Usage: hybridgen profile-kmin \[options\]/);
    expect((await cli(["help", "profile-kmin"])).out).toMatch(/--tolerance X/);
    expect((await cli(["--help"])).out).toMatch(/hybridgen profile-kmin /);
  });

  it("rejects bad input with one line and exit 2", async () => {
    const short = join(tmp, "short.txt");
    writeFileSync(short, "Once upon a time");
    const jsonl = join(tmp, "p.jsonl");
    writeFileSync(jsonl, `${JSON.stringify({ prompt: "x ".repeat(60) })}\n${JSON.stringify({ prompt: "Once upon a time" })}\n`);
    for (const [args, msg] of [
      [["--model", join(tmp, "nope")], /nope/],
      [["--model", dir, "--tolerance", "0"], /invalid value for --tolerance: "0" must be a number in \(0, 1\]/],
      [["--model", dir, "--tolerance", "1.5"], /--tolerance: "1.5" must be a number in \(0, 1\]/],
      [["--model", dir, "--tolerance", "high"], /--tolerance: "high"/],
      [["--model", dir, "--ks", ","], /--ks needs at least one value/],
      [["--model", dir, "--ks", "8,x"], /invalid value for --ks: "x" is not an integer ≥ 1/],
      [["--model", dir, "--ks", "0"], /--ks: "0" is not an integer ≥ 1/],
      [["--model", dir, "--selectors", "topk,nope"], /unknown selector "nope": not a registered name \(topk, /],
      [["--model", dir, "--text", short], /short\.txt is \d+ tokens: too short for --gpu-kv-budget 32 \(it needs at least 34 tokens/],
      [["--model", dir, "--tokens", "20"], /the built-in text is 20 tokens: too short for --gpu-kv-budget 32/],
      [["--model", dir, "--tokens", "999"], /--tokens 999 exceeds the model's max_position_embeddings \(256\)/],
      [["--model", dir, "--text", short, "--prompts", short], /--text and --prompts are exclusive/],
      [["--model", dir, "--prompts", jsonl], /p\.jsonl line 2 is \d+ tokens: too short for --gpu-kv-budget 32/],
      [["--model", dir, "--text", join(tmp, "missing.txt")], /cannot read text file .*missing\.txt: no such file/],
      [["--model", dir, "--gpu-kv-budget", "8", "--sink-tokens", "8"], /--sink-tokens 8 must be smaller than --gpu-kv-budget 8/],
      [["--model", dir, "--recall-threshold", "2"], /--recall-threshold: "2" must be a number in \[0, 1\]/],
      [["--model", dir, "--recall-metric", "heads"], /--recall-metric: "heads" must be tokens or mass/],
      [["--model", dir, "--candidates", "0"], /--candidates: must be at least 1\n?$/],
      [["--model", dir, "--candidates", "65"], /--candidates: must be ≤ 64\n?$/],
      [["--model", dir, "--bogus"], /unknown option --bogus for hybridgen profile-kmin/],
    ] as const) {
      const r = await cli(["profile-kmin", ...args]);
      expect(r.code, `${args.join(" ")}: ${r.err}`).toBe(2);
      expect(r.err).toMatch(msg);
      expect(r.err.trim().split("\n"), r.err).toHaveLength(1);
    }
  });
});
