/**
 * f16 / bf16 <-> f32 conversion in plain TypeScript (round to nearest, ties to even), used by
 * the reference backend, by weight conversion at load and by tests. Bulk helpers read
 * little-endian bytes at any alignment (mmap views are not always 4-byte aligned).
 */
import type { DType } from "./backend.js";
import { DTYPE_BYTES } from "./backend.js";
import { check } from "./errors.js";

const scratchF32 = new Float32Array(1);
const scratchU32 = new Uint32Array(scratchF32.buffer);

export function f32ToF16Bits(value: number): number {
  scratchF32[0] = value;
  const x = scratchU32[0];
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 | (mant >>> 13) : 0);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign; // below half the smallest subnormal
    mant |= 0x800000;
    const shift = 14 - e;
    let half = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const mid = 1 << (shift - 1);
    if (rem > mid || (rem === mid && (half & 1))) half++;
    return sign | half;
  }
  let half = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (half & 1))) half++; // a carry may round up to inf: correct
  return sign | half;
}

export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >>> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0) return sign * m * 2 ** -24;
  if (e === 31) return m ? NaN : sign * Infinity;
  return sign * (1 + m / 1024) * 2 ** (e - 15);
}

export function f32ToBf16Bits(value: number): number {
  scratchF32[0] = value;
  const x = scratchU32[0];
  if ((x & 0x7fffffff) > 0x7f800000) return (x >>> 16) | 0x40; // keep NaN a NaN
  return ((x + 0x7fff + ((x >>> 16) & 1)) >>> 16) & 0xffff;
}

/**
 * f32 -> bf16 bits rounded toward −∞ (`up` false) or +∞ (`up` true), a NaN kept a quiet NaN:
 * Quest's page summaries store min and max so (outward), so they still bound every value.
 */
export function f32ToBf16BitsOutward(value: number, up: boolean): number {
  scratchF32[0] = value;
  const x = scratchU32[0];
  if ((x & 0x7fffffff) > 0x7f800000) return (x >>> 16) | 0x40;
  // Truncation rounds toward 0; an inexact value on the far side of 0 moves one ulp away from it.
  return (x >>> 16) + ((x & 0xffff) !== 0 && (x >>> 31 === 0) === up ? 1 : 0);
}

export function bf16BitsToF32(h: number): number {
  scratchU32[0] = (h & 0xffff) << 16;
  return scratchF32[0];
}

let f16Table: Float32Array | null = null;
function f16Lookup(): Float32Array {
  if (!f16Table) {
    f16Table = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) f16Table[h] = f16BitsToF32(h);
  }
  return f16Table;
}

/** The value `v` takes once stored as `dtype`. */
export function roundTo(dtype: DType, v: number): number {
  if (dtype === "f32") return Math.fround(v);
  if (dtype === "f16") return f16Lookup()[f32ToF16Bits(v)];
  return bf16BitsToF32(f32ToBf16Bits(v));
}

/** Round every element in place to what `dtype` can hold. */
export function roundArrayTo(dtype: DType, a: Float32Array): void {
  if (dtype === "f32") return;
  if (dtype === "f16") {
    const t = f16Lookup();
    for (let i = 0; i < a.length; i++) a[i] = t[f32ToF16Bits(a[i])];
  } else {
    for (let i = 0; i < a.length; i++) a[i] = bf16BitsToF32(f32ToBf16Bits(a[i]));
  }
}

/** Little-endian bytes of `dtype` → f32 values. */
export function decodeToF32(bytes: Uint8Array, dtype: DType): Float32Array {
  const size = DTYPE_BYTES[dtype];
  check(bytes.byteLength % size === 0, `${bytes.byteLength} bytes is not a whole number of ${dtype} values`);
  const n = bytes.byteLength / size;
  // Copy to a fresh aligned buffer so typed views work whatever the source alignment.
  const aligned = bytes.byteOffset % size === 0 ? bytes : bytes.slice();
  if (dtype === "f32") return new Float32Array(aligned.buffer, aligned.byteOffset, n).slice();
  const halves = new Uint16Array(aligned.buffer, aligned.byteOffset, n);
  const out = new Float32Array(n);
  if (dtype === "f16") {
    const t = f16Lookup();
    for (let i = 0; i < n; i++) out[i] = t[halves[i]];
  } else {
    const u = new Uint32Array(out.buffer);
    for (let i = 0; i < n; i++) u[i] = halves[i] << 16;
  }
  return out;
}

/** f32 values → little-endian bytes of `dtype` (rounded to nearest even). */
export function encodeFromF32(values: Float32Array, dtype: DType): Uint8Array {
  if (dtype === "f32") return new Uint8Array(values.slice().buffer);
  const halves = new Uint16Array(values.length);
  const enc = dtype === "f16" ? f32ToF16Bits : f32ToBf16Bits;
  for (let i = 0; i < values.length; i++) halves[i] = enc(values[i]);
  return new Uint8Array(halves.buffer);
}

/** Convert stored bytes between dtypes (a copy only when the dtype changes). */
export function convertBytes(bytes: Uint8Array, from: DType, to: DType): Uint8Array {
  return from === to ? bytes : encodeFromF32(decodeToF32(bytes, from), to);
}
