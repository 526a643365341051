/**
 * µs a launch in a step graph: `body(l)` for l < layers recorded as one decode step (each layer
 * on its own weights or K/V, so L2 holds none of it), replayed `reps` times after two warm-up
 * steps (capture, first replay); includes each launch's boundary to the next. Shared by the benches.
 */
import type { CudaBackend } from "@hybridgen/kernels-cuda";

export function inGraphUs(cuda: CudaBackend, key: string, body: (l: number) => void, layers = 32, reps = 10): number {
  const once = () => {
    cuda.beginStep(key);
    for (let l = 0; l < layers; l++) body(l);
    cuda.endStep();
  };
  once();
  once();
  using t = cuda.timer();
  t.mark();
  for (let r = 0; r < reps; r++) once();
  t.mark();
  return (t.ms() / reps / layers) * 1e3;
}
