import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { DEFAULT_PROFILE_TEXT, writeHybridProfile } from "@hybridgen/runtime";
import { resolveHybrid } from "@hybridgen/runtime";
import { loadHybridSelector, runtimeOptions, splitHybridArgs } from "../src/hybrid-options.js";
import { requireBuiltBin, runBin } from "./helpers.js";
import { PROMPT, stories15M } from "./model-fixture.js";

const HY = ["--attention", "hybrid", "--gpu-kv-budget", "32"];

describe("--scheduler, --k-min and friends", () => {
  it("are taken out of argv and validated", () => {
    const { rest, hybrid } = splitHybridArgs(["-n", "4", ...HY, "--scheduler", "feedback", "--k-min", "8", "--k", "16", "--exact-layers", "0,2", "--candidates", "2", "--logits", "verified"]);
    expect(rest).toEqual(["-n", "4"]);
    expect(hybrid).toMatchObject({ scheduler: "feedback", kMin: 8, k: 16, exactLayers: [0, 2], candidates: 2, logits: "verified" });
    expect(splitHybridArgs([...HY, "--exact-layers", "none"]).hybrid.exactLayers).toEqual([]);
    // Nothing given: the runtime takes the defaults (backend, profile), not the flag parser.
    const bare = splitHybridArgs(HY).hybrid;
    for (const key of ["scheduler", "k", "kMin", "timing", "logits", "exactLayers"] as const) expect(bare[key]).toBeUndefined();
  });

  it("bad values are one-line errors naming the flag", () => {
    const bad: [string[], string | RegExp][] = [
      [["--k-min", "0"], "invalid value for --k-min: must be at least 1"],
      [["--scheduler", "nope"], "invalid value for --scheduler: must be fixed or feedback"],
      [["--selector", "quest", "--timing", "post"], 'selector "quest" cannot run post-QKᵀ selection (it supports pre)'],
      [["--selector", "topk", "--timing", "pre"], 'selector "topk" cannot run pre-QKᵀ selection (it supports post)'],
      [["--scheduler", "fixed", "--k-min", "8"], "--k-min sets the feedback scheduler's floor; --scheduler fixed uses --k"],
      [["--k", "4", "--k-min", "8"], "--k (the feedback scheduler's first K) must be at least --k-min"],
      [["--exact-layers", "1,x"], 'invalid value for --exact-layers: "1,x" is not a comma-separated list of layers or "none"'],
      [["--candidates", "0"], "invalid value for --candidates: must be at least 1"],
      [["--keep", "0"], "invalid value for --keep: must be at least 1"],
      [["--candidates", "2", "--keep", "3"], "keep 3 needs verified logits and at most the candidates (2); logits are verified"],
      [["--logits", "exact", "--keep", "1"], "keep 1 needs verified logits and at most the candidates (4); logits are exact"],
      [["--selector-options", "{"], 'invalid value for --selector-options: "{" is not JSON'],
      [["--selector-options", "[1]"], 'invalid value for --selector-options: "[1]" is not a JSON object'],
      [["--selector", "quest", "--selector-options", '{"pagesize":8}'], 'selector "quest" options: unknown key "pagesize" (it takes pageSize)'],
      [["--scoring", "int3"], "invalid value for --scoring: must be full, int8 or int4"],
      [["--rescore-factor", "0"], "invalid value for --rescore-factor: must be at least 1"],
      [["--row-path", "pinned"], "invalid value for --row-path: must be auto, mapped or staged"],
      [["--mass-target", "0"], "invalid value for --mass-target: must be above 0"],
      [["--mass-target", "1.5"], "invalid value for --mass-target: must be at most 1"],
      [["--mass-target", "most"], 'invalid value for --mass-target: "most" is not a number'],
    ];
    for (const [flags, message] of bad) expect(() => splitHybridArgs([...HY, ...flags]), flags.join(" ")).toThrow(message);
    expect(() => splitHybridArgs(["--scheduler", "feedback"])).toThrow("--selector, --selector-options, --scheduler, --k, --k-min, --timing, --logits, --exact-layers, --candidates, --keep, --cpu-stage-threads, --scoring, --rescore-factor, --row-path and --mass-target need --attention hybrid");
    expect(() => splitHybridArgs(["--row-path", "staged"])).toThrow(/--mass-target need --attention hybrid$/);
    expect(runtimeOptions(splitHybridArgs([...HY, "--mass-target", "0.8"]).hybrid, null)).toMatchObject({ massTarget: 0.8 });
    expect(runtimeOptions(splitHybridArgs([...HY, "--scoring", "int8", "--rescore-factor", "2"]).hybrid, null)).toMatchObject({ scoring: "int8", rescoreFactor: 2 });
    // --row-path reaches the runtime as rowPath and the engine's HybridOptions; absent, the runtime's default.
    for (const rowPath of ["auto", "mapped", "staged"] as const) {
      const o = runtimeOptions(splitHybridArgs([...HY, `--row-path=${rowPath}`]).hybrid, null);
      expect(o.rowPath).toBe(rowPath);
      expect(resolveHybrid(o, { device: true }).hybridOptions.rowPath).toBe(rowPath);
    }
    expect(runtimeOptions(splitHybridArgs(HY).hybrid, null).rowPath).toBeUndefined();
    // --keep reaches the engine's HybridOptions and the plan; absent, every candidate is kept.
    const kept = resolveHybrid(runtimeOptions(splitHybridArgs([...HY, "--candidates", "2", "--keep", "1"]).hybrid, null), { device: true });
    expect([kept.hybridOptions.keep, kept.plan.keep]).toEqual([1, 1]);
    expect(resolveHybrid(runtimeOptions(splitHybridArgs(HY).hybrid, null), { device: true }).hybridOptions.keep).toBeUndefined();
  });

  it("a name that is neither registered nor an installed package fails when loaded, before any model", async () => {
    const { hybrid } = splitHybridArgs([...HY, "--selector", "topk+nope"]);
    await expect(loadHybridSelector(hybrid, process.cwd())).rejects.toThrow(/^unknown selector "nope": not a registered name \(topk, .*\) and no package "nope" installed from /);
  });
});

