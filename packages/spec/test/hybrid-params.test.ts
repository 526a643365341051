import { describe, expect, it } from "vitest";
import { DEFAULT_K, GpuKvBudgetSchema, HybridgenError, KSchema, SinkTokensSchema, resolveGpuKvBudget } from "../src/index.js";

describe("hybrid knobs: one schema each", () => {
  it("K and sinks accept what they name and refuse the rest", () => {
    expect(KSchema.parse(DEFAULT_K)).toBe(DEFAULT_K);
    for (const bad of [0, -1, 1.5, NaN, "8"]) expect(KSchema.safeParse(bad).success, String(bad)).toBe(false);
    expect(SinkTokensSchema.parse(0)).toBe(0);
    for (const bad of [-1, 0.5]) expect(SinkTokensSchema.safeParse(bad).success).toBe(false);
  });

  it("the budget is a positive integer or auto; auto is the planner's fit, else the whole context", () => {
    expect(GpuKvBudgetSchema.parse("auto")).toBe("auto");
    expect(GpuKvBudgetSchema.safeParse(1.5).error?.issues[0]?.message).toBe('must be a positive integer or "auto"');
    expect(GpuKvBudgetSchema.safeParse(0).error?.issues[0]?.message).toBe("must be at least 1");
    expect(resolveGpuKvBudget(undefined, { maxContext: 256 })).toBe(256);
    expect(resolveGpuKvBudget(32, { maxContext: 256 })).toBe(32);
    expect(resolveGpuKvBudget(1000, { maxContext: 256 })).toBe(256);
    expect(resolveGpuKvBudget("auto", { maxContext: 256 })).toBe(256);
    expect(resolveGpuKvBudget("auto", { maxContext: 256, fitTokens: 100 })).toBe(100);
    expect(resolveGpuKvBudget("auto", { maxContext: 256, fitTokens: 1000 })).toBe(256);
    expect(() => resolveGpuKvBudget("big" as never, { maxContext: 256 })).toThrow(HybridgenError);
    expect(() => resolveGpuKvBudget("big" as never, { maxContext: 256 })).toThrow('gpuKvBudget: must be a positive integer or "auto", got "big"');
    expect(() => resolveGpuKvBudget("auto", { maxContext: 256, fitTokens: 0 })).toThrow(/fitTokens must be a positive integer, got 0/);
  });
});
