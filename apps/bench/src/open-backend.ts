/** The benches' `--backend cpu|cuda`: the CPU backend, or the CUDA one (loaded only when asked for, so a CPU run needs no CUDA library). */
import type { Backend } from "@hybridgen/core";
import { createCpuBackend } from "@hybridgen/kernels-cpu";
import type { CudaBackendOptions } from "@hybridgen/kernels-cuda";

/** The backend `name` names ("cpu", else CUDA with `cuda` options); throws with the reason when no GPU is usable. */
export async function openBackend(name: string, cuda: CudaBackendOptions = {}): Promise<Backend & { memory?: () => { freeBytes: number } }> {
  if (name === "cpu") return createCpuBackend({});
  const { createCudaBackend, cudaAvailability, describeCudaAvailability } = await import("@hybridgen/kernels-cuda");
  const avail = cudaAvailability();
  if (!avail.available) throw new Error(describeCudaAvailability(avail));
  return createCudaBackend(cuda);
}
