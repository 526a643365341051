import { describe, expect, it } from "vitest";
import type { MemoryTier } from "@hybridgen/spec";
import { diskRowsMs, gpuWindowTokens, kDiskMs, kSpillUnitBytes, planRun } from "../src/index.js";

const GiB = 2 ** 30, KiB = 1024;
const llama8b = { layers: 32, heads: 32, kvHeads: 8, headDim: 128, weightsBytes: 16_060_522_496 };
// The H200 machine: one node of 125 GiB, a 64 GiB disk; the GPU's free memory as cudaMemGetInfo reports it.
const node0: MemoryTier = { id: "node0", kind: "dram", numaNode: 0, capacityBytes: 125 * GiB, readBandwidthGBs: 40 };
const disk: MemoryTier = { id: "file:/scratch", kind: "file", capacityBytes: 60 * GiB, path: "/scratch", readBandwidthGBs: 2 };
const h200 = { freeBytes: 140 * GiB, readBandwidthGBs: 4000, linkBandwidthGBs: 50 };

describe("planRun: the arithmetic", () => {
  it("window tokens = (free − weights − reserve) / (batch × KV bytes per token)", () => {
    expect(gpuWindowTokens({ freeBytes: 100, weightsBytes: 30, reserveBytes: 10, bytesPerToken: 4, batch: 3 })).toBe(5);
    expect(gpuWindowTokens({ freeBytes: 10, weightsBytes: 30, reserveBytes: 0, bytesPerToken: 4, batch: 1 })).toBe(0);
  });

  it("Llama-3.1-8B at 1.5M tokens on the H200 machine: the GPU window takes what HBM holds, the host the rest", () => {
    const p = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 1_500_000, gpu: h200, tiers: [node0], k: 256 });
    expect(p.bytesPerToken).toEqual({ k: 64 * KiB, v: 64 * KiB });
    const scratch = 4 * 1_500_000 * 8 * 128 * 2; // two K/V pairs of one layer over the context
    // The hybrid step's gathered V and K rows, two slots of 4·K rows a KV head, and two slots of f32 score rows as wide, one a query head.
    const staging = 4 * 1024 * 8 * 128 * 2 + 2 * 32 * 1024 * 4;
    const scores = 32 * 1_500_000 * 4; // attention's f32 score rows, one a query head over the context
    // The window's ring keeps the prefill block's 512 slots past the budget.
    const fit = Math.floor((140 * GiB - llama8b.weightsBytes - 2 * GiB - scratch - staging - scores) / (128 * KiB)) - 512;
    expect(p.gpu).toMatchObject({
      reserveBytes: 2 * GiB + scratch + staging + scores, fitTokens: fit, windowTokens: fit, windowBytes: fit * 128 * KiB, batchRowsBytes: 0,
      perSequence: { windowBytes: (fit + 512) * 128 * KiB, scoresBytes: scores, scratchBytes: scratch, stagingBytes: staging },
    });
    expect(p.offloadedTokens).toBe(1_500_000 - fit);
    const t0 = p.tiers[0]!;
    // Semantic on one node: K and V both on node0; regions are whole pages of kvHeads × offloaded × headDim × 2 bytes.
    const region = Math.ceil((8 * p.offloadedTokens * 128 * 2) / 4096) * 4096;
    expect(t0).toMatchObject({ kBytes: 32 * region, vBytes: 32 * region });
    expect(p.fits).toBe(true);
    expect(p.refusal).toBeNull();
    // Predicted: GPU = (weights + window) / 4000 GB/s; CPU = K / 40 GB/s; the gathered V rows from node0 at 40 GB/s — 256 a KV head
    // on layer 0, 4·256 (the verified candidates) on the 31 after it — then those V rows and the candidates' K rows up at 50 GB/s.
    const gpuMs = ((llama8b.weightsBytes + fit * 128 * KiB) / 4000e9) * 1e3;
    const cpuMs = ((32 * region) / 40e9) * 1e3;
    const row = 128 * 2, selV = (256 + 31 * 1024) * 8 * row, sentK = 31 * 1024 * 8 * row;
    expect(p.predicted.gpuMs).toBeCloseTo(gpuMs, 6);
    expect(p.predicted.cpuMs).toBeCloseTo(cpuMs, 6);
    expect(p.predicted.vGatherMs).toBeCloseTo((selV / 40e9) * 1e3, 6);
    expect(p.predicted.vTransferMs).toBeCloseTo(((selV + sentK) / 50e9) * 1e3, 6);
    expect(p.predicted.msPerToken).toBeCloseTo(Math.max(gpuMs, cpuMs) + (selV / 40e9) * 1e3 + ((selV + sentK) / 50e9) * 1e3, 6);
    // The bytes behind those times: the device's reads, node0's (all of K, the gathered V rows), the rows sent up.
    expect(p.predicted.bytes).toEqual({ gpu: llama8b.weightsBytes + fit * 128 * KiB, tiers: { [t0.id]: 32 * region + selV }, link: selV + sentK });
    // Exact or speculative logits (candidates 1): K rows a KV head on every layer, no K rows sent.
    const single = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 1_500_000, gpu: h200, tiers: [node0], k: 256, candidates: 1 });
    expect(single.predicted.vGatherMs).toBeCloseTo(((32 * 256 * 8 * row) / 40e9) * 1e3, 6);
    expect(single.predicted.vTransferMs).toBeCloseTo(((32 * 256 * 8 * row) / 50e9) * 1e3, 6);
    // Decode only (a synthetic fill): no prefill scratch, a larger window.
    const decodeOnly = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 1_500_000, gpu: h200, tiers: [node0], k: 256, prefill: false });
    expect(decodeOnly.gpu!.fitTokens).toBe(Math.floor((140 * GiB - llama8b.weightsBytes - 2 * GiB - staging - scores) / (128 * KiB)) - 512);
    // Exact or speculative logits stage K rows a head, never more than the context.
    const exact = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 1_500_000, gpu: h200, tiers: [node0], k: 256, candidates: 1 });
    expect(exact.gpu!.reserveBytes).toBe(2 * GiB + scratch + 4 * 256 * 8 * 128 * 2 + 2 * 32 * 256 * 4 + scores);
    const short = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 600, gpu: h200, tiers: [node0], k: 256, gpuKvBudget: 100 });
    expect(short.gpu!.reserveBytes).toBe(2 * GiB + 4 * 600 * 8 * 128 * 2 + 4 * 600 * 8 * 128 * 2 + 2 * 32 * 600 * 4 + 32 * 600 * 4);
    // Tracked scores (h2o, keyformer) materialise the window's logits: score rows over the whole context (384 MB here).
    const tracked = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 1_500_000, gpu: h200, tiers: [node0], k: 256, trackScores: true });
    expect(tracked.gpu!.reserveBytes).toBe(2 * GiB + scratch + 4 * 1024 * 8 * 128 * 2 + 2 * 32 * 1_500_000 * 4 + scores);
    // Without the query heads the score rows count one a KV head.
    const { heads: _, ...noHeads } = llama8b;
    expect(planRun({ model: noHeads, kvElementBytes: 2, contextTokens: 1_500_000, gpu: h200, tiers: [node0], k: 256 }).gpu!.reserveBytes)
      .toBe(2 * GiB + scratch + 4 * 1024 * 8 * 128 * 2 + 2 * 8 * 1024 * 4 + 8 * 1_500_000 * 4);
    // The activations of a long prefill block (the 8B's at 32 768 rows: about 6.3 GiB) are reserved beside the rest.
    const act = Math.round(6.3 * GiB);
    const withAct = planRun({ model: { ...llama8b, activationBytes: act }, kvElementBytes: 2, contextTokens: 1_500_000, gpu: h200, tiers: [node0], k: 256, prefill: false });
    expect(withAct.gpu!.reserveBytes).toBe(decodeOnly.gpu!.reserveBytes + act);
    expect(withAct.gpu!.fitTokens).toBe(Math.floor((140 * GiB - llama8b.weightsBytes - 2 * GiB - staging - scores - act) / (128 * KiB)) - 512);
  });

  it("2M tokens: refused without a disk tier, with the numbers; placed with one, V's overflow on disk at page cost", () => {
    const refused = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 2_000_000, gpu: h200, tiers: [node0] });
    expect(refused.fits).toBe(false);
    expect(refused.refusal).toMatch(/^context 2000000 × batch 1 needs 244\.1 GiB of KV: the GPU window holds 880482 tokens \(107\.5 GiB\), the host tiers and disk have room for 112\.5 GiB of the 136\.7 GiB offloaded: short by 24\.2 GiB \(add --kv-disk DIR/);
    const placed = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 2_000_000, gpu: h200, tiers: [node0, disk], k: 128 });
    expect(placed.fits).toBe(true);
    const d = placed.tiers.find((t) => t.kind === "file")!;
    expect(d.kBytes).toBe(0);
    expect(d.vBytes).toBe(placed.store.diskBytes);
    expect(d.vBytes).toBeGreaterThan(23 * GiB);
    // V's last layers are on disk: each layer's gathered rows (4·128 a KV head, 128 on layer 0) split by its region's bytes there,
    // a 4 KiB page per 256-byte disk row at the disk's bandwidth, the rest at node0's.
    const R = placed.store.layout.regionBytes;
    let diskRows = 0, nodeRows = 0;
    placed.store.layout.v.forEach((segs, l) => {
      const rows = (l === 0 ? 128 : 512) * 8, file = segs.filter((s) => s.mode === "file").reduce((n, s) => n + s.bytes, 0);
      diskRows += (rows * file) / R;
      nodeRows += rows - (rows * file) / R;
    });
    expect(placed.store.layout.v[0]!.every((s) => s.mode !== "file")).toBe(true);
    expect(placed.store.layout.v[31]!.every((s) => s.mode === "file")).toBe(true);
    expect(placed.predicted.vGatherMs).toBeCloseTo(((nodeRows * 256) / 40e9 + (diskRows * 4096) / 2e9) * 1e3, 6);
  });

  it("disk rows with a probed read latency: rows ÷ depth × latency when that is slower than the bandwidth, else the bandwidth", () => {
    const row = 256, vTotal = (p: ReturnType<typeof planRun>) => p.tiers.reduce((n, t) => n + t.vBytes, 0);
    const diskRows = (p: ReturnType<typeof planRun>) => (1024 * 64 * KiB * p.tiers.find((t) => t.kind === "file")!.vBytes) / vTotal(p) / row;
    const nodeMs = (p: ReturnType<typeof planRun>) => ((1024 * 64 * KiB * p.tiers[0]!.vBytes) / vTotal(p) / 40e9) * 1e3;
    const base = { model: llama8b, kvElementBytes: 2, contextTokens: 2_000_000, gpu: h200, k: 1024, candidates: 1 };
    // Page faults: one read at a time, 125 µs each (2.3 GB/s would allow 1.8 µs a page).
    const serial = planRun({ ...base, tiers: [node0, { ...disk, readBandwidthGBs: 2.3, readLatencyUs: 125, readDepth: 1 }] });
    const rows = diskRows(serial);
    expect(rows).toBeGreaterThan(0);
    expect(serial.predicted.vGatherMs).toBeCloseTo(nodeMs(serial) + rows * 0.125, 6);
    expect(serial.tiers.find((t) => t.kind === "file")).toMatchObject({ readLatencyUs: 125, readDepth: 1 });
    // 120 in flight at 200 µs: 1.67 µs a row, below the bandwidth's 1.78 µs a page, which bounds it.
    const deep = planRun({ ...base, tiers: [node0, { ...disk, readBandwidthGBs: 2.3, readLatencyUs: 200, readDepth: 120 }] });
    expect(deep.predicted.vGatherMs).toBeCloseTo(nodeMs(deep) + ((rows * 4096) / 2.3e9) * 1e3, 6);
    // 16 in flight at 170 µs: 10.6 µs a row, above the bandwidth's.
    const vm = planRun({ ...base, tiers: [node0, { ...disk, readBandwidthGBs: 2.3, readLatencyUs: 170, readDepth: 16 }] });
    expect(vm.predicted.vGatherMs).toBeCloseTo(nodeMs(vm) + ((rows / 16) * 170) / 1e3, 6);
    // No bandwidth known: the latency alone; neither: unknown.
    expect(diskRowsMs(1000, 4096, { readLatencyUs: 100, readDepth: 4 })).toBeCloseTo(25, 9);
    expect(diskRowsMs(1000, 4096, {})).toBeNull();
  });

  it("the scale run's 2M disk gather: 8 192 rows a layer (4·256 candidates × 8 KV heads) on V's disk layers, each a random read", () => {
    // A 2M context on a 100 GiB host budget puts V's last ~18 layers in files; the disk tier as a probe describes it (latency at its depth).
    const tiers: MemoryTier[] = [node0, { ...disk, capacityBytes: 60 * GiB, readBandwidthGBs: 2.3, readLatencyUs: 1450, readDepth: 120 }];
    const p = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 2_000_028, gpuKvBudget: 859_852, gpu: h200, tiers, k: 256, prefill: false, hostBudgetBytes: 100 * GiB });
    expect(p.offloadedTokens).toBe(1_140_176);
    const d = p.tiers.find((t) => t.kind === "file")!;
    const diskLayers = d.vBytes / p.store.layout.regionBytes;
    expect(diskLayers).toBeGreaterThan(17);
    expect(diskLayers).toBeLessThan(19);
    const rows = 8192 * diskLayers;
    const nodeMs = ((((256 + 31 * 1024) * 8 - rows) * 256) / 40e9) * 1e3;
    expect(p.predicted.vGatherMs).toBeCloseTo(nodeMs + (rows / 120) * 1.45, 6);
    // Every disk row is a read: twice the rows, twice the time; half the latency at the same depth, half the time.
    expect(diskRowsMs(2 * rows, 4096, d)! / diskRowsMs(rows, 4096, d)!).toBeCloseTo(2, 9);
    expect(diskRowsMs(rows, 4096, { ...d, readLatencyUs: 725 })! / diskRowsMs(rows, 4096, d)!).toBeCloseTo(0.5, 9);
  });

  it("K on disk: past all of V, the K the host budget cannot hold is spilled page-wise and read back through page faults every step", () => {
    const spillDisk: MemoryTier = { ...disk, capacityBytes: 200 * GiB, readBandwidthGBs: 10, faultLatencyUs: 400, faultDepth: 15 };
    const p = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 2_000_028, gpuKvBudget: 859_852, gpu: h200, tiers: [node0, spillDisk], k: 256, prefill: false, hostBudgetBytes: 20 * GiB });
    const pool = 32 * p.store.layout.regionBytes, kDisk = pool - 20 * GiB;
    const d = p.tiers.find((t) => t.kind === "file")!;
    expect(d).toMatchObject({ kBytes: kDisk, vBytes: pool, faultLatencyUs: 400, faultDepth: 15 });
    expect(p.tiers[0]).toMatchObject({ kBytes: 20 * GiB, vBytes: 0 });
    // Every K region stays memory; the spill moves 4.35 MiB units (K's 69.6 GiB over 16 382 units), read back a 128 KiB read-around a fault.
    expect(p.store.layout.k.flat().every((seg) => seg.mode === "bind")).toBe(true);
    expect(p.store.layout.kSpill).toEqual({ unitBytes: kSpillUnitBytes(pool, 4096), files: [{ tier: disk.id, dir: "/scratch", bytes: kDisk }] });
    expect(p.store.layout.kSpill!.unitBytes).toBe(1114 * 4096);
    const faultsMs = (Math.ceil(kDisk / (128 * KiB)) / 15) * 0.4, bwMs = (kDisk / 10e9) * 1e3;
    expect(faultsMs).toBeGreaterThan(bwMs); // 400 µs for 128 KiB at 15 in flight: 4.9 GB/s in all, below the 10 GB/s of large reads
    expect(p.predicted.kDiskMs).toBeCloseTo(faultsMs, 6);
    expect(p.predicted.cpuMs).toBeCloseTo(((20 * GiB) / 40e9) * 1e3 + faultsMs, 6);
    // Without K on disk the term is 0.
    expect(planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 2_000_028, gpuKvBudget: 859_852, gpu: h200, tiers: [node0, spillDisk], k: 256, prefill: false, hostBudgetBytes: 100 * GiB }).predicted.kDiskMs).toBe(0);
  });

  it("kDiskMs: faults of at most the read-around (or a smaller unit) at the fault depth, never faster than the bandwidth", () => {
    const t = { readBandwidthGBs: 1, faultLatencyUs: 100, faultDepth: 4 };
    // 4 MiB units: a fault reads 128 KiB, 8 192 faults at 4 in flight take 204.8 ms, under the 1 073.7 ms 1 GB/s allows.
    expect(kDiskMs(GiB, 4 * 2 ** 20, t)).toBeCloseTo((GiB / 1e9) * 1e3, 9);
    expect(kDiskMs(GiB, 4 * 2 ** 20, { ...t, faultLatencyUs: 1000 })).toBeCloseTo((8192 / 4) * 1, 9);
    expect(kDiskMs(GiB, 4096, t)).toBeCloseTo((262_144 / 4) * 0.1, 9); // a 4 KiB unit: a fault a page, 6.55 s
    expect(kDiskMs(GiB, 4096, { ...t, faultDepth: 8 })! / kDiskMs(GiB, 4096, t)!).toBeCloseTo(0.5, 9);
    expect(kDiskMs(GiB, 4096, { readBandwidthGBs: 2 })).toBeCloseTo((GiB / 2e9) * 1e3, 9);
    expect(kDiskMs(GiB, 4096, {})).toBeNull();
  });

  it("a fixed budget larger than the GPU holds, and weights larger than the GPU, are refused", () => {
    const big = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 2_000_000, gpu: h200, gpuKvBudget: 1_500_000, tiers: [node0, disk] });
    expect(big.refusal).toMatch(/^a GPU window of 1500000 tokens × batch 1 needs 183\.1 GiB, but 107\.5 GiB \(880482 tokens\) is free after the weights and the reserve$/);
    const small = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 8192, gpu: { freeBytes: 12 * GiB }, tiers: [node0] });
    expect(small.refusal).toMatch(/^the weights \(15\.0 GiB\) and the reserve \(2\.07 GiB, activations and each sequence's score rows, prefill scratch and staging included\) exceed the GPU's free 12\.0 GiB$/);
  });

  it("no GPU: weights and window sit in host memory before the store; batch multiplies the KV", () => {
    const tiny: MemoryTier = { id: "node0", kind: "dram", numaNode: 0, capacityBytes: 64 * GiB };
    const p = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 65_536, batch: 4, gpuKvBudget: 4096, tiers: [tiny] });
    expect(p.weights.where).toBe("host");
    expect(p.gpu).toBeNull();
    expect(p.hostWindowBytes).toBe(4096 * 4 * 128 * KiB);
    expect(p.store.tiers[0]!.availableBytes).toBe(Math.floor((Math.floor(64 * GiB * 0.9) - llama8b.weightsBytes - p.hostWindowBytes) / 4096) * 4096);
    expect(p.tiers[0]!.kBytes).toBe(32 * 8 * (65_536 - 4096) * 4 * 128 * 2);
    expect(p.predicted.gpuMs).toBeNull();
    expect(p.predicted.msPerToken).toBeNull(); // no bandwidth known for node0
    const over = planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 262_144, batch: 4, gpuKvBudget: 4096, tiers: [tiny] });
    expect(over.refusal).toMatch(/^context 262144 × batch 4 needs 128\.0 GiB of KV: weights and window take 17\.0 GiB of host memory/);
  });

  it("a batch of 32 × 32K on a GPU capped at 80 GiB: the batched step's rows and every sequence's buffers join the reserve; the step reads the weights once", () => {
    const rowBytes = 4 * (2 * 4096 + 2 * 1024 + 3 * 4096 + 2 * 14336 + 128_256); // the 8B's batched step: one row's activations
    const gpu = { freeBytes: 80 * GiB, readBandwidthGBs: 3000, linkBandwidthGBs: 50 };
    const big = { ...node0, capacityBytes: 1024 * GiB };
    const p = planRun({ model: { ...llama8b, batchRowBytes: rowBytes }, kvElementBytes: 2, contextTokens: 32_768, batch: 32, gpu, tiers: [big], k: 256, appendTokens: 64 });
    const scratch = 4 * 32_768 * 8 * 128 * 2, staging = 4 * 1024 * 8 * 128 * 2 + 2 * 32 * 1024 * 4, scores = 32 * 32_768 * 4;
    const reserve = 2 * GiB + 32 * rowBytes + 32 * (scratch + staging + scores);
    const fit = Math.floor((80 * GiB - llama8b.weightsBytes - reserve) / (32 * 128 * KiB)) - 64;
    expect(p.gpu).toMatchObject({ reserveBytes: reserve, batchRowsBytes: 32 * rowBytes, windowTokens: fit, perSequence: { windowBytes: (fit + 64) * 128 * KiB, scoresBytes: scores, scratchBytes: scratch, stagingBytes: staging } });
    expect(p.offloadedTokens).toBe(32_768 - fit);
    // One step: the weights once and 32 windows at the GPU's bandwidth; every sequence's K at the tier's; 32 sequences' rows gathered and sent up.
    const gpuMs = ((llama8b.weightsBytes + 32 * fit * 128 * KiB) / 3000e9) * 1e3;
    const off = 32_768 - fit, cpuMs = ((32 * Math.ceil((8 * off * 32 * 128 * 2) / 4096) * 4096) / 40e9) * 1e3;
    const row = 128 * 2, selV = 32 * (256 + 31 * 1024) * 8 * row, sentK = 32 * 31 * 1024 * 8 * row;
    expect(p.predicted.gpuMs).toBeCloseTo(gpuMs, 6);
    expect(p.predicted.cpuMs).toBeCloseTo(cpuMs, 6);
    const step = Math.max(gpuMs, cpuMs) + (selV / 40e9) * 1e3 + ((selV + sentK) / 50e9) * 1e3;
    expect(p.predicted.msPerToken).toBeCloseTo(step, 6);
    expect(p.predicted.tokensPerSecond).toBeCloseTo((32 * 1000) / step, 6);
    // At batch 1 no batched step's rows are reserved.
    expect(planRun({ model: { ...llama8b, batchRowBytes: rowBytes }, kvElementBytes: 2, contextTokens: 32_768, gpu, tiers: [big], k: 256 }).gpu!.batchRowsBytes).toBe(0);
  });

  it("bad input is one line naming the field", () => {
    expect(() => planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 0, tiers: [node0] })).toThrow(/^plan: contextTokens: /);
  });
});

