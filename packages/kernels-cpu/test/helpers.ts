/** Test helpers: a seeded PRNG, f16/bf16 encoders, the backends under test, and comparisons. */
import { expect } from "vitest";
import { seededRandom, type DType } from "@hybridgen/spec";
import { createCpuBackend, cpuFeatures, type CpuBackend, type Isa } from "../src/index.js";

/** Fresh inputs each run; set HG_TEST_SEED to replay a failure (the seed is in every message). */
export const SEED = Number(process.env.HG_TEST_SEED ?? (Date.now() % 2 ** 31));

/** Seeded PRNG (core's mulberry32) on `seed ^ SEED`, so each run draws fresh inputs. */
export function rng(seed: number): () => number {
  return seededRandom(seed ^ SEED);
}

/** Uniform values in [-scale, scale). */
export function randn(r: () => number, count: number, scale = 1): Float32Array {
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) out[i] = (r() * 2 - 1) * scale;
  return out;
}

const f32View = new Float32Array(1);
const u32View = new Uint32Array(f32View.buffer);

/** f32 -> bf16 bits, round to nearest even (the reference the C code must match). */
export function bf16Bits(x: number): number {
  f32View[0] = x;
  const u = u32View[0];
  if ((u & 0x7fffffff) > 0x7f800000) return ((u >>> 16) | 0x40) & 0xffff;
  return ((u + 0x7fff + ((u >>> 16) & 1)) >>> 16) & 0xffff;
}

export function bf16Value(bits: number): number {
  u32View[0] = bits << 16;
  return f32View[0];
}

/** Encodes values as `dtype` bytes and returns them with the values they decode to. */
export function encode(values: Float32Array, dtype: DType): { bytes: Uint8Array; decoded: Float64Array } {
  const decoded = new Float64Array(values.length);
  if (dtype === "f32") {
    decoded.set(values);
    return { bytes: new Uint8Array(values.slice().buffer), decoded };
  }
  if (dtype === "f16") {
    const h = new Float16Array(values);
    decoded.set(h);
    return { bytes: new Uint8Array(h.buffer), decoded };
  }
  const b = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) {
    b[i] = bf16Bits(values[i]);
    decoded[i] = bf16Value(b[i]);
  }
  return { bytes: new Uint8Array(b.buffer), decoded };
}

/** ISAs this CPU can run: every test runs on each of them. */
export function supportedIsas(): Isa[] {
  const f = cpuFeatures();
  const out: Isa[] = ["generic"];
  if (f.avx2) out.push("avx2");
  if (f.avx512) out.push("avx512");
  return out;
}

export interface Config {
  isa: Isa;
  threads: number;
}

export const CONFIGS: Config[] = supportedIsas().flatMap((isa) => [1, 2].map((threads) => ({ isa, threads })));

export function backend(c: Config): CpuBackend {
  return createCpuBackend({ isa: c.isa, threads: c.threads });
}

/**
 * Expects |got - want| <= tol[i] elementwise, reporting the worst element and the seed.
 * `tol` is a per-element bound (scaled to each value's magnitude by the caller).
 */
export function expectClose(got: ArrayLike<number>, want: ArrayLike<number>, tol: ArrayLike<number> | number, what: string): void {
  expect(got.length, `${what}: length`).toBe(want.length);
  let worst = -1;
  let worstExcess = 0;
  for (let i = 0; i < want.length; i++) {
    const t = typeof tol === "number" ? tol : tol[i];
    const excess = got[i] === want[i] ? 0 : Math.abs(got[i] - want[i]) - t;
    if (!(excess <= 0) && (worst < 0 || excess > worstExcess || Number.isNaN(excess))) {
      worst = i;
      worstExcess = excess;
    }
  }
  if (worst >= 0) {
    const t = typeof tol === "number" ? tol : tol[worst];
    expect.fail(`${what} (seed ${SEED}): element ${worst} is ${got[worst]}, expected ${want[worst]} ± ${t}`);
  }
}
