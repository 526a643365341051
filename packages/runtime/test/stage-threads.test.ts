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

  it("is shared by the sequences whose stages run at once, at least one thread each; a given count is each one's", () => {
    const threads = (sequences: number, given?: number) =>
      resolveHybrid(given === undefined ? {} : { cpuStageThreads: given }, { device: true, cores: 16, sequences }).plan.cpuStageThreads;
    expect([threads(1), threads(6), threads(13), threads(31)]).toEqual([13, 2, 1, 1]);
    expect(threads(6, 4)).toBe(4);
    expect(resolveHybrid({}, { device: false, cores: 16, sequences: 4 }).plan.cpuStageThreads).toBe(1);
  });
});
