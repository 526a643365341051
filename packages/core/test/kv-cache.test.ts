import { describe, expect, it } from "vitest";
import { HybridgenError, KvCache, LlamaModel, ReferenceBackend, type DType } from "../src/index.js";
import { roundTo } from "@hybridgen/spec";
import { makeRng, randomArray, randomIds, testSeed, tinyModel } from "../src/testing/index.js";

const layers = 2, kvHeads = 3, headDim = 4, maxContext = 70;

/** Random appends / writes / evictions, checking after every step that window ∪ store holds
 * each position exactly once, in order, with the data written for it. */
function exercise(budget: number | undefined, block: number, maxAppend: number, dtype: DType, seed: number, sinks = 0) {
  const rng = makeRng(seed);
  const be = new ReferenceBackend();
  const cache = new KvCache(be, { layers, kvHeads, headDim, maxContext, gpuKvBudget: budget, evictBlock: block, maxAppend, dtype, sinkTokens: sinks });
  // written[layer][kv][pos] = the row values of position pos, KV head g.
  const written: Float32Array[][][] = [];
  for (let l = 0; l < layers; l++) written.push([[], []]);
  let evictions = 0;

  const checkInvariants = () => {
    const len = cache.length;
    const seen = new Array(len).fill(0);
    // Store: positions [S, S + storeCount) at slot = position − S (S = sinks, pinned in the window).
    const S = cache.storeStart;
    for (let p = S; p < S + cache.storeCount; p++) expect(cache.locate(p)).toEqual({ region: "store", slot: p - S });
    for (let p = 0; p < Math.min(sinks, len); p++) expect(cache.locate(p)).toEqual({ region: "window", slot: p });
    // All spans: position order, contiguous, covering [0, length); the token map agrees.
    let next = 0;
    for (const s of cache.spans()) {
      expect(s.pos).toBe(next);
      for (let j = 0; j < s.count; j++) {
        expect(cache.locate(s.pos + j)).toEqual({ region: s.region, slot: s.slot + j });
        seen[s.pos + j]++;
      }
      next += s.count;
    }
    expect(next).toBe(len);
    expect(cache.windowSpans().reduce((a, s) => a + s.count, 0)).toBe(cache.windowCount);
    expect(seen.every((c) => c === 1)).toBe(true);
    expect(cache.windowCount).toBeLessThanOrEqual(cache.windowCapacity);
    // Data: every position's rows are where the map says.
    for (let l = 0; l < layers; l++)
      for (let p = 0; p < len; p++) {
        const { region, slot } = cache.locate(p);
        const [kt, vt, cap] = region === "store"
          ? [cache.storeK[l], cache.storeV[l], cache.storeCapacity]
          : [cache.windowK[l], cache.windowV[l], cache.windowCapacity];
        for (let g = 0; g < kvHeads; g++) {
          const want = written[l][0][p].subarray(g * headDim, (g + 1) * headDim);
          expect(Array.from(be.read(kt, (g * cap + slot) * headDim, headDim))).toEqual(Array.from(want, (v) => roundTo(dtype, v)));
          const wantV = written[l][1][p].subarray(g * headDim, (g + 1) * headDim);
          expect(Array.from(be.read(vt, (g * cap + slot) * headDim, headDim))).toEqual(Array.from(wantV, (v) => roundTo(dtype, v)));
        }
      }
  };

  const kBuf = be.alloc([maxAppend * kvHeads, headDim]);
  const vBuf = be.alloc([maxAppend * kvHeads, headDim]);
  while (cache.length < maxContext) {
    const n = Math.min(maxContext - cache.length, 1 + Math.floor(rng() * maxAppend));
    const first = cache.append(n);
    for (let l = 0; l < layers; l++) {
      const k = randomArray(rng, n * kvHeads * headDim), v = randomArray(rng, n * kvHeads * headDim);
      be.write(kBuf, k);
      be.write(vBuf, v);
      cache.writeRows(l, kBuf, vBuf, first, n);
      for (let i = 0; i < n; i++) {
        written[l][0][first + i] = k.slice(i * kvHeads * headDim, (i + 1) * kvHeads * headDim);
        written[l][1][first + i] = v.slice(i * kvHeads * headDim, (i + 1) * kvHeads * headDim);
      }
    }
    checkInvariants();
    const before = cache.windowCount;
    const moved = cache.evict();
    if (moved > 0) {
      evictions++;
      // Whole blocks, unless the window emptied; never below budget − block resident.
      expect(moved % block === 0 || moved === before).toBe(true);
      expect(cache.windowCount).toBeLessThanOrEqual(cache.gpuKvBudget);
      expect(cache.windowCount).toBeGreaterThan(Math.min(before - moved, cache.gpuKvBudget - block) - 1);
      expect(cache.sinkCount).toBe(Math.min(sinks, cache.length)); // sinks are never evicted
    }
    checkInvariants();
  }
  const result = { evictions, storeCount: cache.storeCount };
  cache.reset();
  expect(cache.length).toBe(0);
  expect(cache.spanCount).toBe(0);
  cache.close();
  be.free(kBuf);
  be.free(vBuf);
  expect(be.liveTensors()).toBe(0);
  return result;
}

