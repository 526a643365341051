import { beforeAll, describe, expect, it } from "vitest";
import { FULL_ATTENTION, splitHybridArgs } from "../src/hybrid-options.js";
import { requireBuiltBin, runBin } from "./helpers.js";
import { PROMPT, stories15M } from "./model-fixture.js";

describe("hybrid flags", () => {
  it("are taken out of argv and validated; the rest goes to the generate parser", () => {
    const { rest, hybrid } = splitHybridArgs(["-p", "hi", "--attention", "hybrid", "--gpu-kv-budget=32", "--k", "8", "--timing", "pre", "--logits", "exact", "-n", "4"]);
    expect(rest).toEqual(["-p", "hi", "-n", "4"]);
    expect(hybrid).toMatchObject({ attention: "hybrid", gpuKvBudget: 32, k: 8, timing: "pre", logits: "exact", sinkTokens: 0 });
    expect(splitHybridArgs(["-n", "3"]).hybrid).toEqual(FULL_ATTENTION);
  });

  it("bad values are one-line errors naming the flag", () => {
    expect(splitHybridArgs(["--attention", "hybrid"]).hybrid.gpuKvBudget).toBe("auto"); // the window the GPU holds
    expect(() => splitHybridArgs(["--attention", "hybrid", "--gpu-kv-budget", "0"])).toThrow("invalid value for --gpu-kv-budget: must be at least 1");
    expect(() => splitHybridArgs(["--attention", "hybrid", "--gpu-kv-budget", "8", "--sink-tokens", "8"])).toThrow(/--sink-tokens must be smaller/);
    expect(() => splitHybridArgs(["--attention", "hybrid", "--gpu-kv-budget", "8", "--k", "-3"])).toThrow(/--k: "-3" is not a non-negative integer/);
    expect(() => splitHybridArgs(["--attention", "hybrid", "--gpu-kv-budget", "8", "--logits", "fast"])).toThrow(/invalid value for --logits/);
    expect(() => splitHybridArgs(["--gpu-kv-budget", "8", "--k", "4"])).toThrow(/need --attention hybrid/);
    expect(() => splitHybridArgs(["--attention", "hybrid", "--gpu-kv-budget", "many"])).toThrow('invalid value for --gpu-kv-budget: "many" is not a positive integer or "auto"');
    expect(() => splitHybridArgs(["--k"])).toThrow("--k needs a value");
  });
});

describe("hybridgen generate --attention hybrid (stories15M)", () => {
  beforeAll(async () => {
    requireBuiltBin();
    await stories15M();
  });

  it('"all" + exact logits with a 32-token window prints full attention\'s greedy text over the whole 256-token context, then the stats line', () => {
    const base = ["generate", "-p", PROMPT, "-n", "251", "-t", "0", "--threads", "1"];
    const full = runBin(base);
    const hy = runBin([...base, "--attention", "hybrid", "--gpu-kv-budget", "32", "--selector", "all", "--logits", "exact"]);
    expect(full.code).toBe(0);
    expect(hy.code).toBe(0);
    expect(hy.stdout).toBe(full.stdout);
    expect(hy.stderr).toMatch(/hybrid: \d+ tokens offloaded, mean rows selected per KV head [\d.]+, per layer: CPU stage [\d.]+ ms, device stage [\d.]+ ms, \d+% of the CPU stage hidden/);
  });

  it("top-K speculative runs and says when K is clamped", () => {
    const r = runBin(["generate", "-p", PROMPT, "-n", "40", "-t", "0", "--threads", "1", "--attention", "hybrid", "--gpu-kv-budget", "16", "--sink-tokens", "4", "--k", "500"]);
    expect(r.code).toBe(0);
    expect(r.stderr).toMatch(/K 500 exceeds the offloaded tokens \(\d+ at step 0\): clamped to the offloaded count/);
  });
});
