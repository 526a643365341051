import { mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { modelInfo, openModelDir, type Backend } from "@hybridgen/core";
import { deviceIndexBytesPerToken, GPU_RESERVE_BYTES, resolveWindowBudget } from "../src/auto-budget.js";
import { diskFreeBytes, parseSize, preflightStore, splitKvTierArgs } from "../src/kv-tier-options.js";
import { ONE_THREAD_BACKEND, requireBuiltBin, runBin, runBinStreaming } from "./helpers.js";
import { PROMPT, stories15M } from "./model-fixture.js";

const dirs: string[] = [];
const tmp = () => {
  const d = mkdtempSync(join(tmpdir(), "hg-kvdisk-"));
  dirs.push(d);
  return d;
};
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe("KV tier flags", () => {
  it("are taken out of argv; sizes take K/M/G/T", () => {
    const dir = tmp();
    const r = splitKvTierArgs(["-p", "x", "--kv-placement", "interleave", `--kv-disk=${dir}`, "--host-kv-budget", "1.5G", "-n", "3"]);
    expect(r).toEqual({ rest: ["-p", "x", "-n", "3"], tier: { kvPlacement: "interleave", kvDisk: dir, hostKvBudget: 1.5 * 2 ** 30 }, given: true });
    expect(splitKvTierArgs(["-n", "3"])).toEqual({ rest: ["-n", "3"], tier: { kvPlacement: "semantic" }, given: false });
    // --kv-disk-read-depth is the runtime's (and NativeCpuStage's) readDepth, 0 included.
    for (const depth of [0, 16, 64]) expect(splitKvTierArgs(["--kv-disk", dir, "--kv-disk-read-depth", String(depth)]).tier.readDepth).toBe(depth);
    expect(splitKvTierArgs([`--kv-disk=${dir}`]).tier.readDepth).toBeUndefined();
    expect(parseSize("4096", "--x")).toBe(4096);
    expect(parseSize("8m", "--x")).toBe(8 * 2 ** 20);
  });

  it("bad values, a missing, non-directory or unwritable --kv-disk are one-line errors before anything runs", () => {
    expect(() => splitKvTierArgs(["--kv-placement", "fastest"])).toThrow(/^invalid value for --kv-placement: /);
    expect(() => splitKvTierArgs(["--host-kv-budget", "lots"])).toThrow('invalid value for --host-kv-budget: "lots" is not a size (bytes, or a number with K, M, G or T)');
    expect(() => splitKvTierArgs(["--kv-disk", "/nonexistent-hg"])).toThrow("--kv-disk /nonexistent-hg: no such directory");
    const d = tmp();
    expect(() => splitKvTierArgs(["--kv-disk", d, "--kv-disk-read-depth", "65"])).toThrow(/^invalid value for --kv-disk-read-depth: must be ≤ 64$/);
    expect(() => splitKvTierArgs(["--kv-disk", d, "--kv-disk-read-depth", "-1"])).toThrow(/^invalid value for --kv-disk-read-depth: "-1" is not a non-negative integer$/);
    expect(() => splitKvTierArgs(["--kv-disk", d, "--kv-disk-read-depth=1.5"])).toThrow(/^invalid value for --kv-disk-read-depth: "1.5" is not a non-negative integer$/);
    expect(() => splitKvTierArgs(["--kv-disk", d, "--kv-disk-read-depth"])).toThrow("--kv-disk-read-depth needs a value");
    expect(() => splitKvTierArgs(["--kv-disk-read-depth", "4"])).toThrow(/^--kv-disk-read-depth needs --kv-disk DIR \(it reads the disk tier's rows\)$/);
    const file = join(tmp(), "f");
    writeFileSync(file, "x");
    expect(() => splitKvTierArgs(["--kv-disk", file])).toThrow(`--kv-disk ${file}: not a directory`);
    expect(() => splitKvTierArgs(["--kv-disk", "/sys/devices"])).toThrow(/^--kv-disk \/sys\/devices: not writable \(E[A-Z]+: read-only file system or permissions\)$/);
  });
});

describe("the store's preflight (before any weight loads)", () => {
  const shape8b = { layers: 32, kvHeads: 8, headDim: 128 };
  it("a store larger than host memory is refused, naming --kv-disk; with a disk too small for the rest, naming its free space", async () => {
    const o = { maxContext: 400_000_000, window: 4096, sinks: 4 }; // 400M positions of f32 KV: ~95 TiB
    await expect(preflightStore(shape8b, o, { kvPlacement: "semantic" })).rejects.toThrow(/^the KV store needs [\d.]+ TiB, [\d.]+ TiB more than host memory holds \(add --kv-disk DIR\)$/);
    const dir = tmp();
    await expect(preflightStore(shape8b, o, { kvPlacement: "semantic", kvDisk: dir })).rejects.toThrow(
      new RegExp(`^the KV store needs [\\d.]+ TiB, [\\d.]+ TiB more than host memory and ${dir} \\([\\d.]+ [GT]iB free\\) hold$`),
    );
    await expect(preflightStore(shape8b, { maxContext: 8192, window: 4096, sinks: 4 }, { kvPlacement: "semantic", kvDisk: dir })).resolves.toBeUndefined();
    await expect(preflightStore(shape8b, { maxContext: 8192, window: 4096, sinks: 4 }, { kvPlacement: "semantic", hostKvBudget: 0 })).rejects.toThrow("--host-kv-budget needs --kv-disk DIR (where the rest of the store goes)");
  });

  it("a batch's stores each take a B-th of the disk: one that fits a sequence but not three is refused for the batch, naming its free space", async () => {
    const dir = tmp();
    const perPosition = 2 * shape8b.layers * shape8b.kvHeads * shape8b.headDim * 4; // K and V, f32
    // All of a sequence's store on disk (no host memory), half the directory's free space.
    const positions = Math.floor(diskFreeBytes(dir) / 2 / perPosition);
    const o = { maxContext: positions + 4096 - 16, window: 4096, sinks: 4 };
    const tier = { kvPlacement: "semantic" as const, kvDisk: dir, hostKvBudget: 0 };
    await expect(preflightStore(shape8b, o, tier, 1)).resolves.toBeUndefined();
    await expect(preflightStore(shape8b, o, tier, 3)).rejects.toThrow(
      new RegExp(`^the KV store of 3 sequences needs [\\d.]+ [GT]iB, [\\d.]+ [GT]iB more than host memory and ${dir} \\([\\d.]+ [GT]iB free\\) hold$`),
    );
  });
});

describe("hybridgen generate with the store placed (stories15M)", () => {
  beforeAll(async () => {
    requireBuiltBin();
    await stories15M();
  });
  const base = ["generate", "-p", PROMPT, "-n", "120", "-t", "0", "--threads", "1", "--attention", "hybrid", "--gpu-kv-budget", "32", "--selector", "all", "--logits", "exact"];

  it("a forced disk tier (no host budget: V in files, K spilled page by page; 512K: V in files, K's coldest pages; 2 MiB: V's last layers) prints the in-memory text, and leaves no file", () => {
    const mem = runBin(base);
    expect(mem.code).toBe(0);
    expect(mem.stderr).toMatch(/placement semantic: K node0 [\d.]+ [KM]iB, V node0 [\d.]+ [KM]iB; one NUMA node \(node0\)/);
    expect(mem.stderr).not.toMatch(/K spill/);
    const dir = tmp();
    const all = runBin([...base, "--kv-disk", dir, "--host-kv-budget", "0"]);
    expect(all.stderr).toMatch(/placement semantic: K disk [\d.]+ [KM]iB \(its coldest pages\), V disk [\d.]+ [KM]iB;/);
    expect(all.stderr).toMatch(/\nK spill: [1-9]\d* units of 4\.00 KiB \([\d.]+ [KM]iB\) moved to disk in [1-9]\d* passes, the least recently selected first\n$/);
    expect(all.code).toBe(0);
    expect(all.stdout).toBe(mem.stdout);
    const some = runBin([...base, "--kv-disk", dir, "--host-kv-budget", "512K"]);
    expect(some.stderr).toMatch(/placement semantic: K node0 512\.0 KiB \+ disk [\d.]+ [KM]iB \(its coldest pages\), V disk [\d.]+ [KM]iB;/);
    expect(some.stderr).toMatch(/\nK spill: [1-9]\d* units/);
    expect(some.stdout).toBe(mem.stdout);
    const split = runBin([...base, "--kv-disk", dir, "--host-kv-budget", "2M"]);
    expect(split.stderr).toMatch(/placement semantic: K node0 [\d.]+ [KM]iB, V node0 [\d.]+ [KM]iB \+ disk [\d.]+ [KM]iB;/);
    expect(split.stderr).not.toMatch(/K spill/);
    expect(split.stdout).toBe(mem.stdout);
    // --kv-disk-read-depth reaches the stage (the plan line says so): page faults (0) and one read in flight give the same text.
    for (const depth of ["0", "1"]) {
      const r = runBin([...base, "--kv-disk", dir, "--host-kv-budget", "0", "--kv-disk-read-depth", depth]);
      expect(r.stderr).toContain(`, ${depth} disk reads in flight a thread\n`);
      expect(r.stdout).toBe(mem.stdout);
    }
    expect(readdirSync(dir)).toEqual([]);
  });

  it("Ctrl-C during a disk-tier run exits 130 and removes the files", async () => {
    const dir = tmp();
    let sawFiles = -1;
    const r = await runBinStreaming([...base.map((a) => (a === "120" ? "250" : a)), "--kv-disk", dir, "--host-kv-budget", "0"], (out, child) => {
      if (sawFiles < 0 && out.length > PROMPT.length) {
        sawFiles = readdirSync(dir).length;
        child.kill("SIGINT");
      }
    });
    expect(sawFiles).toBe(6); // V of 6 layers; K's spill file is unlinked once open
    expect(r.code).toBe(130);
    expect(readdirSync(dir)).toEqual([]);
  });

  it("Ctrl-C during a batch's disk-tier run exits 130 and removes every sequence's files", async () => {
    const dir = tmp();
    const prompts = join(tmp(), "three.jsonl");
    writeFileSync(prompts, [{ prompt: PROMPT, max_tokens: 2 }, { prompt: "The little dog" }, { prompt: "Lily and Tom" }].map((p) => JSON.stringify(p)).join("\n"));
    let sawFiles = -1;
    // The first prompt's line comes out while the other two still decode.
    const r = await runBinStreaming([...batchBase(prompts).map((a) => (a === "120" ? "250" : a)), "--kv-disk", dir, "--host-kv-budget", "0"], (out, child) => {
      if (sawFiles < 0 && out.includes("\n")) {
        sawFiles = readdirSync(dir).length;
        child.kill("SIGINT");
      }
    });
    expect(sawFiles).toBe(18); // V of 6 layers for each of the 3 sequences
    expect(r.code).toBe(130);
    expect(readdirSync(dir)).toEqual([]);
  });

  it("the tier flags need --attention hybrid", () => {
    const r = runBin(["generate", "-p", PROMPT, "-n", "2", "--kv-placement", "local"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toBe("error: --kv-placement, --kv-disk and --host-kv-budget place hybrid attention's offloaded store: add --attention hybrid\n");
  });
});

/** generate --prompts FILE --batch 3 with base's hybrid flags. */
const batchBase = (prompts: string) =>
  ["generate", "--prompts", prompts, "--batch", "3", "-n", "120", "-t", "0", "--threads", "1", "--attention", "hybrid", "--gpu-kv-budget", "32", "--selector", "all", "--logits", "exact"];
const BATCH = [{ prompt: PROMPT, max_tokens: 100 }, { prompt: "The little dog" }, { prompt: "Lily and Tom went to the park. They", max_tokens: 60 }];

describe("hybridgen generate --batch 3 with each sequence's store placed (stories15M)", () => {
  let prompts = "", model = "";
  beforeAll(async () => {
    requireBuiltBin();
    model = await stories15M();
    const d = tmp();
    prompts = join(d, "three.jsonl");
    writeFileSync(prompts, `${BATCH.map((p) => JSON.stringify(p)).join("\n")}\n`);
  });
  const byIndex = (stdout: string) => stdout.trimEnd().split("\n").map((l) => JSON.parse(l)).sort((a, b) => a.index - b.index);

  it("V on disk and K spilled (no host budget; 512K split three ways) give the batch in host memory's tokens and each prompt's alone; the lines sum the sequences; no file is left", () => {
    const mem = runBin(batchBase(prompts));
    expect(mem.code).toBe(0);
    expect(mem.stderr).toMatch(/placement semantic for 3 sequences, each on 1\/3 of every tier: K node0 [\d.]+ [KM]iB, V node0 [\d.]+ [KM]iB; one NUMA node/);
    expect(mem.stderr).not.toMatch(/K spill/);
    const memLines = byIndex(mem.stdout);
    expect(memLines.map((l) => l.generatedTokens)).toEqual([100, 120, 60]);
    const dir = tmp();
    for (const budget of ["0", "512K"]) {
      const r = runBin([...batchBase(prompts), "--kv-disk", dir, "--host-kv-budget", budget]);
      expect(r.stderr).not.toMatch(/error/);
      expect(r.code).toBe(0);
      expect(r.stderr).toMatch(budget === "0"
        ? /placement semantic for 3 sequences, each on 1\/3 of every tier: K disk [\d.]+ MiB \(its coldest pages\), V disk [\d.]+ MiB;/
        : /placement semantic for 3 sequences, each on 1\/3 of every tier: K node0 [\d.]+ KiB \+ disk [\d.]+ MiB \(its coldest pages\), V disk [\d.]+ MiB;/);
      expect(r.stderr).toMatch(/\nK spill: [1-9]\d* units of 4\.00 KiB \([\d.]+ [KM]iB\) moved to disk in [1-9]\d* passes over 3 sequences, the least recently selected first\n$/);
      expect(byIndex(r.stdout).map((l) => l.tokens)).toEqual(memLines.map((l) => l.tokens));
      expect(readdirSync(dir)).toEqual([]);
    }
    BATCH.forEach((p, i) => {
      const one = runBin(["generate", "-p", p.prompt, "--json", "-n", String(p.max_tokens ?? 120), "-t", "0", "--threads", "1", "--attention", "hybrid", "--gpu-kv-budget", "32", "--selector", "all", "--logits", "exact"]);
      expect(one.code).toBe(0);
      expect(JSON.parse(one.stdout).tokens, `prompt ${i} alone`).toEqual(memLines[i].tokens);
    });
  });

  it("hybridgen plan --batch 3 places what generate places, to a page a region", () => {
    const dir = tmp();
    const r = runBin([...batchBase(prompts), "--kv-disk", dir, "--host-kv-budget", "1M"]);
    expect(r.code).toBe(0);
    const m = /placement semantic for 3 sequences, each on 1\/3 of every tier: K node0 ([\d.]+ [KM]iB) \+ disk ([\d.]+ [KM]iB) \(its coldest pages\), V disk ([\d.]+ [KM]iB);/.exec(r.stderr);
    expect(m, r.stderr).not.toBeNull();
    const [kHost, kDisk, vDisk] = m!.slice(1).map((t) => parseSize(t, "size"));
    // generate's store: the context past the window and one eviction block (256 − 32 + 16 positions).
    const p = JSON.parse(runBin(["plan", "--model", model, "--context", "272", "--batch", "3", "--device", "cpu", "--no-probe", "--gpu-kv-budget", "32", "--kv-dtype", "f32", "--kv-disk", dir, "--host-kv-budget", "1M", "--json"]).stdout);
    const node = p.tiers.find((t: { kind: string }) => t.kind !== "file"), disk = p.tiers.find((t: { kind: string }) => t.kind === "file");
    const page = 2 * 6 * 3 * 4096; // K and V regions of 6 layers, rounded up to a page for each of 3 sequences
    expect(Math.abs(kHost! - node.kBytes)).toBeLessThanOrEqual(page);
    expect(node.vBytes).toBe(0);
    expect(Math.abs(kDisk! - disk.kBytes)).toBeLessThanOrEqual(page);
    expect(Math.abs(vDisk! - disk.vBytes)).toBeLessThanOrEqual(page);
  });
});

describe("--gpu-kv-budget auto", () => {
  it("is the device arena's free bytes less weights, reserve and prefill scratch, over the KV bytes of a token; a number passes; no GPU is an error", async () => {
    using files = openModelDir(await stories15M());
    const { layers, kvHeads, headDim } = files.shape;
    const weights = Object.values(modelInfo(files.config, files.shape, files.weights).weightBytes).reduce((a, b) => a + (b ?? 0), 0);
    const perToken = 2 * layers * kvHeads * headDim * 4, scratch = 4 * 256 * kvHeads * headDim * 4;
    const gpu = (freeBytes: number) => ({ name: "fake-gpu", memory: () => ({ freeBytes }) }) as unknown as Backend;
    expect(await resolveWindowBudget("auto", gpu(weights + GPU_RESERVE_BYTES + scratch + 100 * perToken + 5), files, { maxContext: 256 })).toBe(100);
    expect(await resolveWindowBudget("auto", gpu(8 * 2 ** 30), files, { maxContext: 256 })).toBe(256); // capped at the context
    await expect(resolveWindowBudget("auto", gpu(weights), files, { maxContext: 256 })).rejects.toThrow(/^--gpu-kv-budget auto: no room for a window on fake-gpu/);
    expect(await resolveWindowBudget(48, { name: "cpu" } as Backend, files, { maxContext: 256 })).toBe(48);
    expect(await resolveWindowBudget("auto", { name: "cpu" } as Backend, files, { maxContext: 256 })).toBe(256); // full attention: all resident
    await expect(resolveWindowBudget("auto", { name: "cpu" } as Backend, files, { maxContext: 256, hybrid: true })).rejects.toThrow(
      "--gpu-kv-budget auto sizes the window from GPU memory, and cpu has none: give the window in tokens (--gpu-kv-budget N)",
    );
    // A page index ranked on the device: the whole context's index bytes come off the top, and each window token frees its own.
    const ipt = deviceIndexBytesPerToken("topk+index", { form: "int4", pageSize: 8 }, files.shape);
    expect(ipt).toBe((layers * kvHeads * (headDim + 4)) / 8);
    expect(deviceIndexBytesPerToken("index", { placement: "host" }, files.shape)).toBe(0);
    expect(deviceIndexBytesPerToken("topk+quest", {}, files.shape)).toBe(0);
    const free = weights + GPU_RESERVE_BYTES + scratch + Math.ceil(256 * ipt) + 100 * (perToken - ipt) + 5;
    expect(await resolveWindowBudget("auto", gpu(free), files, { maxContext: 256, indexBytesPerToken: ipt })).toBe(100);
  });
});

describe("hybridgen plan", () => {
  beforeAll(requireBuiltBin);

  it("Llama-3.1-8B at 1.5M tokens on a described 140 GiB GPU: weights, window, offloaded bytes and the predicted ms/token", () => {
    const r = runBin(["plan", "--model", "preset:llama-3.1-8b", "--context", "1500000", "--gpu-free", "140G", "--gpu-bandwidth", "4000", "--link-bandwidth", "50", "--k", "256", "--kv-disk", tmp(), "--json"]);
    const p = JSON.parse(r.stdout);
    expect(p.weights).toEqual({ where: "gpu", bytes: 16_060_522_496 });
    // Free less weights, the 2 GiB reserve, the prefill's scratch (two K/V pairs of one layer over the context) and the
    // hybrid step's staging (two slots of gathered V and K rows, 4·K = 1024 a KV head, and of f32 score rows as wide, one a query head)
    // and attention's f32 score rows over the context (one a query head), over 128 KiB a token, less the prefill block's 512 ring slots.
    const fit = Math.floor((140 * 2 ** 30 - 16_060_522_496 - 2 * 2 ** 30 - 4 * 1_500_000 * 8 * 128 * 2 - 4 * 1024 * 8 * 128 * 2 - 2 * 32 * 1024 * 4 - 32 * 1_500_000 * 4) / 131072) - 512;
    expect(p.gpu).toMatchObject({ freeBytes: 140 * 2 ** 30, windowTokens: fit, fitTokens: fit });
    expect(p.offloadedTokens).toBe(1_500_000 - fit);
    const placed = p.tiers.reduce((n: number, t: { kBytes: number; vBytes: number }) => n + t.kBytes + t.vBytes, 0);
    expect(placed).toBe(2 * 32 * Math.ceil((8 * p.offloadedTokens * 128 * 2) / 4096) * 4096);
    // The device reads the weights, each of the 32 layers' W_q once more (its job goes ahead on q̃: 4096 × 4096 bf16), and the window.
    expect(p.predicted.gpuMs).toBeCloseTo(((16_060_522_496 + 32 * 4096 * 4096 * 2 + fit * 131072) / 4000e9) * 1e3, 6);
    expect(p.predicted.msPerToken).toBeGreaterThan(p.predicted.gpuMs);
    expect(r.code).toBe(0);
  });

  it("K on disk: when V on disk is not enough, the plan says how much K goes, in what units, and what reading it back costs", () => {
    const plan = ["plan", "--model", "preset:llama-3.1-8b", "--context", "1500000", "--gpu-free", "140G", "--no-probe", "--k", "256", "--kv-disk", tmp(), "--host-kv-budget", "2G"];
    const r = runBin([...plan, "--json"]);
    expect(r.code).toBe(0);
    const p = JSON.parse(r.stdout);
    const disk = p.tiers.find((t: { kind: string }) => t.kind === "file");
    const pool = 32 * Math.ceil((8 * p.offloadedTokens * 128 * 2) / 4096) * 4096;
    expect(disk.vBytes).toBe(pool); // all of V
    expect(disk.kBytes).toBe(pool - 2 * 2 ** 30); // the K 2 GiB of memory cannot hold
    expect(p.store.kSpill).toEqual({ unitBytes: 4096 * Math.ceil(pool / 4096 / 16382), files: [{ tier: disk.id, dir: expect.any(String), bytes: disk.kBytes }] });
    expect(p.predicted.kDiskMs).toBeNull(); // no bandwidth known without the probes
    const text = runBin(plan);
    expect(text.stdout).toMatch(/\nK on disk: {2}33\.9 GiB \(all of V is on disk first\), the least recently selected 2\.2\d MiB units; the CPU stage's scoring reads them back every step, through page faults: – ms\n/);
    const none = runBin(["plan", "--model", "preset:llama-3.1-8b", "--context", "100000", "--gpu-kv-budget", "90000", "--gpu-free", "140G", "--no-probe", "--kv-disk", tmp(), "--host-kv-budget", "1G"]);
    expect(none.code).toBe(0);
    expect(none.stdout).toMatch(/\ndisk +file /);
    expect(none.stdout).not.toMatch(/K on disk/);
  });

  it("--index: the page index on the GPU shrinks the window by its bytes and takes the K scan off the CPU stage; bad options are one line", () => {
    const plan = ["plan", "--model", "preset:llama-3.1-8b", "--context", "1500000", "--gpu-free", "140G", "--no-probe", "--k", "256", "--kv-disk", tmp()];
    const plain = JSON.parse(runBin([...plan, "--json"]).stdout), r = runBin([...plan, "--index", '{"form":"int4","placement":"device"}', "--json"]);
    expect(r.code).toBe(0);
    const p = JSON.parse(r.stdout);
    expect(p.index).toEqual({ placement: "device", bytes: Math.ceil((p.offloadedTokens * 32 * 8 * (128 + 4)) / 16) });
    expect(p.gpu.windowTokens).toBeLessThan(plain.gpu.windowTokens);
    expect(p.predicted.cpuMs).toBe(0);
    expect(runBin([...plan, "--index", '{"placement":"device"}']).stdout).toMatch(/\nindex: {6}the page index chooses the rows: [\d.]+ GiB in GPU memory \(ranked there; the stage reads only the chosen pages' rows\)\n/);
    expect(runBin([...plan, "--index", '{"form":"int2"}']).stderr).toBe('error: invalid value for --index: form: form "int2" does not exist (forms: int8, int4)\n');
  });

  it("a context that fits nowhere is refused with the numbers after the plan (exit 2)", () => {
    const r = runBin(["plan", "--model", "preset:llama-3.1-8b", "--context", "3000000", "--gpu-free", "140G", "--no-probe", "--kv-disk", tmp(), "--host-kv-budget", "1G"]);
    expect(r.code).toBe(2);
    expect(r.stdout).toMatch(/^plan: {7}preset:llama-3\.1-8b, bf16 KV: 128\.0 KiB a token/);
    expect(r.stdout).toMatch(/\ndisk +file /);
    expect(r.stderr).toMatch(/^error: context 3000000 × batch 1 needs 366\.2 GiB of KV: the GPU window holds \d+ tokens \([\d.]+ GiB\), the host tiers and disk have room for .* of the [\d.]+ GiB offloaded: short by .* \(add --kv-disk DIR, raise --host-kv-budget, or shorten the context\)\n$/);
  });

  it("on the CPU alone the weights and window must fit host memory; bad flags are one line", () => {
    const r = runBin(["plan", "--model", "preset:llama-3.1-8b", "--context", "1000000", "--device", "cpu", "--no-probe", "--gpu-kv-budget", "200000000"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/^error: the weights \(15\.0 GiB\) and a window of 1000000 tokens × batch 1 \(122\.1 GiB\) exceed node0's usable .*\n$/);
    expect(runBin(["plan", "--model", "preset:llama-3.1-8b"]).stderr).toBe("error: hybridgen plan needs --context N\n");
    expect(runBin(["plan", "--context", "5"]).stderr).toBe("error: hybridgen plan needs --model DIR|preset:NAME\n");
    const plan = ["plan", "--model", "preset:llama-3.1-8b", "--context", "1000", "--device", "cpu", "--no-probe"];
    expect(runBin([...plan, "--kv-disk", tmp(), "--kv-disk-read-depth", "65"]).stderr).toBe("error: invalid value for --kv-disk-read-depth: must be ≤ 64\n");
    expect(runBin([...plan, "--kv-disk-read-depth", "4"]).stderr).toBe("error: --kv-disk-read-depth needs --kv-disk DIR (it reads the disk tier's rows)\n");
    // --device names a backend of the runtime's registry (or a module), probed through it: the same line as generate's for an unknown one.
    const device = (d: string) => runBin(["plan", "--model", "preset:llama-3.1-8b", "--context", "1000", "--no-probe", "--device", d]);
    expect(device("tpu").stderr).toBe('error: invalid value for --device: must be one of auto, cpu, cuda or a backend module (./my-backend.ts) (got "tpu")\n');
    const plugin = device(ONE_THREAD_BACKEND);
    expect([plugin.code, plugin.stderr]).toEqual([2, `error: backend "one-thread" cannot be probed for a plan (its entry has no probe): give the device's free memory\n`]);
  });

  it("--kv-disk-read-depth is the depth the disk's latency is probed at (one stage thread on the CPU: that many in flight)", () => {
    const r = runBin(["plan", "--model", "preset:llama-3.1-8b", "--context", "1000", "--device", "cpu", "--kv-disk", tmp(), "--kv-disk-read-depth", "2", "--json"]);
    expect(r.code).toBe(0);
    expect(JSON.parse(r.stdout).tiers.find((t: { kind: string }) => t.kind === "file")).toMatchObject({ readDepth: 2, readLatencyUs: expect.any(Number) });
  });

  it("info says what placement does on this machine", () => {
    const r = runBin(["info"]);
    expect(r.stdout).toMatch(/\nplacement: (one NUMA node \(\w+\): binding K and V there changes nothing|\d+ NUMA nodes.*); default policy semantic/);
  });
});
