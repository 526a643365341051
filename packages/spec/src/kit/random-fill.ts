/**
 * Deterministic random tensor contents, counter-based so any element can be computed on its
 * own: element i of a tensor with key K is
 *
 *   x = lowbias32(K + i·0x9E3779B9 mod 2³²)
 *   v = f32(((x >> 8) − 2²³) · k + offset)    (k, offset f32; the product is exact in f64)
 *
 * i.e. uniform in [offset − 2²³·k, offset + 2²³·k), rounded once to f32 and then to the
 * tensor's dtype (nearest, ties to even). Being counter-based, the fill splits across threads
 * with identical results; the native fill in @hybridgen/kernels-cpu reproduces this one bit
 * for bit, and dummy weights and the parity checkpoints are made with it.
 */
import { DTYPE_BYTES, type DType } from "../backend.js";
import { check } from "../errors.js";
import { f32ToF16Bits } from "../half-float.js";

/** Uniform values in [offset − scale, offset + scale). */
export interface FillParams {
  /** From fillKey(seed, tensor name). */
  readonly key: number;
  readonly scale: number;
  readonly offset: number;
}

/** Fills `out` (little-endian `dtype` elements, out.length a multiple of the element size). */
export type RandomFill = (out: Uint8Array, dtype: DType, params: FillParams) => void;

const GOLDEN = 0x9e3779b9 | 0;

function lowbias32(x: number): number {
  x ^= x >>> 16;
  x = Math.imul(x, 0x7feb352d);
  x ^= x >>> 15;
  x = Math.imul(x, 0x846ca68b | 0);
  x ^= x >>> 16;
  return x >>> 0;
}

/** Per-tensor key: FNV-1a of the name's UTF-8 bytes, mixed with the seed. */
export function fillKey(seed: number, name: string): number {
  check(Number.isInteger(seed) && seed >= 0 && seed <= 0xffffffff, `fill seed must be an integer in [0, 2^32), got ${seed}`);
  let h = 0x811c9dc5 | 0;
  for (const b of new TextEncoder().encode(name)) h = Math.imul(h ^ b, 0x01000193);
  return lowbias32((h ^ lowbias32(seed >>> 0)) >>> 0);
}

/** The f32 step k with 2²³·k ≈ scale (an f32, so the product with a 24-bit integer is exact). */
export function fillStep(scale: number): number {
  return Math.fround(scale / 8388608);
}

/** Element i as f32 (the reference definition; the bulk fill below is the same arithmetic). */
export function fillValue(params: FillParams, i: number): number {
  const x = lowbias32((params.key + Math.imul(i, GOLDEN)) >>> 0);
  return Math.fround(((x >>> 8) - 8388608) * fillStep(params.scale) + Math.fround(params.offset));
}

/** The TypeScript fill (about 100-200 M elements/s on one core). */
export const randomFillTs: RandomFill = (out, dtype, params) => {
  const size = DTYPE_BYTES[dtype];
  check(out.length % size === 0, `random fill: ${out.length} bytes is not a whole number of ${dtype} elements`);
  const n = out.length / size;
  const k = fillStep(params.scale), off = Math.fround(params.offset), key = params.key | 0;
  const dv = new DataView(out.buffer, out.byteOffset, out.byteLength);
  const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
  for (let i = 0; i < n; i++) {
    let x = (key + Math.imul(i, GOLDEN)) | 0;
    x ^= x >>> 16;
    x = Math.imul(x, 0x7feb352d);
    x ^= x >>> 15;
    x = Math.imul(x, 0x846ca68b | 0);
    x ^= x >>> 16;
    f32[0] = ((x >>> 8) - 8388608) * k + off;
    if (dtype === "f32") dv.setFloat32(i * 4, f32[0], true);
    else if (dtype === "bf16") {
      const u = u32[0];
      dv.setUint16(i * 2, (u + 0x7fff + ((u >>> 16) & 1)) >>> 16, true);
    } else dv.setUint16(i * 2, f32ToF16Bits(f32[0]), true);
  }
};
