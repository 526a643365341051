import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensureStories15M, openModelDir, writeSafetensors, type SafetensorsTensor } from "../src/index.js";
import { bytesOf, randomF32, rng, tempDir, removeTempDirs } from "./model-io-fixtures.js";
import { errorMessage } from "./error-helpers.js";

afterAll(removeTempDirs);

const config = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 8, intermediate_size: 16,
  num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, vocab_size: 8,
  max_position_embeddings: 32, rms_norm_eps: 1e-5, bos_token_id: 1, eos_token_id: 2,
};
const tokenizer = {
  added_tokens: [
    { id: 0, content: "<unk>", special: true }, { id: 1, content: "<s>", special: true }, { id: 2, content: "</s>", special: true },
  ],
  normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" }, { type: "Replace", pattern: { String: " " }, content: "▁" }] },
  model: { type: "BPE", unk_token: "<unk>", byte_fallback: false, vocab: { "<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, a: 4, "▁a": 5 }, merges: [["▁", "a"]] },
};

const r = rng(5);
const tensor = (name: string, shape: number[]): SafetensorsTensor => ({
  name, dtype: "f32", shape, data: bytesOf(randomF32(r, shape.reduce((a, b) => a * b, 1))),
});

/** A small valid model directory; `edit` may change or delete its files afterwards. */
function makeDir(edit?: (dir: string) => void): string {
  const dir = join(tempDir("hg-md-"), "model");
  mkdirSync(dir);
  writeFileSync(join(dir, "config.json"), JSON.stringify(config));
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tokenizer));
  writeSafetensors(join(dir, "model.safetensors"), [tensor("model.embed_tokens.weight", [8, 8]), tensor("model.norm.weight", [8])]);
  edit?.(dir);
  return dir;
}

