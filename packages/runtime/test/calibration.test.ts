import { afterAll, describe, expect, it } from "vitest";
import { dummyModelFiles, HybridgenError, loadModel, type ModelFiles, type Tensor } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { createHybridAttention, hybridPlan, resolveHybrid, type HybridModel } from "../src/index.js";

const backend = createCpuBackend({ threads: 1 });
afterAll(() => backend.close());

const CONFIG = {
  architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_size: 64, intermediate_size: 128, num_hidden_layers: 4,
  num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 256, max_position_embeddings: 512, rms_norm_eps: 1e-5,
  rope_theta: 10000, tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2,
};
const PROMPT = 400;
const prompt = Int32Array.from({ length: PROMPT }, (_, i) => (i * 37 + 11) % 256);

/**
 * Random f32 weights whose layers barely move the residual stream (output projections × 1e-3),
 * so the query projected from a layer's input is nearly the next layer's true query, with
 * queries and keys scaled up for attention sharp enough that K tokens matter.
 */
function files(seed: number): ModelFiles {
  const f = dummyModelFiles(CONFIG, "f32", seed, undefined, "calibration");
  const scale = (name: string) => (/o_proj|down_proj/.test(name) ? 1e-3 : /q_proj|k_proj/.test(name) ? 3 : 1);
  return {
    ...f,
    weights: {
      names: () => f.weights.names(),
      get: (name) => {
        const v = f.weights.get(name);
        if (!v || scale(name) === 1) return v;
        const x = new Float32Array(v.bytes.buffer.slice(v.bytes.byteOffset, v.bytes.byteOffset + v.bytes.byteLength));
        for (let i = 0; i < x.length; i++) x[i]! *= scale(name);
        return { ...v, bytes: new Uint8Array(x.buffer) };
      },
    },
  };
}

const load = () => loadModel(files(3), backend, { maxContext: 512, gpuKvBudget: 16, sinkTokens: 2 });

/** The model as hybrid attention sees it, with layer `useless`'s speculative query turned around (−q̃: it ranks every token backwards). */
function turned(model: ReturnType<typeof load>, useless: number): HybridModel {
  return {
    attention: model.attention, cache: model.cache, maxContext: model.maxContext,
    projectQuery(layer: number, x: Tensor, pos: number, out: Tensor) {
      model.projectQuery(layer, x, pos, out);
      if (layer !== useless) return;
      const q = backend.read(out, 0, out.shape[1]!);
      backend.write(out, q.map((v) => -v));
    },
  };
}

describe("calibration from the prefill", () => {
  it("keeps every layer speculative where q̃ is good, and takes K from the prompt", async () => {
    using model = load();
    using ha = await createHybridAttention(model, backend, {});
    expect(hybridPlan(ha)).toMatchObject({ kSource: "default", calibrates: { k: true, exactLayers: true, massTarget: 0.95 } });
    model.forward(prompt, 0);
    const plan = hybridPlan(ha)!;
    expect(plan.calibrated).toBeDefined();
    expect(plan.calibrated!.exactLayers).toEqual([]);
    expect(ha.exactLayers).toEqual([]);
    expect(plan.kSource).toBe("calibration");
    const c = plan.calibrated!;
    expect(c.offloaded).toBeGreaterThan(60);
    expect(plan.k).toBe(c.k);
    expect(c.k).toBe(Math.max(...c.layerK));
    expect(c.layerShare.every((s) => s >= 0.95)).toBe(true);
    expect(ha.stats.summary()).toContain("calibrated from the prefill");
    // The decode steps run with the calibrated K.
    model.forward(Int32Array.of(5), PROMPT);
    expect(ha.stats.trace[0]!.k).toBe(c.k);
  });

  it("finds a layer whose q̃ is useless and makes it exact", async () => {
    using model = load();
    using ha = await createHybridAttention(turned(model, 2), backend, {});
    model.forward(prompt, 0);
    expect(hybridPlan(ha)!.calibrated!.exactLayers).toEqual([2]);
    expect(ha.exactLayers).toEqual([2]);
    expect(hybridPlan(ha)!.exactLayers).toEqual([2]);
    expect(hybridPlan(ha)!.calibrated!.layerRecall[2]).toBeLessThan(0.5);
  });

  it("calibrates again on the next prompt (generate's blocks: expectPrompt marks the last)", async () => {
    using model = load();
    using ha = await createHybridAttention(turned(model, 1), backend, {});
    model.reset();
    model.expectPrompt!(PROMPT);
    for (let off = 0; off < PROMPT; off += 96) model.forward(prompt.subarray(off, Math.min(PROMPT, off + 96)), off);
    expect(hybridPlan(ha)!.calibrated!.exactLayers).toEqual([1]);
    expect(hybridPlan(ha)!.calibrated!.tokens).toBe(PROMPT);
  });

  it("lets explicit options and a profile win", async () => {
    using model = load();
    {
      using ha = await createHybridAttention(turned(model, 2), backend, { k: 7, exactLayers: [3] });
      expect(hybridPlan(ha)!.calibrates).toBeUndefined();
      model.reset();
      model.forward(prompt, 0);
      expect(hybridPlan(ha)).toMatchObject({ k: 7, kSource: "option", exactLayers: [3] });
      expect(ha.exactLayers).toEqual([3]);
    }
    {
      // K given: the exact layers are still calibrated; exact layers given: K still is.
      using ha = await createHybridAttention(turned(model, 2), backend, { k: 7 });
      model.reset();
      model.forward(prompt, 0);
      expect(hybridPlan(ha)).toMatchObject({ k: 7, kSource: "option", exactLayers: [2] });
    }
    {
      using ha = await createHybridAttention(turned(model, 2), backend, { exactLayers: [] });
      model.reset();
      model.forward(prompt, 0);
      expect(hybridPlan(ha)).toMatchObject({ kSource: "calibration", exactLayers: [] });
    }
    {
      using ha = await createHybridAttention(turned(model, 2), backend, { profile: { kMin: 9, exactLayers: [1] } });
      model.reset();
      model.forward(prompt, 0);
      expect(hybridPlan(ha)).toMatchObject({ k: 9, kSource: "profile", exactLayers: [1] });
      expect(hybridPlan(ha)!.calibrated).toBeUndefined();
    }
    {
      using ha = await createHybridAttention(turned(model, 2), backend, { calibrate: false });
      model.reset();
      model.forward(prompt, 0);
      expect(hybridPlan(ha)).toMatchObject({ k: 64, kSource: "default", exactLayers: [] });
    }
  });

  it("starts from a calibration given, until the prompt's own replaces it", async () => {
    using model = load();
    using ha = await createHybridAttention(turned(model, 2), backend, { calibration: { k: 21, exactLayers: [1], layerK: [21, 10, 10, 10] } });
    expect(hybridPlan(ha)).toMatchObject({ k: 21, kSource: "calibration", exactLayers: [1] });
    model.forward(prompt, 0);
    expect(ha.exactLayers).toEqual([2]);
  });

  it("refuses bad values with one-line errors", async () => {
    for (const massTarget of [0, 1.5, -1]) {
      expect(() => resolveHybrid({ massTarget }, { device: false })).toThrow(HybridgenError);
      expect(() => resolveHybrid({ massTarget }, { device: false })).toThrow(/massTarget: must be (above 0|at most 1)/);
    }
    expect(() => resolveHybrid({ massTarget: 1 }, { device: false })).not.toThrow();
    using model = load();
    await expect(createHybridAttention(model, backend, { exactLayers: [99] })).rejects.toThrow(/layer 99 does not exist \(the model has 4\)/);
  });
});
