import { describe, expect, it } from "vitest";
import { createCpuBackend, hostStoreAllocator } from "../src/index.js";

describe("memoryCapBytes: the CPU backend standing in for a smaller device", () => {
  it("counts weights and allocations, refuses one past the cap naming the numbers, and frees give the bytes back", () => {
    using be = createCpuBackend({ threads: 1, memoryCapBytes: 4096 });
    const w = be.loadWeight(new Uint8Array(1024), "f32", [256]);
    const a = be.alloc([512], "f32"); // 2048 bytes
    expect(be.memoryInUseBytes).toBe(3072);
    expect(() => be.alloc([512], "f32")).toThrow(/out of device memory: alloc of f32\[512\] needs 2048 bytes, but 3072 of the 4096-byte cap are in use/);
    expect(be.memoryInUseBytes).toBe(3072);
    be.free(a);
    expect(be.memoryInUseBytes).toBe(1024);
    const b = be.alloc([768], "f32"); // 3072: exactly the cap
    expect(be.memoryInUseBytes).toBe(4096);
    be.free(b);
    be.free(w);
    expect(be.memoryInUseBytes).toBe(0);
  });

  it("allocHost and the host store allocator are outside the cap", () => {
    using be = createCpuBackend({ threads: 1, memoryCapBytes: 1024 });
    const h = be.allocHost([4096], "bf16");
    const s = hostStoreAllocator().alloc(be, "k", 0, [2, 1024, 4], "bf16");
    expect(be.memoryInUseBytes).toBe(0);
    be.write(s, new Float32Array([1.5, 2]));
    expect(Array.from(be.read(s, 0, 2))).toEqual([1.5, 2]);
    be.alloc([256], "f32"); // the whole cap is still there
    be.free(h);
    be.free(s);
  });

  it("no cap: allocations are counted but never refused", () => {
    using be = createCpuBackend({ threads: 1 });
    expect(be.memoryCapBytes).toBeNull();
    be.alloc([1 << 16], "f32");
    expect(be.memoryInUseBytes).toBe(1 << 18);
  });
});
