/**
 * SentencePiece-style BPE (Llama 1/2, Mistral, TinyLlama, llama2.c) read from a Hugging Face
 * `tokenizer.json`: spaces become "▁", a "▁" is prepended, the text is split into code
 * points, and adjacent pairs are merged lowest merge rank first (leftmost on ties) until no
 * merge applies. Code points missing from the vocabulary fall back to `<0xXX>` byte tokens.
 *
 * The merge loop uses a binary heap keyed by (rank, position) over a linked list of
 * symbols, so encoding is O(n log n): a 100K-character prompt takes milliseconds.
 */
import { readFileSync } from "node:fs";
import { HybridgenError, check, fail } from "@hybridgen/spec";
import type { Tokenizer } from "./tokenizer.js";

export interface BpeTokenizerOptions {
  /** Overrides the BOS id guessed from the added tokens (`<s>`); null disables BOS. */
  readonly bosId?: number | null;
  /** Overrides the EOS id guessed from the added tokens (`</s>`). */
  readonly eosId?: number | null;
}

type NormalizeStep = (s: string) => string;

interface PreTokenizer {
  readonly replacement: string;
  readonly prepend: boolean;
  readonly split: boolean;
}

const utf8 = new TextEncoder();

function isObject(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

function parseNormalizer(raw: unknown, src: string): NormalizeStep[] {
  if (raw === null || raw === undefined) return [];
  if (!isObject(raw)) fail(`${src}: normalizer is not an object`);
  switch (raw.type) {
    case "Sequence": {
      const list = raw.normalizers;
      if (!Array.isArray(list)) fail(`${src}: Sequence normalizer without a normalizers list`);
      return list.flatMap((n) => parseNormalizer(n, src));
    }
    case "Prepend": {
      const p = raw.prepend;
      if (typeof p !== "string") fail(`${src}: Prepend normalizer without a prepend string`);
      // As HF: an empty input stays empty (so "" encodes to just BOS).
      return [(s) => (s.length === 0 ? s : p + s)];
    }
    case "Replace": {
      const pat = raw.pattern;
      const content = raw.content;
      if (!isObject(pat) || typeof pat.String !== "string" || typeof content !== "string") {
        fail(`${src}: only Replace normalizers with a String pattern are supported`);
      }
      const from = pat.String;
      return [(s) => s.replaceAll(from, content)];
    }
    case "NFC":
    case "NFD":
    case "NFKC":
    case "NFKD": {
      const form = raw.type;
      return [(s) => s.normalize(form)];
    }
    default:
      fail(`${src}: unsupported normalizer type ${String(raw.type)}`);
  }
}

function parsePreTokenizer(raw: unknown, src: string): PreTokenizer | null {
  if (raw === null || raw === undefined) return null;
  if (!isObject(raw)) fail(`${src}: pre_tokenizer is not an object`);
  if (raw.type === "Metaspace") {
    const replacement = typeof raw.replacement === "string" ? raw.replacement : "▁";
    const scheme = raw.prepend_scheme ?? (raw.add_prefix_space === false ? "never" : "always");
    if (scheme !== "always" && scheme !== "first" && scheme !== "never") {
      fail(`${src}: unsupported Metaspace prepend_scheme ${String(scheme)}`);
    }
    return { replacement, prepend: scheme !== "never", split: raw.split !== false };
  }
  const children = raw.type === "Sequence" && Array.isArray(raw.pretokenizers) ? raw.pretokenizers : [raw];
  if (children.some((c) => isObject(c) && c.type === "ByteLevel")) {
    fail(`${src}: byte-level BPE (GPT-2/Llama-3 style) is not supported; only SentencePiece-style BPE (Llama 2) is`);
  }
  fail(`${src}: unsupported pre_tokenizer type ${String(raw.type)}`);
}

/** Min-heap of float keys (rank * stride + position) in a growable Float64Array. */
class KeyHeap {
  #a = new Float64Array(64);
  size = 0;

  push(k: number): void {
    if (this.size === this.#a.length) {
      const b = new Float64Array(this.#a.length * 2);
      b.set(this.#a);
      this.#a = b;
    }
    const a = this.#a;
    let i = this.size++;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (a[p] <= k) break;
      a[i] = a[p];
      i = p;
    }
    a[i] = k;
  }

  pop(): number {
    const a = this.#a;
    const top = a[0];
    const last = a[--this.size];
    let i = 0;
    const n = this.size;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && a[c + 1] < a[c]) c++;
      if (a[c] >= last) break;
      a[i] = a[c];
      i = c;
    }
    a[i] = last;
    return top;
  }
}

