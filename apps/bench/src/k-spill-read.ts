/**
 * What K on disk costs the CPU stage's scoring, against the planner's kDiskMs: one layer of
 * Llama-3.1-8B's store (8 KV heads × 128, bf16), a share of its K spilled by a KSpill (all units
 * equally cold: the first ones in address order), a post-QKᵀ top-K job over every row, timed cold
 * (the spill file written back and dropped from memory first) and warm; the planner's term from
 * this machine's probes (the file's bandwidth, the stage's page faults at its threads); and the
 * spill pass itself (the units written and remapped).
 *   ./bun apps/bench/src/k-spill-read.ts [--dir /tmp] [--tokens 262144] [--shares 0,0.25,0.5,1] [--threads 2] [--rounds 3]
 */
import type { CpuStageJob, StoreLayout } from "@hybridgen/core";
import { createCpuBackend, NativeCpuStage, probeFileReadBandwidth, TieredStore } from "@hybridgen/kernels-cpu";
import { kDiskMs, kSpillUnitBytes } from "@hybridgen/memtier";
import { KSpill, probeDiskGather } from "@hybridgen/runtime";
import { arg, list } from "./args.js";

const dir = arg("dir", "/tmp"), n = Number(arg("tokens", "262144")), threads = Number(arg("threads", "2")), rounds = Number(arg("rounds", "3"));
const shares = list("shares", "0,0.25,0.5,1").map(Number);
const KV = 8, D = 128, ROW = D * 2, PAGE = 4096, K = 256;
const region = Math.ceil((KV * n * ROW) / PAGE) * PAGE;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;

const bandwidth = probeFileReadBandwidth(dir, 256 * 2 ** 20, 4 * 2 ** 20) / 1e9;
const [faults] = await probeDiskGather(dir, { threads, readDepths: [0] });
const tier = { readBandwidthGBs: bandwidth, faultLatencyUs: faults!.latencyUs, faultDepth: faults!.readDepth };
const unit = kSpillUnitBytes(region, PAGE);
console.log(`${dir}: ${bandwidth.toFixed(2)} GB/s in 4 MiB reads, a stage page fault ${faults!.latencyUs.toFixed(0)} µs at ${faults!.readDepth} in flight; K ${(region / 2 ** 20).toFixed(0)} MiB, units of ${unit / 1024} KiB`);

using be = createCpuBackend({ threads: 1 });
const rows: string[] = [];
let memoryMs = 0;
for (const share of shares) {
  const spillBytes = Math.floor((share * region) / unit) * unit;
  const layout: StoreLayout = {
    regionBytes: region, pageBytes: PAGE,
    k: [[{ offset: 0, bytes: region, mode: "local", tier: "node0", nodes: [] }]],
    v: [[{ offset: 0, bytes: region, mode: "local", tier: "node0", nodes: [] }]],
    ...(spillBytes > 0 ? { kSpill: { unitBytes: unit, files: [{ tier: `file:${dir}`, dir, bytes: spillBytes }] } } : {}),
  };
  const tiered = new TieredStore(layout);
  const store = spillBytes > 0 ? new KSpill(tiered) : tiered;
  try {
    const k = store.alloc(be, "k", 0, [KV, n, D], "bf16");
    const v = store.alloc(be, "v", 0, [KV, n, D], "bf16");
    const chunk = Float32Array.from({ length: 1 << 20 }, (_, i) => Math.sin(i * 0.37) * 0.5);
    for (let off = 0; off < KV * n * D; off += chunk.length) {
      chunk[0] = off;
      be.write(k, chunk.subarray(0, Math.min(chunk.length, KV * n * D - off)), off);
    }
    const t0 = performance.now();
    if (store instanceof KSpill) store.stored(n, () => {});
    const passMs = performance.now() - t0;
    using stage = new NativeCpuStage(be, { threads });
    stage.prepare({ heads: 32, kvHeads: KV, headDim: D, storeCapacity: n, dtype: "bf16" });
    stage.query(0).set(Float32Array.from({ length: 32 * D }, (_, i) => Math.cos(i * 0.11)));
    const job: CpuStageJob = { slot: 0, k, v, offloaded: n, kmax: K, scale: 0.088, work: { kind: "topk", budget: K, shared: false } };
    const cold: number[] = [], warm: number[] = [];
    for (let r = 0; r < rounds; r++) {
      if (store instanceof KSpill) store.dropFileCache();
      for (const list of [cold, warm]) {
        stage.submit(job);
        stage.wait();
        list.push(stage.lastSplit().scoreMs);
      }
    }
    const spilled = store instanceof KSpill ? store.stats.bytes : 0;
    if (share === 0) memoryMs = median(warm);
    const predicted = spilled > 0 ? kDiskMs(spilled, unit, tier)! : 0;
    rows.push(`| ${share} | ${(spilled / 2 ** 20).toFixed(0)} | ${passMs.toFixed(0)} | ${median(cold).toFixed(1)} | ${median(warm).toFixed(1)} | ${(median(cold) - memoryMs).toFixed(1)} | ${predicted.toFixed(1)} |`);
    console.log(rows[rows.length - 1]);
    be.free(k);
    be.free(v);
  } finally {
    store.release();
  }
}
console.log(`\n${threads} stage threads, ${n} tokens a KV head, post-QKᵀ top-${K} over every row; medians of ${rounds}`);
console.log("| K spilled share | MiB | spill pass ms | cold score ms | warm score ms | cold − all in memory | predicted (kDiskMs) |");
console.log("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
for (const r of rows) console.log(r);
