/**
 * Hybrid attention through DeviceStaging (the GPU path: KV store in host memory filled by
 * device → host copies, the stage's output uploaded by copies), on ReferenceBackends and a
 * loopback link whose device → host copies land only at fence().
 */
import { describe, expect, it } from "vitest";
import { BackendCpuStage, KvCache, LlamaModel, ReferenceBackend, type ModelFiles } from "@hybridgen/core";
import { HybridAttention } from "../src/index.js";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "@hybridgen/core/testing";
import { allSelector, fixedScheduler, topKSelector, withCausal, type HybridRunOptions } from "./hybrid-helpers.js";
import { AddressBook, HostReference, LoopbackLink, StagedBackendCpuStage } from "@hybridgen/core/testing";

const CONTEXT = 40;

interface RunOptions extends HybridRunOptions {
  staged?: boolean;
  /** Give the device backend attnCausal (from its stage ops) and log its calls "n@firstPos:start". */
  causal?: string[];
}

function run(files: ModelFiles, tokens: number[], o: RunOptions) {
  const be = new ReferenceBackend();
  const book = new AddressBook();
  const host = new HostReference(book);
  const link = new LoopbackLink(be, host, book);
  const device = o.causal ? withCausal(be, o.causal) : be;
  const model = LlamaModel.load(files, device, { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: o.budget, sinkTokens: o.sinks ?? 0, kvEvictBlock: o.block });
  if (o.staged && o.selector) model.cache.attachHostStore(host, link);
  const stage = o.staged ? new StagedBackendCpuStage(host, book) : new BackendCpuStage(be);
  const hybrid = o.selector
    ? HybridAttention.attach(
      { attention: model.attention, projector: model, stage, selector: o.selector, scheduler: o.scheduler ?? fixedScheduler(4, "post") },
      { logits: o.logits ?? "exact" })
    : null;
  const staged = !!(o.staged && o.selector);
  // With the store in host memory the device holds no store tensors at all.
  if (staged) expect(model.cache.storeK.length + model.cache.storeV.length).toBe(0);
  const out = [model.forward(Int32Array.from(tokens.slice(0, o.prompt)), 0)];
  const stored: number[] = [];
  const snapshots: Float32Array[] = [];
  for (let t = o.prompt; t < tokens.length; t++) {
    stored.push(model.cache.storeCount);
    out.push(model.forward(Int32Array.of(tokens[t]), t));
    if (o.selector) snapshots.push(storeRows(model.cache, staged ? host : be));
  }
  const scratch = model.cache.storeScratchTensors;
  const stats = hybrid?.stats;
  hybrid?.close();
  model.close();
  expect(be.liveTensors()).toBe(0);
  expect(host.liveTensors()).toBe(0);
  expect(link.pinned.size).toBe(0);
  return { out, stored, stats, snapshots, scratch, log: link.log };
}

/** The store's rows [0, storeCount) of every layer, K then V, head by head (after a fence). */
function storeRows(c: KvCache, mem: ReferenceBackend): Float32Array {
  c.syncHostStore();
  const n = c.storeCount, row = c.headDim, cap = c.storeCapacity, parts: Float32Array[] = [];
  for (let l = 0; l < c.layers; l++) {
    for (const t of [c.stageStoreK(l), c.stageStoreV(l)]) {
      for (let g = 0; g < c.kvHeads; g++) parts.push(mem.read(t, g * cap * row, n * row));
    }
  }
  const all = new Float32Array(parts.reduce((a, p) => a + p.length, 0));
  let o = 0;
  for (const p of parts) {
    all.set(p, o);
    o += p.length;
  }
  return all;
}

/** Both runs offloaded the same rows (within tol) after every step. */
function sameStores(a: Float32Array[], b: Float32Array[], tol: number): void {
  expect(a.length).toBe(b.length);
  a.forEach((x, i) => {
    expect(x.length, `store size after step ${i}`).toBe(b[i].length);
    expect(maxAbsDiff(x, b[i]), `store rows after step ${i}`).toBeLessThanOrEqual(tol);
  });
}

