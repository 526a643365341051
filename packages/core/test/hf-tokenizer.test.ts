/**
 * Tokenizers from real tokenizer.json files (GPT-2 and Qwen2.5, shipped by @lenml npm
 * packages) against ids from the Rust `tokenizers` library and chat prompts rendered by
 * transformers' apply_chat_template (fixtures/parity/tokenizer-refs.json, made by
 * parity/make_refs.py), plus round trips on random text and the streaming decode.
 */
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, describe, expect, it } from "vitest";
import { HfTokenizer, loadTokenizerFiles, type ChatRenderer } from "../src/index.js";
import { removeTempDirs, rng, tempDir } from "./model-io-fixtures.js";
import { errorMessage } from "./error-helpers.js";
import { CHAT_CASES, TOKENIZER_STRINGS } from "./parity/tokenizer-cases.js";

afterAll(removeTempDirs);

const require = createRequire(import.meta.url);
const modelsDir = (pkg: string) => join(dirname(require.resolve(`@lenml/${pkg}/package.json`)), "models");
const refs = JSON.parse(readFileSync(fileURLToPath(new URL("./fixtures/parity/tokenizer-refs.json", import.meta.url)), "utf8")) as Record<
  string,
  { ids: number[][]; auto_ids: number[][]; decoded: string[]; chats?: string[] }
>;

function streamDecode(tok: HfTokenizer, ids: number[]): string {
  const dec = new TextDecoder("utf-8");
  let out = "", prev: number | undefined;
  for (const id of ids) {
    out += dec.decode(tok.decodeBytes(id, prev), { stream: true });
    prev = id;
  }
  return out + dec.decode();
}

/** Random text mixing ASCII words, whitespace runs, digits, accents, CJK and emoji. */
function randomText(r: () => number, len: number): string {
  const pools = ["the", " quick", "Brown", "  ", "\n", "\t", "42", "3.5", "é", "ß", "日本", "中文", "🦙", "👩‍💻", "!?", "'s", "Ω", " "];
  let s = "";
  while (s.length < len) s += pools[Math.floor(r() * pools.length)];
  return s;
}

for (const [pkg, key] of [["tokenizer-gpt2", "gpt2"], ["tokenizer-qwen2_5", "qwen2_5"]] as const) {
  describe(`HfTokenizer: ${key}`, () => {
    const dir = modelsDir(pkg);
    const files = loadTokenizerFiles(dir);
    const tok = files.tokenizer as HfTokenizer;
    const ref = refs[key];

    it("is the library-backed tokenizer with the vocabulary of the file", () => {
      expect(tok).toBeInstanceOf(HfTokenizer);
      expect(tok.vocabSize).toBe(key === "gpt2" ? 50257 : 151665);
      expect(tok.bosId).toBeNull(); // neither adds a BOS (transformers agrees: auto_ids = ids)
    });

    it("encodes to the reference ids (Rust tokenizers and transformers)", () => {
      TOKENIZER_STRINGS.forEach((s, i) => {
        expect(tok.encode(s), JSON.stringify(s)).toEqual(ref.ids[i]);
        expect(tok.encode(s), JSON.stringify(s)).toEqual(ref.auto_ids[i]);
      });
      expect(tok.encode("Hello world")).toEqual(key === "gpt2" ? [15496, 995] : [9707, 1879]);
    });

    it("decodes as transformers does (special tokens skipped), whole and streamed", () => {
      TOKENIZER_STRINGS.forEach((s, i) => {
        expect(tok.decode(ref.ids[i])).toBe(ref.decoded[i]);
        expect(streamDecode(tok, ref.ids[i])).toBe(ref.decoded[i]);
      });
    });

    it("round-trips random text, and streams it byte-exact", () => {
      const r = rng(key === "gpt2" ? 7 : 8);
      for (let t = 0; t < 40; t++) {
        const text = randomText(r, 5 + Math.floor(r() * 80));
        const ids = tok.encode(text);
        expect(tok.decode(ids)).toBe(text);
        expect(streamDecode(tok, ids)).toBe(text);
      }
    });

    it("stops at the tokenizer_config eos token", () => {
      expect(files.eosId).toBe(key === "gpt2" ? 50256 : 151645);
    });
  });
}

