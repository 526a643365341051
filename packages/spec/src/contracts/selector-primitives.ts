/**
 * Portable implementation of SelectorPrimitives: typed-array loops with no per-call
 * allocation beyond the result (and one scratch copy for topK). Engines with native kernels
 * may hand selectors faster versions; these define the semantics they must match. Page
 * summaries are bf16 rounded outward (min toward −∞, max toward +∞): half the bytes of f32 for
 * Quest's bounds to read, and the bounds still hold.
 */
import type { DType } from "../backend.js";
import { HybridgenError } from "../errors.js";
import { bf16BitsToF32, f16BitsToF32, f32ToBf16BitsOutward } from "../half-float.js";
import type { OffloadedKeys, PageSummaries, SelectorPrimitives } from "./selector.js";
import { indexFold, indexPages } from "./page-index.js";

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

const positiveInt = (v: number) => Number.isInteger(v) && v > 0;

/** A checked OffloadedKeys over `data` (zero-filled f32/u16 storage when omitted). */
export function offloadedKeys(dtype: DType, kvHeads: number, capacity: number, headDim: number, data?: Float32Array | Uint16Array): OffloadedKeys {
  if (!positiveInt(kvHeads) || !positiveInt(headDim) || !Number.isInteger(capacity) || capacity < 0) {
    throw new HybridgenError(`offloaded keys: bad shape [${kvHeads}, ${capacity}, ${headDim}] (positive KV heads and headDim, capacity ≥ 0)`);
  }
  const n = kvHeads * capacity * headDim;
  const d = data ?? (dtype === "f32" ? new Float32Array(n) : new Uint16Array(n));
  if ((dtype === "f32") !== (d instanceof Float32Array) || !(d instanceof Float32Array || d instanceof Uint16Array)) {
    throw new HybridgenError(`offloaded keys: ${dtype} rows need a ${dtype === "f32" ? "Float32Array" : "Uint16Array of bit patterns"}`);
  }
  if (d.length < n) throw new HybridgenError(`offloaded keys: data holds ${d.length} values, fewer than [${kvHeads}, ${capacity}, ${headDim}] = ${n}`);
  return { dtype, kvHeads, headDim, capacity, data: d };
}

/** Empty page summaries (bf16) for `capacity` slots of K per KV head in pages of `pageSize`. */
export function pageSummaries(kvHeads: number, headDim: number, capacity: number, pageSize: number): PageSummaries {
  if (!positiveInt(pageSize)) throw new HybridgenError(`page summaries: page size must be a positive integer, got ${pageSize}`);
  if (!positiveInt(kvHeads) || !positiveInt(headDim) || !Number.isInteger(capacity) || capacity < 0) {
    throw new HybridgenError(`page summaries: bad shape (${kvHeads} KV heads, headDim ${headDim}, capacity ${capacity})`);
  }
  const pageCapacity = Math.ceil(capacity / pageSize);
  const n = kvHeads * pageCapacity * headDim;
  return { pageSize, kvHeads, headDim, pageCapacity, min: new Uint16Array(n), max: new Uint16Array(n) };
}

/** Element reader of a key view as f32 (bit patterns decoded). */
function keyReader(keys: OffloadedKeys): (i: number) => number {
  const d = keys.data;
  if (keys.dtype === "f32") return (i) => d[i]!;
  return keys.dtype === "bf16" ? (i) => bf16BitsToF32(d[i]!) : (i) => f16BitsToF32(d[i]!);
}

function checkRows(fn: string, keys: OffloadedKeys, from: number, to: number): void {
  if (!Number.isInteger(from) || !Number.isInteger(to) || from < 0 || to < from || to > keys.capacity) {
    throw new HybridgenError(`${fn}: rows [${from}, ${to}) out of range [0, ${keys.capacity}]`);
  }
  if ((keys.dtype === "f32") !== (keys.data instanceof Float32Array) || !(keys.data instanceof Float32Array || keys.data instanceof Uint16Array)) {
    throw new HybridgenError(`${fn}: ${keys.dtype} keys need a ${keys.dtype === "f32" ? "Float32Array" : "Uint16Array of bit patterns"}`);
  }
  if (!positiveInt(keys.kvHeads) || !positiveInt(keys.headDim) || keys.data.length < keys.kvHeads * keys.capacity * keys.headDim) {
    throw new HybridgenError(`${fn}: key data shorter than its shape [${keys.kvHeads}, ${keys.capacity}, ${keys.headDim}]`);
  }
}

