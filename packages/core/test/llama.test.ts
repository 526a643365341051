import { describe, expect, it } from "vitest";
import { HybridgenError, LlamaModel, ReferenceBackend, type DType, type ModelFiles } from "../src/index.js";
import { roundTo } from "@hybridgen/spec";
import { maxAbsDiff, randomIds, testSeed, tinyModel, type TinyWeights } from "../src/testing/index.js";

/**
 * Independent naive Llama forward over the whole sequence in f64: logits of every position.
 * Written from the architecture's definition (no Backend, no KV cache, no blocks).
 */
function naiveForward(files: ModelFiles, weights: TinyWeights, ids: number[], round: (v: number) => number = (v) => v): number[][] {
  const s = files.shape, dim = s.hiddenSize, H = s.heads, KV = s.kvHeads, hd = s.headDim, inter = s.intermediateSize;
  const get = (name: string) => weights.get(name)!.values;
  const W = (name: string) => Array.from(get(name), round); // matmul weights as the model stores them
  const linear = (x: number[], w: number[], out: number, inn: number, b?: Float32Array) =>
    Array.from({ length: out }, (_, j) => {
      let acc = b ? b[j] : 0;
      for (let c = 0; c < inn; c++) acc += x[c] * w[j * inn + c];
      return acc;
    });
  const rms = (x: number[], w: Float32Array) => {
    const r = 1 / Math.sqrt(x.reduce((a, v) => a + v * v, 0) / x.length + s.normEps);
    return x.map((v, i) => v * r * w[i]);
  };
  const rope = (v: number[], heads: number, pos: number) => {
    const out = v.slice();
    for (let h = 0; h < heads; h++)
      for (let j = 0; j < hd / 2; j++) {
        const ang = pos / s.ropeTheta ** ((2 * j) / hd);
        const a = v[h * hd + j], b = v[h * hd + j + hd / 2];
        out[h * hd + j] = a * Math.cos(ang) - b * Math.sin(ang);
        out[h * hd + j + hd / 2] = b * Math.cos(ang) + a * Math.sin(ang);
      }
    return out;
  };
  const bias = (name: string) => weights.get(name)?.values;
  const embed = W("model.embed_tokens.weight");
  let xs = ids.map((id) => embed.slice(id * dim, (id + 1) * dim));
  for (let l = 0; l < s.layers; l++) {
    const p = `model.layers.${l}.`;
    const wq = W(`${p}self_attn.q_proj.weight`), wk = W(`${p}self_attn.k_proj.weight`), wv = W(`${p}self_attn.v_proj.weight`);
    const wo = W(`${p}self_attn.o_proj.weight`);
    const hs = xs.map((x) => rms(x, get(`${p}input_layernorm.weight`)));
    const qs = hs.map((h, t) => rope(linear(h, wq, H * hd, dim, bias(`${p}self_attn.q_proj.bias`)), H, t));
    const ks = hs.map((h, t) => rope(linear(h, wk, KV * hd, dim, bias(`${p}self_attn.k_proj.bias`)), KV, t));
    const vs = hs.map((h) => linear(h, wv, KV * hd, dim, bias(`${p}self_attn.v_proj.bias`)));
    xs = xs.map((x, t) => {
      const att = new Array(H * hd).fill(0);
      for (let h = 0; h < H; h++) {
        const g = Math.floor(h / (H / KV));
        const sc = Array.from({ length: t + 1 }, (_, u) => {
          let d = 0;
          for (let c = 0; c < hd; c++) d += qs[t][h * hd + c] * ks[u][g * hd + c];
          return d / Math.sqrt(hd);
        });
        const m = Math.max(...sc);
        const e = sc.map((v) => Math.exp(v - m));
        const z = e.reduce((a, v) => a + v, 0);
        for (let u = 0; u <= t; u++) for (let c = 0; c < hd; c++) att[h * hd + c] += (e[u] / z) * vs[u][g * hd + c];
      }
      const o = linear(att, wo, dim, H * hd, bias(`${p}self_attn.o_proj.bias`));
      return x.map((v, i) => v + o[i]);
    });
    const wg = W(`${p}mlp.gate_proj.weight`), wu = W(`${p}mlp.up_proj.weight`), wd = W(`${p}mlp.down_proj.weight`);
    xs = xs.map((x) => {
      const h = rms(x, get(`${p}post_attention_layernorm.weight`));
      const g = linear(h, wg, inter, dim), u = linear(h, wu, inter, dim);
      const a = g.map((v, i) => (v / (1 + Math.exp(-v))) * u[i]);
      const d = linear(a, wd, dim, inter);
      return x.map((v, i) => v + d[i]);
    });
  }
  const head = s.tieEmbeddings ? embed : W("lm_head.weight");
  return xs.map((x) => linear(rms(x, get("model.norm.weight")), head, s.vocabSize, dim));
}