describe("hybrid attention staged through host memory (the device-backend path)", () => {
  const windows = [{ budget: 3, sinks: 1, block: 2 }, { budget: 6, sinks: 0, block: 2 }, { budget: 30, sinks: 3, block: 8 }];

  it("'all' + exact logits equals full attention within 1e-5 at every step (MHA and GQA, 3 windows)", () => {
    for (const [li, layout] of [{ heads: 4, kvHeads: 4 }, { heads: 4, kvHeads: 2 }].entries()) {
      const { files } = tinyModel({ seed: testSeed(300 + li), maxPositions: 64, ...layout });
      const tokens = randomIds(testSeed(400 + li), CONTEXT);
      for (const w of windows) {
        const prompt = Math.min(CONTEXT - 4, w.budget + 5);
        const full = run(files, tokens, { prompt });
        for (const kernel of [false, true]) {
          const o = { ...w, prompt, selector: allSelector(kernel), scheduler: fixedScheduler(3, kernel ? "post" : "pre") };
          const hy = run(files, tokens, { ...o, staged: true });
          expect(hy.stored.some((n) => n > 0)).toBe(true);
          expect(hy.stats!.steps).toBeGreaterThan(0);
          sameStores(hy.snapshots, run(files, tokens, o).snapshots, 1e-5);
          expect(hy.log.some((l) => l.startsWith("toHost"))).toBe(true);
          expect(hy.log.some((l) => l.startsWith("toDevice"))).toBe(true);
          hy.out.forEach((l, i) => expect(maxAbsDiff(l, full.out[i]), `budget ${w.budget} step ${i}`).toBeLessThan(1e-5));
        }
      }
    }
  });

  it("a prompt prefilled in several blocks over offloaded rows (loadStore) equals full attention within 1e-5; no device store", () => {
    for (const [li, layout] of [{ heads: 4, kvHeads: 4 }, { heads: 4, kvHeads: 2 }].entries()) {
      const { files } = tinyModel({ seed: testSeed(340 + li), maxPositions: 64, layers: 3, ...layout });
      const tokens = randomIds(testSeed(440 + li), CONTEXT);
      const prompt = 31; // 7 blocks of 5 (the last of 1): blocks 3.. attend over an offloaded store
      const full = run(files, tokens, { prompt });
      for (const w of [{ budget: 6, sinks: 1, block: 2 }, { budget: 8, sinks: 0, block: 4 }]) {
        const o = { ...w, prompt, selector: allSelector(true), scheduler: fixedScheduler(3, "post") };
        const plainStores = run(files, tokens, o).snapshots;
        // Without attnCausal the store comes up alone (loadStore); with it, the whole cache at
        // slot = position (loadContiguous) for one causal call a layer and block.
        for (const causal of [undefined, [] as string[]]) {
          const hy = run(files, tokens, { ...o, staged: true, causal });
          expect(hy.stored[0]).toBeGreaterThan(15); // most of the prompt was offloaded during prefill
          expect(hy.scratch).toBe(4); // two layers' K and V: the only offloaded rows ever on the device
          expect(hy.log.filter((l) => l === "toDevice 2").length).toBeGreaterThan(3 * 3); // a load per layer and block
          hy.out.forEach((l, i) => expect(maxAbsDiff(l, full.out[i]), `budget ${w.budget} forward ${i}`).toBeLessThan(1e-5));
          sameStores(hy.snapshots, plainStores, 1e-5);
          // Blocks at positions 15, 20, 25 (n = 5) and 30 (n = 1) ran over offloaded rows from slot 0.
          if (causal) for (const p of [15, 20, 25]) expect(causal.filter((x) => x === `5@${p}:0`).length).toBe(3);
        }
      }
    }
  });

  it("a host store never takes device memory; a device store is made on first use, 2 tensors a layer", () => {
    const { files } = tinyModel({ seed: testSeed(350), maxPositions: 64, layers: 3 });
    const be = new ReferenceBackend(), book = new AddressBook(), host = new HostReference(book), link = new LoopbackLink(be, host, book);
    const opts = { maxContext: 32, gpuKvBudget: 6, prefillBlock: 4 };
    using plain = LlamaModel.load(files, be, opts);
    const before = be.liveTensors();
    using model = LlamaModel.load(files, be, opts);
    const loaded = be.liveTensors() - before;
    model.cache.attachHostStore(host, link);
    expect(be.liveTensors() - before).toBe(loaded); // nothing to free: the store was never on the device
    expect(model.cache.storeK.length).toBe(0);
    const plainBefore = be.liveTensors();
    expect(plain.cache.storeK.length).toBe(3);
    expect(be.liveTensors() - plainBefore).toBe(2 * 3);
    expect(model.cache.storeInHost).toBe(true);
    expect(plain.cache.storeInHost).toBe(false);
    expect(model.cache.storeBytes).toBe(2 * 3 * model.cache.kvHeads * model.cache.storeCapacity * model.cache.headDim * 4);
    // A device op over the store without loadStore fails with a one-line error, never reads stale memory.
    model.forward(Int32Array.from(randomIds(testSeed(351), 12)), 0);
    expect(model.cache.storeCount).toBeGreaterThan(0);
    const s = model.cache.spans().findIndex((x) => x.region === "store");
    // The last block loaded layers 0, 1, 2 in turn into two scratch pairs: layer 0's was reused.
    expect(() => model.cache.spanK(s, 0)).toThrow(/call loadStore\(0\)/);
    model.cache.loadStore(0);
    expect(model.cache.spanK(s, 0).shape).toEqual([model.cache.kvHeads, model.cache.maxContext, model.cache.headDim]);
  });

  it("top-K, exact, speculative and verified: the staged path gives the CPU-backend path's logits (within 1e-6)", () => {
    const { files } = tinyModel({ seed: testSeed(310), maxPositions: 64, heads: 4, kvHeads: 2, layers: 3 });
    const tokens = randomIds(testSeed(410), CONTEXT);
    for (const logits of ["exact", "speculative", "verified"] as const) {
      for (const kernel of [false, true]) {
        const o = { budget: 6, sinks: 1, block: 2, prompt: 12, logits, selector: topKSelector(kernel), scheduler: fixedScheduler(3, "post") };
        const plain = run(files, tokens, o);
        const staged = run(files, tokens, { ...o, staged: true });
        sameStores(staged.snapshots, plain.snapshots, 1e-6);
        staged.out.forEach((l, i) => expect(maxAbsDiff(l, plain.out[i]), `${logits} step ${i}`).toBeLessThan(1e-6));
        // Device timings come from the link's events (the loopback reports 1 ms and 0.5 ms a step).
        expect(staged.stats!.deviceMs).toBeCloseTo(staged.stats!.steps * 1, 6);
        expect(staged.stats!.txMs).toBeCloseTo(staged.stats!.steps * 0.5, 6);
      }
    }
  });

  it("attachHostStore and a stage without host buffers fail with one-line errors", () => {
    const { files } = tinyModel({ seed: testSeed(320), maxPositions: 64 });
    const be = new ReferenceBackend(), book = new AddressBook(), host = new HostReference(book), link = new LoopbackLink(be, host, book);
    const full = LlamaModel.load(files, be, { maxContext: 16 });
    expect(() => full.cache.attachHostStore(host, link)).toThrow(/no store to keep in host memory/);
    full.close();
    const model = LlamaModel.load(files, be, { maxContext: 16, gpuKvBudget: 4, prefillBlock: 4 });
    expect(() => model.cache.attachHostStore(new ReferenceBackend(), link)).toThrow(/has no host memory/);
    model.cache.attachHostStore(host, link);
    expect(() => model.cache.attachHostStore(host, link)).toThrow(/already attached/);
    const parts = { attention: model.attention, projector: model, selector: allSelector(true), scheduler: fixedScheduler(2, "post") };
    const plain = new BackendCpuStage(host);
    expect(() => HybridAttention.attach({ ...parts, stage: plain })).toThrow(/does not expose host staging buffers/);
    plain.close(); // a failed attach leaves the stage to its caller
    model.close();
    expect(link.pinned.size).toBe(0);
    const late = LlamaModel.load(files, be, { maxContext: 16, gpuKvBudget: 4, prefillBlock: 4 });
    late.forward(Int32Array.of(1, 2), 0);
    expect(() => late.cache.attachHostStore(host, link)).toThrow(/before the first token \(2 are cached\)/);
    late.close();
    expect(be.liveTensors()).toBe(0);
    expect(host.liveTensors()).toBe(0);
  });
});

describe("prefill over sinks and an unwrapped ring", () => {
  it("goes through attnCausal (one call a layer) and gives the plain backend's logits", () => {
    const { files } = tinyModel({ seed: testSeed(330), maxPositions: 64 });
    const tokens = Int32Array.from(randomIds(testSeed(430), 20));
    const inner = new ReferenceBackend();
    const calls: string[] = [];
    const be = withCausal(inner, calls);
    const opts = { prefillBlock: 20, maxContext: 32, gpuKvBudget: 8, sinkTokens: 3 };
    using plain = LlamaModel.load(files, new ReferenceBackend(), opts);
    using fast = LlamaModel.load(files, be, opts);
    expect(maxAbsDiff(fast.forward(tokens, 0), plain.forward(tokens, 0))).toBeLessThan(1e-5);
    expect(calls).toEqual(["20@0:0", "20@0:0"]); // sinks [0, 3) + ring from slot 3: one run of slots
    expect(fast.cache.storeCount).toBeGreaterThan(0); // then the window overflow was evicted
  });
});
