/** `hybridgen bench --workload NxC --gpu-mem SIZE` on the CPU backend, whose "device" memory the cap bounds (stories15M, short contexts). */
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { largestFeasible, workloadSpeed } from "../src/commands/workload-measure.js";
import { parseWorkload } from "../src/commands/workload-args.js";
import { requireBuiltBin, runBin } from "./helpers.js";
import { stories15M } from "./model-fixture.js";

const dir = mkdtempSync(join(tmpdir(), "hybridgen-workload-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
beforeAll(async () => {
  requireBuiltBin();
  await stories15M();
});

const BASE = ["bench", "--device", "cpu", "--threads", "1", "--k", "16", "--steps", "5", "--warmup", "1"];

describe("workload planning (pure)", () => {
  it("largestFeasible finds the largest batch that fits, 0 when none does, trying few sizes (two with a right guess)", () => {
    for (const [max, limit] of [[8, 3], [8, 8], [8, 0], [1, 1], [32, 17]] as const) {
      const tried: number[] = [];
      expect(largestFeasible(max, (b) => (tried.push(b), b <= limit))).toBe(Math.min(max, limit));
      expect(tried.length).toBeLessThanOrEqual(Math.ceil(Math.log2(max + 1)));
    }
    // A guess: right, two tries (it and the one above; one at the top); too high or too low, the search still ends at the limit.
    for (const [max, limit, guess, tries] of [[8, 3, 3, 2], [8, 8, 8, 1], [8, 3, 5, 4], [8, 6, 2, 4], [8, 0, 1, 1], [32, 17, 40, 6]] as const) {
      const tried: number[] = [];
      expect(largestFeasible(max, (b) => (tried.push(b), b <= limit), guess), `max ${max} limit ${limit} guess ${guess}`).toBe(Math.min(max, limit));
      expect(tried.length, `max ${max} limit ${limit} guess ${guess}: ${tried.join(",")}`).toBeLessThanOrEqual(tries);
    }
  });

  it("workloadSpeed: the workload's tokens over the summed step times; every sequence of a wave a sample of its steps", () => {
    // Waves of 3 and 1 sequences: 3·2 + 1·2 = 8 tokens in 10 + 20 + 5 + 5 = 40 ms.
    const s = workloadSpeed([{ sequences: 3, walls: [10, 20] }, { sequences: 1, walls: [5, 5] }]);
    expect(s.tokensPerSec).toBeCloseTo(200, 9);
    expect(s.p50Ms).toBe(10); // samples 5 5 10 10 10 20 20 20
    expect(s.p99Ms).toBe(20);
  });

  it("parseWorkload takes NxC and refuses what no run can hold", () => {
    expect(parseWorkload("8x131072")).toEqual({ sequences: 8, context: 131072 });
    expect(() => parseWorkload("0x1024")).toThrow(/"0x1024" has 0 sequences/);
    expect(() => parseWorkload("64x1024")).toThrow(/64 sequences; one batched step holds at most 32/);
    expect(() => parseWorkload("8*1024")).toThrow(/is not NxC/);
  });
});

describe("hybridgen bench --workload", () => {
  it("under a cap full attention runs the largest batch that fits in waves; the offloading configurations run all N at once; workload.json and the figure", () => {
    const out = join(dir, "run");
    const r = runBin([...BASE, "--workload", "4x200", "--gpu-mem", "64M", "--configs", "full,hybridgen,hybridgen-index,streamingllm", "--out", out]);
    expect(r.stderr).not.toContain("error");
    expect(r.code).toBe(0);
    expect(r.stdout).toContain("### Workload 4 × 200 tokens, stories15M, device memory 64.0 MiB");
    const rep = JSON.parse(readFileSync(join(out, "workload.json"), "utf8"));
    expect(existsSync(join(out, "workload-throughput.svg"))).toBe(true);
    const row = (c: string) => rep.result.rows.find((x: { config: string }) => x.config === c);
    const full = row("full");
    // 4 sequences of 208 positions do not all fit beside the 58 MiB model under 64 MiB: waves.
    expect(full.status).toBe("ok");
    expect(full.batch).toBeGreaterThanOrEqual(1);
    expect(full.batch).toBeLessThan(4);
    expect(full.waves).toBe(Math.ceil(4 / full.batch));
    expect(r.stderr).toContain(`full attention: ${full.batch} of 4 sequences fit at once`);
    for (const c of ["hybridgen", "hybridgen-index", "streamingllm"]) {
      const x = row(c);
      expect(x.status, `${c}: ${x.note}`).toBe("ok");
      expect([x.batch, x.waves]).toEqual([4, 1]);
      expect(x.window).toBeGreaterThan(4);
      expect(x.window).toBeLessThanOrEqual(rep.result.plan.windowTokens);
      expect(x.p99Ms).toBeGreaterThanOrEqual(x.p50Ms);
      expect(x.tokensPerSec).toBeGreaterThan(0);
    }
    expect(row("hybridgen").predictedMsPerStep).toBeGreaterThan(0); // the planner's batched step beside the measured one
    expect(rep.result.plan.windowTokens).toBeLessThan(208);
    // Bytes a step reads by where, and their floor: full attention's device bytes are the model and its batch's whole KV.
    expect(full.bytesPerStep.gpu).toBe(rep.result.residentBytes + full.batch * 205 * rep.result.kvBytesPerToken);
    expect(full.bytesPerStep.link).toBe(0);
    expect(full.floorMsPerStep).toBeGreaterThan(0);
    const h = row("hybridgen");
    expect(h.bytesPerStep.gpu).toBe(rep.result.residentBytes + 4 * h.window * rep.result.kvBytesPerToken);
    expect(Object.values(h.bytesPerStep.tiers as Record<string, number>).reduce((a, b) => a + b, 0)).toBeGreaterThan(0); // the stage's K and V rows
    expect(h.floorMsPerStep).toBe(h.predictedMsPerStep);
    // A hybrid window is the least the host leaves (here the append block: the host holds every sequence): it reads less than full attention's batch.
    for (const x of [h, row("hybridgen-index")]) expect(x.bytesPerStep.gpu).toBeLessThan(full.bytesPerStep.gpu);
    expect(h.window).toBeLessThanOrEqual(16);
    expect(r.stdout).toContain("| floor ms/step | × floor |");
    // Each selector's own bytes: StreamingLLM reads no K to choose, then its K chosen rows' K and V (6 layers × 6 KV heads × 4
    // sequences, exact logits: V alone goes up); the page index (on the stage here) its index and the chosen rows' K and V, no K scan.
    const rowBytes = rep.result.kvBytesPerToken / (2 * 6 * 6), tiers = (x: { bytesPerStep: { tiers: Record<string, number> } }) => Object.values(x.bytesPerStep.tiers).reduce((a, b) => a + b, 0);
    const s = row("streamingllm"), sRows = 6 * Math.min(205 - s.window, 16) * 6 * 4;
    expect(s.bytesPerStep.link).toBe(sRows * rowBytes);
    expect(tiers(s)).toBe(2 * sRows * rowBytes);
    const ix = row("hybridgen-index"), ixOff = 205 - ix.window, ixRows = (Math.min(ixOff, 16) + 5 * Math.min(ixOff, 64)) * 6 * 4;
    expect(tiers(ix)).toBeGreaterThan(2 * ixRows * rowBytes); // + the host index's pages
    expect(tiers(ix)).toBeLessThan(2 * ixRows * rowBytes + 4 * ixOff * 6 * 6 * rowBytes); // far below the offloaded K a scan reads
  });

  it("--synthetic-kv: no prefill, each context's KV random rows; full attention in waves, hybrid offloading the rest", () => {
    const r = runBin([...BASE, "--workload", "6x200", "--gpu-mem", "64M", "--configs", "full,hybridgen", "--synthetic-kv", "--json"]);
    expect(r.stderr).not.toContain("error");
    expect(r.code).toBe(0);
    const rep = JSON.parse(r.stdout);
    expect(rep.setup.fill).toBe("synthetic KV: seeded random rows (seed 1 + slot), no prefill");
    const [full, h] = rep.result.rows;
    expect(full).toMatchObject({ config: "full", status: "ok" });
    expect(full.batch).toBeLessThan(6);
    expect(full.waves).toBe(Math.ceil(6 / full.batch));
    expect(h).toMatchObject({ config: "hybridgen", status: "ok", batch: 6, waves: 1 });
    const filled = /hybridgen: 6 sequences filled with synthetic KV, window (\d+) tokens each \(planned \d+\), (\d+) offloaded/.exec(r.stderr);
    expect(filled, r.stderr).not.toBeNull();
    expect(Number(filled![2])).toBeGreaterThanOrEqual(200 - Number(filled![1])); // the window evicts in blocks: it may hold fewer
  });

  it("--full-batch: full attention's batch taken as given (no search), the same waves as the search's", () => {
    const run = (extra: string[]) => {
      const r = runBin([...BASE, "--workload", "6x200", "--gpu-mem", "64M", "--configs", "full", "--synthetic-kv", "--json", ...extra]);
      expect(r.stderr).not.toContain("error");
      expect(r.code).toBe(0);
      return { row: JSON.parse(r.stdout).result.rows[0], stderr: r.stderr };
    };
    const searched = run([]), given = run(["--full-batch", String(searched.row.batch)]);
    expect(given.stderr).toContain(`full attention: batches of ${searched.row.batch} of 6 sequences (--full-batch, not searched)`);
    expect(given.stderr).not.toContain("sequences fit at once");
    expect(given.row).toMatchObject({ config: "full", status: "ok", batch: searched.row.batch, waves: searched.row.waves });
    expect(run(["--full-batch", "1"]).row).toMatchObject({ batch: 1, waves: 6 });
  });

  it("--issue-ms and --stage-ms: the planner's step has the host's per-row costs; the window is the least the host leaves either way", () => {
    const run = (extra: string[]) => {
      const r = runBin([...BASE, "--workload", "6x200", "--gpu-mem", "64M", "--configs", "full,hybridgen", "--synthetic-kv", "--json", ...extra]);
      expect(r.stderr).not.toContain("error");
      expect(r.code).toBe(0);
      return JSON.parse(r.stdout).result.rows[1];
    };
    const plain = run([]), costed = run(["--issue-ms", "0.5", "--stage-ms", "0.25"]);
    expect(costed.window).toBe(plain.window);
    // 6 layers × 6 rows × 0.5 ms of issuing at the least.
    expect(costed.predictedMsPerStep).toBeGreaterThanOrEqual(6 * 6 * 0.5);
    // The device gathering the rows itself at a slow rate: they are inside the device's part, so the step is no shorter.
    const gathered = run(["--issue-ms", "0.5", "--stage-ms", "0.25", "--gather-gbs", "0.001"]);
    expect(gathered.predictedMsPerStep).toBeGreaterThan(costed.predictedMsPerStep);
  });

  it("without a cap that forces it, full attention runs every sequence in one wave and nothing is offloaded", () => {
    const r = runBin([...BASE, "--workload", "2x100", "--gpu-mem", "200M", "--configs", "full,hybridgen", "--json"]);
    expect(r.code).toBe(0);
    const rep = JSON.parse(r.stdout);
    expect(rep.result.rows[0]).toMatchObject({ config: "full", status: "ok", batch: 2, waves: 1 });
    expect(rep.result.rows[1]).toMatchObject({ config: "hybridgen", status: "skipped" });
  });

  it("bad values are one-line errors naming the numbers", () => {
    const cases: [string[], RegExp][] = [
      [["--workload", "0x1024"], /^error: invalid value for --workload: "0x1024" has 0 sequences \(at least 1\)$/],
      [["--workload", "4x200", "--gpu-mem", "1M"], /^error: --gpu-mem 1048576 bytes \(1\.0 MiB\) is below stories15M's weights: \d+ bytes \(58\.0 MiB\)$/],
      [["--workload", "4x200", "--gpu-mem", "59M"], /^error: --workload 4x200 fits nowhere under --gpu-mem 61865984 bytes \(59\.0 MiB\): full attention: one sequence's KV \([\d.]+ MiB\) does not fit beside the model; offloading: .*59\.0 MiB/],
      [["--workload", "4x300"], /^error: --workload 4x300 plus --steps 5 exceeds stories15M's max_position_embeddings \(256\)$/],
      [["--workload", "4x200", "--batch", "2"], /^error: --workload sets the sequences and their context; --batch does not go with it$/],
      [["--synthetic-kv"], /^error: --synthetic-kv goes with --workload \(the figures' benches prefill their contexts\)$/],
      [["--issue-ms", "0.1"], /^error: --issue-ms goes with --workload \(the planner's batched step\)$/],
      [["--workload", "4x200", "--stage-ms=-1"], /^error: invalid value for --stage-ms: "-1" is not a number of ms in \[0, 1000\]$/],
      [["--full-batch", "2"], /^error: --full-batch goes with --workload \(full attention's waves\)$/],
      [["--gather-gbs", "27"], /^error: --gather-gbs goes with --workload \(the planner's batched step\)$/],
      [["--workload", "4x200", "--gather-gbs", "0"], /^error: invalid value for --gather-gbs: "0" is not a rate in GB\/s in \(0, 10000\]$/],
      [["--workload", "4x200", "--full-batch", "0"], /^error: invalid value for --full-batch: "0" is not an integer in \[1, ∞\]$/],
      [["--workload", "6x200", "--gpu-mem", "64M", "--synthetic-kv", "--configs", "full", "--full-batch", "6"], /^error: --full-batch 6: 6 sequences of 200 tokens do not fit under --gpu-mem 67108864 bytes \(64\.0 MiB\): /],
    ];
    for (const [args, want] of cases) {
      const r = runBin([...BASE, ...args]);
      expect(r.code, args.join(" ")).not.toBe(0);
      const lines = r.stderr.trim().split("\n").filter((l) => l.startsWith("error"));
      expect(lines).toHaveLength(1);
      expect(lines[0]).toMatch(want);
      expect(r.stderr).not.toMatch(/\n\s+at /); // no stack
    }
  });
});
