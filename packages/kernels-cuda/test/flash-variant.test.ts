/**
 * The prefill-attention kernel switch (hg_cu_flash_variant) and the wgmma capability probe are
 * host code, so they are tested wherever the library is built (CI builds it with nvcc), GPU or not.
 * The kernels themselves are checked on the GPU (device/flash-bench.ts, device/op-checks.ts).
 */
import { existsSync } from "node:fs";
import { dlopen, FFIType } from "bun:ffi";
import { describe, expect, it } from "vitest";
import { cudaLibraryPath } from "../src/index.js";

const path = cudaLibraryPath();
const V1 = 1, V2_64 = 2, V2_128 = 3, V3 = 5, V3_ALL = 7; // V1: a retired kernel's code

describe.skipIf(!existsSync(path))("flash kernel switch", () => {
  it("sets each variant, ignores unknown and retired ids, and 0 restores the default (v3)", () => {
    const lib = dlopen(path, {
      hg_cu_flash_variant: { args: [FFIType.i32], returns: FFIType.i32 },
      hg_cu_flash_wgmma: { args: [], returns: FFIType.i32 },
    });
    try {
      const f = lib.symbols.hg_cu_flash_variant;
      for (const v of [V2_64, V2_128, V3_ALL]) expect(f(v)).toBe(v);
      expect(f(-1)).toBe(V3_ALL); // a query changes nothing
      expect(f(99)).toBe(V3_ALL); // out of range: ignored
      expect(f(V1)).toBe(V3_ALL); // v1 is gone: ignored like an unknown id
      expect(f(0)).toBe(V3);
      // 1 only on a compute-capability 9.0 device; a machine without a GPU says 0.
      expect([0, 1]).toContain(lib.symbols.hg_cu_flash_wgmma());
    } finally {
      lib.close();
    }
  });
});
