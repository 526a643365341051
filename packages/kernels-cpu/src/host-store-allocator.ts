/**
 * The offloaded KV store of a capped CPU backend in host memory outside its cap (allocHost): the
 * CPU backend stands in for a smaller GPU, and beside a real one the store lives in host memory.
 */
import { SPEC_VERSION, HybridgenError, type Backend, type DType, type KvStoreAllocator, type Tensor } from "@hybridgen/spec";
import { CpuBackend } from "./cpu-backend.js";

export function hostStoreAllocator(): KvStoreAllocator {
  return {
    spec: SPEC_VERSION,
    alloc(backend: Backend, _pool: "k" | "v", _layer: number, shape: readonly number[], dtype: DType): Tensor {
      if (!(backend instanceof CpuBackend)) throw new HybridgenError(`hostStoreAllocator: the store of a ${backend.name} backend's cache is not the CPU backend's`, "EBADARG");
      return backend.allocHost(shape, dtype);
    },
    pinnable: () => true,
    release: () => {},
  };
}