export class BpeTokenizer implements Tokenizer {
  readonly vocabSize: number;
  readonly bosId: number | null;
  readonly eosId: number | null;
  readonly unkId: number | null;
  /** Number of merge rules. */
  readonly mergeCount: number;

  readonly #pieces: (string | undefined)[];
  readonly #ids: Map<string, number>;
  /** (left * vocabSize + right) → merge rank. */
  readonly #mergeRank: Map<number, number>;
  /** merge rank → id of the merged piece. */
  readonly #mergeOut: Int32Array;
  /** byte value → id of its `<0xXX>` piece, or -1 when byte fallback is off/missing. */
  readonly #byteIds: Int32Array;
  /** id → byte value for `<0xXX>` pieces, else -1. */
  readonly #byteOf: Int32Array;
  readonly #special: Uint8Array;
  readonly #normalize: NormalizeStep[];
  readonly #pre: PreTokenizer | null;
  readonly #fuseUnk: boolean;
  /** Whether encoding adds a leading "▁" that decoding must drop after BOS. */
  readonly #addsPrefixSpace: boolean;
  readonly #space: string;
  readonly #bytesCache: (Uint8Array | undefined)[];

  /** Builds from a parsed `tokenizer.json`; `src` names the file in errors. */
  constructor(json: unknown, src = "tokenizer.json", options: BpeTokenizerOptions = {}) {
    if (!isObject(json)) fail(`${src}: not a JSON object`);
    const model = json.model;
    if (!isObject(model)) fail(`${src}: no "model" object`);
    if (model.type !== "BPE" && !(model.type === undefined && "merges" in model)) {
      fail(`${src}: unsupported tokenizer model type ${String(model.type)} (only BPE is supported)`);
    }
    if (model.continuing_subword_prefix != null || model.end_of_word_suffix != null) {
      fail(`${src}: BPE with continuing_subword_prefix/end_of_word_suffix is not supported`);
    }
    if (!isObject(model.vocab)) fail(`${src}: model.vocab is not an object`);
    if (!Array.isArray(model.merges)) fail(`${src}: model.merges is not an array`);

    // ---- vocabulary (model vocab plus added tokens) ----
    const ids = new Map<string, number>();
    let maxId = -1;
    for (const [piece, id] of Object.entries(model.vocab)) {
      if (typeof id !== "number" || !Number.isSafeInteger(id) || id < 0) fail(`${src}: vocab entry ${JSON.stringify(piece)} has a bad id ${String(id)}`);
      ids.set(piece, id);
      if (id > maxId) maxId = id;
    }
    const special = new Set<number>();
    const added = json.added_tokens ?? [];
    if (!Array.isArray(added)) fail(`${src}: added_tokens is not an array`);
    for (const t of added) {
      if (!isObject(t) || typeof t.content !== "string" || typeof t.id !== "number" || !Number.isSafeInteger(t.id) || t.id < 0) {
        fail(`${src}: malformed added_tokens entry ${JSON.stringify(t)}`);
      }
      if (!ids.has(t.content)) ids.set(t.content, t.id);
      if (t.id > maxId) maxId = t.id;
      if (t.special === true) special.add(t.id);
    }
    check(maxId >= 0, `${src}: empty vocabulary`);
    this.vocabSize = maxId + 1;
    const pieces: (string | undefined)[] = new Array(this.vocabSize);
    for (const [piece, id] of ids) {
      if (pieces[id] !== undefined && pieces[id] !== piece) fail(`${src}: id ${id} is used by both ${JSON.stringify(pieces[id])} and ${JSON.stringify(piece)}`);
      pieces[id] = piece;
    }
    this.#pieces = pieces;
    this.#ids = ids;
    this.#special = new Uint8Array(this.vocabSize);
    for (const id of special) this.#special[id] = 1;

    // ---- merges: "a b" strings (older files) or [a, b] pairs (newer) ----
    const V = this.vocabSize;
    this.#mergeRank = new Map();
    this.#mergeOut = new Int32Array(model.merges.length);
    model.merges.forEach((m: unknown, rank: number) => {
      let a: unknown, b: unknown;
      if (typeof m === "string") {
        const sp = m.indexOf(" ");
        if (sp <= 0 || m.indexOf(" ", sp + 1) !== -1) fail(`${src}: merge ${rank} ${JSON.stringify(m)} is not "left right"`);
        a = m.slice(0, sp);
        b = m.slice(sp + 1);
      } else if (Array.isArray(m) && m.length === 2) {
        [a, b] = m;
      } else {
        fail(`${src}: merge ${rank} is neither "left right" nor [left, right]`);
      }
      if (typeof a !== "string" || typeof b !== "string") fail(`${src}: merge ${rank} has non-string parts`);
      const ia = ids.get(a) ?? fail(`${src}: merge ${rank} refers to unknown token ${JSON.stringify(a)}`);
      const ib = ids.get(b) ?? fail(`${src}: merge ${rank} refers to unknown token ${JSON.stringify(b)}`);
      const io = ids.get(a + b) ?? fail(`${src}: merge ${rank} produces ${JSON.stringify(a + b)}, which is not in the vocab`);
      const key = ia * V + ib;
      // A repeated pair keeps its first (best) rank, as HF does.
      if (!this.#mergeRank.has(key)) this.#mergeRank.set(key, rank);
      this.#mergeOut[rank] = io;
    });
    this.mergeCount = model.merges.length;

    // ---- byte fallback ----
    this.#byteIds = new Int32Array(256).fill(-1);
    this.#byteOf = new Int32Array(this.vocabSize).fill(-1);
    for (let b = 0; b < 256; b++) {
      const id = ids.get(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
      if (id === undefined) continue;
      this.#byteOf[id] = b;
      if (model.byte_fallback === true) this.#byteIds[b] = id;
    }

    const unk = model.unk_token;
    this.unkId = typeof unk === "string" ? (ids.get(unk) ?? fail(`${src}: unk_token ${unk} is not in the vocab`)) : null;
    this.#fuseUnk = model.fuse_unk === true;

    this.#normalize = parseNormalizer(json.normalizer, src);
    this.#pre = parsePreTokenizer(json.pre_tokenizer, src);
    this.#space = this.#pre?.replacement ?? "▁";
    // Decoding drops one leading space after BOS only if encoding added one.
    const prependTest = "x";
    const normalizerPrepends = this.#normalize.reduce((t, step) => step(t), prependTest).length > prependTest.length;
    this.#addsPrefixSpace = normalizerPrepends || (this.#pre?.prepend ?? false);

    const pick = (given: number | null | undefined, guess: string): number | null => {
      if (given === null) return null;
      if (given !== undefined) {
        check(Number.isSafeInteger(given) && given >= 0 && given < this.vocabSize, `${src}: special token id ${given} is outside the vocab (${this.vocabSize})`);
        return given;
      }
      return ids.get(guess) ?? null;
    };
    this.bosId = pick(options.bosId, "<s>");
    this.eosId = pick(options.eosId, "</s>");
    this.#bytesCache = new Array(this.vocabSize);
  }

  /** The vocabulary string of `id` (e.g. "▁Once", "<0x0A>"). */
  idToPiece(id: number): string | undefined {
    return this.#pieces[id];
  }

  pieceToId(piece: string): number | undefined {
    return this.#ids.get(piece);
  }

  encode(text: string, options: { addBos?: boolean } = {}): number[] {
    const out: number[] = [];
    if ((options.addBos ?? true) && this.bosId !== null) out.push(this.bosId);
    let s = text;
    for (const step of this.#normalize) s = step(s);
    const pre = this.#pre;
    if (pre) {
      s = s.replaceAll(" ", pre.replacement);
      if (pre.prepend && s.length > 0 && !s.startsWith(pre.replacement)) s = pre.replacement + s;
      if (pre.split) {
        // Each replacement char starts a new word (HF "MergedWithNext").
        let start = 0;
        for (let i = s.indexOf(pre.replacement, 1); i !== -1; i = s.indexOf(pre.replacement, i + 1)) {
          this.#bpe(s.slice(start, i), out);
          start = i;
        }
        this.#bpe(s.slice(start), out);
        return out;
      }
    }
    this.#bpe(s, out);
    return out;
  }

  /** Encodes one pre-tokenized segment, appending ids to `out`. */
  #bpe(s: string, out: number[]): void {
    if (s.length === 0) return;
    // Initial symbols: one per code point, or its byte tokens, or unk.
    const sym: number[] = [];
    for (const ch of s) {
      const id = this.#ids.get(ch);
      if (id !== undefined && !this.#special[id]) {
        sym.push(id);
        continue;
      }
      const bytes = utf8.encode(ch);
      let ok = true;
      for (const b of bytes) if (this.#byteIds[b] < 0) ok = false;
      if (ok) {
        for (const b of bytes) sym.push(this.#byteIds[b]);
        continue;
      }
      if (this.unkId === null) fail(`cannot encode ${JSON.stringify(ch)}: not in the vocab and the tokenizer has no byte fallback or unk token`);
      if (this.#fuseUnk && sym.length > 0 && sym[sym.length - 1] === this.unkId) continue;
      sym.push(this.unkId);
    }

    const n = sym.length;
    const id = Int32Array.from(sym);
    const next = new Int32Array(n);
    const prev = new Int32Array(n);
    for (let i = 0; i < n; i++) {
      next[i] = i + 1 < n ? i + 1 : -1;
      prev[i] = i - 1;
    }
    const V = this.vocabSize;
    const ranks = this.#mergeRank;
    const heap = new KeyHeap();
    const push = (i: number): void => {
      const j = next[i];
      if (j < 0) return;
      const r = ranks.get(id[i] * V + id[j]);
      if (r !== undefined) heap.push(r * n + i);
    };
    for (let i = 0; i + 1 < n; i++) push(i);

    while (heap.size > 0) {
      const key = heap.pop();
      const r = Math.floor(key / n);
      const i = key - r * n;
      const j = next[i];
      // Stale entries: i was absorbed (id -1) or its pair changed since the push.
      if (id[i] < 0 || j < 0 || ranks.get(id[i] * V + id[j]) !== r) continue;
      id[i] = this.#mergeOut[r];
      id[j] = -1;
      const k = next[j];
      next[i] = k;
      if (k >= 0) prev[k] = i;
      if (prev[i] >= 0) push(prev[i]);
      push(i);
    }
    for (let i = 0; i >= 0; i = next[i]) out.push(id[i]);
  }

  decodeBytes(id: number, prev?: number): Uint8Array {
    let b = this.#bytesCache[id];
    if (b === undefined) {
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) throw new HybridgenError(`token id ${id} is outside the vocab (0..${this.vocabSize - 1})`);
      const piece = this.#pieces[id] ?? fail(`token id ${id} has no piece in the vocab`);
      if (this.#special[id]) b = new Uint8Array(0);
      else if (this.#byteOf[id] >= 0) b = Uint8Array.of(this.#byteOf[id]);
      else b = utf8.encode(piece.replaceAll(this.#space, " "));
      this.#bytesCache[id] = b;
    }
    // SentencePiece drops the space it added in front of the text. Copies, so callers
    // cannot corrupt the cache.
    if (prev !== undefined && prev === this.bosId && this.#addsPrefixSpace && b[0] === 0x20) return b.slice(1);
    return b.slice();
  }

  decode(ids: readonly number[]): string {
    const parts: Uint8Array[] = [];
    let total = 0;
    for (let i = 0; i < ids.length; i++) {
      // The first piece of a sequence is treated as following BOS.
      const prev = i === 0 ? (this.bosId ?? undefined) : ids[i - 1];
      let b = this.decodeBytes(ids[i], prev);
      if (i === 0 && this.bosId === null && this.#addsPrefixSpace && b[0] === 0x20) b = b.subarray(1);
      parts.push(b);
      total += b.length;
    }
    const all = new Uint8Array(total);
    let o = 0;
    for (const p of parts) {
      all.set(p, o);
      o += p.length;
    }
    return new TextDecoder().decode(all);
  }
}

/** Reads a Hugging Face `tokenizer.json`; errors name the file and the problem. */
export function loadTokenizer(path: string, options?: BpeTokenizerOptions): BpeTokenizer {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    fail(`${path}: cannot read tokenizer (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    fail(`${path}: not valid JSON (${(e as Error).message})`);
  }
  return new BpeTokenizer(json, path, options);
}
