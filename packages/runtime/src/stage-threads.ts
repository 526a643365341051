import { availableParallelism } from "node:os";

/**
 * The CPU stage's threads by default: one on a host backend (the stage runs beside the model on the
 * same cores), and beside a device every core but three — the driving thread that issues the
 * device's work and the CUDA runtime's and the JS runtime's own threads keep a core each. The stage's
 * ops are fork-join, so a worker that loses its core mid-op stalls the whole op: on the H200's 16-core
 * host a 32K step took 1.1–2.5× longer on 15 threads than on 11–13 (kernels-cuda DEVICE-NOTES).
 */
export function defaultStageThreads(device: boolean, cores: number = availableParallelism()): number {
  return device ? Math.max(1, cores - 3) : 1;
}
