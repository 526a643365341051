import { availableParallelism } from "node:os";

/**
 * The CPU stage's threads by default: one on a host backend (the stage runs beside the model on the
 * same cores), and beside a device every core but three — the driving thread that issues the
 * device's work and the CUDA runtime's and the JS runtime's own threads keep a core each: the stage's
 * ops are fork-join, so a worker that loses its core mid-op stalls the whole op.
 */
export function defaultStageThreads(device: boolean, cores: number = availableParallelism()): number {
  return device ? Math.max(1, cores - 3) : 1;
}
