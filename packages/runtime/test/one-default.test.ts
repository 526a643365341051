// K has one default (core's DEFAULT_K): the fixed scheduler's K, the feedback scheduler's floor
// and the runtime's plan all take it when nothing else gives one; rowPath likewise takes the engine's.
import { describe, expect, it } from "vitest";
import { DEFAULT_K } from "@hybridgen/core";
import { HybridOptionsSchema } from "../src/index.js";
import { FeedbackScheduler, FixedScheduler } from "@hybridgen/scheduler";
import { resolveHybrid } from "../src/index.js";

describe("the one K default", () => {
  it("runtime (fixed and feedback) == FixedScheduler == FeedbackScheduler == DEFAULT_K", () => {
    const fixed = resolveHybrid({}, { device: false });
    const feedback = resolveHybrid({}, { device: true });
    expect(fixed.plan).toMatchObject({ scheduler: "fixed", k: DEFAULT_K, kSource: "default" });
    expect(feedback.plan).toMatchObject({ scheduler: "feedback", k: DEFAULT_K, kMin: DEFAULT_K, kSource: "default" });
    expect(fixed.scheduler.initial().k).toBe(new FixedScheduler().initial().k);
    expect(feedback.scheduler.initial().k).toBe(new FeedbackScheduler().initial().k);
    expect(new FixedScheduler().initial().k).toBe(DEFAULT_K);
  });

  it("k, kMin and timing are checked once, with the names the schedulers take", () => {
    expect(() => resolveHybrid({ k: 0 }, { device: false })).toThrow("hybrid runtime option k: must be at least 1");
    expect(() => resolveHybrid({ kMin: 2.5 }, { device: false })).toThrow("hybrid runtime option kMin: must be an integer");
    expect(() => resolveHybrid({ topK: 4 } as never, { device: false })).toThrow(/hybrid runtime option .*"topK"/);
    const r = resolveHybrid({ scheduler: "feedback", kMin: 8, k: 16, timing: "post" }, { device: false });
    expect(r.scheduler.initial()).toEqual({ k: 16, timing: "post" });
  });

  it("rowPath has the engine's default and reaches HybridOptions as given", () => {
    expect(resolveHybrid({}, { device: true }).plan.rowPath).toBe(HybridOptionsSchema.parse({}).rowPath);
    for (const rowPath of ["auto", "mapped", "staged"] as const) {
      const r = resolveHybrid({ rowPath }, { device: true });
      expect(r.plan.rowPath).toBe(rowPath);
      expect(r.hybridOptions.rowPath).toBe(rowPath);
    }
  });
});
