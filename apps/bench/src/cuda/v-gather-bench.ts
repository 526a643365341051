/**
 * V rows without a CPU copy (issue 20, item 4): K selected rows per KV head of a pinned host
 * store (8 KV heads × 131 072 tokens × 128 bf16 = 268 MB) reach the device (a) the CPU stage's
 * way — rows memcpy'd by one thread into a pinned buffer, then one DMA — (b) by a device kernel
 * reading the mapped host memory where the rows live, (c) by one copy per run of consecutive ids.
 * Top-K-like ids (ascending, spread over the store) and a window (the last K slots).
 * Usage: bun v-gather-bench.js [--iters 20]
 */
import { createCudaBackend, cudaAvailability, describeCudaAvailability } from "@hybridgen/kernels-cuda";
import { arg } from "../args.js";
import { cudaLab } from "@hybridgen/kernels-cuda/lab";

const iters = Number(arg("iters", "20"));
const a = cudaAvailability();
console.log(describeCudaAvailability(a));
if (!a.available) process.exit(1);
const cuda = createCudaBackend({ arenaBytes: 2 ** 30 });
const kvHeads = 8, cap = 131072, rowBytes = 256;
const rows = [
  "| K | ids | bytes | CPU gather (1 thread) ms | its DMA ms | CPU way total ms | mapped-memory kernel ms (GB/s) | copy per run ms (runs/head) | identical |",
  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
];
for (const contiguous of [false, true]) {
  for (const kmax of [64, 256, 1024, 4096]) {
    const r = cudaLab(cuda).gatherBench({ kvHeads, cap, kmax, rowBytes, contiguous, iters });
    const bytes = kvHeads * kmax * rowBytes;
    rows.push(`| ${kmax} | ${contiguous ? "window" : "top-K-like"} | ${(bytes / 2 ** 20).toFixed(2)} MiB | ${r.cpuGatherMs.toFixed(3)} | ${r.dmaMs.toFixed(3)} | ` +
      `${(r.cpuGatherMs + r.dmaMs).toFixed(3)} | ${r.mappedMs.toFixed(3)} (${(bytes / r.mappedMs / 1e6).toFixed(1)}) | ${r.runCopiesMs.toFixed(3)} (${r.runsPerHead}) | ${r.identical ? "yes" : "NO"} |`);
    console.log(rows[rows.length - 1]);
  }
}
console.log(`\n## V rows to the device, ${kvHeads} KV heads × ${cap} tokens × ${rowBytes} B (bf16 × 128), per layer, mean of ${iters}`);
for (const r of rows) console.log(r);
cuda.close();
