/** The dummy-model helpers the benches and device checks share: presetConfig overrides, dummyModelFiles, greedyDummyRun, relL2Error. */
import { describe, expect, it } from "vitest";
import { ReferenceBackend, STORIES15M_SHAPE, dummyModelFiles, greedyDummyRun, presetConfig, relL2Error } from "../src/index.js";

const SMALL = { ...STORIES15M_SHAPE, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, vocab_size: 64 };

describe("dummy models", () => {
  it("presetConfig puts overrides on a fresh copy of the preset", () => {
    const small = presetConfig("llama-3.2-1b", { num_hidden_layers: 4 });
    expect(small.num_hidden_layers).toBe(4);
    expect(small.hidden_size).toBe(presetConfig("llama-3.2-1b").hidden_size);
    expect(presetConfig("llama-3.2-1b").num_hidden_layers).not.toBe(4);
  });

  it("dummyModelFiles names its dir and config by the label and has no EOS", () => {
    using files = dummyModelFiles(SMALL, "f32", 3, undefined, "small");
    expect(files.dir).toBe("small");
    expect(files.shape.vocabSize).toBe(64);
    expect(files.weights.names().length).toBeGreaterThan(0);
    expect(() => dummyModelFiles({ ...SMALL, hidden_size: -1 }, "f32", 3, undefined, "bad")).toThrow(/bad config\.json/);
  });

  it("greedyDummyRun is deterministic: the same prompt gives the same logits and tokens", () => {
    using be = new ReferenceBackend();
    const prompt = Int32Array.of(1, 5, 9, 13);
    const a = greedyDummyRun(be, SMALL, "f32", prompt, 3), b = greedyDummyRun(be, SMALL, "f32", prompt, 3);
    expect(a.tokens).toHaveLength(3);
    expect(a.logits).toHaveLength(3);
    expect(a.first).toHaveLength(64);
    expect(b.tokens).toEqual(a.tokens);
    expect(relL2Error(b.first, a.first)).toBe(0);
  });

  it("relL2Error: ‖a − b‖/‖b‖, ‖a − b‖ for a zero b, Infinity for a length mismatch or a NaN", () => {
    expect(relL2Error(Float32Array.of(3, 4), Float32Array.of(0, 0))).toBe(5);
    expect(relL2Error(Float32Array.of(1, 1), Float32Array.of(0, 2))).toBeCloseTo(Math.SQRT2 / 2, 6);
    expect(relL2Error(Float32Array.of(1), Float32Array.of(1, 2))).toBe(Infinity);
    expect(relL2Error(Float32Array.of(Number.NaN), Float32Array.of(1))).toBe(Infinity);
  });
});
