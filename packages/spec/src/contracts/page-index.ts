/**
 * The compact hierarchical page index of an offloaded K store, the one definition behind the
 * "index" selector's select(), its primitives and a CpuStage's "index" work. Per KV head:
 *
 * - pages of `pageSize` rows: the per-channel min and max of K as integer codes (int8: ±127, or
 *   int4: ±7, two to a byte) times one f32 scale per page, rounded outward (lo·scale ≤ min,
 *   hi·scale ≥ max), so Σ_c max(q_c·lo_c, q_c·hi_c)·scale still bounds q·k over the page while it
 *   reads 2·headDim (int8) or headDim (int4) bytes a page, not Quest's 4·headDim;
 * - super-pages of `superPages` pages: the same form over their pages' dequantized bounds, so a
 *   super-page's bound is at least each of its pages'.
 *
 * Choosing the best `want` pages reads every super-page and then only the pages of super-pages
 * whose bound (plus a rounding slack) still reaches the want-th best page bound found so far:
 * the result equals the flat choice over every page bound (ties to the lower page). Every page's
 * summary is a function of its rows alone and a super-page's of its pages, so folding in rows
 * as they are evicted equals building the index afresh.
 */
import { fail, HybridgenError } from "../errors.js";
import { bf16BitsToF32, f16BitsToF32 } from "../half-float.js";
import type { OffloadedKeys, Selection, SelectorPrimitives } from "./selector.js";

export const PAGE_INDEX_FORMS = ["int8", "int4"] as const;
export type PageIndexForm = (typeof PAGE_INDEX_FORMS)[number];
/** The form's code in a stage job and the native kernels. */
export const PAGE_INDEX_FORM_CODE: Readonly<Record<PageIndexForm, number>> = { int8: 1, int4: 2 };

/** Largest code magnitude of a form. */
const QMAX: Readonly<Record<PageIndexForm, number>> = { int8: 127, int4: 7 };
/** The scale is widened by this factor so |min| / scale stays below the largest code (exact in f32). */
const WIDEN = 1 + 2 ** -16;
/** A super-page is skipped only when its bound plus this share of Σ_c |q_c|·qmax (times its scale) is below the threshold (f32 sums' rounding). */
export const PAGE_INDEX_SLACK = 1e-4;

/** Where each part of an index lies in its bytes (all offsets 64-byte aligned). */
export interface PageIndexLayout {
  /** Code bytes of one summary (page or super-page): 2·headDim (int8) or headDim (int4). */
  readonly codeBytes: number;
  readonly pageCapacity: number;
  readonly superCapacity: number;
  /** [kvHeads, pageCapacity, codeBytes] */
  readonly pageCodes: number;
  /** [kvHeads, pageCapacity] f32 */
  readonly pageScales: number;
  /** [kvHeads, superCapacity, codeBytes] */
  readonly superCodes: number;
  /** [kvHeads, superCapacity] f32 */
  readonly superScales: number;
  readonly bytes: number;
}

export interface PageIndex extends PageIndexLayout {
  readonly form: PageIndexForm;
  readonly pageSize: number;
  readonly superPages: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly data: Uint8Array;
}

const positiveInt = (v: number) => Number.isInteger(v) && v > 0;
const align = (x: number) => Math.ceil(x / 64) * 64;

/** Checks a form name: one line naming the forms that exist. */
export function pageIndexForm(form: string): PageIndexForm {
  if (!(PAGE_INDEX_FORMS as readonly string[]).includes(form)) throw new HybridgenError(`page index: form "${form}" does not exist (forms: ${PAGE_INDEX_FORMS.join(", ")})`);
  return form as PageIndexForm;
}

/** The layout of an index for `capacity` rows per KV head (checked: one line per bad value). */
export function pageIndexLayout(kvHeads: number, headDim: number, capacity: number, pageSize: number, superPages: number, form: string): PageIndexLayout {
  const f = pageIndexForm(form);
  if (!positiveInt(pageSize)) throw new HybridgenError(`page index: page size must be a positive integer, got ${pageSize}`);
  if (!positiveInt(superPages)) throw new HybridgenError(`page index: pages per super-page must be a positive integer, got ${superPages}`);
  if (!positiveInt(kvHeads) || !positiveInt(headDim) || !Number.isInteger(capacity) || capacity < 0) {
    throw new HybridgenError(`page index: bad shape (${kvHeads} KV heads, headDim ${headDim}, capacity ${capacity})`);
  }
  if (f === "int4" && headDim % 2 !== 0) throw new HybridgenError(`page index: form int4 needs an even headDim, got ${headDim}`);
  const codeBytes = f === "int8" ? 2 * headDim : headDim;
  const pageCapacity = Math.ceil(capacity / pageSize), superCapacity = Math.ceil(pageCapacity / superPages);
  const pageCodes = 0, pageScales = align(kvHeads * pageCapacity * codeBytes);
  const superCodes = pageScales + align(kvHeads * pageCapacity * 4), superScales = superCodes + align(kvHeads * superCapacity * codeBytes);
  return { codeBytes, pageCapacity, superCapacity, pageCodes, pageScales, superCodes, superScales, bytes: superScales + align(kvHeads * superCapacity * 4) };
}

