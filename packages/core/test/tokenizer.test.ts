import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BpeTokenizer, HybridgenError, ensureStories15M, llama2cTokenizerToJson, loadTokenizer } from "../src/index.js";
import { randomText, referenceEncode, rng, syntheticVocab, tempDir, tokenizerBin, removeTempDirs } from "./model-io-fixtures.js";

afterAll(removeTempDirs);

describe("BpeTokenizer on the real stories15M (Llama 2) vocabulary", () => {
  let tok: BpeTokenizer;
  beforeAll(async () => {
    tok = loadTokenizer(join(await ensureStories15M(), "tokenizer.json"));
  }, 600_000);

  it("reproduces Llama 2 ids", () => {
    expect(tok.vocabSize).toBe(32000);
    expect([tok.bosId, tok.eosId, tok.unkId]).toEqual([1, 2, 0]);
    expect(tok.encode("Once upon a time")).toEqual([1, 9038, 2501, 263, 931]);
    expect(tok.encode("Hello world")).toEqual([1, 15043, 3186]);
    expect(tok.encode("Once upon a time", { addBos: false })).toEqual([9038, 2501, 263, 931]);
    expect(tok.encode("")).toEqual([1]);
    // "a" is an ordinary piece (▁a = 263), not the byte token 0x61 that shares its text in tokenizer.bin.
    expect(tok.encode("a")).toEqual([1, 263]);
  });

  it("falls back to <0xXX> byte tokens (id = byte + 3) and round-trips emoji and CJK", () => {
    const ids = tok.encode("😀");
    // ▁ then F0 9F 98 80
    expect(ids).toEqual([1, 29871, 0xf0 + 3, 0x9f + 3, 0x98 + 3, 0x80 + 3]);
    for (const s of ["Lily saw a 🐶 and said 你好, 世界! Ünïcödé — ok", "😀😀 日本語\n\ttabs\r\n", "\u{10FFFF}x\u0001"]) {
      expect(tok.decode(tok.encode(s))).toBe(s);
    }
  });

  it("drops only the space SentencePiece added: after BOS, and at the start of decode()", () => {
    const once = 9038; // "▁Once"
    expect(new TextDecoder().decode(tok.decodeBytes(once, 1))).toBe("Once");
    expect(new TextDecoder().decode(tok.decodeBytes(once, 2501))).toBe(" Once");
    expect(tok.decode([1, 9038, 2501])).toBe("Once upon");
    expect(tok.decode([9038, 2501])).toBe("Once upon");
    // A text that starts with spaces keeps them: only the added prefix goes.
    for (const s of [" x", "  leading", "a  b   c", "end "]) expect(tok.decode(tok.encode(s))).toBe(s);
    expect(tok.decodeBytes(1).length).toBe(0); // BOS decodes to nothing
    expect(() => tok.decodeBytes(32000)).toThrow(HybridgenError);
    expect(() => tok.decodeBytes(-1)).toThrow(/outside the vocab/);
  });

  it("encodes a 100K-character prompt (heap merge loop) and round-trips it", () => {
    const r = rng(7);
    const words = ["Once", "upon", "a", "time", "Lily", "dog", "park", "happy", "🌞", "là", "\n"];
    let s = "";
    while (s.length < 100_000) s += `${words[Math.floor(r() * words.length)]}${r() < 0.1 ? ". " : " "}`;
    const ids = tok.encode(s);
    expect(ids.length).toBeGreaterThan(20_000);
    expect(tok.decode(ids)).toBe(s);
  });
});

describe("BpeTokenizer vs the llama2.c reference encoder (synthetic vocabularies)", () => {
  for (const oldByteFormat of [false, true]) {
    it(`matches on random texts (${oldByteFormat ? "chr(b)" : "<0xXX>"} byte pieces)`, () => {
      const r = rng(oldByteFormat ? 11 : 12);
      const v = syntheticVocab(r);
      const { tokenizer, byteFallback } = llama2cTokenizerToJson(tokenizerBin(v, oldByteFormat), v.pieces.length);
      expect(byteFallback).toBe(true);
      const tok = new BpeTokenizer(tokenizer);
      for (let n = 0; n < 400; n++) {
        const text = randomText(r, v);
        const ids = tok.encode(text);
        expect(ids, JSON.stringify(text)).toEqual(referenceEncode(v, text));
        expect(tok.decode(ids)).toBe(text);
      }
    });
  }
});

describe("loadTokenizer errors", () => {
  const dir = tempDir();
  const write = (name: string, body: string) => {
    const p = join(dir, name);
    writeFileSync(p, body);
    return p;
  };
  const minimal = (model: Record<string, unknown>, extra: Record<string, unknown> = {}) =>
    JSON.stringify({ model: { type: "BPE", vocab: { a: 0, b: 1, ab: 2 }, merges: ["a b"], ...model }, ...extra });

  it("names the file when it is missing or not JSON", () => {
    expect(() => loadTokenizer(join(dir, "nope.json"))).toThrow(/nope\.json: cannot read tokenizer \(ENOENT\)/);
    const p = write("bad.json", "{ not json");
    expect(() => loadTokenizer(p)).toThrow(HybridgenError);
    expect(() => loadTokenizer(p)).toThrow(/bad\.json: not valid JSON/);
  });

  it("rejects unsupported model and pre-tokenizer types", () => {
    expect(() => loadTokenizer(write("u.json", minimal({ type: "Unigram" })))).toThrow(/unsupported tokenizer model type Unigram/);
    expect(() => loadTokenizer(write("bl.json", minimal({}, { pre_tokenizer: { type: "ByteLevel" } })))).toThrow(/byte-level BPE/);
    expect(() => loadTokenizer(write("n.json", minimal({}, { normalizer: { type: "Lowercase" } })))).toThrow(/unsupported normalizer type Lowercase/);
    expect(() => loadTokenizer(write("nm.json", JSON.stringify({ vocab: {} })))).toThrow(/no "model" object/);
  });

  it("rejects merges that refer to unknown tokens", () => {
    expect(() => loadTokenizer(write("m1.json", minimal({ merges: ["a c"] })))).toThrow(/merge 0 refers to unknown token "c"/);
    expect(() => loadTokenizer(write("m2.json", minimal({ merges: [["b", "a"]] })))).toThrow(/produces "ba", which is not in the vocab/);
  });

  it("accepts both merge spellings and a Metaspace pre-tokenizer", () => {
    const vocab = { "<unk>": 0, "▁": 1, a: 2, b: 3, "▁a": 4, "▁ab": 5, ab: 6 };
    for (const merges of [["▁ a", "▁a b", "a b"], [["▁", "a"], ["▁a", "b"], ["a", "b"]]]) {
      const t = new BpeTokenizer({
        model: { type: "BPE", vocab, merges, unk_token: "<unk>" },
        pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "always", split: true },
      });
      expect(t.encode("ab ab b")).toEqual([5, 5, 1, 3]);
      expect(t.encode("abz")).toEqual([5, 0]); // no byte fallback: unk
      expect(t.bosId).toBeNull();
    }
  });
});
