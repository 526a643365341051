import { describe, expect, it } from "vitest";
import { type SelectionTiming } from "@hybridgen/core";
import { HYBRID_TRACE_LIMIT, HybridStats } from "../src/index.js";

const step = (i: number, k: number, timing: SelectionTiming) => ({ step: i, tGpuMs: 1, tCpuMs: 2, tTxMs: 0.5, tWaitMs: 0.25, k, timing, offloaded: 100 + i, layers: 4 });

describe("HybridStats' per-step trace", () => {
  it("records each step's scheduler inputs, counts timing switches and summarises them", () => {
    const s = new HybridStats();
    expect(s.schedulerSummary()).toBe("");
    const plan: [number, SelectionTiming][] = [[8, "post"], [16, "post"], [16, "pre"], [32, "pre"], [24, "post"]];
    plan.forEach(([k, t], i) => s.record(step(i, k, t), 3 + i));
    expect(s.trace.map((r) => [r.k, r.timing, r.wallMs])).toEqual(plan.map(([k, t], i) => [k, t, 3 + i]));
    expect(s.trace[2]).toEqual({ step: 2, k: 16, timing: "pre", offloaded: 102, tGpuMs: 1, tCpuMs: 2, tTxMs: 0.5, tWaitMs: 0.25, wallMs: 5 });
    expect(s.timingSwitches).toBe(2);
    expect(s.schedulerSummary()).toBe("; scheduler: K 8 → 24 (range 8–32), post, 2 timing switches");
    s.reset();
    expect(s.trace).toEqual([]);
    expect(s.timingSwitches).toBe(0);
  });

  it("a device index's fold and upload is the median step's (the first step folds the whole store); without one nothing is said", () => {
    const s = new HybridStats();
    [40, 0.2, 0.3, 0.25].forEach((ms, i) => s.record(step(i, 8, "pre"), 3, { indexSyncMs: ms }));
    expect(s.syncSummary()).toBe("; device index: evicted rows folded and uploaded in 0.275 ms a step (median, driving thread, before the step's device work)");
    s.reset();
    s.record(step(0, 8, "pre"), 3);
    expect(s.syncSummary()).toBe("");
    expect(s.summary()).not.toContain("device index");
  });

  it("recorded segments: the median step's device time inside them, its idle rest of the span (T_gpu and the stage waits) and the host's blocked time, per layer; none recorded, nothing said", () => {
    const s = new HybridStats();
    s.steps = 3;
    s.layerSteps = 12;
    [[30, 1], [5, 0.5], [6, 0.25]].forEach(([segmentMs, hostWaitMs], i) => s.record({ ...step(i, 8, "pre"), tGpuMs: 10, tWaitMs: 2 }, 14, { segments: { segmentMs: segmentMs!, hostWaitMs: hostWaitMs! } }));
    expect(s.segmentSummary()).toBe("; recorded segments per layer: the device in them 1.500 ms, idle between them 1.500 ms; the driving thread blocked on the device 0.125 ms");
    expect(s.summary()).toContain(s.segmentSummary());
    s.reset();
    s.steps = 1;
    s.layerSteps = 4;
    s.record(step(0, 8, "pre"), 3);
    expect(s.segmentSummary()).toBe("");
  });

  it("keeps the last HYBRID_TRACE_LIMIT steps and counts the rest", () => {
    const s = new HybridStats();
    for (let i = 0; i < HYBRID_TRACE_LIMIT + 10; i++) s.record(step(i, 8, i % 1000 === 999 ? "pre" : "post"), 1);
    expect(s.trace.length).toBe(HYBRID_TRACE_LIMIT);
    expect(s.droppedSteps).toBe(10);
    expect(s.trace[0]!.step).toBe(10);
    expect(s.timingSwitches).toBe(8); // four pre steps, each in and out
  });

  it("reports the median step per layer: a step that records graphs and waits long does not swamp it", () => {
    const s = new HybridStats();
    const waits = [60, 0.2, 0.4, 0.2, 0.2]; // step 0 records the step's graphs
    waits.forEach((w, i) => {
      s.steps++;
      s.layerSteps += 4;
      s.record({ ...step(i, 8, "pre"), tGpuMs: 8 + i, tCpuMs: 4, tWaitMs: w }, 10 + w, { issueMs: 9 });
    });
    const line = s.summary();
    expect(line).toContain("per layer: CPU stage 1.000 ms, device stage 2.500 ms, 95% of the CPU stage hidden behind the device stage (median of 5 hybrid steps)");
    expect(line).toContain("transfers 0.125 ms; driving thread per layer: issuing 2.250 ms, waiting for the CPU stage 0.050 ms");
    expect(s.hiddenFraction).toBeCloseTo(0.95, 10);
    s.reset();
    expect(s.steady()).toEqual({ cpu: 0, gpu: 0, tx: 0, wait: 0, issue: 0 });
  });

  it("the CPU stage's split is the median step's, and names a compressed scoring form; full rows say nothing", () => {
    const s = new HybridStats();
    expect(s.splitSummary()).toBe("");
    [[4, 0, 0, 0], [400, 8, 0, 0], [4, 0, 0, 0.5]].forEach((split, i) => {
      s.steps++;
      s.layerSteps += 4;
      s.record(step(i, 8, "post"), 1, { split });
    });
    expect(s.splitSummary()).toBe("; CPU stage split per layer: score 1.000 ms, top-K 0.000 ms, gather 0.000 ms, hand-offs 0.000 ms");
    s.scoring = "int8, 2·K rescored";
    expect(s.splitSummary()).toBe("; CPU stage split per layer: score 1.000 ms, top-K 0.000 ms, gather 0.000 ms, hand-offs 0.000 ms (scoring int8, 2·K rescored)");
  });
});
