import { describe, expect, it } from "vitest";
import { HybridgenError, seededRandom } from "@hybridgen/spec";
import { ARENA_ALIGN, DeviceArena } from "../src/arena.js";

const SEED = Number(process.env.HG_TEST_SEED ?? Date.now() % 2 ** 31);
const rng = (seed: number) => seededRandom(seed ^ SEED);

describe(`DeviceArena (seed ${SEED})`, () => {
  it("hands out aligned, disjoint blocks and coalesces everything back on free", () => {
    const cap = 1 << 24;
    const arena = new DeviceArena(cap);
    const r = rng(1);
    const live = new Map<number, number>(); // offset -> requested bytes
    for (let step = 0; step < 4000; step++) {
      if (live.size > 0 && r() < 0.45) {
        const keys = [...live.keys()];
        const off = keys[Math.floor(r() * keys.length)];
        arena.release(off);
        live.delete(off);
      } else {
        const bytes = Math.floor(r() * r() * 200_000) + 1;
        let off: number;
        try {
          off = arena.allocate(bytes, "test block");
        } catch (e) {
          expect(e).toBeInstanceOf(HybridgenError);
          continue;
        }
        expect(off % ARENA_ALIGN).toBe(0);
        expect(off + bytes).toBeLessThanOrEqual(cap);
        for (const [o, b] of live) expect(off + bytes <= o || o + b <= off).toBe(true);
        live.set(off, bytes);
      }
      const s = arena.stats();
      expect(s.usedBytes + s.freeBytes).toBe(cap);
      expect(s.liveBlocks).toBe(live.size);
    }
    for (const off of live.keys()) arena.release(off);
    const s = arena.stats();
    expect(s).toMatchObject({ usedBytes: 0, freeBytes: cap, largestFreeBytes: cap, liveBlocks: 0 });
    expect(s.peakBytes).toBeGreaterThan(0);
  });

  it("an allocation that does not fit names what was asked and what is free", () => {
    const arena = new DeviceArena(10 * 1024);
    arena.allocate(4000, "a");
    expect(() => arena.allocate(9000, "loadWeight of bf16[4096x4096]")).toThrow(
      /^CUDA out of memory: loadWeight of bf16\[4096x4096\] needs 9000 bytes, but the device arena has 6144 bytes free of 10240$/,
    );
    // Free space split in two: the message says it is fragmented.
    const b = arena.allocate(2048, "b");
    arena.allocate(2048, "c");
    arena.release(b);
    expect(() => arena.allocate(3000, "d")).toThrow(/4096 bytes free of 10240 \(fragmented: the largest free block is 2048 bytes\)/);
  });

  it("rejects releasing a block twice or a bad size", () => {
    const arena = new DeviceArena(4096);
    const off = arena.allocate(10, "x");
    arena.release(off);
    expect(() => arena.release(off)).toThrow(/no live block at offset 0/);
    expect(() => arena.allocate(-1, "y")).toThrow(/bad allocation size -1/);
    expect(() => arena.allocate(1.5, "y")).toThrow(/bad allocation size 1.5/);
  });
});