describe("planRun with the page index choosing the stage's rows", () => {
  const base = { model: llama8b, kvElementBytes: 2, contextTokens: 1_500_000, gpu: h200, tiers: [node0], k: 256, prefill: false };
  // int8: 2·headDim code bytes and a f32 scale a page of 16 and KV head, every layer: 32 · 8 · 260 / 16 bytes an offloaded token.
  const perToken = (32 * 8 * 260) / 16;

  it("on the device: the window gives up room for the index, the stage reads no K of the host, only the chosen rows leave it", () => {
    const plain = planRun(base), p = planRun({ ...base, index: { placement: "device" } });
    const left = plain.gpu!.freeBytes - llama8b.weightsBytes - p.gpu!.reserveBytes - 1_500_000 * perToken;
    expect(p.gpu!.windowTokens).toBe(Math.floor(left / (128 * KiB - perToken)) - 512);
    expect(p.gpu!.windowTokens).toBeLessThan(plain.gpu!.windowTokens);
    expect(p.index).toEqual({ placement: "device", bytes: Math.ceil(p.offloadedTokens * perToken) });
    expect(p.predicted.cpuMs).toBe(0);
    // The GPU reads the index beside weights and window; node0 gives the chosen rows' V and K (256 a KV head on layer 0, 1024 after it).
    expect(p.predicted.bytes.gpu).toBe(llama8b.weightsBytes + p.gpu!.windowTokens * 128 * KiB + p.index!.bytes);
    expect(p.predicted.bytes.tiers.node0).toBeCloseTo(2 * (256 + 31 * 1024) * 8 * 256, 0);
    expect(p.fits).toBe(true);
  });

  it("a measured ranking replaces the index's bytes in the GPU stage: layers × sequences × its ms a layer (none on the host or with nothing offloaded)", () => {
    const bytesOnly = planRun({ ...base, index: { placement: "device" } });
    const ranked = planRun({ ...base, gpu: { ...h200, indexRankMs: 0.05 }, index: { placement: "device" } });
    const gbs = h200.readBandwidthGBs!, streamed = ((bytesOnly.predicted.bytes.gpu - bytesOnly.index!.bytes) / (gbs * 1e9)) * 1e3;
    expect(bytesOnly.predicted.gpuMs).toBeCloseTo((bytesOnly.predicted.bytes.gpu / (gbs * 1e9)) * 1e3, 9);
    expect(ranked.predicted.gpuMs).toBeCloseTo(streamed + 32 * 0.05, 9);
    expect(ranked.predicted.bytes.gpu).toBe(bytesOnly.predicted.bytes.gpu);
    const batch = planRun({ ...base, batch: 2, gpu: { ...h200, indexRankMs: 0.05 }, index: { placement: "device" } });
    expect(batch.predicted.gpuMs).toBeCloseTo(((batch.predicted.bytes.gpu - batch.index!.bytes) / (gbs * 1e9)) * 1e3 + 2 * 32 * 0.05, 9);
    const host = planRun({ ...base, gpu: { ...h200, indexRankMs: 0.05 }, index: { placement: "host" } });
    expect(host.predicted.gpuMs).toBeCloseTo((host.predicted.bytes.gpu / (gbs * 1e9)) * 1e3, 9);
    const short = planRun({ ...base, contextTokens: 1000, gpu: { ...h200, indexRankMs: 0.05 }, index: { placement: "device" } });
    expect(short.offloadedTokens).toBe(0);
    expect(short.predicted.gpuMs).toBeCloseTo((short.predicted.bytes.gpu / (gbs * 1e9)) * 1e3, 9);
  });

  it("a measured hand-off is charged once a sequence for each layer that waits for its true query (serialLayers), after the overlapped stages; none without it or with nothing offloaded", () => {
    const ahead = planRun({ ...base, gpu: { ...h200, handOffMs: 0.08 }, index: { placement: "device" } });
    const exact = planRun({ ...base, candidates: 1, serialLayers: 32, gpu: { ...h200, handOffMs: 0.08 }, index: { placement: "device" } });
    const unmeasured = planRun({ ...base, candidates: 1, serialLayers: 32, index: { placement: "device" } });
    expect(ahead.predicted.handOffMs).toBe(0);
    expect(exact.predicted.handOffMs).toBeCloseTo(32 * 0.08, 12);
    expect(exact.predicted.msPerToken).toBeCloseTo(unmeasured.predicted.msPerToken! + 32 * 0.08, 9);
    expect(planRun({ ...base, batch: 2, serialLayers: 40, gpu: { ...h200, handOffMs: 0.08 }, index: { placement: "device" } }).predicted.handOffMs).toBeCloseTo(2 * 32 * 0.08, 12);
    expect(planRun({ ...base, contextTokens: 1000, serialLayers: 32, gpu: { ...h200, handOffMs: 0.08 } }).predicted.handOffMs).toBe(0);
  });

  it("on the host: the stage reads the index and its super-pages from the fastest tier; auto takes the device when it has room", () => {
    const p = planRun({ ...base, index: { placement: "host", form: "int4" } });
    const bytes = Math.ceil(Math.ceil(p.offloadedTokens * ((32 * 8 * 132) / 16)) * (1 + 1 / 16));
    expect(p.index).toEqual({ placement: "host", bytes });
    expect(p.predicted.cpuMs).toBeCloseTo((bytes / 40e9) * 1e3, 6);
    expect(planRun({ ...base, index: {} }).index!.placement).toBe("device");
  });

  it("an index that does not fit the device it was placed on is a one-line refusal; auto then keeps it on the host", () => {
    const small = { ...h200, freeBytes: 17 * GiB };
    const p = planRun({ ...base, gpu: small, index: { placement: "device" } });
    expect(p.fits).toBe(false);
    expect(p.refusal).toMatch(/^the page index on the GPU \(.+ for 1500000 tokens × batch 1\) leaves no room for a window: .+ \(index placement "host" keeps it on the CPU stage\)$/);
    expect(planRun({ ...base, gpu: small, index: {} }).index!.placement).toBe("host");
    expect(() => planRun({ ...base, index: { form: "int2" as "int8" } })).toThrow(/^plan: index\.form: /);
    expect(() => planRun({ ...base, index: { pageSize: 0 } })).toThrow(/^plan: index\.pageSize: /);
  });

  it("the index's host copy (page level and super-pages, either placement) is reserved on the fastest tier: the store spills to disk, or the plan is refused in one line", () => {
    // An H100's 75 GiB: 1.5M tokens do not fit a 125 GiB host beside its window; with the disk, V goes there by the copy's bytes more.
    const h100 = { freeBytes: 75 * GiB, readBandwidthGBs: 3000, linkBandwidthGBs: 50 }, big = { ...disk, capacityBytes: 600 * GiB };
    const plain = planRun({ ...base, gpu: h100, tiers: [node0, big] }), p = planRun({ ...base, gpu: h100, tiers: [node0, big], index: { placement: "device" } });
    const copy = Math.ceil(Math.ceil(p.offloadedTokens * perToken) * (1 + 1 / 16));
    const room = (x: typeof p) => x.store.tiers.find((t) => t.id === "node0")!.availableBytes;
    expect(Math.abs(room(p) - (Math.floor(125 * GiB * 0.9) - copy))).toBeLessThan(4096); // whole pages
    expect(room(plain)).toBe(Math.floor(125 * GiB * 0.9));
    expect(p.fits).toBe(true);
    expect(planRun({ ...base, gpu: h100, index: { placement: "device" } }).refusal).toMatch(/^context 1500000 × batch 1 needs .+ short by /);
    const small: MemoryTier = { ...node0, capacityBytes: 2 * GiB };
    const r = planRun({ ...base, tiers: [small, big], index: { placement: "host" } });
    expect(r.refusal).toMatch(/^the page index's host copy \(.+ for \d+ offloaded tokens × batch 1\) does not fit node0's usable 1\.80 GiB \(form int4, larger pages or a shorter context need less\)$/);
  });

  it("a ranking beside the layer (a side stream): each layer costs the longer of its streamed bytes and its ranking", () => {
    const serial = planRun({ ...base, gpu: { ...h200, indexRankMs: 0.05 }, index: { placement: "device" } });
    const beside = planRun({ ...base, gpu: { ...h200, indexRankMs: 0.05, indexRankBeside: true }, index: { placement: "device" } });
    const streamed = serial.predicted.gpuMs! - 32 * 0.05;
    expect(beside.predicted.gpuMs).toBeCloseTo(Math.max(streamed, 32 * 0.05), 9);
    expect(beside.predicted.gpuMs).toBeLessThan(serial.predicted.gpuMs!);
    const slow = planRun({ ...base, gpu: { ...h200, indexRankMs: 5, indexRankBeside: true }, index: { placement: "device" } });
    expect(slow.predicted.gpuMs).toBeCloseTo(32 * 5, 9);
  });

  it("q̃'s projection: each layer ahead on q̃ reads its W_q once more a step (not the serial layers, not with nothing offloaded)", () => {
    const wq = 4096 * 4096 * 2, plain = planRun({ ...base, index: { placement: "device" } });
    const ahead = planRun({ ...base, model: { ...llama8b, queryProjectionBytes: wq }, index: { placement: "device" } });
    expect(ahead.predicted.bytes.gpu - plain.predicted.bytes.gpu).toBe(32 * wq);
    expect(ahead.predicted.gpuMs! - plain.predicted.gpuMs!).toBeCloseTo(((32 * wq) / 4000e9) * 1e3, 9);
    const exact = planRun({ ...base, model: { ...llama8b, queryProjectionBytes: wq }, candidates: 1, serialLayers: 30, index: { placement: "device" } });
    expect(exact.predicted.bytes.gpu - planRun({ ...base, candidates: 1, serialLayers: 30, index: { placement: "device" } }).predicted.bytes.gpu).toBe(2 * wq);
    const none = planRun({ ...base, contextTokens: 1000, model: { ...llama8b, queryProjectionBytes: wq } });
    expect(none.predicted.bytes.gpu).toBe(planRun({ ...base, contextTokens: 1000 }).predicted.bytes.gpu);
  });

  it("least window: the smallest whose store the memory tiers hold (never more on disk than the fullest window's), down to the append block", () => {
    // 1M tokens on the H100 machine, the host store held to 88 GiB: the window keeps what the host cannot.
    const h100 = { freeBytes: 75 * GiB, readBandwidthGBs: 3000, linkBandwidthGBs: 50 }, o = { ...base, contextTokens: 1_000_000, gpu: h100, hostBudgetBytes: 88 * GiB, index: { placement: "device" as const } };
    const fill = planRun(o), least = planRun({ ...o, leastWindow: true }), w = least.gpu!.windowTokens;
    expect(least.fits).toBe(true);
    expect(w).toBeLessThan(fill.gpu!.windowTokens);
    expect(planRun({ ...o, gpuKvBudget: w - 1 }).fits).toBe(false); // one token less and the store no longer fits
    expect(least.predicted.bytes.gpu).toBeLessThan(fill.predicted.bytes.gpu);
    expect(least.offloadedTokens).toBe(1_000_000 - w);
    // A host that holds every offloaded token: the window stops at the append block.
    const roomy = planRun({ ...o, hostBudgetBytes: undefined, tiers: [{ ...node0, capacityBytes: 1024 * GiB }], appendTokens: 4096, leastWindow: true });
    expect(roomy.gpu!.windowTokens).toBe(4096);
    // With a disk tier the fullest window does not need, the least window stays off it.
    const withDisk = planRun({ ...o, tiers: [node0, { ...disk, capacityBytes: 600 * GiB }], leastWindow: true });
    expect(withDisk.gpu!.windowTokens).toBe(w);
    expect(withDisk.tiers.find((t) => t.kind === "file")!.vBytes).toBe(0);
    // A fixed window is kept.
    expect(planRun({ ...o, gpuKvBudget: 300_000, leastWindow: true }).gpu!.windowTokens).toBe(300_000);
  });

  it("disk reads: the index's rows come as whole pages of the file, one 4 KiB read an index page of 16 bf16 rows of 128 (not one a row); their K rows from memory, where K is", () => {
    // The scale run's 2M disk layout (V's last ~18 layers in files, K all in memory): the disk gives the pages' V rows.
    const tiers: MemoryTier[] = [node0, { ...disk, capacityBytes: 60 * GiB, readBandwidthGBs: 2.3, readLatencyUs: 1450, readDepth: 120 }];
    const p = planRun({ ...base, contextTokens: 2_000_028, gpuKvBudget: 859_852, tiers, hostBudgetBytes: 100 * GiB, index: { placement: "device" } });
    const d = p.tiers.find((t) => t.kind === "file")!, rows = (8192 * d.vBytes) / p.store.layout.regionBytes;
    expect(d.kBytes).toBe(0);
    expect(p.predicted.bytes.tiers[d.id]).toBeCloseTo((rows / 16) * 4096, 0);
    const all = (256 + 31 * 1024) * 8, nodeMs = (((2 * all - rows) * 256) / 40e9) * 1e3; // every K row and the V rows not on disk
    expect(p.predicted.bytes.tiers.node0).toBeCloseTo((2 * all - rows) * 256, 0);
    expect(p.predicted.vGatherMs).toBeCloseTo(nodeMs + (rows / 16 / 120) * 1.45, 6);
  });
});

