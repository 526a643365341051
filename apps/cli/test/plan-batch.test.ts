/**
 * The planner's batched plan against the bytes a batch really takes, on the CPU backend (its
 * "device" memory counted under a cap): the batched step's B rows and one sequence's window and
 * score rows are exactly what reserveBatch and createSequence allocate; `hybridgen plan --batch`
 * prints the reserve's parts and the step's tokens/s.
 */
import { describe, expect, it } from "vitest";
import { loadModel, modelInfo, openModelDir } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import { planRun } from "@hybridgen/memtier";
import { requireBuiltBin, runBin } from "./helpers.js";
import { stories15M } from "./model-fixture.js";

describe("the planner's batched reserve against measured bytes (CPU backend)", () => {
  it("the batched step's rows and each sequence's window and score rows are what the model allocates", async () => {
    const dir = await stories15M();
    using files = openModelDir(dir);
    using backend = createCpuBackend({ threads: 1, memoryCapBytes: 2 ** 30 });
    const [B, C, W, block] = [4, 200, 32, 64];
    using model = loadModel(files, backend, { maxContext: C, gpuKvBudget: W, sinkTokens: 4, prefillBlock: block });
    const s = files.shape;
    const plan = planRun({
      model: { layers: s.layers, heads: s.heads, kvHeads: s.kvHeads, headDim: s.headDim, weightsBytes: 0, batchRowBytes: modelInfo(files.config, s).batchRowBytes },
      kvElementBytes: 4, contextTokens: C, batch: B, gpuKvBudget: W, appendTokens: block, k: 16,
      gpu: { freeBytes: 2 ** 30, reserveBytes: 0 }, tiers: [{ id: "node0", kind: "dram", numaNode: 0, capacityBytes: 2 ** 32 }],
    });
    const used = () => backend.memoryInUseBytes;
    let before = used();
    model.reserveBatch(B);
    expect(used() - before).toBe(plan.gpu!.batchRowsBytes);
    expect(plan.gpu!.batchRowsBytes).toBeGreaterThan(0);
    before = used();
    const seq = model.createSequence();
    expect(used() - before).toBe(plan.gpu!.perSequence.windowBytes + plan.gpu!.perSequence.scoresBytes);
    model.releaseSequence(seq);
    expect(used()).toBe(before);
    // A sequence made at a shorter context takes the window of its own length and score rows as wide.
    const short = model.sequenceBytes(40);
    expect(short.scores).toBe(s.heads * 40 * 4);
    expect(short.window).toBe(2 * s.layers * 40 * s.kvHeads * s.headDim * 4);
    before = used();
    const small = model.createSequence({ maxContext: 40 });
    expect(used() - before).toBe(short.window + short.scores);
    expect(small.cache.storeCapacity).toBe(short.storeCapacity);
    model.releaseSequence(small);
  });

  it("`hybridgen plan --batch N` prints the reserve's parts and the batched step in tokens/s", async () => {
    requireBuiltBin();
    const model = await stories15M();
    const args = ["plan", "--model", model, "--context", "200", "--batch", "4", "--gpu-kv-budget", "32", "--kv-dtype", "f32", "--gpu-free", "4G",
      "--gpu-bandwidth", "100", "--link-bandwidth", "10", "--device", "cpu", "--k", "16"];
    const text = runBin(args);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout).toMatch(/^reserve: {4}[\d.]+ [KMG]iB: the batched step's 4 rows [\d.]+ [KM]iB; each of the 4 sequences: score rows [\d.]+ KiB, prefill scratch [\d.]+ KiB, staging [\d.]+ KiB; its window with the ring [\d.]+ [KM]iB$/m);
    expect(text.stdout).toMatch(/^predicted: {2}[\d.]+ ms\/step \(a token of each of the 4 sequences: [\d.]+ tokens\/s\) = max\(GPU /m);
    const p = JSON.parse(runBin([...args, "--json"]).stdout);
    expect(p.gpu.batchRowsBytes).toBe(4 * modelInfo(openModelDir(model).config, openModelDir(model).shape).batchRowBytes);
    expect(p.predicted.tokensPerSecond).toBeCloseTo((4 * 1000) / p.predicted.msPerToken, 6);
  });

  it("`plan --batch N --selector S --logits L`: the step's bytes are the selector's — a top-K scan, Quest's bounds, none, the page index's — and its logits' rows up", async () => {
    requireBuiltBin();
    const model = await stories15M();
    const args = ["plan", "--model", model, "--context", "200", "--batch", "4", "--gpu-kv-budget", "32", "--kv-dtype", "f32", "--gpu-free", "4G",
      "--gpu-bandwidth", "100", "--link-bandwidth", "10", "--device", "cpu", "--k", "16", "--no-probe"];
    const plan = (extra: string[]) => {
      const r = runBin([...args, ...extra, "--json"]);
      expect(r.code, r.stderr).toBe(0);
      return JSON.parse(r.stdout);
    };
    const host = (p: { predicted: { bytes: { tiers: Record<string, number> } } }) => Object.values(p.predicted.bytes.tiers).reduce((a, b) => a + b, 0);
    const scan = plan([]), quest = plan(["--selector", "quest"]), streaming = plan(["--selector", "streaming", "--logits", "exact"]), index = plan(["--selector", "index"]);
    // 6 layers × 4 sequences × 6 KV heads of K = 16 rows (exact logits: V rows alone go up; f32 rows of 48).
    const rows = 6 * 4 * 6 * 16, row = 48 * 4, off = 200 - 32;
    expect(streaming.predicted.bytes.link).toBe(rows * row);
    expect(host(streaming)).toBe(2 * rows * row);
    // Verified (the default, 4 candidates): layer 0 sends K rows of V, the 5 after it 4·K rows of K and V.
    const verified = 4 * 6 * (16 + 5 * 4 * 16) * row;
    expect(scan.predicted.bytes.link).toBe(verified + 4 * 6 * 5 * 4 * 16 * row);
    expect(host(scan) - verified).toBeGreaterThanOrEqual(6 * 4 * 6 * off * row); // every offloaded K of every sequence
    expect(host(quest) - 2 * verified).toBeCloseTo((host(scan) - verified) / 8, 0); // two K rows a page of 16
    expect(index.index).not.toBeNull();
    expect(host(index) - (index.index.placement === "host" ? index.index.bytes : 0)).toBe(2 * verified);
    expect(plan(["--selector", "streaming", "--logits", "verified", "--candidates", "2"]).predicted.bytes.link).toBe(4 * 6 * (16 + 5 * 2 * 16) * row + 4 * 6 * 5 * 2 * 16 * row);
    // --keep 1 of 2: the 5 verified layers' K rows of both candidates, V rows of the kept K alone.
    expect(plan(["--selector", "streaming", "--logits", "verified", "--candidates", "2", "--keep", "1"]).predicted.bytes.link).toBe(4 * 6 * (16 + 5 * 16) * row + 4 * 6 * 5 * 2 * 16 * row);
    const text = runBin([...args, "--selector", "streaming", "--logits", "exact"]);
    expect(text.stdout).toMatch(/^select: {5}streaming reads no K to choose, then the chosen rows; logits exact \(K rows of V go up\)$/m);
    for (const [extra, want] of [
      [["--selector", "nope"], /^error: invalid value for --selector: "nope" is not a registered selector \(/],
      [["--selector", "quest", "--index", "{}"], /^error: --index goes with --selector index \(got --selector quest\)$/],
      [["--logits", "maybe"], /^error: invalid value for --logits: /],
      [["--candidates", "0"], /^error: invalid value for --candidates: /],
      [["--candidates", "2", "--keep", "3"], /^error: keep 3 needs verified logits and at most the candidates \(2\); logits are verified$/],
      [["--logits", "exact", "--keep", "1"], /^error: keep 1 needs verified logits and at most the candidates \(4\); logits are exact$/],
    ] as const) {
      const r = runBin([...args, ...extra]);
      expect(r.code, extra.join(" ")).not.toBe(0);
      expect(r.stderr.trim(), extra.join(" ")).toMatch(want);
    }
  });
});