// f32 activations vs the f64 reference: logits are O(1..10), the error of a 2-layer pass
// with f32 rounding stays well below 1e-4.
const TOL = 1e-4;

describe("LlamaModel vs a naive f64 forward", () => {
  it("prefill (one block) and then token-by-token decode match at every position (GQA, untied)", () => {
    const { files, weights } = tinyModel({ seed: testSeed(1) });
    const ids = randomIds(testSeed(2), 24, 50);
    const want = naiveForward(files, weights, ids);
    const be = new ReferenceBackend();
    using model = LlamaModel.load(files, be);
    expect(maxAbsDiff(model.forward(Int32Array.from(ids.slice(0, 10)), 0), want[9])).toBeLessThan(TOL);
    for (let t = 10; t < ids.length; t++) {
      expect(maxAbsDiff(model.forward(Int32Array.of(ids[t]), t), want[t])).toBeLessThan(TOL);
    }
    expect(model.argmaxLogits()).toBe(want[ids.length - 1].indexOf(Math.max(...want[ids.length - 1])));
  });

  it("prefill in blocks == token by token (tied embeddings, attention bias)", () => {
    const { files, weights } = tinyModel({ seed: testSeed(3), tie: true, attentionBias: true });
    const ids = randomIds(testSeed(4), 23, 50);
    const want = naiveForward(files, weights, ids);
    const be = new ReferenceBackend();
    using blocked = LlamaModel.load(files, be, { prefillBlock: 5 });
    const fromBlocks = blocked.forward(Int32Array.from(ids), 0);
    using single = LlamaModel.load(files, be, { prefillBlock: 5 });
    let last: Float32Array = new Float32Array();
    for (let t = 0; t < ids.length; t++) {
      last = single.forward(Int32Array.of(ids[t]), t);
      expect(maxAbsDiff(last, want[t])).toBeLessThan(TOL);
    }
    expect(maxAbsDiff(fromBlocks, last)).toBeLessThan(1e-5);
    expect(maxAbsDiff(fromBlocks, want[ids.length - 1])).toBeLessThan(TOL);
  });

  it("several KV window budgets give the logits of the all-resident cache", () => {
    const { files } = tinyModel({ seed: testSeed(5), maxPositions: 48 });
    const ids = randomIds(testSeed(6), 40, 50);
    const be = new ReferenceBackend();
    const run = (opts: Parameters<typeof LlamaModel.load>[2]) => {
      using m = LlamaModel.load(files, be, { prefillBlock: 6, ...opts });
      const out = [m.forward(Int32Array.from(ids.slice(0, 17)), 0)];
      for (let t = 17; t < ids.length; t++) out.push(m.forward(Int32Array.of(ids[t]), t));
      const stored = m.cache.storeCount;
      return { out, stored };
    };
    const all = run({});
    expect(all.stored).toBe(0);
    for (const [gpuKvBudget, kvEvictBlock] of [[4, 2], [7, 3], [16, 16], [25, 4]]) {
      const r = run({ gpuKvBudget, kvEvictBlock });
      expect(r.stored).toBeGreaterThan(0); // tokens really were offloaded
      r.out.forEach((l, i) => expect(maxAbsDiff(l, all.out[i])).toBeLessThan(1e-5));
    }
  });

  for (const dtype of ["f16", "bf16"] as DType[]) {
    it(`weights converted to ${dtype} at load match the reference on rounded weights`, () => {
      const { files, weights } = tinyModel({ seed: testSeed(7) });
      const ids = randomIds(testSeed(8), 12, 50);
      const want = naiveForward(files, weights, ids, (v) => roundTo(dtype, v));
      const be = new ReferenceBackend();
      using model = LlamaModel.load(files, be, { weightDtype: dtype, prefillBlock: 4 });
      expect(model.weightDtype).toBe(dtype);
      expect(maxAbsDiff(model.forward(Int32Array.from(ids), 0), want[11])).toBeLessThan(TOL);
    });
  }

  it("loads weights stored as bf16 as they are, and a bf16 KV cache stays close", () => {
    const { files, weights } = tinyModel({ seed: testSeed(9), storedDtype: "bf16" });
    const ids = randomIds(testSeed(10), 12, 50);
    const want = naiveForward(files, weights, ids, (v) => roundTo("bf16", v));
    const be = new ReferenceBackend();
    using model = LlamaModel.load(files, be, { kvDtype: "bf16" });
    expect(model.weightDtype).toBe("bf16");
    // bf16 K/V keep 8 bits of mantissa: logits move by ~1e-2 at most on this model.
    expect(maxAbsDiff(model.forward(Int32Array.from(ids), 0), want[11])).toBeLessThan(5e-2);
  });
});

