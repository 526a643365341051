/**
 * A decode layer's four GEMVs (8B shapes, bf16) launched eagerly a few times each, with the
 * weight-stream GEMV (this device's plan) and with the one-warp GEMV (an sm_80 plan), in a small arena: a target for Nsight Compute
 * (`ncu --kernel-name regex:'gemv_stream|gemv_fused' …`), which backs up the whole arena per
 * replay, so the bench's 130 GB arena is no use there. Prints the µs of each launch set.
 * Usage: bun gemv-profile.js [--reps 2]
 */
import { createCudaBackend, cudaAvailability, describeCudaAvailability } from "@hybridgen/kernels-cuda";
import { writeRepeating } from "./fill.js";
import { cudaLab } from "@hybridgen/kernels-cuda/lab";

const i = process.argv.indexOf("--reps");
const reps = i >= 0 ? Number(process.argv[i + 1]) : 2;
const a = cudaAvailability();
console.log(describeCudaAvailability(a));
if (!a.available) process.exit(1);
const cuda = createCudaBackend({ arenaBytes: 2 * 2 ** 30 });
const chunk = Float32Array.from({ length: 1 << 20 }, (_, j) => Math.sin(j * 12.9898) * 0.05);
const fill = (m: number, k: number) => {
  const w = cuda.alloc([m, k], "bf16");
  writeRepeating(cuda, w, chunk, m * k);
  return w;
};
const [wo, wgu, wd, wqkv] = [fill(4096, 4096), fill(28672, 4096), fill(4096, 14336), fill(6144, 4096)];
const nw = cuda.alloc([4096], "bf16");
cuda.write(nw, chunk.subarray(0, 4096).map((v) => 1 + v));
const xr = cuda.alloc([1, 4096]), att = cuda.alloc([1, 4096]), h = cuda.alloc([1, 14336]), qkv = cuda.alloc([1, 6144]);
cuda.write(xr, chunk.subarray(0, 4096));
cuda.write(att, chunk.subarray(4096, 8192));
for (const major of [null, 8] as const) {
  cudaLab(cuda).setPlanMajor(major === null ? null : Math.min(major, cuda.device.major));
  using t = cuda.timer();
  t.mark();
  for (let r = 0; r < reps; r++) {
    cuda.matvec(xr, att, wo, { accumulate: true });
    cuda.matvec(h, xr, wgu, { normWeight: nw, normEps: 1e-5, siluMul: true });
    cuda.matvec(xr, h, wd, { accumulate: true });
    cuda.matvec(qkv, xr, wqkv, { normWeight: nw, normEps: 1e-5 });
  }
  t.mark();
  console.log(`plan for sm_${major ?? cuda.device.major}x: ${((t.ms() / reps) * 1e3).toFixed(1)} µs a layer's four GEMVs (eager launches)`);
}
cuda.close();
