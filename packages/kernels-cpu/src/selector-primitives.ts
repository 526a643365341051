/**
 * SelectorPrimitives with the key primitives (page summaries, bf16 rounded outward as core's; page
 * bounds, key scores, channel packing; native/sel_prims.c, AVX2 with a scalar fallback, AVX-512
 * page bounds with AVX2's bits) and topK
 * (native/sel_topk.c, a radix select) in C; maxRows, sumRows and range are core's. Arguments go
 * through core's checks before any pointer reaches C. Bound to a CPU stage, they run on its thread
 * pool while it is idle.
 */
import { FFIType, ptr as addressOf, type Pointer } from "bun:ffi";
import { fail, keyPrimitiveChecks as check, PAGE_INDEX_FORM_CODE, pageIndexChecks, referencePrimitives, type DType, type IndexFoldItem, type IndexPages, type OffloadedKeys, type PageIndex, type PageSummaries, type SelectorPrimitives } from "@hybridgen/spec";
import { openNativeSymbols } from "./native.js";

const { ptr, i32, i64, i64_fast, void: none } = FFIType;
const symbols = {
  hg_sel_best_isa: { args: [], returns: i32 },
  hg_sel_summarize: { args: [ptr, i32, i64, i64, i64, i64, i64, i64, i64, ptr, ptr, i32, ptr], returns: none },
  hg_sel_page_bounds: { args: [ptr, i64, i64, i64, ptr, ptr, i64, i64, ptr, i32, ptr], returns: none },
  hg_sel_key_scores: { args: [ptr, i64, i64, ptr, i32, i64, i64, i64, i64, ptr, i32, ptr], returns: none },
  hg_sel_gather: { args: [ptr, i32, i64, i64, i64, ptr, i64, i64, i64, ptr, i64, ptr], returns: none },
  hg_sel_topk: { args: [ptr, i64, i64, ptr, i32, ptr], returns: i64_fast },
  hg_index_fold: { args: [ptr, i32, i64, i64, i64, i64, i64, ptr, i32, i64, i64, i64, ptr], returns: none },
  hg_index_fold_many: { args: [ptr, i32, ptr], returns: none },
  hg_index_pages: { args: [ptr, i32, i64, i64, i64, i64, i64, ptr, i64, i64, i64, ptr, i32, ptr], returns: i64_fast },
} as const;
let lib: ReturnType<typeof openNativeSymbols<typeof symbols>> | undefined;

const DTYPE_CODE: Readonly<Record<DType, number>> = { f32: 0, f16: 1, bf16: 2 };

/** Which vector loops the key primitives run: the best the CPU has by default ("avx512": AVX-512 page bounds, AVX2 elsewhere). */
export type SelectorIsa = "generic" | "avx2" | "avx512";
const SELECTOR_ISAS: readonly SelectorIsa[] = ["generic", "avx2", "avx512"];

const at = (a: Float32Array | Uint16Array | Int32Array): Pointer => addressOf(a);

/**
 * Native SelectorPrimitives; `isa` forces a loop set (tests compare each with the reference).
 * `stage` gives the handle of a native CPU stage (null once closed) whose pool the calls borrow
 * while it runs no job; without one they run on the calling thread.
 */
