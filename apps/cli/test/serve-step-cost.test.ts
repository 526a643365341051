// The bytes a decode step reads and the FLOPs a prefill chunk computes (serve/step-cost.ts), and
// the server's counters of them: the arithmetic against a hand count on a small shape; in process
// on stories15M, one request's counters against the steps it ran — full attention reads every
// position it holds each step, hybrid attention its window on the device and, over the link,
// the rows each step's selection held (read from the sequence's own stats around every step).
import { describe, expect, it } from "vitest";
import { BatchDecoder, loadModel, openModelDir, type KvStoreAllocator } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import type { HybridStats } from "@hybridgen/runtime";
import { attachHybrid, HybridCliOptionsSchema } from "../src/hybrid-options.js";
import { ServeMetrics } from "../src/serve/metrics.js";
import { ServeScheduler } from "../src/serve/scheduler.js";
import { StepCost } from "../src/serve/step-cost.js";
import { StoreLedger } from "../src/serve/store-ledger.js";
import { stories15M } from "./model-fixture.js";

const SHAPE = { layers: 2, heads: 4, kvHeads: 2, headDim: 8, kvElementBytes: 2, decodeWeightBytes: 1000, matmulParams: 50 };

describe("StepCost", () => {
  it("a decode step reads the weights once and each row's resident K and V; the link carries what the logits mode brings", () => {
    const perToken = 2 * 2 * 2 * 8 * 2; // K and V, 2 layers, 2 KV heads, 8 × 2 bytes
    expect(new StepCost(SHAPE, null).bytesPerToken).toBe(perToken);
    const rows = [{ resident: 10, selectedRows: 6 }, { resident: 3, selectedRows: 4 }];
    expect(new StepCost(SHAPE, null).decode(rows)).toEqual({ device: 1000 + 13 * perToken, link: 0 });
    const row = 2 * 8 * 2; // a row of every KV head of a layer
    expect(new StepCost(SHAPE, { logits: "speculative", candidates: 1 }).decode(rows).link).toBe(10 * row);
    expect(new StepCost(SHAPE, { logits: "verified", candidates: 4 }).decode(rows).link).toBe(10 * row * 2);
    expect(new StepCost(SHAPE, { logits: "verified", candidates: 2, keep: 1 }).decode(rows).link).toBe(10 * row * 1.5);
    expect(new StepCost(SHAPE, null).decode([])).toEqual({ device: 1000, link: 0 });
  });

  it("a chunk's FLOPs: the matmuls a position and causal attention over every earlier one; chunks add up to the whole prompt", () => {
    const c = new StepCost(SHAPE, null);
    let brute = 0;
    for (let p = 5; p < 9; p++) brute += 2 * 50 + 4 * 2 * 4 * 8 * (p + 1);
    expect(c.prefillFlops(5, 9)).toBe(brute);
    expect(c.prefillFlops(0, 7) + c.prefillFlops(7, 20) + c.prefillFlops(20, 21)).toBe(c.prefillFlops(0, 21));
    expect(c.prefillFlops(4, 4)).toBe(0);
    expect(c.prefillLinkBytes(100)).toBe(100 * c.bytesPerToken);
  });
});

