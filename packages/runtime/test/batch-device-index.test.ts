// The page index ranked on the device at batch 3 (a CPU backend standing in for indexRank and
// indexRankRows): each sequence alone and the batch give the same tokens and logits (within 1e-4),
// and in verified logits every layer of every batched step ranks all its rows in ONE indexRankRows
// call (the rows' q̃ of the batch), where exact logits rank each row on its own with its true query.
import { afterAll, describe, expect, it } from "vitest";
import { BatchDecoder, loadModel, relError, type Backend, type LlamaModel } from "@hybridgen/core";
import { createSelector } from "@hybridgen/selectors";
import { createBatchHybridAttention, createHybridAttention, type HybridRuntimeOptions } from "../src/index.js";
import { IndexSyncBatch } from "../src/hybrid/device-index.js";
import { decodeBatched } from "./batch-helpers.js";
import { rankingBackend } from "./ranking-backend.js";
import { CONTEXT, tinyFiles } from "./tiny-model.js";

const { backend, calls } = rankingBackend();
afterAll(() => (backend as Backend & { close(): void }).close());

const REL_TOL = 1e-4;
const LAYERS = 3;
const load = () => loadModel(tinyFiles(9), backend, { maxContext: CONTEXT, gpuKvBudget: 16, sinkTokens: 2 }) as LlamaModel;
const prompt = (n: number, seed: number) => Int32Array.from({ length: n }, (_, i) => 3 + ((i * 37 + seed * 101) % 250));
const PROMPTS = [prompt(20, 1), prompt(40, 2), prompt(61, 3), prompt(30, 4)];
const STEPS = [4, 10, 7, 10];
const argmax = (x: Float32Array) => x.reduce((b, v, i) => (v > x[b]! ? i : b), 0);
const options = (logits: "exact" | "verified"): HybridRuntimeOptions =>
  ({ selector: createSelector("index", { pageSize: 4, superPages: 2, placement: "device" }), scheduler: "fixed", k: 6, timing: "pre", logits });

async function alone(o: HybridRuntimeOptions): Promise<Float32Array[][]> {
  using model = load();
  using _ha = await createHybridAttention(model, backend, o);
  return PROMPTS.map((p, i) => {
    model.reset();
    const out = [Float32Array.from(model.forward(p, 0))];
    for (let s = 0; s + 1 < STEPS[i]!; s++) out.push(Float32Array.from(model.forward(Int32Array.of(argmax(out[s]!)), p.length + s)));
    return out;
  });
}

describe("the page index ranked on the device for a batch of 3", () => {
  for (const logits of ["verified", "exact"] as const) {
    it(`${logits}: the batch equals each sequence alone; ${logits === "verified" ? "one ranking call a layer for all rows" : "each row ranked alone"}`, async () => {
      const want = await alone(options(logits));
      using model = load();
      using batch = await createBatchHybridAttention(model, backend, options(logits), 3);
      const before = { ...calls }, syncs = IndexSyncBatch.of(backend).calls;
      let steps = 0, rows = 0; // steps of 2+ rows and their rows (a step of one row is a plain step)
      const got = (() => {
        using dec = new BatchDecoder(model, 3);
        const step = dec.step.bind(dec);
        dec.step = (slots, tokens) => {
          if (slots.length > 1) {
            steps++;
            rows += slots.length;
          }
          return step(slots, tokens);
        };
        return decodeBatched(dec, PROMPTS, STEPS);
      })();
      got.forEach((seq, i) => {
        expect(seq.length, `sequence ${i}`).toBe(STEPS[i]);
        seq.forEach((g, s) => {
          expect(argmax(g), `sequence ${i} token ${s}`).toBe(argmax(want[i]![s]!));
          expect(relError(g, want[i]![s]!), `sequence ${i} token ${s}`).toBeLessThanOrEqual(REL_TOL);
        });
      });
      for (const ha of batch.all) expect(ha.deviceIndex).not.toBeNull();
      // Every row offloads from its first step (prompts past the window of 16); all 3 run 6 steps, then 2 and 1.
      expect(steps).toBe(9);
      expect(calls.rows - before.rows).toBe(logits === "verified" ? rows * LAYERS : 0);
      expect(calls.rowCalls - before.rowCalls).toBe(logits === "verified" ? steps * LAYERS : 0);
      // The rows' index folds as one call a batched step (a step whose rows evicted nothing folds nothing).
      const folds = IndexSyncBatch.of(backend).calls - syncs;
      expect(folds).toBeGreaterThan(0);
      expect(folds).toBeLessThanOrEqual(steps);
    });
  }
});
