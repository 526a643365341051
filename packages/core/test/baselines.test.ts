/**
 * The AoG and AoC baselines over every offloaded token equal full attention, on the plain
 * backend (store in its memory) and through the loopback host link (store in host memory, the
 * device-backend path): AoG streams the store up layer by layer, AoC attends on the host and
 * merges its partial output by log-sum-exp.
 */
import { describe, expect, it } from "vitest";
import { AoCAttention, AoGAttention, LlamaModel, ReferenceBackend, type ModelFiles } from "../src/index.js";
import { maxAbsDiff, randomIds, testSeed, tinyModel } from "../src/testing/index.js";
import { AddressBook, HostReference, LoopbackLink } from "../src/testing/index.js";

const CONTEXT = 40;

type Kind = "full" | "aog" | "aoc";

function run(files: ModelFiles, tokens: number[], kind: Kind, o: { budget?: number; sinks?: number; block?: number; prompt: number; staged?: boolean }) {
  const be = new ReferenceBackend();
  const book = new AddressBook();
  const host = new HostReference(book);
  const link = new LoopbackLink(be, host, book);
  const model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: o.budget, sinkTokens: o.sinks ?? 0, kvEvictBlock: o.block });
  if (o.staged) model.cache.attachHostStore(host, link);
  const base = kind === "aog" ? AoGAttention.attach(model.attention) : kind === "aoc" ? AoCAttention.attach(model.attention) : null;
  const out = [model.forward(Int32Array.from(tokens.slice(0, o.prompt)), 0)];
  for (let t = o.prompt; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]!), t));
  const stats = base ? { ...base.stats } : null;
  base?.close();
  expect(model.attention.decodeAttention).toBe(null);
  model.close();
  expect(be.liveTensors()).toBe(0);
  expect(host.liveTensors()).toBe(0);
  return { out, stats, log: link.log };
}

describe("baselines over all offloaded tokens equal full attention", () => {
  const windows = [{ budget: 3, sinks: 1, block: 2 }, { budget: 6, sinks: 0, block: 2 }, { budget: 20, sinks: 3, block: 8 }];
  for (const kind of ["aog", "aoc"] as const) {
    it(`${kind}: logits within 1e-5 at every step (MHA and GQA, 3 windows, store on the device and in host memory)`, () => {
      for (const [li, layout] of [{ heads: 4, kvHeads: 4 }, { heads: 4, kvHeads: 2 }].entries()) {
        const { files } = tinyModel({ seed: testSeed(700 + li), maxPositions: 64, ...layout });
        const tokens = randomIds(testSeed(800 + li), CONTEXT);
        for (const w of windows) {
          const prompt = Math.min(CONTEXT - 4, w.budget + 5);
          const full = run(files, tokens, "full", { prompt });
          for (const staged of [false, true]) {
            const b = run(files, tokens, kind, { ...w, prompt, staged });
            expect(b.stats!.steps).toBeGreaterThan(0);
            expect(b.stats!.offloaded).toBeGreaterThan(0);
            if (staged && kind === "aog") expect(b.log.filter((l) => l.startsWith("toDevice")).length).toBeGreaterThan(0);
            if (kind === "aog") expect(b.stats!.bytesMoved).toBeGreaterThan(0);
            b.out.forEach((l, i) => expect(maxAbsDiff(l, full.out[i]!), `${kind} budget ${w.budget} staged ${staged} step ${i}`).toBeLessThan(1e-5));
          }
        }
      }
    });
  }

  it("aoc: a reference logit above λ is caught and the layer scored again from the exact maximum, still exact", () => {
    const { files } = tinyModel({ seed: testSeed(720), maxPositions: 64, heads: 4, kvHeads: 2 });
    const tokens = randomIds(testSeed(820), CONTEXT);
    const prompt = 12, w = { budget: 6, sinks: 1, block: 2 };
    const full = run(files, tokens, "full", { prompt });
    const plain = run(files, tokens, "aoc", { ...w, prompt });
    expect(plain.stats!.maxScans).toBe(plain.stats!.refMisses);
    // Every argmax lands on a column holding 1e4 (what a stale column past the store could hold).
    const be = new ReferenceBackend();
    const model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: w.budget, sinkTokens: w.sinks, kvEvictBlock: w.block });
    const aoc = AoCAttention.attach(model.attention);
    const hs = (aoc as unknown as { hs: unknown }).hs;
    const argmax = be.argmax.bind(be);
    be.argmax = (x, row) => {
      if (x !== hs) return argmax(x, row);
      be.write(x as never, Float32Array.of(1e4), row * (model.cache.storeCapacity + 1) + model.cache.storeCount + 1);
      return model.cache.storeCount + 1;
    };
    const out = [model.forward(Int32Array.from(tokens.slice(0, prompt)), 0)];
    for (let t = prompt; t < tokens.length; t++) out.push(model.forward(Int32Array.of(tokens[t]!), t));
    expect(aoc.stats.refMisses).toBe(aoc.stats.layerSteps);
    expect(aoc.stats.maxScans).toBe(aoc.stats.layerSteps);
    out.forEach((l, i) => expect(maxAbsDiff(l, full.out[i]!), `step ${i}`).toBeLessThan(1e-5));
    aoc.close();
    model.close();
  });

  it("refuse a cache with nothing to offload; a closed one refuses to run", () => {
    const { files } = tinyModel({ seed: testSeed(9), maxPositions: 64, heads: 4, kvHeads: 2 });
    const be = new ReferenceBackend();
    const model = LlamaModel.load(files, be, { maxContext: CONTEXT });
    expect(() => AoGAttention.attach(model.attention)).toThrow(/AoG attention needs a KV window smaller than the context/);
    expect(() => AoCAttention.attach(model.attention)).toThrow(/AoC attention needs a KV window smaller than the context/);
    model.close();
    const windowed = LlamaModel.load(files, be, { maxContext: CONTEXT, gpuKvBudget: 4 });
    const a = AoCAttention.attach(windowed.attention);
    a.close();
    expect(() => a.beginStep(0)).toThrow(/AoC attention used after close\(\)/);
    windowed.close();
    expect(be.liveTensors()).toBe(0);
  });
});