describe("the server's decode bytes and prefill FLOPs", () => {
  const run = (scheduler: ServeScheduler, ids: number[], maxTokens: number) => new Promise<number>((resolve, reject) => {
    scheduler.submit({
      ids, maxTokens, sampling: { temperature: 0 }, stop: [], arrivedMs: 0, onText: () => {},
      onFinish: (r) => (r.error ? reject(new Error(r.error)) : resolve(r.completionTokens)),
    });
  });
  it("full attention: every step reads the weights and each position the request holds; the chunks' FLOPs are the prompt's", async () => {
    using files = openModelDir(await stories15M());
    using backend = createCpuBackend({ threads: 1 });
    using model = loadModel(files, backend, { maxContext: 128 });
    using dec = new BatchDecoder(model, 1);
    const s = files.shape, metrics = new ServeMetrics();
    const cost = new StepCost({ layers: s.layers, heads: s.heads, kvHeads: s.kvHeads, headDim: s.headDim, kvElementBytes: 4, decodeWeightBytes: 12345, matmulParams: 678 }, null);
    const scheduler = new ServeScheduler(dec, files.tokenizer, s.vocabSize, metrics, {
      slots: [0], queueLimit: 2, chunk: 8, maxContext: 128, eos: [], bytesPerToken: cost.bytesPerToken, ledger: null, cost,
    });
    const ids = files.tokenizer.encode("Once upon a time there was a little girl named Lily");
    expect(await run(scheduler, ids, 12)).toBe(12);
    const steps = metrics.steps.get();
    expect(steps).toBe(11); // the first token comes from the prefill, the last is not fed back
    let positions = 0;
    for (let i = 1; i <= steps; i++) positions += ids.length + i; // the prompt and the tokens fed so far
    expect(metrics.decodeBytes.get({ where: "device" })).toBe(steps * 12345 + positions * cost.bytesPerToken);
    expect(metrics.decodeBytes.get({ where: "link" })).toBe(0);
    expect(metrics.prefillFlops.get()).toBe(cost.prefillFlops(0, ids.length));
    expect(metrics.prefillChunks.get()).toBe(Math.ceil(ids.length / 8));
    expect(metrics.prefillLinkBytes.get(), "nothing offloaded").toBe(0);
  });

  it("hybrid attention (verified, 2 candidates keeping 1): the device reads the window, the link the rows each step's selection held", async () => {
    using files = openModelDir(await stories15M());
    using backend = createCpuBackend({ threads: 1 });
    using model = loadModel(files, backend, { maxContext: 256, gpuKvBudget: 32, sinkTokens: 4 });
    const ledger = await StoreLedger.on([{ id: "node0", kind: "dram", numaNode: 0, capacityBytes: 2 ** 30 }], model.cache, { kvPlacement: "semantic" });
    let next: KvStoreAllocator | null = null;
    const storeAllocator = () => {
      const a = next ?? ledger.idle();
      next = null;
      return a;
    };
    const flags = HybridCliOptionsSchema.parse({ attention: "hybrid", gpuKvBudget: 32, sinkTokens: 4, k: 8, candidates: 2, keep: 1 });
    using hybrids = await attachHybrid(model, backend, flags, { storeAllocator, batch: 1, ownIdle: true });
    using dec = new BatchDecoder(model, 2, { sequenceContext: 33 });
    const s = files.shape, metrics = new ServeMetrics();
    const cost = new StepCost({ layers: s.layers, heads: s.heads, kvHeads: s.kvHeads, headDim: s.headDim, kvElementBytes: 4, decodeWeightBytes: 1, matmulParams: 1 }, { logits: "verified", candidates: 2, keep: 1 });
    // Independently of the scheduler: each step's rows held (the stats' Σ K) and positions resident, read around every step.
    const stats = () => (dec.sequence(1).attention.decodeAttention as unknown as { stats: HybridStats }).stats;
    let selected = 0, resident = 0, steps = 0;
    const step = dec.step.bind(dec);
    dec.step = (slots, ids) => {
      const before = stats().sumK;
      step(slots, ids);
      const c = dec.sequence(1).cache;
      selected += stats().sumK - before;
      resident += c.length - c.storeCount;
      steps++;
    };
    // Each chunk's offloaded positions as it starts: every layer's store comes up for its attention.
    let uploaded = 0;
    const prefill = dec.prefill.bind(dec);
    dec.prefill = (slot, ids, start) => {
      uploaded += dec.sequence(slot).cache.storeCount * cost.bytesPerToken;
      return prefill(slot, ids, start);
    };
    const scheduler = new ServeScheduler(dec, files.tokenizer, s.vocabSize, metrics, {
      slots: [1], queueLimit: 2, chunk: 16, maxContext: 256, eos: [], bytesPerToken: cost.bytesPerToken, idleContext: 33,
      ledger, nextStore: (a) => (next = a), prune: (hybrids as unknown as { prune(): void }).prune, cost,
    });
    const ids = files.tokenizer.encode("Once upon a time there was a little girl named Lily. She loved to play outside in the sun with her dog. One day they went to the park and saw a big red ball under a tree. Lily ran to get it and her dog ran after her, barking and wagging his tail.");
    expect(ids.length, "chunks start past the window").toBeGreaterThan(48);
    expect(await run(scheduler, ids, 24)).toBe(24);
    expect(steps).toBe(23);
    expect(selected, "rows were selected from the host").toBeGreaterThan(0);
    expect(resident, "the window, not the whole context").toBeLessThan(steps * (ids.length + 1));
    expect(metrics.decodeBytes.get({ where: "device" })).toBe(steps + resident * cost.bytesPerToken);
    expect(metrics.decodeBytes.get({ where: "link" })).toBe(selected * s.kvHeads * s.headDim * 4 * 1.5);
    expect(uploaded, "a chunk brought a store up").toBeGreaterThan(0);
    expect(metrics.prefillLinkBytes.get()).toBe(uploaded);
    expect(metrics.prefillFlops.get()).toBe(cost.prefillFlops(0, ids.length));
    await scheduler.idle();
  });
});
