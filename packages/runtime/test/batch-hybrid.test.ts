// Hybrid attention at batch > 1 (createBatchHybridAttention) on the CPU backend with the native
// stage: a batch of 3 sequences of different prompt lengths (so each offloads a different count),
// one leaving early and a fourth joining its slot, equals each sequence run alone with the same
// settings — "all" + exact logits and top-K (verified) — tokens exactly, logits within 1e-4;
// generateBatch's continuous batching gives each prompt's tokens alone; the AoG/AoC baselines
// attached per slot (as hybridgen bench does) equal full attention; bad input is one line.
import { afterAll, describe, expect, it } from "vitest";
import { BatchDecoder, generate, generateBatch, loadModel, relError, type LlamaModel } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { FixedScheduler } from "@hybridgen/scheduler";
import type { CpuStage, CpuStageJob } from "@hybridgen/spec";
import {
  attachAttentionConfigs, attentionConfig, createBatchHybridAttention, createHybridAttention, hybridPlan, sequenceModel, type AttachedAttention, type HybridRuntimeOptions,
} from "../src/index.js";
import { decodeBatched } from "./batch-helpers.js";
import { CONTEXT, tinyFiles } from "./tiny-model.js";

const backend = createCpuBackend({ threads: 1 });
afterAll(() => backend.close());

/** Batched rows run B-row matmuls where a single step runs fused matvecs: f32 summation order only. */
const REL_TOL = 1e-4;
const STEPS = 10;
const WINDOW = 16;
const tok = tinyFiles(5).tokenizer;

const load = () => loadModel(tinyFiles(5), backend, { maxContext: CONTEXT, gpuKvBudget: WINDOW, sinkTokens: 2 }) as LlamaModel;
const prompt = (n: number, seed: number) => Int32Array.from({ length: n }, (_, i) => 3 + ((i * 37 + seed * 101) % 250));
/** Offload 4, 24 and 45 tokens after their prompts; the fourth joins slot 0 when it leaves. */
const PROMPTS = [prompt(20, 1), prompt(40, 2), prompt(61, 3), prompt(30, 4)];

const argmax = (x: Float32Array) => x.reduce((b, v, i) => (v > x[b]! ? i : b), 0);

/** Each prompt alone under createHybridAttention: the logits before each of `steps` greedy tokens. */
async function alone(options: HybridRuntimeOptions, steps: number[]): Promise<Float32Array[][]> {
  using model = load();
  using _ha = await createHybridAttention(model, backend, options);
  return PROMPTS.map((p, i) => {
    model.reset();
    const out = [Float32Array.from(model.forward(p, 0))];
    for (let s = 0; s < steps[i]!; s++) out.push(Float32Array.from(model.forward(Int32Array.of(argmax(out[s]!)), p.length + s)));
    return out.slice(0, steps[i]);
  });
}


