import { afterAll, expect, it } from "vitest";
import { ByteTokenizer, DummyWeightSource, describeModel, loadModel, tensorSpecsOf, type Backend, type DType, type KvStoreAllocator, type ModelFiles, type Tensor } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { createHybridAttention } from "../src/index.js";

// A tiny Llama (4 heads over 2 KV heads), random f32 weights: 3 layers, 96-token context.
const CONFIG = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 64, intermediate_size: 128, num_hidden_layers: 3,
  num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 256, max_position_embeddings: 96, rms_norm_eps: 1e-5,
  rope_theta: 10000, tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2,
};

function tinyFiles(): ModelFiles {
  const { config, shape } = describeModel(CONFIG, "tiny config.json");
  const weights = new DummyWeightSource(tensorSpecsOf(config, shape), { dtype: "f32", seed: 9 });
  const close = (): void => {};
  return { dir: "tiny", config, shape, weights, tokenizer: new ByteTokenizer(shape.vocabSize), chatTemplate: null, close, [Symbol.dispose]: close };
}

/** Plain allocations, and a log of the rows the stage reported per V region. */
class Recorder implements KvStoreAllocator {
  readonly v: Tensor[] = [];
  readonly told: { layer: number; rows: number }[] = [];
  released = 0;
  alloc(backend: Backend, pool: "k" | "v", _layer: number, shape: readonly number[], dtype: DType): Tensor {
    const t = backend.alloc(shape, dtype);
    if (pool === "v") this.v.push(t);
    return t;
  }
  pinnable(): boolean {
    return true;
  }
  release(): void {
    this.released++;
  }
  readAhead(v: Tensor, ids: Int32Array, counts: Int32Array, kmax: number): void {
    let rows = 0;
    for (let g = 0; g < counts.length; g++) {
      for (let i = 0; i < counts[g]!; i++) expect(ids[g * kmax + i]).toBeGreaterThanOrEqual(0);
      rows += counts[g]!;
    }
    this.told.push({ layer: this.v.indexOf(v), rows });
  }
}

const backend = createCpuBackend({ threads: 1 });
afterAll(() => backend.close());

it("a storeAllocator places the store and hears each layer's gathered rows; the logits do not change", async () => {
  const prompt = Int32Array.from({ length: 40 }, (_, i) => (i * 53 + 7) % 256);
  const run = async (allocator?: Recorder) => {
    using model = loadModel(tinyFiles(), backend, { maxContext: 96, gpuKvBudget: 16, sinkTokens: 2 });
    using ha = await createHybridAttention(model, backend, { scheduler: "fixed", selector: "topk", k: 4, logits: "exact", ...(allocator ? { storeAllocator: allocator } : {}) });
    void ha;
    const out = [Array.from(model.forward(prompt, 0))];
    for (let s = 0; s < 4; s++) out.push(Array.from(model.forward(Int32Array.of(5 + s), 40 + s)));
    return out;
  };
  const plain = await run();
  const rec = new Recorder();
  const placed = await run(rec);
  expect(placed).toEqual(plain);
  expect(rec.released).toBe(1);
  // Every decode step told the allocator about each of the 3 layers, K = 4 rows per KV head.
  const steps = rec.told.filter((t) => t.layer === 0).length;
  expect(steps).toBeGreaterThanOrEqual(4);
  expect(rec.told.filter((t) => t.layer === 2)).toHaveLength(steps);
  expect(rec.told.every((t) => t.rows === 2 * 4)).toBe(true);
});