describe("planRun: the selector's byte model at 32 × 32K under 80 GiB", () => {
  const big = { ...node0, capacityBytes: 1024 * GiB };
  const gpu = { freeBytes: 80 * GiB, readBandwidthGBs: 3000, linkBandwidthGBs: 50 };
  const plan = (extra: object) => planRun({ model: llama8b, kvElementBytes: 2, contextTokens: 32_768, batch: 32, gpu, tiers: [big], k: 256, appendTokens: 64, prefill: false, ...extra });
  const row = 128 * 2;
  // Rows gathered a step over the batch: K a KV head on layer 0, candidates·K on the 31 after it (verified), K everywhere otherwise.
  const gathered = (candidates: number) => 32 * (256 + 31 * 256 * candidates) * 8 * row;

  it("top-K reads every offloaded K; Quest's bounds two rows a page; StreamingLLM and the page index none — then the chosen rows' K beside their V", () => {
    const scan = plan({}), bounds = plan({ selection: "bounds", boundsPageSize: 16 }), none = plan({ selection: "none", candidates: 1 }), index = plan({ index: { placement: "device" } });
    const scanK = scan.predicted.bytes.tiers.node0! - gathered(4);
    expect(scanK).toBeGreaterThanOrEqual(32 * scan.offloadedTokens * 32 * 8 * row); // every sequence's offloaded K of every layer (page-rounded)
    expect(bounds.predicted.bytes.tiers.node0).toBeCloseTo(scanK / 8 + 2 * gathered(4), 0);
    expect(bounds.predicted.cpuMs).toBeCloseTo(scan.predicted.cpuMs! / 8, 6);
    expect(none.predicted.bytes.tiers.node0).toBe(2 * gathered(1));
    expect(none.predicted.cpuMs).toBe(0);
    // Exact or speculative logits send K rows of V a layer; verified the candidates' K and V rows.
    expect(none.predicted.bytes.link).toBe(gathered(1));
    expect(scan.predicted.bytes.link).toBe(2 * gathered(4) - 32 * 256 * 8 * row);
    // The page index on the device: no stage read of K, its page level read by the GPU; the step's bytes no longer follow the offloaded K.
    expect(index.predicted.cpuMs).toBe(0);
    expect(index.predicted.bytes.tiers.node0).toBe(2 * gathered(4));
    expect(index.predicted.bytes.gpu).toBe(llama8b.weightsBytes + 32 * index.gpu!.windowTokens * 128 * KiB + index.index!.bytes);
    expect(index.predicted.msPerToken!).toBeLessThan(scan.predicted.msPerToken! / 4);
  });
});

