/**
 * `hybridgen inspect` (presets and directories) and `--dummy-weights` (presets, and a
 * directory without weights whose greedy tokens must equal core's ReferenceBackend loop over
 * the same deterministic weights, generated in TypeScript there and natively by the CLI).
 */
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { DummyWeightSource, ReferenceBackend, describeModel, loadModel, openModelDir, tensorSpecsOf, writeSafetensors } from "@hybridgen/core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "../src/run-cli.js";
import { bufferedIo } from "../src/io.js";
import { requireBuiltBin, runBin } from "./helpers.js";
import { stories15M } from "./model-fixture.js";

let tmp = "";
let tokenizerJson = "";
beforeAll(async () => {
  requireBuiltBin();
  tokenizerJson = join(await stories15M(), "tokenizer.json");
  tmp = mkdtempSync(join(tmpdir(), "hybridgen-inspect-"));
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

const QWEN = {
  architectures: ["Qwen2ForCausalLM"], model_type: "qwen2", hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
  num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 32000, max_position_embeddings: 256, rms_norm_eps: 1e-6,
  rope_theta: 1000000, tie_word_embeddings: true, use_sliding_window: false, bos_token_id: 1, eos_token_id: 2,
};

async function cli(args: string[]) {
  const io = bufferedIo();
  const code = await runCli(args, io);
  return { code, out: io.out, err: io.err };
}

describe("hybridgen inspect", () => {
  it("reports a preset: parameters, weights, KV per token and for a context × batch", async () => {
    const r = await cli(["inspect", "preset:llama-3.1-8b", "--context", "131072"]);
    expect(r.code).toBe(0);
    expect(r.out).toMatch(/architecture: +LlamaForCausalLM \(llama\): 32 layers, hidden 4096, 32 heads \/ 8 KV heads × 128/);
    expect(r.out).toMatch(/parameters: +8\.030 B \(8,030,261,248; tied embeddings: no\)/);
    expect(r.out).toMatch(/weights: +bf16 14\.96 GiB/);
    expect(r.out).toMatch(/KV per token: +128\.00 KiB in bf16\/f16, 256\.00 KiB in f32/);
    expect(r.out).toMatch(/KV cache: +16\.00 GiB for 131072 positions × batch 1 in bf16/);
    const j = JSON.parse((await cli(["inspect", "preset:qwen2.5-7b", "--context", "4096", "--batch", "4", "--kv-dtype", "f32", "--json"])).out);
    // 28 layers × 4 KV heads × 128 dims × 2 (K, V) × 4 bytes per token
    expect(j).toMatchObject({ architecture: "Qwen2ForCausalLM", parameters: 7_615_616_512, context: 4096, batch: 4, kvDtype: "f32" });
    expect(j.kvCacheBytes).toBe(28 * 4 * 128 * 2 * 4 * 4096 * 4);
    expect((await cli(["inspect", "preset:opt-1.3b", "--json"])).out).toMatch(/"weightBytes":\{"f16":2631516160\}/);
  });

  it("reports a directory from its config and the stored dtypes", async () => {
    const dir = join(tmp, "qwen-f16");
    mkdirSync(dir);
    const { config, shape } = describeModel(QWEN);
    const specs = tensorSpecsOf(config, shape);
    const w = new DummyWeightSource(specs, { seed: 1, dtype: "f16" });
    writeSafetensors(join(dir, "model.safetensors"), specs.map((s) => ({ name: s.name, dtype: "f16", shape: s.shape, data: w.get(s.name)!.bytes })));
    writeFileSync(join(dir, "config.json"), JSON.stringify(QWEN));
    copyFileSync(tokenizerJson, join(dir, "tokenizer.json"));
    const j = JSON.parse((await cli(["inspect", dir, "--json"])).out);
    const params = specs.reduce((a, s) => a + s.shape.reduce((x, y) => x * y, 1), 0);
    expect(j).toMatchObject({ family: "qwen2", parameters: params, weightBytes: { f16: params * 2 }, context: 256, batch: 1 });
    expect(j.kvBytesPerToken.bf16).toBe(2 * 2 * 2 * 16 * 2);
    expect(j.weightsFrom).toBe("checkpoint");
    // Without weights (a config downloaded alone): the numbers, dtype from torch_dtype.
    const bare = join(tmp, "qwen-config-only");
    mkdirSync(bare);
    writeFileSync(join(bare, "config.json"), JSON.stringify({ ...QWEN, torch_dtype: "float16" }));
    const k = JSON.parse((await cli(["inspect", bare, "--json"])).out);
    expect(k).toMatchObject({ parameters: params, weightBytes: { f16: params * 2 }, weightsFrom: "config" });
    writeFileSync(join(bare, "config.json"), "{");
    expect((await cli(["inspect", bare])).err).toMatch(/config\.json: cannot read it as JSON/);
  });

  it("has its help", async () => {
    expect((await cli(["inspect", "--help"])).out).toMatch(/^Usage: hybridgen inspect <model>/);
    expect((await cli(["help", "inspect"])).out).toMatch(/Presets: opt-125m, /);
  });

  it("rejects bad input with one line", async () => {
    for (const [args, msg] of [
      [["inspect"], /takes one model .* got 0/],
      [["inspect", "preset:gpt-9"], /unknown preset "gpt-9" \(presets: opt-125m, /],
      [["inspect", "preset:opt-125m", "--batch", "0"], /--batch: "0" is not a positive integer/],
      [["inspect", "preset:opt-125m", "--kv-dtype", "int8"], /--kv-dtype: must be one of f32, f16, bf16/],
      [["inspect", join(tmp, "nope")], /does not exist/],
      [["inspect", "a", "b"], /got 2/],
    ] as const) {
      const r = await cli([...args]);
      expect(r.code, args.join(" ")).toBe(2);
      expect(r.err).toMatch(msg);
      expect(r.err.trim().split("\n")).toHaveLength(1);
    }
  });
});

describe("--dummy-weights", () => {
  it("runs a preset (meaningless text, reported speed), deterministically", () => {
    const args = ["generate", "--model", "preset:opt-125m", "--dummy-weights", "--prompt", "Hello", "-n", "4", "--temperature", "0", "--context", "64", "--json"];
    const a = runBin(args), b = runBin(args);
    expect(a.code, a.stderr).toBe(0);
    const ja = JSON.parse(a.stdout), jb = JSON.parse(b.stdout);
    expect(ja.generatedTokens).toBe(4);
    expect(ja.tokens).toEqual(jb.tokens);
    expect(a.stderr).toMatch(/loaded preset:opt-125m \(opt, 12 layers, dim 768, dummy bf16 weights\)/);
    expect(a.stderr).toMatch(/generated: 4 tokens, [\d.]+ tok\/s/);
  });

  it("a preset needs --dummy-weights", () => {
    const r = runBin(["generate", "--model", "preset:llama-3.2-1b", "--prompt", "x"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe("error: preset:llama-3.2-1b is a preset without weights: add --dummy-weights to run it with random ones\n");
  });

  it("on a directory without weights: natively generated weights give the reference's greedy tokens", async () => {
    const dir = join(tmp, "qwen-noweights");
    mkdirSync(dir);
    writeFileSync(join(dir, "config.json"), JSON.stringify(QWEN));
    copyFileSync(tokenizerJson, join(dir, "tokenizer.json"));
    const r = runBin(["generate", "--model", dir, "--dummy-weights", "--dtype", "f32", "--prompt", "The little dog", "-n", "10", "--temperature", "0", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    const got = JSON.parse(r.stdout).tokens as number[];

    using files = openModelDir(dir, { dummyWeights: { seed: 0, dtype: "f32" } }); // TypeScript fill
    using backend = new ReferenceBackend();
    using model = loadModel(files, backend, { maxContext: 64 });
    const ids = files.tokenizer.encode("The little dog");
    model.step(Int32Array.from(ids), 0);
    const want: number[] = [];
    for (let i = 0; i < 10; i++) {
      want.push(model.argmaxLogits());
      model.step(Int32Array.of(want[i]), ids.length + i);
    }
    expect(got).toEqual(want);
  });
});
