/**
 * Tokenizers from a Hugging Face tokenizer.json (+ tokenizer_config.json) through
 * @huggingface/tokenizers: byte-level BPE (GPT-2, OPT, Llama-3, Qwen2) and the rest of what
 * that library reads. BOS follows the tokenizer: tokenizer_config's add_bos_token when it
 * says, else whatever token the post-processor puts in front (Llama-3's <|begin_of_text|>;
 * nothing for GPT-2 or Qwen2).
 */
import { Tokenizer as HfLibTokenizer } from "@huggingface/tokenizers";
import { fail } from "@hybridgen/spec";
import type { Tokenizer } from "./tokenizer.js";

const utf8 = new TextEncoder();
const EMPTY = new Uint8Array(0);

/** GPT-2's byte ↔ printable-character table, inverted: char code → byte. */
function byteLevelDecodeTable(): Map<number, number> {
  const table = new Map<number, number>();
  let extra = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table.set(printable ? b : 256 + extra++, b);
  }
  return table;
}

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

/** A special-token entry of tokenizer_config.json: a string or {content: string}. */
export function tokenText(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (isObject(v) && typeof v.content === "string") return v.content;
  return null;
}

/** Whether a tokenizer.json component (or any part of a Sequence) has type `type`. */
function hasPart(component: unknown, type: string): boolean {
  if (!isObject(component)) return false;
  if (component.type === type) return true;
  const parts = component.decoders ?? component.pretokenizers ?? component.processors ?? component.normalizers;
  return Array.isArray(parts) && parts.some((p) => hasPart(p, type));
}

export interface HfTokenizerOptions {
  /** Shown in errors. */
  readonly src?: string;
  /** Overrides the EOS id found from tokenizer_config's eos_token. */
  readonly eosId?: number | null;
}

