import { afterAll, describe, expect, it } from "vitest";
import { ReferenceBackend, loadModel } from "@hybridgen/core";
import { type HybridProfile } from "../src/index.js";
import { createCpuBackend, DEFAULT_READ_DEPTH, NativeCpuStage } from "@hybridgen/kernels-cpu";
import { CONTEXT, PROMPT, STEPS, decodeTiny, tinyFiles as tinyModelFiles } from "./tiny-model.js";
import { FixedScheduler } from "@hybridgen/scheduler";
import { createSelector } from "@hybridgen/selectors";
import { createHybridAttention, hybridPlan, resolveHybrid } from "../src/index.js";

const tinyFiles = () => tinyModelFiles(5);

const backend = createCpuBackend({ threads: 1 });
afterAll(() => backend.close());
const prompt = Int32Array.from({ length: PROMPT }, (_, i) => (i * 37 + 11) % 256);

function load(window?: number) {
  return loadModel(tinyFiles(), backend, { maxContext: CONTEXT, ...(window ? { gpuKvBudget: window, sinkTokens: 2 } : {}) });
}

/** The prompt, then STEPS steps fed with `feed` (greedy when absent): every forward's logits. */
const decode = (model: ReturnType<typeof load>, feed?: number[]) => decodeTiny(model, prompt, feed);

// The part of a stored profile (core's HybridProfile) the runtime reads.
const profile = (): Pick<HybridProfile, "kMin" | "exactLayers" | "perSelector" | "selector"> => ({
  selector: "topk", kMin: 12, exactLayers: [1],
  perSelector: { topk: { kMin: 12, agreement: [[4, 0.9, 0.1], [12, 1, 0]] }, quest: { kMin: 20, agreement: [[20, 1, 0]] } },
});

