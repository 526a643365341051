import { describe, expect, it } from "vitest";
import { BackendCpuStage, LlamaModel, ReferenceBackend, type ModelFiles, type TokenSelector } from "@hybridgen/core";
import { HybridAttention } from "../src/index.js";
import { makeRng, maxAbsDiff, randomIds, randomArray, testSeed, tinyModel, type TinyWeights } from "@hybridgen/core/testing";
import { allSelector, fixedScheduler, rawSelector, streamingSelector, topKSelector, type HybridRunOptions } from "./hybrid-helpers.js";
import { HybridReference, type RefSelect, type RefStep } from "./hybrid-reference.js";

const CONTEXT = 40;

/** Prompt (prefill blocks of 5), then one token at a time; logits of every forward, and the
 * offloaded count before each. */
function run(files: ModelFiles, tokens: number[], o: HybridRunOptions) {
  const be = new ReferenceBackend();
  const model = LlamaModel.load(files, be, {
    prefillBlock: 5, maxContext: CONTEXT, gpuKvBudget: o.budget, sinkTokens: o.sinks ?? 0, kvEvictBlock: o.block,
  });
  const hybrid = o.selector
    ? HybridAttention.attach(
      { attention: model.attention, projector: model, stage: new BackendCpuStage(be), selector: o.selector, scheduler: o.scheduler ?? fixedScheduler(4, "post") },
      { logits: o.logits ?? "exact", ...(o.candidates ? { candidates: o.candidates } : {}), ...(o.exactLayers ? { exactLayers: o.exactLayers } : {}) })
    : null;
  const out = [model.forward(Int32Array.from(tokens.slice(0, o.prompt)), 0)];
  const stored: number[] = [];
  for (let t = o.prompt; t < tokens.length; t++) {
    stored.push(model.cache.storeCount);
    out.push(model.forward(Int32Array.of(tokens[t]), t));
  }
  const stats = hybrid?.stats;
  hybrid?.close();
  model.close();
  expect(be.liveTensors()).toBe(0);
  return { out, stored, stats };
}

type RefMode = boolean | Pick<RefStep, "speculative" | "verified" | "candidates" | "exactLayers">;

function reference(files: ModelFiles, weights: TinyWeights, tokens: number[], prompt: number, stored: number[], sinks: number, select: RefSelect, mode: RefMode) {
  const ref = new HybridReference(files, weights);
  const m = typeof mode === "boolean" ? { speculative: mode } : mode;
  let last: number[] = [];
  for (let t = 0; t < prompt; t++) last = ref.step(tokens[t], { storeCount: 0, sinks, select, ...m });
  const out = [last];
  for (let t = prompt; t < tokens.length; t++) out.push(ref.step(tokens[t], { storeCount: stored[t - prompt], sinks, select, ...m }));
  return out;
}

describe("hybrid attention: 'all' + exact logits equals full attention", () => {
  // Budgets: 1, a few, most of the context; sinks on and off; prompts below, at and above the budget.
  const layouts = [{ heads: 4, kvHeads: 4 }, { heads: 4, kvHeads: 2 }];
  const windows = [{ budget: 1, sinks: 0, block: 1 }, { budget: 3, sinks: 1, block: 2 }, { budget: 6, sinks: 2, block: 2 }, { budget: 30, sinks: 0, block: 4 }, { budget: 30, sinks: 3, block: 8 }];
  for (const [li, layout] of layouts.entries()) {
    const kind = layout.heads === layout.kvHeads ? "MHA" : "GQA";
    it(`${kind}: every step within 1e-5 of full attention, f32 (${windows.length} windows × 3 prompt lengths)`, () => {
      const { files } = tinyModel({ seed: testSeed(100 + li), maxPositions: 64, ...layout });
      const tokens = randomIds(testSeed(200 + li), CONTEXT);
      for (const w of windows) {
        for (const prompt of [Math.max(1, w.budget - 1), w.budget, Math.min(CONTEXT - 4, w.budget + 7)]) {
          const full = run(files, tokens, { prompt });
          for (const [kernel, logits] of [[false, "exact"], [true, "exact"], [true, "verified"], [false, "verified"]] as const) {
            const hy = run(files, tokens, { ...w, prompt, selector: allSelector(kernel), scheduler: fixedScheduler(3, kernel ? "post" : "pre"), logits });
            expect(hy.stored.some((n) => n > 0)).toBe(true); // offloading really happened
            expect(hy.stats!.steps).toBeGreaterThan(0);
            hy.out.forEach((l, i) => expect(maxAbsDiff(l, full.out[i]), `budget ${w.budget} sinks ${w.sinks} prompt ${prompt} step ${i}`).toBeLessThan(1e-5));
          }
        }
      }
    });
  }
});