describe("hybrid attention at batch 3 equals each sequence alone (CPU backend, native stage)", () => {
  const steps = [4, STEPS, STEPS - 3, STEPS];
  for (const [name, options] of [
    ['"all" + exact logits', { selector: "all", logits: "exact" }],
    ["top-K, K = 8, verified logits (q̃ from each row's residual)", { selector: "topk", k: 8, logits: "verified" }],
    ["top-K, K = 8, exact logits", { selector: "topk", k: 8, logits: "exact" }],
    // The batch's stages are lanes of one native stage: on 3 threads a layer's jobs of the rows run at once, one a thread.
    ["top-K, K = 8, speculative logits, the batch's stage on 3 threads", { selector: "topk", k: 8, logits: "speculative", cpuStageThreads: 3 }],
    ["top-K, K = 8, exact logits, the batch's stage on 3 threads", { selector: "topk", k: 8, logits: "exact", cpuStageThreads: 3 }],
    ["page index, K = 8, verified logits, the batch's stage on 3 threads", { selector: "index", k: 8, logits: "verified", cpuStageThreads: 3 }],
  ] as const) {
    it(`${name}: tokens equal, logits within ${REL_TOL}; one leaves early, another joins its slot`, async () => {
      const want = await alone(options, steps);
      using model = load();
      using hybrid = await createBatchHybridAttention(model, backend, options, 3);
      const got = (() => {
        using dec = new BatchDecoder(model, 3);
        return decodeBatched(dec, PROMPTS, steps);
      })();
      got.forEach((rows, i) => {
        expect(rows.length, `sequence ${i}`).toBe(steps[i]);
        rows.forEach((g, s) => {
          expect(argmax(g), `sequence ${i} token ${s}`).toBe(argmax(want[i]![s]!));
          expect(relError(g, want[i]![s]!), `sequence ${i} token ${s}`).toBeLessThanOrEqual(REL_TOL);
        });
      });
      // One HybridAttention per slot, each with the settings, each over its own store.
      expect(hybrid.all).toHaveLength(3);
      for (const ha of hybrid.all) expect(hybridPlan(ha)).toMatchObject({ selector: options.selector, logits: options.logits });
      expect(hybrid.all[2]!.stats.offloaded).toBeGreaterThan(hybrid.all[1]!.stats.offloaded);
      expect(hybrid.all[1]!.stats.steps).toBe(STEPS - 1);
    });
  }

  it("generateBatch: 5 prompts through 3 slots (continuous batching) give each prompt's tokens alone, topk and all", async () => {
    const requests = PROMPTS.map((p, i) => ({ prompt: Array.from(p), maxTokens: [3, 9, 7, 8][i]! }));
    requests.push({ prompt: Array.from(prompt(25, 5)), maxTokens: 6 });
    for (const options of [{ selector: "topk", k: 8 }, { selector: "all", logits: "exact" }] as const) {
      const want: number[][] = [];
      {
        using model = load();
        using _ha = await createHybridAttention(model, backend, options);
        for (const r of requests) want.push((await generate(model, tok, r.prompt, { maxTokens: r.maxTokens, sampling: { temperature: 0 } }).result()).tokens);
      }
      using model = load();
      using _b = await createBatchHybridAttention(model, backend, options, 3);
      const res = await generateBatch(model, tok, requests, { batch: 3, sampling: { temperature: 0 } }).result();
      expect(res.results.map((r) => r.tokens), options.selector).toEqual(want);
    }
  });

  it("the batch's shared stage: a one-row step beside idle slots sends each job at its submit; a batched step's group goes once its rows' jobs are in", async () => {
    for (const logits of ["speculative", "exact"] as const) {
      let group: { readonly waiting: number } | null = null;
      const waiting: number[] = [];
      // Jobs still deferred in the group right after each submit (a device waiting on a deferred job hangs).
      const cpuStage = (stage: CpuStage): CpuStage =>
        new Proxy(stage, {
          get: (t, p) => (p === "submit" ? (job: CpuStageJob) => (t.submit(job), void waiting.push(group!.waiting)) : typeof Reflect.get(t, p) === "function" ? (Reflect.get(t, p) as Function).bind(t) : Reflect.get(t, p)),
        });
      using model = load();
      using hybrid = await createBatchHybridAttention(model, backend, { selector: "topk", k: 8, logits, cpuStageThreads: 2, cpuStage }, 3);
      group = hybrid.own.stageGroup as unknown as { readonly waiting: number };
      using dec = new BatchDecoder(model, 3); // slot 2 stays idle, its lane attached
      const layers = model.cache.layers;
      dec.prefill(0, PROMPTS[2]!, 0);
      for (let s = 0; s < 3; s++) dec.step([0], Int32Array.of(argmax(dec.logits(0))));
      expect(waiting, `${logits}: one-row steps`).toEqual(Array(3 * layers).fill(0));
      waiting.length = 0;
      const next0 = argmax(dec.logits(0));
      dec.prefill(1, PROMPTS[1]!, 0);
      dec.step([0, 1], Int32Array.of(next0, argmax(dec.logits(1))));
      dec.step([0, 1], Int32Array.of(argmax(dec.logits(0)), argmax(dec.logits(1))));
      expect(waiting, `${logits}: two-row steps`).toEqual(Array.from({ length: 2 * layers }, () => [1, 0]).flat());
    }
  });

  it("bench's way (attachAttentionConfigs): flexgen (AoG), moe-lightning (AoC) and all-tokens attached to each slot of a batch of 2 equal full attention", async () => {
    const run = async (name: string | null) => {
      using model = name ? load() : (loadModel(tinyFiles(5), backend, { maxContext: CONTEXT }) as LlamaModel);
      using dec = new BatchDecoder(model, 2);
      const out: Float32Array[] = [];
      for (const i of [0, 1]) {
        dec.prefill(i, PROMPTS[i + 1]!, 0);
        out.push(dec.logits(i));
      }
      const attached: AttachedAttention[] = name ? await attachAttentionConfigs([0, 1].map((i) => sequenceModel(model, dec.sequence(i))), backend, attentionConfig(name, 8)) : [];
      for (let s = 0; s < 6; s++) {
        dec.step([0, 1], Int32Array.of(argmax(out.at(-2)!), argmax(out.at(-1)!)));
        out.push(dec.logits(0), dec.logits(1));
      }
      for (const a of attached) a.close();
      return out;
    };
    const want = await run(null);
    for (const name of ["flexgen", "moe-lightning", "all-tokens"]) {
      const got = await run(name);
      got.forEach((g, i) => expect(relError(g, want[i]!), `${name} ${i}`).toBeLessThanOrEqual(REL_TOL));
    }
  });

  it("one-line errors: a Scheduler object, a storeAllocator object, a window holding the context; a slot without hybrid attention", async () => {
    using model = load();
    await expect(createBatchHybridAttention(model, backend, { scheduler: new FixedScheduler({ k: 4 }) })).rejects.toThrow(
      'a Scheduler object serves one sequence; batched hybrid attention needs scheduler "fixed" or "feedback" (one per sequence)',
    );
    const allocator = { alloc: () => { throw new Error("unused"); }, pinnable: () => true, release: () => {} };
    await expect(createBatchHybridAttention(model, backend, { storeAllocator: allocator as never })).rejects.toThrow(/^a storeAllocator object places one sequence's store/);
    using whole = loadModel(tinyFiles(5), backend, { maxContext: CONTEXT });
    await expect(createBatchHybridAttention(whole as LlamaModel, backend, {})).rejects.toThrow(/nothing would be offloaded/);
    using _ha = await createHybridAttention(model, backend, { selector: "all" });
    expect(() => new BatchDecoder(model, 2)).toThrow(/^batched decode: slot 1 has no decode attention and slot 0 has one/);
  });

  it("closing detaches every sequence's hybrid attention; sequences made later run full attention", async () => {
    using model = load();
    const hybrid = await createBatchHybridAttention(model, backend, { selector: "all", logits: "exact" }, 2);
    const s = model.createSequence();
    expect(s.attention.decodeAttention).toBe(hybrid.all[1]);
    hybrid.close();
    expect(model.attention.decodeAttention).toBeNull();
    expect(s.attention.decodeAttention).toBeNull();
    expect(model.createSequence().attention.decodeAttention).toBeNull();
    model.releaseSequence(s);
  });
});