/** An empty index (zeroed bytes, or `data` when given: at least the layout's bytes). */
export function pageIndex(kvHeads: number, headDim: number, capacity: number, pageSize: number, superPages: number, form: string, data?: Uint8Array): PageIndex {
  const layout = pageIndexLayout(kvHeads, headDim, capacity, pageSize, superPages, form);
  const bytes = data ?? new Uint8Array(layout.bytes);
  if (bytes.length < layout.bytes) throw new HybridgenError(`page index: ${bytes.length} bytes do not hold the index's ${layout.bytes}`);
  return { ...layout, form: form as PageIndexForm, pageSize, superPages, kvHeads, headDim, data: bytes };
}

/** Reads codes and scales of an index's summaries. */
class Summaries {
  readonly pageScales: Float32Array;
  readonly superScales: Float32Array;
  constructor(readonly x: PageIndex) {
    const b = x.data.buffer, o = x.data.byteOffset;
    this.pageScales = new Float32Array(b, o + x.pageScales, x.kvHeads * x.pageCapacity);
    this.superScales = new Float32Array(b, o + x.superScales, x.kvHeads * x.superCapacity);
  }
  /** Byte offset of summary i (of head g) at level `superLevel`. */
  at(g: number, i: number, superLevel: boolean): number {
    const x = this.x;
    return superLevel ? x.superCodes + (g * x.superCapacity + i) * x.codeBytes : x.pageCodes + (g * x.pageCapacity + i) * x.codeBytes;
  }
  /** lo and hi codes of channel c of the summary at byte offset `o`. */
  lo(o: number, c: number): number {
    const v = this.x.data;
    return this.x.form === "int8" ? (v[o + c]! << 24) >> 24 : (v[o + c]! & 15) - 8;
  }
  hi(o: number, c: number): number {
    const v = this.x.data;
    return this.x.form === "int8" ? (v[o + this.x.headDim + c]! << 24) >> 24 : (v[o + c]! >> 4) - 8;
  }
}

/**
 * Codes of per-channel lows `mn` and highs `mx` (f32 values) written at byte offset o with the
 * scale returned: scale = amax / qmax widened, lo = ⌊min / scale⌋ lowered once more while
 * lo·scale > min, hi likewise upward, all in f32 (the native fold's operations, bit for bit).
 * No finite value (an empty or all-NaN page): codes 0, scale 0.
 */
function encode(x: PageIndex, o: number, mn: Float32Array, mx: Float32Array): number {
  const f = Math.fround, d = x.headDim, qmax = QMAX[x.form], v = x.data;
  let amax = 0, any = false;
  for (let c = 0; c < d; c++) {
    if (mn[c]! <= mx[c]!) {
      any = true;
      amax = Math.max(amax, Math.abs(mn[c]!), Math.abs(mx[c]!));
    }
  }
  const scale = any && amax > 0 ? f(f(amax / qmax) * WIDEN) : 0;
  for (let c = 0; c < d; c++) {
    let lo = 0, hi = 0;
    if (scale > 0 && mn[c]! <= mx[c]!) {
      lo = Math.floor(f(mn[c]! / scale));
      if (f(lo * scale) > mn[c]!) lo--;
      hi = Math.ceil(f(mx[c]! / scale));
      if (f(hi * scale) < mx[c]!) hi++;
      lo = Math.max(-qmax, lo);
      hi = Math.min(qmax, hi);
    }
    if (x.form === "int8") {
      v[o + c] = lo & 255;
      v[o + d + c] = hi & 255;
    } else {
      v[o + c] = (lo + 8) | ((hi + 8) << 4);
    }
  }
  return scale;
}

function keyReader(keys: OffloadedKeys): (i: number) => number {
  const d = keys.data;
  if (keys.dtype === "f32") return (i) => d[i]!;
  return keys.dtype === "bf16" ? (i) => bf16BitsToF32(d[i]!) : (i) => f16BitsToF32(d[i]!);
}

