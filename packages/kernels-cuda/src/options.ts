/**
 * Options of the CUDA backend (issue 5): which device, how much device memory the arena takes
 * once at start-up (no cudaMalloc per step), CUDA graphs and cuBLAS. The stream layout is fixed
 * (one compute stream; one copy stream, made by hostTransfers()), so it has no option. (The
 * hybrid runtime's host buffers belong to the CPU stage and the KV cache; the backend pins them.)
 */
import { z } from "zod";
import { HybridgenError } from "@hybridgen/spec";
import type { CudaAvailability } from "./availability.js";
import type { CudaDevice } from "./device-record.js";

export const CudaBackendOptionsSchema = z.object({
  /** Device index (after CUDA_VISIBLE_DEVICES). */
  device: z.number().int().nonnegative().default(0),
  /** Bytes of device memory the arena reserves; default: `arenaFraction` of the memory free at start. */
  arenaBytes: z.number().int().positive().optional(),
  arenaFraction: z.number().gt(0).max(0.98).default(0.9),
  /** Capture the decode step in a CUDA graph (one launch per step). */
  cudaGraphs: z.boolean().default(true),
  /** cuBLAS is opened at run time (libcublas.so.13, then .so.12); "off" uses only this package's kernels. */
  cublas: z.enum(["auto", "off"]).default("auto"),
  /** Explicit cuBLAS library to dlopen instead of the search. */
  cublasPath: z.string().min(1).optional(),
  /**
   * Which tensor-core kernel serves prefill attention (bf16/f16, head dim 64/128): auto (v3 on
   * sm_90, v2-64 elsewhere), or one of the others for a bench to compare.
   * Per backend: it is set before each prefill call, so two backends in a process do not mix.
   */
  flash: z.enum(["auto", "v2-64", "v2-64x3", "v2-128", "v3", "v3x3", "v3-all"]).default("auto"),
  /** Native library path (default: $HYBRIDGEN_KERNELS_CUDA_LIB, else lib/libhgcuda.so of this package). */
  libraryPath: z.string().min(1).optional(),
});
export type CudaBackendOptions = z.input<typeof CudaBackendOptionsSchema>;
export type ResolvedCudaBackendOptions = z.output<typeof CudaBackendOptionsSchema>;

export function parseCudaBackendOptions(raw: unknown): ResolvedCudaBackendOptions {
  const r = CudaBackendOptionsSchema.safeParse(raw ?? {});
  if (!r.success) {
    const i = r.error.issues[0];
    throw new HybridgenError(`CUDA backend options: ${i?.path.join(".") || "value"}: ${i?.message ?? "invalid"}`);
  }
  return r.data;
}

/**
 * The device the options ask for, or a one-line HybridgenError: CUDA unavailable (with its
 * reason), an index beyond the devices present, or an arena larger than the device.
 */
export function selectCudaDevice(options: ResolvedCudaBackendOptions, availability: CudaAvailability): CudaDevice {
  if (!availability.available) throw new HybridgenError(availability.reason, "ECUDAUNAVAILABLE");
  const { devices } = availability;
  const device = devices[options.device];
  if (!device) {
    throw new HybridgenError(
      `CUDA device ${options.device} requested, but ${devices.length} present (${devices.map((d) => `${d.index}: ${d.name}`).join(", ")})`,
    );
  }
  if (options.arenaBytes !== undefined && options.arenaBytes > device.totalMemoryBytes) {
    throw new HybridgenError(
      `CUDA arena of ${options.arenaBytes} bytes requested, but device ${device.index} (${device.name}) has ${device.totalMemoryBytes} bytes in all`,
    );
  }
  return device;
}
