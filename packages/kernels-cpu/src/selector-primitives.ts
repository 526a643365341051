/**
 * SelectorPrimitives with the key primitives (page summaries, page bounds, key scores, channel
 * packing) in C (native/sel_prims.c, AVX2 with a scalar fallback); topK, maxRows, sumRows and
 * range are core's. Arguments go through core's keyPrimitiveChecks before any pointer reaches C.
 */
import { FFIType, ptr as addressOf, type Pointer } from "bun:ffi";
import {
  fail, keyPrimitiveChecks as check, referencePrimitives, type DType, type OffloadedKeys, type PageSummaries, type SelectorPrimitives,
} from "@hybridgen/core";
import { openNativeSymbols } from "./native.js";

const { ptr, i32, i64, void: none } = FFIType;
const symbols = {
  hg_sel_best_isa: { args: [], returns: i32 },
  hg_sel_summarize: { args: [ptr, i32, i64, i64, i64, i64, i64, i64, i64, ptr, ptr, i32], returns: none },
  hg_sel_page_bounds: { args: [ptr, i64, i64, i64, ptr, ptr, i64, i64, ptr, i32], returns: none },
  hg_sel_key_scores: { args: [ptr, i64, i64, ptr, i32, i64, i64, i64, i64, ptr, i32], returns: none },
  hg_sel_gather: { args: [ptr, i32, i64, i64, i64, ptr, i64, i64, i64, ptr, i64], returns: none },
} as const;
let lib: ReturnType<typeof openNativeSymbols<typeof symbols>> | undefined;

const DTYPE_CODE: Readonly<Record<DType, number>> = { f32: 0, f16: 1, bf16: 2 };

/** Which vector loop the key primitives run: "avx2" where the CPU has AVX2+FMA+F16C, else "generic". */
export type SelectorIsa = "generic" | "avx2";

const at = (a: Float32Array | Uint16Array | Int32Array): Pointer => addressOf(a);

/** Native SelectorPrimitives; `isa` forces a loop (tests compare both with the reference). */
export function nativeSelectorPrimitives(isa?: SelectorIsa): SelectorPrimitives {
  lib ??= openNativeSymbols(symbols);
  const L = lib;
  const best = L.hg_sel_best_isa() === 1 ? "avx2" : "generic";
  if (isa === "avx2" && best !== "avx2") fail("native selector primitives: this CPU lacks AVX2/FMA/F16C (use isa \"generic\")");
  const code = (isa ?? best) === "avx2" ? 1 : 0;
  return {
    ...referencePrimitives,
    summarizePages(keys: OffloadedKeys, from: number, to: number, pages: PageSummaries): void {
      check.summarizePages(keys, from, to, pages);
      if (to === from) return;
      L.hg_sel_summarize(at(keys.data), DTYPE_CODE[keys.dtype], keys.kvHeads, keys.capacity, keys.headDim, from, to,
        pages.pageSize, pages.pageCapacity, at(pages.min), at(pages.max), code);
    },
    pageBounds(query: Float32Array, groupSize: number, pages: PageSummaries, count: number, out?: Float32Array): Float32Array {
      const dst = check.pageBounds(query, groupSize, pages, count, out);
      if (count === 0) return dst;
      L.hg_sel_page_bounds(at(query), pages.kvHeads, groupSize, pages.headDim, at(pages.min), at(pages.max), pages.pageCapacity, count, at(dst), code);
      return dst;
    },
    keyScores(query: Float32Array, groupSize: number, keys: OffloadedKeys, from: number, to: number, out?: Float32Array): Float32Array {
      const dst = check.keyScores(query, groupSize, keys, from, to, out);
      if (to === from) return dst;
      L.hg_sel_key_scores(at(query), keys.kvHeads, groupSize, at(keys.data), DTYPE_CODE[keys.dtype], keys.capacity, keys.headDim, from, to, at(dst), code);
      return dst;
    },
    gatherChannels(keys: OffloadedKeys, channels: Int32Array, from: number, to: number, out: OffloadedKeys): void {
      check.gatherChannels(keys, channels, from, to, out);
      if (to === from || out.headDim === 0) return;
      L.hg_sel_gather(at(keys.data), DTYPE_CODE[keys.dtype], keys.kvHeads, keys.capacity, keys.headDim, at(channels), out.headDim, from, to,
        at(out.data), out.capacity);
    },
  };
}
