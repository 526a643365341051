/**
 * The architecture registry, presets and model directories of every family: selection from
 * config.json, per-family schemas and their one-line errors, parameter counts of the presets
 * against the published figures, checkpoints in f16/bf16/sharded layouts giving the same
 * logits as the in-memory weights, dummy weights, and the bad-input errors of loading.
 */
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import {
  ByteTokenizer, DummyWeightSource, LlamaModel, OptModel, PRESET_NAMES, ReferenceBackend, SUPPORTED_ARCHITECTURES,
  describeModel, familyOf, kvCacheBytes, loadModel, modelInfo, openModelDir, openPreset, presetConfig, tensorSpecsOf, writeSafetensors,
  type DType, type ModelFiles, type SafetensorsTensor,
} from "../src/index.js";
import { removeTempDirs, tempDir } from "./model-io-fixtures.js";
import { errorMessage } from "./error-helpers.js";
import { PARITY_CASES, promptIds } from "./parity/cases.js";

afterAll(removeTempDirs);

/** Published parameter counts (Hugging Face model cards / num_parameters()). */
const PUBLISHED: Record<string, number> = {
  "opt-125m": 125_239_296, "opt-350m": 331_196_416, "opt-1.3b": 1_315_758_080, "opt-2.7b": 2_651_596_800, "opt-6.7b": 6_658_473_984,
  "opt-13b": 12_853_473_280, "llama-3.2-1b": 1_235_814_400, "llama-3.2-3b": 3_212_749_824, "llama-3.1-8b": 8_030_261_248,
  "qwen2.5-1.5b": 1_543_714_304, "qwen2.5-3b": 3_085_938_688, "qwen2.5-7b": 7_615_616_512, "qwen2.5-14b": 14_770_033_664,
};

const caseByName = (name: string) => PARITY_CASES.find((c) => c.name === name)!;
/** A minimal SentencePiece-style tokenizer.json (6 tokens), enough for openModelDir. */
const TOKENIZER = {
  added_tokens: [{ id: 0, content: "<unk>", special: true }, { id: 1, content: "<s>", special: true }, { id: 2, content: "</s>", special: true }],
  normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" }, { type: "Replace", pattern: { String: " " }, content: "▁" }] },
  model: { type: "BPE", unk_token: "<unk>", byte_fallback: false, vocab: { "<unk>": 0, "<s>": 1, "</s>": 2, "▁": 3, a: 4, "▁a": 5 }, merges: [["▁", "a"]] },
};

/** Writes case `name` as a model directory with weights stored in `dtype`, sharded in two if asked. */
function writeDir(name: string, dtype: DType, sharded = false, edit?: (tensors: SafetensorsTensor[], config: Record<string, unknown>) => void): string {
  const c = caseByName(name);
  const { config, shape } = describeModel(c.config);
  const specs = tensorSpecsOf(config, shape);
  const src = new DummyWeightSource(specs, { seed: c.seed, dtype });
  const tensors: SafetensorsTensor[] = specs.map((s) => ({ name: s.name, dtype, shape: s.shape, data: src.get(s.name)!.bytes }));
  const cfg = structuredClone(c.config);
  edit?.(tensors, cfg);
  const dir = join(tempDir("hg-arch-"), name);
  mkdirSync(dir);
  writeFileSync(join(dir, "config.json"), JSON.stringify(cfg));
  writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(TOKENIZER));
  if (!sharded) writeSafetensors(join(dir, "model.safetensors"), tensors);
  else {
    const half = Math.ceil(tensors.length / 2);
    const parts = [tensors.slice(0, half), tensors.slice(half)];
    const weightMap: Record<string, string> = {};
    parts.forEach((p, i) => {
      const file = `model-0000${i + 1}-of-00002.safetensors`;
      writeSafetensors(join(dir, file), p);
      for (const t of p) weightMap[t.name] = file;
    });
    writeFileSync(join(dir, "model.safetensors.index.json"), JSON.stringify({ metadata: {}, weight_map: weightMap }));
  }
  return dir;
}

