/**
 * `hybridgen plan --gpu-kv-budget least`: the scale runs' window — the smallest the host tiers leave
 * (the page index on the device) — so the plan predicts the rows scale-run measures at --window least.
 */
import { describe, expect, it } from "vitest";
import { requireBuiltBin, runBin } from "./helpers.js";

const ARGS = ["plan", "--model", "preset:llama-3.1-8b", "--context", "30000", "--gpu-free", "22G", "--gpu-bandwidth", "3000", "--link-bandwidth", "55",
  "--device", "cpu", "--k", "256", "--selector", "index", "--index", '{"form":"int4","placement":"device"}', "--host-kv-budget", "1G", "--no-probe", "--json"];

function plan(budget: string) {
  const r = runBin([...ARGS, "--gpu-kv-budget", budget]);
  return { code: r.code, stderr: r.stderr, p: r.stdout ? JSON.parse(r.stdout) : null };
}

describe("hybridgen plan --gpu-kv-budget least", () => {
  it("takes the smallest window whose store fits the host budget: one token less does not fit; auto keeps the whole context on the GPU", () => {
    requireBuiltBin();
    const auto = plan("auto"), least = plan("least");
    expect(auto.code, auto.stderr).toBe(0);
    expect(least.code, least.stderr).toBe(0);
    expect(auto.p.gpu.windowTokens).toBe(30000);
    expect(auto.p.offloadedTokens).toBe(0);
    const w = least.p.gpu.windowTokens;
    expect(w).toBeLessThan(30000);
    expect(least.p.offloadedTokens).toBe(30000 - w);
    expect(least.p.fits).toBe(true);
    const host = least.p.tiers.reduce((n: number, t: { kBytes: number; vBytes: number }) => n + t.kBytes + t.vBytes, 0);
    expect(host).toBeLessThanOrEqual(2 ** 30);
    // 128 KiB a token at the 8B shape (bf16 K and V of 32 layers × 8 KV heads × 128): the budget holds 8 192.
    expect(least.p.offloadedTokens).toBe(8192);
    const at = plan(String(w)), below = plan(String(w - 1));
    expect(at.code, at.stderr).toBe(0);
    expect(at.p.gpu.windowTokens).toBe(w);
    expect(below.code).toBe(2);
    expect(below.stderr).toMatch(/^error: context 30000 × batch 1 needs .+ short by /);
  });

  it("a budget that is not auto, least or a token count is one line", () => {
    requireBuiltBin();
    const r = runBin([...ARGS, "--gpu-kv-budget", "lest"]);
    expect(r.code).not.toBe(0);
    expect(r.stderr.trim()).toBe('error: invalid value for --gpu-kv-budget: must be auto, least or a positive token count (got "lest")');
  });
});
