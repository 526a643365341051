import { isAbsolute, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const CUDA_LIBRARY_ENV = "HYBRIDGEN_KERNELS_CUDA_LIB";

/** Absolute path of the native library: an explicit path, $HYBRIDGEN_KERNELS_CUDA_LIB, else ../lib/libhgcuda.so beside this module. */
export function cudaLibraryPath(explicit?: string): string {
  const chosen = explicit ?? process.env[CUDA_LIBRARY_ENV];
  if (chosen) return isAbsolute(chosen) ? chosen : resolve(chosen); // dlopen wants an absolute path
  return fileURLToPath(new URL("../lib/libhgcuda.so", import.meta.url));
}