/** Logits after the case's prompt, then after 3 greedy steps, for `files`. */
function run(files: ModelFiles, weightDtype?: DType): Float32Array[] {
  using backend = new ReferenceBackend();
  using model = loadModel(files, backend, { maxContext: 80, prefillBlock: 32, ...(weightDtype ? { weightDtype } : {}) });
  const ids = promptIds(caseByName(files.dir.split("/").pop()!)).slice(0, 40);
  const out = [model.forward(Int32Array.from(ids), 0)];
  for (let s = 0; s < 3; s++) out.push(model.forward(Int32Array.of(model.argmaxLogits()), ids.length + s));
  return out;
}

function inMemory(name: string, dtype: DType): ModelFiles {
  const c = caseByName(name);
  const { config, shape } = describeModel(c.config);
  const weights = new DummyWeightSource(tensorSpecsOf(config, shape), { seed: c.seed, dtype });
  return { dir: name, config, shape, weights, tokenizer: new ByteTokenizer(256), close() {}, [Symbol.dispose]() {} };
}

describe("architecture registry", () => {
  it("picks the family from architectures, else model_type, and lists the supported ones otherwise", () => {
    expect(SUPPORTED_ARCHITECTURES).toEqual(["LlamaForCausalLM", "Qwen2ForCausalLM", "OPTForCausalLM"]);
    expect(familyOf({ architectures: ["Qwen2ForCausalLM"], model_type: "llama" }).family).toBe("qwen2");
    expect(familyOf({ model_type: "opt" }).family).toBe("opt");
    expect(errorMessage(() => familyOf({ architectures: ["MambaForCausalLM"] }))).toBe(
      'config.json: unsupported architecture "MambaForCausalLM" (supported: LlamaForCausalLM, Qwen2ForCausalLM, OPTForCausalLM)',
    );
    expect(errorMessage(() => familyOf({ model_type: "gpt2" }))).toMatch(/unsupported model_type "gpt2" \(supported: LlamaForCausalLM, /);
    expect(errorMessage(() => familyOf({ hidden_size: 8 }))).toMatch(/no architectures or model_type .*supported: /);
    expect(errorMessage(() => familyOf([1]))).toMatch(/not a JSON object/);
  });

  it("validates each family's config with its schema: key path and value in one line", () => {
    const opt = caseByName("opt-prenorm").config, qwen = caseByName("qwen2-tied").config;
    expect(errorMessage(() => describeModel({ ...opt, ffn_dim: "big" }, "x/config.json"))).toMatch(/^x\/config\.json: ffn_dim: .*\(got "big"\)$/);
    expect(errorMessage(() => describeModel({ ...opt, activation_function: "swish" }))).toMatch(/activation_function: .*\(got "swish"\)/);
    expect(errorMessage(() => describeModel({ ...opt, enable_bias: false }))).toMatch(/enable_bias: .*\(got false\)/);
    expect(errorMessage(() => describeModel({ ...opt, hidden_size: 130 }))).toMatch(/hidden_size: 130 is not a multiple of num_attention_heads 4/);
    const { ffn_dim: _f, ...noFfn } = opt;
    expect(errorMessage(() => describeModel(noFfn))).toMatch(/ffn_dim: .*\(missing\)/);
    expect(errorMessage(() => describeModel({ ...qwen, use_sliding_window: true }))).toMatch(/use_sliding_window: sliding-window attention is not supported \(got true; window 4096\)/);
    expect(errorMessage(() => describeModel({ ...qwen, num_key_value_heads: 3 }))).toMatch(/num_key_value_heads: .*\(got 3\)/);
  });

  it("OPT resolves positions, projection and norm placement from its config", () => {
    const { shape } = describeModel(caseByName("opt-350m-style").config);
    expect(shape).toMatchObject({ architecture: "opt", hiddenSize: 128, intermediateSize: 384, kvHeads: 4, headDim: 32, ropeTheta: 0, tieEmbeddings: true, eosTokenIds: [2] });
  });
});

describe("presets", () => {
  it("cover the paper's models, with the published parameter counts", () => {
    for (const name of ["opt-1.3b", "opt-2.7b", "opt-6.7b", "opt-13b", "llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b", "qwen2.5-14b"]) {
      expect(PRESET_NAMES).toContain(name);
    }
    for (const name of PRESET_NAMES) {
      const { config, shape } = describeModel(presetConfig(name));
      expect(modelInfo(config, shape).parameters, name).toBe(PUBLISHED[name]);
    }
    expect(errorMessage(() => presetConfig("gpt-5"))).toMatch(/unknown preset "gpt-5" \(presets: opt-125m, /);
  });

  it("report KV bytes: Llama-3.1-8B holds 128 KiB per token in bf16, 16 GiB at 128K", () => {
    const { config, shape } = describeModel(presetConfig("llama-3.1-8b"));
    const info = modelInfo(config, shape);
    expect(info.kvBytesPerToken).toEqual({ f32: 262144, f16: 131072, bf16: 131072 });
    expect(kvCacheBytes(shape, "bf16", 131072)).toBe(16 * 2 ** 30);
    expect(info.weightBytes).toEqual({ bf16: 2 * 8_030_261_248 });
    expect(info).toMatchObject({ architecture: "LlamaForCausalLM", layers: 32, kvHeads: 8, headDim: 128, tiedEmbeddings: false });
  });

  it("open with dummy weights of the right shapes, generated only when read, deterministic by seed", () => {
    using files = openPreset("opt-125m", { seed: 3 });
    expect(files.dir).toBe("preset:opt-125m");
    const w = files.weights.get("model.decoder.layers.0.fc1.weight")!;
    expect(w.dtype).toBe("bf16");
    expect(w.shape).toEqual([3072, 768]);
    const again = openPreset("opt-125m", { seed: 3 }).weights.get("model.decoder.layers.0.fc1.weight")!;
    const other = openPreset("opt-125m", { seed: 4 }).weights.get("model.decoder.layers.0.fc1.weight")!;
    expect(Buffer.compare(Buffer.from(w.bytes), Buffer.from(again.bytes))).toBe(0);
    expect(Buffer.compare(Buffer.from(w.bytes), Buffer.from(other.bytes))).not.toBe(0);
    expect(files.weights.get("nope")).toBeUndefined();
    expect(files.weights.names().length).toBe(tensorSpecsOf(files.config, files.shape).length);
  });
});

describe("model directories of every family", () => {
  for (const name of ["llama3-scaled-bias-tied", "qwen2-untied", "opt-350m-style"]) {
    it(`${name}: bf16, f16 and sharded checkpoints give the logits of the same weights in memory`, () => {
      for (const [dtype, sharded] of [["bf16", false], ["f16", true], ["f32", true]] as const) {
        using files = openModelDir(writeDir(name, dtype, sharded));
        expect(files.shape.architecture).toBe(name.startsWith("opt") ? "opt" : name.startsWith("qwen") ? "qwen2" : "llama");
        const got = run(files);
        const want = run(inMemory(name, dtype));
        got.forEach((g, i) => expect(Array.from(g)).toEqual(Array.from(want[i])));
      }
    });
  }

  it("loads the model class of the family", () => {
    using backend = new ReferenceBackend();
    using opt = loadModel(inMemory("opt-prenorm", "f32"), backend, { maxContext: 16 });
    using qwen = loadModel(inMemory("qwen2-tied", "f32"), backend, { maxContext: 16 });
    expect(opt).toBeInstanceOf(OptModel);
    expect(qwen).toBeInstanceOf(LlamaModel);
    expect(errorMessage(() => OptModel.load(inMemory("qwen2-tied", "f32"), backend))).toMatch(/OptModel cannot run the qwen2 architecture/);
    expect(errorMessage(() => LlamaModel.load(inMemory("opt-prenorm", "f32"), backend))).toMatch(/LlamaModel cannot run the opt architecture/);
  });

  it("uses dummy weights for a directory without weights", () => {
    const dir = writeDir("qwen2-tied", "f32");
    using files = openModelDir(dir, { dummyWeights: { seed: caseByName("qwen2-tied").seed, dtype: "f32" } });
    expect(run(files).map((a) => Array.from(a))).toEqual(run(inMemory("qwen2-tied", "f32")).map((a) => Array.from(a)));
  });

  it("names a missing tensor, a tensor of the wrong shape, and a dtype it cannot read", () => {
    using backend = new ReferenceBackend();
    const load = (dir: string) => {
      using files = openModelDir(dir);
      loadModel(files, backend, { maxContext: 16 }).close();
    };
    const drop = writeDir("opt-prenorm", "f32", false, (t) => t.splice(t.findIndex((x) => x.name === "model.decoder.layers.1.fc2.bias"), 1));
    expect(errorMessage(() => load(drop))).toBe("missing tensor model.decoder.layers.1.fc2.bias in the model weights");
    const reshaped = writeDir("qwen2-tied", "f32", false, (t) => {
      const i = t.findIndex((x) => x.name === "model.layers.0.self_attn.k_proj.bias");
      t[i] = { ...t[i], shape: [2, 32] };
    });
    expect(errorMessage(() => load(reshaped))).toBe("tensor model.layers.0.self_attn.k_proj.bias has shape [2, 32], expected [64]");
    const dir = writeDir("llama-gqa", "f32");
    const bytes = new Uint8Array(8 + 80);
    const header = new TextEncoder().encode(JSON.stringify({ "model.norm.weight": { dtype: "I8", shape: [8], data_offsets: [0, 8] } }).padEnd(80, " "));
    new DataView(bytes.buffer).setBigUint64(0, 80n, true);
    bytes.set(header, 8);
    writeFileSync(join(dir, "model.safetensors"), Buffer.concat([Buffer.from(bytes), Buffer.alloc(8)]));
    expect(errorMessage(() => openModelDir(dir))).toMatch(/unsupported dtype I8 for tensor model\.norm\.weight \(supported: F32, F16, BF16\)/);
  });

  it("rope scaling: dynamic equals default within max_position_embeddings; unknown types are named", () => {
    const c = caseByName("llama-gqa");
    const withScaling = (rope_scaling: unknown): ModelFiles => {
      const { config, shape } = describeModel({ ...c.config, rope_scaling });
      const weights = new DummyWeightSource(tensorSpecsOf(config, shape), { seed: c.seed, dtype: "f32" });
      return { dir: c.name, config, shape, weights, tokenizer: new ByteTokenizer(256), close() {}, [Symbol.dispose]() {} };
    };
    const dynamic = run(withScaling({ rope_type: "dynamic", factor: 4 })).map((a) => Array.from(a));
    expect(dynamic).toEqual(run(inMemory("llama-gqa", "f32")).map((a) => Array.from(a)));
    using backend = new ReferenceBackend();
    expect(errorMessage(() => loadModel(withScaling({ rope_type: "yarn", factor: 4 }), backend))).toBe('unsupported rope scaling type "yarn"');
  });

  it("names an unknown architecture in a directory", () => {
    const dir = writeDir("llama-gqa", "f32", false, (_t, cfg) => (cfg.architectures = ["FalconForCausalLM"]));
    expect(errorMessage(() => openModelDir(dir))).toMatch(/config\.json: unsupported architecture "FalconForCausalLM" \(supported: LlamaForCausalLM, Qwen2ForCausalLM, OPTForCausalLM\)/);
  });
});
