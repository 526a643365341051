/** Device-script helper: fills the first n elements of a tensor with `chunk` repeated (written a chunk at a time). */
import type { Tensor } from "@hybridgen/core";
import type { CudaBackend } from "@hybridgen/kernels-cuda";

export function writeRepeating(cuda: CudaBackend, t: Tensor, chunk: Float32Array, n: number): void {
  for (let off = 0; off < n; off += chunk.length) cuda.write(t, chunk.subarray(0, Math.min(chunk.length, n - off)), off);
}
