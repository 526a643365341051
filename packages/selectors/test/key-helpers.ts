import { offloadedKeys, type DType, type OffloadedKeys } from "@hybridgen/spec";

const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);

/** f32 → f16 bits, truncating (normal range; tiny values flush to zero): enough for test data. */
function f16Bits(v: number): number {
  f32[0] = v;
  const x = u32[0]!, sign = (x >>> 16) & 0x8000, e = ((x >>> 23) & 0xff) - 112;
  if (e <= 0) return sign;
  if (e >= 31) return sign | 0x7bff;
  return sign | (e << 10) | ((x >>> 13) & 0x3ff);
}

/** Keys [kvHeads, capacity, headDim] holding `values` in `dtype` (f16/bf16 as bit patterns). */
export function encodeKeys(dtype: DType, kvHeads: number, capacity: number, headDim: number, values: Float32Array): OffloadedKeys {
  if (dtype === "f32") return offloadedKeys(dtype, kvHeads, capacity, headDim, values.slice());
  const bits = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) {
    f32[0] = values[i]!;
    bits[i] = dtype === "bf16" ? u32[0]! >>> 16 : f16Bits(values[i]!);
  }
  return offloadedKeys(dtype, kvHeads, capacity, headDim, bits);
}

/** The f32 value of element i of a key view (decoded the way the primitives decode it). */
export function keyValue(keys: OffloadedKeys, i: number): number {
  const b = keys.data[i]!;
  if (keys.dtype === "f32") return b;
  if (keys.dtype === "bf16") {
    u32[0] = b << 16;
    return f32[0]!;
  }
  const s = b & 0x8000 ? -1 : 1, e = (b >>> 10) & 0x1f, m = b & 0x3ff;
  return e === 0 ? s * m * 2 ** -24 : s * (1 + m / 1024) * 2 ** (e - 15);
}

export const DTYPES: DType[] = ["f32", "f16", "bf16"];
