import { availableParallelism } from "node:os";
import { describe, expect, it } from "vitest";
import { defaultStageThreads, resolveHybrid } from "../src/index.js";

describe("defaultStageThreads", () => {
  it("leaves three cores beside a device and takes one thread on a host backend", () => {
    expect(defaultStageThreads(true, 16)).toBe(13);
    expect(defaultStageThreads(true, 2)).toBe(1);
    expect(defaultStageThreads(false, 16)).toBe(1);
  });

  it("is the runtime's default, and a given count wins", () => {
    expect(resolveHybrid({}, { device: true }).plan.cpuStageThreads).toBe(Math.max(1, availableParallelism() - 3));
    expect(resolveHybrid({}, { device: false }).plan.cpuStageThreads).toBe(1);
    expect(resolveHybrid({ cpuStageThreads: 5 }, { device: true }).plan.cpuStageThreads).toBe(5);
  });

  it("is the machine's cores less three beside a device (a batch's sequences share one stage of them); a given count is the stage's", () => {
    const threads = (cores: number, given?: number) => resolveHybrid(given === undefined ? {} : { cpuStageThreads: given }, { device: true, cores }).plan.cpuStageThreads;
    expect([threads(16), threads(4), threads(2)]).toEqual([13, 1, 1]);
    expect(threads(16, 4)).toBe(4);
    expect(resolveHybrid({}, { device: false, cores: 16 }).plan.cpuStageThreads).toBe(1);
  });
});