describe("planRun of a batched step: the host's per-row costs and the least window", () => {
  const gpu = { freeBytes: 77 * GiB, readBandwidthGBs: 3000, linkBandwidthGBs: 50 };
  const big = { ...node0, capacityBytes: 1024 * GiB };
  const base = { model: llama8b, kvElementBytes: 2, contextTokens: 131_004, batch: 8, gpu, tiers: [big], k: 256, appendTokens: 4096, prefill: false, index: { placement: "device" as const } };
  const total = 128 * KiB, ipt = (32 * 8 * (2 * 128 + 4)) / 16; // KV and device-index bytes a token

  it("issuing and the stage's jobs: layers × batch × their ms a row a layer, the step no shorter than either", () => {
    const plain = planRun(base), p = planRun({ ...base, issueMsPerRowLayer: 0.2, stageMsPerRowLayer: 0.05 });
    expect(plain.predicted.hostMs).toBe(0);
    expect(p.predicted.hostMs).toBeCloseTo(32 * 8 * 0.2, 9);
    expect(p.predicted.cpuMs).toBeCloseTo(plain.predicted.cpuMs! + 32 * 8 * 0.05, 9);
    const { gpuMs, cpuMs, hostMs, vGatherMs, vTransferMs } = p.predicted;
    expect(p.predicted.msPerToken).toBeCloseTo(Math.max(gpuMs!, cpuMs!, hostMs) + vGatherMs! + vTransferMs!, 9);
    expect(p.gpu!.windowTokens).toBe(plain.gpu!.windowTokens); // no budget asked: the window stays what the device holds
  });

  it("the least window the host leaves: 8 × 131K on a 125 GiB host holds what the host's store cannot, and the device reads less a step than at the window it could hold", () => {
    const host = { ...node0, capacityBytes: 125 * GiB }, o = { ...base, tiers: [host], candidates: 2, keep: 1 };
    const most = planRun(o), least = planRun({ ...o, leastWindow: true }), w = least.gpu!.windowTokens;
    expect(least.fits).toBe(true);
    expect(w).toBeLessThan(most.gpu!.windowTokens);
    expect(w).toBeGreaterThan(4096); // 8 × 131K of KV is 128 GiB: the host holds less, the window the rest
    expect(planRun({ ...o, gpuKvBudget: w - 1 }).fits).toBe(false); // one token fewer a sequence: the host's store overflows
    expect(least.predicted.bytes.gpu).toBeLessThan(most.predicted.bytes.gpu);
    expect(least.predicted.bytes.link).toBe(most.predicted.bytes.link); // the selected rows do not grow with the offloaded part
    expect(least.predicted.gpuMs!).toBeLessThan(most.predicted.gpuMs!);
  });

  it("verified layers that keep keep·K of their candidates send those V rows alone; a device that gathers the rows itself charges them at its gather rate inside its part", () => {
    const plain = planRun({ ...base, gpuKvBudget: 16384 }), kept = planRun({ ...base, gpuKvBudget: 16384, keep: 1 });
    const row = 128 * 2, perLayer = (rows: number) => rows * 8 * 8 * row; // 8 KV heads, batch 8
    // Layer 0 gathers K rows (V only); layers 1–31 the 4·K candidates' K rows and, kept, K of their V rows instead of 4·K.
    expect(plain.predicted.bytes.link).toBe(perLayer(256) + 31 * perLayer(2 * 1024));
    expect(kept.predicted.bytes.link).toBe(perLayer(256) + 31 * perLayer(1024 + 256));
    expect(planRun({ ...base, gpuKvBudget: 16384, keep: 4 }).predicted.bytes.link).toBe(plain.predicted.bytes.link); // keep = candidates: every V row
    // At a gather rate of 27 GB/s: the rows' time inside the device's part, no separate V gather.
    const g = planRun({ ...base, gpuKvBudget: 16384, keep: 1, gpu: { ...gpu, gatherGBs: 27 }, issueMsPerRowLayer: 0.01 });
    const { gpuMs, cpuMs, hostMs, vTransferMs, vGatherMs } = g.predicted;
    expect(vTransferMs).toBeCloseTo((kept.predicted.bytes.link / 27e9) * 1e3, 9);
    expect(vGatherMs).toBe(0);
    expect(g.predicted.msPerToken).toBeCloseTo(Math.max(gpuMs! + vTransferMs!, cpuMs!, hostMs), 9);
  });

  it("rows fetched ahead: the K rows of every layer after the first (and their V rows where no candidate is dropped) cross beside the device's reads, the rest after them", () => {
    const row = 128 * 2, perLayer = (rows: number) => rows * 8 * 8 * row, at = (bytes: number) => (bytes / 27e9) * 1e3;
    for (const keep of [1, undefined]) {
      const o = { ...base, gpuKvBudget: 16384, ...(keep ? { keep } : {}), issueMsPerRowLayer: 0.001 };
      const inLayer = planRun({ ...o, gpu: { ...gpu, gatherGBs: 27 } }), ahead = planRun({ ...o, gpu: { ...gpu, gatherGBs: 27, fetchAhead: true } });
      expect(ahead.predicted.bytes).toEqual(inLayer.predicted.bytes); // the same bytes, moved at another time
      // Layers 1–31 fetch their 4·K candidates' K rows ahead, and their V rows too where every candidate's comes up.
      const fetched = 31 * perLayer(1024) + (keep ? 0 : 31 * perLayer(1024));
      const { gpuMs, vTransferMs } = ahead.predicted;
      expect(ahead.predicted.msPerToken).toBeCloseTo(Math.max(gpuMs!, at(fetched)) + vTransferMs! - at(fetched), 9);
      expect(ahead.predicted.msPerToken!).toBeLessThan(inLayer.predicted.msPerToken!);
    }
    // Exact logits (every layer serial): nothing runs ahead, nothing is fetched ahead.
    const exact = { ...base, gpuKvBudget: 16384, candidates: 1, serialLayers: 32 };
    expect(planRun({ ...exact, gpu: { ...gpu, gatherGBs: 27, fetchAhead: true } }).predicted.msPerToken).toBe(planRun({ ...exact, gpu: { ...gpu, gatherGBs: 27 } }).predicted.msPerToken);
  });
});
