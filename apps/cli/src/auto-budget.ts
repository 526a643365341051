/**
 * `--gpu-kv-budget auto`: the window the GPU's memory holds, from the same arithmetic as
 * `hybridgen plan` (@hybridgen/memtier's gpuWindowTokens): what the device arena has free
 * before the weights load, less the weights, the 2 GiB reserve and the prefill's scratch (two
 * K/V pairs of one layer over the whole context, which loadStore/loadContiguous take), over the
 * KV bytes a token adds. Core's resolveGpuKvBudget caps it at the context.
 */
import { DTYPE_BYTES, GPU_KV_BUDGET_AUTO, HybridgenError, modelInfo, resolveGpuKvBudget, type Backend, type DType, type GpuKvBudget, type ModelFiles } from "@hybridgen/core";

/** Bytes of device memory kept for activations, the hybrid step's staging (candidates·K gathered rows a KV head: MiBs) and the backend's scratch (planRun's default). */
export const GPU_RESERVE_BYTES = 2 * 2 ** 30;

interface ArenaBackend {
  memory(): { readonly freeBytes: number };
}
const hasArena = (b: Backend): b is Backend & ArenaBackend => typeof (b as Partial<ArenaBackend>).memory === "function";

/** The window in tokens for `budget` ("auto" sized from the device's free memory; without one,
 * the whole context for full attention and an error for hybrid attention; a number as given). */
export async function resolveWindowBudget(
  budget: GpuKvBudget | undefined, backend: Backend, files: ModelFiles, o: { maxContext: number; kvDtype?: DType; batch?: number; hybrid?: boolean },
): Promise<number | undefined> {
  if (budget !== GPU_KV_BUDGET_AUTO) return budget;
  if (!hasArena(backend)) {
    if (!o.hybrid) return resolveGpuKvBudget(GPU_KV_BUDGET_AUTO, { maxContext: o.maxContext }); // full attention: every token resident
    throw new HybridgenError(`--gpu-kv-budget auto sizes the window from GPU memory, and ${backend.name} has none: give the window in tokens (--gpu-kv-budget N)`, "EUSAGE");
  }
  const { gpuWindowTokens } = await import("@hybridgen/memtier");
  const shape = files.shape;
  const eb = DTYPE_BYTES[o.kvDtype ?? "f32"];
  const perToken = 2 * shape.layers * shape.kvHeads * shape.headDim * eb;
  const weightsBytes = Object.values(modelInfo(files.config, shape, files.weights).weightBytes).reduce((a, b) => a + (b ?? 0), 0);
  const scratch = 4 * o.maxContext * shape.kvHeads * shape.headDim * eb;
  const fitTokens = gpuWindowTokens({ freeBytes: backend.memory().freeBytes, weightsBytes, reserveBytes: GPU_RESERVE_BYTES + scratch, bytesPerToken: perToken, batch: o.batch ?? 1 });
  if (fitTokens < 1) {
    throw new HybridgenError(`--gpu-kv-budget auto: no room for a window on ${backend.name} (${backend.memory().freeBytes} bytes free, weights ${weightsBytes}, reserve and prefill scratch ${GPU_RESERVE_BYTES + scratch})`);
  }
  return resolveGpuKvBudget(GPU_KV_BUDGET_AUTO, { maxContext: o.maxContext, fitTokens });
}
