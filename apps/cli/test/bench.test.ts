/** `hybridgen bench` on the CPU backend with stories15M and short contexts (seconds). */
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { requireBuiltBin, runBin } from "./helpers.js";
import { stories15M } from "./model-fixture.js";

const dir = mkdtempSync(join(tmpdir(), "hybridgen-bench-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
beforeAll(async () => {
  requireBuiltBin();
  await stories15M();
});

const BASE = ["--device", "cpu", "--threads", "1", "--gpu-kv-budget", "48", "--sink-tokens", "4", "--k", "16", "--steps", "6", "--warmup", "1"];

describe("hybridgen bench", () => {
  it("every baseline and HybridGen variant over two contexts and two batch sizes: tables, bench.json, four SVG figures", () => {
    const out = join(dir, "run");
    const r = runBin(["bench", ...BASE, "--contexts", "96,160", "--batch", "1,2", "--out", out]);
    expect(r.stderr).not.toContain("error");
    expect(r.code).toBe(0);
    for (const fig of ["Fig. 15", "Fig. 16", "Fig. 17", "Fig. 21", "Speed-up of hybridgen over each baseline"]) expect(r.stdout).toContain(fig);
    expect(r.stderr).toMatch(/\[\d+\/44\] stories15M context 160 batch 1 hybridgen: [\d.]+ ms\/token/); // progress
    const report = JSON.parse(readFileSync(join(out, "bench.json"), "utf8"));
    const names = ["full", "flexgen", "moe-lightning", "h2o", "keyformer", "streamingllm", "infinigen", "hybridgen-post", "hybridgen-pre", "hybridgen-adaptive", "hybridgen"];
    expect(new Set(report.points.map((p: { config: string }) => p.config))).toEqual(new Set(names));
    // Every configuration at batch 2 too: each sequence with its own window and configuration.
    for (const p of report.points) {
      expect(p.status, `${p.config} ${p.context} ${p.batch}`).toBe("ok");
      expect(p.msPerToken).toBeGreaterThan(0);
      expect(p.tokensPerSec).toBeCloseTo((1000 * p.batch) / p.msPerToken, 6);
    }
    const hg2 = report.points.find((p: { config: string; batch: number; context: number }) => p.config === "hybridgen" && p.batch === 2 && p.context === 160);
    expect(hg2.offloaded).toBeGreaterThan(0);
    expect(hg2.stageMs.cpu).toBeGreaterThan(0);
    const hg = report.points.find((p: { config: string; batch: number; context: number }) => p.config === "hybridgen" && p.batch === 1 && p.context === 160);
    expect(hg.finalTiming).toMatch(/^(pre|post)$/);
    expect(hg.stageMs.gpu).toBeGreaterThan(0);
    expect(hg.stageMs.cpu).toBeGreaterThan(0);
    expect(report.setup).toMatchObject({ contexts: [96, 160], batches: [1, 2], gpuKvBudget: 48, k: 16, device: expect.stringMatching(/^cpu/) });
    for (const f of ["fig15-latency-per-model.svg", "fig16-latency-per-context.svg", "fig17-throughput-per-batch.svg", "fig21-scheduler-ablation.svg"]) {
      const svg = readFileSync(join(out, f), "utf8");
      expect(svg.startsWith("<svg"), f).toBe(true);
      expect(svg, f).toContain("hybridgen");
      expect((svg.match(/<path/g) ?? []).length, f).toBeGreaterThan(4);
    }
  });

  it("--json prints the report; a window holding the whole context skips the offloading configurations", () => {
    const r = runBin(["bench", ...BASE, "--contexts", "40", "--configs", "full,flexgen,hybridgen", "--json"]);
    expect(r.code).toBe(0);
    const report = JSON.parse(r.stdout);
    expect(report.points.map((p: { config: string; status: string }) => `${p.config}:${p.status}`)).toEqual(["full:ok", "flexgen:skipped", "hybridgen:skipped"]);
    expect(report.points[1].note).toMatch(/holds the whole context/);
  });

  it("bad input: one error line, exit 2, nothing written", () => {
    const cases: [string[], RegExp][] = [
      [["--configs", "full,flexgenn"], /unknown attention configuration "flexgenn"/],
      [["--configs", "hybrid:selector=topk,nope=1"], /unknown key "nope"/],
      [["--steps", "4", "--warmup", "4"], /--warmup 4 must be smaller than --steps 4/],
      [["--contexts", "251"], /--contexts 251 plus --steps 6 exceeds stories15M's max_position_embeddings \(256\)/],
      [["--contexts", "0"], /invalid value for --contexts/],
      [["--sink-tokens", "48"], /--sink-tokens 48 must be smaller than --gpu-kv-budget 48/],
    ];
    for (const [args, want] of cases) {
      const r = runBin(["bench", ...BASE, "--out", join(dir, "bad"), ...args]);
      expect(r.code, args.join(" ")).toBe(2);
      expect(r.stderr.trim().split("\n").at(-1)).toMatch(want);
      expect(r.stderr.trim().split("\n").filter((l) => l.startsWith("error:")).length).toBe(1);
    }
    expect(existsSync(join(dir, "bad"))).toBe(false);
  });
});