describe("hybrid attention: selection equals the TypeScript reference on window ∪ selected", () => {
  const TOL = 2e-4; // f32 engine vs f64 reference on O(1) logits
  const { files, weights } = tinyModel({ seed: testSeed(300), maxPositions: 64, heads: 4, kvHeads: 2, layers: 3 });
  const tokens = randomIds(testSeed(301), CONTEXT);
  const cases: { name: string; selector: () => TokenSelector; timing: "pre" | "post"; ref: RefSelect }[] = [
    { name: "top-K in JS", selector: () => topKSelector(false), timing: "post", ref: { kind: "topk", k: 5 } },
    { name: "top-K in the stage", selector: () => topKSelector(true), timing: "post", ref: { kind: "topk", k: 5 } },
    { name: "streaming pre-QKᵀ", selector: () => streamingSelector(2), timing: "pre", ref: { kind: "streaming", k: 5, sinks: 2 } },
  ];
  for (const c of cases) {
    for (const mode of ["exact", "speculative"] as const) {
      for (const sinks of [0, 2]) {
        it(`${c.name}, ${mode} logits, ${sinks} sinks: within ${TOL} of the reference`, () => {
          const prompt = 13;
          const hy = run(files, tokens, { budget: 8, sinks, block: 3, prompt, selector: c.selector(), scheduler: fixedScheduler(5, c.timing), logits: mode });
          expect(Math.max(...hy.stored)).toBeGreaterThan(5); // K < offloaded: selection matters
          const want = reference(files, weights, tokens, prompt, hy.stored, sinks, c.ref, mode === "speculative");
          hy.out.forEach((l, i) => expect(maxAbsDiff(l, want[i]), `step ${i}`).toBeLessThan(TOL));
          expect(hy.stats!.meanRows).toBe(5);
        });
      }
    }
  }

  // Verified: q̃ chooses (widened by `candidates`), the true query scores; exactLayers select with q.
  const verifiedModes: { name: string; opts: { candidates?: number; exactLayers?: number[] } }[] = [
    { name: "verified", opts: { candidates: 1 } },
    { name: "verified with the default options (4× candidates)", opts: {} },
    { name: "verified, 2× candidates", opts: { candidates: 2 } },
    { name: "verified, layer 1 exact", opts: { exactLayers: [1] } },
  ];
  for (const c of cases) {
    for (const v of verifiedModes) {
      it(`${c.name}, ${v.name}: within ${TOL} of the reference`, () => {
        const prompt = 13;
        const hy = run(files, tokens, { budget: 8, sinks: 2, block: 3, prompt, selector: c.selector(), scheduler: fixedScheduler(5, c.timing), logits: "verified", ...v.opts });
        expect(Math.max(...hy.stored)).toBeGreaterThan(10); // 2K < offloaded: the width matters
        const want = reference(files, weights, tokens, prompt, hy.stored, 2, c.ref, { speculative: true, verified: true, candidates: 4, ...v.opts });
        hy.out.forEach((l, i) => expect(maxAbsDiff(l, want[i]), `step ${i}`).toBeLessThan(TOL));
      });
    }
  }

  it("verified differs from speculative, and a wider candidate set moves it toward exact", () => {
    const prompt = 13, w = { budget: 8, sinks: 0, block: 3, prompt, scheduler: fixedScheduler(3, "post") as ReturnType<typeof fixedScheduler> };
    const dist = (logits: "exact" | "speculative" | "verified", candidates = 1) => {
      const full = run(files, tokens, { prompt });
      const hy = run(files, tokens, { ...w, selector: topKSelector(true), scheduler: fixedScheduler(3, "post"), logits, candidates });
      return hy.out.reduce((a, l, i) => a + maxAbsDiff(l, full.out[i]), 0);
    };
    const spec = dist("speculative"), ver = dist("verified"), wide = dist("verified", 8);
    expect(Math.abs(spec - ver)).toBeGreaterThan(1e-4);
    expect(wide).toBeLessThan(ver);
  });

  it("bad exactLayers / candidates are one-line errors", () => {
    const { files: f } = tinyModel({ seed: testSeed(310), maxPositions: 64, heads: 4, kvHeads: 2, layers: 3 });
    const be = new ReferenceBackend();
    using model = LlamaModel.load(f, be, { maxContext: 32, gpuKvBudget: 6 });
    const parts = () => ({ attention: model.attention, projector: model, stage: new BackendCpuStage(be), selector: topKSelector(true), scheduler: fixedScheduler(3, "post") });
    expect(() => new HybridAttention(parts(), { logits: "verified", exactLayers: [3] })).toThrow(/exactLayers: layer 3 does not exist \(the model has 3\)/);
    expect(() => new HybridAttention(parts(), { logits: "verified", candidates: 0 })).toThrow(/invalid hybrid option candidates/);
    expect(() => new HybridAttention(parts(), { logits: "nope" as "exact" })).toThrow(/invalid hybrid option logits/);
  });

  it("K = 0, no sinks: the window alone (the empty store span, first in order, writes nothing)", () => {
    for (const kernel of [false, true]) {
      const hy = run(files, tokens, { budget: 8, sinks: 0, block: 3, prompt: 13, selector: topKSelector(kernel), scheduler: fixedScheduler(0, "post") });
      expect(Math.max(...hy.stored)).toBeGreaterThan(0);
      const want = reference(files, weights, tokens, 13, hy.stored, 0, { kind: "topk", k: 0 }, false);
      hy.out.forEach((l, i) => expect(maxAbsDiff(l, want[i]), `kernel ${kernel} step ${i}`).toBeLessThan(TOL));
    }
  });

  it("the reference itself: 'all' equals full attention and top-K differs from it", () => {
    const stored = new Array(CONTEXT - 13).fill(8);
    const all = reference(files, weights, tokens, 13, stored, 0, { kind: "all" }, false);
    const full = reference(files, weights, tokens, 13, stored.map(() => 0), 0, { kind: "all" }, false);
    const topk = reference(files, weights, tokens, 13, stored, 0, { kind: "topk", k: 3 }, false);
    all.forEach((l, i) => expect(maxAbsDiff(l, full[i])).toBeLessThan(1e-9));
    expect(Math.max(...topk.map((l, i) => maxAbsDiff(l, full[i])))).toBeGreaterThan(1e-3);
  });
});

