/**
 * `--model` with a checkpoint of each architecture family (Llama GQA, Qwen2, OPT): small
 * random-weight models written to temp dirs. The built CLI (native CPU backend) must produce
 * the same tokens as a plain decode loop over core's ReferenceBackend (TypeScript, f64
 * accumulation) on the same files. Tokens are *sampled* at temperature 1 with a fixed seed
 * (core's Sampler on both sides), so every step depends on the whole distribution, not just
 * its argmax: tiny random models tend to repeat one greedy token, which would prove little.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ReferenceBackend, Sampler, describeModel, loadModel, openModelDir } from "@hybridgen/core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { requireBuiltBin, runBin } from "./helpers.js";
import { stories15M } from "./model-fixture.js";
import { writeTinyCheckpoint } from "./tiny-checkpoint.js";

const VOCAB = 32000; // the stories15M tokenizer is reused, so the vocab matches it
const STEPS = 12;
const PROMPT = "The little dog ran to the park";
const SAMPLING = { temperature: 1, topK: 0, topP: 1, repetitionPenalty: 1, seed: 2024 };

const FAMILIES: { name: string; seed: number; config: Record<string, unknown> }[] = [
  {
    name: "llama-gqa",
    seed: 101,
    config: {
      architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 64, intermediate_size: 160, num_hidden_layers: 2,
      num_attention_heads: 4, num_key_value_heads: 2, vocab_size: VOCAB, max_position_embeddings: 128, rms_norm_eps: 1e-5,
      rope_theta: 10000, tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2,
    },
  },
  {
    name: "qwen2",
    seed: 102,
    config: {
      architectures: ["Qwen2ForCausalLM"], model_type: "qwen2", hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
      num_attention_heads: 4, num_key_value_heads: 2, vocab_size: VOCAB, max_position_embeddings: 128, rms_norm_eps: 1e-6,
      rope_theta: 1000000, tie_word_embeddings: false, use_sliding_window: false, bos_token_id: 1, eos_token_id: 2,
    },
  },
  {
    name: "opt",
    seed: 103,
    config: {
      architectures: ["OPTForCausalLM"], model_type: "opt", hidden_size: 64, ffn_dim: 128, num_hidden_layers: 2,
      num_attention_heads: 4, vocab_size: VOCAB, max_position_embeddings: 128, do_layer_norm_before: true,
      word_embed_proj_dim: 64, activation_function: "relu", tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2, pad_token_id: 0,
    },
  },
];

let tmp = "";
let tokenizerJson = "";
beforeAll(async () => {
  requireBuiltBin();
  tokenizerJson = join(await stories15M(), "tokenizer.json");
  tmp = mkdtempSync(join(tmpdir(), "hybridgen-families-"));
});
afterAll(() => rmSync(tmp, { recursive: true, force: true }));

function writeCheckpoint(f: (typeof FAMILIES)[number], extraFiles: Record<string, string> = {}): string {
  return writeTinyCheckpoint(join(tmp, f.name + (Object.keys(extraFiles).length ? "-extra" : "")), f.config, f.seed, tokenizerJson, extraFiles);
}

/** The decode loop written out by hand on the ReferenceBackend. */
function referenceTokens(dir: string): number[] {
  using files = openModelDir(dir);
  using backend = new ReferenceBackend();
  using model = loadModel(files, backend, {});
  const eos = new Set(files.shape.eosTokenIds);
  const prompt = files.tokenizer.encode(PROMPT);
  const sampler = new Sampler(files.shape.vocabSize, SAMPLING);
  sampler.observeAll(prompt);
  let ids = Int32Array.from(prompt);
  let pos = 0;
  const tokens: number[] = [];
  while (tokens.length < STEPS) {
    const logits = model.forward(ids, pos);
    pos += ids.length;
    const id = sampler.sample(logits);
    if (eos.has(id)) break;
    sampler.observe(id);
    tokens.push(id);
    ids = Int32Array.of(id);
  }
  return tokens;
}

describe("--model with each architecture family", () => {
  for (const f of FAMILIES) {
    it(`${f.name}: the CLI's sampled tokens equal a ReferenceBackend loop`, () => {
      const dir = writeCheckpoint(f);
      const ref = referenceTokens(dir);
      expect(new Set(ref).size, "a varied sequence").toBeGreaterThan(STEPS / 2);
      const r = runBin([
        "generate", "--model", dir, "--prompt", PROMPT, "--max-tokens", String(STEPS), "--json",
        "--temperature", "1", "--top-k", "0", "--top-p", "1", "--seed", String(SAMPLING.seed),
      ]);
      expect(r.code, r.stderr).toBe(0);
      expect(JSON.parse(r.stdout).tokens).toEqual(ref);
      expect(r.stderr).toContain(`(${describeModel(f.config).shape.architecture},`);
    });
  }
});

describe("--chat", () => {
  // A template with no special tokens, so the expected prompt can be written out by hand.
  const TEMPLATE =
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}";

  it("renders the prompt through the model's chat template and prints only the reply", () => {
    const dir = writeCheckpoint(FAMILIES[0]!, { "tokenizer_config.json": JSON.stringify({ chat_template: TEMPLATE }) });
    const args = ["generate", "--model", dir, "--chat", "--system", "Be brief.", "--prompt", "Tell me a story", "-t", "0", "-n", "8"];
    const r = runBin([...args, "--json"]);
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout);
    const expected = "[system] Be brief.\n[user] Tell me a story\n[assistant] ";
    expect(out.prompt).toBe(expected);
    using files = openModelDir(dir);
    expect(out.promptTokens).toBe(files.tokenizer.encode(expected, { addBos: false }).length);

    const streamed = runBin(args);
    expect(streamed.code).toBe(0);
    expect(streamed.stdout).toBe(`${out.text}\n`); // no echo of the rendered prompt
  });

  it("is a one-line error for a model without a chat template", async () => {
    const r = runBin(["generate", "--model", await stories15M(), "--chat", "--prompt", "hi"]);
    expect(r.code).not.toBe(0);
    expect(r.stdout).toBe("");
    expect(r.stderr).toMatch(/^error: .*has no chat template.*drop --chat\n$/);
  });
});