describe("createHybridAttention on the CPU backend", () => {
  it('"all" + exact logits gives full attention\'s logits at every step', async () => {
    using full = load();
    const want = decode(full);
    using model = load(16);
    using ha = await createHybridAttention(model, backend, { selector: "all", logits: "exact" });
    expect(hybridPlan(ha)!.transport).toBe("host"); // no host link: the backend reads the stage's buffers
    const got = decode(model, want.tokens);
    for (let i = 0; i < got.logits.length; i++) {
      const a = got.logits[i]!, b = want.logits[i]!;
      let worst = 0, scale = 0;
      for (let j = 0; j < a.length; j++) {
        worst = Math.max(worst, Math.abs(a[j]! - b[j]!));
        scale = Math.max(scale, Math.abs(b[j]!));
      }
      expect(worst / scale, `forward ${i}`).toBeLessThan(1e-5);
    }
    expect(ha.stats.trace.length).toBe(STEPS);
  });

  it("compressed scoring (int8, int4) with rescoreFactor·K covering the store gives full scoring's logits bit for bit", async () => {
    using ref = load(16);
    const want = await (async () => {
      using ha = await createHybridAttention(ref, backend, { selector: "topk", k: 8, logits: "exact" });
      return decode(ref);
    })();
    for (const scoring of ["int8", "int4"] as const) {
      using model = load(16);
      using ha = await createHybridAttention(model, backend, { selector: "topk", k: 8, logits: "exact", scoring, rescoreFactor: 64 });
      expect(hybridPlan(ha)).toMatchObject({ scoring, rescoreFactor: 64 });
      const got = decode(model, want.tokens);
      for (let i = 0; i < got.logits.length; i++) expect(Array.from(got.logits[i]!), `${scoring} forward ${i}`).toEqual(Array.from(want.logits[i]!));
      // The stats line names the scoring form with the CPU stage's split.
      expect(ha.stats.summary()).toContain(`(scoring ${scoring}, 64·K rescored)`);
    }
  });

  it("readDepth reaches the native stage; absent, the stage's DEFAULT_READ_DEPTH", async () => {
    // The stage is HybridAttention's private field: the one place the constructed NativeCpuStage is seen.
    const stageOf = (ha: object) => (ha as unknown as { stage: NativeCpuStage }).stage;
    for (const readDepth of [0, 3, 64]) {
      using model = load(16);
      using ha = await createHybridAttention(model, backend, { readDepth });
      expect(hybridPlan(ha)!.readDepth).toBe(readDepth);
      expect(stageOf(ha)).toBeInstanceOf(NativeCpuStage);
      expect(stageOf(ha).readDepth).toBe(readDepth);
    }
    using model = load(16);
    using ha = await createHybridAttention(model, backend);
    expect(hybridPlan(ha)!.readDepth).toBeUndefined();
    expect(stageOf(ha).readDepth).toBe(DEFAULT_READ_DEPTH);
  });

  it("defaults on the CPU backend: the fixed scheduler, top-K post, K from the prefill's calibration (DEFAULT_K before it), the engine's logits mode, one stage thread", async () => {
    using model = load(16);
    using ha = await createHybridAttention(model, backend);
    expect(hybridPlan(ha)).toMatchObject({
      selector: "topk", scheduler: "fixed", k: 64, timing: "post", kSource: "default", exactLayers: [], cpuStageThreads: 1, idleSpinUs: 0,
    });
    expect(hybridPlan(ha)!.kMin).toBeUndefined();
    decode(model);
    const k = hybridPlan(ha)!.calibrated!.k;
    expect(hybridPlan(ha)).toMatchObject({ k, kSource: "calibration" });
    expect(ha.stats.trace.every((r) => r.k === k && r.timing === "post")).toBe(true);
  });

  it("feedback with a pair selector: every step recorded with its K, timing and times; K never below kMin", async () => {
    using model = load(16);
    using ha = await createHybridAttention(model, backend, { scheduler: "feedback", kMin: 4 });
    const plan = hybridPlan(ha)!;
    expect(plan).toMatchObject({ selector: "topk+quest", selectorTimings: ["pre", "post"], scheduler: "feedback", k: 4, kMin: 4, timing: "post", kSource: "option" });
    decode(model);
    const t = ha.stats.trace;
    expect(t.map((r) => r.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i));
    for (const r of t) {
      expect(r.k).toBeGreaterThanOrEqual(4);
      expect(r.offloaded).toBeGreaterThan(0);
      for (const v of [r.tGpuMs, r.tCpuMs, r.tTxMs, r.wallMs]) expect(Number.isFinite(v) && v >= 0).toBe(true);
    }
    expect(t[0]!.k).toBe(4);
    expect(ha.stats.summary()).toMatch(/; scheduler: K 4 → \d+ \(range \d+–\d+\), (post|pre), \d+ timing switch(es)?(; calibrated from the prefill .*)?$/);
  });

  it("a pre-only selector under feedback starts pre and never asks for post", () => {
    const r = resolveHybrid({ selector: "quest", scheduler: "feedback", kMin: 8 }, { device: true });
    expect(r.plan).toMatchObject({ timing: "pre", scheduler: "feedback", selectorTimings: ["pre"] });
    expect(r.scheduler.initial()).toEqual({ k: 8, timing: "pre" });
  });

  it("on a device the default is feedback over topk+quest; kMin means feedback, k or timing alone fixed", () => {
    expect(resolveHybrid({ k: 8 }, { device: true }).plan).toMatchObject({ scheduler: "fixed", k: 8, selector: "topk" });
    expect(resolveHybrid({ timing: "pre" }, { device: true }).plan).toMatchObject({ scheduler: "fixed", selector: "streaming" });
    expect(resolveHybrid({ k: 32, kMin: 8 }, { device: true }).plan).toMatchObject({ scheduler: "feedback", k: 32, kMin: 8 });
    const onDevice = resolveHybrid({}, { device: true });
    expect(onDevice.plan).toMatchObject({ scheduler: "feedback", selector: "topk+quest", kMin: 64, k: 64 });
    // both halves of the pair choose in the native stage: top-K post-QKᵀ, Quest's pages pre-QKᵀ
    expect(onDevice.selector.kernel).toEqual(["topk", { name: "quest", pageSize: 16 }]);
    expect(resolveHybrid({ kMin: 16, k: 32 }, { device: false }).plan).toMatchObject({ scheduler: "feedback", kMin: 16, k: 32 });
    expect(resolveHybrid({ timing: "pre" }, { device: false }).plan).toMatchObject({ scheduler: "fixed", selector: "streaming", timing: "pre" });
  });

  it("takes kMin and exactLayers from the model's profile; options override them", async () => {
    const p = profile();
    expect(resolveHybrid({ profile: p, scheduler: "feedback" }, { device: false }).plan).toMatchObject({ kMin: 12, kSource: "profile", exactLayers: [1] });
    expect(resolveHybrid({ profile: p, scheduler: "feedback", selector: "topk+streaming" }, { device: false }).plan.kMin).toBe(12); // the pair's post half
    expect(resolveHybrid({ profile: p, scheduler: "feedback", selector: "quest" }, { device: false }).plan.kMin).toBe(20);
    expect(resolveHybrid({ profile: p }, { device: false }).plan).toMatchObject({ scheduler: "fixed", k: 12, kSource: "profile" });
    expect(resolveHybrid({ profile: p, kMin: 5, exactLayers: [] }, { device: false }).plan).toMatchObject({ kMin: 5, kSource: "option", exactLayers: [] });
    expect(resolveHybrid({ profile: { ...p, candidates: 3 } }, { device: false }).hybridOptions.candidates).toBe(3);
    expect(resolveHybrid({ profile: { ...p, candidates: 3 }, candidates: 1 }, { device: false }).plan.candidates).toBe(1);
    using model = load(16);
    using ha = await createHybridAttention(model, backend, { profile: p, logits: "verified", candidates: 2 });
    expect(hybridPlan(ha)).toMatchObject({ k: 12, exactLayers: [1], logits: "verified", candidates: 2 });
    decode(model);
    expect(ha.stats.trace.length).toBe(STEPS);
  });

  it("accepts a TokenSelector and a Scheduler object", async () => {
    using model = load(16);
    using ha = await createHybridAttention(model, backend, { selector: createSelector("topk"), scheduler: new FixedScheduler({ k: 5 }) });
    expect(hybridPlan(ha)).toMatchObject({ selector: "topk", scheduler: "fixed", k: 5 });
    decode(model);
    expect(ha.stats.trace.every((r) => r.k === 5)).toBe(true);
  });

  it("cpuStage wraps the built stage (a bench's meter); trackScores keeps accumulated scores for a selector that needs none", async () => {
    using model = load(16);
    let built: unknown = null, submits = 0;
    using ha = await createHybridAttention(model, backend, {
      selector: "topk", k: 4, trackScores: true,
      cpuStage: (stage, host) => {
        built = stage;
        expect(host).toBe(backend);
        return new Proxy(stage, {
          get: (t, p) => (p === "submit" ? (job: never) => (submits++, t.submit(job)) : typeof Reflect.get(t, p) === "function" ? (Reflect.get(t, p) as Function).bind(t) : Reflect.get(t, p)),
        });
      },
    });
    expect(built).toBeInstanceOf(NativeCpuStage);
    decode(model);
    expect(submits).toBeGreaterThan(0);
    expect(ha.accumulatedScores(0)).toBeDefined();
    using plain = load(16);
    using other = await createHybridAttention(plain, backend, { selector: "topk", k: 4 });
    decode(plain);
    expect(other.accumulatedScores(0)).toBeUndefined();
  });

  it("bad options are one-line errors, before anything is allocated", async () => {
    const bad: [Record<string, unknown>, string | RegExp][] = [
      [{ kMin: 0 }, "hybrid runtime option kMin: must be at least 1"],
      [{ scheduler: "nope" }, /^hybrid runtime option scheduler: /],
      [{ selector: "quest", timing: "post" }, 'selector "quest" cannot run post-QKᵀ selection (it supports pre)'],
      [{ selector: "topk", timing: "pre" }, 'selector "topk" cannot run pre-QKᵀ selection (it supports post)'],
      [{ scheduler: "fixed", kMin: 8 }, "kMin applies to a scheduler with a floor such as feedback, not fixed"],
      [{ scheduler: "feedback", kMin: 16, k: 8 }, "k 8 (the feedback scheduler's first K) is below kMin 16"],
      [{ selector: "nope" }, /^unknown selector "nope"/],
      [{ selector: "topk+" }, 'selector "topk+": a pair is POST+PRE, e.g. topk+streaming'],
      [{ selector: "streaming+topk" }, /^pairSelectors: selector "topk" cannot run pre-QKᵀ/],
      [{ scheduler: new FixedScheduler(), k: 3 }, "k and timing configure a built-in scheduler; a Scheduler object brings its own"],
      [{ scoring: "int3" }, "hybrid runtime option scoring: must be full, int8 or int4"],
      [{ rescoreFactor: 0 }, "hybrid runtime option rescoreFactor: must be at least 1"],
      [{ rowPath: "pinned" }, "hybrid runtime option rowPath: must be auto, mapped or staged"],
      [{ readDepth: 65 }, "hybrid runtime option readDepth: must be ≤ 64"],
      [{ readDepth: -1 }, "hybrid runtime option readDepth: must be at least 0"],
      [{ readDepth: 1.5 }, /^hybrid runtime option readDepth: /],
      [{ threads: 2 }, /^hybrid runtime option : Unrecognized key|^hybrid runtime option value: Unrecognized key/],
      [{ cpuStage: 3 }, "hybrid runtime option cpuStage: must be a function (stage, host) => CpuStage"],
    ];
    using model = load(16);
    for (const [options, message] of bad) {
      await expect(createHybridAttention(model, backend, options as never), JSON.stringify(Object.keys(options))).rejects.toThrow(message);
    }
    expect(model.attention.decodeAttention).toBeNull();
    using whole = load();
    await expect(createHybridAttention(whole, backend)).rejects.toThrow(/nothing would be offloaded/);
    using onRef = new ReferenceBackend();
    await expect(createHybridAttention(model, onRef)).rejects.toThrow("hybrid attention needs the CPU backend or a device backend with host transfers (got reference)");
  });
});
