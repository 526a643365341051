/**
 * TieredStore.readAhead on the thread that calls it: the next layer's selected V rows of a disk-tier
 * file advised (madvise WILLNEED) one page run at a time on the calling thread ("sync"), or queued
 * for the library's background thread ("queued": readAhead's way), against no read-ahead. One 8B layer pair (8 KV heads × 128 dims, bf16; V of layer 1 in a
 * file), 8 192 random rows (1 024 a KV head: verified top-256 at 4 candidates), the file dropped
 * from the page cache before every round. Columns: the caller's time, the time until the reads were
 * all submitted, then a gather of those rows through the mapping (what the stage's page faults pay).
 *   ./bun apps/bench/src/cpu/read-ahead.ts [--dir /tmp] [--tokens 262144] [--rows 8192] [--rounds 5]
 */
import { toArrayBuffer, type Pointer } from "bun:ffi";
import type { StoreLayout } from "@hybridgen/core";
import { createCpuBackend, TieredStore } from "@hybridgen/kernels-cpu";
import { tierNative } from "@hybridgen/kernels-cpu/lab";

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}
const dir = arg("dir", "/tmp"), n = Number(arg("tokens", "262144")), rows = Number(arg("rows", "8192")), rounds = Number(arg("rounds", "5"));
const KV = 8, D = 128, ROW = D * 2, PAGE = 4096, perHead = rows / KV;
const region = Math.ceil((KV * n * ROW) / PAGE) * PAGE;
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
const mem = () => [{ offset: 0, bytes: region, mode: "local" as const, tier: "node0", nodes: [] }];
const layout: StoreLayout = {
  regionBytes: region, pageBytes: PAGE,
  k: [mem(), mem()],
  v: [mem(), [{ offset: 0, bytes: region, mode: "file", tier: `file:${dir}`, nodes: [], dir }]],
};
using be = createCpuBackend({ threads: 1 });
using store = new TieredStore(layout);
const v0 = store.alloc(be, "v", 0, [KV, n, D], "bf16");
const v1 = store.alloc(be, "v", 1, [KV, n, D], "bf16");
const chunk = Float32Array.from({ length: 1 << 20 }, (_, i) => Math.sin(i * 0.37) * 0.5);
for (let off = 0; off < KV * n * D; off += chunk.length) be.write(v1, chunk.subarray(0, Math.min(chunk.length, KV * n * D - off)), off);
const lib = tierNative();
const base = be.hostRegion(v1).address;
const view = new Uint16Array(toArrayBuffer(base as Pointer, 0, KV * n * ROW));

let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) >>> 0) >>> 8) / (1 << 24);
console.log(`read-ahead of ${rows} rows of a ${(region / 2 ** 30).toFixed(2)} GiB bf16 V file in ${dir}, median of ${rounds} rounds, ms`);
console.log("| arm | caller | until submitted | gather after | runs |");
console.log("| --- | ---: | ---: | ---: | ---: |");
for (const arm of ["none", "sync", "queued"] as const) {
  const caller: number[] = [], submitted: number[] = [], gather: number[] = [];
  let runs = 0;
  for (let r = 0; r < rounds; r++) {
    const ids = new Int32Array(KV * perHead), counts = new Int32Array(KV).fill(perHead);
    for (let g = 0; g < KV; g++) {
      const picked = new Set<number>();
      while (picked.size < perHead) picked.add(Math.floor(rand() * n));
      ids.set([...picked].sort((a, b) => a - b), g * perHead);
    }
    store.dropFileCache();
    const before = store.readAheadStats.requests;
    const t0 = performance.now();
    if (arm === "queued") store.readAhead(v0, ids, counts, perHead, true);
    if (arm === "sync") {
      // readAhead's runs, each advised on this thread.
      for (let g = 0; g < KV; g++) {
        let s = -1, e = -1;
        for (let i = 0; i < perHead; i++) {
          const off = (g * n + ids[g * perHead + i]!) * ROW, p0 = Math.floor(off / PAGE) * PAGE, p1 = Math.ceil((off + ROW) / PAGE) * PAGE;
          if (s >= 0 && p0 <= e) e = Math.max(e, p1);
          else {
            if (s >= 0) lib.hg_tier_prefetch((base + s) as Pointer, e - s), runs++;
            s = p0;
            e = p1;
          }
        }
        if (s >= 0) lib.hg_tier_prefetch((base + s) as Pointer, e - s), runs++;
      }
    }
    const t1 = performance.now();
    lib.hg_tier_prefetch_wait();
    const t2 = performance.now();
    if (arm === "queued") runs += store.readAheadStats.requests - before;
    // The stage's gather through the mapping: one read per row.
    let sum = 0;
    for (let g = 0; g < KV; g++) for (let i = 0; i < perHead; i++) sum += view[(g * n + ids[g * perHead + i]!) * D]!;
    const t3 = performance.now();
    if (sum < 0) console.log(sum);
    caller.push(t1 - t0);
    submitted.push(t2 - t0);
    gather.push(t3 - t2);
  }
  console.log(`| ${arm} | ${median(caller).toFixed(2)} | ${median(submitted).toFixed(2)} | ${median(gather).toFixed(2)} | ${Math.round(runs / rounds)} |`);
}
