import { describe, expect, it } from "vitest";
import { BackendCpuStage, ByteTokenizer, describeModel, DummyWeightSource, LlamaModel, ReferenceBackend, seededRandom as rng, tensorSpecsOf, type ModelFiles, type Scheduler, type SelectionTiming, type TokenSelector } from "@hybridgen/core";
import { HybridAttention } from "../src/index.js";
import { createSelector } from "@hybridgen/selectors";

/** A 2-layer GQA Llama (4 query heads, 2 KV heads, headDim 16) with seeded dummy weights. */
function tinyLlama(kvDtype: "f32" | "bf16"): ModelFiles {
  const json = {
    architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 64, intermediate_size: 96, num_hidden_layers: 2,
    num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 64, max_position_embeddings: 128, rms_norm_eps: 1e-5,
    rope_theta: 500, tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2, torch_dtype: kvDtype === "bf16" ? "bfloat16" : "float32",
  };
  const { config, shape } = describeModel(json, "tiny config");
  const close = (): void => {};
  return {
    dir: "<tiny>", config, shape, weights: new DummyWeightSource(tensorSpecsOf(config, shape), { seed: 5, dtype: "f32" }),
    tokenizer: new ByteTokenizer(shape.vocabSize, null, 2), chatTemplate: null, close, [Symbol.dispose]: close,
  } as ModelFiles;
}

const fixed = (k: number, timing: SelectionTiming): Scheduler => ({ name: "fixed", initial: () => ({ k, timing }), next: () => ({ k, timing }), reset() {} });

const CONTEXT = 100, PROMPT = 8;
const ids = (() => {
  const r = rng(41);
  return Array.from({ length: CONTEXT }, () => 3 + Math.floor(r() * 60));
})();

/** Teacher-forced logits after every token from PROMPT − 1 on. */
function forced(model: LlamaModel): Float32Array[] {
  model.reset();
  const out = [model.forward(Int32Array.from(ids.slice(0, PROMPT)), 0).slice()];
  for (let t = PROMPT; t < CONTEXT - 1; t++) out.push(model.forward(Int32Array.of(ids[t]!), t).slice());
  return out;
}

const argmax = (l: Float32Array) => l.indexOf(Math.max(...l));

/** Full-attention logits and a runner of hybrid attention over a 20-token window (2 sinks). */
function setup(be: ReferenceBackend, kvDtype: "f32" | "bf16" = "f32") {
  const files = tinyLlama("f32");
  const full = LlamaModel.load(files, be, { maxContext: CONTEXT, kvDtype });
  const want = forced(full);
  full.close();
  const hyb = LlamaModel.load(files, be, { maxContext: CONTEXT, gpuKvBudget: 20, sinkTokens: 2, kvEvictBlock: 4, kvDtype });
  const run = (selector: TokenSelector, k: number, timing: SelectionTiming): Float32Array[] => {
    using h = HybridAttention.attach({
      attention: hyb.attention, projector: hyb, stage: new BackendCpuStage(be), selector, scheduler: fixed(k, timing),
    }, { logits: "exact" });
    const got = forced(hyb);
    expect(h.stats.steps).toBeGreaterThan(0);
    return got;
  };
  return { want, run };
}

describe("quest and infinigen in hybrid attention (pre-QKᵀ, the stage's keys)", () => {
  it("one-token pages and every channel give exact top-K's logits (a bf16 cache: Quest's bf16 summaries hold its keys exactly)", () => {
    using be = new ReferenceBackend();
    const { run } = setup(be, "bf16");
    const topk = run(createSelector("topk"), 12, "post");
    for (const sel of [createSelector("quest", { pageSize: 1 }), createSelector("infinigen", { channels: 16 })]) {
      const got = run(sel, 12, "pre");
      got.forEach((l, i) => l.forEach((v, j) => expect(Math.abs(v - topk[i]![j]!), `${sel.name} step ${i}`).toBeLessThan(1e-4)));
    }
  });

  it("default settings stay closer to full attention than StreamingLLM does", () => {
    using be = new ReferenceBackend();
    const { want, run } = setup(be);
    const agreement = (got: Float32Array[]) => got.filter((l, i) => argmax(l) === argmax(want[i]!)).length / got.length;
    const error = (got: Float32Array[]) => got.reduce((s, l, i) => s + l.reduce((t, v, j) => t + Math.abs(v - want[i]![j]!), 0), 0);
    const streaming = run(createSelector("streaming"), 16, "pre");
    const topk = run(createSelector("topk"), 16, "post");
    for (const sel of [createSelector("quest", { pageSize: 4 }), createSelector("infinigen", { channels: 4 })]) {
      const got = run(sel, 16, "pre");
      expect(agreement(got), sel.name).toBeGreaterThanOrEqual(agreement(streaming));
      expect(error(got), sel.name).toBeLessThan(error(streaming));
    }
  });
});
