/**
 * Why the CUDA library is missing, in words that fit the machine: set-up builds it only where a
 * GPU is found, so on a machine with nvcc but no GPU "needs nvcc" would send a newcomer after the
 * wrong thing.
 */
import { existsSync } from "node:fs";
import { delimiter, join } from "node:path";

export interface BuildEnvironment {
  /** nvcc was found (CUDA_HOME/bin, PATH, /usr/local/cuda/bin). */
  readonly nvcc: boolean;
  /** An NVIDIA device node exists (a GPU the driver sees). */
  readonly gpu: boolean;
}

/** nvcc and a GPU as this machine has them (no process is started). */
export function buildEnvironment(env: NodeJS.ProcessEnv = process.env): BuildEnvironment {
  const dirs = [...(env.CUDA_HOME ? [join(env.CUDA_HOME, "bin")] : []), ...(env.PATH ?? "").split(delimiter).filter(Boolean), "/usr/local/cuda/bin"];
  return { nvcc: dirs.some((d) => existsSync(join(d, "nvcc"))), gpu: existsSync("/dev/nvidiactl") || existsSync("/dev/nvidia0") };
}

/** "the CUDA library is not built (PATH is missing: …)" with the step that would build it here. */
export function notBuiltReason(path: string, env: BuildEnvironment = buildEnvironment()): string {
  const why = !env.nvcc
    ? "building it needs nvcc (the CUDA toolkit)"
    : !env.gpu
      ? "set-up builds it only where a GPU is found, and this machine has none (HYBRIDGEN_BUILD_CUDA=1 builds it anyway)"
      : "run npm run setup, or bun run build in packages/kernels-cuda";
  return `the CUDA library is not built (${path} is missing: ${why})`;
}
