/** Helpers shared by the bench scripts: a robust time per call, and tensors of smooth values. */
import type { Backend, DType, Tensor } from "@hybridgen/spec";

/**
 * Seconds per call: after `warmup` calls, calls run in batches of at least 2 ms until `budget`
 * seconds have passed; the result is the fastest batch's mean, so other processes on a shared
 * machine disturb it less than they would a plain mean.
 */
export function bestSeconds(fn: () => void, budget: number, warmup: number): number {
  for (let i = 0; i < warmup; i++) fn();
  let perBatch = 1;
  let best = Infinity;
  const start = Bun.nanoseconds();
  while ((Bun.nanoseconds() - start) / 1e9 < budget) {
    const t0 = Bun.nanoseconds();
    for (let i = 0; i < perBatch; i++) fn();
    const dt = (Bun.nanoseconds() - t0) / 1e9;
    best = Math.min(best, dt / perBatch);
    if (dt < 0.002) perBatch *= 2;
  }
  return best;
}

/** A tensor holding 0.5 · sin(i · step) (no zeros, no denormals), written in 1M-value chunks. */
export function filledTensor(be: Backend, shape: number[], dtype: DType, step: number): Tensor {
  const t = be.alloc(shape, dtype);
  const n = shape.reduce((a, b) => a * b, 1);
  const chunk = new Float32Array(Math.min(n, 1 << 20));
  for (let i = 0; i < chunk.length; i++) chunk[i] = Math.sin(i * step) * 0.5;
  for (let off = 0; off < n; off += chunk.length) be.write(t, chunk.subarray(0, Math.min(chunk.length, n - off)), off);
  return t;
}
