/**
 * `--device auto|cpu|cuda|./my-backend.ts`: which backend runs the model, opened through the
 * runtime's backend registry. auto takes the GPU when CUDA is usable and otherwise the CPU, keeping
 * the reason so the CLI can say why it fell back. Hybrid attention runs its device side on either
 * (on CUDA its KV store and CPU stage live in host memory, see hybrid-options.ts).
 */
import { existsSync } from "node:fs";
import type { Backend } from "@hybridgen/core";
import { openBackendChoice } from "@hybridgen/runtime";

export interface OpenedBackend {
  readonly backend: Backend;
  /** "cpu/avx2" or "cuda/NVIDIA H200". */
  readonly device: string;
  /** Why auto did not take the GPU, in a few words (null when it did, or when a backend was named). */
  readonly fallback: string | null;
  /** The full reason behind `fallback` (each backend passed over and why), for --verbose. */
  readonly fallbackDetail: string | null;
  readonly threads: number;
}

/** `gpuMem`: bytes of device memory the backend may use (the CUDA arena; the CPU backend's cap on its "device" memory). */
export async function openBackend(choice: string, threads: number | undefined, gpuMem?: number): Promise<OpenedBackend> {
  const o = await openBackendChoice(choice, { ...(threads === undefined ? {} : { threads }), ...(gpuMem === undefined ? {} : { memoryBytes: gpuMem }) });
  const passed = o.skipped.length > 0;
  return {
    backend: o.backend, device: o.device, threads: o.threads,
    fallback: passed ? fallbackSummary() : null,
    fallbackDetail: passed ? o.skipped.map((s) => s.reason).join("; ") : null,
  };
}

/** A machine with an NVIDIA GPU and driver has these device nodes. */
const gpuPresent = (): boolean => existsSync("/dev/nvidiactl") || existsSync("/dev/nvidia0");

/** What most users need to know when auto runs on the CPU; the CUDA error is the detail. */
function fallbackSummary(): string {
  return gpuPresent() ? "the GPU is not usable: running on the CPU (--verbose says why)" : "no GPU found: running on the CPU";
}

/** "1 thread", "2 threads". */
export const threadCount = (n: number): string => `${n} thread${n === 1 ? "" : "s"}`;