/** The argument checks of the index primitives (one HybridgenError line each), for every implementation. */
export const pageIndexChecks = {
  fold(keys: OffloadedKeys, from: number, to: number, index: PageIndex): void {
    if (!Number.isInteger(from) || !Number.isInteger(to) || from < 0 || to < from || to > keys.capacity) {
      throw new HybridgenError(`indexFold: rows [${from}, ${to}) out of range [0, ${keys.capacity}]`);
    }
    if ((keys.dtype === "f32") !== (keys.data instanceof Float32Array) || keys.data.length < keys.kvHeads * keys.capacity * keys.headDim) {
      throw new HybridgenError(`indexFold: ${keys.dtype} key data does not hold its shape [${keys.kvHeads}, ${keys.capacity}, ${keys.headDim}]`);
    }
    checkIndex("indexFold", index);
    if (index.kvHeads !== keys.kvHeads || index.headDim !== keys.headDim || index.pageCapacity * index.pageSize < to) {
      throw new HybridgenError(`indexFold: an index of ${index.kvHeads} KV heads × headDim ${index.headDim} × ${index.pageCapacity} pages does not fit keys [${keys.kvHeads}, ${keys.capacity}, ${keys.headDim}] up to row ${to}`);
    }
  },
  pages(query: Float32Array, groupSize: number, index: PageIndex, n: number, want: number): void {
    checkIndex("indexPages", index);
    if (!positiveInt(groupSize) || query.length !== index.kvHeads * groupSize * index.headDim) {
      throw new HybridgenError(`indexPages: query has ${query.length} values, expected ${index.kvHeads} KV heads × ${groupSize} × ${index.headDim}`);
    }
    if (!Number.isInteger(n) || n < 0 || n > index.pageCapacity * index.pageSize) throw new HybridgenError(`indexPages: ${n} rows out of range [0, ${index.pageCapacity * index.pageSize}]`);
    if (!Number.isInteger(want) || want < 0) throw new HybridgenError(`indexPages: want must be a non-negative integer, got ${want}`);
  },
};

function checkIndex(fn: string, x: PageIndex): void {
  const l = pageIndexLayout(x.kvHeads, x.headDim, x.pageCapacity * x.pageSize, x.pageSize, x.superPages, x.form);
  if (l.bytes !== x.bytes || x.data.length < l.bytes || l.superCapacity !== x.superCapacity) throw new HybridgenError(`${fn}: the index's bytes do not match its shape`);
}

/** One indexFold of SelectorPrimitives.indexFoldMany. */
export interface IndexFoldItem {
  readonly keys: OffloadedKeys;
  readonly from: number;
  readonly to: number;
  readonly index: PageIndex;
}

/** Every item's indexFold through `P`: its indexFoldMany where it has one, else one call an item. */
export function indexFoldAll(P: Pick<SelectorPrimitives, "indexFold" | "indexFoldMany">, items: readonly IndexFoldItem[]): void {
  if (items.length === 0) return;
  if (P.indexFoldMany) return P.indexFoldMany(items);
  for (const x of items) P.indexFold(x.keys, x.from, x.to, x.index);
}

/**
 * Folds rows [from, to) of every KV head into the index: each page they touch is summarized
 * afresh from all its rows below `to`, then each super-page over those pages from its pages.
 */
export function indexFold(keys: OffloadedKeys, from: number, to: number, index: PageIndex): void {
  pageIndexChecks.fold(keys, from, to, index);
  if (to <= from) return;
  const { kvHeads, headDim: d, capacity } = keys, P = index.pageSize, S = index.superPages;
  const at = keyReader(keys), s = new Summaries(index);
  const mn = new Float32Array(d), mx = new Float32Array(d);
  const p0 = Math.floor(from / P), p1 = Math.ceil(to / P), s0 = Math.floor(p0 / S), s1 = Math.ceil(p1 / S);
  for (let g = 0; g < kvHeads; g++) {
    for (let p = p0; p < p1; p++) {
      mn.fill(Infinity);
      mx.fill(-Infinity);
      for (let slot = p * P; slot < Math.min(to, (p + 1) * P); slot++) {
        const row = (g * capacity + slot) * d;
        for (let c = 0; c < d; c++) {
          const v = Math.fround(at(row + c));
          if (v < mn[c]!) mn[c] = v;
          if (v > mx[c]!) mx[c] = v;
        }
      }
      s.pageScales[g * index.pageCapacity + p] = encode(index, s.at(g, p, false), mn, mx);
    }
    for (let u = s0; u < s1; u++) {
      mn.fill(Infinity);
      mx.fill(-Infinity);
      for (let p = u * S; p < Math.min(p1, (u + 1) * S); p++) {
        const o = s.at(g, p, false), sc = s.pageScales[g * index.pageCapacity + p]!;
        for (let c = 0; c < d; c++) {
          const lo = Math.fround(s.lo(o, c) * sc), hi = Math.fround(s.hi(o, c) * sc);
          if (lo < mn[c]!) mn[c] = lo;
          if (hi > mx[c]!) mx[c] = hi;
        }
      }
      s.superScales[g * index.superCapacity + u] = encode(index, s.at(g, u, true), mn, mx);
    }
  }
}