describe("openModelDir", () => {
  it("opens config, weights and tokenizer, merging generation_config eos ids", () => {
    const dir = makeDir((d) => writeFileSync(join(d, "generation_config.json"), JSON.stringify({ eos_token_id: [2, 1, 2] })));
    const m = openModelDir(dir);
    expect(m.dir).toBe(dir);
    expect(m.shape).toMatchObject({ hiddenSize: 8, heads: 2, kvHeads: 1, headDim: 4, vocabSize: 8, bosTokenId: 1 });
    expect(m.shape.eosTokenIds).toEqual([2, 1]);
    expect(m.weights.names().sort()).toEqual(["model.embed_tokens.weight", "model.norm.weight"]);
    expect(m.weights.get("model.norm.weight")!.shape).toEqual([8]);
    expect(m.tokenizer.encode("a a")).toEqual([1, 5, 5]);
    m.close();
    expect(() => m.weights.get("model.norm.weight")).toThrow(/after close/);
    m.close(); // idempotent
  });

  it("reads sharded safetensors through the index", () => {
    const emb = tensor("model.embed_tokens.weight", [8, 8]);
    const norm = tensor("model.norm.weight", [8]);
    const dir = makeDir((d) => {
      rmSync(join(d, "model.safetensors"));
      writeSafetensors(join(d, "model-00001-of-00002.safetensors"), [emb]);
      writeSafetensors(join(d, "model-00002-of-00002.safetensors"), [norm]);
      writeFileSync(join(d, "model.safetensors.index.json"), JSON.stringify({
        metadata: { total_size: 288 },
        weight_map: { "model.embed_tokens.weight": "model-00001-of-00002.safetensors", "model.norm.weight": "model-00002-of-00002.safetensors" },
      }));
    });
    using m = openModelDir(dir);
    expect(m.weights.names().sort()).toEqual(["model.embed_tokens.weight", "model.norm.weight"]);
    expect(Array.from(m.weights.get("model.embed_tokens.weight")!.bytes)).toEqual(Array.from(emb.data));
    expect(Array.from(m.weights.get("model.norm.weight")!.bytes)).toEqual(Array.from(norm.data));
    expect(m.weights.get("lm_head.weight")).toBeUndefined();
  });

  it("names a missing or wrong directory and missing files", () => {
    const root = tempDir("hg-md-");
    expect(errorMessage(() => openModelDir(join(root, "nope")))).toMatch(/model directory .*nope does not exist/);
    writeFileSync(join(root, "file"), "x");
    expect(errorMessage(() => openModelDir(join(root, "file")))).toMatch(/file is not a directory/);
    expect(errorMessage(() => openModelDir(makeDir((d) => rmSync(join(d, "config.json")))))).toMatch(/no config\.json/);
    expect(errorMessage(() => openModelDir(makeDir((d) => rmSync(join(d, "tokenizer.json")))))).toMatch(/no tokenizer\.json/);
    expect(errorMessage(() => openModelDir(makeDir((d) => rmSync(join(d, "model.safetensors")))))).toMatch(/no model\.safetensors or model\.safetensors\.index\.json/);
  });

  it("reports config.json problems on one line with the key path and value", () => {
    const bad = (c: unknown) => makeDir((d) => writeFileSync(join(d, "config.json"), typeof c === "string" ? c : JSON.stringify(c)));
    expect(errorMessage(() => openModelDir(bad("{oops")))).toMatch(/config\.json: not valid JSON/);
    const e1 = errorMessage(() => openModelDir(bad({ ...config, hidden_size: "big" })));
    expect(e1).toMatch(/config\.json: hidden_size: .*\(got "big"\)/);
    const { num_hidden_layers: _drop, ...missing } = config;
    expect(errorMessage(() => openModelDir(bad(missing)))).toMatch(/config\.json: num_hidden_layers: .*\(missing\)/);
    expect(errorMessage(() => openModelDir(bad({ ...config, num_key_value_heads: 3 })))).toMatch(/num_key_value_heads: num_attention_heads must be a multiple of num_key_value_heads \(got 3\)/);
    expect(errorMessage(() => openModelDir(bad({ ...config, rope_scaling: { factor: -2 } })))).toMatch(/rope_scaling\.factor: .*\(got -2\)/);
  });

  it("rejects missing shards, misplaced tensors, and a tokenizer larger than the model's vocab", () => {
    const sharded = (map: Record<string, string>, files: Record<string, SafetensorsTensor[]>) =>
      makeDir((d) => {
        rmSync(join(d, "model.safetensors"));
        for (const [f, ts] of Object.entries(files)) writeSafetensors(join(d, f), ts);
        writeFileSync(join(d, "model.safetensors.index.json"), JSON.stringify({ weight_map: map }));
      });
    const missing = sharded({ "model.norm.weight": "model-00002-of-00002.safetensors" }, {});
    expect(errorMessage(() => openModelDir(missing))).toMatch(/shard model-00002-of-00002\.safetensors \(holding model\.norm\.weight\) is missing/);
    const misplaced = sharded({ "model.norm.weight": "a.safetensors" }, { "a.safetensors": [tensor("other", [2])] });
    expect(errorMessage(() => openModelDir(misplaced))).toMatch(/tensor model\.norm\.weight is not in its shard a\.safetensors/);
    const noMap = makeDir((d) => {
      rmSync(join(d, "model.safetensors"));
      writeFileSync(join(d, "model.safetensors.index.json"), "{}");
    });
    expect(errorMessage(() => openModelDir(noMap))).toMatch(/no weight_map/);
    const small = makeDir((d) => writeFileSync(join(d, "config.json"), JSON.stringify({ ...config, vocab_size: 4 })));
    expect(errorMessage(() => openModelDir(small))).toMatch(/tokenizer\.json has 6 tokens but config\.json vocab_size is 4/);
    const badWeights = makeDir((d) => writeFileSync(join(d, "model.safetensors"), "garbage!garbage!"));
    expect(errorMessage(() => openModelDir(badWeights))).toMatch(/model\.safetensors: header length .* exceeds the file/);
  });
});

describe("openModelDir on the converted stories15M", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await ensureStories15M();
  }, 600_000);

  it("opens with the Llama shape, both stop ids and the tokenizer", () => {
    using m = openModelDir(dir);
    expect(m.shape).toMatchObject({ architecture: "llama", hiddenSize: 288, intermediateSize: 768, layers: 6, heads: 6, kvHeads: 6, headDim: 48, vocabSize: 32000, maxPositions: 256, normEps: 1e-5, ropeTheta: 10000, tieEmbeddings: true, bosTokenId: 1 });
    expect(m.shape.eosTokenIds).toEqual([2, 1]);
    expect(m.weights.names().length).toBe(56);
    expect(m.tokenizer.encode("Once upon a time")).toEqual([1, 9038, 2501, 263, 931]);
    expect(m.tokenizer.eosId).toBe(2);
  });
});
