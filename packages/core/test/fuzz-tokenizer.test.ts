/**
 * Property-based fuzzing of tokenizer.json and tokenizer_config.json: a small SentencePiece BPE
 * (the hand-written reader) and a small GPT-2 byte-level BPE (through @huggingface/tokenizers),
 * with any JSON at any key path, changed bytes, and any value for the config's keys and chat
 * template. Each loads, then encodes and decodes text, or fails with one HybridgenError line.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { loadTokenizerFiles } from "../src/tokenizer-files.js";
import { keyPaths, loadsOrOneLineError, withValueAt } from "./fuzz-helpers.js";

// One seed per run of the suite, so CI is repeatable; HYBRIDGEN_FUZZ_SEED explores others.
fc.configureGlobal({ seed: Number(process.env.HYBRIDGEN_FUZZ_SEED ?? 20261203) });

const dir = mkdtempSync(join(tmpdir(), "hybridgen-fuzz-tok-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const hex = (b: number) => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`;

/** A Llama-2-style tokenizer.json: byte fallback, "▁" for spaces, a few merges. */
function sentencePieceSeed(): Record<string, unknown> {
  const pieces = ["<unk>", "<s>", "</s>", ...Array.from({ length: 256 }, (_, b) => hex(b)), "▁", ..."abcdefghijklmnopqrstuvwxyz,.", "▁t", "th", "▁th", "he", "▁the", "er", "in", "▁a"];
  const vocab = Object.fromEntries(pieces.map((p, i) => [p, i]));
  return {
    version: "1.0",
    added_tokens: [0, 1, 2].map((id) => ({ id, content: pieces[id], special: true, normalized: false })),
    normalizer: { type: "Sequence", normalizers: [{ type: "Prepend", prepend: "▁" }, { type: "Replace", pattern: { String: " " }, content: "▁" }] },
    pre_tokenizer: null,
    decoder: { type: "Sequence", decoders: [{ type: "Replace", pattern: { String: "▁" }, content: " " }, { type: "ByteFallback" }, { type: "Fuse" }, { type: "Strip", content: " ", start: 1, stop: 0 }] },
    model: { type: "BPE", unk_token: "<unk>", fuse_unk: true, byte_fallback: true, vocab, merges: [["▁", "t"], ["t", "h"], ["▁", "th"], ["h", "e"], ["▁th", "e"], ["e", "r"], ["i", "n"], ["▁", "a"]] },
  };
}

/** GPT-2's byte → printable character table. */
function byteChars(): string[] {
  const direct = [...Array.from({ length: 94 }, (_, i) => 33 + i), ...Array.from({ length: 12 }, (_, i) => 161 + i), ...Array.from({ length: 82 }, (_, i) => 174 + i)];
  const out: string[] = [];
  let extra = 0;
  for (let b = 0; b < 256; b++) out[b] = String.fromCodePoint(direct.includes(b) ? b : 256 + extra++);
  return out;
}

/** A GPT-2-style byte-level BPE tokenizer.json with an end-of-text token. */
function byteLevelSeed(): Record<string, unknown> {
  const chars = byteChars();
  const merged = ["Ġt", "he", "Ġthe", "in", "er", "Ġa"];
  const vocab = Object.fromEntries([...chars, ...merged].map((p, i) => [p, i]));
  vocab["<|endoftext|>"] = Object.keys(vocab).length;
  return {
    version: "1.0",
    added_tokens: [{ id: vocab["<|endoftext|>"], content: "<|endoftext|>", special: true, normalized: false }],
    normalizer: null,
    pre_tokenizer: { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: null,
    decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
    model: { type: "BPE", vocab, merges: ["Ġ t", "h e", "Ġt he", "i n", "e r", "Ġ a"] },
  };
}

const SEEDS = [sentencePieceSeed(), byteLevelSeed()];
const CONFIGS: Record<string, unknown>[] = [
  { bos_token: "<s>", eos_token: "</s>", add_bos_token: true },
  { eos_token: "<|endoftext|>", chat_template: "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}" },
];
const TEXT = "Once upon a time, the cat ate 42 ünïcode 🐉 things.\n  Then";

/** Writes the files, loads the tokenizer, and uses it: encode, decode, piece bytes, chat template. */
function load(tokenizer: string | Uint8Array, config: unknown): "ok" | "error" {
  writeFileSync(join(dir, "tokenizer.json"), tokenizer);
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(config));
  return loadsOrOneLineError(() => {
    const { tokenizer: tok, chatTemplate } = loadTokenizerFiles(dir, { bosId: 1, eosId: 2 });
    const ids = tok.encode(TEXT);
    for (const id of ids) expect(Number.isInteger(id) && id >= 0 && id < tok.vocabSize).toBe(true);
    expect(typeof tok.decode(ids)).toBe("string");
    for (const id of ids.slice(0, 16)) expect(tok.decodeBytes(id)).toBeInstanceOf(Uint8Array);
    chatTemplate?.render([{ role: "user", content: "hi" }]);
  });
}

describe("tokenizer.json under fuzzing", () => {
  it("the seeds load and round-trip text", () => {
    expect(load(JSON.stringify(SEEDS[0]), CONFIGS[0])).toBe("ok");
    expect(load(JSON.stringify(SEEDS[1]), CONFIGS[1])).toBe("ok");
  });

  it("any JSON at any key path of tokenizer.json", () => {
    fc.assert(
      fc.property(fc.nat(), fc.nat(), fc.jsonValue({ maxDepth: 3 }), (seed, pick, value) => {
        const json = SEEDS[seed % 2];
        // Most vocab entries are alike: one path in ten of them is enough.
        const paths = keyPaths(json).filter((p, i) => !(p[0] === "model" && p[1] === "vocab" && p.length > 2 && i % 10 !== 0));
        load(JSON.stringify(withValueAt(json, paths[pick % paths.length], value)), CONFIGS[seed % 2]);
      }),
      { numRuns: 500 },
    );
  });

  it("changed bytes of tokenizer.json", () => {
    fc.assert(
      fc.property(fc.nat(), fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { minLength: 1, maxLength: 6 }), (seed, edits) => {
        const bytes = new TextEncoder().encode(JSON.stringify(SEEDS[seed % 2]));
        for (const [at, v] of edits) bytes[at % bytes.length] = v;
        load(bytes, CONFIGS[seed % 2]);
      }),
      { numRuns: 300 },
    );
  });

  it("any value for tokenizer_config.json's keys, chat templates included", () => {
    const keys = ["bos_token", "eos_token", "unk_token", "pad_token", "add_bos_token", "chat_template"];
    const template = fc.oneof(fc.string({ unit: "binary", maxLength: 40 }), fc.constantFrom("{{ ", "{% for %}", "{{ messages[0].content }}", "{% if x %}{% endif", "{{ raise_exception('no') }}"));
    fc.assert(
      fc.property(fc.nat(), fc.constantFrom(...keys), fc.oneof(fc.jsonValue({ maxDepth: 2 }), template), (seed, key, value) => {
        load(JSON.stringify(SEEDS[seed % 2]), { ...CONFIGS[seed % 2], [key]: value });
      }),
      { numRuns: 200 },
    );
  });
});
