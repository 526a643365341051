/** The benches' `--backend cpu|cuda|NAME`: a backend opened through the runtime's registry (CUDA loaded only when asked for). */
import type { Backend } from "@hybridgen/core";
import { openBackend as openRegistered } from "@hybridgen/runtime";
import type { CudaBackendOptions } from "@hybridgen/kernels-cuda";

/** The backend `name` names, with `cuda` options for the CUDA one; throws with the reason when it cannot open. */
export async function openBackend(name: string, cuda: CudaBackendOptions = {}): Promise<Backend & { memory?: () => { freeBytes: number } }> {
  return (await openRegistered(name, name === "cuda" ? { options: cuda } : {})).backend;
}