describe("LlamaModel lifecycle and errors", () => {
  it("reset() starts over with identical logits; close() frees every tensor", () => {
    const { files } = tinyModel({ seed: testSeed(11) });
    const be = new ReferenceBackend();
    const model = LlamaModel.load(files, be, { gpuKvBudget: 8, kvEvictBlock: 4, prefillBlock: 8 });
    const ids = Int32Array.from(randomIds(testSeed(12), 20, 50));
    const a = model.forward(ids, 0);
    model.reset();
    expect(model.length).toBe(0);
    expect(maxAbsDiff(model.forward(ids, 0), a)).toBe(0);
    model.close();
    expect(be.liveTensors()).toBe(0);
    expect(() => model.forward(ids, 0)).toThrow(/after close/);
  });

  it("one-line errors naming the tensor, the overflow, the position, the id", () => {
    const be = new ReferenceBackend();
    const { files } = tinyModel({ seed: testSeed(13) });
    const missing: ModelFiles = { ...files, weights: { get: (n) => (n.includes("layers.1.mlp.up_proj") ? undefined : files.weights.get(n)), names: () => [] } };
    expect(() => LlamaModel.load(missing, be)).toThrow("missing tensor model.layers.1.mlp.up_proj.weight in the model weights");
    expect(be.liveTensors()).toBe(0); // a failed load frees what it allocated
    const wrong: ModelFiles = {
      ...files,
      weights: { get: (n) => { const w = files.weights.get(n); return w && n.endsWith("0.self_attn.k_proj.weight") ? { ...w, shape: [12, 48] } : w; }, names: () => [] },
    };
    expect(() => LlamaModel.load(wrong, be)).toThrow("tensor model.layers.0.self_attn.k_proj.weight has shape [12, 48], expected [24, 48]");
    expect(() => LlamaModel.load(files, be, { maxContext: 65 })).toThrow(/exceeds the model's max_position_embeddings 64/);
    expect(() => LlamaModel.load(files, be, { prefillBlock: 0 })).toThrow(/invalid load option prefillBlock/);
    using model = LlamaModel.load(files, be, { maxContext: 16 });
    expect(() => model.forward(new Int32Array(17).fill(3), 0)).toThrow(HybridgenError);
    expect(() => model.forward(new Int32Array(17).fill(3), 0)).toThrow("context overflow: 0 + 17 tokens exceed the context of 16");
    expect(() => model.forward(Int32Array.of(3), 4)).toThrow(/startPos 4 must equal the cached length 0/);
    expect(() => model.forward(Int32Array.of(50), 0)).toThrow("forward: token id 50 out of range [0, 50)");
    expect(model.length).toBe(0); // rejected before any work
  });
});