/** Bound of summary at byte offset o (scale sc) for query head row qh: sc · Σ_c max(q·lo, q·hi); slack adds the rounding allowance, a share of Σ_c |q_c|·qmax. */
function bound(s: Summaries, query: Float32Array, qh: number, d: number, o: number, sc: number, slack: boolean): number {
  let sum = 0, abs = 0;
  for (let c = 0; c < d; c++) {
    const q = query[qh + c]!, lo = s.lo(o, c), hi = s.hi(o, c);
    sum += q > 0 ? q * hi : q * lo;
    abs += Math.abs(q);
  }
  return sc * (sum + (slack ? PAGE_INDEX_SLACK * QMAX[s.x.form] * abs : 0));
}

function groupBound(s: Summaries, query: Float32Array, G: number, g: number, o: number, sc: number, slack: boolean): number {
  const d = s.x.headDim;
  let best = -Infinity;
  for (let j = 0; j < G; j++) best = Math.max(best, bound(s, query, (g * G + j) * d, d, o, sc, slack));
  return best;
}

/**
 * Every page's bound, out[g · count + p] = max over KV head g's query heads of
 * scale·Σ_c max(q_c·lo_c, q_c·hi_c), p < count = ⌈n / pageSize⌉ (the flat choice's input).
 */
export function indexPageBounds(query: Float32Array, groupSize: number, index: PageIndex, n: number, out?: Float32Array): Float32Array {
  pageIndexChecks.pages(query, groupSize, index, n, 0);
  const count = Math.ceil(n / index.pageSize), s = new Summaries(index);
  const dst = out ?? new Float32Array(index.kvHeads * count);
  for (let g = 0; g < index.kvHeads; g++) {
    for (let p = 0; p < count; p++) dst[g * count + p] = groupBound(s, query, groupSize, g, s.at(g, p, false), s.pageScales[g * index.pageCapacity + p]!, false);
  }
  return dst;
}

/** The chosen pages per KV head and how many page summaries the choice read. */
export interface IndexPages {
  /** [kvHeads, want'] with want' = min(want, ⌈n / pageSize⌉): each head's pages by bound, highest first, ties to the lower page. */
  readonly pages: Int32Array;
  readonly want: number;
  /** Page summaries read, all heads (the super-pages' are kvHeads · ⌈pages / superPages⌉ more). */
  readonly pagesRead: number;
}

/**
 * The best `want` pages of rows [0, n) per KV head: super-pages by bound, highest first; a
 * super-page's pages are bounded and kept among the best want while its bound (with the rounding
 * slack) is not below the want-th best kept; the first super-page below it ends the search.
 */
export function indexPages(query: Float32Array, groupSize: number, index: PageIndex, n: number, want: number): IndexPages {
  pageIndexChecks.pages(query, groupSize, index, n, want);
  const P = index.pageSize, S = index.superPages, count = Math.ceil(n / P), supers = Math.ceil(count / S), w = Math.min(want, count);
  const s = new Summaries(index), out = new Int32Array(index.kvHeads * w);
  let read = 0;
  for (let g = 0; g < index.kvHeads; g++) {
    const sb = new Float64Array(supers), order = Array.from({ length: supers }, (_, u) => u);
    for (let u = 0; u < supers; u++) sb[u] = groupBound(s, query, groupSize, g, s.at(g, u, true), s.superScales[g * index.superCapacity + u]!, true);
    order.sort((a, b) => sb[b]! - sb[a]! || a - b);
    const kept: { p: number; b: number }[] = [];
    for (const u of order) {
      if (kept.length === w && (w === 0 || sb[u]! < kept[w - 1]!.b)) break;
      for (let p = u * S; p < Math.min(count, (u + 1) * S); p++) {
        const b = groupBound(s, query, groupSize, g, s.at(g, p, false), s.pageScales[g * index.pageCapacity + p]!, false);
        read++;
        kept.push({ p, b });
        kept.sort((x, y) => y.b - x.b || x.p - y.p);
        if (kept.length > w) kept.pop();
      }
    }
    kept.forEach((x, i) => (out[g * w + i] = x.p));
  }
  return { pages: out, want: w, pagesRead: read };
}

