/**
 * The native deterministic random fill (native/random_fill.c): the same values as
 * @hybridgen/spec/kit's randomFillTs, bit for bit, on several threads. Used to build dummy
 * weights (`--dummy-weights`) fast.
 */
import { FFIType } from "bun:ffi";
import { availableParallelism } from "node:os";
import { DTYPE_BYTES, fail, type DType } from "@hybridgen/spec";
import { fillStep, type FillParams, type RandomFill } from "@hybridgen/spec/kit";
import { openNativeSymbols } from "./native.js";

const TYPE_CODE: Readonly<Record<DType, number>> = { f32: 0, f16: 1, bf16: 2 };

type NativeFill = (dst: Uint8Array, type: number, count: number, key: number, k: number, offset: number, threads: number) => number;
let fillFn: NativeFill | undefined;

function nativeFill(): NativeFill {
  fillFn ??= openNativeSymbols({
    hg_random_fill: { args: [FFIType.ptr, FFIType.i32, FFIType.i64, FFIType.u32, FFIType.f32, FFIType.f32, FFIType.i32], returns: FFIType.i32 },
  }).hg_random_fill as unknown as NativeFill;
  return fillFn;
}

/** A RandomFill on `threads` native threads (default: every core). */
export function createNativeRandomFill(threads: number = availableParallelism()): RandomFill {
  if (!(Number.isInteger(threads) && threads >= 1 && threads <= 256)) fail(`random fill: threads must be an integer in [1, 256], got ${threads}`);
  return (out: Uint8Array, dtype: DType, params: FillParams) => {
    const size = DTYPE_BYTES[dtype];
    if (size === undefined) fail(`random fill: unsupported dtype ${String(dtype)}`);
    if (out.length % size !== 0) fail(`random fill: ${out.length} bytes is not a whole number of ${dtype} elements`);
    if (!(Number.isInteger(params.key) && params.key >= 0 && params.key <= 0xffffffff)) fail(`random fill: key must be a u32, got ${params.key}`);
    if (!(Number.isFinite(params.scale) && Number.isFinite(params.offset))) fail("random fill: scale and offset must be finite");
    if (out.length === 0) return;
    const rc = nativeFill()(out, TYPE_CODE[dtype], out.length / size, params.key, fillStep(params.scale), params.offset, threads);
    if (rc !== 0) fail(`random fill: native fill failed for ${dtype} (could not start threads?)`);
  };
}
