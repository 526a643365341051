import { describe, expect, it } from "vitest";
import { KvCache, LlamaModel, ReferenceBackend, type Backend, type DType, type KvStoreAllocator, type Tensor } from "../src/index.js";
import { randomIds, testSeed, tinyModel } from "../src/testing/index.js";
import { AddressBook, HostReference, LoopbackLink } from "../src/testing/index.js";

/** Records what the cache asks of it; V of odd layers is "file-backed" (not pinnable). */
class RecordingAllocator implements KvStoreAllocator {
  readonly calls: string[] = [];
  readonly unpinnable = new Set<Tensor>();
  released = 0;
  alloc(backend: Backend, pool: "k" | "v", layer: number, shape: readonly number[], dtype: DType): Tensor {
    this.calls.push(`${pool}${layer}:${shape.join("x")}:${dtype}`);
    const t = backend.alloc(shape, dtype);
    if (pool === "v" && layer % 2 === 1) this.unpinnable.add(t);
    return t;
  }
  pinnable(t: Tensor): boolean {
    return !this.unpinnable.has(t);
  }
  release(): void {
    this.released++;
  }
}

describe("KvStoreAllocator", () => {
  it("placeStore: the store's tensors come from the allocator, the cache releases it once on close", () => {
    const be = new ReferenceBackend();
    const cache = new KvCache(be, { layers: 2, kvHeads: 2, headDim: 4, maxContext: 40, gpuKvBudget: 8, evictBlock: 4, maxAppend: 4 });
    const a = new RecordingAllocator();
    const old = cache.storeK[0];
    cache.placeStore(a);
    expect(a.calls).toEqual(["k0:2x36x4:f32", "k1:2x36x4:f32", "v0:2x36x4:f32", "v1:2x36x4:f32"]);
    expect(cache.storeK[0]).not.toBe(old);
    expect(() => cache.placeStore(a)).toThrow("KV cache: the store was placed already");
    cache.close();
    cache.close();
    expect(a.released).toBe(1);
  });

  it("placeStore after the first token, or with the window holding everything, is a one-line error", () => {
    const be = new ReferenceBackend();
    const cache = new KvCache(be, { layers: 1, kvHeads: 1, headDim: 4, maxContext: 40, gpuKvBudget: 8, evictBlock: 4, maxAppend: 4 });
    cache.append(1);
    expect(() => cache.placeStore(new RecordingAllocator())).toThrow("KV cache: place the store before the first token (1 are cached)");
    const whole = new KvCache(be, { layers: 1, kvHeads: 1, headDim: 4, maxContext: 8 });
    expect(() => whole.placeStore(new RecordingAllocator())).toThrow(/no store to place/);
  });

  it("attachHostStore with an allocator pins only what it allows, unpins exactly those, and the model's outputs do not change", () => {
    const { files } = tinyModel({ seed: testSeed(880), maxPositions: 64, layers: 2 });
    const opts = { maxContext: 32, gpuKvBudget: 6, prefillBlock: 4 };
    const ids = Int32Array.from(randomIds(testSeed(881), 12));
    const run = (allocator?: RecordingAllocator) => {
      const be = new ReferenceBackend(), book = new AddressBook(), host = new HostReference(book), link = new LoopbackLink(be, host, book);
      using model = LlamaModel.load(files, be, opts);
      model.cache.attachHostStore(host, link, false, allocator);
      const pinned = link.pinned.size;
      const out = model.forward(ids, 0);
      model.cache.close();
      return { out, pinned, after: link.pinned.size };
    };
    const plain = run();
    const a = new RecordingAllocator();
    const placed = run(a);
    expect(plain.pinned).toBe(4);
    expect(placed.pinned).toBe(3); // V of layer 1 stays pageable
    expect(placed.after).toBe(0);
    expect(a.released).toBe(1);
    expect(Array.from(placed.out)).toEqual(Array.from(plain.out));
  });
});
