/**
 * llama2.c checkpoint (model.bin + tokenizer.bin) → Hugging Face Llama directory
 * (config.json, generation_config.json, model.safetensors, tokenizer.json,
 * tokenizer_config.json), so the one HF loader serves both.
 *
 * model.bin: 7 int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size — negative
 * when the classifier is not shared — and seq_len), then f32 arrays: token_embedding,
 * rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis_real, freq_cis_imag,
 * then wcls when unshared.
 * tokenizer.bin: int32 max_token_length, then per token: f32 score, int32 length, bytes.
 */
import { mkdirSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { fail } from "@hybridgen/spec";
import { writeSafetensors, type SafetensorsTensor } from "./safetensors.js";

export interface Llama2cHeader {
  readonly dim: number;
  readonly hiddenDim: number;
  readonly layers: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly vocabSize: number;
  /** False when vocab_size was negative: a separate wcls follows the other weights. */
  readonly sharedClassifier: boolean;
  readonly seqLen: number;
}

const HEADER_BYTES = 28;

export function parseLlama2cHeader(modelBin: Uint8Array): Llama2cHeader {
  if (modelBin.length < HEADER_BYTES) fail(`llama2.c model.bin: ${modelBin.length} bytes, shorter than its 28-byte header`);
  const dv = new DataView(modelBin.buffer, modelBin.byteOffset, HEADER_BYTES);
  const v = Array.from({ length: 7 }, (_, i) => dv.getInt32(i * 4, true));
  const [dim, hiddenDim, layers, heads, kvHeads, vocab, seqLen] = v;
  const h: Llama2cHeader = { dim, hiddenDim, layers, heads, kvHeads, vocabSize: Math.abs(vocab), sharedClassifier: vocab > 0, seqLen };
  if (![dim, hiddenDim, layers, heads, kvHeads, seqLen].every((x) => x > 0) || vocab === 0) {
    fail(`llama2.c model.bin: bad header [${v.join(", ")}] (expected positive dim, hidden_dim, n_layers, n_heads, n_kv_heads, seq_len and non-zero vocab_size)`);
  }
  if (dim % heads !== 0) fail(`llama2.c model.bin: dim ${dim} is not a multiple of n_heads ${heads}`);
  if (heads % kvHeads !== 0) fail(`llama2.c model.bin: n_heads ${heads} is not a multiple of n_kv_heads ${kvHeads}`);
  if ((dim / heads) % 2 !== 0) fail(`llama2.c model.bin: head size ${dim / heads} is odd; RoPE needs pairs`);
  return h;
}

/** The f32 arrays of a llama2.c checkpoint in file order, with their element counts. */
function llama2cLayout(h: Llama2cHeader): { name: string; count: number }[] {
  const { dim, hiddenDim: hd, layers: L, heads, kvHeads, vocabSize: V, seqLen } = h;
  const headSize = dim / heads;
  const kvDim = headSize * kvHeads;
  const parts = [
    { name: "token_embedding", count: V * dim },
    { name: "rms_att", count: L * dim },
    { name: "wq", count: L * dim * dim },
    { name: "wk", count: L * kvDim * dim },
    { name: "wv", count: L * kvDim * dim },
    { name: "wo", count: L * dim * dim },
    { name: "rms_ffn", count: L * dim },
    { name: "w1", count: L * hd * dim },
    { name: "w2", count: L * dim * hd },
    { name: "w3", count: L * hd * dim },
    { name: "rms_final", count: dim },
    { name: "freq_cis_real", count: (seqLen * headSize) / 2 },
    { name: "freq_cis_imag", count: (seqLen * headSize) / 2 },
  ];
  if (!h.sharedClassifier) parts.push({ name: "wcls", count: V * dim });
  return parts;
}

/**
 * Reorders the rows of a q or k projection ([heads · headDim, in]) from llama2.c's
 * interleaved RoPE pairs (2i, 2i+1) to HF's half-split pairs (i, i + headDim/2): new row
 * h·d + t·d/2 + i takes old row h·d + 2i + t (HF's `permute`: view [heads, d/2, 2, in],
 * swap the middle axes). A half-split RoPE on the permuted projection then gives the same
 * attention scores as llama2.c's interleaved RoPE on the original. Works on raw rows, so
 * any dtype.
 */
export function permuteForHalfSplitRope(rows: Uint8Array, heads: number, headDim: number, rowBytes: number): Uint8Array {
  if (rows.length !== heads * headDim * rowBytes) {
    fail(`permuteForHalfSplitRope: ${rows.length} bytes, expected ${heads} heads × ${headDim} rows × ${rowBytes} bytes`);
  }
  if (headDim % 2 !== 0) fail(`permuteForHalfSplitRope: head size ${headDim} is odd`);
  const out = new Uint8Array(rows.length);
  const half = headDim / 2;
  for (let h = 0; h < heads; h++) {
    for (let t = 0; t < 2; t++) {
      for (let i = 0; i < half; i++) {
        const src = (h * headDim + 2 * i + t) * rowBytes;
        out.set(rows.subarray(src, src + rowBytes), (h * headDim + t * half + i) * rowBytes);
      }
    }
  }
  return out;
}

export interface Llama2cTokenizerJson {
  /** A Hugging Face tokenizer.json object (BPE, byte fallback, SentencePiece normalizer). */
  readonly tokenizer: Record<string, unknown>;
  readonly maxTokenLength: number;
  readonly byteFallback: boolean;
}

const hexByte = (b: number): string => `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`;

/**
 * Converts llama2.c's tokenizer.bin to tokenizer.json. Ids 0/1/2 are <unk>/<s>/</s> (llama2.c
 * stores "\n<s>\n" and "\n</s>\n"); ids 3..258 are the byte pieces when they hold either
 * "<0xXX>" or, in older exports, the character U+00XX — which would otherwise duplicate
 * ordinary pieces such as "a". Spaces go back to "▁".
 *
 * Merges: every piece that splits into two ordinary pieces yields a merge, ranked by the
 * merged piece's score, highest first. That reproduces SentencePiece/llama2.c greedy
 * highest-score merging. Equal scores (the whitespace-run pieces, all -1e9) rank longer
 * results first, which reproduces their leftmost-first tie rule on runs of "▁". Byte and
 * special pieces are never merge results (SentencePiece only reaches them by fallback).
 */
export function llama2cTokenizerToJson(tokenizerBin: Uint8Array, vocabSize: number): Llama2cTokenizerJson {
  const src = "llama2.c tokenizer.bin";
  if (tokenizerBin.length < 4) fail(`${src}: ${tokenizerBin.length} bytes, too short`);
  const dv = new DataView(tokenizerBin.buffer, tokenizerBin.byteOffset, tokenizerBin.byteLength);
  const maxTokenLength = dv.getInt32(0, true);
  if (maxTokenLength <= 0) fail(`${src}: bad max_token_length ${maxTokenLength}`);
  const dec = new TextDecoder("utf-8", { fatal: true });
  const raw: Uint8Array[] = [];
  const scores = new Float32Array(vocabSize);
  let o = 4;
  for (let id = 0; id < vocabSize; id++) {
    if (o + 8 > tokenizerBin.length) fail(`${src}: truncated at token ${id} of ${vocabSize}`);
    scores[id] = dv.getFloat32(o, true);
    const len = dv.getInt32(o + 4, true);
    o += 8;
    if (len < 0 || len > maxTokenLength || o + len > tokenizerBin.length) fail(`${src}: token ${id} has a bad length ${len}`);
    raw.push(tokenizerBin.subarray(o, o + len));
    o += len;
  }
  if (o !== tokenizerBin.length) fail(`${src}: ${tokenizerBin.length - o} trailing bytes after ${vocabSize} tokens (vocab size mismatch with model.bin?)`);
  if (vocabSize < 3) fail(`${src}: vocab of ${vocabSize} lacks <unk>, <s>, </s>`);

  const isByteAt = (id: number): boolean => {
    const s = dec.decode(raw[id]);
    const b = id - 3;
    return s === hexByte(b) || s === String.fromCharCode(b);
  };
  const byteFallback = vocabSize >= 259 && Array.from({ length: 256 }, (_, b) => isByteAt(b + 3)).every(Boolean);

  const pieces: string[] = new Array(vocabSize);
  const kind = new Uint8Array(vocabSize); // 0 ordinary, 1 special, 2 byte
  pieces[0] = "<unk>";
  pieces[1] = "<s>";
  pieces[2] = "</s>";
  kind[0] = kind[1] = kind[2] = 1;
  for (let id = 3; id < vocabSize; id++) {
    if (byteFallback && id < 259) {
      pieces[id] = hexByte(id - 3);
      kind[id] = 2;
      continue;
    }
    let s: string;
    try {
      s = dec.decode(raw[id]);
    } catch {
      fail(`${src}: token ${id} is not valid UTF-8`);
    }
    pieces[id] = s.replaceAll(" ", "▁");
  }
  const vocab = new Map<string, number>();
  for (let id = 0; id < vocabSize; id++) {
    const prev = vocab.get(pieces[id]);
    if (prev !== undefined) fail(`${src}: tokens ${prev} and ${id} are both ${JSON.stringify(pieces[id])}`);
    vocab.set(pieces[id], id);
  }

  interface Cand { left: string; right: string; score: number; len: number; leftLen: number; id: number }
  const cands: Cand[] = [];
  for (let id = 0; id < vocabSize; id++) {
    if (kind[id] !== 0) continue;
    const cps = Array.from(pieces[id]);
    for (let k = 1; k < cps.length; k++) {
      const left = cps.slice(0, k).join("");
      const right = cps.slice(k).join("");
      const l = vocab.get(left);
      const r = vocab.get(right);
      if (l === undefined || r === undefined || kind[l] !== 0 || kind[r] !== 0) continue;
      cands.push({ left, right, score: scores[id], len: cps.length, leftLen: k, id });
    }
  }
  cands.sort((a, b) => b.score - a.score || b.len - a.len || b.leftLen - a.leftLen || a.id - b.id);

  const special = (id: number, content: string) => ({
    id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true,
  });
  const tokenizer: Record<string, unknown> = {
    version: "1.0",
    truncation: null,
    padding: null,
    added_tokens: [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
    normalizer: {
      type: "Sequence",
      normalizers: [
        { type: "Prepend", prepend: "▁" },
        { type: "Replace", pattern: { String: " " }, content: "▁" },
      ],
    },
    pre_tokenizer: null,
    post_processor: {
      type: "TemplateProcessing",
      single: [{ SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } }],
      pair: [
        { SpecialToken: { id: "<s>", type_id: 0 } }, { Sequence: { id: "A", type_id: 0 } },
        { SpecialToken: { id: "<s>", type_id: 1 } }, { Sequence: { id: "B", type_id: 1 } },
      ],
      special_tokens: { "<s>": { id: "<s>", ids: [1], tokens: ["<s>"] } },
    },
    decoder: {
      type: "Sequence",
      decoders: [
        { type: "Replace", pattern: { String: "▁" }, content: " " },
        { type: "ByteFallback" },
        { type: "Fuse" },
        { type: "Strip", content: " ", start: 1, stop: 0 },
      ],
    },
    model: {
      type: "BPE",
      dropout: null,
      unk_token: "<unk>",
      continuing_subword_prefix: null,
      end_of_word_suffix: null,
      fuse_unk: true,
      byte_fallback: byteFallback,
      ignore_merges: false,
      vocab: Object.fromEntries(vocab),
      merges: cands.map((c) => [c.left, c.right]),
    },
  };
  return { tokenizer, maxTokenLength, byteFallback };
}

export interface ConvertLlama2cOptions {
  readonly modelBin: Uint8Array;
  readonly tokenizerBin: Uint8Array;
  /** Created by the conversion; must not exist unless `overwrite`. */
  readonly outDir: string;
  readonly overwrite?: boolean;
  readonly onProgress?: (msg: string) => void;
}

function exists(p: string): boolean {
  try {
    statSync(p);
    return true;
  } catch {
    return false;
  }
}

/**
 * Converts and writes the HF directory. Files are written to a sibling temp dir that is
 * renamed into place at the end, so an interrupted conversion never leaves a half model.
 * Returns `outDir`.
 */
export async function convertLlama2c(opts: ConvertLlama2cOptions): Promise<string> {
  const { modelBin, tokenizerBin, outDir } = opts;
  const progress = opts.onProgress ?? (() => {});
  const h = parseLlama2cHeader(modelBin);
  const layout = llama2cLayout(h);
  const expected = HEADER_BYTES + 4 * layout.reduce((a, p) => a + p.count, 0);
  if (modelBin.length !== expected) {
    fail(`llama2.c model.bin: ${modelBin.length} bytes, but header [dim ${h.dim}, hidden ${h.hiddenDim}, ${h.layers} layers, ${h.heads} heads, ${h.kvHeads} kv heads, vocab ${h.vocabSize}, seq ${h.seqLen}] implies ${expected}`);
  }
  if (exists(outDir) && !opts.overwrite) fail(`${outDir} already exists`);
  progress(`converting llama2.c model: dim ${h.dim}, ${h.layers} layers, ${h.heads} heads, vocab ${h.vocabSize}`);

  // Slices of the f32 arrays, by name (byte views; no copies except the permuted ones).
  const arrays = new Map<string, Uint8Array>();
  let off = HEADER_BYTES;
  for (const p of layout) {
    arrays.set(p.name, modelBin.subarray(off, off + 4 * p.count));
    off += 4 * p.count;
  }
  const A = (name: string) => arrays.get(name)!;
  const { dim, hiddenDim, layers: L, heads, kvHeads, vocabSize: V } = h;
  const headSize = dim / heads;
  const kvDim = headSize * kvHeads;
  const perLayer = (name: string, l: number, rows: number, cols: number) => A(name).subarray(l * rows * cols * 4, (l + 1) * rows * cols * 4);

  const tensors: SafetensorsTensor[] = [];
  const f32 = (name: string, shape: number[], data: Uint8Array) => tensors.push({ name, dtype: "f32", shape, data });
  f32("model.embed_tokens.weight", [V, dim], A("token_embedding"));
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}.`;
    f32(`${p}input_layernorm.weight`, [dim], perLayer("rms_att", l, 1, dim));
    f32(`${p}self_attn.q_proj.weight`, [dim, dim], permuteForHalfSplitRope(perLayer("wq", l, dim, dim), heads, headSize, dim * 4));
    f32(`${p}self_attn.k_proj.weight`, [kvDim, dim], permuteForHalfSplitRope(perLayer("wk", l, kvDim, dim), kvHeads, headSize, dim * 4));
    f32(`${p}self_attn.v_proj.weight`, [kvDim, dim], perLayer("wv", l, kvDim, dim));
    f32(`${p}self_attn.o_proj.weight`, [dim, dim], perLayer("wo", l, dim, dim));
    f32(`${p}post_attention_layernorm.weight`, [dim], perLayer("rms_ffn", l, 1, dim));
    f32(`${p}mlp.gate_proj.weight`, [hiddenDim, dim], perLayer("w1", l, hiddenDim, dim));
    f32(`${p}mlp.down_proj.weight`, [dim, hiddenDim], perLayer("w2", l, dim, hiddenDim));
    f32(`${p}mlp.up_proj.weight`, [hiddenDim, dim], perLayer("w3", l, hiddenDim, dim));
  }
  f32("model.norm.weight", [dim], A("rms_final"));
  if (!h.sharedClassifier) f32("lm_head.weight", [V, dim], A("wcls"));

  const tok = llama2cTokenizerToJson(tokenizerBin, V);
  progress(`tokenizer: ${V} pieces, ${(tok.tokenizer.model as { merges: unknown[] }).merges.length} merges, byte fallback ${tok.byteFallback}`);

  const config = {
    architectures: ["LlamaForCausalLM"],
    model_type: "llama",
    hidden_size: dim,
    intermediate_size: hiddenDim,
    num_hidden_layers: L,
    num_attention_heads: heads,
    num_key_value_heads: kvHeads,
    head_dim: headSize,
    hidden_act: "silu",
    vocab_size: V,
    max_position_embeddings: h.seqLen,
    rms_norm_eps: 1e-5,
    rope_theta: 10000,
    attention_bias: false,
    mlp_bias: false,
    tie_word_embeddings: h.sharedClassifier,
    bos_token_id: 1,
    eos_token_id: 2,
    torch_dtype: "float32",
  };
  // llama2.c models (TinyStories) separate stories with BOS and never emit EOS, so BOS
  // must also end a generation.
  const generationConfig = { bos_token_id: 1, eos_token_id: [2, 1], max_length: h.seqLen };
  const tokenizerConfig = {
    tokenizer_class: "LlamaTokenizerFast",
    add_bos_token: true,
    add_eos_token: false,
    bos_token: "<s>",
    eos_token: "</s>",
    unk_token: "<unk>",
    model_max_length: h.seqLen,
    clean_up_tokenization_spaces: false,
    legacy: true,
  };

  const parent = dirname(outDir);
  mkdirSync(parent, { recursive: true });
  const tmp = join(parent, `.${basename(outDir)}.tmp-${process.pid}-${Date.now().toString(36)}`);
  mkdirSync(tmp);
  try {
    const json = (o: unknown) => `${JSON.stringify(o, null, 2)}\n`;
    writeFileSync(join(tmp, "config.json"), json(config));
    writeFileSync(join(tmp, "generation_config.json"), json(generationConfig));
    writeFileSync(join(tmp, "tokenizer_config.json"), json(tokenizerConfig));
    writeFileSync(join(tmp, "tokenizer.json"), JSON.stringify(tok.tokenizer));
    progress(`writing model.safetensors (${tensors.length} tensors, ${((modelBin.length - HEADER_BYTES) / 1e6).toFixed(1)} MB)`);
    writeSafetensors(join(tmp, "model.safetensors"), tensors, { format: "pt", source: "llama2.c" });
    if (exists(outDir)) {
      const old = `${tmp}.old`;
      renameSync(outDir, old);
      renameSync(tmp, outDir);
      rmSync(old, { recursive: true, force: true });
    } else {
      renameSync(tmp, outDir);
    }
  } catch (e) {
    rmSync(tmp, { recursive: true, force: true });
    throw e;
  }
  progress(`wrote ${outDir}`);
  return outDir;
}