function checkQuery(fn: string, query: Float32Array, groupSize: number, kvHeads: number, headDim: number): void {
  if (!positiveInt(groupSize)) throw new HybridgenError(`${fn}: groupSize must be a positive integer, got ${groupSize}`);
  if (query.length !== kvHeads * groupSize * headDim) {
    throw new HybridgenError(`${fn}: query has ${query.length} values, expected ${kvHeads} KV heads × ${groupSize} × ${headDim}`);
  }
}

function outBuffer(fn: string, out: Float32Array | undefined, n: number): Float32Array {
  if (!out) return new Float32Array(n);
  if (out.length < n) throw new HybridgenError(`${fn}: out has ${out.length} values, fewer than ${n}`);
  return out;
}

/**
 * The argument checks of the key primitives (each throws one HybridgenError line), shared by
 * every implementation: a native one must run them before it hands memory to C.
 */
export const keyPrimitiveChecks = {
  summarizePages(keys: OffloadedKeys, from: number, to: number, pages: PageSummaries): void {
    checkRows("summarizePages", keys, from, to);
    const { kvHeads, headDim: d, capacity } = keys;
    if (pages.kvHeads !== kvHeads || pages.headDim !== d || pages.pageCapacity * pages.pageSize < to ||
      pages.min.length < kvHeads * pages.pageCapacity * d || pages.max.length < kvHeads * pages.pageCapacity * d) {
      throw new HybridgenError(`summarizePages: summaries for ${pages.kvHeads} KV heads × headDim ${pages.headDim} × ${pages.pageCapacity} pages do not fit keys [${kvHeads}, ${capacity}, ${d}] up to row ${to}`);
    }
  },
  /** Returns the output buffer (`out`, or a new one). */
  pageBounds(query: Float32Array, groupSize: number, pages: PageSummaries, count: number, out?: Float32Array): Float32Array {
    const { kvHeads, headDim: d, pageCapacity } = pages;
    checkQuery("pageBounds", query, groupSize, kvHeads, d);
    if (!Number.isInteger(count) || count < 0 || count > pageCapacity) throw new HybridgenError(`pageBounds: page count ${count} out of range [0, ${pageCapacity}]`);
    if (pages.min.length < kvHeads * pageCapacity * d || pages.max.length < kvHeads * pageCapacity * d) throw new HybridgenError("pageBounds: summaries shorter than their shape");
    return outBuffer("pageBounds", out, kvHeads * count);
  },
  /** Returns the output buffer (`out`, or a new one). */
  keyScores(query: Float32Array, groupSize: number, keys: OffloadedKeys, from: number, to: number, out?: Float32Array): Float32Array {
    checkRows("keyScores", keys, from, to);
    checkQuery("keyScores", query, groupSize, keys.kvHeads, keys.headDim);
    return outBuffer("keyScores", out, keys.kvHeads * (to - from));
  },
  gatherChannels(keys: OffloadedKeys, channels: Int32Array, from: number, to: number, out: OffloadedKeys): void {
    checkRows("gatherChannels", keys, from, to);
    const { kvHeads, headDim: d } = keys, r = out.headDim;
    if (out.dtype !== "f32" || out.kvHeads !== kvHeads || out.capacity < to) {
      throw new HybridgenError(`gatherChannels: out must be f32 keys with ${kvHeads} KV heads and capacity ≥ ${to}`);
    }
    checkRows("gatherChannels", out, from, to);
    if (channels.length !== kvHeads * r) throw new HybridgenError(`gatherChannels: ${channels.length} channels, expected ${r} per KV head (${kvHeads * r})`);
    for (const c of channels) if (!(c >= 0 && c < d)) throw new HybridgenError(`gatherChannels: channel ${c} out of range [0, ${d})`);
  },
};

