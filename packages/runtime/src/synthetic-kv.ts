/**
 * A KV cache at a given length without computing a row: the window is filled with seeded random
 * rows, then the cache grows through its own append and evict path, so every eviction's copy
 * carries those rows into the offloaded store (host tiers, the disk tier) as a prefill's would.
 * Benchmarks of decode at contexts whose prefill would take minutes use it (never a default).
 */
import { HybridgenError, type Backend, type KvCache, type Tensor } from "@hybridgen/core";
import { createNativeRandomFill } from "@hybridgen/kernels-cpu";

/** Rows written from the host at once; the rest of a window tensor is copied from them on the backend. */
const CHUNK_ROWS = 4096;

/** Seeded random rows (uniform, ±0.5) in every window tensor of `cache`. */
export function randomizeWindow(backend: Backend, cache: KvCache, seed = 1): void {
  const hd = cache.headDim;
  const chunk = new Float32Array(CHUNK_ROWS * hd);
  const bytes = new Uint8Array(chunk.buffer);
  const fill = createNativeRandomFill();
  [...cache.windowK, ...cache.windowV].forEach((t: Tensor, i) => {
    fill(bytes, "f32", { key: (seed * 1000 + i) >>> 0, scale: 0.5, offset: 0 });
    const rows = t.shape[0]! * t.shape[1]!;
    backend.write(t, chunk.subarray(0, Math.min(chunk.length, rows * hd)));
    for (let n = CHUNK_ROWS; n < rows; n *= 2) backend.copyRows(t, n, t, 0, Math.min(n, rows - n));
  });
}

/** `cache` (empty or not) at `length` positions: the window randomized, then appended and evicted block by block; the host store caught up. */
export function fillSyntheticKv(backend: Backend, cache: KvCache, length: number, seed = 1): void {
  if (!(Number.isInteger(length) && length >= cache.length && length <= cache.maxContext)) {
    throw new HybridgenError(`synthetic KV: length ${length} outside [${cache.length}, ${cache.maxContext}]`);
  }
  randomizeWindow(backend, cache, seed);
  while (cache.length < length) {
    const room = cache.windowCapacity - cache.windowCount;
    cache.append(Math.min(cache.maxAppend, length - cache.length, room));
    cache.evict();
  }
  cache.syncHostStore();
}