describe("KvCache residency", () => {
  it("all-resident by default: no store, no eviction", () => {
    const r = exercise(undefined, 16, 9, "f32", testSeed(1));
    expect(r).toEqual({ evictions: 0, storeCount: 0 });
  });

  for (const [budget, block, maxAppend, dtype] of [
    [20, 8, 7, "f32"], [16, 16, 5, "f16"], [9, 4, 12, "bf16"], [33, 5, 1, "f32"],
  ] as [number, number, number, DType][]) {
    it(`window ${budget}, block ${block}, appends ≤ ${maxAppend}, ${dtype}: every position exactly once, in order`, () => {
      const r = exercise(budget, block, maxAppend, dtype, testSeed(budget * 31 + block));
      expect(r.evictions).toBeGreaterThan(0);
      expect(r.storeCount).toBeGreaterThan(maxContext - budget - block);
    });
  }

  for (const [budget, block, maxAppend, sinks] of [[20, 8, 7, 4], [9, 4, 12, 5], [6, 1, 1, 5], [12, 3, 30, 1]] as const) {
    it(`window ${budget} with ${sinks} sinks, block ${block}, appends ≤ ${maxAppend}: sinks stay, every position exactly once`, () => {
      const r = exercise(budget, block, maxAppend, "f32", testSeed(budget * 17 + sinks), sinks);
      expect(r.evictions).toBeGreaterThan(0);
      expect(r.storeCount).toBeGreaterThan(maxContext - budget - block);
    });
  }

  it("rejects overflow, oversized appends and writes to evicted positions with one-line errors", () => {
    const be = new ReferenceBackend();
    const cache = new KvCache(be, { layers: 1, kvHeads: 1, headDim: 2, maxContext: 10, gpuKvBudget: 4, evictBlock: 2, maxAppend: 4 });
    const k = be.alloc([4, 2]);
    expect(() => cache.append(5)).toThrow(/cannot append 5 positions/);
    cache.append(4);
    cache.append(2);
    expect(() => cache.append(3)).toThrow(/window full/);
    expect(cache.evict()).toBe(2);
    expect(() => cache.writeRows(0, k, k, 0, 1)).toThrow(/no longer in the window/);
    expect(() => cache.windowSlot(0)).toThrow(/^KV cache: position 0 is not in the window$/);
    expect(() => cache.windowSlot(6)).toThrow(/^KV cache: position 6 is not in the window$/); // not appended
    expect([2, 3, 4, 5].map((p) => cache.windowSlot(p))).toEqual([2, 3, 4, 5]); // slots of the ring past the evicted block
    cache.append(4);
    cache.evict();
    expect(cache.length).toBe(10);
    expect(() => cache.append(1)).toThrow(HybridgenError);
    expect(() => cache.append(1)).toThrow("context overflow: 10 + 1 tokens exceed the context of 10");
    expect(() => new KvCache(be, { layers: 1, kvHeads: 1, headDim: 2, maxContext: 10, gpuKvBudget: 3, evictBlock: 4 })).toThrow(/eviction block \(4\) must not exceed/);
    expect(() => new KvCache(be, { layers: 1, kvHeads: 1, headDim: 2, maxContext: 10, gpuKvBudget: 3, sinkTokens: 3, evictBlock: 1 })).toThrow(/3 sink tokens leave no room/);
    expect(() => new KvCache(be, { layers: 1, kvHeads: 1, headDim: 2, maxContext: 10, gpuKvBudget: 4, sinkTokens: 2, evictBlock: 3 })).toThrow(/less the sinks \(2\)/);
    expect(() => new KvCache(be, { layers: 1, kvHeads: 1, headDim: 2, maxContext: 10, gpuKvBudget: 0 })).toThrow(/gpuKvBudget/);
    expect(() => new KvCache(be, { layers: 0, kvHeads: 1, headDim: 2, maxContext: 10 })).toThrow(/invalid KV cache option layers/);
    cache.close();
    expect(() => cache.append(1)).toThrow(/after close/);
  });
});

describe("KvCache checkpoint / restore", () => {
  it("decoding after restore() repeats the same logits, across evictions; stale checkpoints are refused", () => {
    const { files } = tinyModel({ seed: testSeed(900), maxPositions: 64, heads: 4, kvHeads: 2 });
    const tokens = randomIds(testSeed(901), 40);
    const be = new ReferenceBackend();
    const model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: 48, gpuKvBudget: 8, sinkTokens: 2, kvEvictBlock: 3 });
    model.forward(Int32Array.from(tokens.slice(0, 20)), 0);
    const cp = model.cache.checkpoint();
    const decode = () => tokens.slice(20).map((t, i) => Array.from(model.forward(Int32Array.of(t), 20 + i)));
    const first = decode();
    expect(model.cache.storeCount).toBeGreaterThan(cp.storeCount); // evictions happened after the checkpoint
    model.cache.restore(cp);
    expect(model.cache.length).toBe(20);
    const again = decode();
    again.forEach((l, i) => expect(l).toEqual(first[i]));
    model.reset();
    expect(() => model.cache.restore(cp)).toThrow(/checkpoint is from an earlier sequence/);
    cp.close();
    expect(() => model.cache.restore(cp)).toThrow(/checkpoint was closed/);
    model.close();
    expect(be.liveTensors()).toBe(0);
  });
});
