// The window has one pair of flags, --gpu-kv-budget and --sink-tokens, for full and hybrid
// attention alike; the old spellings are refused with the new name before any model is opened.
import { describe, expect, it } from "vitest";
import { DEFAULT_SINK_TOKENS } from "@hybridgen/core";
import { splitHybridArgs, windowLoadOptions } from "../src/hybrid-options.js";
import { bufferedIo, runCli } from "../src/index.js";

describe("window flags", () => {
  it("--kv-window, --kv-sinks and --selection are one-line usage errors naming the flag that replaced them", async () => {
    for (const [extra, msg] of [
      [["--kv-window", "64"], "--kv-window is now --gpu-kv-budget"],
      [["--kv-sinks", "4"], "--kv-sinks is now --sink-tokens"],
      [["--selection=pre"], "--selection is now --timing"],
    ] as const) {
      const io = bufferedIo();
      const code = await runCli(["generate", "-p", "x", ...extra], io);
      expect(code).toBe(2);
      expect(io.out).toBe("");
      expect(io.err).toBe(`error: ${msg}\n`);
    }
  });

  it("--gpu-kv-budget and --sink-tokens size the window of full attention too, and accept auto", () => {
    const full = splitHybridArgs(["--gpu-kv-budget", "64", "--sink-tokens", "4"]).hybrid;
    expect(full).toMatchObject({ attention: "full", gpuKvBudget: 64, sinkTokens: 4 });
    expect(windowLoadOptions(full)).toEqual({ gpuKvBudget: 64, sinkTokens: 4 });
    expect(windowLoadOptions(splitHybridArgs([]).hybrid)).toEqual({});
    const auto = splitHybridArgs(["--attention", "hybrid", "--gpu-kv-budget=auto"]).hybrid;
    expect(windowLoadOptions(auto)).toEqual({ gpuKvBudget: "auto", sinkTokens: DEFAULT_SINK_TOKENS });
    expect(() => splitHybridArgs(["--sink-tokens", "4"])).toThrow("--sink-tokens needs --gpu-kv-budget");
  });
});