describe("accumulated scores", () => {
  it("per KV head, the tracked probabilities sum to steps × group size, and only attended tokens gain", () => {
    const { files } = tinyModel({ seed: testSeed(600), maxPositions: 64, heads: 4, kvHeads: 2 });
    const tokens = randomIds(testSeed(601), 30);
    const be = new ReferenceBackend();
    using model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: 32, gpuKvBudget: 6, kvEvictBlock: 2 });
    using h = HybridAttention.attach(
      { attention: model.attention, projector: model, stage: new BackendCpuStage(be), selector: topKSelector(true), scheduler: fixedScheduler(3, "post") },
      { logits: "exact", trackScores: true });
    model.forward(Int32Array.from(tokens.slice(0, 10)), 0);
    for (let t = 10; t < tokens.length; t++) model.forward(Int32Array.of(tokens[t]), t);
    const sc = h.accumulatedScores(1)!;
    expect(sc.steps).toBe(h.stats.steps);
    const offloaded = model.cache.storeCount;
    for (const row of sc.perKvHead) {
      let total = 0;
      for (let i = 0; i < row.length; i++) total += row[i];
      expect(total).toBeCloseTo(sc.steps * 2, 4); // group of 2 query heads, each row sums to 1
      // With K = 3 per step, at most 3 × steps offloaded slots can have gained anything.
      expect(Array.from(row.subarray(0, offloaded)).filter((v) => v > 0).length).toBeLessThanOrEqual(3 * sc.steps);
    }
  });
});

describe("speculative query", () => {
  it("LlamaModel.projectQuery equals RoPE(W_q · rmsNorm(x)) of the reference", () => {
    const { files, weights } = tinyModel({ seed: testSeed(400), heads: 4, kvHeads: 2, attentionBias: true });
    const be = new ReferenceBackend();
    using model = LlamaModel.load(files, be, {});
    const ref = new HybridReference(files, weights);
    const rng = makeRng(testSeed(401));
    const dim = files.shape.hiddenSize, qw = files.shape.heads * files.shape.headDim;
    const x = be.alloc([1, dim]), out = be.alloc([1, qw]);
    for (const [layer, pos] of [[0, 0], [1, 17], [1, 63]]) {
      const xs = randomArray(rng, dim);
      be.write(x, xs);
      model.projectQuery(layer, x, pos, out);
      expect(maxAbsDiff(be.read(out), ref.query(layer, Array.from(xs), pos))).toBeLessThan(1e-5);
    }
    expect(() => model.projectQuery(2, x, 0, out)).toThrow(/layer 2 out of range/);
    be.free(x);
    be.free(out);
  });
});

