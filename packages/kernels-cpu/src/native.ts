/** Loads libhgcpu.so through bun:ffi. One library per process, opened on first use. */
import { dlopen, FFIType } from "bun:ffi";
import { existsSync } from "node:fs";
import { fail } from "@hybridgen/spec";
import { resolveNativeLibrary } from "@hybridgen/spec/kit";

const { ptr, i32, i64, i64_fast, u64, f32, f64, void: none } = FFIType;

const symbols = {
  hg_cpu_features: { args: [], returns: i32 },
  hg_best_isa: { args: [], returns: i32 },
  hg_online_cpus: { args: [], returns: i32 },
  hg_create: { args: [i32, i32], returns: ptr },
  hg_destroy: { args: [ptr], returns: none },
  hg_ctx_isa: { args: [ptr], returns: i32 },
  hg_ctx_threads: { args: [ptr], returns: i32 },
  hg_alloc: { args: [u64], returns: ptr },
  hg_free: { args: [ptr, u64], returns: none },
  hg_convert: { args: [ptr, ptr, i32, ptr, i32, i64], returns: none },
  hg_embedding: { args: [ptr, ptr, ptr, i32, i32, ptr, i32], returns: none },
  hg_matmul: { args: [ptr, ptr, ptr, ptr, i32, ptr, i32, i32, i32, i32], returns: none },
  hg_rmsnorm: { args: [ptr, ptr, ptr, ptr, i32, i32, i32, f32], returns: i32 },
  hg_layernorm: { args: [ptr, ptr, ptr, ptr, i32, ptr, i32, i32, i32, f32], returns: i32 },
  hg_rope: { args: [ptr, ptr, i32, i32, ptr, i32, i32, ptr, ptr, i32], returns: none },
  hg_silu_mul: { args: [ptr, ptr, ptr, ptr, i64], returns: none },
  hg_relu: { args: [ptr, ptr, i64], returns: none },
  hg_gelu: { args: [ptr, ptr, i64], returns: none },
  hg_add: { args: [ptr, ptr, ptr, ptr, i64], returns: none },
  hg_softmax: { args: [ptr, ptr, i32, i32, i32], returns: none },
  hg_argmax: { args: [ptr, ptr, i64], returns: i64_fast },
  hg_check_slots: { args: [ptr, i64, i64], returns: i64_fast },
  hg_attn_logits: {
    args: [ptr, ptr, i32, ptr, ptr, i32, i32, i32, i32, i64, i64, ptr, i64, f32],
    returns: i32,
  },
  hg_attn_aggregate: {
    args: [ptr, ptr, ptr, i32, ptr, i32, i32, i32, i32, i64, i64, ptr, i64, i32],
    returns: i32,
  },
  hg_attn_partial: { args: [ptr, ptr, ptr, ptr, ptr, i32, i32, i32, i32, i64, ptr, i32, f32], returns: i32 },
  hg_attn_merge: { args: [ptr, ptr, ptr, ptr, i32, ptr, i32, i32, i32, i32, i64, i64, i64], returns: i32 },
  hg_stream_sum: { args: [ptr, ptr, u64], returns: f64 },
  hg_pool_probe: { args: [ptr], returns: i32 },
} as const;

export type NativeLib = ReturnType<typeof dlopen<typeof symbols>>["symbols"];

/**
 * Absolute path of the library: $HYBRIDGEN_KERNELS_CPU_LIB, else one built here (../lib/), else
 * the prebuilt one shipped for this platform (../prebuilds/<platform>-<arch>/).
 */
export function nativeLibraryPath(): string {
  const built = new URL("../lib/libhgcpu.so", import.meta.url);
  const prebuilt = new URL(`../prebuilds/${process.platform}-${process.arch}/libhgcpu.so`, import.meta.url);
  return resolveNativeLibrary("HYBRIDGEN_KERNELS_CPU_LIB", existsSync(built) || !existsSync(prebuilt) ? built : prebuilt);
}

/**
 * dlopen of libhgcpu.so for one module's symbols (the backend's, the CPU stage's, the random
 * fill's), with one error message for a missing or unloadable library.
 */
export function openNativeSymbols<S extends Record<string, { args: readonly FFIType[]; returns: FFIType }>>(syms: S): ReturnType<typeof dlopen<S>>["symbols"] {
  const path = nativeLibraryPath();
  if (!existsSync(path)) {
    fail(
      `kernels-cpu: native library not found at ${path} and none prebuilt for ${process.platform}-${process.arch}; ` +
        `build it with 'node scripts/build-native.mjs' in the package (needs gcc), or set HYBRIDGEN_KERNELS_CPU_LIB`,
      "ENATIVE",
    );
  }
  try {
    return dlopen(path, syms).symbols;
  } catch (e) {
    fail(`kernels-cpu: cannot load ${path}: ${(e as Error).message.split("\n")[0]} (an older build? run 'bun run build' in packages/kernels-cpu)`, "ENATIVE");
  }
}

let lib: NativeLib | undefined;

export function native(): NativeLib {
  lib ??= openNativeSymbols(symbols);
  return lib;
}
