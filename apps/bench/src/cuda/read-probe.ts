/**
 * How fast the GPU streams memory into the SMs, against the decode GEMV: the D2D copy the floors use, plain 16-byte loads, the weight
 * stream's bulk-copy ring with no arithmetic (slot and ring sizes), and the stream GEMV itself at
 * steady state (one 2 GiB matvec, so no kernel boundary counts). If the ring without arithmetic
 * reaches the copy's speed and the GEMV does not, the GEMV's consumers are the limit; if the ring
 * does not either, the copy pattern is. Usage: bun read-probe.js [--gib 2] [--iters 5]
 */
import { createCudaBackend, cudaAvailability, describeCudaAvailability } from "@hybridgen/kernels-cuda";
import { arg } from "../args.js";
import { cudaLab } from "@hybridgen/kernels-cuda/lab";

const bytes = Number(arg("gib", "2")) * 2 ** 30, iters = Number(arg("iters", "5"));
const a = cudaAvailability();
console.log(describeCudaAvailability(a));
if (!a.available) process.exit(1);
const cuda = createCudaBackend({ arenaBytes: 2 * bytes + 2 ** 30 });
const tb = (bps: number) => (bps / 1e12).toFixed(2);
const rows: string[] = ["| probe | TB/s |", "| --- | --- |"];
rows.push(`| D2D copy (read + write), the floors' bandwidth | ${tb(cuda.copyBandwidth(bytes, iters))} |`);
rows.push(`| plain 16-byte loads, grid-stride | ${tb(cudaLab(cuda).readBandwidth({ mode: "loads" }, bytes, iters))} |`);
for (const [slotKb, ringKb] of [[4, 64], [8, 64], [8, 128], [8, 192], [16, 128], [16, 192]] as const)
  rows.push(`| bulk-copy ring, no arithmetic: slots of ${slotKb} KB, ring ${ringKb} KB | ${tb(cudaLab(cuda).readBandwidth({ mode: "bulk", slotKb, ringKb }, bytes, iters))} |`);
{
  // The GEMV at steady state: one bf16 [m, 4096] matvec of `bytes`.
  const k = 4096, m = Math.floor(bytes / (2 * k));
  const w = cuda.alloc([m, k], "bf16"), x = cuda.alloc([1, k]), y = cuda.alloc([1, m]);
  const ones = new Float32Array(1 << 20).fill(0.01);
  for (let off = 0; off < m * k; off += ones.length) cuda.write(w, ones.subarray(0, Math.min(ones.length, m * k - off)), off);
  cuda.write(x, ones.subarray(0, k));
  for (const major of [null, 8] as const) {
    cudaLab(cuda).setPlanMajor(major === null ? null : Math.min(major, cuda.device.major));
    cuda.matvec(y, x, w, {});
    using t = cuda.timer();
    t.mark();
    for (let i = 0; i < iters; i++) cuda.matvec(y, x, w, {});
    t.mark();
    const s = t.ms() / iters / 1e3;
    rows.push(`| decode GEMV ${major === null ? "as planned for this device (sm_90: the weight stream)" : "one warp a row (an sm_80 plan)"}: one [${m}, ${k}] bf16 matvec | ${tb((m * k * 2) / s)} |`);
  }
  for (const t of [w, x, y]) cuda.free(t);
}
console.log(rows.join("\n"));
cuda.close();