export function summarizePages(keys: OffloadedKeys, from: number, to: number, pages: PageSummaries): void {
  keyPrimitiveChecks.summarizePages(keys, from, to, pages);
  const { kvHeads, headDim: d, capacity } = keys;
  const at = keyReader(keys), P = pages.pageSize;
  for (let g = 0; g < kvHeads; g++) {
    for (let slot = from; slot < to; slot++) {
      const p = Math.floor(slot / P), row = (g * capacity + slot) * d, s = (g * pages.pageCapacity + p) * d;
      const fresh = slot % P === 0;
      for (let c = 0; c < d; c++) {
        // The row's value rounded outward to bf16, then folded in (a NaN or a tie keeps the old bits).
        const v = at(row + c), lo = f32ToBf16BitsOutward(v, false), hi = f32ToBf16BitsOutward(v, true);
        if (fresh || bf16BitsToF32(lo) < bf16BitsToF32(pages.min[s + c]!)) pages.min[s + c] = lo;
        if (fresh || bf16BitsToF32(hi) > bf16BitsToF32(pages.max[s + c]!)) pages.max[s + c] = hi;
      }
    }
  }
}

export function pageBounds(query: Float32Array, groupSize: number, pages: PageSummaries, count: number, out?: Float32Array): Float32Array {
  const dst = keyPrimitiveChecks.pageBounds(query, groupSize, pages, count, out);
  const { kvHeads, headDim: d, pageCapacity } = pages;
  for (let g = 0; g < kvHeads; g++) {
    for (let p = 0; p < count; p++) {
      const s = (g * pageCapacity + p) * d;
      let best = -Infinity;
      for (let j = 0; j < groupSize; j++) {
        const q = (g * groupSize + j) * d;
        let sum = 0;
        for (let c = 0; c < d; c++) {
          const qc = query[q + c]!;
          sum += Math.max(qc * bf16BitsToF32(pages.min[s + c]!), qc * bf16BitsToF32(pages.max[s + c]!));
        }
        if (sum > best) best = sum;
      }
      dst[g * count + p] = best;
    }
  }
  return dst;
}

export function keyScores(query: Float32Array, groupSize: number, keys: OffloadedKeys, from: number, to: number, out?: Float32Array): Float32Array {
  const dst = keyPrimitiveChecks.keyScores(query, groupSize, keys, from, to, out);
  const { kvHeads, headDim: d, capacity } = keys;
  const n = to - from, at = keyReader(keys);
  for (let g = 0; g < kvHeads; g++) {
    for (let slot = from; slot < to; slot++) {
      const row = (g * capacity + slot) * d;
      let best = -Infinity;
      for (let j = 0; j < groupSize; j++) {
        const q = (g * groupSize + j) * d;
        let sum = 0;
        for (let c = 0; c < d; c++) sum += query[q + c]! * at(row + c);
        if (sum > best) best = sum;
      }
      dst[g * n + slot - from] = best;
    }
  }
  return dst;
}

export function gatherChannels(keys: OffloadedKeys, channels: Int32Array, from: number, to: number, out: OffloadedKeys): void {
  keyPrimitiveChecks.gatherChannels(keys, channels, from, to, out);
  const { kvHeads, headDim: d, capacity } = keys, r = out.headDim;
  const at = keyReader(keys), o = out.data;
  for (let g = 0; g < kvHeads; g++) {
    for (let slot = from; slot < to; slot++) {
      const row = (g * capacity + slot) * d, dst = (g * out.capacity + slot) * r;
      for (let i = 0; i < r; i++) o[dst + i] = at(row + channels[g * r + i]!);
    }
  }
}

export const referencePrimitives: SelectorPrimitives = {
  topK,
  maxRows: (rows, length, out) => reduceRows("maxRows", rows, length, out, true),
  sumRows: (rows, length, out) => reduceRows("sumRows", rows, length, out, false),
  range,
  summarizePages,
  pageBounds,
  keyScores,
  gatherChannels,
  indexFold,
  indexPages,
};
