import { describe, expect, it } from "vitest";
import { CONFIGS, backend, bf16Bits, bf16Value, expectClose, randn, rng } from "./helpers.js";

describe.each(CONFIGS)("memory isa=$isa threads=$threads", (cfg) => {
  it("alloc is zero-filled; write/read round-trips with f16/bf16 rounding to nearest even", () => {
    using be = backend(cfg);
    const r = rng(31);
    // Sizes under and over the parallel conversion threshold; values include f16 subnormals.
    for (const count of [5, 37, 200_003]) {
      const x = randn(r, count, 4);
      x[0] = 3e-6; // f16 subnormal
      x[1] = 70000; // f16 overflow -> inf
      x[2] = -0;
      for (const dtype of ["f32", "f16", "bf16"] as const) {
        const t = be.alloc([count], dtype);
        expectClose(be.read(t), new Float64Array(count), 0, `alloc ${dtype} zero`);
        be.write(t, x);
        const want = dtype === "f32" ? Float64Array.from(x) : dtype === "f16" ? Float64Array.from(new Float16Array(x)) : Float64Array.from(x, (v) => bf16Value(bf16Bits(v)));
        expectClose(be.read(t), want, 0, `round trip ${dtype} count=${count}`);
        expectClose(be.read(t, 3, 2), want.subarray(3, 5), 0, `partial read ${dtype}`);
        be.free(t);
      }
    }
  });

  it("copyRows: same dtype, f32 -> f16/bf16, overlapping rows of one tensor", () => {
    using be = backend(cfg);
    const r = rng(37);
    const x = randn(r, 10 * 19);
    const src = be.alloc([10, 19]);
    be.write(src, x);
    const dst = be.alloc([8, 19], "bf16");
    be.copyRows(dst, 2, src, 5, 4);
    const got = be.read(dst);
    const want = new Float64Array(8 * 19);
    for (let i = 0; i < 4 * 19; i++) want[2 * 19 + i] = bf16Value(bf16Bits(x[5 * 19 + i]));
    expectClose(got, want, 0, "copyRows f32 -> bf16");
    const h = be.alloc([3, 19], "f16");
    be.copyRows(h, 0, src, 0, 3);
    expectClose(be.read(h), Float64Array.from(new Float16Array(x.subarray(0, 57))), 0, "copyRows f32 -> f16");
    be.copyRows(src, 2, src, 0, 6); // overlapping: behaves like memmove
    const moved = Float64Array.from(x);
    moved.set(x.subarray(0, 6 * 19), 2 * 19);
    expectClose(be.read(src), moved, 0, "copyRows overlapping");
  });

  it("loadWeight uses aligned bytes in place and copies misaligned ones", () => {
    using be = backend(cfg);
    const x = randn(rng(41), 24);
    const bytes = new Uint8Array(x.buffer);
    const inPlace = be.loadWeight(bytes, "f32", [4, 6]) as unknown as { owned: boolean };
    expect(inPlace.owned).toBe(false);
    x[0] = 42; // the tensor sees the caller's memory
    expect(be.read(inPlace as never, 0, 1)[0]).toBe(42);
    const shifted = new Uint8Array(24 * 4 + 1);
    shifted.set(bytes, 1);
    const copy = be.loadWeight(shifted.subarray(1), "f32", [24]) as unknown as { owned: boolean };
    expect(copy.owned).toBe(true);
    expectClose(be.read(copy as never), Float64Array.from(x), 0, "misaligned loadWeight");
  });

  it("view aliases part of a tensor at another row width", () => {
    using be = backend(cfg);
    const t = be.alloc([2, 12]);
    const x = randn(rng(43), 24);
    be.write(t, x);
    const v = be.view(t, 4, [4, 3]);
    expect(v.shape).toEqual([4, 3]);
    expectClose(be.read(v), Float64Array.from(x.subarray(4, 16)), 0, "view read");
    be.write(v, new Float32Array([7, 8, 9]), 3);
    expect([...be.read(t, 7, 3)]).toEqual([7, 8, 9]);
    const vv = be.view(v, 3, [3]);
    expect([...be.read(vv)]).toEqual([7, 8, 9]);
    be.free(v); // only the handle
    expect(be.read(t, 7, 1)[0]).toBe(7);
    be.free(t);
    expect(() => be.read(vv)).toThrow(/freed/);
  });

  it("free, double free and close release everything", () => {
    const be = backend(cfg);
    const a = be.alloc([4 << 20]); // large: mmap path
    const b = be.alloc([3, 3], "f16");
    const v = be.view(a, 0, [8]);
    expect(be.liveTensors).toBe(2); // views are handles, not allocations
    be.free(b);
    expect(() => be.free(b)).toThrow(/already freed/);
    expect(be.liveTensors).toBe(1);
    be.close();
    expect(be.closed).toBe(true);
    expect(be.liveTensors).toBe(0);
    expect(() => be.read(a)).toThrow(/closed/);
    expect(() => be.read(v)).toThrow(/closed/);
    expect(() => be.alloc([1])).toThrow(/closed/);
    be.close(); // idempotent
  });
});