/** Pages a KV head's list is filled from for K = min(budget, n) of n rows: ⌈K / pageSize⌉ + 1, at most ⌈n / pageSize⌉ (indexSelection's). */
export function indexWant(budget: number, n: number, pageSize: number): number {
  const k = Math.min(budget, n), count = Math.ceil(n / pageSize);
  return k === 0 ? 0 : Math.min(count, Math.ceil(k / pageSize) + 1);
}

/** Byte offset of a device's chosen pages in a stage slot's query buffer: right after the query's heads·headDim f32. */
export function indexChosenOffset(heads: number, headDim: number): number {
  return heads * headDim * 4;
}

/**
 * K ids per KV head (ascending) of rows [0, n): the best ⌈K / pageSize⌉ + 1 pages (indexPages),
 * whole while they fit K, the page that does not fit by its best tokens by exact q·k (ties to the
 * lower slot), as Quest fills its lists.
 */
export function indexSelection(P: SelectorPrimitives, query: Float32Array, groupSize: number, keys: OffloadedKeys, index: PageIndex,
  n: number, k: number): Selection {
  if (k === 0) return { kind: "shared", ids: new Int32Array(0) };
  const chosen = P.indexPages(query, groupSize, index, n, indexWant(k, n, index.pageSize));
  return indexSelectionFrom(P, query, groupSize, keys, chosen.pages, chosen.want, index.pageSize, n, k);
}

/** indexSelection's lists from pages chosen already (`pages` [kvHeads, want], best first: a device's ranking). */
export function indexSelectionFrom(P: SelectorPrimitives, query: Float32Array, groupSize: number, keys: OffloadedKeys, pages: Int32Array, want: number,
  pageSize: number, n: number, k: number): Selection {
  if (k === 0) return { kind: "shared", ids: new Int32Array(0) };
  const ids = Array.from({ length: keys.kvHeads }, (_, g) => listFromPages(P, query, groupSize, keys, g, pages.subarray(g * want, (g + 1) * want), pageSize, n, k));
  return { kind: "perKvHead", ids };
}

/**
 * KV head g's list of k rows from its pages `best` (best first): whole pages while they fit, the
 * page that does not by its best rows by exact q·k (ties to the lower slot), ascending; a page
 * outside [0, ⌈n / pageSize⌉) ends the list (a device's ranking pads with −1).
 */
function listFromPages(P: SelectorPrimitives, query: Float32Array, G: number, keys: OffloadedKeys, g: number, best: Int32Array, pageSize: number, n: number, k: number): Int32Array {
  const d = keys.headDim, list = new Int32Array(k), count = Math.ceil(n / pageSize);
  let taken = 0;
  for (const p of best) {
    if (taken === k || p < 0 || p >= count) break;
    const from = p * pageSize, to = Math.min(n, from + pageSize), left = k - taken;
    if (to - from <= left) {
      for (let t = from; t < to; t++) list[taken++] = t;
    } else {
      const span = keys.capacity * d, head = { ...keys, kvHeads: 1, data: keys.data.subarray(g * span, (g + 1) * span) };
      const exact = P.keyScores(query.subarray(g * G * d, (g + 1) * G * d), G, head, from, to);
      for (const i of P.topK(exact, left)) list[taken++] = from + i;
    }
  }
  return (taken === k ? list : list.slice(0, taken)).sort();
}

/** A layer's index as a selector keeps it, and how far it reaches. */
export interface PageIndexState {
  index: PageIndex | null;
  /** Offloaded rows folded in so far. */
  summarized: number;
}

/**
 * The index over rows [0, n) of `keys`: rows added since the last call are folded in; it is made
 * afresh when it does not cover the store, its shape changed or n shrank (a new sequence).
 */
export function indexFor(P: SelectorPrimitives, state: PageIndexState, keys: OffloadedKeys, n: number, pageSize: number, superPages: number, form: PageIndexForm): PageIndex {
  const x = state.index;
  if (!x || x.pageSize !== pageSize || x.superPages !== superPages || x.form !== form || x.pageCapacity * pageSize < keys.capacity || n < state.summarized) {
    state.index = pageIndex(keys.kvHeads, keys.headDim, keys.capacity, pageSize, superPages, form);
    state.summarized = 0;
  }
  P.indexFold(keys, state.summarized, n, state.index!);
  state.summarized = n;
  return state.index!;
}