describe("chat templates", () => {
  it("renders Qwen2.5's template as transformers' apply_chat_template", () => {
    const { chatTemplate } = loadTokenizerFiles(modelsDir("tokenizer-qwen2_5"));
    const chat = chatTemplate as ChatRenderer;
    expect(chat).toBeTruthy();
    CHAT_CASES.forEach((c, i) => expect(chat.render(c.messages)).toBe(refs.qwen2_5.chats![i]));
  });

  it("has none for GPT-2, and checks messages", () => {
    expect(loadTokenizerFiles(modelsDir("tokenizer-gpt2")).chatTemplate).toBeNull();
    const { chatTemplate } = loadTokenizerFiles(modelsDir("tokenizer-qwen2_5"));
    expect(() => chatTemplate!.render([])).toThrow(/at least one message/);
    expect(() => chatTemplate!.render([{ role: "robot" as "user", content: "x" }])).toThrow(/chat messages: 0\.role/);
  });

  it("reads chat_template.jinja and the BOS a post-processor adds (Llama-3 style)", () => {
    const dir = tempDir("hg-tok-");
    const tj = JSON.parse(readFileSync(join(modelsDir("tokenizer-gpt2"), "tokenizer.json"), "utf8"));
    // A Llama-3-like setup: a special BOS token prepended by a TemplateProcessing post-processor.
    tj.added_tokens.push({ id: 50257, content: "<|begin_of_text|>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
    tj.post_processor = {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<|begin_of_text|>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [{ Sequence: { id: "A", type_id: 0 } }, { Sequence: { id: "B", type_id: 1 } }],
      special_tokens: { "<|begin_of_text|>": { id: "<|begin_of_text|>", ids: [50257], tokens: ["<|begin_of_text|>"] } },
    };
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "tokenizer.json"), JSON.stringify(tj));
    writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ bos_token: "<|begin_of_text|>", eos_token: "<|endoftext|>" }));
    writeFileSync(join(dir, "chat_template.jinja"), "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}");
    const { tokenizer, chatTemplate } = loadTokenizerFiles(dir);
    expect(tokenizer.bosId).toBe(50257);
    expect(tokenizer.encode("Hello world")).toEqual([50257, 15496, 995]);
    expect(tokenizer.encode("Hello world", { addBos: false })).toEqual([15496, 995]);
    const prompt = chatTemplate!.render([{ role: "user", content: "hi" }]);
    expect(prompt).toBe("<|begin_of_text|>[user]hi<|endoftext|>[assistant]");
    // The rendered special tokens encode as their ids, not as text.
    expect(tokenizer.encode(prompt, { addBos: false })[0]).toBe(50257);
  });
});

describe("tokenizer files: bad input", () => {
  const dirWith = (files: Record<string, string>) => {
    const dir = tempDir("hg-tokbad-");
    mkdirSync(dir, { recursive: true });
    for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
    return dir;
  };

  it("names a tokenizer.json that does not parse, or is not a tokenizer", () => {
    expect(errorMessage(() => loadTokenizerFiles(dirWith({ "tokenizer.json": "{ not json" })))).toMatch(/tokenizer\.json: tokenizer\.json is not valid JSON/);
    expect(errorMessage(() => loadTokenizerFiles(dirWith({ "tokenizer.json": "[1, 2]" })))).toMatch(/tokenizer\.json: not a tokenizer\.json \(no model object\)/);
    expect(errorMessage(() => loadTokenizerFiles(dirWith({ "tokenizer.json": JSON.stringify({ model: { type: "Nope" } }) })))).toMatch(/tokenizer\.json: cannot build the tokenizer/);
    expect(errorMessage(() => loadTokenizerFiles(dirWith({})))).toMatch(/no tokenizer\.json/);
  });

  it("names a broken tokenizer_config.json and a chat template that does not parse", () => {
    const tj = readFileSync(join(modelsDir("tokenizer-gpt2"), "tokenizer.json"), "utf8");
    expect(errorMessage(() => loadTokenizerFiles(dirWith({ "tokenizer.json": tj, "tokenizer_config.json": "{" })))).toMatch(/tokenizer_config\.json is not valid JSON/);
    expect(errorMessage(() => loadTokenizerFiles(dirWith({ "tokenizer.json": tj, "tokenizer_config.json": JSON.stringify({ chat_template: "{% for %}" }) })))).toMatch(/chat template does not parse/);
    expect(errorMessage(() => loadTokenizerFiles(dirWith({ "tokenizer.json": tj, "tokenizer_config.json": JSON.stringify({ chat_template: 5 }) })))).toMatch(/chat_template is neither a string/);
  });
});