export class HfTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bosId: number | null;
  readonly eosId: number | null;
  /** tokenizer_config.json's special tokens by name (bos_token, eos_token, …) for templates. */
  readonly specialTokens: Readonly<Record<string, string>>;
  private readonly tok: HfLibTokenizer;
  private readonly byteLevel: Map<number, number> | null;
  private readonly added: Map<number, { content: string; special: boolean }>;
  private readonly pieceCache = new Map<number, Uint8Array>();
  private readonly src: string;

  constructor(tokenizerJson: unknown, tokenizerConfig: unknown = {}, options: HfTokenizerOptions = {}) {
    const src = options.src ?? "tokenizer.json";
    this.src = src;
    if (!isObject(tokenizerJson) || !isObject(tokenizerJson.model)) fail(`${src}: not a tokenizer.json (no model object)`);
    const cfg = isObject(tokenizerConfig) ? tokenizerConfig : {};
    try {
      this.tok = new HfLibTokenizer(tokenizerJson, cfg);
    } catch (e) {
      fail(`${src}: cannot build the tokenizer (${(e as Error).message.split("\n")[0]})`);
    }
    this.added = new Map();
    const addedList = Array.isArray(tokenizerJson.added_tokens) ? tokenizerJson.added_tokens : [];
    for (const t of addedList) {
      if (isObject(t) && Number.isInteger(t.id) && typeof t.content === "string") this.added.set(t.id as number, { content: t.content, special: t.special === true });
    }
    let maxId = -1;
    for (const id of this.tok.get_vocab(true).values()) if (id > maxId) maxId = id;
    this.vocabSize = maxId + 1;
    if (this.vocabSize === 0) fail(`${src}: the vocabulary is empty`);
    this.byteLevel = hasPart(tokenizerJson.decoder, "ByteLevel") ? byteLevelDecodeTable() : null;

    const specials: Record<string, string> = {};
    for (const key of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
      const text = tokenText(cfg[key]);
      if (text !== null) specials[key] = text;
    }
    this.specialTokens = specials;
    this.bosId = this.findBos(cfg, src);
    const eosText = specials.eos_token;
    this.eosId = options.eosId !== undefined ? options.eosId : eosText !== undefined ? (this.tok.token_to_id(eosText) ?? null) : null;
    for (const [name, id] of [["BOS", this.bosId], ["EOS", this.eosId]] as const) {
      if (id !== null && !(Number.isInteger(id) && id >= 0 && id < this.vocabSize)) fail(`${src}: the ${name} id ${id} is outside the vocabulary of ${this.vocabSize}`);
    }
  }

  /** Runs the library; what it throws on a malformed tokenizer.json becomes one line naming the file. */
  private lib<T>(what: string, run: () => T): T {
    try {
      return run();
    } catch (e) {
      fail(`${this.src}: cannot ${what} with this tokenizer (${(e instanceof Error ? e.message : String(e)).split("\n")[0]})`);
    }
  }

  encode(text: string, options: { addBos?: boolean } = {}): number[] {
    const ids = this.lib("encode text", () => this.tok.encode(text, { add_special_tokens: false }).ids);
    const bad = ids.findIndex((id) => !(Number.isInteger(id) && id >= 0 && id < this.vocabSize));
    if (bad >= 0) fail(`${this.src}: the tokenizer produced id ${String(ids[bad])}, outside its vocabulary of ${this.vocabSize} (vocab entries must be non-negative integers)`);
    if ((options.addBos ?? true) && this.bosId !== null) ids.unshift(this.bosId);
    return ids;
  }

  /** Bytes of token `id`; special tokens decode to nothing (as skip_special_tokens). */
  decodeBytes(id: number, prev?: number): Uint8Array {
    const cached = this.pieceCache.get(id);
    if (cached) return cached;
    const added = this.added.get(id);
    let bytes: Uint8Array;
    if (added) bytes = added.special ? EMPTY : utf8.encode(added.content);
    else if (this.byteLevel) {
      const piece = this.tok.id_to_token(id);
      if (piece === undefined) return EMPTY;
      const out: number[] = [];
      for (const ch of piece) {
        const b = this.byteLevel.get(ch.codePointAt(0)!);
        if (b === undefined) out.push(...utf8.encode(ch)); // not from the byte table: keep as text
        else out.push(b);
      }
      bytes = Uint8Array.from(out);
    } else {
      // Other decoders (Metaspace, WordPiece, …) depend on context: the text this token
      // adds after `prev`.
      if (id < 0 || id >= this.vocabSize) return EMPTY;
      const before = prev === undefined ? "" : this.decode([prev]);
      const both = this.decode(prev === undefined ? [id] : [prev, id]);
      return utf8.encode(both.startsWith(before) ? both.slice(before.length) : both);
    }
    this.pieceCache.set(id, bytes);
    return bytes;
  }

  decode(ids: readonly number[]): string {
    return this.lib("decode ids", () => this.tok.decode([...ids], { skip_special_tokens: true, clean_up_tokenization_spaces: false }));
  }

  /** The id of a token string, if the vocabulary has it. */
  tokenId(token: string): number | undefined {
    return this.tok.token_to_id(token);
  }

  private findBos(cfg: Record<string, unknown>, src: string): number | null {
    const bosText = tokenText(cfg.bos_token);
    if (typeof cfg.add_bos_token === "boolean") {
      if (!cfg.add_bos_token || bosText === null) return null;
      const id = this.tok.token_to_id(bosText);
      if (id === undefined) fail(`${src}: bos_token ${JSON.stringify(bosText)} is not in the vocabulary`);
      return id;
    }
    // No explicit setting: the post-processor's leading special token, if any.
    const plain = this.tok.encode("a", { add_special_tokens: false }).ids;
    const withSpecial = this.tok.encode("a", { add_special_tokens: true }).ids;
    if (withSpecial.length > plain.length && withSpecial[0] !== plain[0]) return withSpecial[0];
    return null;
  }
}
