/**
 * Prefill calibration's per-sample sums in native code (native/calib.c): the same figures as the
 * engine's JavaScript reference, bit for bit, with the samples spread over `threads` native threads.
 * The calibrator reads its stash of sampled rows once and passes them here, so the measurement
 * leaves the thread that drives the model.
 */
import { FFIType } from "bun:ffi";
import { availableParallelism } from "node:os";
import { fail, type CalibrationBatch } from "@hybridgen/spec";
import { openNativeSymbols } from "./native.js";

type Sums = (data: Float32Array, rows: number, width: number, group: number, samples: Int32Array, n: number, grid: Int32Array, g: number, c: number, out: Float64Array, threads: number) => number;
let sumsFn: Sums | undefined;

function nativeSums(): Sums {
  const { ptr, i32, i64 } = FFIType;
  sumsFn ??= openNativeSymbols({ hg_calib_sums: { args: [ptr, i64, i64, i32, ptr, i64, ptr, i32, i32, ptr, i32], returns: i32 } }).hg_calib_sums as unknown as Sums;
  return sumsFn;
}

/** Sums of a batch ([samples][4·(grid + 1) + 2], the engine's layout) on `threads` native threads (default: every core). */
export function createNativeCalibrationSums(threads: number = availableParallelism()): (b: CalibrationBatch) => Float64Array {
  if (!(Number.isInteger(threads) && threads >= 1 && threads <= 256)) fail(`calibration sums: threads must be an integer in [1, 256], got ${threads}`);
  return (b) => {
    const n = b.samples.length / 5, g = b.grid.length;
    if (!Number.isInteger(n)) fail(`calibration sums: ${b.samples.length} sample fields is not a whole number of samples (5 each)`);
    if (b.width < 1 || b.data.length % b.width !== 0) fail(`calibration sums: ${b.data.length} floats is not a whole number of ${b.width}-float rows`);
    const out = new Float64Array(n * (4 * (g + 1) + 2));
    if (n === 0) return out;
    const rc = nativeSums()(b.data, b.data.length / b.width, b.width, b.group, b.samples, n, Int32Array.from(b.grid), g, b.candidates, out, threads);
    if (rc === -1) fail("calibration sums: a sample's rows or range lie outside the data, or the grid is not increasing (1 ≤ K, at most 255 points)");
    if (rc !== 0) fail("calibration sums: native scratch memory or threads could not be allocated");
    return out;
  };
}