describe("hybrid attention: bad input", () => {
  const { files } = tinyModel({ seed: testSeed(500), maxPositions: 64 });
  const tokens = randomIds(testSeed(501), 24);

  it("a budget of 0, sinks filling the budget, or no offloading are one-line errors", () => {
    const be = new ReferenceBackend();
    expect(() => LlamaModel.load(files, be, { gpuKvBudget: 0 })).toThrow(/gpuKvBudget/);
    expect(() => LlamaModel.load(files, be, { gpuKvBudget: 4, sinkTokens: 4, maxContext: 32 })).toThrow(/sink tokens leave no room/);
    using model = LlamaModel.load(files, be, { maxContext: 32 });
    expect(() => new HybridAttention({ attention: model.attention, projector: model, stage: new BackendCpuStage(be), selector: allSelector(false), scheduler: fixedScheduler(4, "post") }))
      .toThrow(/nothing would be offloaded/);
  });

  it("K larger than the offloaded count is clamped, and said once", () => {
    const hy = run(files, tokens, { budget: 6, block: 2, prompt: 10, selector: topKSelector(true), scheduler: fixedScheduler(1000, "post") });
    expect(hy.stats!.notes.join("\n")).toMatch(/K 1000 exceeds the offloaded tokens \(\d+ at step 0\): clamped/);
    expect(hy.stats!.notes.length).toBe(1);
  });

  it("a selector returning out-of-range, duplicate or unsorted ids fails with a clear error", () => {
    const bad = [
      [(i: { offloaded: number }) => ({ kind: "shared", ids: Int32Array.of(0, i.offloaded) }), /out of range/],
      [() => ({ kind: "shared", ids: Int32Array.of(1, 1) }), /not strictly ascending/],
      [() => ({ kind: "shared", ids: Int32Array.of(2, 1) }), /not strictly ascending/],
      [() => ({ kind: "shared", ids: Int32Array.of(-1) }), /out of range/],
    ] as const;
    for (const [pick, msg] of bad) {
      expect(() => run(files, tokens, { budget: 6, block: 2, prompt: 10, selector: rawSelector(pick as never), scheduler: fixedScheduler(3, "pre") })).toThrow(msg);
    }
  });

  it("after a selector fails mid-step (speculative, a job in flight) the model resets and runs again", () => {
    const be = new ReferenceBackend();
    using model = LlamaModel.load(files, be, { prefillBlock: 5, maxContext: 32, gpuKvBudget: 6, kvEvictBlock: 2 });
    let fail = true;
    const flaky = rawSelector((i) => {
      if (fail && i.layer === 1) throw new Error("boom");
      return { kind: "shared", ids: i.primitives.range(0, i.k) };
    });
    using h = HybridAttention.attach({ attention: model.attention, projector: model, stage: new BackendCpuStage(be), selector: flaky, scheduler: fixedScheduler(2, "pre") }, { logits: "speculative" });
    model.forward(Int32Array.from(tokens.slice(0, 10)), 0);
    expect(() => model.forward(Int32Array.of(tokens[10]), 10)).toThrow(/boom/);
    fail = false;
    model.reset();
    model.forward(Int32Array.from(tokens.slice(0, 10)), 0);
    expect(model.forward(Int32Array.of(tokens[10]), 10).every(Number.isFinite)).toBe(true);
    expect(h.stats.steps).toBe(1);
  });

  it("a stage job with a mismatched head layout is refused before any memory access", () => {
    const be = new ReferenceBackend();
    using stage = new BackendCpuStage(be);
    stage.prepare({ heads: 4, kvHeads: 2, headDim: 8, storeCapacity: 10, dtype: "f32" });
    const k = be.alloc([3, 10, 8]), v = be.alloc([2, 10, 8]);
    const job = { slot: 0 as const, k, v, offloaded: 5, kmax: 2, scale: 0.3, work: { kind: "score" as const } };
    expect(() => stage.submit(job)).toThrow(/store K has shape \[3, 10, 8\].*mismatched head layout/);
    expect(() => stage.submit({ ...job, k: v, offloaded: 11 })).toThrow(/offloaded count 11 out of range/);
    expect(() => stage.submit({ ...job, k: v, kmax: 6 })).toThrow(/width 6 out of range/);
    be.free(k);
    be.free(v);
  });
});
