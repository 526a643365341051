/**
 * Device checks of cuBLAS GEMMs inside a recorded step (CMD_CUBLAS: matmul's path for 9–32 rows of
 * bf16/f16 weights, and for f32 weights past the GEMV's rows): for bf16 and f32 weights, with and
 * without a bias, a matmul of 12 rows recorded in a step, captured once and replayed twice with new
 * inputs, equals the same matmul run eagerly bit for bit, and nothing drains the step. A batched
 * decode step of 9–32 sequences (full attention or hybrid) records its projections this way.
 * hybrid-bench.ts runs them with its checks (--skip-bench).
 */
import type { Tensor } from "@hybridgen/core";
import type { CudaBackend } from "@hybridgen/kernels-cuda";
import { cudaLab } from "@hybridgen/kernels-cuda/lab";

type Check = (ok: boolean, what: string) => void;

const sameBits = (a: Float32Array, b: Float32Array) => {
  if (a.length !== b.length) return false;
  const bb = new Uint32Array(b.buffer, b.byteOffset, b.length);
  return new Uint32Array(a.buffer, a.byteOffset, a.length).every((x, i) => x === bb[i]);
};
const values = (n: number, seed: number) => Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.37 + seed) * 0.5);

export function recordedGemmChecks(cuda: CudaBackend, check: Check): void {
  const n = 12, k = 512, m = 384;
  for (const dtype of ["bf16", "f32"] as const) {
    for (const withBias of [false, true]) {
      const what = `cuBLAS matmul of ${n} rows, ${dtype} weights${withBias ? ", bias" : ""}`;
      const w = cuda.alloc([m, k], dtype), x = cuda.alloc([n, k]), eager = cuda.alloc([n, m]), rec = cuda.alloc([n, m]);
      const bias: Tensor | undefined = withBias ? cuda.alloc([m], dtype) : undefined;
      try {
        cuda.write(w, values(m * k, 1));
        if (bias) cuda.write(bias, values(m, 2));
        const before = cudaLab(cuda).graphStats();
        let same = true;
        for (let step = 0; step < 3; step++) {
          cuda.write(x, values(n * k, 10 + step));
          cuda.matmul(eager, x, w, n, bias);
          const want = cuda.read(eager);
          cuda.beginStep(`recorded-gemm-${dtype}-${withBias}`);
          cuda.matmul(rec, x, w, n, bias);
          cuda.endStep();
          same &&= sameBits(cuda.read(rec), want);
        }
        const after = cudaLab(cuda).graphStats();
        const d = [after.captures - before.captures, after.replays - before.replays, after.drained - before.drained];
        check(same && d[0] === 1 && d[1] === 2 && d[2] === 0,
          `${what}: recorded (1 capture, 2 replays with new inputs) equals eager bit for bit: ${same}; captures ${d[0]}, replays ${d[1]}, drained ${d[2]} (last drain: ${after.lastDrain || "none"})`);
      } finally {
        for (const t of [w, x, eager, rec, bias]) if (t) cuda.free(t);
      }
    }
  }
}
