import { afterAll, expect, it } from "vitest";
import { loadModel, type Backend, type DType, type KvStoreAllocator, type Tensor } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { createSelector } from "@hybridgen/selectors";
import { createHybridAttention } from "../src/index.js";
import { tinyFiles } from "./tiny-model.js";

/** Plain allocations, and a log of the rows the stage reported per V region. */
class Recorder implements KvStoreAllocator {
  readonly v: Tensor[] = [];
  readonly told: { layer: number; rows: number; ahead: boolean }[] = [];
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
  readAhead(v: Tensor, ids: Int32Array, counts: Int32Array, kmax: number, ahead: boolean): void {
    let rows = 0;
    for (let g = 0; g < counts.length; g++) {
      for (let i = 0; i < counts[g]!; i++) expect(ids[g * kmax + i]).toBeGreaterThanOrEqual(0);
      rows += counts[g]!;
    }
    this.told.push({ layer: this.v.indexOf(v), rows, ahead });
  }
}

const backend = createCpuBackend({ threads: 1 });
afterAll(() => backend.close());

it("a storeAllocator places the store and hears each layer's gathered rows; the logits do not change", async () => {
  const prompt = Int32Array.from({ length: 40 }, (_, i) => (i * 53 + 7) % 256);
  const run = async (allocator?: Recorder) => {
    using model = loadModel(tinyFiles(9), backend, { maxContext: 96, gpuKvBudget: 16, sinkTokens: 2 });
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
  expect(rec.told.every((t) => t.ahead)).toBe(true); // top-K's picks: the next layer's same slots may be read ahead
});

it("the page index's picks are told without read-ahead: only the pages it picks may leave the disk", async () => {
  const prompt = Int32Array.from({ length: 40 }, (_, i) => (i * 53 + 7) % 256);
  const rec = new Recorder();
  {
    using model = loadModel(tinyFiles(9), backend, { maxContext: 96, gpuKvBudget: 16, sinkTokens: 2 });
    const selector = createSelector("index", { pageSize: 4, superPages: 2, placement: "host" });
    using ha = await createHybridAttention(model, backend, { scheduler: "fixed", selector, k: 8, timing: "pre", logits: "exact", storeAllocator: rec });
    void ha;
    model.forward(prompt, 0);
    for (let s = 0; s < 4; s++) model.forward(Int32Array.of(5 + s), 40 + s);
  }
  expect(rec.told.filter((t) => t.layer === 2).length).toBeGreaterThanOrEqual(4);
  expect(rec.told.every((t) => !t.ahead && t.rows === 2 * 8)).toBe(true);
});
