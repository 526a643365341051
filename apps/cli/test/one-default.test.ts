// The CLI's K default is core's DEFAULT_K, the same the runtime and the schedulers use.
import { describe, expect, it } from "vitest";
import { DEFAULT_K } from "@hybridgen/core";
import { FixedScheduler } from "@hybridgen/scheduler";
import { resolveHybrid } from "@hybridgen/runtime";
import { HYBRID_HELP, runtimeOptions, splitHybridArgs } from "../src/hybrid-options.js";

describe("one K default from the flag to the scheduler", () => {
  it("--attention hybrid without --k runs DEFAULT_K, and the help says so", () => {
    const { hybrid } = splitHybridArgs(["--attention", "hybrid", "--gpu-kv-budget", "16"]);
    const { plan, scheduler } = resolveHybrid(runtimeOptions(hybrid, null), { device: false });
    expect(plan.k).toBe(DEFAULT_K);
    expect(scheduler.initial().k).toBe(new FixedScheduler().initial().k);
    expect(HYBRID_HELP).toContain(`else ${DEFAULT_K})`);
  });
});
