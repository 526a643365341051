import { describe, expect, it } from "vitest";
import { DEFAULT_K } from "@hybridgen/spec";
import { FeedbackScheduler, FixedScheduler, SchedulerSpecSchema, createScheduler } from "../src/index.js";
import { measure, rng } from "./simulate.js";

describe("FixedScheduler", () => {
  it("answers the given K and timing whatever the measurements", () => {
    const r = rng(11);
    const s = new FixedScheduler({ k: 96, timing: "pre" });
    expect(s.initial()).toEqual({ k: 96, timing: "pre" });
    for (let step = 0; step < 50; step++) {
      const m = { gpuMs: r() * 10, fixedMs: r(), scoreMs: r() * 1e-3, preScoreMs: r() * 1e-3, gatherMs: r() * 1e-2, txMs: r() * 1e-2 };
      expect(s.next(measure(m, step, 96, "pre", 1 + Math.floor(r() * 1e5), 0.2, r))).toEqual({ k: 96, timing: "pre" });
    }
  });
  it("defaults to K = DEFAULT_K post and rejects K < 1", () => {
    expect(new FixedScheduler().initial()).toEqual({ k: DEFAULT_K, timing: "post" });
    expect(() => new FixedScheduler({ k: 0 })).toThrow(/fixed scheduler options: k/);
  });
});

describe("createScheduler", () => {
  it("builds either kind from a spec and rejects unknown kinds", () => {
    expect(createScheduler({ kind: "fixed", k: 8, timing: "post" }).initial()).toEqual({ k: 8, timing: "post" });
    const f = createScheduler({ kind: "feedback", options: { kMin: 48 } });
    expect(f).toBeInstanceOf(FeedbackScheduler);
    expect(f.initial()).toEqual({ k: 48, timing: "post" });
    expect(() => createScheduler({ kind: "magic" } as never)).toThrow(/scheduler options: kind/);
    expect(SchedulerSpecSchema.safeParse({ kind: "feedback", options: { kMin: -1 } }).success).toBe(false);
  });
});
