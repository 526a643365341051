/**
 * The CPU stage's gather of disk-tier rows from a cold page cache: one layer of Llama-3.1-8B's store
 * (8 KV heads × 128 dims, bf16) whose V lies in a file of the disk tier (TieredStore), 8 192 random
 * rows a job (1 024 a KV head: verified top-256 at 4 candidates), the file dropped from the page cache
 * before every job (msync, madvise and fadvise DONTNEED). Page faults on the mapping (readDepth 0)
 * against explicit reads with threads × readDepth in flight (pread at depth 1, io_uring above).
 *   ./bun apps/bench/src/cpu/disk-rows.ts [--dir /tmp] [--tokens 524288] [--rows 8192] [--rounds 3]
 *     [--configs pf1,pf2,1x1,2x1,1x2,1x8,2x4,1x16,2x8,8x1,16x1]
 * A config "TxD" is T stage threads with readDepth D; "pfT" is T threads reading through the mapping.
 * Each round draws new rows; every config gathers the same rows and must stage the same bytes.
 */
import type { CpuStageJob, StoreLayout } from "@hybridgen/spec";
import { createHash } from "node:crypto";
import { cpus } from "node:os";
import { createCpuBackend, NativeCpuStage, TieredStore } from "@hybridgen/kernels-cpu";

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}
const dir = arg("dir", "/tmp"), n = Number(arg("tokens", "524288")), rowsPerJob = Number(arg("rows", "8192"));
const rounds = Number(arg("rounds", "3"));
const configs = arg("configs", "pf1,pf2,1x1,2x1,1x2,1x8,2x4,1x16,2x8,8x1,16x1").split(",");
const KV = 8, HEADS = 32, D = 128, ROW = D * 2, PAGE = 4096, perHead = rowsPerJob / KV;
const region = Math.ceil((KV * n * ROW) / PAGE) * PAGE;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;

const layout: StoreLayout = {
  regionBytes: region, pageBytes: PAGE,
  k: [[{ offset: 0, bytes: region, mode: "local", tier: "node0", nodes: [] }]],
  v: [[{ offset: 0, bytes: region, mode: "file", tier: `file:${dir}`, nodes: [], dir }]],
};
using be = createCpuBackend({ threads: 2 });
using store = new TieredStore(layout);
const K = store.alloc(be, "k", 0, [KV, n, D], "bf16"); // untouched: selected K rows read as zeros
const V = store.alloc(be, "v", 0, [KV, n, D], "bf16");
const t0 = performance.now();
const chunk = Float32Array.from({ length: 1 << 20 }, (_, i) => Math.sin(i * 0.37) * 0.5);
for (let off = 0; off < KV * n * D; off += chunk.length) {
  chunk[0] = off; // rows differ from chunk to chunk
  be.write(V, chunk.subarray(0, Math.min(chunk.length, KV * n * D - off)), off);
}
console.log(`V file: ${(region / 2 ** 30).toFixed(2)} GiB in ${dir}, written through the mapping in ${((performance.now() - t0) / 1e3).toFixed(1)} s`);

/** Sorted distinct random slots, perHead a KV head (a fixed generator: every config gets the same rows). */
let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) / 2 ** 32);
const draws = Array.from({ length: rounds }, () =>
  Array.from({ length: KV }, () => {
    const s = new Set<number>();
    while (s.size < perHead) s.add(Math.floor(rand() * n));
    return Int32Array.from([...s].sort((a, b) => a - b));
  }));

interface Result { config: string; inFlight: number; coldMs: number[]; warmMs: number[]; reads: number; cachedMB: number }
const results: Result[] = [];
const digests: string[] = [];
for (const config of configs) {
  const pf = config.startsWith("pf");
  const [threads, depth] = pf ? [Number(config.slice(2)), 0] : config.split("x").map(Number) as [number, number];
  using stage = new NativeCpuStage(be, { threads, readDepth: depth });
  stage.prepare({ heads: HEADS, kvHeads: KV, headDim: D, storeCapacity: n, dtype: "bf16" });
  stage.query(0).set(new Float32Array(HEADS * D).fill(0.01));
  const res: Result = { config, inFlight: pf ? threads : threads * depth, coldMs: [], warmMs: [], reads: 0, cachedMB: 0 };
  for (let r = 0; r < rounds; r++) {
    const job: CpuStageJob = { slot: 0, k: K, v: V, offloaded: n, kmax: perHead, scale: 0.088, work: { kind: "selected", selection: { kind: "perKvHead", ids: draws[r]! } } };
    store.dropFileCache();
    res.cachedMB = Math.max(res.cachedMB, store.cachedFileBytes() / 2 ** 20);
    for (const cold of [true, false]) {
      stage.submit(job);
      stage.wait();
      (cold ? res.coldMs : res.warmMs).push(stage.lastSplit().gatherMs);
    }
    res.reads = stage.lastReads().reads;
    const o = stage.output(0), bytes = new Uint8Array(be.read(o.values, 0, KV * perHead * D).buffer);
    const digest = createHash("sha1").update(bytes).digest("hex");
    if (digests[r] === undefined) digests[r] = digest;
    else if (digests[r] !== digest) throw new Error(`${config}: round ${r} staged different rows than ${configs[0]}`);
  }
  results.push(res);
  console.log(`${config}: cold ${res.coldMs.map((x) => x.toFixed(1)).join(" / ")} ms, warm ${res.warmMs.map((x) => x.toFixed(2)).join(" / ")} ms`);
}
be.free(K);
be.free(V);

console.log(`\n${cpus().length} CPUs (${cpus()[0]?.model}), ${rowsPerJob} rows of ${ROW} B a job from ${(region / 2 ** 30).toFixed(2)} GiB, page cache dropped before each cold job; medians of ${rounds}`);
console.log("| reads | in flight | cold gather ms | µs a row | warm gather ms | reads issued | cached after drop |");
console.log("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
for (const r of results) {
  const how = r.config.startsWith("pf") ? `page faults, ${r.config.slice(2)} thread(s)` : `${r.config.split("x")[0]} thread(s) × depth ${r.config.split("x")[1]}`;
  const cold = median(r.coldMs);
  console.log(`| ${how} | ${r.inFlight} | ${cold.toFixed(1)} | ${((cold * 1e3) / rowsPerJob).toFixed(1)} | ${median(r.warmMs).toFixed(2)} | ${r.reads} | ${r.cachedMB.toFixed(1)} MiB |`);
}
