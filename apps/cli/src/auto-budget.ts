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

/**
 * The page index's device bytes a token (every layer) when `selector` (a name or a pair like
 * topk+index) ranks an index on the device: placement "device" or "auto" (the planner's charge); 0 otherwise.
 */
export function deviceIndexBytesPerToken(selector: string | undefined, options: Record<string, unknown> | undefined, shape: { layers: number; kvHeads: number; headDim: number }): number {
  if (!selector || !selector.split("+").includes("index") || options?.placement === "host") return 0;
  const pageSize = typeof options?.pageSize === "number" ? options.pageSize : 16, codeBytes = options?.form === "int4" ? shape.headDim : 2 * shape.headDim;
  return (shape.layers * shape.kvHeads * (codeBytes + 4)) / pageSize;
}

/** The window in tokens for `budget` ("auto" sized from the device's free memory; without one,
 * the whole context for full attention and an error for hybrid attention; a number as given).
 * `indexBytesPerToken`: a device page index's bytes an offloaded token, charged beside the window. */
export async function resolveWindowBudget(
  budget: GpuKvBudget | undefined, backend: Backend, files: ModelFiles, o: { maxContext: number; kvDtype?: DType; batch?: number; hybrid?: boolean; indexBytesPerToken?: number },
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
  // A device index covers the offloaded tokens: each token the window gives up costs its index bytes instead.
  const ipt = o.indexBytesPerToken ?? 0, B = o.batch ?? 1;
  const fitTokens = gpuWindowTokens({ freeBytes: backend.memory().freeBytes, weightsBytes, reserveBytes: GPU_RESERVE_BYTES + scratch + Math.ceil(o.maxContext * ipt * B), bytesPerToken: perToken - ipt, batch: B });
  if (fitTokens < 1) {
    throw new HybridgenError(`--gpu-kv-budget auto: no room for a window on ${backend.name} (${backend.memory().freeBytes} bytes free, weights ${weightsBytes}, reserve and prefill scratch ${GPU_RESERVE_BYTES + scratch})`);
  }
  return resolveGpuKvBudget(GPU_KV_BUDGET_AUTO, { maxContext: o.maxContext, fitTokens });
}