export function nativeSelectorPrimitives(isa?: SelectorIsa, stage?: () => Pointer | null): SelectorPrimitives {
  lib ??= openNativeSymbols(symbols);
  const L = lib;
  const best = L.hg_sel_best_isa();
  const code = SELECTOR_ISAS.indexOf(isa ?? SELECTOR_ISAS[best]!);
  if (code > best) fail(`native selector primitives: this CPU lacks ${isa === "avx2" ? "AVX2/FMA/F16C" : "AVX-512 F/BW/VL/DQ"} (use isa "${SELECTOR_ISAS[best]}")`);
  const pool = stage ?? (() => null);
  return {
    ...referencePrimitives,
    topK(values: Float32Array, k: number, length: number = values.length): Int32Array {
      checkTopK(values, k, length);
      const out = new Int32Array(Math.max(0, Math.min(k, length)));
      if (out.length === 0) return out;
      if (Number(L.hg_sel_topk(at(values), length, out.length, at(out), code, pool())) < 0) fail("topK: out of memory for the native select");
      return out;
    },
    summarizePages(keys: OffloadedKeys, from: number, to: number, pages: PageSummaries): void {
      check.summarizePages(keys, from, to, pages);
      if (to === from) return;
      L.hg_sel_summarize(at(keys.data), DTYPE_CODE[keys.dtype], keys.kvHeads, keys.capacity, keys.headDim, from, to,
        pages.pageSize, pages.pageCapacity, at(pages.min), at(pages.max), code, pool());
    },
    pageBounds(query: Float32Array, groupSize: number, pages: PageSummaries, count: number, out?: Float32Array): Float32Array {
      const dst = check.pageBounds(query, groupSize, pages, count, out);
      if (count === 0) return dst;
      L.hg_sel_page_bounds(at(query), pages.kvHeads, groupSize, pages.headDim, at(pages.min), at(pages.max), pages.pageCapacity, count, at(dst), code, pool());
      return dst;
    },
    keyScores(query: Float32Array, groupSize: number, keys: OffloadedKeys, from: number, to: number, out?: Float32Array): Float32Array {
      const dst = check.keyScores(query, groupSize, keys, from, to, out);
      if (to === from) return dst;
      L.hg_sel_key_scores(at(query), keys.kvHeads, groupSize, at(keys.data), DTYPE_CODE[keys.dtype], keys.capacity, keys.headDim, from, to, at(dst), code, pool());
      return dst;
    },
    indexFold(keys: OffloadedKeys, from: number, to: number, index: PageIndex): void {
      pageIndexChecks.fold(keys, from, to, index);
      if (to === from) return;
      L.hg_index_fold(addressOf(index.data), PAGE_INDEX_FORM_CODE[index.form], index.kvHeads, index.headDim, index.pageSize, index.superPages, index.pageCapacity,
        at(keys.data), DTYPE_CODE[keys.dtype], keys.capacity, from, to, pool());
    },
    indexFoldMany(items: readonly IndexFoldItem[]): void {
      const table = new Float64Array(12 * items.length);
      let n = 0;
      for (const { keys, from, to, index } of items) {
        pageIndexChecks.fold(keys, from, to, index);
        if (to === from) continue;
        table.set([addressOf(index.data), PAGE_INDEX_FORM_CODE[index.form], index.kvHeads, index.headDim, index.pageSize, index.superPages, index.pageCapacity,
          addressOf(keys.data), DTYPE_CODE[keys.dtype], keys.capacity, from, to], 12 * n++);
      }
      if (n > 0) L.hg_index_fold_many(table, n, pool());
    },
    indexPages(query: Float32Array, groupSize: number, index: PageIndex, n: number, want: number): IndexPages {
      pageIndexChecks.pages(query, groupSize, index, n, want);
      const w = Math.min(want, Math.ceil(n / index.pageSize)), pages = new Int32Array(index.kvHeads * w);
      if (w === 0) return { pages, want: 0, pagesRead: 0 };
      const read = Number(L.hg_index_pages(addressOf(index.data), PAGE_INDEX_FORM_CODE[index.form], index.kvHeads, index.headDim, index.pageSize, index.superPages,
        index.pageCapacity, at(query), groupSize, n, w, at(pages), code, pool()));
      if (read < 0) fail("indexPages: out of memory for the native search");
      return { pages, want: w, pagesRead: read };
    },
    gatherChannels(keys: OffloadedKeys, channels: Int32Array, from: number, to: number, out: OffloadedKeys): void {
      check.gatherChannels(keys, channels, from, to, out);
      if (to === from || out.headDim === 0) return;
      L.hg_sel_gather(at(keys.data), DTYPE_CODE[keys.dtype], keys.kvHeads, keys.capacity, keys.headDim, at(channels), out.headDim, from, to,
        at(out.data), out.capacity, pool());
    },
  };
}

/** The reference topK's argument checks (same messages). */
function checkTopK(values: Float32Array, k: number, length: number): void {
  if (!Number.isInteger(length) || length < 0) fail(`topK: length must be a non-negative integer, got ${length}`);
  if (values.length < length) fail(`topK: values has ${values.length} elements, fewer than length ${length}`);
  if (!Number.isFinite(k) || Math.floor(k) !== k) fail(`topK: k must be an integer, got ${k}`);
}
