/**
 * Portable implementation of SelectorPrimitives: typed-array loops with no per-call
 * allocation beyond the result (and one scratch copy for topK). Engines with native kernels
 * may hand selectors faster versions; these define the semantics they must match.
 */
import { HybridgenError } from "../errors.js";
import type { SelectorPrimitives } from "./selector.js";

function checkLength(fn: string, arr: ArrayLike<number>, length: number, what: string): void {
  if (!Number.isInteger(length) || length < 0) throw new HybridgenError(`${fn}: length must be a non-negative integer, got ${length}`);
  if (arr.length < length) throw new HybridgenError(`${fn}: ${what} has ${arr.length} elements, fewer than length ${length}`);
}

/** Swap-based three-way quickselect: after it, a[r] is the value of ascending rank r. */
function selectRank(a: Float32Array, r: number): number {
  let lo = 0;
  let hi = a.length - 1;
  // Degenerate pivots cannot make it quadratic: after this many rounds fall back to a sort.
  let rounds = 2 * Math.ceil(Math.log2(a.length + 1)) + 8;
  while (hi > lo) {
    if (--rounds < 0) {
      a.subarray(lo, hi + 1).sort();
      return a[r]!;
    }
    const mid = (lo + hi) >>> 1;
    const x = a[lo]!, y = a[mid]!, z = a[hi]!;
    const pivot = x < y ? (y < z ? y : x < z ? z : x) : x < z ? x : y < z ? z : y;
    // Dutch-flag partition: [lo, lt) < pivot, [lt, i) == pivot, (gt, hi] > pivot.
    let lt = lo, i = lo, gt = hi;
    while (i <= gt) {
      const v = a[i]!;
      if (v < pivot) { a[i] = a[lt]!; a[lt] = v; lt++; i++; }
      else if (v > pivot) { a[i] = a[gt]!; a[gt] = v; gt--; }
      else i++;
    }
    if (r < lt) hi = lt - 1;
    else if (r > gt) lo = gt + 1;
    else return pivot;
  }
  return a[r]!;
}

/** Indices (ascending) of the kk largest numbers among `vals` (NaN-free), ties to the earlier entry. */
function pickLargest(vals: Float32Array, idx: Int32Array | null, kk: number, out: Int32Array): void {
  const m = vals.length;
  const t = selectRank(vals.slice(), m - kk);
  let above = 0;
  for (let i = 0; i < m; i++) if (vals[i]! > t) above++;
  let tiesLeft = kk - above;
  let o = 0;
  for (let i = 0; i < m; i++) {
    const v = vals[i]!;
    if (v > t || (v === t && tiesLeft-- > 0)) out[o++] = idx ? idx[i]! : i;
  }
}

const SAMPLE = 1024;

/**
 * Fast path for k ≪ n: estimate a threshold from an evenly spaced sample, keep the values at
 * or above it (in index order) in one comparison pass, and select among those few. Every value
 * left out is below every kept one, so the answer (ties included) equals the full selection.
 * Returns false when the sample's guess kept too few or too many, and the caller falls back.
 */
function topKSampled(values: Float32Array, n: number, kk: number, out: Int32Array): boolean {
  const want = Math.ceil(kk * 1.5) + 64;
  const sample = new Float32Array(SAMPLE);
  let s = 0;
  for (let j = 0; j < SAMPLE; j++) {
    const v = values[Math.floor(((j + 0.5) * n) / SAMPLE)]!;
    if (v === v) sample[s++] = v;
  }
  const rank = s - 1 - Math.floor((want / n) * s);
  if (rank < 0) return false;
  const sorted = sample.subarray(0, s).sort();
  const t = sorted[rank]!;
  const cap = Math.min(n, 4 * want);
  const candVal = new Float32Array(cap);
  const candIdx = new Int32Array(cap);
  let c = 0;
  for (let i = 0; i < n; i++) {
    const v = values[i]!;
    if (v >= t) {
      if (c === cap) return false;
      candVal[c] = v;
      candIdx[c++] = i;
    }
  }
  if (c < kk) return false;
  pickLargest(candVal.subarray(0, c), candIdx, kk, out);
  return true;
}

export function topK(values: Float32Array, k: number, length: number = values.length): Int32Array {
  checkLength("topK", values, length, "values");
  if (!Number.isFinite(k) || Math.floor(k) !== k) throw new HybridgenError(`topK: k must be an integer, got ${k}`);
  const n = length;
  const kk = Math.max(0, Math.min(k, n));
  const out = new Int32Array(kk);
  if (kk === 0) return out;
  if (kk === n) {
    for (let i = 0; i < n; i++) out[i] = i;
    return out;
  }
  if (n >= 8 * SAMPLE && kk * 4 <= n && topKSampled(values, n, kk, out)) return out;
  let nans = 0;
  for (let i = 0; i < n; i++) if (values[i]! !== values[i]!) nans++;
  if (nans === 0) {
    pickLargest(values.subarray(0, n), null, kk, out);
    return out;
  }
  // Copy the non-NaN values; NaN ranks below every number.
  const nums = new Float32Array(n);
  const where = new Int32Array(n);
  let m = 0;
  for (let i = 0; i < n; i++) {
    const v = values[i]!;
    if (v === v) {
      nums[m] = v;
      where[m++] = i;
    }
  }
  if (kk >= m) {
    // Every number, then the lowest-index NaNs.
    let o = 0;
    let nanTake = kk - m;
    for (let i = 0; i < n; i++) {
      const v = values[i]!;
      if (v === v) out[o++] = i;
      else if (nanTake > 0) { out[o++] = i; nanTake--; }
    }
    return out;
  }
  pickLargest(nums.subarray(0, m), where, kk, out);
  return out;
}

function reduceRows(fn: string, rows: readonly Float32Array[], length: number, out: Float32Array | undefined, max: boolean): Float32Array {
  if (rows.length === 0) throw new HybridgenError(`${fn}: needs at least one row`);
  rows.forEach((r, i) => checkLength(fn, r, length, `row ${i}`));
  const dst = out ?? new Float32Array(length);
  checkLength(fn, dst, length, "out");
  dst.set(rows[0]!.subarray(0, length));
  for (let r = 1; r < rows.length; r++) {
    const row = rows[r]!;
    if (max) {
      for (let j = 0; j < length; j++) if (row[j]! > dst[j]!) dst[j] = row[j]!;
    } else {
      for (let j = 0; j < length; j++) dst[j] = dst[j]! + row[j]!;
    }
  }
  return dst;
}

export function range(start: number, count: number): Int32Array {
  if (!Number.isInteger(start) || !Number.isInteger(count) || count < 0) {
    throw new HybridgenError(`range: start and count must be integers with count ≥ 0, got (${start}, ${count})`);
  }
  const out = new Int32Array(count);
  for (let i = 0; i < count; i++) out[i] = start + i;
  return out;
}

export const referencePrimitives: SelectorPrimitives = {
  topK,
  maxRows: (rows, length, out) => reduceRows("maxRows", rows, length, out, true),
  sumRows: (rows, length, out) => reduceRows("sumRows", rows, length, out, false),
  range,
};