describe("hybridgen generate --scheduler (stories15M)", () => {
  let cache: string;
  let dir: string;
  beforeAll(async () => {
    requireBuiltBin();
    dir = await stories15M();
    cache = mkdtempSync(join(tmpdir(), "hybridgen-sched-test-"));
  });
  afterAll(() => rmSync(cache, { recursive: true, force: true }));

  const json = (args: string[], env: Record<string, string> = {}) => {
    const r = runBin(["generate", "--model", dir, "-p", PROMPT, "-t", "0", "--threads", "1", "--json", ...args], { env: { HYBRIDGEN_CACHE: cache, ...env } });
    expect(r.code, r.stderr).toBe(0);
    return { out: JSON.parse(r.stdout), stderr: r.stderr };
  };

  it("--scheduler feedback --k-min 8 --json includes the per-step trace; the stats line summarises it", () => {
    const { out, stderr } = json([...HY, "--scheduler", "feedback", "--k-min", "8"]);
    const s = out.scheduler;
    expect(s).toMatchObject({ name: "feedback", kMin: 8, kSource: "option", selector: "topk+quest", droppedSteps: 0 });
    expect(s.steps.length).toBeGreaterThan(50);
    s.steps.forEach((r: Record<string, unknown>, i: number) => {
      expect(r.step).toBe(i);
      expect(r.k as number).toBeGreaterThanOrEqual(8);
      expect(["post", "pre"]).toContain(r.timing);
      for (const key of ["tGpuMs", "tCpuMs", "tTxMs", "wallMs"]) expect(r[key] as number).toBeGreaterThanOrEqual(0);
      expect(r.offloaded as number).toBeGreaterThan(0);
    });
    expect(s.steps[0].k).toBe(8); // Algorithm 1 starts at kMin, post
    expect(s.steps[0].timing).toBe("post");
    expect(s.finalK).toBe(s.steps[s.steps.length - 1].k);
    expect(stderr).toContain("hybrid: selector topk+quest, feedback scheduler (K from 8 post, kMin 8 from the flags)");
    expect(stderr).toMatch(/; scheduler: K 8 → \d+ \(range 8–\d+\), (post|pre), \d+ timing switch(es)?\n/);
  });

  it("--keep runs on the CPU backend: keeping every candidate changes nothing, keeping fewer still decodes", () => {
    const verified = ["--attention", "hybrid", "--gpu-kv-budget", "12", "--k", "4", "-n", "40", "--logits", "verified", "--candidates", "2"];
    const all = json(verified).out, same = json([...verified, "--keep", "2"]).out, fewer = json([...verified, "--keep", "1"]).out;
    expect([all.scheduler.keep, same.scheduler.keep, fewer.scheduler.keep]).toEqual([null, 2, 1]);
    expect(fewer.scheduler.steps.at(-1).offloaded).toBeGreaterThan(8); // the verified layers had candidates to keep from
    expect(same.text).toBe(all.text);
    expect(fewer.tokens.length).toBe(all.tokens.length);
  });

  it("on the CPU backend the default is the fixed scheduler: --k and --timing every step", () => {
    const { out } = json([...HY, "--k", "16", "-n", "40"]);
    expect(out.scheduler).toMatchObject({ name: "fixed", kMin: null, selector: "topk", transport: "host" });
    expect(out.scheduler.steps.every((r: { k: number; timing: string }) => r.k === 16 && r.timing === "post")).toBe(true);
  });

  it("takes --k-min and the exact layers from the model's profile (hybridgen profile-kmin); flags override it", () => {
    writeHybridProfile(dir, {
      version: 1, model: dir, tolerance: 0.99, selector: "topk", kMin: 12,
      perSelector: { topk: { kMin: 12, agreement: [[4, 0.9, 0.2], [12, 1, 0.01]] } },
      exactLayers: [2], layerRecall: [1, 0.9, 0.5, 0.9, 0.9, 0.9], layerMassRecall: [1, 0.9, 0.5, 0.9, 0.9, 0.9], recallMetric: "tokens", candidates: 4,
      recallK: 8, recallThreshold: 0.8, gpuKvBudget: 32, sinkTokens: 0, steps: 16, createdAt: "2026-12-02T22:00:00.000Z",
    } as never, cache);
    const fromProfile = json([...HY, "--scheduler", "feedback", "-n", "40"]);
    expect(fromProfile.out.scheduler).toMatchObject({ kMin: 12, kSource: "profile", exactLayers: [2] });
    expect(fromProfile.out.scheduler.steps[0].k).toBe(12);
    expect(fromProfile.stderr).toContain("kMin 12 from the model's profile");
    const overridden = json([...HY, "--scheduler", "feedback", "--k-min", "5", "--exact-layers", "none", "-n", "40"]);
    expect(overridden.out.scheduler).toMatchObject({ kMin: 5, kSource: "option", exactLayers: [] });
  });

  it("with no K and no profile, K and the exact layers come from the prompt's prefill, cached for the next run", () => {
    const fresh = mkdtempSync(join(tmpdir(), "hybridgen-calib-test-"));
    try {
      const run = () => {
        const r = runBin(["generate", "--model", dir, "-p", DEFAULT_PROFILE_TEXT.slice(0, 700), "-n", "6", "-t", "0", "--threads", "1", "--json", ...HY], { env: { HYBRIDGEN_CACHE: fresh } });
        expect(r.code, r.stderr).toBe(0);
        return { out: JSON.parse(r.stdout), stderr: r.stderr };
      };
      const first = run();
      const c = first.out.scheduler.calibration;
      expect(first.out.scheduler).toMatchObject({ kSource: "calibration", exactLayers: c.exactLayers });
      expect(c.layerK).toHaveLength(6);
      expect(first.out.scheduler.steps[0].k).toBe(c.k);
      expect(first.stderr).toContain("fixed scheduler (K 64 post, the default), logits verified, exact layers none");
      expect(first.stderr).toContain("\ncalibration: the prompt's prefill chooses K and the exact layers (95% of the attention mass)\n");
      expect(first.stderr).toMatch(/; calibrated from the prefill \(\d+ samples a layer, \d+ offloaded\): K per layer [\d/]+ for 95% of the attention mass/);
      expect(readdirSync(join(fresh, "profiles")).filter((f) => f.endsWith(".calibration.json"))).toHaveLength(1);
      // The next run starts from the cached calibration.
      expect(run().stderr).toContain(`(K ${c.k} post, from a calibration)`);
    } finally {
      rmSync(fresh, { recursive: true, force: true });
    }
  });

  it("--exact-layers naming a layer the model lacks is a one-line error", () => {
    const r = runBin(["generate", "--model", dir, "-p", PROMPT, ...HY, "--exact-layers", "99"], { env: { HYBRIDGEN_CACHE: cache } });
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/^error: [^\n]*layer 99 does not exist \(the model has 6\)\n$/);
  });

  it("bad flags exit 2 with one line before the model loads", () => {
    for (const flags of [["--k-min", "0"], ["--scheduler", "nope"], ["--selector", "quest", "--timing", "post"], ["--scheduler", "fixed", "--k-min", "8"], ["--mass-target", "0"], ["--mass-target", "2"]]) {
      const r = runBin(["generate", "-p", PROMPT, ...HY, ...flags]);
      expect(r.code, flags.join(" ")).toBe(2);
      expect(r.stderr).toMatch(/^error: [^\n]+\n$/);
      expect(r.stdout).toBe("");
    }
  });

  it("--seed with the feedback scheduler says the text may differ; with fixed (the CPU's default) the same seed repeats the text", async () => {
    requireBuiltBin();
    const model = await stories15M();
    const args = ["generate", "--model", model, "-p", PROMPT, "-n", "24", "-t", "0.8", "--seed", "7", "--threads", "1", ...HY];
    const note = "note: --seed repeats the sampling, not the feedback scheduler's K";
    const feedback = runBin([...args, "--scheduler", "feedback", "--k-min", "8"]);
    expect(feedback.code, feedback.stderr).toBe(0);
    expect(feedback.stderr).toContain(note);
    const [a, b] = [runBin(args), runBin(args)];
    for (const r of [a, b]) {
      expect(r.code, r.stderr).toBe(0);
      expect(r.stderr).toContain("fixed scheduler");
      expect(r.stderr).not.toContain(note);
    }
    expect(b.stdout).toBe(a.stdout);
  });
});
