// fillSyntheticKv: a cache at a length without computing a row — the window's seeded random rows,
// carried into the offloaded store by the cache's own evictions; the same seed gives the same rows,
// another seed others; a length outside [length, maxContext] is a one-line error.
import { afterAll, describe, expect, it } from "vitest";
import { dummyModelFiles, loadModel, type LlamaModel } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { fillSyntheticKv } from "../src/index.js";
import { TINY_CONFIG } from "./tiny-model.js";

const CONTEXT = 128;
const backend = createCpuBackend({ threads: 1 });
afterAll(() => backend.close());
const load = () => loadModel(dummyModelFiles({ ...TINY_CONFIG, max_position_embeddings: CONTEXT }, "f32", 5, undefined, "tiny-128"), backend, { maxContext: CONTEXT, gpuKvBudget: 16, sinkTokens: 2 }) as LlamaModel;

describe("fillSyntheticKv", () => {
  it("fills the window with random rows and offloads the rest through evictions; seeded", () => {
    using a = load();
    fillSyntheticKv(backend, a.cache, 100, 7);
    expect(a.cache.length).toBe(100);
    expect(a.cache.storeCount + a.cache.windowCount).toBe(100);
    expect(a.cache.storeCount).toBeGreaterThan(80);
    const store = backend.read(a.cache.storeK[1]!);
    const offloadedRow = store.subarray(0, a.cache.headDim);
    expect(offloadedRow.some((x) => x !== 0)).toBe(true);
    expect(Math.max(...offloadedRow.map(Math.abs))).toBeLessThanOrEqual(0.5);
    using b = load();
    fillSyntheticKv(backend, b.cache, 100, 7);
    expect(backend.read(b.cache.storeK[1]!)).toEqual(store);
    using c = load();
    fillSyntheticKv(backend, c.cache, 100, 8);
    expect(backend.read(c.cache.storeK[1]!)).not.toEqual(store);
    // The model decodes from there: its next step sees position 100.
    c.step(Int32Array.of(3), 100);
    expect(c.cache.length).toBe(101);
  });

  it("a length outside [length, maxContext] is a one-line error", () => {
    using m = load();
    expect(() => fillSyntheticKv(backend, m.cache, CONTEXT + 1)).toThrow(/^synthetic KV: length 129 outside \[0, 128\]$/);
    fillSyntheticKv(backend, m.cache, 50);
    expect(() => fillSyntheticKv(backend, m.cache, 40)).toThrow(/^synthetic KV: length 40 outside \[50, 128\]$/);
  });
});
