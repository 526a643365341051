import { resolveNativeLibrary } from "@hybridgen/spec/kit";

export const CUDA_LIBRARY_ENV = "HYBRIDGEN_KERNELS_CUDA_LIB";

/** Absolute path of the native library: an explicit path, $HYBRIDGEN_KERNELS_CUDA_LIB, else ../lib/libhgcuda.so beside this module. */
export function cudaLibraryPath(explicit?: string): string {
  return resolveNativeLibrary(CUDA_LIBRARY_ENV, new URL("../lib/libhgcuda.so", import.meta.url), explicit);
}
