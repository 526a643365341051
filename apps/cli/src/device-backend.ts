/**
 * `--device auto|cpu|cuda`: which backend runs the model. auto takes the GPU when CUDA is
 * usable and otherwise the CPU, keeping the reason so the CLI can say why it fell back.
 * Hybrid attention runs its device side on either (on CUDA its KV store and CPU stage live in
 * host memory, see hybrid-options.ts), so auto decides the same way for it.
 */
import { existsSync } from "node:fs";
import type { Backend } from "@hybridgen/core";

export type DeviceChoice = "auto" | "cpu" | "cuda";

export interface OpenedBackend {
  readonly backend: Backend;
  /** "cpu/avx2" or "cuda/NVIDIA H200". */
  readonly device: string;
  /** Why auto did not take the GPU, in a few words (null when it did, or when cpu/cuda was asked for). */
  readonly fallback: string | null;
  /** The full reason behind `fallback` (the CUDA error), for --verbose. */
  readonly fallbackDetail: string | null;
  readonly threads: number;
}

/** `gpuMem`: bytes of device memory the backend may use (the CUDA arena; the CPU backend's cap on its "device" memory). */
export async function openBackend(choice: DeviceChoice, threads: number | undefined, _hybrid = false, gpuMem?: number): Promise<OpenedBackend> {
  let fallback: string | null = null;
  if (choice === "cuda" || choice === "auto") {
    const cuda = await import("@hybridgen/kernels-cuda");
    const a = cuda.cudaAvailability();
    if (a.available || choice === "cuda") {
      try {
        const backend = cuda.createCudaBackend(gpuMem === undefined ? {} : { arenaBytes: gpuMem }); // throws "CUDA unavailable: …" for --device cuda
        return { backend, device: `cuda/${backend.device.name}`, fallback: null, fallbackDetail: null, threads: 1 };
      } catch (e) {
        if (choice === "cuda") throw e;
        fallback = e instanceof Error ? e.message : String(e);
      }
    } else {
      fallback = a.reason;
    }
  }
  const { createCpuBackend } = await import("@hybridgen/kernels-cpu");
  const backend = createCpuBackend({ ...(threads === undefined ? {} : { threads }), ...(gpuMem === undefined ? {} : { memoryCapBytes: gpuMem }) });
  return { backend, device: `cpu/${backend.isa}`, fallback: fallback === null ? null : fallbackSummary(), fallbackDetail: fallback, threads: backend.threads };
}

/** A machine with an NVIDIA GPU and driver has these device nodes. */
const gpuPresent = (): boolean => existsSync("/dev/nvidiactl") || existsSync("/dev/nvidia0");

/** What most users need to know when auto runs on the CPU; the CUDA error is the detail. */
function fallbackSummary(): string {
  return gpuPresent() ? "the GPU is not usable: running on the CPU (--verbose says why)" : "no GPU found: running on the CPU";
}

/** "1 thread", "2 threads". */
export const threadCount = (n: number): string => `${n} thread${n === 1 ? "" : "s"}`;
