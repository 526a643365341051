/** Test helpers of the engine tests: a seeded PRNG, random arrays, a tiny in-memory Llama. */
import { encodeFromF32, seededRandom, type DType } from "@hybridgen/spec";
import { LlamaConfigSchema, resolveLlamaShape } from "../config.js";
import type { ModelFiles, WeightView } from "../model-files.js";
import type { Tokenizer } from "../tokenizer.js";

/** Seeded PRNG (mulberry32, @hybridgen/spec's seeded-random.ts) for test data. */
export const makeRng = seededRandom;

/** Uniform values in [-scale, scale), never all zero. */
export function randomArray(rng: () => number, n: number, scale = 1): Float32Array {
  const a = new Float32Array(n);
  for (let i = 0; i < n; i++) a[i] = (rng() * 2 - 1) * scale;
  return a;
}

export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length ${a.length} vs ${b.length}`);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

/**
 * `inner` with some methods replaced (an `undefined` entry hides one, as a backend without that
 * optional op); every other method is bound to `inner`.
 */
export function withMethods<T extends object>(inner: T, methods: Record<string, unknown>): T {
  return new Proxy(inner, {
    get(target, prop) {
      if (typeof prop === "string" && prop in methods) return methods[prop];
      const v = Reflect.get(target, prop, target);
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
}

/** `n` token ids uniform in [0, vocab), from the seed. */
export function randomIds(seed: number, n: number, vocab = 50): number[] {
  const rng = makeRng(seed);
  return Array.from({ length: n }, () => Math.floor(rng() * vocab));
}

/** The seed of a test: fixed for reproducible CI, HYBRIDGEN_TEST_SEED=n draws fresh inputs. */
export function testSeed(base: number): number {
  const env = process.env.HYBRIDGEN_TEST_SEED;
  return env ? (Number(env) ^ base) >>> 0 : base;
}

// ---- a tiny random Llama held in memory -------------------------------------------------

export interface TinyModelOptions {
  seed: number;
  layers?: number;
  hidden?: number;
  heads?: number;
  kvHeads?: number;
  intermediate?: number;
  vocab?: number;
  maxPositions?: number;
  tie?: boolean;
  attentionBias?: boolean;
  storedDtype?: DType;
  eos?: number;
}

/** Random f32 values of every tensor, by HF name (the naive reference reads these). */
export type TinyWeights = Map<string, { shape: number[]; values: Float32Array }>;

export function tinyModel(o: TinyModelOptions): { files: ModelFiles; weights: TinyWeights } {
  const rng = makeRng(o.seed);
  const L = o.layers ?? 2, dim = o.hidden ?? 48, H = o.heads ?? 4, KV = o.kvHeads ?? 2;
  const inter = o.intermediate ?? 64, vocab = o.vocab ?? 50, hd = dim / H;
  const config = LlamaConfigSchema.parse({
    hidden_size: dim, intermediate_size: inter, num_hidden_layers: L, num_attention_heads: H,
    num_key_value_heads: KV, vocab_size: vocab, max_position_embeddings: o.maxPositions ?? 64,
    rms_norm_eps: 1e-5, rope_theta: 500, tie_word_embeddings: o.tie ?? false,
    attention_bias: o.attentionBias ?? false, bos_token_id: 1, eos_token_id: o.eos ?? 2,
  });
  const weights: TinyWeights = new Map();
  // Scales keep activations O(1) so the test compares meaningful logits.
  const add = (name: string, shape: number[], scale: number, offset = 0) => {
    const n = shape.reduce((a, b) => a * b, 1);
    const values = randomArray(rng, n, scale);
    for (let i = 0; i < n; i++) values[i] += offset;
    weights.set(name, { shape, values });
  };
  add("model.embed_tokens.weight", [vocab, dim], 1);
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}.`;
    add(`${p}input_layernorm.weight`, [dim], 0.2, 1);
    add(`${p}self_attn.q_proj.weight`, [H * hd, dim], 0.5);
    add(`${p}self_attn.k_proj.weight`, [KV * hd, dim], 0.5);
    add(`${p}self_attn.v_proj.weight`, [KV * hd, dim], 0.3);
    add(`${p}self_attn.o_proj.weight`, [dim, H * hd], 0.2);
    if (o.attentionBias) {
      add(`${p}self_attn.q_proj.bias`, [H * hd], 0.3);
      add(`${p}self_attn.k_proj.bias`, [KV * hd], 0.3);
      add(`${p}self_attn.v_proj.bias`, [KV * hd], 0.3);
      add(`${p}self_attn.o_proj.bias`, [dim], 0.3);
    }
    add(`${p}post_attention_layernorm.weight`, [dim], 0.2, 1);
    add(`${p}mlp.gate_proj.weight`, [inter, dim], 0.3);
    add(`${p}mlp.up_proj.weight`, [inter, dim], 0.3);
    add(`${p}mlp.down_proj.weight`, [dim, inter], 0.2);
  }
  add("model.norm.weight", [dim], 0.2, 1);
  if (!(o.tie ?? false)) add("lm_head.weight", [vocab, dim], 0.3);

  const dtype = o.storedDtype ?? "f32";
  const views = new Map<string, WeightView>();
  for (const [name, w] of weights) views.set(name, { dtype, shape: w.shape, bytes: encodeFromF32(w.values, dtype) });
  const files: ModelFiles = {
    dir: "<memory>",
    config,
    shape: resolveLlamaShape(config),
    weights: { get: (n) => views.get(n), names: () => [...views.keys()] },
    tokenizer: charTokenizer(vocab),
    close() {},
    [Symbol.dispose]() {},
  };
  return { files, weights };
}

/**
 * A byte-level tokenizer like SentencePiece's byte fallback: 0 unk, 1 BOS, 2 EOS, id b + 3
 * is byte b (bytes the vocabulary lacks encode as unk). A multi-byte UTF-8 character spans
 * several tokens.
 */
export function charTokenizer(vocab: number): Tokenizer {
  const base = 3;
  return {
    vocabSize: vocab,
    bosId: 1,
    eosId: 2,
    encode(text, options) {
      const ids = options?.addBos === false ? [] : [1];
      for (const b of new TextEncoder().encode(text)) ids.push(b + base < vocab ? b + base : 0);
      return ids;
    },
    decodeBytes(id) {
      return id >= base ? Uint8Array.of(id - base) : new Uint8Array(0);
    },
    decode(ids) {
      return new TextDecoder().decode(Uint8Array.from(ids.filter((i) => i >= base).map((i) => i - base)));
    },
  };
}
