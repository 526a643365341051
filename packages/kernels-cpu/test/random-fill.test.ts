/**
 * The native random fill reproduces core's TypeScript fill bit for bit (f32, f16, bf16),
 * whatever the thread count and split, and rejects bad arguments with one-line errors.
 */
import { describe, expect, it } from "vitest";
import { HybridgenError, type DType } from "@hybridgen/spec";
import { fillKey, randomFillTs, fillValue } from "@hybridgen/spec/kit";
import { createNativeRandomFill } from "../src/index.js";

const SIZES: Record<DType, number> = { f32: 4, f16: 2, bf16: 2 };

describe("native random fill", () => {
  for (const dtype of ["f32", "bf16", "f16"] as const) {
    it(`matches the TypeScript fill bit for bit (${dtype})`, () => {
      let seed = 12345;
      for (const [count, scale, offset, threads] of [
        [1, 1, 0, 1], [777, 0.05, 1, 1], [200_003, 3.5, -0.25, 2], [1 << 17, 1e-3, 0, 3], [65_537, 60000, 0, 2],
      ] as const) {
        seed = (seed * 1103515245 + 12345) >>> 0;
        const params = { key: fillKey(seed, `layer.${count}.weight`), scale, offset };
        const ts = new Uint8Array(count * SIZES[dtype]);
        const nat = new Uint8Array(count * SIZES[dtype]);
        randomFillTs(ts, dtype, params);
        createNativeRandomFill(threads)(nat, dtype, params);
        expect(Buffer.compare(Buffer.from(ts), Buffer.from(nat)), `${dtype} count ${count} threads ${threads}`).toBe(0);
        if (dtype === "f32") {
          const v = new Float32Array(nat.buffer);
          for (const i of [0, count >> 1, count - 1]) expect(v[i]).toBe(fillValue(params, i));
          // uniform in [offset - scale, offset + scale): the values spread over the range
          let lo = Infinity, hi = -Infinity;
          for (const x of v) (lo = Math.min(lo, x)), (hi = Math.max(hi, x));
          expect(lo).toBeGreaterThanOrEqual(offset - scale);
          expect(hi).toBeLessThan(offset + scale);
          if (count > 1000) expect(hi - lo).toBeGreaterThan(1.9 * scale);
        }
      }
    });
  }

  it("rejects bad arguments", () => {
    const fill = createNativeRandomFill(2);
    expect(() => fill(new Uint8Array(3), "f32", { key: 1, scale: 1, offset: 0 })).toThrow(HybridgenError);
    expect(() => fill(new Uint8Array(3), "f32", { key: 1, scale: 1, offset: 0 })).toThrow(/not a whole number of f32 elements/);
    expect(() => fill(new Uint8Array(4), "f32", { key: -1, scale: 1, offset: 0 })).toThrow(/key must be a u32/);
    expect(() => fill(new Uint8Array(4), "f32", { key: 1, scale: NaN, offset: 0 })).toThrow(/finite/);
    expect(() => fill(new Uint8Array(4), "i8" as DType, { key: 1, scale: 1, offset: 0 })).toThrow(/unsupported dtype/);
    expect(() => createNativeRandomFill(0)).toThrow(/threads/);
  });
});
